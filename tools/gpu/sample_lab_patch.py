"""Marks the draw phases of kernels/sampling.cu, kept_prefix.cuh or rank.cuh for tools/gpu/sample-lab.sh: `PROBE(i);` (thread 0's
clock64; sample_lab.cu defines PROBE) after each anchor's statement, PROBE(0) where a draw
starts, and `LAB_PASS();` after each radix pass's histogram and bucket. An anchor missing from
the file (the other file's, or an older sampling.cu's) is reported and skipped.

    python3 sample_lab_patch.py SRC DST
"""
import sys

ANCHORS = [
    ("    const float divisor = fmaxf(f.temperature, MIN_TEMPERATURE);", 1),
    ("    block_min_u32_key(bad, first, scratch);", 2),
    ("        return Draw{0, {FAULT_NON_FINITE, bad, __float_as_uint(__fdiv_rn(row(bad), divisor))}};\n    }", 2),
    ("    const double fast_total = block_sum(own, scratch);", 3),
    ("        const int m = select_best(keys, n, select);", 4),
    ("    if (narrow) first = select.cand[0];", 4),
    ("        const uint32_t fast = fast_draw(n, m, select.cand, best, fast_total, f, key, scratch);", 5),
    ("        mass[j] = i < n ? rank_mass(keys[i], best, total) : 0ull;\n    }", 6),
    ("        if (threadIdx.x < 32) mass_bucket(s, shift, prefix, limit, f);\n        __syncthreads();\n    }", 7),
    ("            mass_leaf(s, sel.cand, count, best, total, limit, f);\n        }\n        __syncthreads();\n    }", 8),
    ("    const unsigned long long last_kept = s.last_kept;", 9),
    ("        const uint32_t massed = mass_draw(keys, n, best, fast_total, f, key, mass, select, scratch);", 10),
]


PASS_ANCHORS = [
    "        select_histogram(keys, n, s, shift, prefix);",
    "        if (threadIdx.x < 32) select_bucket(s, shift, prefix);",
    "        mass_histogram(keys, n, mass, s, shift, prefix);",
    "        if (threadIdx.x < 32) mass_bucket(s, shift, prefix, limit, f);",
]


def main():
    src, dst = sys.argv[1:3]
    text = open(src).read()
    for anchor, i in ANCHORS:
        if anchor in text:
            text = text.replace(anchor, anchor + f"\n    PROBE({i});", 1)
        else:
            print(f"sample_lab_patch: probe {i} has no anchor in {src}", file=sys.stderr)
    for anchor in PASS_ANCHORS:
        if anchor in text:
            text = text.replace(anchor, anchor + "\n        LAB_PASS();", 1)
    start = "    const float divisor = fmaxf(f.temperature, MIN_TEMPERATURE);"
    text = text.replace(start, "    PROBE(0);\n" + start, 1)
    open(dst, "w").write(text)


main()
