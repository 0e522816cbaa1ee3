// Long prompts' routed experts (`MoePath::Rows` from a few pairs per expert up): moe_rows.cu's
// arithmetic in its reduction order, so the same bits pair by pair, in tiles of up to 32 pairs of
// one expert whose weights and operand rows stream through shared memory.
//
// Why: moe_rows.cu's tiles hold 8 pairs (one n8 column set) and its gate/up blocks own 16
// features, so an expert with 31 pairs (a 1000-row prompt: 8000 pairs over 256 experts) has its
// weights read from L2 four times, and every block re-reads its tile's operand rows for its 16
// features. At 1000 rows the experts took 3.9× (gate/up) and 3.1× (down) their DRAM floor while
// reading each weight from DRAM about once (run 31): L2 → SM traffic. Here a block owns 128
// features of one tile of up to 32 pairs: each warp streams its 16 weight rows once per tile and
// the 8 warps share the tile's operand rows in shared memory.
//
// Same bits as moe_rows.cu: lane (g, c) holds the same 16 codes of weight rows g, g + 8 and of
// operand column g per 64-wide half of a K group (mma.cuh's k permutation); the MMAs into each
// accumulator run in the same order (per K group 8 k16 steps into fresh partials, hi before lo);
// each group folds in as total = fmaf(partial, s_x·s_w, total); and gate/up walks the
// ROWS_GATE_UP_SLICES slices one after another (slice s: groups s, s + 8, … in increasing
// order; slice totals added in slice order, empty slices' zeros included) where moe_rows.cu runs
// a slice per warp. An MMA computes each output from its own A row and B column, so the column a
// pair sits in and the features beside it leave its bits alone.
//
// Pipeline: the block walks its K groups (in slice order) through STAGES shared-memory stages by
// cp.async, STAGES − 1 in flight. A stage holds one K group: the 128 features' weight codes of
// each matrix (128 B a row), the tile's 32 operand rows (1, 2 or 2 + 2 bytes an element), their
// 32 scales and each matrix's weight scale. The 16-byte chunks of a row are XOR-swizzled by the
// row's parity, so each quarter-warp's fragment loads hit 8 distinct bank groups. Each thread's
// copies are the same chunks of every stage, so their addresses are worked out once per block
// (`StageCopies`). A warp converts its weight codes to f16 once per group and reuses them for
// each n8 column set that holds pairs (a 6-pair tile runs one).
//
// Floor: as moe_rows.cu's, each used expert's 3.15 MB once per layer. A 200-row prompt touches
// ~250 of 256 experts in each of 40 layers, 31 GB (7.4 ms at 4.2 TB/s, 10.5 ms at the H100's
// 2.97). Expected within 1.3× of it from a few pairs per expert up (moe_rows.cu: 1.5× at 200
// rows, 3.5× at 1000, on the H100).
#include "kernel_constants.cuh"  // ROWS_WIDE_* (src/backend/cuda/kernel_constants.rs)
#include "mma.cuh"
#include "moe.cuh"

#define WIDE_THREADS 256
#define WIDE_SETS (ROWS_WIDE_PAIRS / 8)  // n8 column sets a warp

// Byte layout of one stage for NB weight matrices and operand format FMT (the launcher's
// `wide_stage_bytes` in src/backend/cuda/moe/rows.rs repeats BYTES; the kernels trap if the
// launch gave less).
template <int NB, int FMT>
struct WideStage {
    static constexpr int CODE = FMT == FMT_E4M3 ? 1 : 2;     // bytes per element of a plane
    static constexpr int PLANES = FMT == FMT_F16X2 ? 2 : 1;  // hi (and lo)
    static constexpr int OP_ROW = 128 * CODE;
    static constexpr int OP = NB * ROWS_WIDE_FEATURES * 128;           // the operand planes
    static constexpr int SX = OP + PLANES * ROWS_WIDE_PAIRS * OP_ROW;  // the pairs' group scales
    static constexpr int SW = SX + ROWS_WIDE_PAIRS * 4;                // the matrices' weight scales
    // Whole 128-byte lines, so every stage's rows start on a bank line (an unpadded stage left
    // the next one 16 bytes off: cp.async stores split across lines, run 34's ncu).
    static constexpr int BYTES = (SW + 16 + 127) / 128 * 128;
};

// Where 16-byte chunk `ch` of row `row` sits, in rows of `chunks` chunks (8 or 16): odd rows
// swap the two halves of each 128-byte line (8) or the chunks of each pair (16).
__device__ __forceinline__ int swizzle(int row, int ch, int chunks) {
    return ch ^ (chunks == 8 ? (row & 1) << 2 : row & 1);
}

