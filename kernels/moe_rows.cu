// The decode batch's routed experts (`MoePath::Rows`, `BackboneOps::moe_rows`) on tensor cores,
// and the operand preparation (the dynamic quantiser included) that every expert path uses.
//
// Arithmetic: as moe.cu's (the CPU oracle `fp8_linear.rs`): y[o] = Σ_g s_x[g] · s_w[o/128][g] ·
// Σ_{i∈g} x[i]·w[o,i], an f32 partial sum per 128-wide K group, both scales applied once per
// group. Both operands reach the MMA as f16 without rounding (mma.sync m16n8k16 f16, f32
// accumulate; every product of two such values is exact in f32):
//   - weights: e4m3 codes → f16 exactly (`e4m3x4_to_f16x4`);
//   - Fp8Dynamic activations: e4m3 codes (FMT_E4M3), the dynamic quantiser's scale per group;
//   - Exact activations: each 1×128 group scaled by a power of two s = 2^e that puts its amax in
//     [2^14, 2^15), so every element lands in f16's normal range. A bf16 input (8 significant
//     bits) is then one f16 exactly (FMT_F16); an f32 input (the SwiGLU output h) is a sum of two
//     f16, hi + lo, good to 22 bits (FMT_F16X2: two MMAs per step). Elements below amax·2^-28
//     fall into f16's subnormals (a bf16 stays exact down to amax·2^-31); the absolute error
//     there is under amax·2^-39.
//
// Swap-AB tiles: a tile is up to 8 (row, slot) pairs of one expert (consecutive in the order of
// `moe_group_pairs`). A warp owns 16 output features: they are the MMA's A rows (m16), the tile's
// pairs its n8 columns. Lane (g, c) loads 16 bytes of weight rows g and g + 8 and the same 16 k
// of pair g's operand row (the k permutation of mma.cuh: 4 k16 steps per 16 e4m3 codes).
//
// Per-output reduction order, fixed by K alone: within a K group, 8 k16 steps into fresh
// accumulators in k order; the group then folds in as total = fmaf(partial, s_x·s_w, total), in
// increasing group order. The gate/up kernel splits K into GU_KS slices (groups ks, ks + GU_KS,
// …), one warp each; their totals are added in slice order. An MMA computes each output from its
// own A row and B column only, so a pair's result is the same bits whichever pairs share its
// tile, whatever the tile count or the grid: each row's result is its own (no float atomics; the
// combine sums a row's slots in slot order).
//
// Grid: (tiles, N / features per block), which scales with the pairs and spreads the weight
// bytes over every SM at any batch: gate/up blocks own 16 features (one feature warp × 8 K
// slices of 2 groups each), down blocks 128 (8 feature warps). One row (8 experts): 256 gate/up
// blocks and 128 down blocks of 8 warps. Where the block converts its tile's operand rows itself
// (the decode step), a warp requests all its weights before that conversion, so they stream in
// during it: gate/up 2 groups × 8 × 16 B a lane, down 4 groups × 4 × 16 B, 8 KB a warp in
// flight, 64 KB a block (124 / 122 registers: still two gate/up blocks per SM). In series, the
// operand's loads, its conversion and barrier, then each group's weight round trip made the
// decode step's gate/up 10.0 µs and down 6.7 µs a layer against their 5.6 and 2.8 µs of bytes
// (H100, run 47). The prompts' path (operand rows converted by moe_rows_operand) issues a
// group's loads together.
//
// Floor (H200, 4.18 TB/s copy): a step reads the union of the experts its rows route to, each
// 3·I·H bytes = 3·512·2048 = 3.15 MB (+ 768 B of scales), once per layer. With the spec's 40
// layers, 256 experts, top-8 (`model.md`): 1 row → 8 experts → 25.2 MB per layer, 1.01 GB per
// step, 0.24 ms; 64 rows → E·(1 − (1 − k/E)^64) ≈ 222 experts → 28.0 GB, 6.7 ms. (At 512 experts,
// top-10, 48 layers it would be 31.5 MB per layer and 0.36 ms per step at one row.) Expected:
// within 2× of the floor at 64 rows (every 16-byte weight load feeds 4 MMAs; ~2.3 pairs per
// expert waste 3/4 of each n8 column set, free on a bandwidth-bound kernel) and within 3× at one
// row (the launches of the layer's MoE, ~2 µs each, are then as long as its 6 µs of loads).
#include "kernel_constants.cuh"  // ROWS_PAIRS (src/backend/cuda/kernel_constants.rs)
#include "mma.cuh"
#include "moe.cuh"

