// Block-FP8 MoE block (`backbone.md` §5–6): routed SwiGLU experts with [128,128]-block weight
// scales, and the weighted combine with the sigmoid-gated shared expert. The router and the
// grouping of pairs by expert are in moe_route.cu; the dynamic 1×128 e4m3 activation quantiser
// and the tensor-core experts in moe_rows.cu and moe_rows_wide.cu.
//
// Expert GEMM arithmetic (as the CPU oracle, `fp8_linear.rs`): y[o] = Σ_g s_x[g] · s_w[o/128][g] ·
// Σ_{i∈g} x[i]·w[o,i], fp32 partial sums per 128-wide K group, the two scales applied once per
// group. Activations come as one of three kinds (`ACT_*`): e4m3 codes with one f32 scale per
// 128 columns (Fp8Dynamic), or bf16 / f32 values used directly with unit scales (Exact).
//
// Two expert paths here give the same math: a per-(row, slot) GEMV path for decode, and a grouped
// path for prefill (pairs sorted by expert on the device, 32-row tiles sharing one weight tile).
// Both (and moe_rows.cu's) write one f32 output row per (row, slot); the combine sums the slots in
// slot order, so the result does not depend on scheduling (no float atomics).
#include "moe.cuh"
#include "norm.cuh"

// ---------------------------------------------------------------------------------------------
// e4m3 dot product

// acc + Σ_j x[j]·w[j] over 4 packed e4m3 weights, in element order.
__device__ __forceinline__ float dot_e4m3x4(unsigned int w, float4 x, float acc) {
    const float4 v = e4m3x4_to_float4(w);
    acc = fmaf(x.x, v.x, acc);
    acc = fmaf(x.y, v.y, acc);
    acc = fmaf(x.z, v.z, acc);
    acc = fmaf(x.w, v.w, acc);
    return acc;
}

// ---------------------------------------------------------------------------------------------
// Prefill: grouped block-FP8 GEMMs (CUDA-core FMA on dequantised e4m3)

// Tile: TM rows (pairs of one expert) × TN output columns, per weight matrix; K walked in BK-wide
// steps, four per 128-wide scale group. 256 threads: thread (tr = tid/32, tc = tid%32) owns rows
// tr·4 + i and columns tc + 32·j (i, j < 4) of each matrix, so a warp owns 4 whole tile rows.
#define TM 32
#define TN 128
#define BK 32
#define GEMM_THREADS 256

template <int NB>
struct TileSmem {
    float a[BK][TM + 1];       // activations, k-major; +1 pad: the stores are conflict-free
    float b[BK][NB * TN + 1];  // dequantised weight codes, k-major; +1 pad likewise
    int src[TM];               // activation row of each tile row, or -1 past the expert's pairs
    float sx[TM];              // activation scale of each tile row for the current K group
};

// acc[m][i][j] = Σ_g s_x[row][g] · s_w_m[n0/128][g] · Σ_{k∈g} a[row][k] · w_m[n0 + col][k] for
// the tile's rows (s.src, set before the call) and the NB weight matrices w[m] ([N, K] e4m3).
template <int NB>
__device__ __forceinline__ void grouped_tile(const void* __restrict__ act, const float* __restrict__ act_scales,
                                             int kind, const unsigned char* const (&w)[NB],
                                             const float* const (&sw)[NB], int K, int N, int n0, TileSmem<NB>& s,
                                             float (&acc)[NB][4][4]) {
    __syncthreads();  // s.src is ready
    const int tid = threadIdx.x, tr = tid >> 5, tc = tid & 31;
    const int groups = K >> 7, steps = K / BK;
    // Loader roles: activations row ar, columns ak..ak+3; weights row tid/2 of each matrix, 16 bytes.
    const int ar = tid >> 3, ak = (tid & 7) * 4;
    const int asrc = s.src[ar];
    const int wn = n0 + (tid >> 1), whalf = (tid & 1) * 16;
    const size_t sw_row = (size_t)(n0 >> 7) * groups;

    float4 areg;
    uint4 breg[NB];
    auto load = [&](int kt) {
        const int k0 = kt * BK;
        areg = asrc >= 0 ? load_act4(act, kind, (size_t)asrc * K + k0 + ak) : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int m = 0; m < NB; ++m)
            breg[m] = wn < N ? __ldg(reinterpret_cast<const uint4*>(w[m] + (size_t)wn * K + k0 + whalf))
                             : make_uint4(0u, 0u, 0u, 0u);
    };

    float part[NB][4][4];
