// Token sampling on the GPU (`model.md` §8.1 steps 2 and 4, §8.2): the same decisions as the CPU
// sampler (src/model/sampling.rs, the oracle) on the same logits, with the same Philox draws
// (src/model/rng.rs). Built for CUDA-graph capture: every input and output is device memory at a
// fixed address, and the per-request knobs, the RAS window and the frame counter live in a device
// `SamplerState`, so a captured frame replays correctly frame after frame.
//
// Every kernel serves `rows` requests at once (the decode batch): row b reads `SamplerState`
// st[b] and its logits row, and writes `SamplerOut` out[b]. Each row's draws are its own row's
// alone, so a row's picks never depend on the others.
//
//   sample_main_draws   2 × rows blocks: the first draw (blockIdx.x 0, request knobs) and the RAS
//                       draw (blockIdx.x 1, T 1.0, top-k 30, top-p 0.95), both keeping the
//                       crossing token; blockIdx.y is the row;
//   sample_main_finish  one block per row: the window check, the push into the RAS window, and
//                       the frame row's main token, c0 and "is semantic";
//   sample_head         one block per row: codebook head r's draw (crossing token dropped), code
//                       c_{r+1};
//   sampler_end_frame   one block per row: the frame counter + 1.
//
// One draw = one block of THREADS threads over one row of n ≤ SORT_CAP logits:
//   1. scores s_i = x_i / max(T, 1e-5) in f32 (IEEE division, as Rust's `/`);
//   2. rank: a draw that keeps at most SELECT_MIN ranks (top-k) takes the SELECT_CAP best keys
//      at most (score descending, then index ascending) by a radix select and a one-warp sort
//      (`select_best`); one that may keep more finds where its kept prefix ends by a radix
//      descent over probability mass, without sorting (`mass_draw`); the full row's bitonic
//      sort runs only where neither is sure (see `draw`);
//   3. weights w_r = exp(s_r − s_0) in f64 and their total over the FULL row (a block sum);
//   4. the kept prefix: warp 0 runs the CPU's loop — p_r = w_r / total added in rank order, the
//      same f64 operations in the same order — until top-k or top-p stops it; where a comparison
//      lies within rounding of top_p, again with the total added in the CPU's order. Over the
//      full sort a block scan finds the same end first and the serial loop runs only where the
//      scan is not sure of it (scanned_prefix_end);
//   5. the exponential race argmax_r w_r / E(candidate_r) over the kept ranks, ties to the better
//      rank, by a block (or, over the selected ranks, a warp) argmax.
//
// Where this can differ from the CPU (and why it practically never changes a pick):
//   - exp and log in f64: CUDA's `exp`/`log` are within 1 ulp (CUDA Programming Guide, double
//     precision functions), Rust's `f64::exp`/`ln` call the platform libm (glibc: < 1 ulp). A
//     weight or an Exp(1) variate can therefore differ in the last bit (relative 1.1e-16).
//   - the total Σw, summed by a tree (the CPU: in rank order), a few ulps apart; used only
//     where no top-p comparison lies within 1e-10 of top_p (see kept_prefix).
//   A pick then changes only if a weight's last bit moves a cumulative probability across top_p
//   (it must lie within ~1e-15 of it) or swaps the two best race values w/E (within ~2 ulps of
//   each other): for logits that are not exactly tied, each has a probability of order 1e-12 per
//   draw. Exactly tied logits (bf16 heads, greedy draws, flat rows) are decided as on the CPU:
//   equal scores give bit-equal weights, exp(0) = 1 and underflow 0 on both sides, the
//   cumulative sums are the CPU's own sequence, and an equal uniform gives a bit-equal E, so an
//   exact race tie is broken by rank on both. The one case a last-bit exp difference can still
//   decide at a rate that is not negligible: top_p = 1 on a row whose non-zero weights all fit
//   in the prefix, where the head rule (crossing token dropped) keeps or drops the last such
//   token by whether Σp rounds to 1.0 or just above — on the CPU too, whose exp differs between
//   libm builds.
//   Every f32/f64 operation that the CPU rounds separately is written with an explicit _rn
//   intrinsic, so nvcc cannot contract it into an FMA.
#include "kernel_constants.cuh"  // SAMPLING_*, SORT_CAP, ROW_CAPACITY (src/backend/cuda/kernel_constants.rs)
#include "rank.cuh"

