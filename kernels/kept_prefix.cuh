// Where a draw's kept prefix ends (kernels/sampling.cu's step 4): the CPU's serial loop on
// sorted ranks (kept_prefix, rank_order_total), a block scan of it that is sure or defers
// (scanned_prefix_end), and the radix descent over probability mass that needs no sort
// (mass_draw, which also runs the race over what it keeps).
#pragma once
#include "draw.cuh"

// ---------------------------------------------------------------------------------------------
// The kept prefix (warp 0; every lane returns the same). The CPU's loop, in rank order and with
// the same f64 operations: cumulative += p_r, p_r = w_r / total, stopping at the first rank
// r ≥ 1 that top-k or top-p rejects. 32 ranks at a time, each lane computes one p_r; then every
// lane adds all 32 in order (the same adds on every lane, so the loop and its exits stay
// warp-uniform). Serial by design: as many adds as kept ranks (≤ 30 for RAS and heads; up to n
// for a flat row under a wide top-p).
//
// `near`: some compared cumulative lay within NEAR_TOP_P of top_p, so the total's summation
// order (a tree here, rank order on the CPU; a few ulps apart) may decide the comparison. That
// is not rare where a cumulative meets top_p exactly in real arithmetic: top_p = 1 on a row
// whose non-zero weights all fit in the prefix (the crossing rule then hinges on Σp rounding to
// 1.0 or just above), or m tied weights with top_p = k/m. The caller then recomputes the total
// in the CPU's order. NEAR_TOP_P is far above the two totals' relative gap (≤ ~(n + log2 n) ·
// 2^-53 ≈ 1e-12 for n ≤ SORT_CAP), and a continuous row comes this near with probability ~1e-6.
constexpr double NEAR_TOP_P = 1e-10;

struct Prefix {
    uint32_t end;  // ranks < end are kept
    bool near;
};

__device__ Prefix kept_prefix(const unsigned long long* keys, float best, double total, uint32_t limit,
                              const Filter& f) {
    const uint32_t lane = threadIdx.x & 31;
    const double top_p = (double)f.top_p;
    Prefix prefix{limit, false};
    double cumulative = 0.0;
    bool stopped = false;
    for (uint32_t base = 0; base < limit && !stopped; base += 32) {
        const uint32_t mine = base + lane;
        const double p = mine < limit ? __ddiv_rn(rank_weight(keys[mine], best), total) : 0.0;
        for (int j = 0; j < 32; ++j) {
            const double pj = __shfl_sync(FULL, p, j);
            const uint32_t r = base + j;
            if (r >= limit) break;
            const double before = cumulative;
            cumulative = __dadd_rn(cumulative, pj);
            if (r == 0) continue;
            const double passed = f.keep_crossing ? before : cumulative;
            prefix.near |= fabs(__dsub_rn(passed, top_p)) <= NEAR_TOP_P;
            if (passed > top_p) {
                prefix.end = r;
                stopped = true;
                break;
            }
        }
    }
    return prefix;
}

// Σ w_r over all n ranks, added in rank order as the CPU adds them (warp 0; every lane returns
// the same). n serial adds: only for draws kept_prefix marks `near`.
__device__ double rank_order_total(const unsigned long long* keys, float best, int n) {
    const uint32_t lane = threadIdx.x & 31;
    double total = 0.0;
    for (int base = 0; base < n; base += 32) {
        const double w = base + (int)lane < n ? rank_weight(keys[base + lane], best) : 0.0;
        for (int j = 0; j < 32 && base + j < n; ++j) total = __dadd_rn(total, __shfl_sync(FULL, w, j));
    }
    return total;
}

// The kept prefix's end by a block-wide scan, or UINT32_MAX where it cannot be sure. kept_prefix
// is serial (one add per kept rank: a flat row under a wide top-p keeps thousands, ~100 µs).
// Here thread t holds the p_r of its `per` contiguous ranks (the same __ddiv_rn(w_r, total) as
// kept_prefix), and the cumulative sums come from a block scan: the same p_r added in another
// order, within ~n · 2^-53 ≈ 1e-12 of the serial sums for n ≤ SORT_CAP. So where every compared
// cumulative (ranks 1 up to the first that passes top_p) lies farther than SCAN_NEAR_TOP_P from
// top_p, the serial loop — with either total — makes the same comparisons and ends at the same
// rank, and this is its answer; otherwise the caller runs the serial loop. SCAN_NEAR_TOP_P is
// twice NEAR_TOP_P, so a serial run this defers to never reaches its own `near` case either.
constexpr double SCAN_NEAR_TOP_P = 2 * NEAR_TOP_P;

