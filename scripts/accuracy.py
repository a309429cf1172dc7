#!/usr/bin/env python3
"""Accuracy of a fleet-wide limit: admitted ÷ configured, measured with weir-loadgen against
real weir replicas gossiping on 127.0.0.x.

    scripts/accuracy.py                      # every scenario, 30 s each
    scripts/accuracy.py even kill --duration 20

Each scenario starts a fresh fleet (L = 10 000 samples/s, burst = L, one tenant), offers load
through the load generator, and reports admitted ÷ L for the first 5 s and for the steady state
after it, per second where it matters. Reports land in target/accuracy/.
"""

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WEIR = os.path.join(ROOT, "target", "release", "weir")
LOADGEN = os.path.join(ROOT, "target", "release", "weir-loadgen")
OUT = os.path.join(ROOT, "target", "accuracy")
LIMIT = 10_000
TENANT = "accuracy"
FIRST = 5  # seconds reported separately
EXTRA_ARGS = os.environ.get("WEIR_EXTRA_ARGS", "").split()


def free_udp(ip):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind((ip, 0))
        return sock.getsockname()[1]


class Fleet:
    def __init__(self, size, strategy, burst=LIMIT, first_ip=20):
        self.dir = tempfile.mkdtemp(prefix="weir-accuracy-")
        overrides = os.path.join(self.dir, "overrides.yaml")
        with open(overrides, "w") as f:
            f.write(
                f"overrides:\n  {TENANT}:\n    ingestion_rate: {LIMIT}\n"
                f"    ingestion_burst_size: {burst}\n    rate_limit_strategy: {strategy}\n"
            )
        ips = [f"127.0.0.{first_ip + i}" for i in range(size)]
        gossip = [f"{ip}:{free_udp(ip)}" for ip in ips]
        self.replicas = []
        for ip, addr in zip(ips, gossip):
            proc = subprocess.Popen(
                [WEIR, "--http-addr", f"{ip}:0", "--gossip-addr", addr, "--join", ",".join(gossip),
                 "--cluster-id", f"accuracy-{os.getpid()}", "--runtime-config", overrides,
                 "--max-inflight-push-requests", "0", *EXTRA_ARGS],
                stdout=subprocess.PIPE, stderr=open(os.path.join(self.dir, f"{ip}.log"), "w"),
                text=True,
            )
            line = proc.stdout.readline()
            url = "http://" + line.split("http://")[1].split()[0]
            self.replicas.append((proc, url))
        self.wait_healthy(size)

    def urls(self):
        return [url for _, url in self.replicas]

    def ring(self, index):
        with urllib.request.urlopen(self.replicas[index][1] + "/ring?format=json", timeout=2) as r:
            return json.load(r)

    def metric(self, index, name):
        with urllib.request.urlopen(self.replicas[index][1] + "/metrics", timeout=2) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(name + " "):
                    return float(line.split()[1])
        return None

    def healthy_changes(self):
        return [self.metric(i, "weir_ring_healthy_replicas_changes_total") or 0.0
                for i in range(len(self.replicas))]

    def wait_healthy(self, size, timeout=15):
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                if all(self.ring(i)["healthy"] == size for i in range(len(self.replicas))):
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise SystemExit(f"fleet did not converge to {size}")

    def stop(self):
        for proc, _ in self.replicas:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc, _ in self.replicas:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()


class LocalLimitSampler:
    """Samples the sum of every replica's local ingestion limit for the tenant (from /ring)
    while a scenario runs: what the (1 + ε) bound is about."""

    def __init__(self, fleet, skip_first=FIRST):
        self.fleet, self.skip_first, self.sums, self.done = fleet, skip_first, [], False
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        started = time.time()
        while not self.done:
            time.sleep(0.5)
            total = 0.0
            try:
                for i, (proc, _) in enumerate(self.fleet.replicas):
                    if proc.poll() is not None:
                        continue
                    for tenant in self.fleet.ring(i)["tenants"]:
                        if tenant["tenant"] == TENANT and tenant["local_ingestion_rate"] is not None:
                            total += tenant["local_ingestion_rate"]
            except OSError:
                continue
            if time.time() - started >= self.skip_first:
                self.sums.append(total / LIMIT)

    def stop(self):
        self.done = True
        self.thread.join()
        if not self.sums:
            return "no samples of the local limits"
        return (f"sum of local limits after {self.skip_first}s: max {max(self.sums):.3f} L, "
                f"mean {sum(self.sums) / len(self.sums):.3f} L over {len(self.sums)} samples")