constexpr int THREADS = SAMPLING_THREADS;
constexpr int WARPS = THREADS / 32;
// Ranks per thread at the largest sort; SORT_CAP = THREADS · ITEMS candidates at most.
constexpr int ITEMS = SAMPLING_ITEMS;

// Sampling constants of src/engine/sampling.rs and src/engine/rng.rs.
constexpr float MIN_TEMPERATURE = 1e-5f;
constexpr float RAS_TEMPERATURE = 1.0f;
constexpr uint32_t RAS_TOP_K = 30;
constexpr float RAS_TOP_P = 0.95f;
constexpr int RAS_WINDOW = 16;
constexpr uint32_t MAIN_STREAM = 0, RAS_STREAM = 1, FIRST_HEAD_STREAM = 2;

// Why a draw failed (SamplingError on the CPU).
constexpr uint32_t FAULT_NONE = 0, FAULT_NON_FINITE = 1, FAULT_NO_CANDIDATES = 2;


// Per-request state; src/backend/cuda/sampling.rs `DeviceState` mirrors it word for word.
struct SamplerState {
    uint32_t seed_lo, seed_hi;
    uint32_t frame_lo, frame_hi;  // index of the frame being sampled; sampler_end_frame advances it
    float temperature, top_p;
    uint32_t main_top_k;          // UINT32_MAX = no cap
    uint32_t head_top_k;          // min(request top_k, 30)
    uint32_t window_len;          // valid window slots: the last window_len of them
    uint32_t window[RAS_WINDOW];  // main tokens of the last frames (prompt rows first), oldest first
};
static_assert(sizeof(SamplerState) == 25 * 4, "SamplerState layout (DeviceState in sampling.rs)");

struct DrawFault {
    uint32_t kind, index, score_bits;
};

// Outputs; src/backend/cuda/sampling.rs `DeviceOutputs` mirrors it word for word.
struct SamplerOut {
    uint32_t row[ROW_CAPACITY];   // the frame row [main, c0, c1..c_heads], what the next step embeds
    uint32_t semantic;            // main is a semantic token (the tower's label mask)
    uint32_t first, ras, ras_used;
    uint32_t pick[2];             // candidate index of the first and the RAS draw
    DrawFault draw_fault[2];      // this frame's faults of the first and the RAS draw
    uint32_t fault_stream;        // the first fault since the request began (sticky) ...
    DrawFault fault;              // ... kind FAULT_NONE while there was none
    uint32_t fault_frame_lo, fault_frame_hi;
};
static_assert(sizeof(SamplerOut) == 34 * 4, "SamplerOut layout (DeviceOutputs in sampling.rs)");

// ---------------------------------------------------------------------------------------------
// Philox4x32-10 and the uniform → Exp(1) mapping, exactly as src/model/rng.rs:
//   key = [seed_lo, seed_hi ^ frame_hi], counter = [candidate, 0, stream, frame_lo],
//   u = ((bits >> 9) + 0.5) · 2^-23 (exact in f32), E = −ln(u) in f64.
struct DrawKey {
    uint32_t k0, k1, stream, frame_lo;
};

__device__ __forceinline__ DrawKey draw_key(const SamplerState* st, uint32_t stream) {
    return DrawKey{st->seed_lo, st->seed_hi ^ st->frame_hi, stream, st->frame_lo};
}