__device__ __forceinline__ uint32_t scanned_prefix_end(const double (&w)[ITEMS], int per, int first_rank, double total,
                                       uint32_t limit, const Filter& f, Scratch& s) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const double top_p = (double)f.top_p;
    double p[ITEMS];
    double own = 0.0;
#pragma unroll
    for (int j = 0; j < ITEMS; ++j) {
        const uint32_t r = (uint32_t)(first_rank + j);
        p[j] = j < per && r < limit ? __ddiv_rn(w[j], total) : 0.0;
        own = __dadd_rn(own, p[j]);
    }
    // Exclusive scan of the threads' sums in thread order (= rank order): within the warp, then
    // over the warps' totals (WARPS == 32: one lane each).
    double incl = own;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const double v = __shfl_up_sync(FULL, incl, o);
        if (lane >= o) incl = __dadd_rn(incl, v);
    }
    double before = __shfl_up_sync(FULL, incl, 1);
    if (lane == 0) before = 0.0;
    __syncthreads();  // s.d may hold a previous reduction's values still being read
    if (lane == 31) s.d[warp] = incl;
    __syncthreads();
    if (warp == 0) {
        double t = s.d[lane];
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const double v = __shfl_up_sync(FULL, t, o);
            if (lane >= o) t = __dadd_rn(t, v);
        }
        s.d[lane] = t;
    }
    __syncthreads();
    if (warp > 0) before = __dadd_rn(before, s.d[warp - 1]);
    // The first rank r ≥ 1 whose compared cumulative passes top_p.
    double cumulative = before;
    uint32_t crossing = UINT32_MAX;
#pragma unroll
    for (int j = 0; j < ITEMS; ++j) {
        const uint32_t r = (uint32_t)(first_rank + j);
        const double was = cumulative;
        cumulative = __dadd_rn(cumulative, p[j]);
        const double passed = f.keep_crossing ? was : cumulative;
        if (j < per && r >= 1 && r < limit && passed > top_p) crossing = min(crossing, r);
    }
    crossing = block_min_u32(crossing, s);
    // Any comparison up to that rank within reach of rounding: not sure.
    cumulative = before;
    uint32_t sure = 1;
#pragma unroll
    for (int j = 0; j < ITEMS; ++j) {
        const uint32_t r = (uint32_t)(first_rank + j);
        const double was = cumulative;
        cumulative = __dadd_rn(cumulative, p[j]);
        const double passed = f.keep_crossing ? was : cumulative;
        if (j < per && r >= 1 && r < limit && r <= crossing && fabs(__dsub_rn(passed, top_p)) <= SCAN_NEAR_TOP_P)
            sure = 0;
    }
    if (block_min_u32(sure, s) == 0) return UINT32_MAX;
    return min(crossing, limit);
}

// ---------------------------------------------------------------------------------------------
// The kept prefix without sorting the row: a radix descent over probability mass. Where a draw
// may keep more ranks than select_best finds (a flat row under a wide top-p keeps thousands),
// the full bitonic sort of the row costs ~100 µs (91 barrier-separated passes over 8192 keys). Yet
// the draw needs only which ranks are kept — the prefix ends at a key, and the race runs over
// every key below it in any order (its ties go to the lower key, which is the lower rank).
//
// So, as select_best descends by count, this descends by mass: each pass histograms the keys in
// the current range by their next 8 bits, with each bucket's count and its summed probability
// in fixed point, P = round(p · 2^48) with p = w / total as kept_prefix computes it. Integer sums
// are exact in any order, so every bucket's mass is the same whichever thread adds what; against
// the CPU's serial f64 cumulative (rank order, its own total) they differ by at most
// n · 2^-49 (the roundings, ≤ 1.5e-11 at SORT_CAP) + ~n · 2^-53 (the CPU's adds and totals,
// ≈ 1e-12): far inside SCAN_NEAR_TOP_P (2e-10). Each compared cumulative of a bucket's ranks
// lies within [L, U] (the mass below its first key; through its last). Walking the buckets in
// rank order:
//   - a bucket whose every rank is below the limit (top-k) and whose U < top_p − margin keeps all
//     its ranks, surely (rank 0 is never compared);
//   - at the first bucket that does not: if its first rank is the limit, or is compared and its L
//     > top_p + margin, the prefix ends there, surely; otherwise the end lies within it, and the
//     descent continues into it, down to a bucket of ≤ MASS_LEAF keys, which warp 0 sorts and
//     scans rank by rank with the same fixed-point cumulative.
// Any compared cumulative within the margin of top_p, or an end just past the leaf that the
// leaf's mass cannot decide, leaves the draw unsure: the caller sorts the row (the path that
// handles those cases in the CPU's own order). Monotone cumulatives make the check local: only
// the last compared value below top_p and the first above can lie within the margin.
constexpr double MASS_ONE = 281474976710656.0;  // 2^48
constexpr int MASS_LEAF = SELECT_CAP;            // a leaf is sorted in Select::cand
// Keys a thread holds through the descent (its masses in registers): rows of up to
// MASS_HELD · THREADS candidates (the main draw's 4097); a longer row sorts.
constexpr int MASS_HELD = 5;
constexpr int MASS_DESCEND = 0, MASS_LEAF_SCAN = 1, MASS_DONE = 2, MASS_UNSURE = 3;

