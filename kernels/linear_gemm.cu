// Prefill projections y = x · Wᵀ (W: [n, k] bf16 row-major as stored) on tensor cores, above
// DECODE_MAX_ROWS rows (src/backend/cuda/linear/prefill_gemm.rs, `Path::Gemm`): fp32
// accumulation, each output rounded once to bf16. The decode projections are kernels/linear.cu's.
#include "kernel_constants.cuh"  // GEMM_WG_*_STAGES (src/backend/cuda/kernel_constants.rs)
#include "mma.cuh"
#include "wgmma.cuh"

// ---------------------------------------------------------------------------------------------
// Prefill projections on tensor cores (`linear_gemm_r32`, `_r64`, `_r128`): above
// DECODE_MAX_ROWS rows, `linear` and `linear_segments` (several prompts' rows in one launch).
//
// A tiled GEMM in the Ampere style on mma.sync m16n8k16 bf16 (f32 accumulate): a block owns BM
// input rows (the MMA's A rows) × 128 output features (its B columns), 8 warps as 2 × 4, each
// warp BM/2 rows × 32 features (BM/32 m16 tiles × 4 n8 tiles). K runs in 64-wide stages staged
// in shared memory by cp.async (STAGES − 1 loading while one is computed: 4 at BM = 64, 3 at 128;
// rows, features and k past the matrix are zero-filled), fragments read with ldmatrix. Shared rows are 128 bytes
// (eight 16-byte chunks); chunk q of row r sits at q ^ (r & 7), so the 8 rows an ldmatrix reads
// hit 8 distinct 16-byte bank groups.
//
// Per-output reduction order, fixed by k alone: one accumulator per output, fed the k16 steps
// 0, 16, 32, … in increasing order (an MMA computes each output from its own A row and B column
// only). So a row's bits depend on neither the rows that share its tile, nor BM, nor the grid:
// `linear_gemm_r32`, `_r64` and `_r128` give each row the same bits, alone or among any rows, which is
// what lets one launch project many prompts' rows (issue 12). (They are not the bits of
// `linear_mma_*`, whose K runs in 8 interleaved slices; `linear` and `linear_segments` keep each
// row count on one path.) No split-K, no atomics.
//
// Launch: 256 threads, grid (ceil(n / 128), ceil(rows / BM)). Needs k % 8 == 0 (16-byte chunks,
// each wholly in or out of the matrix). Dynamic shared memory STAGES · (BM + 128) · 128 bytes
// (96 KiB at both BM = 64 and 128, 80 KiB at 32; prefill_gemm.rs `mma_sync_smem_bytes`). BM = 32
// serves launches whose 32-row grid still fits one block an SM (prefill_gemm.rs
// `mma_sync_rows_per_block`): a 200-row prompt's [2048, 4096] projections were 64 blocks on 132
// SMs, 42 µs each at 64 rows and 33.7 µs at 32 (runs 24 and 27, an H100).
//
// Floor (H200): FLOPs 2·rows·n·k at the mma.sync rate; at 64 prompts × 85 rows every dense
// projection of the prefill is ≈ 15 TFLOP, ≈ 25 ms at 600 TFLOP/s. The weights are re-read per
// BM rows (from L2 when the block rows of a wave share them), x per 128 features. Expected: ≈ 2×
// the mma.sync floor (a plain 3-stage pipeline, no warp specialisation), against the ≈ 194 ms
// that one cuBLASLt call per prompt took (run 13). Run 20 (32-wide stages): 130 launches of 5440
// rows took 44 ms; 84-row launches were latency-bound (a block's K loop with 2 × 24 KiB in
// flight), hence 64-wide stages: twice the bytes in flight per block. A prompt's prefill runs in
// 256-row chunks (4 blocks of 64 rows), so most launches have few blocks per weight, each walking
// the whole of k: their time is k / 64 stage latencies, hence a fourth stage at BM = 64 (issue 14:
// one more stage in flight per block; the stage count changes no bit).
namespace gemm {
constexpr int BN = 128, BK = 64, THREADS = 256;
}

// The bf16 offset of 16-byte chunk q (0..7) of shared row r (128-byte rows, swizzled).
__device__ __forceinline__ int gemm_slot(int r, int q) { return r * gemm::BK + ((q ^ (r & 7)) << 3); }