#define ROWS_THREADS 256
#define GU_KS ROWS_GATE_UP_SLICES  // gate/up: K slices per block
#define GU_FS (8 / GU_KS)        // gate/up: feature warps per block
#define DN_FS 8                  // down: feature warps per block
#define GU_GPB 2                 // gate/up from the layer input: K groups per weight batch
#define DN_GPB 4                 // down from h: K groups per weight batch

// ---------------------------------------------------------------------------------------------
// Operands

// This lane's 4 elements v of one 1×128 group (lanes in order) as operand codes of format `fmt`
// at element `at` of `codes` (FMT_F16X2: the lo halves at `lo` + at); returns the group's scale.
// The warp must be converged (the group's amax is a warp reduction).
__device__ __forceinline__ float operand_group(float4 v, int fmt, void* codes, __half* lo, size_t at) {
    const float amax = warp_max(fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
    float s;
    if (fmt == FMT_E4M3) {
        s = quant_scale(amax);
        const unsigned int packed = (unsigned int)quant_e4m3(v.x, s) | ((unsigned int)quant_e4m3(v.y, s) << 8) |
                                    ((unsigned int)quant_e4m3(v.z, s) << 16) |
                                    ((unsigned int)quant_e4m3(v.w, s) << 24);
        *reinterpret_cast<unsigned int*>((unsigned char*)codes + at) = packed;
    } else {
        // amax's binary exponent less 14, clamped so that 2^±e are normal floats (then x·2^-e
        // is exact, and below 2^16 even for the largest bf16 / f32 amax).
        const int e = min(max(((__float_as_int(amax) >> 23) & 0xFF) - 127 - 14, -112), 112);
        s = __int_as_float((127 + e) << 23);
        const float inv = __int_as_float((127 - e) << 23);
        const float y[4] = {v.x * inv, v.y * inv, v.z * inv, v.w * inv};
        uint32_t hi[2] = {0u, 0u}, lw[2] = {0u, 0u};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const __half h = __float2half_rn(y[j]);
            const __half l = __float2half_rn(y[j] - __half2float(h));  // the difference is exact in f32
            hi[j >> 1] |= (uint32_t)__half_as_ushort(h) << (16 * (j & 1));
            lw[j >> 1] |= (uint32_t)__half_as_ushort(l) << (16 * (j & 1));
        }
        *reinterpret_cast<uint2*>((__half*)codes + at) = make_uint2(hi[0], hi[1]);
        if (fmt == FMT_F16X2) *reinterpret_cast<uint2*>(lo + at) = make_uint2(lw[0], lw[1]);
    }
    return s;
}

// Each row of x ([rows, K], ACT_BF16 or ACT_F32) in 1×128 groups, as an MMA operand of format
// `fmt`, with one f32 scale per group (scales [rows, K/128]):
//   FMT_E4M3: e4m3 codes of x/s, s = max(amax, 1e-10)/448 (the dynamic quantiser, as the CPU
//             `quantise`); codes [rows, K] bytes;
//   FMT_F16:  f16 of x·2^-e, s = 2^e (header); codes [rows, K] f16;
//   FMT_F16X2: as FMT_F16 (hi), and f16 of the remainder x·2^-e − hi (lo) at codes + rows·K f16.
// One warp per group, 8 per block: grid (ceil(K/128 / 8), rows), 256 threads. K % 128 == 0.
extern "C" __global__ void moe_rows_operand(const void* __restrict__ x, int in_kind, int rows, int K, int fmt,
                                            void* __restrict__ codes, float* __restrict__ scales) {
    pdl_begin();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int groups = K >> 7;
    const int g = blockIdx.x * (blockDim.x >> 5) + warp;
    if (g >= groups) return;
    const size_t at = (size_t)blockIdx.y * K + g * 128 + lane * 4;
    const float s = operand_group(load_act4(x, in_kind, at), fmt, codes, (__half*)codes + (size_t)rows * K, at);
    if (lane == 0) scales[(size_t)blockIdx.y * groups + g] = s;
}

