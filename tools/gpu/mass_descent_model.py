"""A CPU model of kernels/kept_prefix.cuh's `mass_draw` descent, held to the CPU sampler's loop.

The kernel decides where a draw's kept prefix ends without sorting: a radix descent over the
64-bit rank keys that carries each bucket's probability in fixed point (p · 2^48) and decides
only where every compared cumulative lies farther than 2e-10 from top-p. This model runs the
same rules (buckets, leaf scan, the rank after the leaf) in Python on random rows — flat to
peaked, ties on a grid, half -inf, random top-p and top-k, both crossing rules — and checks that
every row it decides keeps exactly the ranks `src/model/sampling.rs`'s `kept_candidates` keeps.
Prints how many rows were decided and how many were left to the sort; exits 1 on a mismatch.

    python3 tools/gpu/mass_descent_model.py [ROWS]     (default 3000; ~1 min a thousand rows)
"""
import math
import random
import struct
import sys

MARGIN = 2e-10  # SCAN_NEAR_TOP_P
ONE = 2.0**48  # MASS_ONE
PAD = (1 << 64) - 1  # PAD_KEY
LEAF = 128  # MASS_LEAF


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def rank_key(score, index):
    """kernels/rank.cuh `rank_key`: ascending key = score descending, then index ascending."""
    bits = struct.unpack("<I", struct.pack("<f", score + 0.0))[0]
    ordered = (~bits & 0xFFFFFFFF) if bits & 0x80000000 else (bits | 0x80000000)
    return ((~ordered & 0xFFFFFFFF) << 32) | index


def key_score(key):
    ordered = (~(key >> 32)) & 0xFFFFFFFF
    bits = (ordered & 0x7FFFFFFF) if ordered & 0x80000000 else (~ordered & 0xFFFFFFFF)
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def cpu_end(sorted_keys, best, limit, top_p, keep_crossing):
    """The CPU's loop (`kept_candidates`): how many ranks it keeps."""
    weights = [math.exp(key_score(k) - best) for k in sorted_keys]
    total = sum(weights)
    cumulative = weights[0] / total
    end = 1
    for r in range(1, limit):
        before = cumulative
        cumulative += weights[r] / total
        if (before if keep_crossing else cumulative) > top_p:
            break
        end += 1
    return end


def mass_end(keys, best, total, limit, top_p, keep_crossing):
    """The kernel's descent: the last kept key, or None where it is not sure."""
    mass = {k: round(math.exp(key_score(k) - best) / total * ONE) for k in keys}
    prefix, shift, below_count, below_mass = 0, 56, 0, 0
    while True:
        count, weight = [0] * 256, [0] * 256
        for k in keys:
            if shift == 56 or (k >> (shift + 8)) == (prefix >> (shift + 8)):
                digit = (k >> shift) & 255
                count[digit] += 1
                weight[digit] += mass[k]
        first, low, found = below_count, below_mass, None
        for b in range(256):
            if count[b] == 0:
                continue
            last = first + count[b] - 1
            if last < limit and (last == 0 or (low + weight[b]) / ONE < top_p - MARGIN):
                first += count[b]
                low += weight[b]
                continue
            found = b
            break
        if found is None:
            return PAD - 1 if shift == 56 else None
        start = prefix | (found << shift)
        if first >= limit or (first >= 1 and low / ONE > top_p + MARGIN):
            return start - 1
        if count[found] > LEAF and shift > 0:
            prefix, shift, below_count, below_mass = start, shift - 8, first, low
            continue
        hi = start | ((1 << shift) - 1)
        leaf = sorted(k for k in keys if start <= k <= hi)
        carry = low
        for i, k in enumerate(leaf):
            r = first + i
            before = carry
            carry += mass[k]
            passed = (before if keep_crossing else carry) / ONE
            if r >= limit:
                return leaf[i - 1] if i > 0 else start - 1
            if r >= 1:
                if abs(passed - top_p) <= MARGIN:
                    return None
                if passed > top_p:
                    return leaf[i - 1] if i > 0 else start - 1
        if first + len(leaf) >= limit or carry / ONE > top_p + MARGIN:
            return hi
        return None


def random_case(rng):
    n = rng.choice([4097, 4097, 300, 1000])
    scale = rng.choice([0.01, 0.1, 0.5, 1, 3])
    on_grid = rng.random() < 0.3
    temperature = rng.choice([0.5, 1.0, 1.7])
    scores = []
    for _ in range(n):
        v = rng.uniform(-scale, scale)
        if on_grid:
            v = round(v * 16 / scale) * scale / 16
        scores.append(f32(f32(v) / f32(temperature)))
    if rng.random() < 0.1:
        for i in rng.sample(range(n), n // 2):
            scores[i] = -math.inf
    top_k = rng.choice([None, rng.randint(100, n), 100000])
    limit = min(n, top_k) if top_k else n
    top_p = 1.0 if rng.random() < 0.06 else f32(rng.uniform(0.02, 1.0))
    return scores, limit, top_p, rng.random() < 0.8


def main():
    rows = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    rng = random.Random(1)
    decided = unsure = mismatches = 0
    for case in range(rows):
        scores, limit, top_p, keep_crossing = random_case(rng)
        keys = [rank_key(s, i) for i, s in enumerate(scores)]
        best = key_score(min(keys))
        total = sum(math.exp(key_score(k) - best) for k in keys)
        last_kept = mass_end(keys, best, total, limit, top_p, keep_crossing)
        if last_kept is None:
            unsure += 1
            continue
        decided += 1
        got = sum(1 for k in keys if k <= last_kept)
        want = cpu_end(sorted(keys), best, limit, top_p, keep_crossing)
        if got != want:
            mismatches += 1
            print(f"row {case}: the descent keeps {got} ranks, the CPU {want}")
    print(f"{rows} rows: {decided} decided, {unsure} left to the sort, {mismatches} mismatches")
    sys.exit(1 if mismatches else 0)


main()
