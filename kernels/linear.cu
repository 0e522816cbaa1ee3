// Dense bf16 projections y = x · Wᵀ (W: [n, k] row-major as stored), the input-embedding gather
// and the restricted lm_head. fp32 accumulation; projection and embedding outputs are rounded
// once to bf16, logits stay f32. Decode rows go to the tensor-core `linear_mma_*`, prefill to the
// tensor-core `linear_gemm_*` of kernels/linear_gemm.cu (both row-invariant); widths they cannot
// read (k % 8 != 0) to cuBLASLt (src/backend/cuda/cublaslt.rs), or to `linear_tiled` when the
// library is absent.
#include "kernel_constants.cuh"  // MMA_MANY, PIECE_* (src/backend/cuda/kernel_constants.rs)
#include "mma.cuh"

// The 8 bf16 of a 16-byte vector as f32 (bf16 → f32 is a 16-bit shift: exact).
__device__ __forceinline__ void unpack8(uint4 v, float* f) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        f[2 * i] = __uint_as_float(w[i] << 16);
        f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
}

// 8 f32 rounded to bf16 (RNE) in one 16-byte vector.
__device__ __forceinline__ uint4 pack8(const float* f) {
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const uint32_t lo = __bfloat16_as_ushort(to_bf16(f[2 * i]));
        const uint32_t hi = __bfloat16_as_ushort(to_bf16(f[2 * i + 1]));
        w[i] = lo | (hi << 16);
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}

// ---------------------------------------------------------------------------------------------
// Decode projections on tensor cores (`linear_mma_r8`, `linear_mma_r64`): the decode batch at
// any row count (`linear_rows`) and the single-stream decode (`linear`, ≤ 8 rows).
//
// Swap-AB tiles on mma.sync m16n8k16 bf16 (f32 accumulate): a block owns 16 output features
// (the MMA's A rows: weight rows f0 + g and f0 + g + 8) and up to 8·R8 input rows (R8 n8 tiles,
// the MMA's B columns). Fragments come straight from global memory with the k permutation of
// mma.cuh: in k32 step t, lane (g, c) loads the 16 bytes at k = 32t + 8c of its two weight rows
// (load_stream: read once) and of input row 8j + g of each n8 tile j (__ldg: x is re-read by
// every block, so it stays in L1/L2). Features past n, rows past `rows` and the k tail past k
// (k % 32 != 0: the last step's lanes with 32t + 8c ≥ k) load zeros and are never stored.
//
// Per-output reduction order, fixed by k alone: the k32 steps are dealt to MMA_SLICES = 8
// slices, slice s taking steps s, s + 8, s + 16, … in increasing order into fresh accumulators
// (one warp per slice: 8 warps per block, always); the 8 partials then meet in shared memory and
// are added in slice order ((p0 + p1) + p2) + … + p7, and rounded once to bf16. An MMA computes
// each output from its own A row and B column only, so a row's bits do not depend on the rows
// that share its tile, on the template (R8 = 1 or 8), nor on the grid: `linear_mma_r8` and
// `linear_mma_r64` give every row the same bits, alone or in any batch. No atomics.
//
// Launch: block = 256 threads, grid = (ceil(n / 16), ceil(rows / (8·R8))); rows past one
// block's capacity go to blockIdx.y with the same arithmetic. Needs k % 8 == 0 (16-byte
// vectors, every row start 16-byte aligned). Static shared memory 4·R8 KiB (the partials).
//
// Floor on the H200 (4.18 TB/s measured copy): weight bytes / 4.18e12 — the weight is read
// once whatever the row count up to 64 (once per 64 rows above):
//   [8192, 2048] 32 MiB → 8.0 µs; [4096, 2048], [2048, 4096] 16 MiB → 4.0 µs;
//   [2048, 2048] 8 MiB → 2.0 µs; [1024, 2048] 4 MiB → 1.0 µs; [512, 2048] 2 MiB → 0.50 µs;
//   [64, 2048] 256 KiB → 0.06 µs, [32, 2048] 128 KiB → 0.03 µs (launch latency dominates).
// Bytes in flight, r64 (the batch): a warp keeps the weights of its next P = 3 steps in
// registers, 1 KiB per step (16 rows × 64 bytes), refilled as each is consumed; ptxas issues a
// pass's refills ahead of its MMAs, so 3–6 KiB per warp, 48–96 KiB per SM (≤ 128 registers:
// 2 blocks per SM). Copy bandwidth needs ≈ 4.18 TB/s × ~0.8 µs ≈ 3.3 MB in flight over the GPU.
// r8 (≤ 8 rows) used the same ring with P = 4; measured at one row (ncu, run 12 of
// docs/perf/2026-12-04-one-stream.md): [8192, 2048] 15.7 µs (45 % of DRAM peak), [2048, 4096]
// 12.8 µs (27 %), [32, 2048] 6.7 µs — latency, not bytes: each warp waits out ⌈steps / P⌉ round
// trips in turn. It then staged each block's whole tile in shared memory, every byte in flight
// at once (run 18: 2.0–2.4 TB/s on the big projections, each block loading, then computing); it
// now pipelines weight pieces through shared memory in blocks that stay resident
// (`linear_mma_staged` below). Both kernels are launched overlapping their predecessor
// (programmatic dependent launch, kernels/common.cuh); what runs before `pdl_wait` fetches only
// weights. Neither change touches an FMA or its order.
// x's re-reads: each block reads its rows of x once (its 8 warps read disjoint k), so at 64
// rows the blocks read 64·k·2·n/16 bytes of x, 4× the weight bytes, from L1/L2: blocks sharing
// an SM walk k in the same order and share x in L1 (n ≥ 4096: ≥ 2 blocks per SM); with n =
// 2048 each SM reads the whole of x (512 KiB at k = 4096) from L2, which bounds those shapes at
// about 2–2.5× their floor. Expected at 64 rows: 1.2–2.5× the floor (the r8 GEMV read every
// weight 8 times); at 1 row within 1.2× (tiny shapes: launch-bound). Compute is not the limit:
// 64 rows of [8192, 2048] are 0.5 M MMAs, ~4 µs of the H200's mma.sync rate, overlapped.
constexpr int MMA_SLICES = 8;

