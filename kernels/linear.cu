// Dense bf16 projections y = x · Wᵀ (W: [n, k] row-major as stored), the input-embedding gather
// and the restricted lm_head. fp32 accumulation; projection and embedding outputs are rounded
// once to bf16, logits stay f32. Multi-row projections normally go to cuBLASLt
// (src/backend/cuda/cublaslt.rs); `linear_tiled` is the fallback when the library is absent.
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
// GEMV for few rows (decode). Bandwidth-bound: every weight byte is read once per group of R
// input rows (R ≤ 8, so once per call for decode), with 16-byte loads, GEMV_UNROLL of them in
// flight per lane per weight row; the R input rows sit in shared memory and are reused across
// the GEMV_ROWS_PER_WARP weight rows a warp holds in registers.
//
// Floor on the H200 (≈4.3 TB/s measured copy bandwidth): bytes of W / 4.3e12, e.g.
//   [8192, 2048] 32 MiB → 7.8 µs; [4096, 2048] and [2048, 4096] 16 MiB → 3.9 µs;
//   [512, 2048] 2 MiB → 0.49 µs; [32, 2048] 128 KiB → 0.03 µs (launch latency dominates).
//
// Launch: block = GEMV_WARPS·32 = 256 threads, grid = (ceil(n / 16), ceil(rows / R)), dynamic
// shared memory R·k·2 bytes. Block (bx, by) computes outputs [16·bx, 16·bx + 16) of input rows
// [R·by, R·by + R); input rows past `rows` are zero-filled in shared memory and never stored.
// Needs k % 8 == 0 (16-byte vectors; every row start is then 16-byte aligned).
constexpr int GEMV_WARPS = 8;
constexpr int GEMV_ROWS_PER_WARP = 2;
constexpr int GEMV_UNROLL = 4;

template <int R>
__device__ __forceinline__ void gemv(const bf16* __restrict__ x, const bf16* __restrict__ w,
                                     bf16* __restrict__ y, int rows, int n, int k) {
    extern __shared__ uint4 xs[];  // [R][k / 8]
    constexpr int NW = GEMV_ROWS_PER_WARP, U = GEMV_UNROLL;
    const int k8 = k >> 3;
    const int row0 = blockIdx.y * R;
    const uint4* xg = reinterpret_cast<const uint4*>(x);
    for (int i = threadIdx.x; i < R * k8; i += blockDim.x) {
        const int r = i / k8;
        xs[i] = row0 + r < rows ? xg[(size_t)(row0 + r) * k8 + (i - r * k8)] : make_uint4(0, 0, 0, 0);
    }
    __syncthreads();

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int n0 = (blockIdx.x * GEMV_WARPS + warp) * NW;
    if (n0 >= n) return;  // after the block's only barrier
    const uint4* wr[NW];
#pragma unroll
    for (int j = 0; j < NW; ++j) wr[j] = reinterpret_cast<const uint4*>(w) + (size_t)min(n0 + j, n - 1) * k8;

    float acc[NW][R];
#pragma unroll
    for (int j = 0; j < NW; ++j)
#pragma unroll
        for (int r = 0; r < R; ++r) acc[j][r] = 0.f;

    for (int base = lane; base < k8; base += 32 * U) {
        uint4 wv[NW][U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int c = base + 32 * u;
#pragma unroll
            for (int j = 0; j < NW; ++j) wv[j][u] = c < k8 ? load_stream(wr[j] + c) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int c = base + 32 * u;
            if (c >= k8) break;
            float wf[NW][8];
#pragma unroll
            for (int j = 0; j < NW; ++j) unpack8(wv[j][u], wf[j]);
#pragma unroll
            for (int r = 0; r < R; ++r) {
                float xf[8];
                unpack8(xs[r * k8 + c], xf);
#pragma unroll
                for (int j = 0; j < NW; ++j)
#pragma unroll
                    for (int e = 0; e < 8; ++e) acc[j][r] = fmaf(wf[j][e], xf[e], acc[j][r]);
            }
        }
    }

    // Every lane gets every sum; lane j·R + r stores output (row0 + r, n0 + j).
#pragma unroll
    for (int j = 0; j < NW; ++j)
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const float s = warp_sum(acc[j][r]);
            if (lane == j * R + r && n0 + j < n && row0 + r < rows) y[(size_t)(row0 + r) * n + n0 + j] = to_bf16(s);
        }
}

// The GEMV at the four group widths the host picks from (rows rounded up to a power of two).
extern "C" __global__ void __launch_bounds__(256) linear_gemv_r1(const bf16* x, const bf16* w, bf16* y, int rows, int n, int k) {
    gemv<1>(x, w, y, rows, n, k);
}
extern "C" __global__ void __launch_bounds__(256) linear_gemv_r2(const bf16* x, const bf16* w, bf16* y, int rows, int n, int k) {
    gemv<2>(x, w, y, rows, n, k);
}
extern "C" __global__ void __launch_bounds__(256) linear_gemv_r4(const bf16* x, const bf16* w, bf16* y, int rows, int n, int k) {
    gemv<4>(x, w, y, rows, n, k);
}
extern "C" __global__ void __launch_bounds__(256) linear_gemv_r8(const bf16* x, const bf16* w, bf16* y, int rows, int n, int k) {
    gemv<8>(x, w, y, rows, n, k);
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
