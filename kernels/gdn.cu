// Gated DeltaNet mixer core (`backbone.md` §3): causal depthwise conv + SiLU with the carried conv
// state, q/k L2 norm and gates, the delta rule (64-token chunks for prefill, token recurrence for
// decode) and the gated RMSNorm of each value head. The projections around it are `linear.cu`.
//
// Numerics follow the CPU oracle (`src/backend/cpu/backbone/gdn.rs`, `gdn_chunk.rs`) step for
// step, in fp32: inputs are the bf16 projection outputs, everything between is fp32 (conv output,
// normalised q/k, gates, core output, recurrent state), and only the gated norm rounds to bf16.
//
// The chunked form (WY/UT transform of each 64-token chunk, then one read and one update of the
// chunk-start state) is the one of flash-linear-attention (github.com/fla-org/flash-linear-attention,
// MIT licence, `chunk_gated_delta_rule`), here kept entirely in fp32 and computed as the
// transformers torch reference orders it.
//
// Layouts (row t of a call, C = 2·Hk·Dk + Hv·Dv channels):
//   prep   f32 [T, C]       conv output: q (L2-normalised, scaled by Dk^-1/2) | k (normalised) | v
//   gates  f32 [2, T, Hv]   β = sigmoid(b), then g = −exp(A_log)·softplus(a + dt_bias)
//   state  f32 [Hv, Dk, Dv] recurrent state S[k][v] per value head (the CPU GdnState layout)
//   conv   f32 [K−1, C]     the last K−1 pre-conv inputs, oldest first (bf16-exact values)
//   o      f32 [T, Hv, Dv]  core output before the gated norm
#include "common.cuh"
// GDN_THREADS, GDN_CHUNK (tokens per chunk, as in the reference; the last chunk may be
// shorter), GDN_BV (value columns per CTA of the recurrent core: one per lane), GDN_SCAN_BV
// (value columns per CTA of the chunk scan) and GDN_MAX_DK (the largest key dim the cores
// support): src/backend/cuda/kernel_constants.rs.
#include "kernel_constants.cuh"

#define GDN_WARPS (GDN_THREADS / 32)
// Rows of S a warp of the recurrent core holds.
#define GDN_ROWS_PER_WARP (GDN_MAX_DK / GDN_WARPS)
// Epsilon of the q/k L2 norm, inside the sqrt; fixed in the reference.
#define GDN_L2_EPS 1e-6f

// Fills n floats with zeros (a fresh request's states). One thread per value.
extern "C" __global__ void gdn_zero_f32(float* __restrict__ p, int n) {
    pdl_begin();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = 0.f;
}