// The walk through K in slice order (slice s: groups s, s + KS, …), one position at a time.
template <int KS>
struct SliceWalk {
    int slice = 0, group = 0;
    __device__ __forceinline__ void next(int groups) {
        group += KS;
        if (group >= groups) group = ++slice;
    }
};

// This thread's share of every stage's copies, its addresses worked out once per block (the
// address arithmetic per stage was most of what the warps issued, run 34): a stage of group gi
// adds gi·128 codes to each source. Weights: chunk (tid % 8) of feature rows tid / 8 + 32j of
// each matrix (rows 2 KB apart, so j strides by 32 rows on both sides). Operand: chunk tid % C of
// lines tid / C + (256 / C)·j (C = chunks a line; a line is a pair row of a plane), the rows
// gathered through src_row once. Scales: thread r < 32 the pair row r's, thread 32 + m
// matrix m's.
template <int NB, int FMT>
struct StageCopies {
    using S = WideStage<NB, FMT>;
    static constexpr int OP_CHUNKS = S::OP_ROW / 16;
    static constexpr int W_COPIES = ROWS_WIDE_FEATURES * 8 / WIDE_THREADS;                 // per matrix
    static constexpr int OP_COPIES = S::PLANES * ROWS_WIDE_PAIRS * OP_CHUNKS / WIDE_THREADS;  // 1, 2 or 4
    const unsigned char* w[NB];
    int w_dst;
    size_t w_stride;  // 32 rows of a weight matrix
    const unsigned char* op[OP_COPIES];
    int op_dst[OP_COPIES];
    bool op_ok[OP_COPIES];
    const float* scale = nullptr;  // this thread's scale row (pair or matrix), or none
    bool scale_ok = false;
    int scale_dst = 0;

    __device__ __forceinline__ StageCopies(const unsigned char* const (&wm)[NB], const float* const (&sw)[NB],
                                           const void* act, const void* act_lo, const float* act_scales,
                                           const int* src_row, int K) {
        static_assert(ROWS_WIDE_FEATURES * 8 % WIDE_THREADS == 0 && OP_COPIES >= 1, "whole copies per thread");
        const int tid = threadIdx.x, f = tid >> 3, ch = tid & 7;
#pragma unroll
        for (int m = 0; m < NB; ++m) w[m] = wm[m] + (size_t)f * K + ch * 16;
        w_dst = f * 128 + swizzle(f, ch, 8) * 16;  // rows f + 32j keep f's parity
        w_stride = (size_t)32 * K;
#pragma unroll
        for (int j = 0; j < OP_COPIES; ++j) {
            const int i = tid + j * WIDE_THREADS, line = i / OP_CHUNKS, c = i % OP_CHUNKS;
            const int r = line % ROWS_WIDE_PAIRS, src = src_row[r];
            const unsigned char* plane = (const unsigned char*)(line < ROWS_WIDE_PAIRS ? act : act_lo);
            op[j] = plane + (size_t)max(src, 0) * K * S::CODE + c * 16;
            op_ok[j] = src >= 0;
            op_dst[j] = S::OP + line * S::OP_ROW + swizzle(r, c, OP_CHUNKS) * 16;
        }
        if (tid < ROWS_WIDE_PAIRS) {
            const int src = src_row[tid];
            scale = act_scales + (size_t)max(src, 0) * (K >> 7);
            scale_ok = src >= 0;
            scale_dst = S::SX + tid * 4;
        }
#pragma unroll
        for (int m = 0; m < NB; ++m)
            if (tid == ROWS_WIDE_PAIRS + m) {
                scale = sw[m];
                scale_ok = true;
                scale_dst = S::SW + m * 4;
            }
    }

    // Starts the copies of K group gi into stage `st` (every thread of the block calls it); rows
    // past the tile are zero-filled.
    __device__ __forceinline__ void issue(unsigned char* st, int gi) const {
#pragma unroll
        for (int m = 0; m < NB; ++m)
#pragma unroll
            for (int j = 0; j < W_COPIES; ++j)
                cp_async16_zfill(st + m * ROWS_WIDE_FEATURES * 128 + w_dst + j * 32 * 128,
                                 w[m] + j * w_stride + gi * 128, true);
#pragma unroll
        for (int j = 0; j < OP_COPIES; ++j)
            cp_async16_zfill(st + op_dst[j], op[j] + gi * 128 * S::CODE, op_ok[j]);
        if (scale) cp_async4_zfill(reinterpret_cast<float*>(st + scale_dst), scale + gi, scale_ok);
    }
};

