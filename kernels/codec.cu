// The Fish modded-DAC decode path (`codec.md` §1–2) in FP16 as the reference runs it: f16
// weights and f16 activations between operations, f32 arithmetic inside each kernel.
//
// Exact streaming (`src/backend/codec.rs`): every output element is computed by the same
// sequence of f32 operations whatever the number of rows in a call and wherever the row falls in
// a tile. So: no cuBLAS (its algorithm depends on M); one GEMM whose per-output reduction runs in
// an order fixed by the weight's shape alone (see its section); attention visiting a query's keys
// from the oldest to the newest of its window, with the split of keys over lanes counted from the
// oldest key; row kernels whose reductions depend on the row's width only. Element-wise
// arithmetic uses the explicit `_rn` intrinsics so that the compiler never contracts it
// differently in the GEMM's instantiations.
#include "common.cuh"
#include "mma.cuh"
#include <cuda_fp16.h>

typedef __half f16;

__device__ __forceinline__ float h2f(f16 v) { return __half2float(v); }
// Round to nearest even, as torch's .to(float16).
__device__ __forceinline__ f16 f2h(float v) { return __float2half_rn(v); }
// The value an f16 activation would hold, back in f32.
__device__ __forceinline__ float round_h(float v) { return __half2float(__float2half_rn(v)); }

// Snake (`dac.nn.layers.snake`): x + (α + 1e-9)⁻¹ · sin²(α·x).
__device__ __forceinline__ float snake(float x, float alpha) {
    const float s = sinf(__fmul_rn(alpha, x));
    return __fadd_rn(x, __fmul_rn(__fdiv_rn(1.f, __fadd_rn(alpha, 1e-9f)), __fmul_rn(s, s)));
}

// GELU with the exact erf (nn.GELU()).
__device__ __forceinline__ float gelu(float x) {
    const float e = erff(__fmul_rn(x, 0.70710678118654752f));
    return __fmul_rn(__fmul_rn(0.5f, x), __fadd_rn(1.f, e));
}

__device__ __forceinline__ float silu(float x) { return __fdiv_rn(x, __fadd_rn(1.f, expf(-x))); }

// ---------------------------------------------------------------------------------------------
// RVQ lookup (`codec.md` §1.2). One thread per (frame, latent channel):
//   q_i = b_i + W_i · codebook_i[code_i]  (a fmaf chain over the codebook dim),
//   z = q_0 + (((q_1 + q_2) + …) + q_9), rounded once to f16.
// `books` holds three device addresses per codebook: raw codebook [size, dim], folded out_proj
// [latent, dim], bias [latent], all f16. `codes` is [frames, n_books], already clamped.
extern "C" __global__ void codec_rvq(const uint32_t* __restrict__ codes, const uint64_t* __restrict__ books,
                                     f16* __restrict__ z, int frames, int n_books, int latent, int dim) {
    const int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= frames * latent) return;
    const int t = idx / latent, o = idx - t * latent;
    float semantic = 0.f, residual = 0.f;
    for (int i = 0; i < n_books; ++i) {
        const f16* codebook = reinterpret_cast<const f16*>(books[3 * i]);
        const f16* proj = reinterpret_cast<const f16*>(books[3 * i + 1]);
        const f16* bias = reinterpret_cast<const f16*>(books[3 * i + 2]);
        const f16* entry = codebook + (size_t)codes[(size_t)t * n_books + i] * dim;
        float q = 0.f;
        for (int e = 0; e < dim; ++e) q = __fmaf_rn(h2f(proj[(size_t)o * dim + e]), h2f(entry[e]), q);
        q = __fadd_rn(q, h2f(bias[o]));
        if (i == 0) semantic = q;
        else residual = i == 1 ? q : __fadd_rn(residual, q);
    }
    z[idx] = f2h(__fadd_rn(semantic, residual));
}

// ---------------------------------------------------------------------------------------------
// RMSNorm of the codec transformers: y = f16(x · rsqrt(mean(x²) + eps)) · w, one block per row
// (the reference rounds the normalised row to the activation dtype before the gain).
extern "C" __global__ void codec_rms_norm(const f16* __restrict__ x, const f16* __restrict__ w, f16* __restrict__ y,
                                          int cols, float eps) {
    __shared__ float scratch[32];
    const f16* xr = x + (size_t)blockIdx.x * cols;
    f16* yr = y + (size_t)blockIdx.x * cols;
    float ss = 0.f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        const float v = h2f(xr[c]);
        ss = __fmaf_rn(v, v, ss);
    }
    const float inv = __frsqrt_rn(__fadd_rn(__fdiv_rn(block_sum(ss, scratch), (float)cols), eps));
    for (int c = threadIdx.x; c < cols; c += blockDim.x)
        yr[c] = f2h(__fmul_rn(round_h(__fmul_rn(h2f(xr[c]), inv)), h2f(w[c])));
}