// load_stream where `ok`, else zeros without touching memory (p need not be valid then).
__device__ __forceinline__ uint4 load_stream_if(const uint4* p, bool ok) {
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    asm("{\n .reg .pred q;\n setp.ne.b32 q, %5, 0;\n"
        " @q ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n}"
        : "+r"(v.x), "+r"(v.y), "+r"(v.z), "+r"(v.w)
        : "l"(p), "r"((int)ok));
    return v;
}

// The end of every `linear_mma_*` block: each slice's accumulators into `part`, then thread v
// sums output (row0 + v / 16, f0 + v % 16) over the slices in slice order, 16 consecutive
// features of a row per half-warp. Its partials sit where the D fragment put them: d[e] of lane
// (g, c) of tile j is feature g + 8·(e / 2), tile row 2c + e % 2.
template <int R8>
__device__ __forceinline__ void mma_partials_store(float (*part)[4 * R8][32], const float (*acc)[4], int tiles,
                                                   bf16* __restrict__ y, int rows, int n, int f0, int row0) {
    const int slice = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
    for (int r = 0; r < R8; ++r)
        if (r < tiles)
#pragma unroll
            for (int e = 0; e < 4; ++e) part[slice][4 * r + e][lane] = acc[r][e];
    __syncthreads();
    for (int v = threadIdx.x; v < tiles * 128; v += blockDim.x) {
        const int rl = v >> 4, fl = v & 15;
        const int row = row0 + rl, f = f0 + fl;
        if (row >= rows || f >= n) continue;
        const int tr = rl & 7;
        const int slot = 4 * (rl >> 3) + 2 * (fl >> 3) + (tr & 1), ln = 4 * (fl & 7) + (tr >> 1);
        float s = part[0][slot][ln];
#pragma unroll
        for (int q = 1; q < MMA_SLICES; ++q) s += part[q][slot][ln];
        y[(size_t)row * n + f] = to_bf16(s);
    }
}