// A mass P ≤ 2^48 as u32 parts that sum apart without overflow: P >> 24, bits 12..23, bits 0..11.
constexpr int MASS_PARTS = 3;
__device__ __forceinline__ constexpr int mass_part_shift(int i) { return 24 - 12 * i; }
__device__ __forceinline__ uint32_t mass_part(unsigned long long mass, int i) {
    return i == 0 ? (uint32_t)(mass >> 24) : (uint32_t)(mass >> mass_part_shift(i)) & 0xFFFu;
}

struct MassSelect {
    uint32_t count[RADIX];
    // Each bucket's Σ P in MASS_PARTS parts (mass_part), summed apart: Σ_i 2^mass_part_shift(i)
    // · mass[i][bucket] (see mass_histogram).
    uint32_t mass[MASS_PARTS][RADIX];
    unsigned long long prefix;     // the digits decided so far (bits at and above shift + 8)
    int shift;                     // this pass's digit: key bits [shift, shift + 8)
    int state;                     // MASS_*
    uint32_t below_count;          // ranks below the range
    unsigned long long below_mass; // their fixed-point mass
    unsigned long long leaf_lo, leaf_hi;  // the leaf's key range (MASS_LEAF_SCAN)
    unsigned long long last_kept;  // once MASS_DONE: the kept ranks are the keys ≤ last_kept
};

__device__ __forceinline__ unsigned long long rank_mass(unsigned long long key, float best, double total) {
    return __double2ull_rn(__dmul_rn(__ddiv_rn(rank_weight(key, best), total), MASS_ONE));
}

__device__ __forceinline__ double mass_p(unsigned long long mass) { return (double)mass * (1.0 / MASS_ONE); }

// One pass over the range's keys: each bucket's count and mass. The mass is added as three u32
// parts of each P — P >> 24, bits 12..23, bits 0..11 — since a 64-bit shared atomicAdd is a
// compare-and-swap loop on sm_90 (SASS ATOMS.CAS), and the first pass's warps, nearly all adding
// to one bucket, kept retrying it (~8 µs a pass; tools/gpu/sample-lab.sh, run 38). The parts'
// sums stay exact: Σ P ≤ 2^48 + n over the row, so Σ (P >> 24) ≤ 2^24 + n, and the others sum
// below n · 2^12. As in select_histogram, the lanes that share the warp's first in-range lane's
// digit add once, by that lane, and the others add their own.
__device__ void mass_histogram(const unsigned long long* keys, int n, const unsigned long long (&mass)[MASS_HELD],
                               MassSelect& s, int shift, unsigned long long prefix) {
    for (int b = threadIdx.x; b < RADIX; b += blockDim.x) {
        s.count[b] = 0;
#pragma unroll
        for (int i = 0; i < MASS_PARTS; ++i) s.mass[i][b] = 0;
    }
    __syncthreads();
    const int lane = threadIdx.x & 31;
    const int held = (n + THREADS - 1) / THREADS;  // block-uniform: the ballots stay whole
#pragma unroll
    for (int j = 0; j < MASS_HELD; ++j) {
        if (j >= held) break;
        const int i = (int)threadIdx.x + j * THREADS;
        const unsigned long long key = i < n ? keys[i] : PAD_KEY;
        const bool in = i < n && (shift == 56 || (key >> (shift + 8)) == (prefix >> (shift + 8)));
        const uint32_t digit = (uint32_t)(key >> shift) & (RADIX - 1);
        const unsigned active = __ballot_sync(FULL, in);
        if (active == 0) continue;
        const int leader = __ffs(active) - 1;
        const uint32_t lead = __shfl_sync(FULL, digit, leader);
        const bool with_lead = in && digit == lead;
        const unsigned same = __ballot_sync(FULL, with_lead);
        uint32_t part[MASS_PARTS], sum[MASS_PARTS];
#pragma unroll
        for (int i = 0; i < MASS_PARTS; ++i) {
            part[i] = mass_part(mass[j], i);
            sum[i] = __reduce_add_sync(FULL, with_lead ? part[i] : 0u);
        }
        if (lane == leader) {
            atomicAdd(&s.count[lead], (uint32_t)__popc(same));
#pragma unroll
            for (int i = 0; i < MASS_PARTS; ++i) atomicAdd(&s.mass[i][lead], sum[i]);
        } else if (in && !with_lead) {
            atomicAdd(&s.count[digit], 1u);
#pragma unroll
            for (int i = 0; i < MASS_PARTS; ++i) atomicAdd(&s.mass[i][digit], part[i]);
        }
    }
    __syncthreads();
}