// Conv + SiLU, q/k normalisation and the gates of one row. Grid = (rows, ceil(C /
// block_channels)), any multiple of 32 threads: block (t, j) owns row t's channels
// [j·block_channels, (j + 1)·block_channels), a multiple of key_dim, so each q or k head lies in
// one block (a decode row spreads over C / block_channels SMs instead of one); blocks (t, 0) also
// write row t's gates. Each channel's conv and each head's norm are computed as one block per row
// computed them (taps in order; a warp per head, lanes striding key_dim, then warp_sum), so the
// bits do not depend on block_channels. qkv: [rows, C] bf16 projection; conv_state: [K−1, C] f32 (read
// only; gdn_conv_state_update advances it afterwards); conv_w: [C, 1, K] bf16, tap K−1 multiplies
// the current row; b, a: [rows, Hv] bf16; a_log, dt_bias: [Hv] f32.
// `prep` is written, then re-read by other threads of the block after the barrier (hence no
// __restrict__: its loads must see this block's stores).
// The decode batch (`states` given: one conv state per row): row t is its own sequence of one row,
// its history from states[t].
extern "C" __global__ void gdn_conv_prepare(const bf16* __restrict__ qkv, const float* conv_state,
                                            const bf16* __restrict__ conv_w, const bf16* __restrict__ b,
                                            const bf16* __restrict__ a, const float* __restrict__ a_log,
                                            const float* __restrict__ dt_bias, float* prep, float* __restrict__ gates,
                                            int rows, int channels, int kernel, int key_heads, int key_dim,
                                            int value_heads, float q_scale, const unsigned long long* states,
                                            const int* __restrict__ row_seq, const int* __restrict__ seq_starts,
                                            int block_channels) {
    pdl_begin();
    const int t = blockIdx.x;
    const int c0 = blockIdx.y * block_channels, c1 = min(channels, c0 + block_channels);
    const int history = kernel - 1;
    float* out = prep + (size_t)t * channels;
    // Several sequences (`states` given): row t belongs to sequence row_seq[t], whose rows start
    // at seq_starts[that]; without row_seq (the decode batch) row t is row 0 of sequence t.
    const int seq = row_seq ? row_seq[t] : t;
    const int start = states ? (row_seq ? seq_starts[seq] : t) : 0;
    const int own = t - start;
    const bf16* seq_qkv = qkv + (size_t)start * channels;
    if (states) conv_state = reinterpret_cast<const float*>(states[seq]);
    for (int c = c0 + threadIdx.x; c < c1; c += blockDim.x) {
        float acc = 0.f;
        for (int i = 0; i < kernel; ++i) {
            // Input row t − (K−1) + i; rows before this call come from the carried state.
            const int r = own - history + i;
            const float x = r >= 0 ? to_f32(seq_qkv[(size_t)r * channels + c])
                                   : conv_state[(size_t)(history + r) * channels + c];
            acc = fmaf(to_f32(conv_w[(size_t)c * kernel + i]), x, acc);
        }
        out[c] = siluf_(acc);
    }
    __syncthreads();

    // One warp per q or k head vector: x / sqrt(Σx² + eps), q also scaled by Dk^-1/2.
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const int h1 = min(2 * key_heads, c1 / key_dim);
    for (int h = c0 / key_dim + warp; h < h1; h += warps) {
        float* vec = out + (size_t)h * key_dim;
        float ss = 0.f;
        for (int d = lane; d < key_dim; d += 32) ss = fmaf(vec[d], vec[d], ss);
        const float inv = rsqrtf(warp_sum(ss) + GDN_L2_EPS) * (h < key_heads ? q_scale : 1.f);
        for (int d = lane; d < key_dim; d += 32) vec[d] *= inv;
    }

    if (blockIdx.y != 0) return;
    for (int j = threadIdx.x; j < value_heads; j += blockDim.x) {
        const size_t idx = (size_t)t * value_heads + j;
        gates[idx] = sigmoidf_(to_f32(b[idx]));
        // softplus with PyTorch's threshold 20 (linear above it).
        const float x = to_f32(a[idx]) + dt_bias[j];
        const float softplus = x > 20.f ? x : log1pf(expf(x));
        gates[(size_t)rows * value_heads + idx] = -expf(a_log[j]) * softplus;
    }
}

// Conv state ← the last K−1 rows of [state; qkv] (run after gdn_conv_prepare). One thread per
// channel; row i of the new state is row rows + i of that window, which lies ahead of i, so the
// in-place shift reads each old row before overwriting it.
// Several sequences (`states` given): grid.y = sequences, sequence y's state at states[y]; its
// rows are seq_starts[y]..seq_starts[y + 1] of qkv, or (no seq_starts: the decode batch) row y
// alone (`rows` is then 1).
extern "C" __global__ void gdn_conv_state_update(float* state, const bf16* qkv, int rows, int channels, int history,
                                                 const unsigned long long* states, const int* __restrict__ seq_starts) {
    pdl_begin();
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= channels) return;
    if (states) {
        const int y = blockIdx.y;
        const int start = seq_starts ? seq_starts[y] : y;
        if (seq_starts) rows = seq_starts[y + 1] - start;
        state = reinterpret_cast<float*>(states[y]);
        qkv += (size_t)start * channels;
    }
    for (int i = 0; i < history; ++i) {
        const int src = rows + i;
        state[(size_t)i * channels + c] = src < history ? state[(size_t)src * channels + c]
                                                        : to_f32(qkv[(size_t)(src - history) * channels + c]);
    }
}

// Copies chunk rows [0, n) × columns [0, cols) of a row-major global matrix (row stride `stride`)
// into shared memory at dst(i, d), loads flattened over (row, column) and issued GDN_LOAD_BATCH
// at a time before any store (one global round trip per batch, not per row). Copies only.
#define GDN_LOAD_BATCH 16
template <typename Dst>
__device__ __forceinline__ void gdn_load_tile(const float* __restrict__ src, size_t stride, int n, int cols, Dst dst) {
    const int total = n * cols;
    for (int e0 = threadIdx.x; e0 < total; e0 += GDN_LOAD_BATCH * GDN_THREADS) {
        float v[GDN_LOAD_BATCH];
#pragma unroll
        for (int u = 0; u < GDN_LOAD_BATCH; ++u) {
            const int e = e0 + u * GDN_THREADS;
            v[u] = e < total ? __ldg(src + (size_t)(e / cols) * stride + e % cols) : 0.f;
        }
#pragma unroll
        for (int u = 0; u < GDN_LOAD_BATCH; ++u) {
            const int e = e0 + u * GDN_THREADS;
            if (e < total) dst(e / cols, e % cols, v[u]);
        }
    }
}

