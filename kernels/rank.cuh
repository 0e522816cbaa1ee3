// Ranking a row of scores (kernels/sampling.cu's step 2): 64-bit sort keys in rank order, the
// full bitonic sort of a row, and the radix select of its best ranks.
#pragma once
#include "common.cuh"

constexpr unsigned FULL = 0xffffffffu;

// Sort keys: ascending key = score descending, then index ascending (the CPU's tie rule). −0.0
// is folded into +0.0 first, since the CPU compares them equal. NaN and +inf never get here.
__device__ __forceinline__ unsigned long long rank_key(float score, uint32_t index) {
    const uint32_t bits = __float_as_uint(score == 0.f ? 0.f : score);
    const uint32_t ordered = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
    return ((unsigned long long)(~ordered) << 32) | index;
}

__device__ __forceinline__ float key_score(unsigned long long key) {
    const uint32_t ordered = ~(uint32_t)(key >> 32);
    return __uint_as_float((ordered & 0x80000000u) ? (ordered & 0x7fffffffu) : ~ordered);
}

__device__ __forceinline__ uint32_t key_index(unsigned long long key) { return (uint32_t)key; }

// Pads sort after every real key (whose top word is at most ~(+inf order) < 0xffffffff).
constexpr unsigned long long PAD_KEY = ~0ull;

// Bitonic sort (Batcher) of n keys in shared memory, ascending; n a power of two. Each pass
// compares n/2 disjoint pairs (i, i | j) with bit j of i clear, dealt to `ranks` threads (this
// one is `rank`); `sync` comes before every pass and after the last (the block's barrier, for a
// whole row; the selected ranks sort in registers instead, warp_sort_cand).
template <class Sync>
__device__ void bitonic_sort(unsigned long long* keys, int n, int rank, int ranks, Sync sync) {
    for (int k = 2; k <= n; k <<= 1) {
        for (int j = k >> 1; j > 0; j >>= 1) {
            sync();
            for (int p = rank; p < (n >> 1); p += ranks) {
                const int i = ((p & ~(j - 1)) << 1) | (p & (j - 1));
                const int partner = i | j;
                const bool ascending = (i & k) == 0;
                const unsigned long long a = keys[i], b = keys[partner];
                if ((a > b) == ascending) {
                    keys[i] = b;
                    keys[partner] = a;
                }
            }
        }
    }
    sync();
}

// ---------------------------------------------------------------------------------------------
// The best ranks without sorting the row (step 2's fast path). A head draw keeps ≤ 30 ranks
// (top-k ≤ HEAD_TOP_K_CAP) and so does the RAS draw, yet the full bitonic sort of 4096 keys is 78
// barrier-separated passes (≈ 47 µs a draw on the H200; a frame runs 9 head draws in series).
// Instead, a radix select over the 64-bit keys, 8 bits at a time from the top, finds the bucket
// that holds the SELECT_MIN-th smallest key; once every key up to that bucket fits in SELECT_CAP,
// those keys are collected and warp 0 sorts them. Keys are unique (their low word is the index),
// so after the last digit the bucket holds one key and the set always fits. The m keys returned
// are exactly the first m ranks of the full sort, min(n, SELECT_MIN) ≤ m ≤ SELECT_CAP; a row of
// at most SELECT_CAP keys comes back whole.
constexpr int SELECT_MIN = 64;
constexpr int SELECT_CAP = 128;
constexpr int RADIX = 256;

struct Select {
    uint32_t hist[RADIX];
    unsigned long long cand[SELECT_CAP];  // the selected keys, ascending after select_best
    unsigned long long prefix;            // the digits decided so far (bits at and above shift + 8)
    unsigned long long bound;             // once done: the selected keys are those ≤ bound
    int shift;                            // this pass's digit: key bits [shift, shift + 8)
    uint32_t taken;                       // keys below the prefix's range: all selected
    uint32_t need;                        // keys still to find within the prefix's range
    uint32_t count;                       // keys collected into cand
    bool done;
};

// Warp 0's sort of cand[0..count) into cand[0..SELECT_CAP), ascending, pads (PAD_KEY) after the
// keys: the bitonic network in registers, lane l holding elements 4l..4l+3; pairs within a lane
// compare in place, the others by shuffles (no shared-memory round trip a pass).
constexpr int WARP_SORT_PER = SELECT_CAP / 32;
__device__ void warp_sort_cand(unsigned long long* cand, uint32_t count) {
    const uint32_t lane = threadIdx.x & 31;
    unsigned long long v[WARP_SORT_PER];
#pragma unroll
    for (int j = 0; j < WARP_SORT_PER; ++j) {
        const uint32_t e = lane * WARP_SORT_PER + j;
        v[j] = e < count ? cand[e] : PAD_KEY;
    }
#pragma unroll
    for (int k = 2; k <= SELECT_CAP; k <<= 1) {
#pragma unroll
        for (int d = k >> 1; d > 0; d >>= 1) {
            if (d >= WARP_SORT_PER) {
                const int lanes = d / WARP_SORT_PER;
#pragma unroll
                for (int j = 0; j < WARP_SORT_PER; ++j) {
                    const uint32_t e = lane * WARP_SORT_PER + j;
                    const unsigned long long other = __shfl_xor_sync(FULL, v[j], lanes);
                    const bool ascending = (e & k) == 0, lower = (e & d) == 0;
                    v[j] = (lower == ascending) ? min(v[j], other) : max(v[j], other);
                }
            } else {
#pragma unroll
                for (int j = 0; j < WARP_SORT_PER; ++j) {
                    if (j & d) continue;
                    const uint32_t e = lane * WARP_SORT_PER + j;
                    const bool ascending = (e & k) == 0;
                    const unsigned long long a = v[j], b = v[j | d];
                    if ((a > b) == ascending) {
                        v[j] = b;
                        v[j | d] = a;
                    }
                }
            }
        }
    }
#pragma unroll
    for (int j = 0; j < WARP_SORT_PER; ++j) cand[lane * WARP_SORT_PER + j] = v[j];
    __syncwarp();
}