// Starts copying one k stage of ROWS matrix rows into `dst` (ROWS 128-byte rows, swizzled by
// `gemm_slot`): rows row0.. of the [limit, k] row-major `src`, columns k0 .. k0 + 63, each of the
// T threads taking every T-th 16-byte chunk; chunks past the matrix are zero-filled.
template <int ROWS, int T>
__device__ __forceinline__ void gemm_stage_rows(bf16* dst, const bf16* __restrict__ src, int row0, int limit, int k,
                                                int k0) {
#pragma unroll
    for (int i = 0; i < ROWS * 8 / T; ++i) {
        const int q = threadIdx.x + i * T, r = q >> 3, ch = q & 7;
        const bool ok = row0 + r < limit && k0 + ch * 8 < k;
        cp_async16_zfill(dst + gemm_slot(r, ch), ok ? src + (size_t)(row0 + r) * k + k0 + ch * 8 : src, ok);
    }
}

template <int BM, int STAGES>
__device__ __forceinline__ void linear_gemm(const bf16* __restrict__ x, const bf16* __restrict__ w,
                                            bf16* __restrict__ y, int rows, int n, int k) {
    using namespace gemm;
    constexpr int MT = BM / 32;  // m16 tiles per warp (BM / 2 rows)
    extern __shared__ __align__(128) unsigned char gemm_smem[];
    bf16* xs = reinterpret_cast<bf16*>(gemm_smem);  // [STAGES][BM · BK]
    bf16* ws = xs + STAGES * BM * BK;               // [STAGES][BN · BK]
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3;
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
    const int wm = (warp >> 2) * (BM / 2), wn = (warp & 3) * 32;
    const int stages = (k + BK - 1) / BK;

    // Stage s's chunks: x rows m0.., w rows n0.., k from s·BK; zero-filled past the matrices.
    auto load = [&](int slot, int s) {
        gemm_stage_rows<BM, THREADS>(xs + slot * BM * BK, x, m0, rows, k, s * BK);
        gemm_stage_rows<BN, THREADS>(ws + slot * BN * BK, w, n0, n, k, s * BK);
    };

    float acc[MT][4][4];
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;

#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < stages) load(s, s);
        cp_async_commit();
    }
    for (int s = 0; s < stages; ++s) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();  // stage s landed for every thread; stage s - 1's slot is free
        if (s + STAGES - 1 < stages) load((s + STAGES - 1) % STAGES, s + STAGES - 1);
        cp_async_commit();
        const bf16* xt = xs + (s % STAGES) * BM * BK;
        const bf16* wt = ws + (s % STAGES) * BN * BK;
#pragma unroll
        for (int kk = 0; kk < BK / 16; ++kk) {  // the stage's k16 steps, in k order
            uint32_t a[MT][4], b[2][4];
#pragma unroll
            for (int i = 0; i < MT; ++i) {
                // lanes 0-15: rows 0-15 of the tile, chunk 2kk; lanes 16-31: the same rows, 2kk + 1.
                const int r = wm + i * 16 + (lane & 15);
                ldmatrix_x4(a[i], xt + gemm_slot(r, 2 * kk + (lane >> 4)));
            }
#pragma unroll
            for (int p = 0; p < 2; ++p) {
                // matrix j = lane / 8: features 8·(j / 2).. of n8 tile pair p, chunk 2kk + j % 2;
                // b[p][0..1] is n8 tile 2p's fragment, b[p][2..3] tile 2p + 1's.
                const int j = lane >> 3;
                const int r = wn + p * 16 + (j >> 1) * 8 + (lane & 7);
                ldmatrix_x4(b[p], wt + gemm_slot(r, 2 * kk + (j & 1)));
            }
#pragma unroll
            for (int i = 0; i < MT; ++i)
#pragma unroll
                for (int t = 0; t < 4; ++t)
                    mma_bf16_k16(acc[i][t], a[i][0], a[i][1], a[i][2], a[i][3], b[t >> 1][2 * (t & 1)],
                                 b[t >> 1][2 * (t & 1) + 1]);
        }
    }
    cp_async_wait<0>();

    // d[0], d[1]: row g, features 2c, 2c + 1 of the tile; d[2], d[3]: row g + 8.
    const bool pairs = (n & 1) == 0;
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int t = 0; t < 4; ++t)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int row = m0 + wm + i * 16 + g + 8 * h, f = n0 + wn + t * 8 + 2 * c;
                if (row >= rows || f >= n) continue;
                const float v0 = acc[i][t][2 * h], v1 = acc[i][t][2 * h + 1];
                bf16* out = y + (size_t)row * n + f;
                if (pairs) {
                    *reinterpret_cast<__nv_bfloat162*>(out) = __halves2bfloat162(to_bf16(v0), to_bf16(v1));
                } else {
                    out[0] = to_bf16(v0);
                    if (f + 1 < n) out[1] = to_bf16(v1);
                }
            }
}