// Warp 0 after a pass: the first bucket that does not surely keep all its ranks, and what it
// decides (see above). Lane l holds buckets 8l .. 8l + 7.
__device__ void mass_bucket(MassSelect& s, int shift, unsigned long long prefix, uint32_t limit, const Filter& f) {
    constexpr int PER = RADIX / 32;
    const uint32_t lane = threadIdx.x & 31;
    const double top_p = (double)f.top_p;
    uint32_t c[PER];
    unsigned long long m[PER];
    uint32_t csum = 0;
    unsigned long long msum = 0;
#pragma unroll
    for (int j = 0; j < PER; ++j) {
        c[j] = s.count[PER * lane + j];
        m[j] = 0;
#pragma unroll
        for (int i = 0; i < MASS_PARTS; ++i) m[j] += (unsigned long long)s.mass[i][PER * lane + j] << mass_part_shift(i);
        csum += c[j];
        msum += m[j];
    }
    uint32_t cthrough = csum;  // inclusive scans of the lanes' sums
    unsigned long long mthrough = msum;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const uint32_t tc = __shfl_up_sync(FULL, cthrough, o);
        const unsigned long long tm = __shfl_up_sync(FULL, mthrough, o);
        if (lane >= (uint32_t)o) {
            cthrough += tc;
            mthrough += tm;
        }
    }
    uint32_t first = s.below_count + (cthrough - csum);
    unsigned long long lo = s.below_mass + (mthrough - msum);
    int found = -1;
#pragma unroll
    for (int j = 0; j < PER; ++j) {
        if (found >= 0 || c[j] == 0) continue;
        const uint32_t last = first + c[j] - 1;
        const bool kept = last < limit && (last == 0 || mass_p(lo + m[j]) < top_p - SCAN_NEAR_TOP_P);
        if (!kept) {
            found = j;
        } else {
            first += c[j];
            lo += m[j];
        }
    }
    const unsigned any = __ballot_sync(FULL, found >= 0);
    if (any == 0) {
        // Every rank kept: only possible over the whole row (a range is descended into only
        // when it does not keep all its ranks, and its last bucket ends as it ends).
        if (lane == 0) {
            s.state = shift == 56 ? MASS_DONE : MASS_UNSURE;
            s.last_kept = PAD_KEY - 1;
        }
        return;
    }
    if ((int)lane != __ffs(any) - 1) return;
    const unsigned long long start = prefix | ((unsigned long long)(PER * lane + found) << shift);
    if (first >= limit || (first >= 1 && mass_p(lo) > top_p + SCAN_NEAR_TOP_P)) {
        // The prefix ends at the bucket's first rank (keys below it exist, so start ≥ 1).
        s.state = MASS_DONE;
        s.last_kept = start - 1;
    } else if (c[found] <= (uint32_t)MASS_LEAF || shift == 0) {
        s.state = MASS_LEAF_SCAN;
        s.leaf_lo = start;
        s.leaf_hi = start | ((1ull << shift) - 1);
    } else {
        s.prefix = start;
        s.shift = shift - 8;
    }
    s.below_count = first;
    s.below_mass = lo;
}

