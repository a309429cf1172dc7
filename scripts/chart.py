#!/usr/bin/env python3
"""Draws admitted samples/s over time for `divided` against `weighted` from the load
generator's reports (scripts/accuracy.py writes them), as an SVG with no dependencies.

    scripts/chart.py target/accuracy/divided-100,0,0.json target/accuracy/weighted-100,0,0.json \
        --title "All traffic to one of 3 replicas (100,0,0), L = 10 000 samples/s" \
        --output docs/weighted-vs-divided-100-0-0.svg
"""
import argparse
import json
import os

WIDTH, HEIGHT, LEFT, RIGHT, TOP, BOTTOM = 760, 360, 70, 150, 40, 50
COLOURS = ["#d62728", "#1f77b4", "#2ca02c", "#9467bd"]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("reports", nargs="+")
    parser.add_argument("--limit", type=float, default=10_000)
    parser.add_argument("--title", default="admitted samples/s")
    parser.add_argument("--output", required=True)
    args = parser.parse_args()

    series = []
    for path in args.reports:
        with open(path) as f:
            report = json.load(f)
        label = os.path.basename(path).split("-")[0]
        series.append((label, [s["admitted_samples"] for s in report["timeline"]]))
    seconds = max(len(values) for _, values in series)
    highest = max(max(max(values) for _, values in series), args.limit) * 1.1
    step = 10 ** max(len(str(int(highest))) - 2, 0) * 5  # round gridlines
    top = -(-highest // step) * step
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    x = lambda t: LEFT + plot_w * t / max(seconds - 1, 1)
    y = lambda v: TOP + plot_h * (1 - v / top)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
           f'font-family="sans-serif" font-size="12">',
           f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
           f'<text x="{LEFT}" y="22" font-size="14">{args.title}</text>']
    for i in range(6):
        value = top * i / 5
        out.append(f'<line x1="{LEFT}" x2="{LEFT + plot_w}" y1="{y(value):.1f}" y2="{y(value):.1f}" stroke="#eee"/>')
        out.append(f'<text x="{LEFT - 6}" y="{y(value) + 4:.1f}" text-anchor="end">{value:,.0f}</text>')
    for t in range(0, seconds, 5):
        out.append(f'<text x="{x(t):.1f}" y="{TOP + plot_h + 18}" text-anchor="middle">{t}</text>')
    out.append(f'<text x="{LEFT + plot_w / 2}" y="{HEIGHT - 10}" text-anchor="middle">seconds</text>')
    out.append(f'<line x1="{LEFT}" x2="{LEFT + plot_w}" y1="{y(args.limit):.1f}" y2="{y(args.limit):.1f}" '
               f'stroke="#555" stroke-dasharray="6,4"/>')
    out.append(f'<text x="{LEFT + plot_w + 8}" y="{y(args.limit) + 4:.1f}">configured L</text>')
    for i, (label, values) in enumerate(series):
        colour = COLOURS[i % len(COLOURS)]
        points = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in enumerate(values))
        out.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{points}"/>')
        out.append(f'<text x="{LEFT + plot_w + 8}" y="{TOP + 20 + 18 * i}" fill="{colour}">{label}</text>')
    out.append(f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#999"/>')
    out.append("</svg>")
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, "w") as f:
        f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
