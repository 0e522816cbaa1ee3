#!/usr/bin/env python3
"""One kernel's launches from a step profile (tools/gpu/step-ncu.sh's `*-kernels.tsv`), split by
the DRAM bytes each launch moved, against their floor at a copy bandwidth:

    ncu_split.py KERNELS_TSV BANDWIDTH_GBPS KERNEL_PREFIX SPLIT_MB

prints, per frame (a step range holds two frames), the launches at or below SPLIT_MB and those
above: their count, their time measured alone, their floor (bytes / bandwidth) and the ratio.
Run 19 used `linear_mma_r8` and 30 MB to tell the 66 big fused projections from the rest.
"""
import csv
import sys

FRAMES_IN_STEP_RANGE = 2


def main():
    path, bandwidth, prefix, split_mb = sys.argv[1], float(sys.argv[2]) * 1e9, sys.argv[3], float(sys.argv[4])
    rows = [r for r in csv.DictReader(open(path), delimiter="\t") if r["kernel"].startswith(prefix)]
    moved = lambda r: float(r["dram_read_bytes"]) + float(r["dram_write_bytes"])
    for label, group in [
        (f"<= {split_mb:g} MB", [r for r in rows if float(r["dram_read_bytes"]) <= split_mb * 1e6]),
        (f"> {split_mb:g} MB", [r for r in rows if float(r["dram_read_bytes"]) > split_mb * 1e6]),
    ]:
        time_us = sum(float(r["duration_ns"]) for r in group) / 1e3 / FRAMES_IN_STEP_RANGE
        floor_us = sum(map(moved, group)) / bandwidth * 1e6 / FRAMES_IN_STEP_RANGE
        ratio = time_us / floor_us if floor_us else float("nan")
        print(f"{prefix}* launches {label}: {len(group) // FRAMES_IN_STEP_RANGE} a frame, "
              f"{time_us:.0f} us alone, floor {floor_us:.0f} us, {ratio:.2f}x")


if __name__ == "__main__":
    main()