// ---------------------------------------------------------------------------------------------
// Splits a fused q|k|v row and applies interleaved RoPE to q and k (`codec.md` §1.3): pairs
// (2i, 2i+1) of every head rotated by the (cos, sin) of the row's position, in f32, rounded to
// f16. One thread per (row, pair of the q|k|v width). q goes to `q` [rows, width]; k and v to row
// `past + r` of `keys` / `values` (the window's past rows sit before them).
// rope: [rows, head_dim / 2, 2] f32 (bf16-rounded values).
extern "C" __global__ void codec_rope_split(const f16* __restrict__ qkv, const float* __restrict__ rope,
                                            f16* __restrict__ q, f16* __restrict__ keys, f16* __restrict__ values,
                                            int rows, int width, int head_dim, int past) {
    const int pairs = width / 2;
    const int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= rows * 3 * pairs) return;
    const int r = idx / (3 * pairs), p = idx - r * 3 * pairs;
    const int part = p / pairs, pp = p - part * pairs;  // part 0: q, 1: k, 2: v
    const f16* src = qkv + (size_t)r * 3 * width + (size_t)part * width + 2 * pp;
    const float x0 = h2f(src[0]), x1 = h2f(src[1]);
    const size_t out = (size_t)(part == 0 ? r : past + r) * width + 2 * pp;
    if (part == 2) {
        values[out] = src[0];
        values[out + 1] = src[1];
        return;
    }
    const float* cs = rope + (size_t)r * head_dim + 2 * (pp % (head_dim / 2));
    const float c = cs[0], s = cs[1];
    const float y0 = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
    const float y1 = __fadd_rn(__fmul_rn(x1, c), __fmul_rn(x0, s));
    f16* dst = part == 0 ? q : keys;
    dst[out] = f2h(y0);
    dst[out + 1] = f2h(y1);
}

// ---------------------------------------------------------------------------------------------
// Windowed causal attention, head_dim 64 (`codec.md` §1.3). One warp per (query row, head).
// Query r sits at row `past + r` of keys/values; it attends the `min(past + r + 1, window)` rows
// ending there. Key `first + j` belongs to lane j % 32, which sums its keys in increasing j; the
// lanes' sums meet in a fixed xor tree. Since `first` and the key count depend only on the
// query's absolute position (the window always holds the last `window − 1` frames), the order of
// every operation is the same however the stream was cut.
// Block: ATTN_WARPS warps; dynamic shared memory ATTN_WARPS · (64 + window) floats.
constexpr int ATTN_HEAD_DIM = 64;
constexpr int ATTN_WARPS = 4;