#pragma unroll
    for (int m = 0; m < NB; ++m)
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j) acc[m][i][j] = part[m][i][j] = 0.f;

    load(0);
    for (int kt = 0; kt < steps; ++kt) {
        const int g = kt / (128 / BK);
        __syncthreads();  // the previous step's reads of s.a / s.b are done
        s.a[ak + 0][ar] = areg.x;
        s.a[ak + 1][ar] = areg.y;
        s.a[ak + 2][ar] = areg.z;
        s.a[ak + 3][ar] = areg.w;
#pragma unroll
        for (int m = 0; m < NB; ++m) {
            const unsigned int words[4] = {breg[m].x, breg[m].y, breg[m].z, breg[m].w};
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                const float4 v = e4m3x4_to_float4(words[q]);
                s.b[whalf + 4 * q + 0][m * TN + (tid >> 1)] = v.x;
                s.b[whalf + 4 * q + 1][m * TN + (tid >> 1)] = v.y;
                s.b[whalf + 4 * q + 2][m * TN + (tid >> 1)] = v.z;
                s.b[whalf + 4 * q + 3][m * TN + (tid >> 1)] = v.w;
            }
        }
        if (kt % (128 / BK) == 0 && tid < TM) {
            const int src = s.src[tid];
            s.sx[tid] = (kind == ACT_E4M3 && src >= 0) ? act_scales[(size_t)src * groups + g] : 1.f;
        }
        __syncthreads();
        if (kt + 1 < steps) load(kt + 1);  // in flight during the FMAs below

#pragma unroll 8
        for (int kk = 0; kk < BK; ++kk) {
            float a[4], b[NB][4];
#pragma unroll
            for (int i = 0; i < 4; ++i) a[i] = s.a[kk][tr * 4 + i];
#pragma unroll
            for (int m = 0; m < NB; ++m)
#pragma unroll
                for (int j = 0; j < 4; ++j) b[m][j] = s.b[kk][m * TN + tc + 32 * j];
#pragma unroll
            for (int m = 0; m < NB; ++m)
#pragma unroll
                for (int i = 0; i < 4; ++i)
#pragma unroll
                    for (int j = 0; j < 4; ++j) part[m][i][j] = fmaf(a[i], b[m][j], part[m][i][j]);
        }

        if (kt % (128 / BK) == 128 / BK - 1) {  // end of a scale group: fold it in with both scales
#pragma unroll
            for (int m = 0; m < NB; ++m) {
                const float swm = sw[m][sw_row + g];
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const float scale = s.sx[tr * 4 + i] * swm;
#pragma unroll
                    for (int j = 0; j < 4; ++j) {
                        acc[m][i][j] += part[m][i][j] * scale;
                        part[m][i][j] = 0.f;
                    }
                }
            }
        }
    }
}