// A tile's operand rows in shared memory: moe_rows_operand's format and arithmetic (so the same
// bits), for the tile's n ≤ ROWS_PAIRS rows. Slot i holds the row at element offset base(i) of x
// ([·, K] of in_kind). Layout from smem: codes [ROWS_PAIRS][K] (FMT_F16X2: the lo halves follow,
// [ROWS_PAIRS][K] more), then scales [ROWS_PAIRS][K/128] f32. One warp per group; ends with a
// block barrier (every thread of the block must call it).
template <class Base>
__device__ __forceinline__ void tile_operand(const void* x, int in_kind, int fmt, int K, int n, Base base,
                                             unsigned char* smem) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, groups = K >> 7;
    const int code_bytes = fmt == FMT_E4M3 ? 1 : fmt == FMT_F16 ? 2 : 4;
    float* scales = reinterpret_cast<float*>(smem + (size_t)ROWS_PAIRS * K * code_bytes);
    __half* lo = reinterpret_cast<__half*>(smem) + (size_t)ROWS_PAIRS * K;
    for (int item = warp; item < n * groups; item += blockDim.x >> 5) {
        const int slot = item / groups, g = item - slot * groups;
        const float4 v = load_act4(x, in_kind, base(slot) + g * 128 + lane * 4);
        const float sc = operand_group(v, fmt, smem, lo, (size_t)slot * K + g * 128 + lane * 4);
        if (lane == 0) scales[slot * groups + g] = sc;
    }
    __syncthreads();
}

// Bytes of shared memory tile_operand takes.
__host__ __device__ constexpr size_t tile_operand_bytes(int fmt, int K) {
    return (size_t)ROWS_PAIRS * K * (fmt == FMT_E4M3 ? 1 : fmt == FMT_F16 ? 2 : 4) + (size_t)ROWS_PAIRS * (K / 128) * 4;
}

// ---------------------------------------------------------------------------------------------
// Swap-AB block-FP8 MMA over one tile

// A 16-byte operand load: through the read-only cache from global memory, or from shared memory
// (a tile's operand that the block converted itself).
template <bool SMEM>
__device__ __forceinline__ uint4 load_vec(const uint4* p) {
    if constexpr (SMEM) return *p;
    else return __ldg(p);
}
template <bool SMEM>
__device__ __forceinline__ float load_scale(const float* p) {
    if constexpr (SMEM) return *p;
    else return __ldg(p);
}

// The lane's 16 operand codes at k of row `src` (zeros for src < 0: a column past the tile).
template <int FMT, bool SMEM>
__device__ __forceinline__ void load_operand(const void* act, const void* act_lo, int src, int K, int k,
                                             uint4 (&b)[OperandVecs<FMT>::n]) {
#pragma unroll
    for (int v = 0; v < OperandVecs<FMT>::n; ++v) b[v] = make_uint4(0u, 0u, 0u, 0u);
    if (src < 0) return;
    const size_t at = (size_t)src * K + k;
    if constexpr (FMT == FMT_E4M3) {
        b[0] = load_vec<SMEM>(reinterpret_cast<const uint4*>((const unsigned char*)act + at));
    } else {
        const uint4* hi = reinterpret_cast<const uint4*>((const __half*)act + at);
        b[0] = load_vec<SMEM>(hi);
        b[1] = load_vec<SMEM>(hi + 1);
        if constexpr (FMT == FMT_F16X2) {
            const uint4* lo = reinterpret_cast<const uint4*>((const __half*)act_lo + at);
            b[OperandVecs<FMT>::n - 2] = load_vec<SMEM>(lo);
            b[OperandVecs<FMT>::n - 1] = load_vec<SMEM>(lo + 1);
        }
    }
}

// One batch of a warp's weight loads: GPB K groups (gb, gb + KS, …: the warp's own groups, in
// its order), each in two 64-wide halves, NB matrices, rows g and g + 8 (16 bytes each), and
// the matrices' scales of those groups. Held in registers from their loads to their MMAs, so a
// kernel can issue them before it waits for anything else (its tile's operand rows).
template <int NB, int GPB>
struct WeightBatch {
    uint4 a[GPB][2][NB][2];
    float sw[GPB][NB];
};