__device__ __forceinline__ uint32_t philox_bits(const DrawKey& key, uint32_t candidate) {
    constexpr uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u, W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
    uint32_t c0 = candidate, c1 = 0, c2 = key.stream, c3 = key.frame_lo;
    uint32_t k0 = key.k0, k1 = key.k1;
#pragma unroll
    for (int round = 0; round < 10; ++round) {
        if (round > 0) {
            k0 += W0;
            k1 += W1;
        }
        const uint32_t hi0 = __umulhi(M0, c0), lo0 = M0 * c0;
        const uint32_t hi1 = __umulhi(M1, c2), lo1 = M1 * c2;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
    }
    return c0;
}

__device__ __forceinline__ double exponential(const DrawKey& key, uint32_t candidate) {
    const float k = (float)(philox_bits(key, candidate) >> 9);  // < 2^23: exact
    const float u = __fmul_rn(__fadd_rn(k, 0.5f), 1.0f / 8388608.0f);
    return -log((double)u);
}

// ---------------------------------------------------------------------------------------------
// w_r = exp(s_r − s_0) in f64, as the CPU computes it (every caller gets the same bits).
__device__ __forceinline__ double rank_weight(unsigned long long key, float best) {
    return exp(__dsub_rn((double)key_score(key), (double)best));
}

// ---------------------------------------------------------------------------------------------
// Block reductions (blockDim.x == THREADS). Each starts with a barrier, so its scratch may be the
// previous call's; every thread gets the result.
struct Scratch {
    double d[WARPS];
    uint32_t u[WARPS];
    unsigned long long k[WARPS];
    uint32_t end;   // the kept prefix's length, from warp 0 to the block
    uint32_t pick;  // the fast path's pick, or UINT32_MAX when it could not decide
};

__device__ uint32_t block_min_u32(uint32_t v, Scratch& s) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = min(v, __shfl_xor_sync(FULL, v, o));
    __syncthreads();
    if (lane == 0) s.u[warp] = v;
    __syncthreads();
    v = s.u[lane];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = min(v, __shfl_xor_sync(FULL, v, o));
    return v;
}

// The least of each thread's (v, key) over the block, both in one reduction: step 1's first
// non-finite index and its smallest key (rank 0).
__device__ void block_min_u32_key(uint32_t& v, unsigned long long& key, Scratch& s) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        v = min(v, __shfl_xor_sync(FULL, v, o));
        key = min(key, __shfl_xor_sync(FULL, key, o));
    }
    __syncthreads();
    if (lane == 0) {
        s.u[warp] = v;
        s.k[warp] = key;
    }
    __syncthreads();
    v = s.u[lane];
    key = s.k[lane];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        v = min(v, __shfl_xor_sync(FULL, v, o));
        key = min(key, __shfl_xor_sync(FULL, key, o));
    }
}

// Sum over the block (a tree; the order is not the CPU's, see the header).
__device__ double block_sum(double v, Scratch& s) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = __dadd_rn(v, __shfl_xor_sync(FULL, v, o));
    __syncthreads();
    if (lane == 0) s.d[warp] = v;
    __syncthreads();
    v = s.d[lane];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = __dadd_rn(v, __shfl_xor_sync(FULL, v, o));
    return v;
}

// The largest race value, ties to the lower rank (the CPU's strict `>` in rank order).
__device__ __forceinline__ void better(double& v, uint32_t& r, double ov, uint32_t orank) {
    if (ov > v || (ov == v && orank < r)) {
        v = ov;
        r = orank;
    }
}

__device__ uint32_t block_argmax_rank(double v, uint32_t r, Scratch& s) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) better(v, r, __shfl_xor_sync(FULL, v, o), __shfl_xor_sync(FULL, r, o));
    __syncthreads();
    if (lane == 0) {
        s.d[warp] = v;
        s.u[warp] = r;
    }
    __syncthreads();
    v = s.d[lane];
    r = s.u[lane];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) better(v, r, __shfl_xor_sync(FULL, v, o), __shfl_xor_sync(FULL, r, o));
    return r;
}