extern "C" __global__ void __launch_bounds__(ATTN_WARPS * 32)
    codec_attention(const f16* __restrict__ q, const f16* __restrict__ keys, const f16* __restrict__ values,
                    f16* __restrict__ out, int rows, int heads, int past, int window, float scale) {
    extern __shared__ float attn_smem[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int task = blockIdx.x * ATTN_WARPS + warp;
    if (task >= rows * heads) return;  // no block-wide barrier below
    const int r = task / heads, h = task - r * heads;
    const int width = heads * ATTN_HEAD_DIM;
    float* qs = attn_smem + warp * (ATTN_HEAD_DIM + window);
    float* probs = qs + ATTN_HEAD_DIM;

    const f16* qr = q + (size_t)r * width + h * ATTN_HEAD_DIM;
    qs[lane] = h2f(qr[lane]);
    qs[lane + 32] = h2f(qr[lane + 32]);
    __syncwarp();

    const int last = past + r;
    const int count = min(last + 1, window);
    const int first = last + 1 - count;
    float local_max = -INFINITY;
    for (int j = lane; j < count; j += 32) {
        const f16* kr = keys + (size_t)(first + j) * width + h * ATTN_HEAD_DIM;
        float dot = 0.f;
#pragma unroll 8
        for (int d = 0; d < ATTN_HEAD_DIM; ++d) dot = __fmaf_rn(qs[d], h2f(kr[d]), dot);
        const float s = __fmul_rn(dot, scale);
        probs[j] = s;
        local_max = fmaxf(local_max, s);
    }
    const float max = warp_max(local_max);
    float local_sum = 0.f;
    for (int j = lane; j < count; j += 32) {
        const float p = expf(__fsub_rn(probs[j], max));
        probs[j] = p;
        local_sum = __fadd_rn(local_sum, p);
    }
    const float sum = warp_sum(local_sum);
    __syncwarp();

    // Lane owns dims 2·lane and 2·lane + 1; keys in increasing order.
    float acc0 = 0.f, acc1 = 0.f;
    for (int j = 0; j < count; ++j) {
        const __half2 v =
            *reinterpret_cast<const __half2*>(values + (size_t)(first + j) * width + h * ATTN_HEAD_DIM + 2 * lane);
        acc0 = __fmaf_rn(probs[j], __low2float(v), acc0);
        acc1 = __fmaf_rn(probs[j], __high2float(v), acc1);
    }
    f16* o = out + (size_t)r * width + h * ATTN_HEAD_DIM + 2 * lane;
    o[0] = f2h(__fdiv_rn(acc0, sum));
    o[1] = f2h(__fdiv_rn(acc1, sum));
}

// ---------------------------------------------------------------------------------------------
// A causal conv's input window: the carried history rows, then the new rows (through Snake when
// `alpha` is given), f16. `history` may be null when h = 0. One thread per element.
extern "C" __global__ void codec_window(const f16* __restrict__ history, const f16* __restrict__ x,
                                        const f16* __restrict__ alpha, f16* __restrict__ win, int h, int n,
                                        int cols) {
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t past = (size_t)h * cols;
    if (idx >= past + (size_t)n * cols) return;
    if (idx < past) {
        win[idx] = history[idx];
        return;
    }
    const f16 v = x[idx - past];
    win[idx] = alpha == nullptr ? v : f2h(snake(h2f(v), h2f(alpha[(idx - past) % cols])));
}

// ---------------------------------------------------------------------------------------------
// ConvNeXt's causal depthwise conv (k taps over `win` = history + new rows) and LayerNorm
// (eps 1e-6), one block per output row. The conv output is rounded to f16 (the reference's
// activation) before the norm's statistics. Dynamic shared memory: cols floats.
extern "C" __global__ void codec_convnext_dw_norm(const f16* __restrict__ win, const f16* __restrict__ dw_weight,
                                                  const f16* __restrict__ dw_bias, const f16* __restrict__ norm_weight,
                                                  const f16* __restrict__ norm_bias, f16* __restrict__ y, int cols,
                                                  int kernel) {
    extern __shared__ float row[];
    __shared__ float scratch[32];
    const int t = blockIdx.x;
    float partial = 0.f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        float acc = 0.f;
        for (int tap = 0; tap < kernel; ++tap)
            acc = __fmaf_rn(h2f(dw_weight[tap * cols + c]), h2f(win[(size_t)(t + tap) * cols + c]), acc);
        const float v = round_h(__fadd_rn(acc, h2f(dw_bias[c])));
        row[c] = v;
        partial = __fadd_rn(partial, v);
    }
    const float mean = __fdiv_rn(block_sum(partial, scratch), (float)cols);
    float sq = 0.f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        const float d = __fsub_rn(row[c], mean);
        sq = __fmaf_rn(d, d, sq);
    }
    const float inv = __frsqrt_rn(__fadd_rn(__fdiv_rn(block_sum(sq, scratch), (float)cols), 1e-6f));
    f16* yr = y + (size_t)t * cols;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        const float normed = __fmul_rn(__fsub_rn(row[c], mean), inv);
        yr[c] = f2h(__fmaf_rn(normed, h2f(norm_weight[c]), h2f(norm_bias[c])));
    }
}

// ---------------------------------------------------------------------------------------------
// tanh of the final conv's output, rounded to f16 (the reference's output dtype).
extern "C" __global__ void codec_tanh(const f16* __restrict__ x, f16* __restrict__ y, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = f2h(tanhf(h2f(x[i])));
}

