#!/usr/bin/env python3
"""The admission API's numbers, on real replicas (release build), measured with
weir-admission-bench over gRPC:

    scripts/admission-bench.py                 # everything; writes target/admission/summary.json
    scripts/admission-bench.py --only throughput|accuracy|concurrency
    scripts/admission-bench.py --only throughput --runs 3 --duration 10s

- throughput: one replica next to a bare tonic server for weir.admission.v1 that allows
  everything (`weir-admission-bench serve-bare`: the same generated types, tonic settings and
  allocator, no authentication, names or limiter); Allow, and AllowBatch of 100, closed loop
  from 16 callers on 4 connections, 10 s each, the two servers alternating, two runs each:
  calls/s, call latency, and each server's CPU per call from /proc/PID/stat (utime + stime
  over the run), then weir / bare. The ratio is the figure: absolute numbers move by a
  quarter between runs on a 2-core machine where client and server share the cores.
- accuracy: 3 replicas per strategy (weighted, divided, shared on a real redis-server); each
  algorithm at 1 000/s, 3x offered for 20 s, evenly spread and all on one replica:
  admitted / allowance (rate x 20 s + burst; the sliding window has no burst; under divided
  the allowance is the replicas' shares: the rate / N and each replica's whole burst).
- concurrency: 3 replicas per strategy, max_concurrent 100, 500 clients acquiring, holding
  50-500 ms, releasing, for 20 s: the fleet-wide in-flight count, sampled every millisecond.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import accuracy  # noqa: E402  (the Fleet of real replicas)

ROOT = accuracy.ROOT
BENCH = os.path.join(ROOT, "target", "release", "weir-admission-bench")
OUT = os.path.join(ROOT, "target", "admission")
RATE = 1000
ALGORITHMS = {
    "token_bucket": f"{{rate: {RATE}, burst: {RATE}}}",
    "sliding_window": f"{{algorithm: sliding_window, rate: {RATE}, window: 1s}}",
    "leaky_bucket": f"{{algorithm: leaky_bucket, rate: {RATE}, burst: {RATE}}}",
}


def overrides(strategy):
    """The accuracy keys of tenant t, and bench's key k that never runs dry. k's bucket holds
    4e9 tokens refilled at 1e12/s, only 4 ms of refill: a decision whose clock was read over
    4 ms before another's (its worker preempted on a loaded machine) is refused, a few in
    millions for Allow, about one in 10 000 for AllowBatch, which reads the clock once a
    batch (none at rate 1e9). Kept so, as serve-bare answers k's exact 42 bytes."""
    limits = "".join(f"      {name}-{split}: {spec}\n" for name, spec in ALGORITHMS.items()
                     for split in ("even", "one"))
    return (f"overrides:\n  t:\n    rate_limit_strategy: {strategy}\n    on_store_failure: closed\n"
            f"    limits:\n{limits}      slots: {{max_concurrent: 100}}\n"
            f"  bench:\n    rate_limit_strategy: {strategy}\n    limits:\n"
            f"      k: {{rate: 1e12, burst: 4000000000}}\n")


def grpc_targets(fleet):
    return [fleet.ring(i)["grpc_addr"] for i in range(len(fleet.replicas))]


def bench(mode, targets, *args):
    command = [BENCH, mode, *sum((["--target", t] for t in targets), []), *map(str, args)]
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


class Redis:
    def __init__(self):
        with __import__("socket").socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.dir = tempfile.mkdtemp(prefix="weir-redis-")
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.dir],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.3)

    def url(self):
        return f"redis://127.0.0.1:{self.port}"

    def stop(self):
        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def fleet(size, strategy):
    redis = Redis() if strategy == "shared" else None
    extra = ["--store-url", redis.url()] if redis else []
    return accuracy.Fleet(size, strategy, overrides(strategy), extra), redis


TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    """utime + stime of a process, all its threads, in seconds (fields 14 and 15 of
    /proc/PID/stat, counted after the command name, which may hold spaces)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


class BareServer:
    """`weir-admission-bench serve-bare` on a port the kernel picks on loopback."""

    def __init__(self):
        self.proc = subprocess.Popen([BENCH, "serve-bare", "--listen", "127.0.0.1:0"],
                                     stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line.startswith("listening on "):
            self.stop()
            raise SystemExit(f"serve-bare did not start: {line!r}")
        self.addr = line.split()[-1]

    def stop(self):
        self.proc.terminate()
        self.proc.wait()


def spread(values, fmt, unit=""):
    """`low–high unit` over the runs (one figure when they agree at this precision)."""
    low, high = fmt(min(values)), fmt(max(values))
    return f"{low}{unit}" if low == high else f"{low}–{high}{unit}"


def throughput(runs, duration):
    """weir and the bare server side by side: both up throughout, driven in turn, the order
    swapped every run so that a drift in the machine's speed falls on both."""
    rows = []
    f, _ = fleet(1, "weighted")
    bare = None
    try:
        bare = BareServer()
        servers = {"weir": (f.replicas[0][0].pid, grpc_targets(f)[0]),
                   "bare": (bare.proc.pid, bare.addr)}
        for name, (pid, target) in servers.items():
            bench("throughput", [target], "--tenant", "bench", "--key", "k", "--batch", 1,
                  "--concurrency", 16, "--connections", 4, "--duration", "1s")  # warm-up
            before = cpu_seconds(pid)
            time.sleep(2)
            print(f"{name} idle: {1e3 * (cpu_seconds(pid) - before) / 2:.0f} ms of CPU a second",
                  flush=True)
        for run in range(runs):
            order = ("weir", "bare") if run % 2 == 0 else ("bare", "weir")
            for batch in (1, 100):
                for name in order:
                    pid, target = servers[name]
                    before = cpu_seconds(pid)
                    r = bench("throughput", [target], "--tenant", "bench", "--key", "k",
                              "--batch", batch, "--concurrency", 16, "--connections", 4,
                              "--duration", duration)
                    cpu = cpu_seconds(pid) - before
                    r.update(server=name, run=run + 1, server_cpu_seconds=cpu,
                             cpu_us_per_call=1e6 * cpu / r["calls"],
                             cpu_ns_per_decision=1e9 * cpu / r["decisions"])
                    if r["allowed"] != r["decisions"]:
                        print(f"note: {name} did not allow {r['decisions'] - r['allowed']} of "
                              f"{r['decisions']} decisions (errors by reason: "
                              f"{r.get('item_errors', {})})", flush=True)
                    rows.append(r)
                    print(f"run {run + 1} {name} batch {batch}: {r['calls_per_second']:.0f} calls/s, "
                          f"{r['decisions_per_second']:.0f} decisions/s, "
                          f"server CPU {r['cpu_us_per_call']:.1f} µs a call "
                          f"({r['cpu_ns_per_decision']:.0f} ns a decision), "
                          f"call p50 {r['call_p50_ms']:.2f} ms, p99 {r['call_p99_ms']:.2f} ms",
                          flush=True)
    finally:
        if bare:
            bare.stop()
        f.stop()
    print("\n| | calls/s | decisions/s | server CPU a call | server CPU a decision |\n"
          "| --- | --- | --- | --- | --- |")
    ratios = []
    for batch in (1, 100):
        rpc = "Allow" if batch == 1 else f"AllowBatch of {batch}"
        mine = {name: [r for r in rows if r["server"] == name and r["batch"] == batch]
                for name in ("weir", "bare")}
        for name in ("weir", "bare"):
            rs = mine[name]
            calls = spread([r["calls_per_second"] / 1e3 for r in rs], "{:.1f}".format, " k")
            decisions = (spread([r["decisions_per_second"] / 1e6 for r in rs], "{:.2f}".format,
                                " M") if batch > 1 else "the same")
            call_cpu = spread([r["cpu_us_per_call"] for r in rs], "{:.1f}".format, " µs")
            decision_cpu = (spread([r["cpu_ns_per_decision"] for r in rs], "{:.0f}".format, " ns")
                            if batch > 1 else "the same")
            print(f"| {name} `{rpc}` | {calls} | {decisions} | {call_cpu} | {decision_cpu} |")
        # The ratio of the means, and of each run's pair (weir and bare driven back to back).
        mean = {name: sum(r["cpu_us_per_call"] for r in rs) / len(rs) for name, rs in mine.items()}
        pairs = [w["cpu_us_per_call"] / b["cpu_us_per_call"]
                 for w, b in zip(mine["weir"], mine["bare"])]
        speed = (sum(r["calls_per_second"] for r in mine["weir"])
                 / sum(r["calls_per_second"] for r in mine["bare"]))
        ratios.append(dict(batch=batch, cpu_per_call_weir_over_bare=mean["weir"] / mean["bare"],
                           cpu_per_call_pairs=pairs, calls_per_second_weir_over_bare=speed))
    print()
    for ratio in ratios:
        rpc = "Allow" if ratio["batch"] == 1 else f"AllowBatch of {ratio['batch']}"
        print(f"{rpc}: weir / bare, CPU per call {ratio['cpu_per_call_weir_over_bare']:.2f}× "
              f"(runs: {', '.join(f'{p:.2f}' for p in ratio['cpu_per_call_pairs'])}), "
              f"calls/s {ratio['calls_per_second_weir_over_bare']:.2f}×", flush=True)
    return {"runs": rows, "ratios": ratios}