// The chunked prefill (`backbone.md` §3.7) in two launches, split as flash-linear-attention
// splits it (its kkt / solve_tril / wy_fast kernels, then chunk_h with the output folded in):
// with γ the cumulative log-decay from the chunk start,
//   A = strict lower β_i (k_i·k_m) e^{γ_i−γ_m};  U = (I+A)⁻¹ diag(β) V;  W = (I+A)⁻¹ diag(β) (K ⊙ e^γ)
//   C = lower (q_i·k_m) e^{γ_i−γ_m} (diagonal included)
// depend on no state, so `gdn_chunk_intra` computes them for every chunk of every prompt at once;
// `gdn_chunk_scan` then walks each prompt's chunks in order:
//   V_new = U − W S;  O = e^γ ⊙ (Q S) + C V_new;  S ← e^{γ_n} S + Kᵀ (e^{γ_n−γ} ⊙ V_new).
// Why (issue 14): the single kernel this replaces ran one CTA of 8 warps per (head, 32 value
// columns), each walking its prompt's chunks and redoing the state-free work (both grams, W's
// substitution) for each of the head's value tiles: 128 CTAs for a 200-row prompt, one per SM,
// issue-bound at 306 µs a layer on an H100 against ~20 µs of FMAs (run 19).
//
// Scratch written by the first and read by the second, row t of the call (t = the chunk's first
// row + i), value head j:
//   w      f32 [rows, Hv, Dk]    W
//   u      f32 [rows, Hv, Dv]    U
//   c      f32 [rows, Hv, 64]    row i of the chunk's C (entries past i are zeros)
//   decay  f32 [rows, Hv, 2]     e^{γ_i}, e^{γ_{n−1}−γ_i}
// Shared-memory rows of Dk floats are padded to Dk + GDN_ROW_PAD (4): a float4 read of 16
// different rows at one column then spans all eight 16-byte bank groups.
// A chunk's shared [64][64] matrices (A, C) have rows of GDN_SQ_STRIDE floats, padded likewise.

// The rows [t_begin, t_end) of sequence z: the whole call without `seq_starts`.
__device__ __forceinline__ void gdn_sequence_rows(const int* seq_starts, int rows, int z, int& t_begin, int& t_end) {
    t_begin = seq_starts ? seq_starts[z] : 0;
    t_end = seq_starts ? seq_starts[z + 1] : rows;
}