def loadgen(name, urls, split, offered, duration, extra=()):
    os.makedirs(OUT, exist_ok=True)
    output = os.path.join(OUT, f"{name}.json")
    cmd = [LOADGEN, *sum((["--target", u] for u in urls), []), "--split", ",".join(map(str, split)),
           "--samples-per-second", str(offered), "--series-per-request", "100",
           "--tenants", TENANT, "--duration", f"{duration}s", "--output", output, "--quiet", *extra]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(output) as f:
        return json.load(f)


def ratios(report):
    return [s["admitted_samples"] / LIMIT for s in report["timeline"]]


def summary(name, report, strategy, note=""):
    per_second = ratios(report)
    first = sum(per_second[:FIRST]) / FIRST
    steady = per_second[FIRST:]
    steady_mean = sum(steady) / len(steady)
    first_admitted = sum(s["admitted_samples"] for s in report["timeline"][:FIRST])
    # The bound for the first 5 s, with the fleet burst the configured one (B = L).
    bound = (LIMIT + FIRST * LIMIT)
    note = f"first 5 s = {first_admitted / bound:.3f} x (B + 5L). " + note
    row = {
        "scenario": name, "strategy": strategy,
        "first_5s_admitted_over_L": round(first, 3),
        "first_5s_admitted_samples": first_admitted,
        "first_5s_over_burst_plus_5L": round(first_admitted / bound, 3),
        "steady_admitted_over_L": round(steady_mean, 4),
        "steady_min": round(min(steady), 3), "steady_max": round(max(steady), 3),
        "per_second": [round(r, 3) for r in per_second], "note": note,
    }
    print(f"{name:<10} {strategy:<9} first {FIRST}s {first:6.3f} L   steady {steady_mean:6.4f} L "
          f"(min {min(steady):.3f}, max {max(steady):.3f}) {note}")
    return row


def scenario_even(strategy, duration):
    fleet = Fleet(3, strategy)
    try:
        before = fleet.healthy_changes()
        sampler = LocalLimitSampler(fleet)
        report = loadgen(f"{strategy}-even", fleet.urls(), [34, 33, 33], 3 * LIMIT, duration)
        flaps = [a - b for a, b in zip(fleet.healthy_changes(), before)]
        return summary("even", report, strategy,
                       f"healthy-count changes during run: {flaps}; {sampler.stop()}")
    finally:
        fleet.stop()


def scenario_skew(strategy, duration, split, name):
    fleet = Fleet(3, strategy)
    try:
        sampler = LocalLimitSampler(fleet)
        report = loadgen(f"{strategy}-{name}", fleet.urls(), split, 3 * LIMIT, duration)
        return summary(name, report, strategy, sampler.stop())
    finally:
        fleet.stop()


def recovery(per_second, at):
    """First second from `at` on after which admitted stays >= 0.95 L for 3 s."""
    back = next((t for t in range(at, len(per_second))
                 if all(r >= 0.95 for r in per_second[t:t + 3])), None)
    return (f"back to >= 0.95 L from second {back} "
            f"({'never' if back is None else back - at} s after the event); "
            f"seconds {at - 2}..{at + 6}: {per_second[at - 2:at + 7]}")