// One K group in stage `st` against the tile's first `sets` column sets: this warp's 16 features
// of each matrix (rows warp·16 + g and + 8) fold into total[m][set] (moe_rows.cu's warp_tile:
// total[m][set][0, 1] are features g, columns 2c, 2c + 1 of the set; [2, 3] feature g + 8).
template <int NB, int FMT>
__device__ __forceinline__ void mma_group(const unsigned char* st, int sets, float (&total)[NB][WIDE_SETS][4]) {
    using S = WideStage<NB, FMT>;
    constexpr int OP_CHUNKS = S::OP_ROW / 16;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    // The weight fragments as f16, once for every column set: [matrix][half][k16 step].
    uint32_t a[NB][2][4][4];
#pragma unroll
    for (int m = 0; m < NB; ++m)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int r0 = m * ROWS_WIDE_FEATURES + warp * 16 + g, r1 = r0 + 8, ch = half * 4 + c;
            const uint4 v0 = *reinterpret_cast<const uint4*>(st + r0 * 128 + swizzle(r0, ch, 8) * 16);
            const uint4 v1 = *reinterpret_cast<const uint4*>(st + r1 * 128 + swizzle(r1, ch, 8) * 16);
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                const uint2 x0 = e4m3x4_to_f16x4(word_of(v0, q)), x1 = e4m3x4_to_f16x4(word_of(v1, q));
                a[m][half][q][0] = x0.x;
                a[m][half][q][1] = x1.x;
                a[m][half][q][2] = x0.y;
                a[m][half][q][3] = x1.y;
            }
        }
    const float* sx = reinterpret_cast<const float*>(st + S::SX);
    const float* sw = reinterpret_cast<const float*>(st + S::SW);
#pragma unroll
    for (int set = 0; set < WIDE_SETS; ++set) {
        if (set >= sets) continue;  // warp-uniform
        const int r = set * 8 + g;
        float part[NB][4];
#pragma unroll
        for (int m = 0; m < NB; ++m)
#pragma unroll
            for (int i = 0; i < 4; ++i) part[m][i] = 0.f;
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            // Column g's 16 codes of this half (OperandVecs' order): chunk half·4 + c (e4m3) or
            // half·8 + 2c, + 1 of each plane (f16).
            uint4 b[OperandVecs<FMT>::n];
#pragma unroll
            for (int p = 0; p < S::PLANES; ++p)
#pragma unroll
                for (int v = 0; v < (FMT == FMT_E4M3 ? 1 : 2); ++v) {
                    const int ch = FMT == FMT_E4M3 ? half * 4 + c : half * 8 + 2 * c + v;
                    b[2 * p + v] = *reinterpret_cast<const uint4*>(st + S::OP + (p * ROWS_WIDE_PAIRS + r) * S::OP_ROW +
                                                                   swizzle(r, ch, OP_CHUNKS) * 16);
                }
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                uint32_t b0, b1, l0 = 0u, l1 = 0u;
                operand_frag<FMT>(b, q, b0, b1, l0, l1);
#pragma unroll
                for (int m = 0; m < NB; ++m) {
                    const uint32_t(&f)[4] = a[m][half][q];
                    mma_f16_k16(part[m], f[0], f[1], f[2], f[3], b0, b1);
                    if constexpr (FMT == FMT_F16X2) mma_f16_k16(part[m], f[0], f[1], f[2], f[3], l0, l1);
                }
            }
        }
        const float x0 = sx[set * 8 + 2 * c], x1 = sx[set * 8 + 2 * c + 1];
#pragma unroll
        for (int m = 0; m < NB; ++m) {
            const float s0 = x0 * sw[m], s1 = x1 * sw[m];
            total[m][set][0] = fmaf(part[m][0], s0, total[m][set][0]);
            total[m][set][1] = fmaf(part[m][1], s1, total[m][set][1]);
            total[m][set][2] = fmaf(part[m][2], s0, total[m][set][2]);
            total[m][set][3] = fmaf(part[m][3], s1, total[m][set][3]);
        }
    }
}