// Issues the loads of the weight batch that starts at group gb (w[m]: row f0 of an [N, K] e4m3
// matrix; sw[m]: its scale row f0/128); groups past K are skipped.
template <int NB, int GPB>
__device__ __forceinline__ void load_weight_batch(const unsigned char* const (&w)[NB], const float* const (&sw)[NB],
                                                  int K, int gb, int KS, WeightBatch<NB, GPB>& wb) {
    const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int groups = K >> 7;
#pragma unroll
    for (int j = 0; j < GPB; ++j) {
        const int gi = gb + j * KS;
        if (gi >= groups) break;
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int k = gi * 128 + half * 64 + c * 16;
#pragma unroll
            for (int m = 0; m < NB; ++m) {
                wb.a[j][half][m][0] = load_stream(reinterpret_cast<const uint4*>(w[m] + (size_t)g * K + k));
                wb.a[j][half][m][1] = load_stream(reinterpret_cast<const uint4*>(w[m] + (size_t)(g + 8) * K + k));
            }
        }
#pragma unroll
        for (int m = 0; m < NB; ++m) wb.sw[j][m] = __ldg(sw[m] + gi);
    }
}

// The loaded weight batch at gb against the tile's 8 columns, folded into total: per group, 8
// k16 steps into fresh partials in k order, then total = fmaf(partial, s_x·s_w, total), groups
// in increasing order. This lane loads column g from operand row `src`; it holds the outputs
// of columns 2c, 2c + 1, whose operand rows are src0, src1 (-1 past the tile). Operands from
// global memory are loaded for the whole batch at once (their latency overlaps); from shared
// memory one group at a time (fewer registers).
template <int NB, int FMT, int GPB, bool SMEM>
__device__ __forceinline__ void mma_weight_batch(const WeightBatch<NB, GPB>& wb, const void* act, const void* act_lo,
                                                 const float* act_scales, int src, int src0, int src1, int K, int gb,
                                                 int KS, float (&total)[NB][4]) {
    constexpr int V = OperandVecs<FMT>::n;
    constexpr int OB = SMEM ? 1 : GPB;  // operand groups held at once
    const int lane = threadIdx.x & 31, c = lane & 3;
    const int groups = K >> 7;
    uint4 b[OB][2][V];  // [group][64-wide half]
    float sx[OB][2];
    const auto load_group = [&](int j, int slot) {
        const int gi = gb + j * KS;
#pragma unroll
        for (int half = 0; half < 2; ++half)
            load_operand<FMT, SMEM>(act, act_lo, src, K, gi * 128 + half * 64 + c * 16, b[slot][half]);
        sx[slot][0] = src0 >= 0 ? load_scale<SMEM>(act_scales + (size_t)src0 * groups + gi) : 0.f;
        sx[slot][1] = src1 >= 0 ? load_scale<SMEM>(act_scales + (size_t)src1 * groups + gi) : 0.f;
    };
    if constexpr (!SMEM) {
#pragma unroll
        for (int j = 0; j < GPB; ++j)
            if (gb + j * KS < groups) load_group(j, j);
    }
#pragma unroll
    for (int j = 0; j < GPB; ++j) {
        if (gb + j * KS >= groups) break;
        const int slot = SMEM ? 0 : j;
        if constexpr (SMEM) load_group(j, 0);
        float part[NB][4];
#pragma unroll
        for (int m = 0; m < NB; ++m)
#pragma unroll
            for (int i = 0; i < 4; ++i) part[m][i] = 0.f;
#pragma unroll
        for (int half = 0; half < 2; ++half)
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                uint32_t b0, b1, l0 = 0u, l1 = 0u;
                operand_frag<FMT>(b[slot][half], q, b0, b1, l0, l1);
#pragma unroll
                for (int m = 0; m < NB; ++m) {
                    const uint2 ag = e4m3x4_to_f16x4(word_of(wb.a[j][half][m][0], q));
                    const uint2 ag8 = e4m3x4_to_f16x4(word_of(wb.a[j][half][m][1], q));
                    mma_f16_k16(part[m], ag.x, ag8.x, ag.y, ag8.y, b0, b1);
                    if constexpr (FMT == FMT_F16X2) mma_f16_k16(part[m], ag.x, ag8.x, ag.y, ag8.y, l0, l1);
                }
            }
#pragma unroll
        for (int m = 0; m < NB; ++m) {
            const float s0 = sx[slot][0] * wb.sw[j][m], s1 = sx[slot][1] * wb.sw[j][m];
            total[m][0] = fmaf(part[m][0], s0, total[m][0]);
            total[m][1] = fmaf(part[m][1], s1, total[m][1]);
            total[m][2] = fmaf(part[m][2], s0, total[m][2]);
            total[m][3] = fmaf(part[m][3], s1, total[m][3]);
        }
    }
}