extern "C" __global__ void __launch_bounds__(256, 2) linear_gemm_r32(const bf16* x, const bf16* w, bf16* y, int rows, int n, int k) {
    pdl_begin();
    linear_gemm<32, 4>(x, w, y, rows, n, k);
}
extern "C" __global__ void __launch_bounds__(256, 2) linear_gemm_r64(const bf16* x, const bf16* w, bf16* y, int rows, int n, int k) {
    pdl_begin();
    linear_gemm<64, 4>(x, w, y, rows, n, k);
}
extern "C" __global__ void __launch_bounds__(256, 2) linear_gemm_r128(const bf16* x, const bf16* w, bf16* y, int rows, int n, int k) {
    pdl_begin();
    linear_gemm<128, 3>(x, w, y, rows, n, k);
}

// ---------------------------------------------------------------------------------------------
// The same GEMM on Hopper's warpgroup MMA (`linear_gemm_wg*`, sm_90a; prefill_gemm.rs takes it on
// compute capability 9.0 only, the mma.sync kernels above everywhere else).
//
// A block owns WGS · 64 input rows × BN output features: warpgroup i (128 threads) rows 64i..,
// one m64nBNk16 wgmma per k16 step, its A and B read by the tensor cores straight from shared
// memory (no ldmatrix, no fragment registers: the mma.sync kernels above spend most of their
// issue slots on ldmatrix at 200 rows). The staging is the mma.sync kernels': 64-wide k stages of
// x and W rows by cp.async, zero-filled past the matrices, 128-byte rows whose chunk q of row r
// sits at q ^ (r & 7) (`gemm_slot`), which is exactly wgmma's 128-byte swizzle once each tile
// starts on 1024 bytes. STAGES buffers; DIST = STAGES − 1 − KEEP stages load ahead while KEEP
// stages of wgmma stay in flight (a buffer is refilled only after every warpgroup's wgmmas
// reading it have completed: each waits down to KEEP groups before the barrier that precedes
// the refill).
//
// Reduction order: per output, the k16 steps 0, 16, 32, … in increasing k into one accumulator
// (wgmma.cuh): a row's bits depend on neither the rows beside it nor WGS, BN or the grid. They
// are not the mma.sync kernels' bits (the hardware's sum within a k16 step may differ), so a GPU
// takes one family for every prefill projection.
template <int WGS, int BN, int STAGES, int KEEP>
__device__ __forceinline__ void linear_gemm_wg(const bf16* __restrict__ x, const bf16* __restrict__ w,
                                               bf16* __restrict__ y, int rows, int n, int k) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int BM = 64 * WGS, BK = 64, T = 128 * WGS, DIST = STAGES - 1 - KEEP;
    static_assert(DIST >= 1 && BN * 8 % T == 0 && (BN == 64 || BN == 128 || BN == 256), "tile shape");
    extern __shared__ unsigned char wg_smem[];
    // The tiles start on 1024 bytes (the swizzle's period); the grant holds 1 KiB of slack.
    const unsigned base = (unsigned)__cvta_generic_to_shared(wg_smem);
    bf16* xs = reinterpret_cast<bf16*>(wg_smem + (1024 - base % 1024) % 1024);  // [STAGES][BM · BK]
    bf16* ws = xs + STAGES * BM * BK;                                            // [STAGES][BN · BK]
    const int tid = threadIdx.x, wg = tid >> 7, lane = tid & 31, wi = (tid >> 5) & 3;
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
    const int stages = (k + BK - 1) / BK;

    auto load = [&](int slot, int s) {  // the mma.sync kernels' staging
        gemm_stage_rows<BM, T>(xs + slot * BM * BK, x, m0, rows, k, s * BK);
        gemm_stage_rows<BN, T>(ws + slot * BN * BK, w, n0, n, k, s * BK);
    };

    float acc[BN / 2];
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) acc[i] = 0.f;
#pragma unroll
    for (int s = 0; s < DIST; ++s) {
        if (s < stages) load(s, s);
        cp_async_commit();
    }
    for (int s = 0; s < stages; ++s) {
        cp_async_wait<DIST - 1>();
        __syncthreads();  // stage s landed; stage s − 1 − KEEP's wgmmas are done in every warpgroup
        if (s + DIST < stages) load((s + DIST) % STAGES, s + DIST);
        cp_async_commit();
        const bf16* xt = xs + (s % STAGES) * BM * BK + wg * 64 * BK;
        const bf16* wt = ws + (s % STAGES) * BN * BK;
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) wg_fence_operand(acc[i]);
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < BK / 16; ++kk) {  // the stage's k16 steps, in k order
            const uint64_t a = wg_desc(xt + kk * 16), b = wg_desc(wt + kk * 16);
            if constexpr (BN == 64) wgmma_n64(acc, a, b);
            if constexpr (BN == 128) wgmma_n128(acc, a, b);
            if constexpr (BN == 256) wgmma_n256(acc, a, b);
        }
        wg_commit();
        wg_wait<KEEP>();
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) wg_fence_operand(acc[i]);
    }
    wg_wait<0>();
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) wg_fence_operand(acc[i]);
    cp_async_wait<0>();

    const int g = lane >> 2, c = lane & 3;
    const bool pairs = (n & 1) == 0;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = m0 + wg * 64 + wi * 16 + g + 8 * h, f = n0 + j * 8 + 2 * c;
            if (row >= rows || f >= n) continue;
            const float v0 = acc[4 * j + 2 * h], v1 = acc[4 * j + 2 * h + 1];
            bf16* out = y + (size_t)row * n + f;
            if (pairs) {
                *reinterpret_cast<__nv_bfloat162*>(out) = __halves2bfloat162(to_bf16(v0), to_bf16(v1));
            } else {
                out[0] = to_bf16(v0);
                if (f + 1 < n) out[1] = to_bf16(v1);
            }
        }