// Grid (Hv, chunks of the longest sequence, sequences), 256 threads: one CTA per value head and
// chunk (CTAs past their sequence's end leave at once). Rows of a short last chunk are padded with
// k = 0, β = 0, g = 0, which the reference's padded chunk equals; only rows < n are written.
// Dynamic shared memory (floats), kst = Dk + 4:  K [64][kst] | Q [64][kst] | A [64][68] | γ, β, e^γ [64 each].
// Requires Dk ≤ 128 and Dk % 4 == 0.
extern "C" __global__ void __launch_bounds__(GDN_THREADS, 1)
    gdn_chunk_intra(const float* __restrict__ prep, const float* __restrict__ gates, float* __restrict__ w_out,
                    float* __restrict__ u_out, float* __restrict__ c_out, float* __restrict__ decay_out, int rows,
                    int key_heads, int value_heads, int key_dim, int value_dim, const int* __restrict__ seq_starts) {
    pdl_begin();
    extern __shared__ __align__(16) float smem[];
    const int dk = key_dim, dv = value_dim, kst = key_dim + GDN_ROW_PAD, hv = value_heads;
    const int j = blockIdx.x, kh = j / (value_heads / key_heads);
    int t_begin, t_end;
    gdn_sequence_rows(seq_starts, rows, blockIdx.z, t_begin, t_end);
    const int t0 = t_begin + GDN_CHUNK * blockIdx.y;
    if (t0 >= t_end) return;  // the whole block, before any barrier
    const int n = min(GDN_CHUNK, t_end - t0);
    const int channels = 2 * key_heads * dk + value_heads * dv;

    float* K = smem;
    float* Q = K + GDN_CHUNK * kst;
    float* A = Q + GDN_CHUNK * kst;
    float* gam = A + GDN_CHUNK * GDN_SQ_STRIDE;
    float* beta = gam + GDN_CHUNK;
    float* egam = beta + GDN_CHUNK;

    const size_t row0 = (size_t)t0 * channels;
    gdn_load_tile(prep + row0 + (size_t)(key_heads + kh) * dk, channels, n, dk, [&](int i, int d, float x) { K[i * kst + d] = x; });
    gdn_load_tile(prep + row0 + (size_t)kh * dk, channels, n, dk, [&](int i, int d, float x) { Q[i * kst + d] = x; });
    for (int e = n * dk + threadIdx.x; e < GDN_CHUNK * dk; e += GDN_THREADS) {
        K[(e / dk) * kst + e % dk] = 0.f;
        Q[(e / dk) * kst + e % dk] = 0.f;
    }
    if (threadIdx.x < GDN_CHUNK) {
        const int i = threadIdx.x;
        const size_t idx = (size_t)(t0 + i) * hv + j;
        beta[i] = i < n ? gates[idx] : 0.f;
        gam[i] = i < n ? gates[(size_t)rows * hv + idx] : 0.f;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float acc = 0.f;  // the running sum in row order
        for (int i = 0; i < GDN_CHUNK; ++i) gam[i] = acc += gam[i];
    }
    __syncthreads();
    if (threadIdx.x < GDN_CHUNK) {
        const int i = threadIdx.x;
        egam[i] = expf(gam[i]);
        if (i < n) {
            float* dec = decay_out + ((size_t)(t0 + i) * hv + j) * 2;
            dec[0] = egam[i];
            dec[1] = expf(gam[n - 1] - gam[i]);
        }
    }

    // Both grams over the whole 64 × 64 square: thread (bi, bm) owns rows i = bi + 16r and
    // columns m = bm + 16c (r, c < 4), each sum over d in order, four d per float4 read.
    {
        const int bi = threadIdx.x / 16, bm = threadIdx.x % 16;
        float ak[4][4] = {}, aq[4][4] = {};
        for (int d = 0; d < dk; d += 4) {
            float4 km[4], ki[4], qi[4];
#pragma unroll
            for (int c = 0; c < 4; ++c) km[c] = *reinterpret_cast<const float4*>(K + (bm + 16 * c) * kst + d);
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                ki[r] = *reinterpret_cast<const float4*>(K + (bi + 16 * r) * kst + d);
                qi[r] = *reinterpret_cast<const float4*>(Q + (bi + 16 * r) * kst + d);
            }
#pragma unroll
            for (int r = 0; r < 4; ++r)
#pragma unroll
                for (int c = 0; c < 4; ++c) {
                    ak[r][c] = fmaf(ki[r].x, km[c].x, ak[r][c]);
                    ak[r][c] = fmaf(ki[r].y, km[c].y, ak[r][c]);
                    ak[r][c] = fmaf(ki[r].z, km[c].z, ak[r][c]);
                    ak[r][c] = fmaf(ki[r].w, km[c].w, ak[r][c]);
                    aq[r][c] = fmaf(qi[r].x, km[c].x, aq[r][c]);
                    aq[r][c] = fmaf(qi[r].y, km[c].y, aq[r][c]);
                    aq[r][c] = fmaf(qi[r].z, km[c].z, aq[r][c]);
                    aq[r][c] = fmaf(qi[r].w, km[c].w, aq[r][c]);
                }
        }
        // The decays only where they are kept: e^{γ_i−γ_m} overflows above the diagonal.
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const int i = bi + 16 * r;
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                const int m = bm + 16 * c;
                A[i * GDN_SQ_STRIDE + m] = m < i ? beta[i] * (ak[r][c] * expf(gam[i] - gam[m])) : 0.f;
                if (i < n) c_out[((size_t)(t0 + i) * hv + j) * GDN_CHUNK + m] = m <= i ? aq[r][c] * expf(gam[i] - gam[m]) : 0.f;
            }
        }
    }
    __syncthreads();

    // Forward substitution, one column per thread: W's Dk columns, then U's Dv. Column x solves
    // x_i = init_i − Σ_{m<i} A[i, m] x_m, the terms added in increasing m; the column lives in
    // registers (the loops unroll fully), A's rows are broadcast float4 reads.
    for (int col = threadIdx.x; col < dk + dv; col += GDN_THREADS) {
        const bool is_w = col < dk;
        const float* v_src = prep + row0 + (size_t)2 * key_heads * dk + (size_t)j * dv + (col - dk);
        float x[GDN_CHUNK];
#pragma unroll
        for (int i = 0; i < GDN_CHUNK; ++i) {
            float acc;
            if (is_w) {
                acc = beta[i] * egam[i] * K[i * kst + col];
            } else {
                acc = i < n ? beta[i] * __ldg(v_src + (size_t)i * channels) : 0.f;
            }
            const float* a_row = A + i * GDN_SQ_STRIDE;
#pragma unroll
            for (int m = 0; m + 4 <= i; m += 4) {
                const float4 a = *reinterpret_cast<const float4*>(a_row + m);
                acc = fmaf(-a.x, x[m], acc);
                acc = fmaf(-a.y, x[m + 1], acc);
                acc = fmaf(-a.z, x[m + 2], acc);
                acc = fmaf(-a.w, x[m + 3], acc);
            }
#pragma unroll
            for (int m = i & ~3; m < i; ++m) acc = fmaf(-a_row[m], x[m], acc);
            x[i] = acc;
        }
        float* dst = is_w ? w_out + (size_t)j * dk + col : u_out + (size_t)j * dv + (col - dk);
        const size_t row_stride = (size_t)hv * (is_w ? dk : dv);
#pragma unroll
        for (int i = 0; i < GDN_CHUNK; ++i)
            if (i < n) dst[(size_t)(t0 + i) * row_stride] = x[i];
    }
}