// The largest race value, ties to the lower key (= the lower rank: keys ascend in rank order).
__device__ __forceinline__ void better_key(double& v, unsigned long long& k, double ov, unsigned long long ok) {
    if (ov > v || (ov == v && ok < k)) {
        v = ov;
        k = ok;
    }
}

__device__ unsigned long long block_argmax_key(double v, unsigned long long k, Scratch& s) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) better_key(v, k, __shfl_xor_sync(FULL, v, o), __shfl_xor_sync(FULL, k, o));
    __syncthreads();
    if (lane == 0) {
        s.d[warp] = v;
        s.k[warp] = k;
    }
    __syncthreads();
    v = s.d[lane];
    k = s.k[lane];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) better_key(v, k, __shfl_xor_sync(FULL, v, o), __shfl_xor_sync(FULL, k, o));
    return k;
}

// ---------------------------------------------------------------------------------------------
// One draw's parameters.
struct Filter {
    float temperature;
    uint32_t top_k;
    float top_p;
    bool keep_crossing;  // main draws keep the token that crosses top_p; heads drop it
};

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

struct MassSelect {
    uint32_t count[RADIX];
    unsigned long long mass[RADIX];
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

// One pass over the range's keys: each bucket's count and mass. Lanes with the same digit add
// once: the count by popcount, the mass by two 24-bit halves summed over the lanes (each P ≤
// 2^48, so a half's sum over 32 lanes stays below 2^30).
__device__ void mass_histogram(const unsigned long long* keys, int n, const unsigned long long (&mass)[MASS_HELD],
                               MassSelect& s, int shift, unsigned long long prefix) {
    for (int b = threadIdx.x; b < RADIX; b += blockDim.x) {
        s.count[b] = 0;
        s.mass[b] = 0;
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
        if (in) {
            const unsigned same = __match_any_sync(active, digit);
            const uint32_t hi = __reduce_add_sync(same, (uint32_t)(mass[j] >> 24));
            const uint32_t lo = __reduce_add_sync(same, (uint32_t)(mass[j] & 0xFFFFFFu));
            if (lane == __ffs(same) - 1) {
                atomicAdd(&s.count[digit], (uint32_t)__popc(same));
                atomicAdd(&s.mass[digit], ((unsigned long long)hi << 24) + lo);
            }
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
        m[j] = s.mass[PER * lane + j];
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
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            const unsigned long long k = keys[i];
            if (k >= lo && k <= hi) sel.cand[atomicAdd(&sel.count, 1u)] = k;
        }
        __syncthreads();
        if (threadIdx.x < 32) {
            const uint32_t count = sel.count;
            for (int i = (int)count + (int)threadIdx.x; i < SELECT_CAP; i += 32) sel.cand[i] = PAD_KEY;
            bitonic_sort(sel.cand, SELECT_CAP, threadIdx.x, 32, [] { __syncwarp(); });
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
        better_key(value, winner, __ddiv_rn(rank_weight(k, best), exponential(key, key_index(k))), k);
    }
    return key_index(block_argmax_key(value, winner, scratch));
}

// ---------------------------------------------------------------------------------------------
// One draw (steps 1–5 above) over row(i), i < n; n_pad = the sort length, a power of two with
// THREADS ≤ n_pad ≤ SORT_CAP; `keys` holds n_pad keys of dynamic shared memory.
struct Draw {
    uint32_t pick;  // index in the row (0 after a fault)
    DrawFault fault;
};

// Steps 3–5 over the m ranks select_best found (cand, ascending): the pick's index, or
// UINT32_MAX when those ranks cannot decide — the kept prefix may run past them (top-k above m
// and top-p not reached within them), or a top-p comparison lies near (kept_prefix's `near`).
// The total (the caller's) is summed by each thread over its own indices, a different tree from
// the sorted path's; the two differ by a few ulps, which can only matter for a `near` comparison, and
// those go to the sorted path. So a pick made here is the sorted path's pick.
__device__ uint32_t fast_draw(int n, int m, const unsigned long long* cand, float best, double total, const Filter& f,
                              const DrawKey& key, Scratch& scratch) {
    if (threadIdx.x < 32) {
        const uint32_t limit = min((uint32_t)n, f.top_k);
        const uint32_t reach = min(limit, (uint32_t)m);
        const Prefix prefix = kept_prefix(cand, best, total, reach, f);
        const bool decided = !prefix.near && (prefix.end < reach || limit <= reach);
        // The exponential race over ranks < end, ties to the better rank.
        double value = -INFINITY;
        uint32_t rank = UINT32_MAX;
        for (uint32_t r = threadIdx.x; decided && r < prefix.end; r += 32) {
            const double v = __ddiv_rn(rank_weight(cand[r], best), exponential(key, key_index(cand[r])));
            better(value, rank, v, r);
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            better(value, rank, __shfl_xor_sync(FULL, value, o), __shfl_xor_sync(FULL, rank, o));
        if (threadIdx.x == 0) scratch.pick = decided ? key_index(cand[rank]) : UINT32_MAX;
    }
    __syncthreads();
    return scratch.pick;
}

template <class Row>
__device__ Draw draw(const Row& row, int n, int n_pad, const Filter& f, const DrawKey& key) {
    extern __shared__ unsigned long long keys[];
    __shared__ Scratch scratch;
    const float divisor = fmaxf(f.temperature, MIN_TEMPERATURE);

    // 1. Scores and sort keys; the first non-finite score (NaN or +inf) is a fault, as on the CPU.
    uint32_t bad = UINT32_MAX;
    unsigned long long first = PAD_KEY;  // the smallest key: rank 0
    for (int i = threadIdx.x; i < n_pad; i += blockDim.x) {
        unsigned long long k = PAD_KEY;
        if (i < n) {
            const float s = __fdiv_rn(row(i), divisor);
            if (isnan(s) || s == INFINITY) bad = min(bad, (uint32_t)i);
            k = rank_key(s, (uint32_t)i);
        }
        keys[i] = k;
        first = min(first, k);
    }
    block_min_u32_key(bad, first, scratch);
    if (bad != UINT32_MAX) {
        return Draw{0, {FAULT_NON_FINITE, bad, __float_as_uint(__fdiv_rn(row(bad), divisor))}};
    }

    // 2. Rank without sorting where that can decide the draw. A draw that keeps at most
    //    SELECT_MIN ranks (top-k: the heads, RAS) takes the best ranks (select_best); one that
    //    may keep more (the first draw: no top-k by default) goes straight to the descent over
    //    mass (mass_draw), which on a wide row would otherwise follow a wasted select_best.
    //    Where neither is sure (a top-p comparison within rounding: kept_prefix's `near`), the
    //    whole row is sorted and steps 3–5 run over it.
    const float best = key_score(first);
    if (best == -INFINITY) return Draw{0, {FAULT_NO_CANDIDATES, 0, 0}};
    // Σw over the row, each thread over its own indices (the tree of fast_draw and mass_draw).
    double own = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) own = __dadd_rn(own, rank_weight(keys[i], best));
    const double fast_total = block_sum(own, scratch);
    __shared__ Select select;
    if (min((uint32_t)n, f.top_k) <= (uint32_t)SELECT_MIN) {
        const int m = select_best(keys, n, select);
        const uint32_t fast = fast_draw(n, m, select.cand, best, fast_total, f, key, scratch);
        if (fast != UINT32_MAX) return Draw{fast, {FAULT_NONE, 0, 0}};
    } else {
        __shared__ MassSelect mass;
        const uint32_t massed = mass_draw(keys, n, best, fast_total, f, key, mass, select, scratch);
        if (massed != UINT32_MAX) return Draw{massed, {FAULT_NONE, 0, 0}};
    }
    bitonic_sort(keys, n_pad, threadIdx.x, blockDim.x, [] { __syncthreads(); });

    // 3. Weights w_r = exp(s_r − s_0) of this thread's contiguous ranks, and their total over
    //    the full row.
    const int per = n_pad / THREADS;
    const int first_rank = threadIdx.x * per;
    double w[ITEMS];
    double run = 0.0;
#pragma unroll
    for (int j = 0; j < ITEMS; ++j) {
        const int r = first_rank + j;
        w[j] = 0.0;
        if (j < per && r < n) {
            w[j] = rank_weight(keys[r], best);
            run = __dadd_rn(run, w[j]);
        }
    }
    const double total = block_sum(run, scratch);

    // 4. The kept prefix: by a block scan (scanned_prefix_end); where that cannot be sure, by
    //    warp 0's serial loop (see kept_prefix), again with the total summed in the CPU's order
    //    when a comparison lies within rounding of top_p.
    const uint32_t limit = min((uint32_t)n, f.top_k);
    uint32_t end = scanned_prefix_end(w, per, first_rank, total, limit, f, scratch);
    if (end == UINT32_MAX) {
        if (threadIdx.x < 32) {
            Prefix prefix = kept_prefix(keys, best, total, limit, f);
            if (prefix.near) prefix = kept_prefix(keys, best, rank_order_total(keys, best, n), limit, f);
            if (threadIdx.x == 0) scratch.end = prefix.end;
        }
        __syncthreads();
        end = scratch.end;
    }

    // 5. The exponential race over ranks < end.
    double best_value = -INFINITY;
    uint32_t best_rank = UINT32_MAX;
#pragma unroll
    for (int j = 0; j < ITEMS; ++j) {
        const int r = first_rank + j;
        if (j < per && (uint32_t)r < end) {
            const double value = __ddiv_rn(w[j], exponential(key, key_index(keys[r])));
            if (value > best_value) {
                best_value = value;
                best_rank = (uint32_t)r;
            }
        }
    }
    const uint32_t rank = block_argmax_rank(best_value, best_rank, scratch);
    return Draw{key_index(keys[rank]), {FAULT_NONE, 0, 0}};
}

// Restricted logits (f32, the restricted head's order) read in candidate order.
struct MainRow {
    const float* logits;
    const uint32_t* logit_index;
    __device__ float operator()(int i) const { return logits[logit_index[i]]; }
};

// A codebook head's logits: bf16 (what the head GEMV writes), widened exactly.
struct HeadRow {
    const bf16* logits;
    __device__ float operator()(int i) const { return to_f32(logits[i]); }
};

// The first fault since the request began stays; later ones are dropped.
__device__ void record_fault(SamplerOut* out, const SamplerState* st, uint32_t stream, const DrawFault& fault) {
    if (fault.kind == FAULT_NONE || out->fault.kind != FAULT_NONE) return;
    out->fault_stream = stream;
    out->fault = fault;
    out->fault_frame_lo = st->frame_lo;
    out->fault_frame_hi = st->frame_hi;
}

// ---------------------------------------------------------------------------------------------
// Grid (2, rows) blocks × THREADS, dynamic shared memory n_pad · 8 bytes. logits: row b's
// restricted logits at logits + b · logits_stride, [n] f32 in the head's order; logit_index[i]:
// the head row of candidate i (candidates ascend by token id; i is also the draw's Philox counter).
extern "C" __global__ void __launch_bounds__(THREADS)
    sample_main_draws(const float* __restrict__ logits, const uint32_t* __restrict__ logit_index, int n, int n_pad,
                      int logits_stride, const SamplerState* __restrict__ states, SamplerOut* __restrict__ outs) {
    pdl_begin();
    const int b = blockIdx.y;
    const SamplerState* st = states + b;
    SamplerOut* out = outs + b;
    const uint32_t stream = blockIdx.x == 0 ? MAIN_STREAM : RAS_STREAM;
    const Filter filter = stream == MAIN_STREAM ? Filter{st->temperature, st->main_top_k, st->top_p, true}
                                                : Filter{RAS_TEMPERATURE, RAS_TOP_K, RAS_TOP_P, true};
    const Draw d =
        draw(MainRow{logits + (size_t)b * logits_stride, logit_index}, n, n_pad, filter, draw_key(st, stream));
    if (threadIdx.x == 0) {
        out->pick[blockIdx.x] = d.pick;
        out->draw_fault[blockIdx.x] = d.fault;
    }
}

// One block per row (thread 0 works), after sample_main_draws. ids[i]: token of candidate i; the
// semantic band is [semantic_start, semantic_end]. The RAS draw replaces the first when the first
// is semantic and among the window's tokens; the chosen token is then pushed into the window
// (oldest dropped).
extern "C" __global__ void sample_main_finish(const uint32_t* __restrict__ ids, uint32_t semantic_start,
                                              uint32_t semantic_end, SamplerState* __restrict__ states,
                                              SamplerOut* __restrict__ outs) {
    pdl_begin();
    if (threadIdx.x != 0) return;
    SamplerState* st = states + blockIdx.x;
    SamplerOut* out = outs + blockIdx.x;
    const uint32_t first = ids[out->pick[0]], ras = ids[out->pick[1]];
    bool seen = false;
    for (int i = RAS_WINDOW - (int)st->window_len; i < RAS_WINDOW; ++i) seen |= st->window[i] == first;
    const bool first_semantic = first >= semantic_start && first <= semantic_end;
    const bool ras_used = first_semantic && seen;
    const uint32_t token = ras_used ? ras : first;
    out->row[0] = token;
    // c0 = clamp(main − semantic_start, 0, V − 1): an EOS frame carries a valid (masked) code.
    out->row[1] = min(token > semantic_start ? token - semantic_start : 0u, semantic_end - semantic_start);
    out->semantic = token >= semantic_start && token <= semantic_end;
    out->first = first;
    out->ras = ras;
    out->ras_used = ras_used;
    for (int i = 0; i + 1 < RAS_WINDOW; ++i) st->window[i] = st->window[i + 1];
    st->window[RAS_WINDOW - 1] = token;
    st->window_len = min(st->window_len + 1, (uint32_t)RAS_WINDOW);
    record_fault(out, st, MAIN_STREAM, out->draw_fault[0]);
    record_fault(out, st, RAS_STREAM, out->draw_fault[1]);
}

// One block of THREADS per row, dynamic shared memory n_pad · 8 bytes. logits: head r's
// [rows, n] bf16. Writes row b's c_{r+1} into out[b].row[2 + r].
extern "C" __global__ void __launch_bounds__(THREADS)
    sample_head(const bf16* __restrict__ logits, int n, int n_pad, int r, const SamplerState* __restrict__ states,
                SamplerOut* __restrict__ outs) {
    pdl_begin();
    const SamplerState* st = states + blockIdx.x;
    SamplerOut* out = outs + blockIdx.x;
    const Filter filter{st->temperature, st->head_top_k, st->top_p, false};
    const uint32_t stream = FIRST_HEAD_STREAM + (uint32_t)r;
    const Draw d = draw(HeadRow{logits + (size_t)blockIdx.x * n}, n, n_pad, filter, draw_key(st, stream));
    if (threadIdx.x == 0) {
        out->row[2 + r] = d.pick;
        record_fault(out, st, stream, d.fault);
    }
}

// One block per row (thread 0 works), at the end of a frame: the next frame's draws use the
// next counter.
extern "C" __global__ void sampler_end_frame(SamplerState* __restrict__ states) {
    pdl_begin();
    if (threadIdx.x != 0) return;
    SamplerState* st = states + blockIdx.x;
    const unsigned long long frame = (((unsigned long long)st->frame_hi << 32) | st->frame_lo) + 1;
    st->frame_lo = (uint32_t)frame;
    st->frame_hi = (uint32_t)(frame >> 32);
}