// Slice s's totals into the result: slice 0 is the result, later slices add to it (moe_rows.cu's
// order); the totals restart at zero.
template <int NB>
__device__ __forceinline__ void fold_slice(int s, float (&total)[NB][WIDE_SETS][4], float (&acc)[NB][WIDE_SETS][4]) {
#pragma unroll
    for (int m = 0; m < NB; ++m)
#pragma unroll
        for (int set = 0; set < WIDE_SETS; ++set)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                acc[m][set][i] = s == 0 ? total[m][set][i] : acc[m][set][i] + total[m][set][i];
                total[m][set][i] = 0.f;
            }
}

// The block's 128 features of each matrix against the tile's first `sets` column sets over all of
// K, through STAGES stages of `smem`; acc as fold_slice leaves it.
template <int NB, int FMT, int KS, int STAGES>
__device__ __forceinline__ void wide_tile(unsigned char* smem, const unsigned char* const (&w)[NB],
                                          const float* const (&sw)[NB], const void* act, const void* act_lo,
                                          const float* act_scales, const int* src_row, int K, int sets,
                                          float (&acc)[NB][WIDE_SETS][4]) {
    using S = WideStage<NB, FMT>;
    unsigned int given;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(given));
    if (given < (unsigned int)(STAGES * S::BYTES)) __trap();
    const int groups = K >> 7;
    float total[NB][WIDE_SETS][4];
#pragma unroll
    for (int m = 0; m < NB; ++m)
#pragma unroll
        for (int set = 0; set < WIDE_SETS; ++set)
#pragma unroll
            for (int i = 0; i < 4; ++i) total[m][set][i] = 0.f;
    const StageCopies<NB, FMT> copies(w, sw, act, act_lo, act_scales, src_row, K);
    SliceWalk<KS> loads;  // the next group to copy
#pragma unroll
    for (int t = 0; t < STAGES - 1; ++t) {
        if (t < groups) {
            copies.issue(smem + t * S::BYTES, loads.group);
            loads.next(groups);
        }
        cp_async_commit();
    }
    SliceWalk<KS> mmas;  // the group in stage t
    for (int t = 0; t < groups; ++t) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();  // stage t landed for every thread; stage t − 1 is free again
        const int next = t + STAGES - 1;
        if (next < groups) {
            copies.issue(smem + (next % STAGES) * S::BYTES, loads.group);
            loads.next(groups);
        }
        cp_async_commit();
        mma_group<NB, FMT>(smem + (t % STAGES) * S::BYTES, sets, total);
        const int slice = mmas.slice;
        mmas.next(groups);
        if (mmas.slice != slice) fold_slice(slice, total, acc);  // the slice's last group
    }
    // Slices with no group (K under KS groups; the walk ends at slice min(groups, KS)):
    // moe_rows.cu adds their zero totals too.
    for (int slice = mmas.slice; slice < KS; ++slice) fold_slice(slice, total, acc);
}

// The block's tile (expert e, sorted positions [start, end)) and its operand rows: src_row[r] is
// the row of position start + r (the pair's token row, sorted / top_k, when by_token; the
// position itself otherwise), −1 past the tile. False past the tile list (block-uniform).
__device__ __forceinline__ bool wide_tile_rows(const int* tiles, const int* offsets, const int* sorted, int top_k,
                                               bool by_token, int& e, int& start, int& end, int* src_row) {
    if ((int)blockIdx.x >= tiles[0]) return false;
    e = tiles[1 + 2 * blockIdx.x];
    start = tiles[2 + 2 * blockIdx.x];
    end = min(offsets[e + 1], start + ROWS_WIDE_PAIRS);
    if (threadIdx.x < ROWS_WIDE_PAIRS) {
        const int pos = start + threadIdx.x;
        src_row[threadIdx.x] = pos < end ? (by_token ? sorted[pos] / top_k : pos) : -1;
    }
    __syncthreads();
    return true;
}