// Gate and up projections of one tile, then h = SiLU(gate) ⊙ up (fp32). With quantise, h is
// requantised per row in the tile's 128 columns (= one K group of the down projection) and
// written as e4m3 codes hq [pairs, N] + scales hscale [pairs, N/128]; otherwise as f32 hf
// [pairs, N]. Rows of h are sorted positions. Grid (max_tiles, N/128), 256 threads; blocks past
// tiles[0] exit. act: the layer input rows (kind ACT_E4M3 with act_scales, or ACT_BF16);
// K = hidden, N = intermediate (both multiples of 128).
extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    moe_grouped_gate_up(const void* __restrict__ act, const float* __restrict__ act_scales, int kind,
                        const int* __restrict__ sorted, const int* __restrict__ tiles,
                        const int* __restrict__ offsets, const unsigned long long* __restrict__ table, int top_k,
                        int K, int N, int quantise, unsigned char* __restrict__ hq, float* __restrict__ hscale,
                        float* __restrict__ hf) {
    pdl_begin();
    __shared__ TileSmem<2> s;
    const int tile = blockIdx.x;
    if (tile >= tiles[0]) return;  // block-uniform, before any barrier
    const int e = tiles[1 + 2 * tile], start = tiles[2 + 2 * tile];
    const int end = min(offsets[e + 1], start + TM);
    const int n0 = blockIdx.y * TN;
    if (threadIdx.x < TM) {
        const int pos = start + threadIdx.x;
        s.src[threadIdx.x] = pos < end ? sorted[pos] / top_k : -1;
    }
    const unsigned long long* t = table + (size_t)e * T_STRIDE;
    const unsigned char* const w[2] = {(const unsigned char*)t[T_GATE_W], (const unsigned char*)t[T_UP_W]};
    const float* const sw[2] = {(const float*)t[T_GATE_S], (const float*)t[T_UP_S]};
    float acc[2][4][4];
    grouped_tile<2>(act, act_scales, kind, w, sw, K, N, n0, s, acc);

    const int tr = threadIdx.x >> 5, tc = threadIdx.x & 31;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int pos = start + tr * 4 + i;
        if (pos >= end) continue;  // warp-uniform: a warp owns whole rows
        float h[4];
        float amax = 0.f;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            h[j] = siluf_(acc[0][i][j]) * acc[1][i][j];
            amax = fmaxf(amax, fabsf(h[j]));
        }
        if (quantise) {
            const float sc = quant_scale(warp_max(amax));
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const int col = n0 + tc + 32 * j;
                if (col < N) hq[(size_t)pos * N + col] = quant_e4m3(h[j], sc);
            }
            if (tc == 0) hscale[(size_t)pos * (N >> 7) + (n0 >> 7)] = sc;
        } else {
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const int col = n0 + tc + 32 * j;
                if (col < N) hf[(size_t)pos * N + col] = h[j];
            }
        }
    }
}

// Down projection of one tile: y[pair, :] = W_down h[pos] for the tile's sorted positions, written
// at the pair's row of y [pairs, N] f32 (unweighted; the combine applies the routing weight).
// Grid (max_tiles, N/128), 256 threads. act: h rows by sorted position (ACT_E4M3 with
// act_scales, or ACT_F32); K = intermediate, N = hidden.
extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    moe_grouped_down(const void* __restrict__ act, const float* __restrict__ act_scales, int kind,
                     const int* __restrict__ sorted, const int* __restrict__ tiles, const int* __restrict__ offsets,
                     const unsigned long long* __restrict__ table, int K, int N, float* __restrict__ y) {
    pdl_begin();
    __shared__ TileSmem<1> s;
    const int tile = blockIdx.x;
    if (tile >= tiles[0]) return;
    const int e = tiles[1 + 2 * tile], start = tiles[2 + 2 * tile];
    const int end = min(offsets[e + 1], start + TM);
    const int n0 = blockIdx.y * TN;
    if (threadIdx.x < TM) {
        const int pos = start + threadIdx.x;
        s.src[threadIdx.x] = pos < end ? pos : -1;
    }
    const unsigned long long* t = table + (size_t)e * T_STRIDE;
    const unsigned char* const w[1] = {(const unsigned char*)t[T_DOWN_W]};
    const float* const sw[1] = {(const float*)t[T_DOWN_S]};
    float acc[1][4][4];
    grouped_tile<1>(act, act_scales, kind, w, sw, K, N, n0, s, acc);

    const int tr = threadIdx.x >> 5, tc = threadIdx.x & 31;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int pos = start + tr * 4 + i;
        if (pos >= end) continue;
        const int pair = sorted[pos];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int col = n0 + tc + 32 * j;
            if (col < N) y[(size_t)pair * N + col] = acc[0][i][j];
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Decode: one-row GEMVs per (row, slot)

// acc[r] += Σ_g s_x[g] · sw[r][g] · Σ_{i∈g} xs[i]·w[r][i] for R weight rows of K e4m3 codes
// (K % 512 == 0 not needed, K % 16 == 0 is). Lane l reads 16 bytes at l·16 + 512·step of every
// row (coalesced); xs/xsc: the activation row and its group scales in shared memory.
template <int R>
__device__ __forceinline__ void gemv_rows(const unsigned char* const (&w)[R], const float* const (&sw)[R],
                                          const float* xs, const float* xsc, int K, float (&acc)[R]) {
    const int lane = threadIdx.x & 31;
#pragma unroll 2
    for (int i = lane * 16; i < K; i += 32 * 16) {
        uint4 wv[R];
#pragma unroll
        for (int r = 0; r < R; ++r) wv[r] = __ldg(reinterpret_cast<const uint4*>(w[r] + i));
        const float4* xv = reinterpret_cast<const float4*>(xs + i);
        const float4 x0 = xv[0], x1 = xv[1], x2 = xv[2], x3 = xv[3];
        const int g = i >> 7;
        const float sx = xsc[g];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            float p = 0.f;
            p = dot_e4m3x4(wv[r].x, x0, p);
            p = dot_e4m3x4(wv[r].y, x1, p);
            p = dot_e4m3x4(wv[r].z, x2, p);
            p = dot_e4m3x4(wv[r].w, x3, p);
            acc[r] += p * (sx * sw[r][g]);
        }
    }
}