// Block (bx, by) of the launch: features 16·bx.., rows 8·R8·by.. (the grid's block indices for
// one weight; `linear_mma_many` maps its blocks onto several weights' grids).
template <int R8, int P>
__device__ __forceinline__ void linear_mma(const bf16* __restrict__ x, const bf16* __restrict__ w,
                                           bf16* __restrict__ y, int rows, int n, int k, int bx, int by) {
    __shared__ float part[MMA_SLICES][4 * R8][32];  // [slice][tile·4 + d][lane]
    const int slice = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int f0 = bx * 16, row0 = by * 8 * R8;
    const int tiles = min(R8, (rows - row0 + 7) >> 3);  // n8 tiles holding rows (≥ 1)
    const int k8 = k >> 3;
    const int steps = (k + 31) >> 5;
    const int mine = steps > slice ? (steps - slice + MMA_SLICES - 1) / MMA_SLICES : 0;  // steps slice + 8i

    // The lane's vector of step t is t·4 + c of its rows; past n, rows or k it is zeros.
    const uint4* wv = reinterpret_cast<const uint4*>(w);
    const bool a_ok = f0 + g < n, b_ok = f0 + g + 8 < n;
    const uint4* wa = wv + (size_t)(f0 + g) * k8;
    const uint4* wb = wv + (size_t)(f0 + g + 8) * k8;
    const uint4* xg = reinterpret_cast<const uint4*>(x) + (size_t)(row0 + g) * k8;
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
    auto weight = [&](const uint4* row, bool ok, int t) {
        const int v = t * 4 + c;
        return load_stream_if(row + v, ok && v < k8);
    };

    // The weights of the slice's next P steps, refilled as each step is consumed (slot j holds
    // the steps i ≡ j mod P).
    uint4 ring[P][2];
#pragma unroll
    for (int j = 0; j < P; ++j) {
        ring[j][0] = weight(wa, a_ok, slice + MMA_SLICES * j);
        ring[j][1] = weight(wb, b_ok, slice + MMA_SLICES * j);
    }
    // Launched overlapping its predecessor (PDL), the block has fetched only weights so far; x
    // and y belong to the kernels before it.
    pdl_wait();
    float acc[R8][4];
#pragma unroll
    for (int r = 0; r < R8; ++r)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[r][e] = 0.f;

    for (int i0 = 0; i0 < mine; i0 += P) {
#pragma unroll
        for (int j = 0; j < P; ++j) {
            const int i = i0 + j;
            if (i >= mine) break;
            const int t = slice + MMA_SLICES * i, v = t * 4 + c;
            uint4 b[R8];
#pragma unroll
            for (int r = 0; r < R8; ++r)
                b[r] = r < tiles && row0 + 8 * r + g < rows && v < k8 ? __ldg(xg + (size_t)(8 * r) * k8 + v) : zero;
            const uint4 a0 = ring[j][0], a1 = ring[j][1];
            ring[j][0] = weight(wa, a_ok, t + MMA_SLICES * P);  // past the slice's end: no load
            ring[j][1] = weight(wb, b_ok, t + MMA_SLICES * P);
#pragma unroll
            for (int r = 0; r < R8; ++r)
                if (r < tiles) mma_bf16_k32(acc[r], a0, a1, b[r]);
        }
    }

    mma_partials_store<R8>(part, acc, tiles, y, rows, n, f0, row0);
}

