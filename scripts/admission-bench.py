#!/usr/bin/env python3
"""The admission API's numbers, on real replicas (release build), measured with
weir-admission-bench over gRPC:

    scripts/admission-bench.py                 # everything; writes target/admission/summary.json
    scripts/admission-bench.py --only throughput|accuracy|concurrency

- throughput: one replica; Allow, and AllowBatch of 100, closed loop from 16 callers on 4
  connections, 10 s each: decisions/s and call latency (client and server share 2 cores).
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


def throughput():
    rows = []
    f, _ = fleet(1, "weighted")
    try:
        targets = grpc_targets(f)
        for batch in (1, 100):
            r = bench("throughput", targets, "--tenant", "bench", "--key", "k", "--batch", batch,
                      "--concurrency", 16, "--connections", 4, "--duration", "10s")
            rows.append(r)
            print(f"throughput batch {batch}: {r['decisions_per_second']:.0f} decisions/s, "
                  f"call p50 {r['call_p50_ms']:.2f} ms, p99 {r['call_p99_ms']:.2f} ms", flush=True)
    finally:
        f.stop()
    return rows


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
    args = parser.parse_args()
    if not args.no_build:
        subprocess.run(["cargo", "build", "--release", "--bin", "weir", "--bin",
                        "weir-admission-bench"], cwd=ROOT, check=True)
    os.makedirs(OUT, exist_ok=True)
    summary = {}
    if args.only in (None, "throughput"):
        summary["throughput"] = throughput()
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