// ---------------------------------------------------------------------------------------------
// The one GEMM of the codec: linears, causal convs and transposed convs as an implicit GEMM.
//
//   y[m, n] = epilogue( Σ_{t < taps} Σ_{c < C} A[m + a_base + t·a_tap, c] · B[n·b_row + t·b_tap + c] )
//
// A: the input rows [*, C] f16 (a conv's window: history rows, then new rows); B: the weight, f16.
//   linear [N, C]:                 taps 1
//   causal conv [N, k, C]:         taps k, a_tap = dilation, b_row = k·C, b_tap = C
//   transposed conv [2s, out, C]:  N = s·out (column j·out + o is output row m·s + j, channel o);
//                                  tap 0 reads row m + 1 (a_base 1) with W[j], tap 1 row m with
//                                  W[j + s] (a_tap −1, b_row = C, b_tap = s·out·C)
// The reduction index is k = t·C + c, K = taps·C.
//
// Epilogue (`gemm_finish`), in f32 with one rounding to f16 at the end:
//   v = acc (+ bias[n % bias_len]); then GELU (EPI_GELU), or Snake of f16(v) with α = aux[n]
//   (EPI_SNAKE: the next conv's input), or silu(f16(v)) · aux[m, n] (EPI_GATE: SwiGLU); then,
//   with `res`, v = res[m, n] + γ[n]·v (γ = 1 when `gamma` is null).
//
// Two kernels, chosen by the host from C alone (`gemm.rs`), so every call with one weight takes
// the same one, whatever its row count:
// - `conv_mma` (C a multiple of 8, every layer of the published codec): tensor cores, f16
//   operands, f32 accumulators. Each output's sum is one accumulator through the same mma.sync
//   steps in the same order: k32 steps 0, 1, …, ceil(K / 32) − 1 (k ≥ K zero-filled, so the
//   padding depends on K only), each two k16 MMAs over the fixed k permutation of `mma.cuh`. An
//   MMA computes an output from its own A row and B column only, so the bits of an output do not
//   depend on M, on the row's place in a tile, or on which tile runs.
// - `conv_gemm_scalar` (any C: only the tiny test codec's narrowest blocks, C = 6 and 12): one
//   fmaf chain per output over k = 0, 1, …, K − 1, in CUDA-core f32.
//
// Floor (H200). A code frame costs 6.8 GFLOP of GEMM (`codec.md` §1.7, from these shapes:
// post_module 0.22, upsample stages 0.11, decoder 6.4, of which the residual units of blocks 2
// and 3, 256 and 1024 rows per frame, are 1.8 each). At an assumed 400 TFLOPS for mma.sync
// m16n8k16 f16 with f32 accumulation (the dense peak is 989 through wgmma; mma.sync reaches
// about two thirds of it in the best hand-tuned kernels, less with this conv addressing) that is
// 17 µs per frame: ~59 000 frames/s. The epilogue is CUDA-core work on top: ~3.5 M outputs per
// frame, half of them through Snake's sinf and division, ~8 µs per frame over 132 SMs. Expected
// when the decode batch's rows fill the GPU: 25–45 µs of GEMM per frame. (The stacked windows'
// history rows are computed and dropped: 6, 18 and 54 rows per stream in a block's three units,
// which nearly doubles block 1's unit convs at one-frame groups.)
constexpr int EPI_NONE = 0, EPI_GELU = 1, EPI_SNAKE = 2, EPI_GATE = 3;
constexpr int HAS_BIAS = 1, HAS_RES = 2, HAS_GAMMA = 4;

// The epilogue of one output from its accumulated sum and the values it reads (bias[n],
// α[n] or gate[m, n], res[m, n], γ[n]). Not inlined: compiled once per epilogue and called by
// every kernel and tile, so no instantiation can contract or schedule its arithmetic differently.
template <int EPI>
__device__ __noinline__ float gemm_finish(float v, float bias, float aux, float res, float gamma, int flags) {
    if (flags & HAS_BIAS) v = __fadd_rn(v, bias);
    if (EPI == EPI_GELU) v = gelu(v);
    if (EPI == EPI_SNAKE) v = snake(round_h(v), aux);
    if (EPI == EPI_GATE) v = __fmul_rn(silu(round_h(v)), aux);
    if (flags & HAS_RES) v = (flags & HAS_GAMMA) ? __fmaf_rn(gamma, v, res) : __fadd_rn(res, v);
    return v;
}