// h[pair, o] = SiLU(gate_o · x) · (up_o · x) for the pair's expert and row (pair / top_k).
// Warp w of block b owns columns o = 16·b + 2·w and o + 1 (4 weight rows in flight). Grid
// (ceil(N/16), pairs), 256 threads, dynamic shared (K + K/128) floats. act: layer input rows
// (ACT_E4M3 with act_scales, or ACT_BF16); K = hidden, N = intermediate; h: [pairs, N] f32.
extern "C" __global__ void __launch_bounds__(256)
    moe_gemv_gate_up(const void* __restrict__ act, const float* __restrict__ act_scales, int kind,
                     const int* __restrict__ ids, const unsigned long long* __restrict__ table, int top_k, int E,
                     int K, int N, float* __restrict__ h) {
    pdl_begin();
    extern __shared__ float gemv_smem[];
    float* xs = gemv_smem;
    float* xsc = gemv_smem + K;
    const int pair = blockIdx.y, row = pair / top_k, groups = K >> 7;
    for (int i = threadIdx.x * 4; i < K; i += blockDim.x * 4)
        *reinterpret_cast<float4*>(xs + i) = load_act4(act, kind, (size_t)row * K + i);
    for (int g = threadIdx.x; g < groups; g += blockDim.x)
        xsc[g] = kind == ACT_E4M3 ? act_scales[(size_t)row * groups + g] : 1.f;
    __syncthreads();

    const int e = ids[pair];
    if (e < 0 || e >= E) return;  // cannot happen (route writes valid ids); leaves h unwritten
    const unsigned long long* t = table + (size_t)e * T_STRIDE;
    const unsigned char* gw = (const unsigned char*)t[T_GATE_W];
    const unsigned char* uw = (const unsigned char*)t[T_UP_W];
    const float* gs = (const float*)t[T_GATE_S];
    const float* us = (const float*)t[T_UP_S];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int o0 = blockIdx.x * 16 + warp * 2;
    if (o0 >= N) return;
    const int o1 = min(o0 + 1, N - 1);
    const unsigned char* const w[4] = {gw + (size_t)o0 * K, gw + (size_t)o1 * K, uw + (size_t)o0 * K,
                                       uw + (size_t)o1 * K};
    const float* const sw[4] = {gs + (size_t)(o0 >> 7) * groups, gs + (size_t)(o1 >> 7) * groups,
                                us + (size_t)(o0 >> 7) * groups, us + (size_t)(o1 >> 7) * groups};
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    gemv_rows<4>(w, sw, xs, xsc, K, acc);
#pragma unroll
    for (int r = 0; r < 4; ++r) acc[r] = warp_sum(acc[r]);
    if (lane == 0) {
        h[(size_t)pair * N + o0] = siluf_(acc[0]) * acc[2];
        if (o0 + 1 < N) h[(size_t)pair * N + o0 + 1] = siluf_(acc[1]) * acc[3];
    }
}