def scenario_kill(strategy, duration, split, victim, name, kill_at=10):
    fleet = Fleet(3, strategy)
    try:
        def kill():
            time.sleep(kill_at)
            fleet.replicas[victim][0].send_signal(signal.SIGKILL)
        threading.Thread(target=kill, daemon=True).start()
        report = loadgen(f"{strategy}-{name}", fleet.urls(), split, 3 * LIMIT, duration,
                         ["--failover"])
        note = f"SIGKILL replica {victim} at {kill_at}s; " + recovery(ratios(report), kill_at)
        return summary(name, report, strategy, note)
    finally:
        fleet.stop()


def scenario_switch(strategy, duration, at=10):
    fleet = Fleet(3, strategy)
    try:
        report = loadgen(f"{strategy}-switch", fleet.urls(), [100, 0, 0], 3 * LIMIT, duration,
                         ["--split-at", f"{at}=0,0,100"])
        return summary("switch", report, strategy, "100,0,0 -> 0,0,100 at 10s; " + recovery(ratios(report), at))
    finally:
        fleet.stop()


def scenario_under(strategy, duration):
    """70,20,10 at 0.9 L: almost nothing should be refused."""
    fleet = Fleet(3, strategy)
    try:
        report = loadgen(f"{strategy}-under", fleet.urls(), [70, 20, 10], 0.9 * LIMIT, duration)
        after = report["timeline"][3:]
        offered = sum(s["offered_samples"] for s in after)
        refused = offered - sum(s["admitted_samples"] for s in after)
        note = f"refused after the first 3 s: {100 * refused / offered:.2f} % of offered"
        row = summary("0.9L", report, strategy, note)
        row["refused_after_3s_percent"] = round(100 * refused / offered, 3)
        return row
    finally:
        fleet.stop()


def scenario_saturate(strategy, duration):
    """Does the failure detector flap while the load saturates both cores?"""
    fleet = Fleet(3, strategy)
    try:
        before = fleet.healthy_changes()
        report = loadgen(f"{strategy}-saturate", fleet.urls(), [1, 1, 1], 3_000_000, duration,
                         ["--max-outstanding", "256"])
        flaps = [a - b for a, b in zip(fleet.healthy_changes(), before)]
        healthy = [fleet.ring(i)["healthy"] for i in range(3)]
        offered = report["total"]["offered_samples_per_second"]
        print(f"saturate   {strategy:<9} offered {offered:.0f} samples/s; healthy-count changes "
              f"{flaps}; healthy now {healthy}")
        return {"scenario": "saturate", "strategy": strategy, "healthy_changes": flaps,
                "healthy_after": healthy, "offered_samples_per_second": offered}
    finally:
        fleet.stop()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("scenarios", nargs="*",
                        default=["even", "kill", "skew", "skew70", "under", "switch", "kill-hot", "saturate"])
    parser.add_argument("--strategy", default="divided")
    parser.add_argument("--duration", type=int, default=30)
    args = parser.parse_args()
    subprocess.run(["cargo", "build", "--release", "--bin", "weir", "--bin", "weir-loadgen"],
                   cwd=ROOT, check=True)
    rows = []
    for name in args.scenarios:
        if name == "even":
            rows.append(scenario_even(args.strategy, args.duration))
        elif name == "kill":
            rows.append(scenario_kill(args.strategy, args.duration, [1, 1, 1], 2, "kill"))
        elif name == "kill-hot":
            rows.append(scenario_kill(args.strategy, args.duration, [70, 20, 10], 0, "kill-hot"))
        elif name == "skew":
            rows.append(scenario_skew(args.strategy, args.duration, [100, 0, 0], "100,0,0"))
        elif name == "skew70":
            rows.append(scenario_skew(args.strategy, args.duration, [70, 20, 10], "70,20,10"))
        elif name == "under":
            rows.append(scenario_under(args.strategy, args.duration))
        elif name == "switch":
            rows.append(scenario_switch(args.strategy, args.duration))
        elif name == "saturate":
            rows.append(scenario_saturate(args.strategy, min(args.duration, 20)))
        else:
            sys.exit(f"unknown scenario {name}")
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, f"summary-{args.strategy}.json"), "w") as f:
        json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