// One warp's 16 features of NB weight matrices against the tile's 8 columns, over its K groups
// ks, ks + KS, … in batches of GPB, the first batch already loaded into `first` (by
// load_weight_batch at gb = ks, which a kernel issues before waiting for its operand rows):
//   total[m][0, 1] = features f0 + g, columns 2c, 2c + 1; total[m][2, 3] = feature f0 + g + 8.
template <int NB, int FMT, int GPB, bool SMEM>
__device__ __forceinline__ void warp_tile_loaded(WeightBatch<NB, GPB>& first, const unsigned char* const (&w)[NB],
                                                 const float* const (&sw)[NB], const void* act, const void* act_lo,
                                                 const float* act_scales, int src, int src0, int src1, int K, int ks,
                                                 int KS, float (&total)[NB][4]) {
#pragma unroll
    for (int m = 0; m < NB; ++m)
#pragma unroll
        for (int i = 0; i < 4; ++i) total[m][i] = 0.f;
    const int groups = K >> 7;
    for (int gb = ks; gb < groups; gb += KS * GPB) {
        if (gb != ks) load_weight_batch<NB, GPB>(w, sw, K, gb, KS, first);
        mma_weight_batch<NB, FMT, GPB, SMEM>(first, act, act_lo, act_scales, src, src0, src1, K, gb, KS, total);
    }
}

// warp_tile_loaded, its first batch loaded here.
template <int NB, int FMT, int GPB, bool SMEM>
__device__ __forceinline__ void warp_tile(const unsigned char* const (&w)[NB], const float* const (&sw)[NB],
                                          const void* act, const void* act_lo, const float* act_scales, int src,
                                          int src0, int src1, int K, int ks, int KS, float (&total)[NB][4]) {
    WeightBatch<NB, GPB> first;
    load_weight_batch<NB, GPB>(w, sw, K, ks, KS, first);
    warp_tile_loaded<NB, FMT, GPB, SMEM>(first, w, sw, act, act_lo, act_scales, src, src0, src1, K, ks, KS, total);
}

// The block's tile: its expert and its pairs [start, end) in sorted order. False past the tile
// list (block-uniform, before any barrier).
struct RowsTile {
    int e, start, end;
};

// The grid has max_tiles blocks, so the block's own entry is in bounds even past the count: it
// is read with the count, one round trip instead of two.
__device__ __forceinline__ bool rows_tile(const int* tiles, const int* offsets, RowsTile& t) {
    const int count = tiles[0];
    t.e = tiles[1 + 2 * blockIdx.x];
    t.start = tiles[2 + 2 * blockIdx.x];
    if ((int)blockIdx.x >= count) return false;
    t.end = min(offsets[t.e + 1], t.start + ROWS_PAIRS);
    return true;
}
// rows_tile read through L2 (ld.global.cg), for a block that reads the tiles before its
// pdl_wait: nothing this SM's L1 may hold from an earlier layer's tiles is used.
__device__ __forceinline__ bool rows_tile_l2(const int* tiles, const int* offsets, RowsTile& t) {
    const int count = __ldcg(tiles);
    t.e = __ldcg(tiles + 1 + 2 * blockIdx.x);
    t.start = __ldcg(tiles + 2 + 2 * blockIdx.x);
    if ((int)blockIdx.x >= count) return false;
    t.end = min(__ldcg(offsets + t.e + 1), t.start + ROWS_PAIRS);
    return true;
}

// ---------------------------------------------------------------------------------------------
// Kernels