// acc[r] = Σ_d X[g + 16r, d] · Sᵀ[c, d] (r < 4), each sum over d in order, four d per float4
// read; rows past a short chunk's end read stale values, and their sums are never used.
__device__ __forceinline__ void gdn_rows_times_state(const float* X, const float* st_col, int dk, int kst, int g,
                                                     float (&acc)[4]) {
#pragma unroll
    for (int r = 0; r < 4; ++r) acc[r] = 0.f;
#pragma unroll 2
    for (int d = 0; d < dk; d += 4) {
        const float4 st = *reinterpret_cast<const float4*>(st_col + d);
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const float4 x = *reinterpret_cast<const float4*>(X + (g + 16 * r) * kst + d);
            acc[r] = fmaf(x.x, st.x, acc[r]);
            acc[r] = fmaf(x.y, st.y, acc[r]);
            acc[r] = fmaf(x.z, st.z, acc[r]);
            acc[r] = fmaf(x.w, st.w, acc[r]);
        }
    }
}

// s[e] += k[e] · x for the eight state rows a thread of the scan holds (k: a key row at them).
__device__ __forceinline__ void gdn_state_rows_add(const float* k, float x, float (&s)[8]) {
    const float4 ka = *reinterpret_cast<const float4*>(k);
    const float4 kb = *reinterpret_cast<const float4*>(k + 4);
    s[0] = fmaf(ka.x, x, s[0]);
    s[1] = fmaf(ka.y, x, s[1]);
    s[2] = fmaf(ka.z, x, s[2]);
    s[3] = fmaf(ka.w, x, s[3]);
    s[4] = fmaf(kb.x, x, s[4]);
    s[5] = fmaf(kb.y, x, s[5]);
    s[6] = fmaf(kb.z, x, s[6]);
    s[7] = fmaf(kb.w, x, s[7]);
}

