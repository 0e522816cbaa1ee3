// Gated DeltaNet mixer core (`backbone.md` §3): causal depthwise conv + SiLU with the carried conv
// state, q/k L2 norm and gates, the delta rule (64-token chunks for prefill, token recurrence for
// decode) and the gated RMSNorm of each value head. The projections around it are `linear.cu`.
//
// Numerics follow the CPU oracle (`src/backend/cpu/backbone/gdn.rs`, `gdn_chunk.rs`) step for
// step, in fp32: inputs are the bf16 projection outputs, everything between is fp32 (conv output,
// normalised q/k, gates, core output, recurrent state), and only the gated norm rounds to bf16.
//
// The chunked form (WY/UT transform of each 64-token chunk, then one read and one update of the
// chunk-start state) is in gdn_chunk.cuh (and its two kernels' files): the one of flash-linear-attention
// (github.com/fla-org/flash-linear-attention, MIT licence, `chunk_gated_delta_rule`), kept in fp32.
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
// bits do not depend on block_channels. qkv: [rows, C] bf16 projection; conv_state: [K−1, C] f32;
// conv_w: [C, 1, K] bf16, tap K−1 multiplies the current row; b, a: [rows, Hv] bf16; a_log,
// dt_bias: [Hv] f32.
// `prep` is written, then re-read by other threads of the block after the barrier (hence no
// __restrict__: its loads must see this block's stores).
// The decode batch (`states` given: one conv state per row): row t is its own sequence of one row,
// its history from states[t].
// Where every sequence has one row (the decode batch, or one sequence of one row: no row_seq, and
// `states` or rows == 1) the thread that reads a channel's window is the only one that reads it,
// so it also advances it (`advances_window`, the values gdn_conv_state_update would write): the
// decode step's launch fewer. Otherwise the window is read only, and gdn_conv_state_update
// advances it afterwards.
__device__ __forceinline__ bool advances_window(int rows, const unsigned long long* states, const int* row_seq) {
    return !row_seq && (states || rows == 1);
}

extern "C" __global__ void gdn_conv_prepare(const bf16* __restrict__ qkv, float* conv_state,
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
    if (states) conv_state = reinterpret_cast<float*>(states[seq]);
    const bool advance = advances_window(rows, states, row_seq);
    for (int c = c0 + threadIdx.x; c < c1; c += blockDim.x) {
        float acc = 0.f;
        for (int i = 0; i < kernel; ++i) {
            // Input row t − (K−1) + i; rows before this call come from the carried state.
            const int r = own - history + i;
            const float x = r >= 0 ? to_f32(seq_qkv[(size_t)r * channels + c])
                                   : conv_state[(size_t)(history + r) * channels + c];
            acc = fmaf(to_f32(conv_w[(size_t)c * kernel + i]), x, acc);
            // The window after this row: inputs 1..K−1 of this one (own = 0, as advance implies).
            if (advance && i > 0) conv_state[(size_t)(i - 1) * channels + c] = x;
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

// Conv state ← the last K−1 rows of [state; qkv] (run after gdn_conv_prepare, where it did not
// advance the window itself: `advances_window`). One thread per
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
// z, y: [pairs, Dv] bf16 (row-major [rows, Hv·Dv]); w: [Dv] f32. Lane l visits columns
// l, l + 32, … in that order; heads up to GDN_MAX_DK wide are read in one go (the gain, a weight,
// before waiting on the kernel before), wider ones column by column: the same bits.
#define GATED_NORM_REGS (GDN_MAX_DK / 32)
extern "C" __global__ void gdn_gated_norm(const float* __restrict__ o, const bf16* __restrict__ z,
                                          const float* __restrict__ w, bf16* __restrict__ y, int pairs, int dv,
                                          float eps) {
    const int lane = threadIdx.x & 31;
    const bool in_regs = dv <= GDN_MAX_DK;
    float g[GATED_NORM_REGS];
#pragma unroll
    for (int j = 0; j < GATED_NORM_REGS; ++j) g[j] = in_regs && lane + 32 * j < dv ? w[lane + 32 * j] : 0.f;
    pdl_begin();
    const int pair = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (pair >= pairs) return;  // whole warps leave; no block barrier follows
    const float* op = o + (size_t)pair * dv;
    const bf16* zp = z + (size_t)pair * dv;
    bf16* yp = y + (size_t)pair * dv;
    float ss = 0.f;
    if (in_regs) {
        float v[GATED_NORM_REGS], zv[GATED_NORM_REGS];
#pragma unroll
        for (int j = 0; j < GATED_NORM_REGS; ++j) {
            const int c = lane + 32 * j;
            v[j] = c < dv ? op[c] : 0.f;
            zv[j] = c < dv ? to_f32(zp[c]) : 0.f;
        }
#pragma unroll
        for (int j = 0; j < GATED_NORM_REGS; ++j)
            if (lane + 32 * j < dv) ss = fmaf(v[j], v[j], ss);
        const float inv = rsqrtf(warp_sum(ss) / dv + eps);
#pragma unroll
        for (int j = 0; j < GATED_NORM_REGS; ++j)
            if (lane + 32 * j < dv) yp[lane + 32 * j] = to_bf16(v[j] * inv * g[j] * siluf_(zv[j]));
        return;
    }
    for (int c = lane; c < dv; c += 32) ss = fmaf(op[c], op[c], ss);
    const float inv = rsqrtf(warp_sum(ss) / dv + eps);
    for (int c = lane; c < dv; c += 32) yp[c] = to_bf16(op[c] * inv * w[c] * siluf_(to_f32(zp[c])));
}
