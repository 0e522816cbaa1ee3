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
// shorter), GDN_BV (value columns per CTA of the cores: one per lane) and GDN_MAX_DK (the
// largest key dim the cores support): src/backend/cuda/kernel_constants.rs.
#include "kernel_constants.cuh"

#define GDN_WARPS (GDN_THREADS / 32)
// Rows of S a warp holds.
#define GDN_ROWS_PER_WARP (GDN_MAX_DK / GDN_WARPS)
#define GDN_CHUNK_ROWS_PER_WARP (GDN_CHUNK / GDN_WARPS)
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

// Element (row, col) of a chunk matrix with row stride ks (a multiple of 32 floats). Its 16-byte
// chunks are XOR-swizzled by the row (chunk q of row r sits at q ^ (r & 7)), so that a float4
// read of one row's chunk across lanes (lane = chunk), and of one chunk across eight consecutive
// rows (lane = row, a quarter-warp per phase), hit distinct banks.
__device__ __forceinline__ int gdn_swz(int row, int col, int ks) {
    return row * ks + ((((col >> 2) ^ (row & 7)) << 2) | (col & 3));
}
// The float4 of chunk q (columns 4q..4q+3) of a row at `row_base` (= a row start of the matrix).
__device__ __forceinline__ float4 gdn_chunk4(const float* row_base, int row, int q) {
    return *reinterpret_cast<const float4*>(row_base + ((q ^ (row & 7)) << 2));
}

// Lower triangle (diagonal included) of a GDN_CHUNK × GDN_CHUNK matrix, each row's start padded to
// a multiple of 4 floats so that a row reads as float4s: row i = 4q + s starts at 4(q+1)(2q+s)
// (rows before it hold 4·ceil((j+1)/4) floats each).
__device__ __forceinline__ int gdn_tri(int i) {
    const int q = i >> 2, s = i & 3;
    return 4 * (q + 1) * (2 * q + s);
}
#define GDN_TRI_SIZE (4 * (GDN_CHUNK / 4 + 1) * (GDN_CHUNK / 2))

// A compile-time count of chunk rows per warp: warp w holds rows w, w+8, …, so R = ceil(n / 8)
// slots cover a chunk of n rows. The chunk products below run R slots, not GDN_CHUNK_ROWS_PER_WARP:
// a short chunk (the tail of a prompt, or a short prompt) issues only the work its rows need. Each
// output is still summed over d in order, so R changes no bit.
template <int N>
struct GdnRows {
    static constexpr int value = N;
};

// Calls f(GdnRows<R>{}) with R = ceil(n / GDN_WARPS) (1 ≤ n ≤ GDN_CHUNK).
template <typename F>
__device__ __forceinline__ void gdn_by_rows(int n, F&& f) {
    static_assert(GDN_CHUNK_ROWS_PER_WARP == 8, "one case per slot count");
    switch ((n + GDN_WARPS - 1) / GDN_WARPS) {
        case 1: f(GdnRows<1>{}); break;
        case 2: f(GdnRows<2>{}); break;
        case 3: f(GdnRows<3>{}); break;
        case 4: f(GdnRows<4>{}); break;
        case 5: f(GdnRows<5>{}); break;
        case 6: f(GdnRows<6>{}); break;
        case 7: f(GdnRows<7>{}); break;
        default: f(GdnRows<8>{}); break;
    }
}

// Why the chunk products read float4s (issue 14): ncu on the 200-row prefill at the real shape
// (docs/perf/2026-12-04-one-stream.md, run 9) found the core issue-bound at one CTA of 8 warps per
// SM, 35 k warp instructions per warp per chunk, integer address arithmetic the busiest pipe: a
// scalar shared load and its swizzled address for every FMA. Each product below reads four
// consecutive d (or m) per load and sums them into each output in the same increasing order as
// the scalar loops it replaces, so every output keeps its bits. Rows past n hold stale values;
// they are read but their results are never stored.

