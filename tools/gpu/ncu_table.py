#!/usr/bin/env python3
"""ncu's raw CSV of one profiled range (tools/gpu/step-ncu.sh) as a per-kernel table against floors.

    ncu_table.py NCU_CSV ENGINE_JSON step|prompt LAUNCHES_TSV > TABLE_MD

Each kernel's floor is its DRAM bytes (read + written, as ncu counted them with caches flushed)
at the copy bandwidth `bench engine` measured. A `step` range holds two frame steps, so its
numbers are halved to one frame. The table ends with the kernels' own time summed against the
wall time of the same path without the profiler: what is left is time between kernels.
"""
import csv
import json
import sys
from collections import OrderedDict

FRAMES_IN_STEP_RANGE = 2


def short(name):
    """The kernel's name without its parameter list or template arguments."""
    return name.split("(")[0].split("<")[0].strip()


def main():
    csv_path, json_path, kind, launches_path = sys.argv[1:5]
    rows = [r for r in csv.reader(open(csv_path)) if r]
    head = rows[0]
    col = {name: head.index(name) for name in head}
    data = [r for r in rows[1:] if r[col["ID"]].isdigit()]
    bench = json.load(open(json_path))
    bw = bench["copy_bandwidth_gb_per_s"] * 1e9
    per = FRAMES_IN_STEP_RANGE if kind == "step" else 1
    wall_ms = bench["graph_ms_per_frame"] if kind == "step" else bench["prompt_ms"]

    def num(r, metric):
        return float(r[col[metric]].replace(",", ""))

    kernels = OrderedDict()
    with open(launches_path, "w") as out:
        out.write("kernel\tduration_ns\tdram_read_bytes\tdram_write_bytes\tgrid\tblock\n")
        for r in data:
            name = short(r[col["Kernel Name"]])
            ns = num(r, "gpu__time_duration.sum")
            dram = num(r, "dram__bytes_read.sum") + num(r, "dram__bytes_write.sum")
            out.write(f"{name}\t{ns:.0f}\t{num(r, 'dram__bytes_read.sum'):.0f}\t"
                      f"{num(r, 'dram__bytes_write.sum'):.0f}\t{r[col['launch__grid_size']]}\t"
                      f"{r[col['launch__block_size']]}\n")
            k = kernels.setdefault(name, [0, 0.0, 0.0])
            k[0] += 1
            k[1] += ns
            k[2] += dram

    total_ns = sum(k[1] for k in kernels.values()) / per
    total_bytes = sum(k[2] for k in kernels.values()) / per
    what = "one frame step (CUDA graph), per frame" if kind == "step" else "one prompt"
    print(f"### {what}: {bench['prompt_rows']} prompt rows, copy bandwidth {bw / 1e9:.0f} GB/s\n")
    print("| kernel | launches | time (µs) | share | DRAM (MB) | GB/s | floor (µs) | × floor |")
    print("|---|---|---|---|---|---|---|---|")
    for name, (n, ns, dram) in sorted(kernels.items(), key=lambda kv: -kv[1][1]):
        us, mb = ns / per / 1e3, dram / per / 1e6
        floor_us = dram / per / bw * 1e6
        ratio = f"{us / floor_us:.1f}" if floor_us > 0.05 else "—"
        gbs = dram / ns if ns else 0.0
        print(f"| `{name}` | {n / per:g} | {us:.1f} | {100 * ns / per / 1e3 / (total_ns / 1e3):.1f} % | "
              f"{mb:.2f} | {gbs:.0f} | {floor_us:.1f} | {ratio} |")
    floor_ms = total_bytes / bw * 1e3
    print(f"| **all kernels** | {len(data) / per:g} | {total_ns / 1e3:.1f} | 100 % | {total_bytes / 1e6:.1f} | "
          f"{total_bytes / total_ns if total_ns else 0:.0f} | {floor_ms * 1e3:.1f} | {total_ns / 1e6 / floor_ms:.2f} |")
    print()
    print(f"- Kernels alone (each measured in isolation, caches flushed): {total_ns / 1e6:.3f} ms; "
          f"the path's wall time without the profiler: {wall_ms:.3f} ms.")
    gap = wall_ms - total_ns / 1e6
    if gap >= 0:
        print(f"- Between kernels (launch gaps, dependency waits, host): {gap:.3f} ms "
              f"({100 * gap / wall_ms:.0f} % of the wall time).")
    else:
        print(f"- The kernels alone sum to {-gap:.3f} ms more than the wall time: in the real run, "
              "overlapped launches and a warm L2 hide that much of what each costs measured alone.")
    if kind == "step":
        print(f"- The step's floor by its own bytes ({bench['step_bytes_per_frame'] / 1e9:.2f} GB): "
              f"{bench['step_floor_ms']:.3f} ms; wall/floor {wall_ms / bench['step_floor_ms']:.2f}.")


if __name__ == "__main__":
    main()
