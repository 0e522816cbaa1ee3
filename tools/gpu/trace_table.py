#!/usr/bin/env python3
"""The frame step's timeline from tools/gpu/kernel_trace.c's TSV, as a markdown table.

    trace_table.py TRACE.tsv [--skip N]

A CUDA graph replay is the kernels sharing one correlation id (the graph launch's) and a graph
id. The step's graph is the step graph (one with `step_embed_recipe`, which every frame step
launches once) replayed the most times (a server's start-up warming captures step graphs of
other batch sizes, replayed a few times); its first N replays (default 8) are dropped as
warm-up. For each kernel name: launches a replay, the median over replays of its summed in-graph
time (start to end: with programmatic dependent launch a kernel starts early and waits for its
predecessor inside, so this overlaps), its critical time (end minus the later of its start and
the previous kernels' last end: what it adds to the replay's span; these sum to the busy time),
and the idle time just before its launches (the gap since the GPU last had a kernel running).
Then a replay's span, busy time (the union of kernel intervals) and idle time.
"""
import argparse
import lzma
import statistics
import sys
from collections import defaultdict


def open_text(path):
    """A trace for reading as text, xz'd (as the scripts keep them) or not."""
    return lzma.open(path, "rt") if path.endswith(".xz") else open(path)


def read(path):
    rows = []
    with open_text(path) as f:
        header = f.readline().rstrip("\n").split("\t")
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) != len(header):
                continue
            r = dict(zip(header, parts))
            for key in ("start_ns", "end_ns", "graph_id", "graph_node_id", "correlation_id"):
                r[key] = int(r[key])
            rows.append(r)
    return rows


def replays_of(rows):
    by_launch = defaultdict(list)
    for r in rows:
        if r["graph_id"]:
            by_launch[(r["graph_id"], r["correlation_id"])].append(r)
    by_graph = defaultdict(list)
    for (graph, _), kernels in by_launch.items():
        by_graph[graph].append(sorted(kernels, key=lambda k: k["start_ns"]))
    return by_graph


STEP_KERNEL = "step_embed_recipe"  # kernels/step.cu: once in every frame step (graph or decode batch)


def step_replays(rows, skip):
    """The step graph replayed most (see the module doc), its usual replay size and its replays of
    that size in start order, the first `skip` dropped."""
    by_graph = replays_of(rows)
    steps = {g: r for g, r in by_graph.items() if any(k["name"] == STEP_KERNEL for k in r[0])}
    if not steps:
        sys.exit(f"no replays of a step graph (one with {STEP_KERNEL}) in the trace")
    graph = max(steps, key=lambda g: len(steps[g]))
    replays = sorted(by_graph[graph], key=lambda r: r[0]["start_ns"])
    size = statistics.mode(len(r) for r in replays)
    replays = [r for r in replays if len(r) == size][skip:]
    if not replays:
        sys.exit("no replays left after --skip")
    return graph, size, replays


def timeline(kernels):
    """Span, busy time, and per kernel the idle gap before it and its critical time, in ns."""
    start = kernels[0]["start_ns"]
    last_end = start
    busy = 0
    gaps, critical = [], []
    for k in kernels:
        gaps.append(max(0, k["start_ns"] - last_end))
        critical.append(max(0, k["end_ns"] - max(k["start_ns"], last_end)))
        busy += critical[-1]
        last_end = max(last_end, k["end_ns"])
    return last_end - start, busy, gaps, critical


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--skip", type=int, default=8)
    args = ap.parse_args()
    rows = read(args.trace)
    graph, size, replays = step_replays(rows, args.skip)

    spans, busies = [], []
    per_name = defaultdict(lambda: {"launches": 0, "time": [], "gap": [], "critical": []})
    for replay in replays:
        span, busy, gaps, critical = timeline(replay)
        spans.append(span)
        busies.append(busy)
        time, gap, crit = defaultdict(int), defaultdict(int), defaultdict(int)
        for k, g, c in zip(replay, gaps, critical):
            time[k["name"]] += k["end_ns"] - k["start_ns"]
            gap[k["name"]] += g
            crit[k["name"]] += c
        for name in time:
            per_name[name]["time"].append(time[name])
            per_name[name]["gap"].append(gap[name])
            per_name[name]["critical"].append(crit[name])
    for k in replays[0]:
        per_name[k["name"]]["launches"] += 1

    med = statistics.median
    span, busy = med(spans), med(busies)
    print(f"### the frame step's graph in flight: {len(replays)} replays of {size} kernels (graph {graph})\n")
    print("| kernel | launches | critical µs (median) | µs a launch | share of span | in-graph µs | idle before it, µs |")
    print("|---|---|---|---|---|---|---|")
    order = sorted(per_name.items(), key=lambda kv: -med(kv[1]["critical"]))
    for name, p in order:
        c, t, g = med(p["critical"]) / 1e3, med(p["time"]) / 1e3, med(p["gap"]) / 1e3
        print(
            f"| `{name}` | {p['launches']} | {c:.1f} | {c / p['launches']:.2f} | {100 * c * 1e3 / span:.1f} % "
            f"| {t:.1f} | {g:.1f} |"
        )
    summed = sum(med(p["time"]) for p in per_name.values())
    print()
    print(f"- Span of a replay (first kernel's start to last kernel's end), median: {span / 1e3:.1f} µs "
          f"(min {min(spans) / 1e3:.1f}, max {max(spans) / 1e3:.1f}).")
    print(f"- Busy (at least one kernel running): {busy / 1e3:.1f} µs; idle: {(span - busy) / 1e3:.1f} µs "
          f"({100 * (span - busy) / span:.1f} %), {(span - busy) / 1e3 / size:.2f} µs a launch.")
    print(f"- Kernel times summed: {summed / 1e3:.1f} µs ({summed / busy:.2f}× busy: overlap by PDL).")

    # Outside graphs: the prompts (and host-loop steps), by kernel, µs a launch.
    loose = defaultdict(list)
    for r in rows:
        if not r["graph_id"]:
            loose[r["name"]].append((r["end_ns"] - r["start_ns"]) / 1e3)
    print("\n### kernels launched outside graphs (prompts, host-loop steps), by total time\n")
    print("| kernel | launches | median µs a launch | total ms |")
    print("|---|---|---|---|")
    for name, times in sorted(loose.items(), key=lambda kv: -sum(kv[1])):
        print(f"| `{name}` | {len(times)} | {med(times):.1f} | {sum(times) / 1e3:.2f} |")


if __name__ == "__main__":
    main()