// ≤ 8 rows, staged and pipelined (`linear_mma_r8*`): the single-row and single-stream decode.
// The same fragments, MMAs and order as `linear_mma` (so the bits of `linear_mma_r64` for every
// row), read from shared memory:
// - x's rows are staged once per block, whole (zeros past k), after `pdl_wait`;
// - the weights go through PIECE_STAGES buffers of one piece each: 16 feature rows ×
//   PIECE_STEPS k32 steps. PIECE_STAGES − 1 pieces are in flight by cp.async while the warps
//   read the oldest, so a block's copies never wait on its MMAs (run 18: the tile-at-once stage
//   reached 2.0–2.4 TB/s on the big projections, loading and computing in turn). The first
//   pieces are issued before `pdl_wait` (weights are written by no kernel).
// - A block owns tiles blockIdx.x, blockIdx.x + gridDim.x, … of 16 features each (the launch
//   takes min(tiles, SMs) blocks: one block per SM fits), in order, each tile's pieces in k
//   order. Tiles are numbered across the launch's weights (`MmaWeights`: one, or up to
//   MMA_MANY over one input).
// Order: slice s takes steps s, s + 8, … of a tile in increasing order (a piece is a multiple of
// MMA_SLICES steps, so the pieces keep it), into accumulators fresh for each tile; the partials
// meet in slice order (mma_partials_store). Nothing depends on the grid or on the other tiles.
// Shared layout (dynamic): `rows` x rows of mma_x_stride(k) vectors, then PIECE_STAGES pieces of
// 16 rows × PIECE_STRIDE vectors; both strides ≡ 4 (mod 8) vectors, so a quarter-warp's eight
// 16-byte reads (rows g and g + 1, c = 0..3) fall in eight distinct bank groups. Bytes:
// (rows · mma_x_stride(k) + PIECE_STAGES · 16 · PIECE_STRIDE) · 16 (`linear::staged_smem_bytes`):
// 132 KiB of pieces plus 4 KiB (k = 2048) to 64.5 KiB (8 rows, k = 4096) of x; a shape above the
// GPU's opt-in limit takes `linear_mma_r64` (the same bits).
static_assert(PIECE_STEPS % MMA_SLICES == 0, "a piece deals whole rounds of steps to the slices");
static_assert(PIECE_STRIDE % 8 == 4, "conflict-free fragment reads");
__host__ __device__ constexpr int mma_x_stride(int k) {
    return ((((k + 31) >> 5) * 4 + 7) / 8) * 8 + 4;
}

// The weights of one `linear_mma_r8*` launch, each with its output: tiles of 16 features are
// numbered across them in order.
struct MmaWeights {
    int count;
    const bf16* w[MMA_MANY];
    bf16* y[MMA_MANY];
    int n[MMA_MANY];

    __device__ __forceinline__ int tiles() const {
        int t = 0;
        for (int i = 0; i < count; ++i) t += (n[i] + 15) >> 4;
        return t;
    }
    // The weight holding tile `tile`; `b` gets the tile's index within that weight.
    __device__ __forceinline__ int locate(int tile, int& b) const {
        for (int i = 0; i < count; ++i) {
            const int blocks = (n[i] + 15) >> 4;
            if (tile < blocks) {
                b = tile;
                return i;
            }
            tile -= blocks;
        }
        b = 0;
        return 0;
    }
};

// bf16(SiLU(g) · u) of 8 bf16 pairs, each as moe_swiglu_bf16 computes it.
__device__ __forceinline__ uint4 swiglu8(uint4 g, uint4 u) {
    const bf16* gb = reinterpret_cast<const bf16*>(&g);
    const bf16* ub = reinterpret_cast<const bf16*>(&u);
    uint4 out;
    bf16* ob = reinterpret_cast<bf16*>(&out);
#pragma unroll
    for (int j = 0; j < 8; ++j) ob[j] = to_bf16(siluf_(to_f32(gb[j])) * to_f32(ub[j]));
    return out;
}