// y[pair, o] = W_down[o] · h[pair] for the pair's expert; with quantise, h is first requantised
// per 128-group exactly as the grouped path's gate/up epilogue does. Warp w of block b owns rows
// o = 32·b + 4·w .. +3. Grid (ceil(N/32), pairs), 256 threads, dynamic shared (K + K/128)
// floats. h: [pairs, K] f32; K = intermediate, N = hidden; y: [pairs, N] f32.
extern "C" __global__ void __launch_bounds__(256)
    moe_gemv_down(const float* __restrict__ h, int quantise, const int* __restrict__ ids,
                  const unsigned long long* __restrict__ table, int E, int K, int N, float* __restrict__ y) {
    pdl_begin();
    extern __shared__ float gemv_smem[];
    float* xs = gemv_smem;
    float* xsc = gemv_smem + K;
    const int pair = blockIdx.y, groups = K >> 7;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    for (int i = threadIdx.x * 4; i < K; i += blockDim.x * 4)
        *reinterpret_cast<float4*>(xs + i) = *reinterpret_cast<const float4*>(h + (size_t)pair * K + i);
    __syncthreads();
    for (int g = warp; g < groups; g += warps) {
        float v[4], amax = 0.f;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            v[j] = xs[g * 128 + lane + 32 * j];
            amax = fmaxf(amax, fabsf(v[j]));
        }
        if (quantise) {
            const float sc = quant_scale(warp_max(amax));
#pragma unroll
            for (int j = 0; j < 4; ++j) xs[g * 128 + lane + 32 * j] = e4m3_to_f32(quant_e4m3(v[j], sc));
            if (lane == 0) xsc[g] = sc;
        } else if (lane == 0) {
            xsc[g] = 1.f;
        }
    }
    __syncthreads();

    const int e = ids[pair];
    if (e < 0 || e >= E) return;
    const unsigned long long* t = table + (size_t)e * T_STRIDE;
    const unsigned char* dw = (const unsigned char*)t[T_DOWN_W];
    const float* ds = (const float*)t[T_DOWN_S];
    const int o0 = blockIdx.x * 32 + warp * 4;
    if (o0 >= N) return;
    int o[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) o[r] = min(o0 + r, N - 1);
    const unsigned char* const w[4] = {dw + (size_t)o[0] * K, dw + (size_t)o[1] * K, dw + (size_t)o[2] * K,
                                       dw + (size_t)o[3] * K};
    const float* const sw[4] = {ds + (size_t)(o[0] >> 7) * groups, ds + (size_t)(o[1] >> 7) * groups,
                                ds + (size_t)(o[2] >> 7) * groups, ds + (size_t)(o[3] >> 7) * groups};
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    gemv_rows<4>(w, sw, xs, xsc, K, acc);
#pragma unroll
    for (int r = 0; r < 4; ++r) acc[r] = warp_sum(acc[r]);
    if (lane == 0) {
#pragma unroll
        for (int r = 0; r < 4; ++r)
            if (o0 + r < N) y[(size_t)pair * N + o0 + r] = acc[r];
    }
}

// ---------------------------------------------------------------------------------------------
// Shared expert and combine

// h = bf16(SiLU(g) · u) elementwise (the shared expert's activation). Grid ceil(n/256), 256 threads.
extern "C" __global__ void moe_swiglu_bf16(const bf16* __restrict__ g, const bf16* __restrict__ u,
                                           bf16* __restrict__ h, int n) {
    pdl_begin();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) h[i] = to_bf16(siluf_(to_f32(g[i])) * to_f32(u[i]));
}