// Grid (Hv, ceil(Dv / GDN_SCAN_BV), sequences), 256 threads: one CTA per value head and
// GDN_SCAN_BV value columns of one sequence (the delta rule never mixes value columns), walking
// the sequence's chunks in order with the state tile in registers and, transposed, in shared
// memory. Thread (c = t % 16, g = t / 16) owns value column c: output rows i = g + 16r (r < 4)
// and state rows d = 8g .. 8g + 7. Rows of a short last chunk past n are never read.
// Dynamic shared memory (floats), kst = Dk + 4:
//   Sᵀ [16][kst] | X [64][kst] (W, then Q, then K) | C [64][68] | V_newᵀ [16][68] | (e^{γ_n−γ} ⊙ V_new)ᵀ [16][68]
//   | e^γ, e^{γ_n−γ} [64 each]
// Requires Dk ≤ 128 and Dk % 4 == 0.
extern "C" __global__ void __launch_bounds__(GDN_THREADS, 2)
    gdn_chunk_scan(const float* __restrict__ prep, const float* __restrict__ w_in, const float* __restrict__ u_in,
                   const float* __restrict__ c_in, const float* __restrict__ decay_in, float* __restrict__ state,
                   float* __restrict__ out, int rows, int key_heads, int value_heads, int key_dim, int value_dim,
                   const unsigned long long* __restrict__ states, const int* __restrict__ seq_starts) {
    static_assert(GDN_SCAN_BV == 16 && GDN_THREADS == 256 && GDN_MAX_DK <= 128, "thread (c, g) covers 16 columns × 64 rows");
    pdl_begin();
    extern __shared__ __align__(16) float smem[];
    const int dk = key_dim, dv = value_dim, kst = key_dim + GDN_ROW_PAD, hv = value_heads;
    const int j = blockIdx.x, kh = j / (value_heads / key_heads);
    const int c = threadIdx.x % GDN_SCAN_BV, g = threadIdx.x / GDN_SCAN_BV;
    const int v0 = blockIdx.y * GDN_SCAN_BV, v = v0 + c, v_cols = min(GDN_SCAN_BV, dv - v0);
    const bool v_ok = c < v_cols;
    const int channels = 2 * key_heads * dk + value_heads * dv;

    float* ST = smem;
    float* X = ST + GDN_SCAN_BV * kst;
    float* C = X + GDN_CHUNK * kst;
    float* VN = C + GDN_CHUNK * GDN_SQ_STRIDE;
    float* VD = VN + GDN_SCAN_BV * GDN_SQ_STRIDE;
    float* egam = VD + GDN_SCAN_BV * GDN_SQ_STRIDE;
    float* fdec = egam + GDN_CHUNK;

    int t_begin, t_end;
    gdn_sequence_rows(seq_starts, rows, blockIdx.z, t_begin, t_end);
    if (states) state = reinterpret_cast<float*>(states[blockIdx.z]);
    float* s_global = state + (size_t)j * dk * dv;
    const int d0 = 8 * g;  // this thread's state rows d0 .. d0 + 7 (those < dk)
    float s[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) {
        s[e] = d0 + e < dk && v_ok ? s_global[(size_t)(d0 + e) * dv + v] : 0.f;
        if (d0 + e < dk) ST[c * kst + d0 + e] = s[e];
    }

    const float* q_in = prep + (size_t)kh * dk;
    const float* k_in = prep + (size_t)(key_heads + kh) * dk;
    for (int t0 = t_begin; t0 < t_end; t0 += GDN_CHUNK) {
        const int n = min(GDN_CHUNK, t_end - t0);
        const size_t head_row0 = (size_t)t0 * hv + j;  // (row t0, head j) of the scratch
        for (int e = threadIdx.x; e < n * (dk / 4); e += GDN_THREADS) {
            const int i = e / (dk / 4), q = e % (dk / 4);
            *reinterpret_cast<float4*>(X + i * kst + 4 * q) =
                __ldg(reinterpret_cast<const float4*>(w_in + (head_row0 + (size_t)i * hv) * dk) + q);
        }
        for (int e = threadIdx.x; e < n * (GDN_CHUNK / 4); e += GDN_THREADS) {
            const int i = e / (GDN_CHUNK / 4), q = e % (GDN_CHUNK / 4);
            *reinterpret_cast<float4*>(C + i * GDN_SQ_STRIDE + 4 * q) =
                __ldg(reinterpret_cast<const float4*>(c_in + (head_row0 + (size_t)i * hv) * GDN_CHUNK) + q);
        }
        for (int e = threadIdx.x; e < n * GDN_SCAN_BV; e += GDN_THREADS) {
            const int i = e / GDN_SCAN_BV, cc = e % GDN_SCAN_BV;
            VN[cc * GDN_SQ_STRIDE + i] = cc < v_cols ? __ldg(u_in + (head_row0 + (size_t)i * hv) * dv + v0 + cc) : 0.f;
        }
        if (threadIdx.x < n) {
            const float* dec = decay_in + (head_row0 + (size_t)threadIdx.x * hv) * 2;
            egam[threadIdx.x] = dec[0];
            fdec[threadIdx.x] = dec[1];
        }
        __syncthreads();

        // V_new = U − W S (each sum over d in order), and its rows scaled by e^{γ_n−γ_i}.
        {
            float acc[4];
            gdn_rows_times_state(X, ST + c * kst, dk, kst, g, acc);
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                const int i = g + 16 * r;
                if (i < n) {
                    const float vn = VN[c * GDN_SQ_STRIDE + i] - acc[r];
                    VN[c * GDN_SQ_STRIDE + i] = vn;
                    VD[c * GDN_SQ_STRIDE + i] = fdec[i] * vn;
                }
            }
        }
        __syncthreads();
        gdn_load_tile(q_in + (size_t)t0 * channels, channels, n, dk, [&](int i, int d, float x) { X[i * kst + d] = x; });
        __syncthreads();

        // O_i = e^{γ_i} q_iᵀ S + Σ_{m≤i} C[i, m] V_new[m], with S the chunk-start state.
        {
            float acc[4];
            gdn_rows_times_state(X, ST + c * kst, dk, kst, g, acc);
            const float* vn_col = VN + c * GDN_SQ_STRIDE;
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                const int i = g + 16 * r;
                if (i >= n) continue;
                float o = acc[r] * egam[i];
                const float* c_row = C + i * GDN_SQ_STRIDE;
                int m = 0;
                for (; m + 4 <= i + 1; m += 4) {
                    const float4 cm = *reinterpret_cast<const float4*>(c_row + m);
                    const float4 vm = *reinterpret_cast<const float4*>(vn_col + m);
                    o = fmaf(cm.x, vm.x, o);
                    o = fmaf(cm.y, vm.y, o);
                    o = fmaf(cm.z, vm.z, o);
                    o = fmaf(cm.w, vm.w, o);
                }
                for (; m <= i; ++m) o = fmaf(c_row[m], vn_col[m], o);
                if (v_ok) out[((size_t)(t0 + i) * hv + j) * dv + v] = o;
            }
        }
        __syncthreads();
        gdn_load_tile(k_in + (size_t)t0 * channels, channels, n, dk, [&](int i, int d, float x) { X[i * kst + d] = x; });
        __syncthreads();

        // S ← e^{γ_n} S + Σ_{i<n} k_i (e^{γ_n−γ_i} V_new[i])ᵀ, the terms added in increasing i.
        {
            const float e_last = egam[n - 1];
            const float* vd_col = VD + c * GDN_SQ_STRIDE;
#pragma unroll
            for (int e = 0; e < 8; ++e) s[e] *= e_last;
            if (d0 < dk) {
                int i = 0;
                for (; i + 4 <= n; i += 4) {
                    const float4 vd = *reinterpret_cast<const float4*>(vd_col + i);
                    gdn_state_rows_add(X + i * kst + d0, vd.x, s);
                    gdn_state_rows_add(X + (i + 1) * kst + d0, vd.y, s);
                    gdn_state_rows_add(X + (i + 2) * kst + d0, vd.z, s);
                    gdn_state_rows_add(X + (i + 3) * kst + d0, vd.w, s);
                }
                for (; i < n; ++i) gdn_state_rows_add(X + i * kst + d0, vd_col[i], s);
#pragma unroll
                for (int e = 0; e < 8; ++e)
                    if (d0 + e < dk) ST[c * kst + d0 + e] = s[e];
            }
        }
        __syncthreads();
    }