// x's rows as staged: copied (up == null), or bf16(SiLU(x) · up) elementwise, the SwiGLU that
// moe_swiglu_bf16 computes with the same expression (so the same bits), made while staging
// instead of by a launch of its own.
__device__ __forceinline__ void linear_mma_staged(const bf16* __restrict__ x, const bf16* __restrict__ up,
                                                  const MmaWeights& ws, int rows, int k) {
    extern __shared__ uint4 stage[];
    __shared__ float part[MMA_SLICES][4][32];
    const int slice = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int k8 = k >> 3, steps = (k + 31) >> 5, xs = mma_x_stride(k);
    const int per_tile = (steps + PIECE_STEPS - 1) / PIECE_STEPS;
    const int tiles = ws.tiles();
    const int mine = (int)blockIdx.x < tiles ? (tiles - (int)blockIdx.x + (int)gridDim.x - 1) / (int)gridDim.x : 0;
    const int pieces = mine * per_tile;
    uint4* const xst = stage;
    uint4* const wst = stage + rows * xs;
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);

    // Piece q: tile blockIdx.x + gridDim.x · (q / per_tile), its steps [32·(q % per_tile), +32),
    // into buffer q % PIECE_STAGES; zeros past k and past n.
    auto issue = [&](int q) {
        int b;
        const int i = ws.locate(blockIdx.x + gridDim.x * (q / per_tile), b);
        const uint4* wv = reinterpret_cast<const uint4*>(ws.w[i]);
        const int f0 = b * 16, n = ws.n[i], v0 = (q % per_tile) * PIECE_STEPS * 4;
        uint4* dst = wst + (q % PIECE_STAGES) * 16 * PIECE_STRIDE;
        for (int e = threadIdx.x; e < 16 * PIECE_STEPS * 4; e += blockDim.x) {
            const int r = e / (PIECE_STEPS * 4), v = e % (PIECE_STEPS * 4);
            const bool ok = f0 + r < n && v0 + v < k8;
            cp_async16_zfill(dst + r * PIECE_STRIDE + v, ok ? wv + (size_t)(f0 + r) * k8 + v0 + v : wv, ok);
        }
    };

    // The first PIECE_STAGES − 1 pieces, then (after the kernels before it) x: one group, then
    // empty groups, so that from here on piece q is complete once group q is.
    for (int q = 0; q < PIECE_STAGES - 1; ++q)
        if (q < pieces) issue(q);
    pdl_wait();
    const uint4* xv = reinterpret_cast<const uint4*>(x);
    if (up) {
        const uint4* uv = reinterpret_cast<const uint4*>(up);
        for (int r = 0; r < rows; ++r)
            for (int v = threadIdx.x; v < steps * 4; v += blockDim.x)
                xst[r * xs + v] = v < k8 ? swiglu8(xv[(size_t)r * k8 + v], uv[(size_t)r * k8 + v]) : zero;
    } else {
        for (int r = 0; r < rows; ++r)
            for (int v = threadIdx.x; v < steps * 4; v += blockDim.x) {
                const bool ok = v < k8;
                cp_async16_zfill(xst + r * xs + v, ok ? xv + (size_t)r * k8 + v : xv, ok);
            }
    }
    cp_async_commit();
#pragma unroll
    for (int q = 1; q < PIECE_STAGES - 1; ++q) cp_async_commit();

    float acc[1][4] = {{0.f, 0.f, 0.f, 0.f}};
    for (int q = 0; q < pieces; ++q) {
        // The buffer refilled here was read in iteration q − 1, which every warp has left.
        if (q + PIECE_STAGES - 1 < pieces) issue(q + PIECE_STAGES - 1);
        cp_async_commit();
        cp_async_wait<PIECE_STAGES - 1>();
        __syncthreads();
        const int chunk = q % per_tile, first = chunk * PIECE_STEPS;
        const int count = min(steps - first, PIECE_STEPS);
        const uint4* wa = wst + (q % PIECE_STAGES) * 16 * PIECE_STRIDE + g * PIECE_STRIDE + c;
        const uint4* wb = wa + 8 * PIECE_STRIDE;
        const uint4* xb = xst + g * xs + first * 4 + c;
        for (int t = slice; t < count; t += MMA_SLICES) {
            const uint4 b = g < rows ? xb[4 * t] : zero;
            mma_bf16_k32(acc[0], wa[4 * t], wb[4 * t], b);
        }
        if (chunk == per_tile - 1) {
            int b;
            const int i = ws.locate(blockIdx.x + gridDim.x * (q / per_tile), b);
            mma_partials_store<1>(part, acc, 1, ws.y[i], rows, ws.n[i], b * 16, 0);
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[0][e] = 0.f;
        }
        __syncthreads();
    }
    cp_async_wait<0>();
}