// moe_rows_gate_up's result, h[pos, f] = SiLU(gate_f · x) · (up_f · x) f32 at sorted position
// pos, from the operand rows of act (fmt FMT_E4M3 or FMT_F16, [rows, K] by token row, as
// moe_rows_operand writes them). Grid (max_tiles, N / ROWS_WIDE_FEATURES), WIDE_THREADS threads,
// ROWS_WIDE_GATE_UP_STAGES · WideStage<2, fmt>::BYTES of dynamic shared memory.
extern "C" __global__ void __launch_bounds__(WIDE_THREADS, 1)
    moe_rows_wide_gate_up(const void* __restrict__ act, const float* __restrict__ act_scales, int fmt,
                          const int* __restrict__ sorted, const int* __restrict__ tiles,
                          const int* __restrict__ offsets, const unsigned long long* __restrict__ table, int top_k,
                          int K, int N, float* __restrict__ h) {
    pdl_begin();
    extern __shared__ __align__(16) unsigned char wide_smem[];
    __shared__ int src_row[ROWS_WIDE_PAIRS];
    int e, start, end;
    if (!wide_tile_rows(tiles, offsets, sorted, top_k, true, e, start, end, src_row)) return;
    const int f0 = blockIdx.y * ROWS_WIDE_FEATURES;
    const unsigned long long* t = table + (size_t)e * T_STRIDE;
    const size_t srow = (size_t)(f0 >> 7) * (K >> 7);
    const unsigned char* const w[2] = {(const unsigned char*)t[T_GATE_W] + (size_t)f0 * K,
                                       (const unsigned char*)t[T_UP_W] + (size_t)f0 * K};
    const float* const sw[2] = {(const float*)t[T_GATE_S] + srow, (const float*)t[T_UP_S] + srow};
    const int sets = (end - start + 7) / 8;
    float acc[2][WIDE_SETS][4];
    if (fmt == FMT_E4M3)
        wide_tile<2, FMT_E4M3, ROWS_GATE_UP_SLICES, ROWS_WIDE_GATE_UP_STAGES>(wide_smem, w, sw, act, nullptr,
                                                                             act_scales, src_row, K, sets, acc);
    else
        wide_tile<2, FMT_F16, ROWS_GATE_UP_SLICES, ROWS_WIDE_GATE_UP_STAGES>(wide_smem, w, sw, act, nullptr,
                                                                            act_scales, src_row, K, sets, acc);
    const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int f = f0 + (threadIdx.x >> 5) * 16 + g;
#pragma unroll
    for (int set = 0; set < WIDE_SETS; ++set)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int pos = start + set * 8 + 2 * c + (i & 1);
            if (pos < end) h[(size_t)pos * N + f + 8 * (i >> 1)] = siluf_(acc[0][set][i]) * acc[1][set][i];
        }
}

// moe_rows_down's result, y[pair, f] = down_f · h[pos] f32 at the pair's row of y (pair =
// sorted[pos]), from the operand rows of act (and act_lo; fmt FMT_E4M3 or FMT_F16X2, [pairs, K]
// by sorted position). Grid (max_tiles, N / ROWS_WIDE_FEATURES), WIDE_THREADS threads,
// ROWS_WIDE_DOWN_STAGES · WideStage<1, fmt>::BYTES of dynamic shared memory (two blocks an SM).
extern "C" __global__ void __launch_bounds__(WIDE_THREADS, 2)
    moe_rows_wide_down(const void* __restrict__ act, const void* __restrict__ act_lo,
                       const float* __restrict__ act_scales, int fmt, const int* __restrict__ sorted,
                       const int* __restrict__ tiles, const int* __restrict__ offsets,
                       const unsigned long long* __restrict__ table, int K, int N, float* __restrict__ y) {
    pdl_begin();
    extern __shared__ __align__(16) unsigned char wide_smem[];
    __shared__ int src_row[ROWS_WIDE_PAIRS];
    int e, start, end;
    if (!wide_tile_rows(tiles, offsets, sorted, 1, false, e, start, end, src_row)) return;
    const int f0 = blockIdx.y * ROWS_WIDE_FEATURES;
    const unsigned long long* t = table + (size_t)e * T_STRIDE;
    const unsigned char* const w[1] = {(const unsigned char*)t[T_DOWN_W] + (size_t)f0 * K};
    const float* const sw[1] = {(const float*)t[T_DOWN_S] + (size_t)(f0 >> 7) * (K >> 7)};
    const int sets = (end - start + 7) / 8;
    float acc[1][WIDE_SETS][4];
    if (fmt == FMT_E4M3)
        wide_tile<1, FMT_E4M3, 1, ROWS_WIDE_DOWN_STAGES>(wide_smem, w, sw, act, nullptr, act_scales, src_row, K,
                                                          sets, acc);
    else
        wide_tile<1, FMT_F16X2, 1, ROWS_WIDE_DOWN_STAGES>(wide_smem, w, sw, act, act_lo, act_scales, src_row, K,
                                                           sets, acc);
    const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int f = f0 + (threadIdx.x >> 5) * 16 + g;
#pragma unroll
    for (int set = 0; set < WIDE_SETS; ++set)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int pos = start + set * 8 + 2 * c + (i & 1);
            if (pos < end) y[(size_t)sorted[pos] * N + f + 8 * (i >> 1)] = acc[0][set][i];
        }
}