// Warp 0 over the leaf's sorted keys (cand[0..count)): the compared cumulatives rank by rank,
// 32 at a time by an exact integer scan; sets MASS_DONE with last_kept, or MASS_UNSURE.
__device__ void mass_leaf(MassSelect& s, const unsigned long long* cand, uint32_t count, float best, double total,
                          uint32_t limit, const Filter& f) {
    const int lane = threadIdx.x & 31;
    const double top_p = (double)f.top_p;
    unsigned long long carry = s.below_mass;
    bool near = false;
    int stop = -1;  // leaf index of the first rank not kept
    for (uint32_t base = 0; base < count && stop < 0; base += 32) {
        const uint32_t i = base + lane;
        const uint32_t r = s.below_count + i;
        const unsigned long long p = i < count ? rank_mass(cand[i], best, total) : 0ull;
        unsigned long long incl = p;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const unsigned long long t = __shfl_up_sync(FULL, incl, o);
            if (lane >= o) incl += t;
        }
        const double passed = mass_p(carry + (f.keep_crossing ? incl - p : incl));
        const bool compared = i < count && r >= 1 && r < limit;
        const bool ends = (i < count && r >= limit) || (compared && passed > top_p);
        const unsigned ending = __ballot_sync(FULL, ends);
        const int first_end = ending ? __ffs(ending) - 1 : 32;
        near |= __any_sync(FULL, compared && lane <= first_end && fabs(passed - top_p) <= SCAN_NEAR_TOP_P);
        if (ending) stop = (int)base + first_end;
        carry += __shfl_sync(FULL, incl, 31);
    }
    if (lane != 0) return;
    if (near) {
        s.state = MASS_UNSURE;
    } else if (stop >= 0) {
        s.state = MASS_DONE;
        s.last_kept = stop > 0 ? cand[stop - 1] : s.leaf_lo - 1;  // stop 0: a compared rank, so keys lie below
    } else if (s.below_count + count >= limit || mass_p(carry) > top_p + SCAN_NEAR_TOP_P) {
        // The rank after the leaf is the limit, or surely passes top_p (its compared cumulative
        // is at least the mass through the leaf).
        s.state = MASS_DONE;
        s.last_kept = s.leaf_hi;
    } else {
        s.state = MASS_UNSURE;
    }
}

// Steps 4–5 by the mass descent: the pick's index, or UINT32_MAX when unsure (the caller sorts).
// All threads call it; keys[0..n) are the row's keys, unsorted; `total` as fast_draw's. Not
// inlined: its registers (the held masses) would otherwise spill in the kernels' other paths
// (ptxas: the head draw's spill loads 104 bytes a thread against 296 inlined).
__device__ __noinline__ uint32_t mass_draw(const unsigned long long* keys, int n, float best, double total, const Filter& f,
                              const DrawKey& key, MassSelect& s, Select& sel, Scratch& scratch) {
    const uint32_t limit = min((uint32_t)n, f.top_k);
    if (limit == 0 || n > MASS_HELD * THREADS) return UINT32_MAX;
    unsigned long long mass[MASS_HELD];
#pragma unroll
    for (int j = 0; j < MASS_HELD; ++j) {
        const int i = (int)threadIdx.x + j * THREADS;
        mass[j] = i < n ? rank_mass(keys[i], best, total) : 0ull;
    }
    if (threadIdx.x == 0) {
        s.prefix = 0;
        s.shift = 56;
        s.state = MASS_DESCEND;
        s.below_count = 0;
        s.below_mass = 0;
        sel.count = 0;
    }
    __syncthreads();
    while (s.state == MASS_DESCEND) {
        const int shift = s.shift;
        const unsigned long long prefix = s.prefix;
        mass_histogram(keys, n, mass, s, shift, prefix);
        if (threadIdx.x < 32) mass_bucket(s, shift, prefix, limit, f);
        __syncthreads();
    }
    if (s.state == MASS_LEAF_SCAN) {
        const unsigned long long lo = s.leaf_lo, hi = s.leaf_hi;
        for (int base = 0; base < n; base += blockDim.x) {
            const int i = base + threadIdx.x;
            const unsigned long long k = i < n ? keys[i] : PAD_KEY;
            collect_key(sel.cand, sel.count, i < n && k >= lo && k <= hi, k);
        }
        __syncthreads();
        if (threadIdx.x < 32) {
            const uint32_t count = sel.count;
            warp_sort_cand(sel.cand, count);
            mass_leaf(s, sel.cand, count, best, total, limit, f);
        }
        __syncthreads();
    }
    if (s.state != MASS_DONE) return UINT32_MAX;

    // The exponential race over the kept keys, in any order.
    const unsigned long long last_kept = s.last_kept;
    double value = -INFINITY;
    unsigned long long winner = PAD_KEY;
#pragma unroll
    for (int j = 0; j < MASS_HELD; ++j) {
        const int i = (int)threadIdx.x + j * THREADS;
        if (i >= n) continue;
        const unsigned long long k = keys[i];
        if (k > last_kept) continue;
        better(value, winner, __ddiv_rn(rank_weight(k, best), exponential(key, key_index(k))), k);
    }
    return key_index(block_argmax(value, winner, scratch));
}
