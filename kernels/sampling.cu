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
#include "kernel_constants.cuh"  // ROW_CAPACITY (src/backend/cuda/kernel_constants.rs)
#include "kept_prefix.cuh"      // and through it draw.cuh, rank.cuh

// Sampling constants of src/model/sampling.rs and src/model/rng.rs.
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
// The Philox key of a request's frame and stream (draw.cuh's DrawKey).
__device__ __forceinline__ DrawKey draw_key(const SamplerState* st, uint32_t stream) {
    return DrawKey{st->seed_lo, st->seed_hi ^ st->frame_hi, stream, st->frame_lo};
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
    // The block's reduction finds the first non-finite score, and a wide draw's rank 0 with it;
    // a narrow one (see step 2) takes rank 0 from select_best, whose first key it is, and so
    // skips the 64-bit half of the reduction.
    const bool narrow = min((uint32_t)n, f.top_k) <= (uint32_t)SELECT_MIN;
    if (narrow) bad = block_min_u32(bad, scratch);
    else block_min_u32_key(bad, first, scratch);
    if (bad != UINT32_MAX) {
        return Draw{0, {FAULT_NON_FINITE, bad, __float_as_uint(__fdiv_rn(row(bad), divisor))}};
    }

    // 2. Rank without sorting where that can decide the draw. A draw that keeps at most
    //    SELECT_MIN ranks (top-k: the heads, RAS) takes the best ranks (select_best); one that
    //    may keep more (the first draw: no top-k by default) goes straight to the descent over
    //    mass (mass_draw), which on a wide row would otherwise follow a wasted select_best.
    //    Where neither is sure (a top-p comparison within rounding: kept_prefix's `near`), the
    //    whole row is sorted and steps 3–5 run over it.
    __shared__ Select select;
    const int m = narrow ? select_best(keys, n, select) : 0;
    if (narrow) first = select.cand[0];
    const float best = key_score(first);
    if (best == -INFINITY) return Draw{0, {FAULT_NO_CANDIDATES, 0, 0}};
    // Σw over the row, each thread over its own indices (the tree of fast_draw and mass_draw).
    double own = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) own = __dadd_rn(own, rank_weight(keys[i], best));
    const double fast_total = block_sum(own, scratch);
    if (narrow) {
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
    const uint32_t rank = block_argmax(best_value, best_rank, scratch);
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