// What the epilogue reads besides the sum, shared by both kernels.
struct GemmOut {
    f16* y;
    const f16* bias;
    int bias_len;
    const f16* aux;
    const f16* res;
    const f16* gamma;
    int M, N;

    __device__ __forceinline__ int flags() const {
        return (bias != nullptr ? HAS_BIAS : 0) | (res != nullptr ? HAS_RES : 0) | (gamma != nullptr ? HAS_GAMMA : 0);
    }

    // y[m, n] from its sum (m < M, n < N).
    template <int EPI>
    __device__ __forceinline__ void store(int m, int n, float acc, int flags) const {
        const size_t at = (size_t)m * N + n;
        const float b = bias != nullptr ? h2f(bias[n % bias_len]) : 0.f;
        const float x = EPI == EPI_SNAKE ? h2f(aux[n]) : EPI == EPI_GATE ? h2f(aux[at]) : 0.f;
        const float r = res != nullptr ? h2f(res[at]) : 0.f;
        const float g = gamma != nullptr ? h2f(gamma[n]) : 0.f;
        y[at] = f2h(gemm_finish<EPI>(acc, b, x, r, g, flags));
    }
};

// The conv addressing of both operands.
struct GemmIn {
    const f16* a;
    const f16* w;
    int C, taps, a_base, a_tap, b_row, b_tap;
};

// ---- Tensor cores -----------------------------------------------------------------------------
// Block: 128 threads, 2 × 2 warps; warp (wm, wn) owns rows wm·16·MI + [0, 16·MI) and columns
// wn·32 + [0, 32) of a (32·MI) × 64 tile: MI m16 fragments × 4 n8 fragments, 16·MI f32
// accumulators per lane. Two tiles: MI = 1 (32 rows: calls of few rows, where reading the weight
// is the cost and more blocks keep more of it in flight) and MI = 4 (128 rows: many rows, where
// a 64 × 32 warp tile reads 192 bytes of shared memory per MMA: at 128 B/clk per SM, room for
// ~700 TFLOPS, above what mma.sync delivers). Columns per tile are 64 in both: the codec's N are
// multiples of 96, and 64 loses 25% only at N = 96 (block 4's units).
//
// Operands go global → shared through cp.async (16 bytes each: C % 8 == 0 keeps every piece of
// 8 consecutive k inside one tap and 16-byte aligned), STAGES k32 steps in flight. Shared rows
// are 64 bytes (32 f16), unpadded: a fragment load (lane (g, c) reads 16 bytes at k = 8c of rows
// g and g + 8, `mma.cuh`) has each quarter-warp read two whole 64-byte rows, conflict-free.
constexpr int MMA_BN = 64, MMA_BK = 32, MMA_THREADS = 128;