// The lower triangle of X Kᵀ over one chunk (n rows, both swizzled [GDN_CHUNK, ks]) into `tri_out`,
// each entry scaled by e^{γ_i − γ_m} and, when `beta` is given, by β_i. kDiag includes m = i.
// Warp w owns rows i = w, w+8, … (R slots); lane l owns columns m = l and, when R > 4 (n > 32),
// l+32. Per four d: a broadcast float4 of each X row, a float4 of each K row. dk % 4 == 0.
template <bool kDiag, int R>
__device__ __forceinline__ void gdn_chunk_gram(const float* X, const float* K, const float* gam, const float* beta,
                                               float* tri_out, int n, int dk, int ks) {
    constexpr int H = R > 4 ? 2 : 1;  // column halves that can hold m < n
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float acc[R][H];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int h = 0; h < H; ++h) acc[r][h] = 0.f;
    for (int q = 0; q < dk / 4; ++q) {
        float4 k[H];
#pragma unroll
        for (int h = 0; h < H; ++h) k[h] = gdn_chunk4(K + (lane + 32 * h) * ks, lane + 32 * h, q);
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const int i = warp + GDN_WARPS * r;
            const float4 x = gdn_chunk4(X + i * ks, i, q);
#pragma unroll
            for (int h = 0; h < H; ++h) {
                acc[r][h] = fmaf(x.x, k[h].x, acc[r][h]);
                acc[r][h] = fmaf(x.y, k[h].y, acc[r][h]);
                acc[r][h] = fmaf(x.z, k[h].z, acc[r][h]);
                acc[r][h] = fmaf(x.w, k[h].w, acc[r][h]);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const int i = warp + GDN_WARPS * r;
#pragma unroll
        for (int h = 0; h < H; ++h) {
            const int m = lane + 32 * h;
            if (i < n && (kDiag ? m <= i : m < i)) {
                const float decayed = acc[r][h] * expf(gam[i] - gam[m]);
                tri_out[gdn_tri(i) + m] = beta ? beta[i] * decayed : decayed;
            }
        }
    }
}

// acc[r] = Σ_d X[i, d] · S[d, lane] over d in order, for the warp's rows i = warp + 8r
// (r < R; slots past R are left as they are). Per four d: a broadcast float4 of each X row and
// four state loads. dk % 4 == 0.
template <int R>
__device__ __forceinline__ void gdn_rows_times_state(const float* X, const float* S, int dk, int ks,
                                                     float (&acc)[GDN_CHUNK_ROWS_PER_WARP]) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int q = 0; q < dk / 4; ++q) {
        const float* s_rows = S + 4 * q * GDN_BV + lane;
        const float s0 = s_rows[0], s1 = s_rows[GDN_BV], s2 = s_rows[2 * GDN_BV], s3 = s_rows[3 * GDN_BV];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const int i = warp + GDN_WARPS * r;
            const float4 x = gdn_chunk4(X + i * ks, i, q);
            acc[r] = fmaf(x.x, s0, acc[r]);
            acc[r] = fmaf(x.y, s1, acc[r]);
            acc[r] = fmaf(x.z, s2, acc[r]);
            acc[r] = fmaf(x.w, s3, acc[r]);
        }
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

// Forward substitution of four columns of one chunk matrix M (row stride `stride` floats, the
// columns' float4 at `at(row)`): for i in order, M[i] ← init(i) − Σ_{m<i} A[i, m] · M[m], each
// column's terms added in increasing m (as the scalar loop `x = fmaf(−a, M[m][c], x)` adds them).
template <typename At, typename Init>
__device__ __forceinline__ void gdn_substitute4(const float* A, int n, At at, Init init) {
    for (int i = 0; i < n; ++i) {
        float4 x = init(i);
        const float* a_row = A + gdn_tri(i);
        int m = 0;
        for (; m + 4 <= i; m += 4) {
            const float4 a = *reinterpret_cast<const float4*>(a_row + m);
            const float4 c0 = at(m), c1 = at(m + 1), c2 = at(m + 2), c3 = at(m + 3);
            x.x = fmaf(-a.x, c0.x, x.x), x.y = fmaf(-a.x, c0.y, x.y), x.z = fmaf(-a.x, c0.z, x.z), x.w = fmaf(-a.x, c0.w, x.w);
            x.x = fmaf(-a.y, c1.x, x.x), x.y = fmaf(-a.y, c1.y, x.y), x.z = fmaf(-a.y, c1.z, x.z), x.w = fmaf(-a.y, c1.w, x.w);
            x.x = fmaf(-a.z, c2.x, x.x), x.y = fmaf(-a.z, c2.y, x.y), x.z = fmaf(-a.z, c2.z, x.z), x.w = fmaf(-a.z, c2.w, x.w);
            x.x = fmaf(-a.w, c3.x, x.x), x.y = fmaf(-a.w, c3.y, x.y), x.z = fmaf(-a.w, c3.z, x.z), x.w = fmaf(-a.w, c3.w, x.w);
        }
        for (; m < i; ++m) {
            const float a = a_row[m];
            const float4 c = at(m);
            x.x = fmaf(-a, c.x, x.x), x.y = fmaf(-a, c.y, x.y), x.z = fmaf(-a, c.z, x.z), x.w = fmaf(-a, c.w, x.w);
        }
        at(i) = x;
    }
}

