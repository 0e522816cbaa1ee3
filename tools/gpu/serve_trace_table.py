#!/usr/bin/env python3
"""A served stream's steps from tools/gpu/kernel_trace.c's TSV (tools/gpu/serve-trace.sh).

    serve_trace_table.py TRACE.tsv [--skip N]

The step graph is the graph id with the most kernels a replay (trace_table.py's rule); its
replays in start order, the first N (default 8) dropped as warm-up and the prompt's. Between two
consecutive replays: the period (start to start: the GPU's frame time), the span (first kernel's
start to last kernel's end), the gap (the host's time between a replay's end and the next one's
start). Codec kernels (`codec_*`, on the codec thread's stream) are split into the time they run
inside a replay's span and in the gaps, and the replays are split into those that overlap codec
work and those that do not: the difference of their spans is what the codec's kernels cost the
step they share the GPU with.
"""
import argparse
import statistics
import sys

sys.path.insert(0, __import__("os").path.dirname(__file__))
from trace_table import read, step_replays  # noqa: E402


def overlap(a0, a1, b0, b1):
    return max(0, min(a1, b1) - max(a0, b0))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--skip", type=int, default=8)
    args = ap.parse_args()
    rows = read(args.trace)
    graph, size, replays = step_replays(rows, args.skip)
    if len(replays) < 2:
        sys.exit("fewer than two replays left after --skip")
    windows = [(r[0]["start_ns"], max(k["end_ns"] for k in r)) for r in replays]
    codec = sorted(
        ((r["start_ns"], r["end_ns"]) for r in rows if r["name"].startswith("codec_")), key=lambda c: c[0]
    )

    periods, spans, gaps, inside, between = [], [], [], [], []
    spans_with, spans_without = [], []
    for i, (s0, s1) in enumerate(windows[:-1]):
        n0 = windows[i + 1][0]
        periods.append(n0 - s0)
        spans.append(s1 - s0)
        gaps.append(max(0, n0 - s1))
        c_in = sum(overlap(c0, c1, s0, s1) for c0, c1 in codec if c1 > s0 and c0 < s1)
        c_gap = sum(overlap(c0, c1, s1, n0) for c0, c1 in codec if c1 > s1 and c0 < n0)
        inside.append(c_in)
        between.append(c_gap)
        (spans_with if c_in else spans_without).append(s1 - s0)

    med = statistics.median
    us = lambda v: f"{v / 1e3:.1f}"  # noqa: E731
    print(f"### a served stream's steps: {len(periods)} replays of {size} kernels (graph {graph})\n")
    print("| per step (median) | µs |")
    print("|---|---|")
    print(f"| period: one replay's start to the next's (the GPU's frame time) | {us(med(periods))} |")
    print(f"| span of a replay | {us(med(spans))} |")
    print(f"| the host's gap after a replay | {us(med(gaps))} |")
    print(f"| codec kernels inside a replay's span | {us(med(inside))} |")
    print(f"| codec kernels in the gap after it | {us(med(between))} |")
    print()
    print(f"- Mean period {us(statistics.mean(periods))} µs = {1e9 / statistics.mean(periods):.0f} frames/s.")
    if spans_with and spans_without:
        d = med(spans_with) - med(spans_without)
        print(f"- Replays overlapping codec kernels: {len(spans_with)}, span {us(med(spans_with))} µs; "
              f"without: {len(spans_without)}, span {us(med(spans_without))} µs: the codec costs the step "
              f"{us(d)} µs where they meet.")
    else:
        print(f"- Replays overlapping codec kernels: {len(spans_with)}; without: {len(spans_without)}.")
    codec_total = sum(c1 - c0 for c0, c1 in codec)
    print(f"- Codec kernels in the whole trace: {len(codec)}, {codec_total / 1e6:.2f} ms.")


if __name__ == "__main__":
    main()