// h[pos, f] = SiLU(gate_f · x) · (up_f · x) (f32) for the tile's sorted positions pos, x the
// operand row of the pair's token row (sorted[pos] / top_k); K = hidden, N = intermediate (both
// multiples of 128); h: [pairs, N]. The operand comes one of two ways:
//   - raw null: act, act_scales as moe_rows_operand wrote them (fmt FMT_E4M3 or FMT_F16);
//   - raw the layer input itself ([rows, K] of raw_kind, fmt FMT_F16): the block converts its
//     tile's rows into dynamic shared memory (tile_operand_bytes(FMT_F16, K)) with
//     moe_rows_operand's arithmetic, which saves that kernel's launch in the decode step.
// Grid (max_tiles, N/16), 256 threads (ROWS_THREADS); blocks past tiles[0] exit.
extern "C" __global__ void __launch_bounds__(ROWS_THREADS)
    moe_rows_gate_up(const void* __restrict__ act, const float* __restrict__ act_scales, int fmt,
                     const void* __restrict__ raw, int raw_kind, const int* __restrict__ sorted,
                     const int* __restrict__ tiles, const int* __restrict__ offsets,
                     const unsigned long long* __restrict__ table, int top_k, int K, int N, float* __restrict__ h) {
    pdl_begin();
    extern __shared__ __align__(16) unsigned char rows_smem[];
    __shared__ float slices[GU_KS][GU_FS][8][32];  // [K slice][feature warp][total][lane]
    RowsTile tile;
    if (!rows_tile(tiles, offsets, tile)) return;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int fs = warp / GU_KS, ks = warp % GU_KS;
    const int f0 = blockIdx.y * (16 * GU_FS) + 16 * fs;
    const unsigned long long* t = table + (size_t)tile.e * T_STRIDE;
    const size_t srow = (size_t)(f0 >> 7) * (K >> 7);
    const unsigned char* const w[2] = {(const unsigned char*)t[T_GATE_W] + (size_t)f0 * K,
                                       (const unsigned char*)t[T_UP_W] + (size_t)f0 * K};
    const float* const sw[2] = {(const float*)t[T_GATE_S] + srow, (const float*)t[T_UP_S] + srow};
    float total[2][4];
    if (raw) {
        // The warp's weights are requested first: they stream in while the block converts its
        // operand rows (the decode step's critical path was the two in series).
        WeightBatch<2, GU_GPB> first;
        load_weight_batch<2, GU_GPB>(w, sw, K, ks, GU_KS, first);
        // Operand rows by slot: the tile's pair i reads slot i.
        const int n = tile.end - tile.start;
        tile_operand(raw, raw_kind, FMT_F16, K, n,
                     [&](int slot) { return (size_t)(sorted[tile.start + slot] / top_k) * K; }, rows_smem);
        const auto slot_of = [&](int i) { return tile.start + i < tile.end ? i : -1; };
        const float* scales = reinterpret_cast<const float*>(rows_smem + (size_t)ROWS_PAIRS * K * 2);
        warp_tile_loaded<2, FMT_F16, GU_GPB, true>(first, w, sw, rows_smem, nullptr, scales, slot_of(g),
                                                    slot_of(2 * c), slot_of(2 * c + 1), K, ks, GU_KS, total);
    } else {
        const auto row_of = [&](int pos) { return pos < tile.end ? sorted[pos] / top_k : -1; };
        const int src = row_of(tile.start + g), src0 = row_of(tile.start + 2 * c),
                  src1 = row_of(tile.start + 2 * c + 1);
        if (fmt == FMT_E4M3)
            warp_tile<2, FMT_E4M3, 1, false>(w, sw, act, nullptr, act_scales, src, src0, src1, K, ks, GU_KS, total);
        else
            warp_tile<2, FMT_F16, 1, false>(w, sw, act, nullptr, act_scales, src, src0, src1, K, ks, GU_KS, total);
    }

    // The K slices' totals, added in slice order by each feature warp's slice-0 warp.
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int i = 0; i < 4; ++i) slices[ks][fs][4 * m + i][lane] = total[m][i];
    __syncthreads();
    if (ks != 0) return;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        float gate = slices[0][fs][i][lane], up = slices[0][fs][4 + i][lane];
#pragma unroll
        for (int s = 1; s < GU_KS; ++s) {
            gate += slices[s][fs][i][lane];
            up += slices[s][fs][4 + i][lane];
        }
        const int pos = tile.start + 2 * c + (i & 1);
        if (pos < tile.end) h[(size_t)pos * N + f0 + g + 8 * (i >> 1)] = siluf_(gate) * up;
    }
}

