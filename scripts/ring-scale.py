#!/usr/bin/env python3
"""The ring's own cost on real processes: gossip bytes and CPU per replica against ring size,
with many tenants under `weighted`. Each replica runs in a network namespace of its own with
two links (scripts/chaos's Net): HTTP on one, gossip on the other, so the gossip link's
counters (/sys/class/net/<link>/statistics) are that replica's gossip and nothing else. CPU is
utime + stime from /proc/PID/stat over the same window.

    scripts/ring-scale.py                        # 3, 10 and 30 replicas, 1 000 tenants
    scripts/ring-scale.py --sizes 3,10 --window 10

Load: weir-loadgen, 1 000 tenants (`--tenant-count 1000×t`), pushes of 10 series at a low
total rate, routed at random so every replica sees most tenants (each replica's usage key
lists the tenants it tracks). A warm-up first, then the measured window. Needs root.
Prints one line per size and a fit of bytes per replica per second ∝ N^k.
"""

import argparse
import importlib.machinery
import importlib.util
import math
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
_loader = importlib.machinery.SourceFileLoader("chaos", os.path.join(HERE, "chaos"))
_spec = importlib.util.spec_from_loader("chaos", _loader)
chaos = importlib.util.module_from_spec(_spec)
_loader.exec_module(chaos)

TICKS = os.sysconf("SC_CLK_TCK")


def counters(link):
    base = f"/sys/class/net/{link}/statistics/"
    with open(base + "rx_bytes") as f:
        rx = int(f.read())
    with open(base + "tx_bytes") as f:
        tx = int(f.read())
    return rx, tx


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def tracked(fleet, index):
    try:
        return chaos.metrics(fleet.url(index)).get("weir_limiter_tracked_tenants", float("nan"))
    except OSError:
        return float("nan")


def measure(size, args):
    net = chaos.Net()
    fleet = None
    load = None
    try:
        fleet = chaos.Fleet(net, size, extra=[
            "--rate-limit-strategy", "weighted", "--http-workers", "1",
            "--ingestion-rate", "1000000", "--ingestion-burst-size", "1000000",
            "--cluster-id", f"ring-scale-{size}"])
        output = os.path.join(chaos.OUT, f"ring-scale-{size}.json")
        duration = args.warmup + args.window + 5
        load = subprocess.Popen(
            [chaos.LOADGEN, *sum((["--target", u] for u in fleet.urls()), []),
             "--tenant-count", f"{args.tenants}×t", "--samples-per-second", str(args.rate),
             "--series-per-request", "10", "--route", "random", "--duration", f"{duration}s",
             "--timeout", "3s", "--output", output, "--quiet", "--no-tenant-timeline"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(args.warmup)
        links = [net.link(i, 1) for i in range(size)]
        pids = [proc.pid for proc in fleet.procs]
        start = time.time()
        before = [counters(link) for link in links]
        cpu_before = [cpu_seconds(pid) for pid in pids]
        time.sleep(args.window)
        elapsed = time.time() - start
        after = [counters(link) for link in links]
        cpu_after = [cpu_seconds(pid) for pid in pids]
        # The host end of a replica's veth receives what the replica sends, and sends what
        # it receives.
        sent = [(a[0] - b[0]) / elapsed for a, b in zip(after, before)]
        received = [(a[1] - b[1]) / elapsed for a, b in zip(after, before)]
        cpu = [(a - b) / elapsed for a, b in zip(cpu_after, cpu_before)]
        seen = [tracked(fleet, i) for i in range(size)]
        healthy = [fleet.healthy(i) for i in range(size)]
        return {
            "size": size,
            "sent": sum(sent) / size,
            "received": sum(received) / size,
            "cpu": sum(cpu) / size,
            "cpu_max": max(cpu),
            "tracked": sum(seen) / size,
            "healthy": healthy,
        }
    finally:
        if load and load.poll() is None:
            load.terminate()
            load.wait()
        if fleet:
            fleet.stop()
        net.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="3,10,30")
    parser.add_argument("--tenants", type=int, default=1000)
    parser.add_argument("--rate", type=int, default=10000, help="samples per second, in all")
    parser.add_argument("--warmup", type=float, default=25)
    parser.add_argument("--window", type=float, default=15)
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("ring-scale.py needs root (network namespaces)")
    os.makedirs(chaos.OUT, exist_ok=True)
    rows = []
    print(f"{args.tenants} tenants under weighted, {args.rate} samples/s in pushes of 10 series, "
          f"gossip every 200 ms; window {args.window:.0f} s after {args.warmup:.0f} s of warm-up")
    print("| replicas | tenants tracked per replica | gossip sent B/s per replica | received B/s "
          "per replica | CPU per replica (mean, max) | healthy seen |")
    print("|---|---|---|---|---|---|")
    for size in [int(s) for s in args.sizes.split(",")]:
        row = measure(size, args)
        rows.append(row)
        print(f"| {size} | {row['tracked']:.0f} | {row['sent'] / 1e3:.1f} k | "
              f"{row['received'] / 1e3:.1f} k | {row['cpu'] * 100:.1f} %, "
              f"{row['cpu_max'] * 100:.1f} % | {sorted(set(str(h) for h in row['healthy']))} |", flush=True)
    if len(rows) >= 2:
        # Least squares on logs: bytes per replica ∝ N^k.
        xs = [math.log(r["size"]) for r in rows]
        for what in ["received", "cpu"]:
            ys = [math.log(max(r[what], 1e-9)) for r in rows]
            mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
            k = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
            c = math.exp(my - k * mx)
            print(f"fit: {what} per replica ≈ {c:.4g} × N^{k:.2f}")


if __name__ == "__main__":
    main()