extern "C" __global__ void __launch_bounds__(256) linear_mma_r8(const bf16* x, const bf16* w, bf16* y, int rows, int n, int k) {
    pdl_launch_dependents();
    const MmaWeights ws{1, {w, nullptr, nullptr, nullptr}, {y, nullptr, nullptr, nullptr}, {n, 0, 0, 0}};
    linear_mma_staged(x, nullptr, ws, rows, k);
}
// y = bf16(SiLU(gate) · up) · wᵀ at ≤ 8 rows (gate, up: [rows, k]): the shared expert's and the
// tower's down projection with their SwiGLU folded into the staging, with the bits of
// moe_swiglu_bf16 then linear_mma_r8.
extern "C" __global__ void __launch_bounds__(256) linear_mma_r8_swiglu(const bf16* gate, const bf16* up, const bf16* w,
                                                                    bf16* y, int rows, int n, int k) {
    pdl_launch_dependents();
    const MmaWeights ws{1, {w, nullptr, nullptr, nullptr}, {y, nullptr, nullptr, nullptr}, {n, 0, 0, 0}};
    linear_mma_staged(gate, up, ws, rows, k);
}
// ≤ 64 rows per block (eight n8 tiles): the decode batch.
extern "C" __global__ void __launch_bounds__(256, 2) linear_mma_r64(const bf16* x, const bf16* w, bf16* y, int rows, int n, int k) {
    pdl_launch_dependents();
    linear_mma<8, 3>(x, w, y, rows, n, k, blockIdx.x, blockIdx.y);
}

// Several projections of one input x [rows, k] in one launch (`linear::linear_rows_many`): up to
// MMA_MANY weights w_i [n_i, k], each into its own y_i. grid.x = Σ ceil(n_i / 16): the first
// ceil(n_0 / 16) blocks are weight 0's grid.x, the next weight 1's, and so on; grid.y as for one
// weight. A block runs exactly what it runs in its own weight's launch, so every output has the
// bits `linear_mma_*` gives it alone. One launch instead of several: at one decode row the small
// projections (the GDN's b and a, 32 features each) cost their launch, not their bytes.
// Runs `block(w_i, y_i, n_i, b)` for this block's weight i and b, its block within that weight's
// grid.x.
template <class Block>
__device__ __forceinline__ void linear_mma_many(int count, const bf16* const* w, bf16* const* y, const int* n,
                                                Block block) {
    int b = blockIdx.x;
    for (int i = 0; i < count; ++i) {
        const int blocks = (n[i] + 15) >> 4;
        if (b < blocks) {
            block(w[i], y[i], n[i], b);
            return;
        }
        b -= blocks;
    }
}
#define LINEAR_MMA_MANY_ARGS                                                                                         \
    const bf16 *x, int rows, int k, int count, const bf16 *w0, bf16 *y0, int n0, const bf16 *w1, bf16 *y1, int n1, \
        const bf16 *w2, bf16 *y2, int n2, const bf16 *w3, bf16 *y3, int n3
extern "C" __global__ void __launch_bounds__(256) linear_mma_r8_many(LINEAR_MMA_MANY_ARGS) {
    pdl_launch_dependents();
    const MmaWeights ws{count, {w0, w1, w2, w3}, {y0, y1, y2, y3}, {n0, n1, n2, n3}};
    linear_mma_staged(x, nullptr, ws, rows, k);
}
extern "C" __global__ void __launch_bounds__(256, 2) linear_mma_r64_many(LINEAR_MMA_MANY_ARGS) {
    pdl_launch_dependents();
    const bf16* w[MMA_MANY] = {w0, w1, w2, w3};
    bf16* y[MMA_MANY] = {y0, y1, y2, y3};
    const int n[MMA_MANY] = {n0, n1, n2, n3};
    linear_mma_many(count, w, y, n, [&](const bf16* wi, bf16* yi, int ni, int b) {
        linear_mma<8, 3>(x, wi, yi, rows, ni, k, b, blockIdx.y);
    });
}