// Chunked prefill core (`backbone.md` §3.7): for each 64-token chunk, with γ the cumulative
// log-decay from the chunk start,
//   A = strict lower β_i (k_i·k_m) e^{γ_i−γ_m};  U = (I+A)⁻¹ diag(β) V;  W = (I+A)⁻¹ diag(β) (K ⊙ e^γ)
//   V_new = U − W S;  O = (Q ⊙ e^γ) S + [(Q Kᵀ) ⊙ e^{γ_i−γ_m}]_{m≤i} V_new;  S ← e^{γ_n} S + (K ⊙ e^{γ_n−γ})ᵀ V_new.
// (I+A)⁻¹ is applied by forward substitution of U and W column by column, as the CPU does.
//
// Grid (Hv, ceil(Dv/32), sequences), 256 threads: one CTA per value head and 32 value columns of
// one sequence (the delta rule never mixes value columns, so each column tile runs the recurrence
// on its own); the CTA walks its sequence's chunks in order with its state tile in shared memory.
// The prompts of several streams run in one launch (grid.z), which fills the GPU where one
// prompt's Hv·Dv/32 CTAs do not. Requires Dk ≤ 128, Dk % 4 == 0 and Hv % Hk == 0.
// Dynamic shared memory (floats), ks = Dk rounded up to 32:
//   S [Dk][32] | K [64][ks] | QW [64][ks] (W, later the chunk's Q) | U [64][32] (βV → U → V_new)
//   | A [GDN_TRI_SIZE] (A, later the decayed Q Kᵀ) | γ, β, e^γ, e^{γ_n−γ} [64 each]
// Two CTAs per SM (≤ 128 registers): several prompts' heads share a launch (grid.z).
extern "C" __global__ void __launch_bounds__(GDN_THREADS, 2)
    gdn_chunk_core(const float* __restrict__ prep, const float* __restrict__ gates, float* __restrict__ state,
                   float* __restrict__ out, int rows, int key_heads, int value_heads, int key_dim, int value_dim,
                   const unsigned long long* __restrict__ states, const int* __restrict__ seq_starts) {
    pdl_begin();
    extern __shared__ __align__(16) float smem[];
    const int dk = key_dim, dv = value_dim, ks = (key_dim + 31) & ~31;
    const int j = blockIdx.x, kh = j / (value_heads / key_heads);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int v = blockIdx.y * GDN_BV + lane;
    const bool v_ok = v < dv;
    const int channels = 2 * key_heads * dk + value_heads * dv;

    float* S = smem;
    float* K = S + dk * GDN_BV;
    float* QW = K + GDN_CHUNK * ks;
    float* U = QW + GDN_CHUNK * ks;
    float* A = U + GDN_CHUNK * GDN_BV;
    float* gam = A + GDN_TRI_SIZE;
    float* beta = gam + GDN_CHUNK;
    float* egam = beta + GDN_CHUNK;
    float* fdec = egam + GDN_CHUNK;

    // Several sequences (`states` given): grid.z = sequences, sequence z's rows seq_starts[z]..
    // seq_starts[z + 1] (of `rows` in all) continuing the state at states[z]; chunks start at the
    // sequence's first row, so each sequence is computed exactly as it is alone.
    int t_begin = 0, t_end = rows;
    if (states) {
        state = reinterpret_cast<float*>(states[blockIdx.z]);
        t_begin = seq_starts[blockIdx.z];
        t_end = seq_starts[blockIdx.z + 1];
    }
    float* s_global = state + (size_t)j * dk * dv;
    for (int d = warp; d < dk; d += GDN_WARPS) S[d * GDN_BV + lane] = v_ok ? s_global[(size_t)d * dv + v] : 0.f;

    const float* q_in = prep + (size_t)kh * dk;
    const float* k_in = prep + (size_t)(key_heads + kh) * dk;
    const float* v_in = prep + (size_t)2 * key_heads * dk + (size_t)j * dv;
    const float* g_in = gates + (size_t)rows * value_heads;

    for (int t0 = t_begin; t0 < t_end; t0 += GDN_CHUNK) {
        const int n = min(GDN_CHUNK, t_end - t0);
        const size_t row0 = (size_t)t0 * channels;
        gdn_load_tile(k_in + row0, channels, n, dk, [&](int i, int d, float x) { K[gdn_swz(i, d, ks)] = x; });
        // The tile's value columns; those past dv (a last, partial tile) are zeros.
        const int v_cols = min(GDN_BV, dv - (int)blockIdx.y * GDN_BV);
        gdn_load_tile(v_in + row0 + blockIdx.y * GDN_BV, channels, n, v_cols,
                      [&](int i, int c, float x) { U[i * GDN_BV + c] = x; });
        if (v_cols < GDN_BV)
            for (int i = warp; i < n; i += GDN_WARPS)
                if (lane >= v_cols) U[i * GDN_BV + lane] = 0.f;
        if (threadIdx.x < n) {
            const size_t idx = (size_t)(t0 + threadIdx.x) * value_heads + j;
            beta[threadIdx.x] = gates[idx];
            gam[threadIdx.x] = g_in[idx];
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            // The running sum in row order, eight loads issued ahead of their adds (the same
            // adds as the plain loop).
            float acc = 0.f;
            for (int i0 = 0; i0 < n; i0 += 8) {
                float g[8];
#pragma unroll
                for (int u = 0; u < 8; ++u) g[u] = i0 + u < n ? gam[i0 + u] : 0.f;
#pragma unroll
                for (int u = 0; u < 8; ++u)
                    if (i0 + u < n) gam[i0 + u] = acc += g[u];
            }
        }
        __syncthreads();
        if (threadIdx.x < n) {
            egam[threadIdx.x] = expf(gam[threadIdx.x]);
            fdec[threadIdx.x] = expf(gam[n - 1] - gam[threadIdx.x]);
        }
        gdn_by_rows(n, [&](auto rows) { gdn_chunk_gram<false, decltype(rows)::value>(K, K, gam, beta, A, n, dk, ks); });
        __syncthreads();

        // Forward substitution: thread t < dk/4 owns W's columns 4t..4t+3, the next 8 threads U's
        // 32 columns four each; a column depends only on itself.
        {
            const int t = threadIdx.x, wq = dk / 4;
            if (t < wq) {
                gdn_substitute4(
                    A, n, [&](int m) -> float4& { return *reinterpret_cast<float4*>(QW + m * ks + ((t ^ (m & 7)) << 2)); },
                    [&](int i) {
                        const float be = beta[i] * egam[i];
                        const float4 k = gdn_chunk4(K + i * ks, i, t);
                        return make_float4(be * k.x, be * k.y, be * k.z, be * k.w);
                    });
            } else if (t < wq + GDN_BV / 4) {
                const int u = t - wq;
                gdn_substitute4(
                    A, n, [&](int m) -> float4& { return *reinterpret_cast<float4*>(U + m * GDN_BV + 4 * u); },
                    [&](int i) {
                        const float b = beta[i];
                        const float4 x = *reinterpret_cast<const float4*>(U + i * GDN_BV + 4 * u);
                        return make_float4(b * x.x, b * x.y, b * x.z, b * x.w);
                    });
            }
        }
        __syncthreads();

        // V_new = U − W S: warp w owns rows w, w+8, …, lane its value column.
        {
            float acc[GDN_CHUNK_ROWS_PER_WARP] = {};
            gdn_by_rows(n, [&](auto rows) { gdn_rows_times_state<decltype(rows)::value>(QW, S, dk, ks, acc); });
#pragma unroll
            for (int r = 0; r < GDN_CHUNK_ROWS_PER_WARP; ++r) {
                const int i = warp + GDN_WARPS * r;
                if (i < n) U[i * GDN_BV + lane] -= acc[r];
            }
        }
        __syncthreads();

        gdn_load_tile(q_in + row0, channels, n, dk, [&](int i, int d, float x) { QW[gdn_swz(i, d, ks)] = x; });
        __syncthreads();
        gdn_by_rows(n, [&](auto rows) { gdn_chunk_gram<true, decltype(rows)::value>(QW, K, gam, nullptr, A, n, dk, ks); });
        __syncthreads();

        // O_i = e^{γ_i} q_iᵀ S + Σ_{m≤i} (q_i·k_m) e^{γ_i−γ_m} V_new[m], with S the chunk-start state.
        {
            float acc[GDN_CHUNK_ROWS_PER_WARP] = {};
            gdn_by_rows(n, [&](auto rows) { gdn_rows_times_state<decltype(rows)::value>(QW, S, dk, ks, acc); });
#pragma unroll
            for (int r = 0; r < GDN_CHUNK_ROWS_PER_WARP; ++r) {
                const int i = warp + GDN_WARPS * r;
                if (i >= n) continue;
                float o = acc[r] * egam[i];
                const float* c_row = A + gdn_tri(i);
                int m = 0;
                for (; m + 4 <= i + 1; m += 4) {
                    const float4 c = *reinterpret_cast<const float4*>(c_row + m);
                    o = fmaf(c.x, U[m * GDN_BV + lane], o);
                    o = fmaf(c.y, U[(m + 1) * GDN_BV + lane], o);
                    o = fmaf(c.z, U[(m + 2) * GDN_BV + lane], o);
                    o = fmaf(c.w, U[(m + 3) * GDN_BV + lane], o);
                }
                for (; m <= i; ++m) o = fmaf(c_row[m], U[m * GDN_BV + lane], o);
                if (v_ok) out[((size_t)(t0 + i) * value_heads + j) * dv + v] = o;
            }
        }
        __syncthreads();

        // S ← e^{γ_n} S + Σ_i e^{γ_n−γ_i} k_i V_new[i]ᵀ: warp w owns the 16 consecutive rows
        // d = 16w.. of the tile (four float4 chunks of each k_i, read as broadcasts).
        {
            static_assert(GDN_ROWS_PER_WARP == 16, "four chunks of k per warp");
            float s[GDN_ROWS_PER_WARP];
            const float e_last = egam[n - 1];
            const int d0 = warp * GDN_ROWS_PER_WARP;
#pragma unroll
            for (int r = 0; r < GDN_ROWS_PER_WARP; ++r) {
                const int d = d0 + r;
                s[r] = d < dk ? S[d * GDN_BV + lane] * e_last : 0.f;
            }
            if (d0 < dk) {
                for (int i = 0; i < n; ++i) {
                    const float u = U[i * GDN_BV + lane], f = fdec[i];
#pragma unroll
                    for (int c = 0; c < 4; ++c) {
                        const float4 k = gdn_chunk4(K + i * ks, i, d0 / 4 + c);
                        s[4 * c] = fmaf(f * k.x, u, s[4 * c]);
                        s[4 * c + 1] = fmaf(f * k.y, u, s[4 * c + 1]);
                        s[4 * c + 2] = fmaf(f * k.z, u, s[4 * c + 2]);
                        s[4 * c + 3] = fmaf(f * k.w, u, s[4 * c + 3]);
                    }
                }
            }
#pragma unroll
            for (int r = 0; r < GDN_ROWS_PER_WARP; ++r) {
                const int d = d0 + r;
                if (d < dk) S[d * GDN_BV + lane] = s[r];
            }
        }
        __syncthreads();
    }

    for (int d = warp; d < dk; d += GDN_WARPS)
        if (v_ok) s_global[(size_t)d * dv + v] = S[d * GDN_BV + lane];
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