template <int MI, int STAGES, int EPI>
__device__ __forceinline__ void conv_mma(const GemmIn in, const GemmOut out) {
    constexpr int BM = 32 * MI, BN = MMA_BN, BK = MMA_BK;
    __shared__ __align__(16) f16 as[STAGES][BM][BK];
    __shared__ __align__(16) f16 bs[STAGES][BN][BK];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, c4 = lane & 3;
    const int wm = (warp >> 1) * 16 * MI, wn = (warp & 1) * 32;
    const int m0 = blockIdx.x * BM, n0 = blockIdx.y * BN;  // row tiles on x: no 65535 limit
    const int K = in.taps * in.C, steps = (K + BK - 1) / BK;

    // Thread i copies the 16-byte piece i % 4 (k = 8·(i % 4) of the step) of rows i / 4 + 32j:
    // one tap / channel split per step.
    const int piece = threadIdx.x & 3, prow = threadIdx.x >> 2;
    auto load = [&](int step, int stage) {
        const int k = step * BK + 8 * piece;
        const bool in_k = k < K;
        const int t = in_k ? k / in.C : 0;
        const int c = k - t * in.C;
#pragma unroll
        for (int j = 0; j < BM / 32; ++j) {
            const int r = prow + 32 * j, m = m0 + r;
            const bool ok = in_k && m < out.M;
            const f16* src = ok ? in.a + (size_t)(m + in.a_base + t * in.a_tap) * in.C + c : in.a;
            cp_async16_zfill(&as[stage][r][8 * piece], src, ok);
        }
#pragma unroll
        for (int j = 0; j < BN / 32; ++j) {
            const int r = prow + 32 * j, n = n0 + r;
            const bool ok = in_k && n < out.N;
            const f16* src = ok ? in.w + (size_t)n * in.b_row + (size_t)t * in.b_tap + c : in.w;
            cp_async16_zfill(&bs[stage][r][8 * piece], src, ok);
        }
    };

    float acc[MI][4][4];
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;

#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < steps) load(s, s);
        cp_async_commit();  // empty groups too: the wait below counts groups
    }
    for (int step = 0; step < steps; ++step) {
        cp_async_wait<STAGES - 2>();  // this thread's pieces of `step` have landed
        __syncthreads();              // everyone's have, and step − 1's stage is free again
        const int next = step + STAGES - 1;
        if (next < steps) load(next, next % STAGES);
        cp_async_commit();
        const int stage = step % STAGES;
        uint4 b[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) b[j] = *reinterpret_cast<const uint4*>(&bs[stage][wn + 8 * j + g][8 * c4]);
#pragma unroll
        for (int i = 0; i < MI; ++i) {
            const uint4 ag = *reinterpret_cast<const uint4*>(&as[stage][wm + 16 * i + g][8 * c4]);
            const uint4 ag8 = *reinterpret_cast<const uint4*>(&as[stage][wm + 16 * i + g + 8][8 * c4]);
#pragma unroll
            for (int j = 0; j < 4; ++j) mma_f16_k32(acc[i][j], ag, ag8, b[j]);
        }
    }

    // Lane (g, c4) holds rows g and g + 8 of each m16 fragment, columns 2·c4 and 2·c4 + 1 of
    // each n8 fragment.
    const int flags = out.flags();
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int m = m0 + wm + 16 * i + g + 8 * h;
            if (m >= out.M) continue;
#pragma unroll
            for (int j = 0; j < 4; ++j)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int n = n0 + wn + 8 * j + 2 * c4 + e;
                    if (n < out.N) out.store<EPI>(m, n, acc[i][j][2 * h + e], flags);
                }
        }
}

// ---- CUDA cores (any C) -----------------------------------------------------------------------
// Grid: (ceil(M / 64), ceil(N / 64)); 256 threads as 16 × 16, thread (ty, tx) owns outputs
// (m0 + ty + 16i, n0 + tx + 16j), i, j < 4. Tiles are staged in shared memory as f32, transposed
// to [k][row] and padded (conflict-free stores); the next tile's global loads are in flight while
// the current one is multiplied. Every thread loads the same k column of every tile
// (k = threadIdx.x % 32), so the tap / channel split is computed once per tile.
constexpr int SCALAR_BM = 64, SCALAR_BN = 64, SCALAR_BK = 32, SCALAR_THREADS = 256;

template <int EPI>
__device__ __forceinline__ void conv_gemm_scalar(const GemmIn in, const GemmOut out) {
    constexpr int BM = SCALAR_BM, BN = SCALAR_BN, BK = SCALAR_BK, TM = BM / 16, TN = BN / 16;
    constexpr int ROWS_PER_PASS = SCALAR_THREADS / BK;  // 8 rows of a tile per pass of the block
    constexpr int A_LOADS = BM / ROWS_PER_PASS, B_LOADS = BN / ROWS_PER_PASS;
    __shared__ float as[BK][BM + 1];
    __shared__ float bs[BK][BN + 1];
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    const int kcol = threadIdx.x % BK, row0 = threadIdx.x / BK;
    const int m0 = blockIdx.x * BM, n0 = blockIdx.y * BN;
    const int K = in.taps * in.C;

    float ra[A_LOADS], rb[B_LOADS];
    auto load = [&](int k0) {
        const int kk = k0 + kcol;
        const bool in_k = kk < K;
        const int t = in_k ? kk / in.C : 0;
        const int c = kk - t * in.C;
#pragma unroll
        for (int i = 0; i < A_LOADS; ++i) {
            const int m = m0 + row0 + ROWS_PER_PASS * i;
            ra[i] = in_k && m < out.M ? h2f(in.a[(size_t)(m + in.a_base + t * in.a_tap) * in.C + c]) : 0.f;
        }
#pragma unroll
        for (int i = 0; i < B_LOADS; ++i) {
            const int n = n0 + row0 + ROWS_PER_PASS * i;
            rb[i] = in_k && n < out.N ? h2f(in.w[(size_t)n * in.b_row + (size_t)t * in.b_tap + c]) : 0.f;
        }
    };

    float acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = 0.f;

    load(0);
    for (int k0 = 0; k0 < K; k0 += BK) {
#pragma unroll
        for (int i = 0; i < A_LOADS; ++i) as[kcol][row0 + ROWS_PER_PASS * i] = ra[i];
#pragma unroll
        for (int i = 0; i < B_LOADS; ++i) bs[kcol][row0 + ROWS_PER_PASS * i] = rb[i];
        __syncthreads();
        if (k0 + BK < K) load(k0 + BK);
#pragma unroll
        for (int k = 0; k < BK; ++k) {
            float av[TM], bv[TN];
#pragma unroll
            for (int i = 0; i < TM; ++i) av[i] = as[k][ty + 16 * i];
#pragma unroll
            for (int j = 0; j < TN; ++j) bv[j] = bs[k][tx + 16 * j];
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j) acc[i][j] = __fmaf_rn(av[i], bv[j], acc[i][j]);
        }
        __syncthreads();
    }

    const int flags = out.flags();
