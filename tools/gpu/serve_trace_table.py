#!/usr/bin/env python3
"""A served stream's steps from tools/gpu/kernel_trace.c's TSV (tools/gpu/serve-trace.sh).

    serve_trace_table.py TRACE.tsv [--api API.tsv] [--skip N]

The step graph is trace_table.py's (the step graph replayed most); its replays in start order,
the first N (default 8) dropped as warm-up and the prompt's. Between two consecutive replays:
the period (start to start: the GPU's frame time), the span (first kernel's start to last
kernel's end), the gap (the host's time between a replay's end and the next one's start). Codec
kernels (`codec_*`, on the codec thread's stream) are split into the time they run inside a
replay's span and in the gaps, and the replays are split into those that overlap codec work and
those that do not: the difference of their spans is what the codec's kernels cost the step they
share the GPU with.

With --api (kernel_trace.c's driver calls and copies) the gap is taken apart on the host: from
the replay's end to the return of the worker's call that waited for it (the wake), the worker's
own work outside driver calls, its driver calls by name, the cuGraphLaunch call itself, and its
return to the replay's first kernel. The worker's calls are those of the thread that launched
the next replay (its cuGraphLaunch carries the replay's correlation id).
"""
import argparse
import bisect
import csv
import statistics
import sys
from collections import defaultdict

sys.path.insert(0, __import__("os").path.dirname(__file__))
from trace_table import open_text, read, step_replays  # noqa: E402


def read_api(path):
    with open_text(path) as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    for r in rows:
        for key in ("start_ns", "end_ns", "thread", "correlation_id"):
            r[key] = int(r[key])
    return rows


def host_gaps(api, windows, replays):
    """Per gap between consecutive replays: wake, host work, calls by name, launch call, launch
    to first kernel (ns), from the worker's driver calls."""
    calls = sorted((r for r in api if r["kind"] == "api"), key=lambda r: r["start_ns"])
    launch_of = {r["correlation_id"]: r for r in calls if r["name"].startswith("cuGraphLaunch")}
    by_thread = defaultdict(list)
    for c in calls:
        by_thread[c["thread"]].append(c)
    starts = {t: [c["start_ns"] for c in cs] for t, cs in by_thread.items()}
    out = []
    for i in range(len(windows) - 1):
        end = windows[i][1]
        launch = launch_of.get(replays[i + 1][0]["correlation_id"])
        if launch is None:
            continue
        # A thread's calls do not overlap: those from the one running at `end` to the launch.
        cs, st = by_thread[launch["thread"]], starts[launch["thread"]]
        lo, hi = max(0, bisect.bisect_right(st, end) - 1), bisect.bisect_left(st, launch["start_ns"])
        mine = [c for c in cs[lo:hi] if c["end_ns"] > end]
        # The call that waited for the replay: the worker's first call to return after its end.
        wait = mine[0] if mine else None
        wake = wait["end_ns"] - end if wait and wait["start_ns"] <= end else 0
        after = wait["end_ns"] if wake else end
        by_name, in_calls = {}, 0
        for c in mine[1:] if wake else mine:
            t = c["end_ns"] - max(c["start_ns"], after)
            by_name[c["name"]] = by_name.get(c["name"], 0) + t
            in_calls += t
        host = max(0, launch["start_ns"] - after - in_calls)
        out.append({
            "wake": wake,
            "wait_call": wait["name"] if wake else "-",
            "host": host,
            "calls": by_name,
            "launch": launch["end_ns"] - launch["start_ns"],
            "to_kernel": windows[i + 1][0] - launch["end_ns"],
        })
    return out


def overlap(a0, a1, b0, b1):
    return max(0, min(a1, b1) - max(a0, b0))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--api")
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
    if args.api:
        gaps = host_gaps(read_api(args.api), windows, replays)
        if not gaps:
            print("\nNo cuGraphLaunch records matched the replays.")
            return
        print(f"\n### the gap on the host: {len(gaps)} gaps (median µs)\n")
        print("| part | µs |")
        print("|---|---|")
        waits = sorted({g["wait_call"] for g in gaps})
        print(f"| wake: the replay's end to the return of the worker's wait ({', '.join(waits)}) | "
              f"{us(med([g['wake'] for g in gaps]))} |")
        print(f"| the worker's own work, outside driver calls | {us(med([g['host'] for g in gaps]))} |")
        names = sorted({n for g in gaps for n in g["calls"]})
        for n in names:
            print(f"| driver calls: `{n}` | {us(med([g['calls'].get(n, 0) for g in gaps]))} |")
        print(f"| the `cuGraphLaunch` call | {us(med([g['launch'] for g in gaps]))} |")
        print(f"| its return to the replay's first kernel | {us(med([g['to_kernel'] for g in gaps]))} |")


if __name__ == "__main__":
    main()