// out[r] = bf16(Σ_slot w[r, slot] · y[r·top_k + slot] + shared_gate[r] · shared[r]), the slots
// summed in slot order in fp32, one rounding. One thread per output: grid (rows, ceil(N / 256)),
// 256 threads (a decode row spreads over N / 256 SMs; one block per row ran its 2048 outputs'
// dependent loads on one SM, ≈ 12 µs a launch). y: [rows·top_k, N] f32; w: [rows, top_k];
// shared_gate: [rows]; shared, out: [rows, N] bf16.
extern "C" __global__ void moe_combine(const float* __restrict__ y, const float* __restrict__ w,
                                       const float* __restrict__ shared_gate, const bf16* __restrict__ shared,
                                       bf16* __restrict__ out, int top_k, int N) {
    pdl_begin();
    const int r = blockIdx.x, c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= N) return;
    const float* wr = w + (size_t)r * top_k;
    const float* yr = y + (size_t)r * top_k * N;
    float acc = 0.f;
    for (int s = 0; s < top_k; ++s) acc += wr[s] * yr[(size_t)s * N + c];
    acc += shared_gate[r] * to_f32(shared[(size_t)r * N + c]);
    out[(size_t)r * N + c] = to_bf16(acc);
}

// moe_combine, then add_rms_norm_zc of its output into the residual (norm.cu), in one launch: the
// decode MoE ending in the next layer's input norm. One block of NORM_THREADS threads per row of
// N ≤ NORM_REGS · NORM_THREADS columns; thread t combines columns t + j · NORM_THREADS exactly as
// moe_combine does (slots in order from 0.f, then the gated shared expert, one rounding to bf16)
// and hands them to the norm's register path: the bits of the two launches, one launch fewer.
// The y values of COMBINE_SLOTS slots are loaded together (one round trip per COMBINE_SLOTS
// slots); the gain, a weight, is fetched before waiting on the kernel before.
// y: [rows·top_k, N] f32; w: [rows, top_k]; shared_gate: [rows]; shared, residual, out: [rows, N]
// bf16; gain: [N] f32.
extern "C" __global__ void __launch_bounds__(NORM_THREADS) moe_combine_add_norm(
    const float* __restrict__ y, const float* __restrict__ w, const float* __restrict__ shared_gate,
    const bf16* __restrict__ shared, bf16* __restrict__ residual, const float* __restrict__ gain,
    bf16* __restrict__ out, int top_k, int N, float eps) {
    __shared__ float scratch[32];
    const int r = blockIdx.x, t = threadIdx.x;
    float g[NORM_REGS];
#pragma unroll
    for (int j = 0; j < NORM_REGS; ++j) {
        const int c = t + j * NORM_THREADS;
        g[j] = c < N ? gain[c] : 0.f;
    }
    pdl_begin();
    const float* wr = w + (size_t)r * top_k;
    const float* yr = y + (size_t)r * top_k * N;
    const bf16* sr = shared + (size_t)r * N;
    bf16* rr = residual + (size_t)r * N;
    float acc[NORM_REGS];
    bf16 a[NORM_REGS], sh[NORM_REGS];
#pragma unroll
    for (int j = 0; j < NORM_REGS; ++j) {
        const int c = t + j * NORM_THREADS;
        acc[j] = 0.f;
        a[j] = c < N ? rr[c] : to_bf16(0.f);
        sh[j] = c < N ? sr[c] : to_bf16(0.f);
    }
    for (int s0 = 0; s0 < top_k; s0 += COMBINE_SLOTS) {
        float ws[COMBINE_SLOTS], yv[COMBINE_SLOTS][NORM_REGS];
#pragma unroll
        for (int i = 0; i < COMBINE_SLOTS; ++i) {
            const int s = s0 + i;
            ws[i] = s < top_k ? wr[s] : 0.f;
#pragma unroll
            for (int j = 0; j < NORM_REGS; ++j) {
                const int c = t + j * NORM_THREADS;
                yv[i][j] = s < top_k && c < N ? yr[(size_t)s * N + c] : 0.f;
            }
        }
#pragma unroll
        for (int i = 0; i < COMBINE_SLOTS; ++i)
            if (s0 + i < top_k)
#pragma unroll
                for (int j = 0; j < NORM_REGS; ++j) acc[j] += ws[i] * yv[i][j];
    }
    const float gate = shared_gate[r];
    bf16 delta[NORM_REGS];
#pragma unroll
    for (int j = 0; j < NORM_REGS; ++j) {
        acc[j] += gate * to_f32(sh[j]);
        delta[j] = to_bf16(acc[j]);
    }
    add_rms_norm_row(rr, a, delta, g, out + (size_t)r * N, N, eps, scratch);
}