// ---------------------------------------------------------------------------------------------
// Multi-row fallback when cuBLASLt is not loaded: a plain shared-memory tiled GEMM, any shape.
//
// Launch: block = 256 threads as 16×16 (ty = tid / 16, tx = tid % 16), grid = (ceil(n / 64),
// ceil(rows / 64)). Each step stages a 64×32 tile of x and of W in shared memory as f32,
// transposed to [k][row] (padded by one column: conflict-free stores); thread (ty, tx) owns the
// 4×4 outputs (m0 + ty + 16i, n0 + tx + 16j), so a warp's reads are broadcasts (x) or consecutive
// (W). Scalar, bounds-checked loads: any k.
constexpr int TILE_M = 64, TILE_N = 64, TILE_K = 32;

extern "C" __global__ void __launch_bounds__(256) linear_tiled(const bf16* __restrict__ x, const bf16* __restrict__ w,
                                                               bf16* __restrict__ y, int rows, int n, int k) {
    pdl_begin();
    __shared__ float xs[TILE_K][TILE_M + 1];
    __shared__ float ws[TILE_K][TILE_N + 1];
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    const int m0 = blockIdx.y * TILE_M, n0 = blockIdx.x * TILE_N;
    float acc[4][4] = {};
    for (int k0 = 0; k0 < k; k0 += TILE_K) {
        for (int e = threadIdx.x; e < TILE_M * TILE_K; e += blockDim.x) {
            const int r = e / TILE_K, kk = e % TILE_K, gk = k0 + kk;
            xs[kk][r] = m0 + r < rows && gk < k ? to_f32(x[(size_t)(m0 + r) * k + gk]) : 0.f;
            ws[kk][r] = n0 + r < n && gk < k ? to_f32(w[(size_t)(n0 + r) * k + gk]) : 0.f;
        }
        __syncthreads();
#pragma unroll 8
        for (int kk = 0; kk < TILE_K; ++kk) {
            float a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) a[i] = xs[kk][ty + 16 * i];
#pragma unroll
            for (int j = 0; j < 4; ++j) b[j] = ws[kk][tx + 16 * j];
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int m = m0 + ty + 16 * i;
        if (m >= rows) continue;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int c = n0 + tx + 16 * j;
            if (c < n) y[(size_t)m * n + c] = to_bf16(acc[i][j]);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Input embedding: y[r] = bf16(scale_r · (E[token_r] + Σ_i CB[cb_r,i])), summed in f32 in that
// order. `recipe` (u32 words, host-packed): row r's header at [4r, 4r + 4) = {token, index of its
// first codebook row in `recipe`, number of codebook rows, scale as f32 bits}; the codebook row
// indices follow the headers. Indices are validated on the host.
//
// Launch: grid = rows, block = 256; thread t handles columns 8t, 8t + 2048, … with 16-byte
// vectors when hidden % 8 == 0, else single columns t, t + 256, ….
extern "C" __global__ void __launch_bounds__(256) embed_gather(const bf16* __restrict__ table, const bf16* __restrict__ codebooks,
                                                               const uint32_t* __restrict__ recipe, bf16* __restrict__ y,
                                                               int hidden) {
    pdl_begin();
    const uint32_t* head = recipe + 4 * blockIdx.x;
    const size_t token = head[0];
    const uint32_t* cbs = recipe + head[1];
    const int ncb = (int)head[2];
    const float scale = __uint_as_float(head[3]);
    bf16* yr = y + (size_t)blockIdx.x * hidden;
    if ((hidden & 7) == 0) {
        const int h8 = hidden >> 3;
        const uint4* er = reinterpret_cast<const uint4*>(table) + token * h8;
        for (int c = threadIdx.x; c < h8; c += blockDim.x) {
            float acc[8], v[8];
            unpack8(er[c], acc);
            for (int i = 0; i < ncb; ++i) {
                unpack8(reinterpret_cast<const uint4*>(codebooks)[(size_t)cbs[i] * h8 + c], v);
#pragma unroll
                for (int e = 0; e < 8; ++e) acc[e] += v[e];
            }
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[e] *= scale;
            reinterpret_cast<uint4*>(yr)[c] = pack8(acc);
        }
    } else {
        for (int c = threadIdx.x; c < hidden; c += blockDim.x) {
            float acc = to_f32(table[token * hidden + c]);
            for (int i = 0; i < ncb; ++i) acc += to_f32(codebooks[(size_t)cbs[i] * hidden + c]);
            yr[c] = to_bf16(acc * scale);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Restricted lm_head: out[i] = Σ_c head[ids[i], c] · h[c] in f32, for the candidate ids only (a
// gathered GEMV: the weight rows are read once, 16-byte loads, HEAD_UNROLL in flight per lane).
//
// Launch: block = 256 threads (8 warps), grid = (ceil(n_ids / 8), rows), dynamic shared memory
// k·2 bytes (the bf16 hidden row, staged once per block). Warp w of block (b, r) computes id 8b + w
// of hidden row r into out[r·n_ids + ·]: each row's sums are the same whatever the row count. The
// vector path needs k % 8 == 0; otherwise single elements.
constexpr int HEAD_UNROLL = 8;

extern "C" __global__ void __launch_bounds__(256) restricted_logits(const bf16* __restrict__ head, const uint32_t* __restrict__ ids,
                                                                    const bf16* __restrict__ h, float* __restrict__ out,
                                                                    int n_ids, int k) {
    pdl_begin();
    extern __shared__ uint4 hs[];  // the hidden row: k / 8 vectors (or k bf16 when k % 8 != 0)
    h += (size_t)blockIdx.y * k;
    out += (size_t)blockIdx.y * n_ids;
    const bool vec = (k & 7) == 0;
    if (vec) {
        for (int c = threadIdx.x; c < (k >> 3); c += blockDim.x) hs[c] = reinterpret_cast<const uint4*>(h)[c];
    } else {
        for (int c = threadIdx.x; c < k; c += blockDim.x) reinterpret_cast<bf16*>(hs)[c] = h[c];
    }
    __syncthreads();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int i = blockIdx.x * (blockDim.x >> 5) + warp;
    if (i >= n_ids) return;  // after the block's only barrier
    float acc = 0.f;
    if (vec) {
        const int k8 = k >> 3;
        const uint4* wr = reinterpret_cast<const uint4*>(head) + (size_t)ids[i] * k8;
        for (int base = lane; base < k8; base += 32 * HEAD_UNROLL) {
            uint4 wv[HEAD_UNROLL];
#pragma unroll
            for (int u = 0; u < HEAD_UNROLL; ++u) {
                const int c = base + 32 * u;
                wv[u] = c < k8 ? load_stream(wr + c) : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int u = 0; u < HEAD_UNROLL; ++u) {
                const int c = base + 32 * u;
                if (c >= k8) break;
                float wf[8], hf[8];
                unpack8(wv[u], wf);
                unpack8(hs[c], hf);
#pragma unroll
                for (int e = 0; e < 8; ++e) acc = fmaf(wf[e], hf[e], acc);
            }
        }
    } else {
        const bf16* wr = head + (size_t)ids[i] * k;
        const bf16* hb = reinterpret_cast<const bf16*>(hs);
        for (int c = lane; c < k; c += 32) acc = fmaf(to_f32(wr[c]), to_f32(hb[c]), acc);
    }
    acc = warp_sum(acc);
    if (lane == 0) out[i] = acc;
}