def accuracy_rows():
    rows = []
    for strategy in ("weighted", "divided", "shared"):
        f, redis = fleet(3, strategy)
        try:
            targets = grpc_targets(f)
            for name in ALGORITHMS:
                burst = 0 if name == "sliding_window" else RATE
                runs = []
                for split, weights in (("even", "1,1,1"), ("one", "100,0,0")):
                    rate, allowance_burst = RATE, burst
                    if strategy == "divided":
                        rate, allowance_burst = ((RATE, 3 * burst) if split == "even"
                                                 else (RATE / 3, burst))
                    command = [BENCH, "rate", *sum((["--target", t] for t in targets), []),
                               "--split", weights, "--tenant", "t", "--key", f"{name}-{split}",
                               "--rate", str(rate), "--burst", str(allowance_burst),
                               "--offered", str(3 * RATE / rate), "--duration", "20s"]
                    runs.append((split, subprocess.Popen(command, stdout=subprocess.PIPE, text=True)))
                for split, proc in runs:
                    r = json.loads(proc.communicate()[0])
                    r.update(strategy=strategy, algorithm=name, placement=split)
                    rows.append(r)
                    print(f"accuracy {strategy:8} {name:15} {split:4}: admitted/allowance "
                          f"{r['admitted_over_allowance']:.3f} (errors {r['errors']})", flush=True)
        finally:
            f.stop()
            if redis:
                redis.stop()
    return rows


def concurrency_rows():
    rows = []
    for strategy in ("weighted", "divided", "shared"):
        f, redis = fleet(3, strategy)
        try:
            r = bench("concurrency", grpc_targets(f), "--tenant", "t", "--key", "slots",
                      "--clients", 500, "--limit", 100, "--duration", "20s")
            r.update(strategy=strategy)
            rows.append(r)
            print(f"concurrency {strategy:8}: max {r['max_in_flight']}, p99 {r['p99_in_flight']}, "
                  f"mean {r['mean_in_flight']:.1f}, time over 100: "
                  f"{100 * r['share_of_time_over_limit']:.1f} %", flush=True)
        finally:
            f.stop()
            if redis:
                redis.stop()
    return rows


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", choices=["throughput", "accuracy", "concurrency"])
    parser.add_argument("--no-build", action="store_true")
    parser.add_argument("--runs", type=int, default=2, help="throughput runs per server")
    parser.add_argument("--duration", default="10s", help="each throughput run")
    args = parser.parse_args()
    if not args.no_build:
        subprocess.run(["cargo", "build", "--release", "--bin", "weir", "--bin",
                        "weir-admission-bench"], cwd=ROOT, check=True)
    os.makedirs(OUT, exist_ok=True)
    summary = {}
    if args.only in (None, "throughput"):
        summary["throughput"] = throughput(args.runs, args.duration)
    if args.only in (None, "accuracy"):
        summary["accuracy"] = accuracy_rows()
    if args.only in (None, "concurrency"):
        summary["concurrency"] = concurrency_rows()
    path = os.path.join(OUT, f"summary{'-' + args.only if args.only else ''}.json")
    with open(path, "w") as f:
        json.dump(summary, f, indent=1)
    print(f"written {path}")


if __name__ == "__main__":
    main()