#pragma unroll
    for (int e = 0; e < 8; ++e)
        if (d0 + e < dk && v_ok) s_global[(size_t)(d0 + e) * dv + v] = s[e];
}

// Recurrent decode core (`backbone.md` §3.4): rows one after another, each
//   S ← e^g S;  u = Sᵀk;  δ = β(v − u);  S ← S + k δᵀ;  o = Sᵀq.
// Grid (Hv, ceil(Dv/32)), 256 threads; the state tile [Dk][32] lives in registers: warp w holds
// rows d = w, w+8, … (at most 16), lane its value column. The Dk-sums are per-warp partials
// combined through shared memory. Requires Dk ≤ 128 and Hv % Hk == 0.
// The decode batch (`states` given): grid.z = sequences of one row each; sequence z runs row z
// (of `rows` = the batch) over its own state states[z].
extern "C" __global__ void __launch_bounds__(GDN_THREADS)
    gdn_recurrent_core(const float* __restrict__ prep, const float* __restrict__ gates, float* state,
                       float* __restrict__ out, int rows, int key_heads, int value_heads, int key_dim, int value_dim,
                       const unsigned long long* states) {
    pdl_begin();
    __shared__ float kq[2][GDN_MAX_DK];
    __shared__ float part[2][GDN_WARPS][32];
    const int dk = key_dim, dv = value_dim;
    const int j = blockIdx.x, kh = j / (value_heads / key_heads);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int v = blockIdx.y * GDN_BV + lane;
    const bool v_ok = v < dv;
    const int channels = 2 * key_heads * dk + value_heads * dv;

    if (states) state = reinterpret_cast<float*>(states[blockIdx.z]);
    const int t_begin = states ? blockIdx.z : 0, t_end = states ? blockIdx.z + 1 : rows;
    float* s_global = state + (size_t)j * dk * dv;
    float s[GDN_ROWS_PER_WARP];
#pragma unroll
    for (int r = 0; r < GDN_ROWS_PER_WARP; ++r) {
        const int d = warp + GDN_WARPS * r;
        s[r] = d < dk && v_ok ? s_global[(size_t)d * dv + v] : 0.f;
    }

    for (int t = t_begin; t < t_end; ++t) {
        const float* row = prep + (size_t)t * channels;
        for (int d = threadIdx.x; d < dk; d += blockDim.x) {
            kq[0][d] = row[(size_t)(key_heads + kh) * dk + d];
            kq[1][d] = row[(size_t)kh * dk + d];
        }
        const float vt = v_ok ? row[(size_t)2 * key_heads * dk + (size_t)j * dv + v] : 0.f;
        const float b = gates[(size_t)t * value_heads + j];
        const float decay = expf(gates[((size_t)rows + t) * value_heads + j]);
        __syncthreads();

        float u = 0.f;
#pragma unroll
        for (int r = 0; r < GDN_ROWS_PER_WARP; ++r) {
            const int d = warp + GDN_WARPS * r;
            if (d < dk) {
                s[r] *= decay;
                u = fmaf(s[r], kq[0][d], u);
            }
        }
        part[0][warp][lane] = u;
        __syncthreads();
        float u_all = 0.f;
#pragma unroll
        for (int w = 0; w < GDN_WARPS; ++w) u_all += part[0][w][lane];
        const float delta = b * (vt - u_all);

        float o = 0.f;
#pragma unroll
        for (int r = 0; r < GDN_ROWS_PER_WARP; ++r) {
            const int d = warp + GDN_WARPS * r;
            if (d < dk) {
                s[r] = fmaf(kq[0][d], delta, s[r]);
                o = fmaf(s[r], kq[1][d], o);
            }
        }
        part[1][warp][lane] = o;
        __syncthreads();
        // Every read of kq and part[0] for this row is done by now (kq is rewritten right after
        // this barrier); warp 0's read of part[1] precedes the next row's first barrier, and
        // part[1] is rewritten only after the next row's second.
        if (warp == 0 && v_ok) {
            float o_all = 0.f;
#pragma unroll
            for (int w = 0; w < GDN_WARPS; ++w) o_all += part[1][w][lane];
            out[((size_t)t * value_heads + j) * dv + v] = o_all;
        }
    }

#pragma unroll
    for (int r = 0; r < GDN_ROWS_PER_WARP; ++r) {
        const int d = warp + GDN_WARPS * r;
        if (d < dk && v_ok) s_global[(size_t)d * dv + v] = s[r];
    }
}