// y[pair, f] = down_f · h[pos] for the tile's sorted positions pos (pair = sorted[pos]), written
// at the pair's row of y [pairs, N] f32 (unweighted; the combine applies the routing weight).
// The operand (format fmt: FMT_E4M3, or FMT_F16X2) comes one of two ways, as in gate/up:
//   - h null: act, act_lo, act_scales as moe_rows_operand wrote them from h;
//   - h itself ([pairs, K] f32 by sorted position, as moe_rows_gate_up wrote it): the block
//     converts its tile's rows in dynamic shared memory (tile_operand_bytes(fmt, K)) with
//     moe_rows_operand's arithmetic, which saves that kernel's launch in the decode step.
// K = intermediate, N = hidden. Grid (max_tiles, N/128), 256 threads.
extern "C" __global__ void __launch_bounds__(ROWS_THREADS)
    moe_rows_down(const void* __restrict__ act, const void* __restrict__ act_lo, const float* __restrict__ act_scales,
                  const float* __restrict__ h, int fmt, const int* __restrict__ sorted,
                  const int* __restrict__ tiles, const int* __restrict__ offsets,
                  const unsigned long long* __restrict__ table, int K, int N, float* __restrict__ y) {
    // With h (the decode step) the tiles come from the grouping two launches back, which had
    // finished before gate/up (the launch before this one) passed its pdl_wait: they are read
    // (through L2) and the tile's weights requested before this kernel's own wait, while gate/up
    // still runs. Only h, gate/up's output, waits for it.
    if (!h) pdl_begin();
    extern __shared__ __align__(16) unsigned char rows_smem[];
    RowsTile tile;
    if (!(h ? rows_tile_l2(tiles, offsets, tile) : rows_tile(tiles, offsets, tile))) {
        if (h) pdl_begin();
        return;
    }
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int f0 = blockIdx.y * (16 * DN_FS) + 16 * warp;
    const unsigned long long* t = table + (size_t)tile.e * T_STRIDE;
    const unsigned char* const w[1] = {(const unsigned char*)t[T_DOWN_W] + (size_t)f0 * K};
    const float* const sw[1] = {(const float*)t[T_DOWN_S] + (size_t)(f0 >> 7) * (K >> 7)};
    float total[1][4];
    if (h) {
        // The warp's weights are requested first (DN_GPB groups at once: all of them at the
        // spec's K), streaming in during gate/up's tail and while the block converts its
        // operand rows.
        WeightBatch<1, DN_GPB> first;
        load_weight_batch<1, DN_GPB>(w, sw, K, 0, 1, first);
        pdl_begin();
        // Operand rows by slot: the tile's position i reads slot i.
        const int n = tile.end - tile.start;
        tile_operand(h, ACT_F32, fmt, K, n, [&](int slot) { return (size_t)(tile.start + slot) * K; }, rows_smem);
        const auto slot_of = [&](int i) { return i < n ? i : -1; };
        const int src = slot_of(g), src0 = slot_of(2 * c), src1 = slot_of(2 * c + 1);
        const float* scales = reinterpret_cast<const float*>(rows_smem + tile_operand_bytes(fmt, K) -
                                                             (size_t)ROWS_PAIRS * (K / 128) * 4);
        if (fmt == FMT_E4M3)
            warp_tile_loaded<1, FMT_E4M3, DN_GPB, true>(first, w, sw, rows_smem, nullptr, scales, src, src0, src1, K,
                                                         0, 1, total);
        else
            warp_tile_loaded<1, FMT_F16X2, DN_GPB, true>(first, w, sw, rows_smem,
                                                          (const __half*)rows_smem + (size_t)ROWS_PAIRS * K, scales,
                                                          src, src0, src1, K, 0, 1, total);
    } else {
        // Operand rows by sorted position.
        const auto row_of = [&](int pos) { return pos < tile.end ? pos : -1; };
        const int src = row_of(tile.start + g), src0 = row_of(tile.start + 2 * c),
                  src1 = row_of(tile.start + 2 * c + 1);
        if (fmt == FMT_E4M3)
            warp_tile<1, FMT_E4M3, 2, false>(w, sw, act, nullptr, act_scales, src, src0, src1, K, 0, 1, total);
        else
            warp_tile<1, FMT_F16X2, 1, false>(w, sw, act, act_lo, act_scales, src, src0, src1, K, 0, 1, total);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int pos = tile.start + 2 * c + (i & 1);
        if (pos < tile.end) y[(size_t)sorted[pos] * N + f0 + g + 8 * (i >> 1)] = total[0][i];
    }
}
