#!/usr/bin/env python3
"""`shared` measured with real processes: real redis-server (and a real 3-master Redis
Cluster) started here on free ports, real weir replicas gossiping on 127.0.0.x, the load
generator.

    scripts/shared-bench.py                 # every row
    scripts/shared-bench.py accuracy outage # some rows

Rows (names as arguments):
  accuracy   3 replicas, 64 requests outstanding, 3 L offered, even and 100,0,0: admitted / L
             after the first burst, and store calls per admitted request
  calls      a request-rate limit at 3 L: store calls per admitted request at steady load
  outage     Redis SIGKILLed, then SIGSTOPped, mid-load, with one `open` and one `closed`
             tenant: breaker open time, p99 push latency during the outage, what `closed`
             admitted while the store was away, recovery after the store returns
  crash      a replica SIGKILLed holding leases: admitted against B + L(t + lease TTL)
  cluster    a 3-master cluster: a hot tenant with store_shards 3 (its calls on each
             master), then its master SIGKILLed: time to the limit holding again after the
             replica's promotion
  noisy      one tenant at 100x its limit in small requests beside another: the other's p99
  skew       a replica whose clock is 30 s ahead (faketime): admitted unchanged

Reports land in target/shared-bench/; a Markdown summary is printed.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import accuracy  # noqa: E402  (Fleet, LOADGEN, ROOT)

OUT = os.path.join(accuracy.ROOT, "target", "shared-bench")
L = 10_000
RESULTS = []


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def free_cluster_port():
    """A free port whose cluster bus port (10 000 above) exists and is free too."""
    while True:
        port = free_port()
        if port > 55_535:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port + 10_000))
            except OSError:
                continue
        return port


class Redis:
    def __init__(self, port=None, extra=()):
        self.port = port or free_port()
        self.dir = tempfile.mkdtemp(prefix="weir-redis-")
        self.extra = extra
        self.start()

    def start(self):
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.dir, *self.extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 10
        while time.time() < deadline:
            if self.cli("PING") == "PONG":
                return
            time.sleep(0.05)
        raise SystemExit(f"redis-server on {self.port} did not start")

    def cli(self, *args):
        out = subprocess.run(["redis-cli", "-p", str(self.port), *args], capture_output=True, text=True)
        return out.stdout.strip()

    def url(self):
        return f"redis://127.0.0.1:{self.port}"

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def signal(self, sig):
        self.proc.send_signal(sig)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def metric_sum(fleet, prefix):
    total = 0.0
    for i, (proc, _) in enumerate(fleet.replicas):
        if proc.poll() is not None:
            continue
        try:
            with urllib.request.urlopen(fleet.replicas[i][1] + "/metrics", timeout=2) as r:
                for line in r.read().decode().splitlines():
                    if line.startswith(prefix):
                        total += float(line.rsplit(" ", 1)[1])
        except OSError:
            pass
    return total


def loadgen(name, urls, tenant, args, duration):
    os.makedirs(OUT, exist_ok=True)
    output = os.path.join(OUT, f"{name}.json")
    cmd = [accuracy.LOADGEN, *sum((["--target", u] for u in urls), []), "--tenants", tenant,
           "--duration", f"{duration}s", "--output", output, "--quiet", *args]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(output) as f:
        return json.load(f)


def report(row, measure, target, value, ok):
    RESULTS.append((row, measure, target, value, ok))
    print(f"{'ok  ' if ok else 'MISS'} {row:<9} {measure}: {value} (target {target})", flush=True)


def overrides(tenants):
    text = "overrides:\n"
    for name, body in tenants.items():
        text += f"  {name}:\n" + "".join(f"    {line}\n" for line in body)
    return text


def shared_tenant(rate=L, burst=L, policy="open", shards=1, request_rate=None):
    if request_rate:  # only the request rate limits: the ingestion rate is out of the way
        rate, burst = "1e9", 4_000_000_000
    body = [f"ingestion_rate: {rate}", f"ingestion_burst_size: {burst}",
            "rate_limit_strategy: shared", f"on_store_failure: {policy}", f"store_shards: {shards}"]
    if request_rate:
        body += [f"request_rate: {request_rate}", f"request_burst_size: {request_rate}"]
    return body


def row_accuracy():
    redis = Redis()
    try:
        for split in ("1,1,1", "100,0,0"):
            fleet = accuracy.Fleet(3, "weighted", overrides({"hard": shared_tenant()}),
                                   extra=["--store-url", redis.url()])
            try:
                time.sleep(1.5)  # the replicas connect to the store
                calls_before = metric_sum(fleet, "weir_store_calls_total")
                rep = loadgen(f"accuracy-{split}", fleet.urls(), "hard",
                              ["--split", split, "--samples-per-second", str(3 * L),
                               "--series-per-request", "100", "--max-outstanding", "64"], 30)
                calls = metric_sum(fleet, "weir_store_calls_total") - calls_before
            finally:
                fleet.stop()
            per_second = [s["admitted_samples"] / L for s in rep["timeline"]]
            steady = sum(per_second[5:]) / len(per_second[5:])
            admitted_requests = rep["total"]["counts"]["status"].get("200", 0)
            report("accuracy", f"{split}: admitted / L after the first 5 s", "[0.97, 1.01]",
                   round(steady, 4), 0.97 <= steady <= 1.01)
            report("accuracy", f"{split}: store calls per admitted request (100-sample pushes)",
                   "report", f"{calls / max(admitted_requests, 1):.3f} ({calls:.0f} calls, "
                   f"{admitted_requests} admitted)", True)
    finally:
        redis.stop()


def row_calls():
    redis = Redis()
    fleet = accuracy.Fleet(3, "weighted", overrides({"reqs": shared_tenant(request_rate=2000)}),
                           extra=["--store-url", redis.url()])
    try:
        time.sleep(1.5)
        loadgen("calls-warmup", fleet.urls(), "reqs",
                ["--requests-per-second", "6000", "--series-per-request", "1"], 5)
        calls_before = metric_sum(fleet, "weir_store_calls_total")
        rep = loadgen("calls", fleet.urls(), "reqs",
                      ["--requests-per-second", "6000", "--series-per-request", "1",
                       "--max-outstanding", "256"], 20)
        calls = metric_sum(fleet, "weir_store_calls_total") - calls_before
        admitted = rep["total"]["counts"]["status"].get("200", 0)
        ratio = calls / max(admitted, 1)
        report("calls", "store calls per admitted request (request_rate 2 000/s, 3 L offered)",
               "<= 1 %", f"{100 * ratio:.2f} % ({calls:.0f} calls, {admitted} admitted, "
               f"{admitted / 20:.0f}/s)", ratio <= 0.01)
    finally:
        fleet.stop()
        redis.stop()


def row_outage():
    for fault in ("kill", "stop"):
        redis = Redis()
        port = redis.port
        fleet = accuracy.Fleet(
            3, "weighted",
            overrides({"open": shared_tenant(policy="open"), "closed": shared_tenant(policy="closed")}),
            extra=["--store-url", redis.url(), "--store-timeout", "50ms"])
        try:
            time.sleep(1.5)
            reports = {}
            threads = [threading.Thread(target=lambda t=t: reports.__setitem__(t, loadgen(
                f"outage-{fault}-{t}", fleet.urls(), t,
                ["--samples-per-second", str(2 * L), "--series-per-request", "100"], 30)))
                for t in ("open", "closed")]
            for t in threads:
                t.start()
            time.sleep(10)
            leased_before = metric_sum(fleet, "weir_store_tokens_leased_total")
            t_fault = time.time()
            if fault == "kill":
                redis.kill()
            else:
                redis.signal(signal.SIGSTOP)
            opened = None
            while time.time() - t_fault < 5:
                states = [metric_sum_one(fleet, i, "weir_store_breaker_state") for i in range(3)]
                if all(s == 2 for s in states):
                    opened = time.time() - t_fault
                    break
                time.sleep(0.02)
            time.sleep(max(0, 10 - (time.time() - t_fault)))
            t_back = time.time()
            if fault == "kill":
                redis = Redis(port=port)
            else:
                redis.signal(signal.SIGCONT)
            for t in threads:
                t.join()
            start = reports["closed"]["timeline"]
            fault_s, back_s = 10, 20
            p99 = max((s["latency_ms_p99"] or 0) for s in start[fault_s + 1:back_s])
            p99_open = max((s["latency_ms_p99"] or 0) for s in reports["open"]["timeline"][fault_s + 1:back_s])
            closed_admitted = sum(s["admitted_samples"] for s in start[fault_s + 1:back_s])
            recovered = next((i - back_s for i in range(back_s, len(start))
                              if start[i]["admitted_samples"] >= 0.9 * L), None)
            report("outage", f"{fault}: breaker open on every replica after", "<= 1 s",
                   "never" if opened is None else f"{opened:.2f} s", opened is not None and opened <= 1)
            report("outage", f"{fault}: p99 push latency during the outage (closed / open)",
                   "<= 55 ms", f"{p99:.1f} ms / {p99_open:.1f} ms", max(p99, p99_open) <= 55)
            report("outage", f"{fault}: closed tenant admitted while the store was away",
                   f"<= tokens leased before ({leased_before:.0f} over both tenants)",
                   f"{closed_admitted}", closed_admitted <= leased_before)
            report("outage", f"{fault}: closed tenant back to >= 0.9 L after the store returned",
                   "<= 2 s", "never" if recovered is None else f"{recovered} s",
                   recovered is not None and recovered <= 2)
        finally:
            fleet.stop()
            redis.stop()


def metric_sum_one(fleet, index, name):
    try:
        return fleet.metric(index, name)
    except OSError:
        return None


def row_crash():
    redis = Redis()
    fleet = accuracy.Fleet(3, "weighted", overrides({"hard": shared_tenant()}),
                           extra=["--store-url", redis.url()])
    try:
        time.sleep(1.5)
        killer = threading.Timer(10, lambda: fleet.replicas[0][0].send_signal(signal.SIGKILL))
        killer.start()
        rep = loadgen("crash", fleet.urls(), "hard",
                      ["--samples-per-second", str(3 * L), "--series-per-request", "100",
                       "--failover"], 30)
        killer.join()
        admitted = rep["total"]["counts"]["admitted_samples"]
        bound = L + L * (30 + 0.5)
        report("crash", "admitted over 30 s, a replica SIGKILLed holding leases at 10 s",
               f"<= B + L(t + lease TTL) = {bound:.0f}", f"{admitted} ({admitted / bound:.3f} of the bound)",
               admitted <= bound)
    finally:
        fleet.stop()
        redis.stop()


def row_cluster():
    ports = [free_cluster_port() for _ in range(6)]
    nodes = [Redis(port=p, extra=("--cluster-enabled", "yes", "--cluster-node-timeout", "1000",
                                  "--repl-diskless-sync-delay", "0")) for p in ports]
    try:
        subprocess.run(["redis-cli", "--cluster", "create", *[f"127.0.0.1:{p}" for p in ports],
                        "--cluster-replicas", "1", "--cluster-yes"], check=True,
                       stdout=subprocess.DEVNULL)
        deadline = time.time() + 30
        while time.time() < deadline:
            ok = all("cluster_state:ok" in n.cli("CLUSTER", "INFO") for n in nodes)
            synced = all("role:slave" not in n.cli("INFO", "replication")
                         or "master_link_status:up" in n.cli("INFO", "replication") for n in nodes)
            if ok and synced:
                break
            time.sleep(0.2)
        masters = [n for n in nodes if "role:master" in n.cli("INFO", "replication")]
        before = {n.port: commandstat(n) for n in masters}
        fleet = accuracy.Fleet(3, "weighted", overrides({"hot": shared_tenant(shards=3)}),
                               extra=["--store-url", ",".join(n.url() for n in nodes)])
        try:
            time.sleep(2)
            loadgen("cluster-hot", fleet.urls(), "hot",
                    ["--samples-per-second", str(3 * L), "--series-per-request", "100"], 10)
            spread = {n.port: commandstat(n) - before[n.port] for n in masters}
            report("cluster", "hot tenant, store_shards 3: script calls per master",
                   "all three masters", str(sorted(spread.values())),
                   sum(1 for v in spread.values() if v > 0) == 3)
            # Kill the master of the tenant's first sub-bucket mid-load.
            slot = nodes[0].cli("CLUSTER", "KEYSLOT", "weir:{hot}:i")
            victim = next(n for n in masters if owns(n, int(slot)))
            result = {}
            worker = threading.Thread(target=lambda: result.__setitem__("r", loadgen(
                "cluster-failover", fleet.urls(), "hot",
                ["--samples-per-second", str(3 * L), "--series-per-request", "100"], 30)))
            worker.start()
            time.sleep(10)
            victim.kill()
            t_kill = time.time()
            promoted = None
            while time.time() - t_kill < 20:
                alive = [n for n in nodes if n.proc.poll() is None]
                if all("cluster_state:ok" in n.cli("CLUSTER", "INFO") for n in alive):
                    promoted = time.time() - t_kill
                    break
                time.sleep(0.1)
            worker.join()
            timeline = result["r"]["timeline"]
            promoted_at = 10 + (promoted or 20)
            back = next((i for i in range(10, len(timeline) - 2)
                         if all(s["admitted_samples"] >= 0.95 * L for s in timeline[i:i + 3])), None)
            after = None if back is None else max(0.0, back - promoted_at)
            report("cluster", "master SIGKILLed: limit holds again after the promotion",
                   "<= 5 s", f"promoted after {promoted:.1f} s; >= 0.95 L {after} s after it"
                   if promoted else "no promotion", after is not None and after <= 5)
        finally:
            fleet.stop()
    finally:
        for n in nodes:
            n.stop()


def commandstat(node):
    stats = node.cli("INFO", "commandstats")
    total = 0
    for line in stats.splitlines():
        if line.startswith("cmdstat_evalsha:") or line.startswith("cmdstat_eval:"):
            total += int(line.split("calls=")[1].split(",")[0])
    return total


def owns(node, slot):
    for line in node.cli("CLUSTER", "NODES").splitlines():
        fields = line.split()
        if "myself" in fields[2]:
            for part in fields[8:]:
                if "-" in part:
                    a, b = part.split("-")
                    if int(a) <= slot <= int(b):
                        return True
                elif part.isdigit() and int(part) == slot:
                    return True
    return False


def row_noisy():
    redis = Redis()
    fleet = accuracy.Fleet(1, "weighted",
                           overrides({"quiet": shared_tenant(), "noisy": shared_tenant(rate=50, burst=50)}),
                           extra=["--store-url", redis.url()])
    try:
        time.sleep(1.5)
        alone = loadgen("noisy-alone", fleet.urls(), "quiet",
                        ["--samples-per-second", str(L // 2), "--series-per-request", "100"], 15)
        result = {}
        noise = threading.Thread(target=lambda: result.__setitem__("n", loadgen(
            "noisy-noise", fleet.urls(), "noisy",
            ["--requests-per-second", "500", "--series-per-request", "10"], 17)))
        noise.start()
        time.sleep(1)
        beside = loadgen("noisy-beside", fleet.urls(), "quiet",
                         ["--samples-per-second", str(L // 2), "--series-per-request", "100"], 15)
        noise.join()
        p99_alone = alone["total"]["latency_ms_p99"]
        p99_beside = beside["total"]["latency_ms_p99"]
        rise = (p99_beside - p99_alone) / p99_alone
        report("noisy", "quiet tenant's p99 push latency, alone / beside a tenant at 100x its limit",
               "rises <= 10 %", f"{p99_alone:.2f} ms / {p99_beside:.2f} ms ({100 * rise:+.0f} %)",
               rise <= 0.10)
    finally:
        fleet.stop()
        redis.stop()


def row_skew():
    if shutil.which("faketime") is None:
        report("skew", "faketime", "installed", "missing (apt-get install faketime)", False)
        return
    results = {}
    for skewed in (False, True):
        redis = Redis()
        extra = ["--store-url", redis.url()]
        fleet = accuracy.Fleet(1, "weighted", overrides({"hard": shared_tenant()}), extra=extra) \
            if not skewed else skewed_fleet(redis)
        try:
            time.sleep(1.5)
            rep = loadgen(f"skew-{skewed}", fleet.urls(), "hard",
                          ["--samples-per-second", str(3 * L), "--series-per-request", "100"], 20)
            results[skewed] = sum(s["admitted_samples"] for s in rep["timeline"][5:]) / (15 * L)
        finally:
            fleet.stop()
            redis.stop()
    report("skew", "admitted / L, normal clock / clock 30 s ahead", "no change",
           f"{results[False]:.4f} / {results[True]:.4f}", abs(results[True] - results[False]) < 0.02)


def skewed_fleet(redis):
    real = accuracy.WEIR
    wrapper = os.path.join(tempfile.mkdtemp(), "weir-faketime")
    with open(wrapper, "w") as f:
        f.write(f"#!/bin/sh\nexec faketime -f '+30s' {real} \"$@\"\n")
    os.chmod(wrapper, 0o755)
    accuracy.WEIR = wrapper
    try:
        return accuracy.Fleet(1, "weighted", overrides({"hard": shared_tenant()}),
                              extra=["--store-url", redis.url()])
    finally:
        accuracy.WEIR = real


def main():
    rows = sys.argv[1:] or ["accuracy", "calls", "outage", "crash", "cluster", "noisy", "skew"]
    subprocess.run(["cargo", "build", "--release", "--bin", "weir", "--bin", "weir-loadgen"],
                   cwd=accuracy.ROOT, check=True)
    for row in rows:
        globals()[f"row_{row}"]()
    print("\n| row | measure | target | measured |\n| --- | --- | --- | --- |")
    for row, measure, target, value, ok in RESULTS:
        print(f"| {row} | {measure} | {target} | {'' if ok else '**missed** '}{value} |")


if __name__ == "__main__":
    main()