// Gated RMSNorm of each value head (`backbone.md` §3.5, norm before gate, plain gain):
//   y = bf16(o · rsqrt(mean(o²) + eps) · w · SiLU(z)).
// One warp per (row, value head) pair: grid ceil(pairs / 8), 256 threads. o: [pairs, Dv] f32;
// z, y: [pairs, Dv] bf16 (row-major [rows, Hv·Dv]); w: [Dv] f32.
extern "C" __global__ void gdn_gated_norm(const float* __restrict__ o, const bf16* __restrict__ z,
                                          const float* __restrict__ w, bf16* __restrict__ y, int pairs, int dv,
                                          float eps) {
    pdl_begin();
    const int lane = threadIdx.x & 31;
    const int pair = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (pair >= pairs) return;  // whole warps leave; no block barrier follows
    const float* op = o + (size_t)pair * dv;
    const bf16* zp = z + (size_t)pair * dv;
    bf16* yp = y + (size_t)pair * dv;
    float ss = 0.f;
    for (int c = lane; c < dv; c += 32) ss = fmaf(op[c], op[c], ss);
    const float inv = rsqrtf(warp_sum(ss) / dv + eps);
    for (int c = lane; c < dv; c += 32) yp[c] = to_bf16(op[c] * inv * w[c] * siluf_(to_f32(zp[c])));
}