#else
    __trap();  // prefill_gemm.rs launches these on compute capability 9.0 only
#endif
}

// Three tile shapes, one per launch shape (prefill_gemm.rs `wg_tile`; the same bits): run 30's lab
// on an H100 (.gpu/lab, L2 flushed) timed nine of them on the prefill's shapes.
//   _64x64:   6 stages, 5 loading ahead: 200 rows at n ≤ 4096, 13–31 % under the mma.sync kernels
//             ([2048, 2048]: 18.8 → 14.1 µs; [2048, 4096]: 32.6 → 24.2 µs);
//   _64x128:  4 stages, no wgmma left in flight: 200 rows × 8192 features (36.4 → 30.3 µs), where
//             64 × 64 tiles make 512 blocks;
//   _128x128: two warpgroups, 4 stages: from 512 rows (1000 × [4096, 2048]: 59.7 → 46.2 µs).
// Dynamic shared memory: STAGES · (rows + features) · 128 bytes + 1 KiB of alignment slack.
#define GEMM_WG(NAME, WGS, BN, STAGES, KEEP)                                                                  \
    extern "C" __global__ void __launch_bounds__(128 * WGS)                                                  \
        NAME(const bf16* x, const bf16* w, bf16* y, int rows, int n, int k) {                                \
        pdl_begin();                                                                                         \
        linear_gemm_wg<WGS, BN, STAGES, KEEP>(x, w, y, rows, n, k);                                           \
    }
GEMM_WG(linear_gemm_wg_64x64, 1, 64, GEMM_WG_64X64_STAGES, 1)
GEMM_WG(linear_gemm_wg_64x128, 1, 128, GEMM_WG_64X128_STAGES, 0)
GEMM_WG(linear_gemm_wg_128x128, 2, 128, GEMM_WG_128X128_STAGES, 1)