// Appends this thread's key to cand when `take`, one shared atomic a warp.
__device__ __forceinline__ void collect_key(unsigned long long* cand, uint32_t& count, bool take,
                                            unsigned long long key) {
    const uint32_t lane = threadIdx.x & 31;
    const unsigned takers = __ballot_sync(FULL, take);
    if (takers == 0) return;
    const int leader = __ffs(takers) - 1;
    uint32_t base = 0;
    if ((int)lane == leader) base = atomicAdd(&count, (uint32_t)__popc(takers));
    base = __shfl_sync(FULL, base, leader);
    if (take) cand[base + __popc(takers & ((1u << lane) - 1))] = key;
}

// One pass's histogram of the digit at `shift` over the keys within the prefix's range. The lanes
// whose digit is the warp's first in-range lane's add once, by that lane (the first pass puts
// nearly every key in one bucket); the others add their own. (Grouping every digit by
// __match_any_sync cost more than the atomics it saved: tools/gpu/sample-lab.sh, run 38.)
__device__ void select_histogram(const unsigned long long* keys, int n, Select& s, int shift,
                                 unsigned long long prefix) {
    for (int b = threadIdx.x; b < RADIX; b += blockDim.x) s.hist[b] = 0;
    __syncthreads();
    for (int base = 0; base < n; base += blockDim.x) {
        const int i = base + threadIdx.x;
        bool in = false;
        uint32_t digit = 0;
        if (i < n) {
            const unsigned long long key = keys[i];
            in = shift == 56 || (key >> (shift + 8)) == (prefix >> (shift + 8));
            digit = (uint32_t)(key >> shift) & (RADIX - 1);
        }
        const unsigned active = __ballot_sync(FULL, in);
        if (active == 0) continue;
        const int leader = __ffs(active) - 1;
        const uint32_t lead = __shfl_sync(FULL, digit, leader);
        const unsigned same = __ballot_sync(FULL, in && digit == lead);
        if ((int)(threadIdx.x & 31) == leader) atomicAdd(&s.hist[lead], (uint32_t)__popc(same));
        else if (in && digit != lead) atomicAdd(&s.hist[digit], 1u);
    }
    __syncthreads();
}

// Warp 0 after a histogram: the bucket holding the need-th key of the prefix's range. Either
// every key up to that bucket fits (done: bound set) or the select descends into the bucket.
__device__ void select_bucket(Select& s, int shift, unsigned long long prefix) {
    const uint32_t lane = threadIdx.x & 31;
    uint32_t c[RADIX / 32];
    uint32_t sum = 0;
#pragma unroll
    for (int j = 0; j < RADIX / 32; ++j) {
        c[j] = s.hist[(RADIX / 32) * lane + j];
        sum += c[j];
    }
    uint32_t through = sum;  // inclusive scan of the lanes' sums
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const uint32_t t = __shfl_up_sync(FULL, through, o);
        if (lane >= (uint32_t)o) through += t;
    }
    const uint32_t need = s.need;
    uint32_t below = through - sum;
    if (!(below < need && need <= through)) return;  // exactly one lane holds the need-th key
    int b = (RADIX / 32) * lane;
#pragma unroll
    for (int j = 0; j < RADIX / 32; ++j) {
        if (below + c[j] >= need) {
            b = (RADIX / 32) * lane + j;
            break;
        }
        below += c[j];
    }
    const unsigned long long bucket = prefix | ((unsigned long long)b << shift);
    if (s.taken + below + s.hist[b] <= SELECT_CAP || shift == 0) {
        s.bound = bucket | ((1ull << shift) - 1);
        s.done = true;
    } else {
        s.prefix = bucket;
        s.taken += below;
        s.need = need - below;
        s.shift = shift - 8;
    }
}

// Step 2's fast path: fills s.cand with the best m ranks in rank order and returns m (see above).
// All threads call it; keys[0..n) are the row's keys.
__device__ int select_best(const unsigned long long* keys, int n, Select& s) {
    if (threadIdx.x == 0) {
        s.prefix = 0;
        s.shift = 56;
        s.taken = 0;
        s.need = (uint32_t)min(n, SELECT_MIN);
        s.count = 0;
        s.done = n <= SELECT_CAP;
        s.bound = PAD_KEY - 1;  // every real key
    }
    __syncthreads();
    while (!s.done) {
        const int shift = s.shift;
        const unsigned long long prefix = s.prefix;
        select_histogram(keys, n, s, shift, prefix);
        if (threadIdx.x < 32) select_bucket(s, shift, prefix);
        __syncthreads();
    }
    const unsigned long long bound = s.bound;
    for (int base = 0; base < n; base += blockDim.x) {
        const int i = base + threadIdx.x;
        const unsigned long long key = i < n ? keys[i] : PAD_KEY;
        collect_key(s.cand, s.count, i < n && key <= bound, key);
    }
    __syncthreads();
    const int m = (int)s.count;
    if (threadIdx.x < 32) warp_sort_cand(s.cand, (uint32_t)m);
    __syncthreads();
    return m;
}

