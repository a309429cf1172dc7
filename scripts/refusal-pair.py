#!/usr/bin/env python3
"""Two weir builds taking turns on the refusal path: weir's CPU while every push is refused.

Each run starts a sink-mode replica with --request-rate 1 (so all but about one request a
second is answered 429), lets target/release/weir-loadgen offer a fixed rate of 100-series
requests for --duration seconds, and reads the replica's utime + stime from /proc/PID/stat
before and after. Prints each run's CPU and the ratio THIS / OTHER. Used to check the PGO
build (scripts/pgo-build) on a path its training never runs (docs/mimir-side-by-side.md, cut 5).

  scripts/refusal-pair.py target/pgo/weir target/release/weir
  scripts/refusal-pair.py A B --rates 2000,20000 --repeat 3 --duration 8
"""

import argparse
import json
import os
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TICKS = os.sysconf("SC_CLK_TCK")
PORT = 18180


def cpu_seconds(pid):
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def run(binary, rate, duration):
    weir = subprocess.Popen(
        [binary, "--http-addr", f"127.0.0.1:{PORT}", "--grpc-addr", "127.0.0.1:0",
         "--gossip-addr", "127.0.0.1:0", "--request-rate", "1", "--request-burst-size", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{PORT}/ready", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        else:
            raise SystemExit(f"refusal-pair: {binary} never became ready")
        time.sleep(1)
        before = cpu_seconds(weir.pid)
        with tempfile.NamedTemporaryFile(suffix=".json") as report:
            subprocess.run(
                [str(ROOT / "target/release/weir-loadgen"), "--target", f"http://127.0.0.1:{PORT}",
                 "--requests-per-second", str(rate), "--series-per-request", "100",
                 "--duration", f"{duration}s", "--quiet", "--output", report.name],
                check=True, stdout=subprocess.DEVNULL)
            used = cpu_seconds(weir.pid) - before
            status = json.load(open(report.name))["total"]["counts"]["status"]
    finally:
        weir.terminate()
        weir.wait()
    return used, status.get("429", 0)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("this")
    parser.add_argument("other")
    parser.add_argument("--rates", default="2000,20000", help="requests/s offered")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--duration", type=int, default=8)
    args = parser.parse_args()
    for rate in [int(rate) for rate in args.rates.split(",")]:
        for rep in range(args.repeat):
            this_cpu, this_refused = run(args.this, rate, args.duration)
            other_cpu, other_refused = run(args.other, rate, args.duration)
            if not this_refused or not other_refused:
                raise SystemExit("refusal-pair: a run refused nothing")
            print(f"{rate} requests/s, run {rep}: this {this_cpu:.2f} s ({this_refused} refused), "
                  f"other {other_cpu:.2f} s ({other_refused} refused), "
                  f"ratio {this_cpu / other_cpu:.3f}, per refusal "
                  f"{(this_cpu / this_refused) / (other_cpu / other_refused):.3f}", flush=True)


if __name__ == "__main__":
    main()