#pragma unroll
    for (int i = 0; i < TM; ++i) {
        const int m = m0 + ty + 16 * i;
        if (m >= out.M) continue;
#pragma unroll
        for (int j = 0; j < TN; ++j) {
            const int n = n0 + tx + 16 * j;
            if (n < out.N) out.store<EPI>(m, n, acc[i][j], flags);
        }
    }
}

// Entry points, each with every epilogue: codec_gemm_m32* and codec_gemm_m128* (tensor cores,
// 32- and 128-row tiles, identical outputs) and codec_gemm_scalar* (C not a multiple of 8).
// All take the same arguments; grid (ceil(M / tile rows), ceil(N / 64)).
#define CODEC_GEMM_PARAMS                                                                                \
    const f16 *a, const f16 *w, f16 *y, int M, int N, int C, int taps, int a_base, int a_tap, int b_row, \
        int b_tap, const f16 *bias, int bias_len, const f16 *aux, const f16 *res, const f16 *gamma
#define CODEC_GEMM_ARGS \
    GemmIn{a, w, C, taps, a_base, a_tap, b_row, b_tap}, GemmOut{y, bias, bias_len, aux, res, gamma, M, N}
#define CODEC_GEMM_MMA(NAME, MI, STAGES, EPI)                                                       \
    extern "C" __global__ void __launch_bounds__(MMA_THREADS) NAME(CODEC_GEMM_PARAMS) {             \
        conv_mma<MI, STAGES, EPI>(CODEC_GEMM_ARGS);                                                 \
    }
#define CODEC_GEMM_SCALAR(NAME, EPI)                                                                \
    extern "C" __global__ void __launch_bounds__(SCALAR_THREADS) NAME(CODEC_GEMM_PARAMS) {          \
        conv_gemm_scalar<EPI>(CODEC_GEMM_ARGS);                                                     \
    }
// Shared memory: (32·MI + 64) rows × 64 bytes per stage: 8 stages of the 32-row tile (more of
// the weight in flight when it is the traffic) and 4 of the 128-row one, 48 KiB each.
CODEC_GEMM_MMA(codec_gemm_m32, 1, 8, EPI_NONE)
CODEC_GEMM_MMA(codec_gemm_m32_gelu, 1, 8, EPI_GELU)
CODEC_GEMM_MMA(codec_gemm_m32_snake, 1, 8, EPI_SNAKE)
CODEC_GEMM_MMA(codec_gemm_m32_gate, 1, 8, EPI_GATE)
CODEC_GEMM_MMA(codec_gemm_m128, 4, 4, EPI_NONE)
CODEC_GEMM_MMA(codec_gemm_m128_gelu, 4, 4, EPI_GELU)
CODEC_GEMM_MMA(codec_gemm_m128_snake, 4, 4, EPI_SNAKE)
CODEC_GEMM_MMA(codec_gemm_m128_gate, 4, 4, EPI_GATE)
CODEC_GEMM_SCALAR(codec_gemm_scalar, EPI_NONE)
CODEC_GEMM_SCALAR(codec_gemm_scalar_gelu, EPI_GELU)
CODEC_GEMM_SCALAR(codec_gemm_scalar_snake, EPI_SNAKE)
CODEC_GEMM_SCALAR(codec_gemm_scalar_gate, EPI_GATE)
