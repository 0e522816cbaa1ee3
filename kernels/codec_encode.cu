// The codec encoder (`codec.md` §5.3, voice cloning) in f32: f32 weights, f32 activations, f32
// arithmetic, as the reference encode hook runs it on a GPU (fp32 with TF32 off: its authors
// measured TF32 flipping ~3% of codes). Encoding a reference clip is a one-off per voice, so the
// kernels are plain CUDA-core code chosen for a fixed, simple reduction order, not for speed:
// every output is one f32 chain over its inputs in an order fixed by the weight's shape, so the
// same clip gives the same codes however it is tiled. Element-wise steps use the `_rn`
// intrinsics so the compiler never contracts them differently between instantiations.
#include "common.cuh"

// Snake (`dac.nn.layers.snake`): x + (α + 1e-9)⁻¹ · sin²(α·x), the CPU reference's f32 order.
extern "C" __global__ void __launch_bounds__(256) enc_snake(const float* __restrict__ x, const float* __restrict__ alpha,
                                                            float* __restrict__ y, int n, int cols) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float v = x[i], a = alpha[i % cols];
    const float s = sinf(__fmul_rn(a, v));
    y[i] = __fadd_rn(v, __fmul_rn(__fdiv_rn(1.f, __fadd_rn(a, 1e-9f)), __fmul_rn(s, s)));
}

// Conv / linear: y[m, o] = bias[o] + Σ_{t < taps} Σ_{c < cin} W[o, t, c] · win[m·stride + t·dilation, c],
// then the epilogue. `win` is the whole input window (history or zero padding first), so every
// read row exists. One f32 accumulator per output, fed k = t·cin + c in increasing order
// (fmaf): the order depends on the weight's shape only.
//
// Epilogues: 0 none; 1 exact-erf GELU; 2 y = aux[m, o] + v·γ[o] (γ = 1 when null: a residual);
// 3 y = silu(aux[m, o])·v (SwiGLU, v the w3 projection and aux the w1 one).
//
// Tile: 32 rows × 64 outputs per block of 256 threads, 32 of k staged in shared memory per step;
// thread (ty, tx) computes rows 2·ty, 2·ty + 1 and outputs tx, tx + 16, tx + 32, tx + 48.
// Launch: grid (ceil(rows / 32), ceil(n / 64)), 256 threads.
namespace conv {
constexpr int BM = 32, BN = 64, BK = 32;
}

template <int EPI>
__device__ __forceinline__ void enc_conv(const float* __restrict__ win, const float* __restrict__ w,
                                         const float* __restrict__ bias, const float* __restrict__ aux,
                                         const float* __restrict__ gamma, float* __restrict__ y, int rows, int n,
                                         int cin, int taps, int stride, int dilation) {
    using namespace conv;
    __shared__ float a_s[BK][BM + 1];
    __shared__ float b_s[BK][BN + 1];
    const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
    const int m0 = blockIdx.x * BM, o0 = blockIdx.y * BN;  // rows on x: a clip has millions
    const int k_total = taps * cin;
    float acc[2][4];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.f;

    for (int k0 = 0; k0 < k_total; k0 += BK) {
        // A: BM rows × BK of k (4 per thread); B: BN outputs × BK of k (8 per thread).
        for (int e = tid; e < BM * BK; e += 256) {
            const int r = e / BK, kk = e % BK, m = m0 + r, k = k0 + kk;
            float v = 0.f;
            if (m < rows && k < k_total) {
                const int t = k / cin, c = k - t * cin;
                v = win[(size_t)(m * stride + t * dilation) * cin + c];
            }
            a_s[kk][r] = v;
        }
        for (int e = tid; e < BN * BK; e += 256) {
            const int o = e / BK, kk = e % BK, k = k0 + kk;
            b_s[kk][o] = (o0 + o < n && k < k_total) ? w[(size_t)(o0 + o) * k_total + k] : 0.f;
        }
        __syncthreads();
        const int steps = min(BK, k_total - k0);
        for (int kk = 0; kk < steps; ++kk) {
            const float a0 = a_s[kk][2 * ty], a1 = a_s[kk][2 * ty + 1];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const float b = b_s[kk][tx + 16 * j];
                acc[0][j] = __fmaf_rn(a0, b, acc[0][j]);
                acc[1][j] = __fmaf_rn(a1, b, acc[1][j]);
            }
        }
        __syncthreads();
    }

#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int m = m0 + 2 * ty + i;
        if (m >= rows) continue;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int o = o0 + tx + 16 * j;
            if (o >= n) continue;
            float v = bias ? __fadd_rn(acc[i][j], bias[o]) : acc[i][j];
            const size_t at = (size_t)m * n + o;
            if (EPI == 1) {
                v = __fmul_rn(__fmul_rn(0.5f, v), __fadd_rn(1.f, erff(__fmul_rn(v, 0.70710678118654752f))));
            } else if (EPI == 2) {
                v = __fadd_rn(aux[at], gamma ? __fmul_rn(v, gamma[o]) : v);
            } else if (EPI == 3) {
                const float g = aux[at];
                v = __fmul_rn(__fdiv_rn(g, __fadd_rn(1.f, expf(-g))), v);
            }
            y[at] = v;
        }
    }
}

#define ENC_CONV(name, epi)                                                                                          \
    extern "C" __global__ void __launch_bounds__(256)                                                               \
        name(const float* win, const float* w, const float* bias, const float* aux, const float* gamma, float* y,   \
             int rows, int n, int cin, int taps, int stride, int dilation) {                                         \
        enc_conv<epi>(win, w, bias, aux, gamma, y, rows, n, cin, taps, stride, dilation);                            \
    }
ENC_CONV(enc_conv, 0)
ENC_CONV(enc_conv_gelu, 1)
ENC_CONV(enc_conv_residual, 2)
ENC_CONV(enc_conv_swiglu, 3)

// RMSNorm of each row (one block per row): y = (x · (1 / √(mean(x²) + eps))) · w.
extern "C" __global__ void __launch_bounds__(256) enc_rms_norm(const float* __restrict__ x, const float* __restrict__ w,
                                                               float* __restrict__ y, int cols, float eps) {
    __shared__ float scratch[32];
    const float* row = x + (size_t)blockIdx.x * cols;
    float s = 0.f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) s = __fmaf_rn(row[c], row[c], s);
    const float ms = __fdiv_rn(block_sum(s, scratch), (float)cols);
    const float r = __fdiv_rn(1.f, __fsqrt_rn(__fadd_rn(ms, eps)));
    for (int c = threadIdx.x; c < cols; c += blockDim.x)
        y[(size_t)blockIdx.x * cols + c] = __fmul_rn(__fmul_rn(row[c], r), w[c]);
}

// LayerNorm of each row (ConvNeXt's, biased variance): y = (x − mean) · (1 / √(var + eps)) · w + b.
extern "C" __global__ void __launch_bounds__(256) enc_layer_norm(const float* __restrict__ x, const float* __restrict__ w,
                                                                 const float* __restrict__ b, float* __restrict__ y,
                                                                 int cols, float eps) {
    __shared__ float scratch[32];
    const float* row = x + (size_t)blockIdx.x * cols;
    float s = 0.f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) s = __fadd_rn(s, row[c]);
    const float mean = __fdiv_rn(block_sum(s, scratch), (float)cols);
    float q = 0.f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        const float d = __fsub_rn(row[c], mean);
        q = __fmaf_rn(d, d, q);
    }
    const float var = __fdiv_rn(block_sum(q, scratch), (float)cols);
    const float r = __fdiv_rn(1.f, __fsqrt_rn(__fadd_rn(var, eps)));
    for (int c = threadIdx.x; c < cols; c += blockDim.x)
        y[(size_t)blockIdx.x * cols + c] = __fadd_rn(__fmul_rn(__fmul_rn(__fsub_rn(row[c], mean), r), w[c]), b[c]);
}

// Depthwise causal conv over a window: y[t, c] = b[c] + Σ_tap w[tap, c] · win[t + tap, c].
extern "C" __global__ void __launch_bounds__(256) enc_depthwise(const float* __restrict__ win,
                                                                const float* __restrict__ w,
                                                                const float* __restrict__ b, float* __restrict__ y,
                                                                int rows, int cols, int taps) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * cols) return;
    const int t = i / cols, c = i - t * cols;
    float acc = b[c];
    for (int k = 0; k < taps; ++k) acc = __fmaf_rn(w[k * cols + c], win[(size_t)(t + k) * cols + c], acc);
    y[i] = acc;
}

// Interleaved RoPE of q and k inside a fused q|k|v row ([rows, 3·width]), in place: the pairs
// (2i, 2i + 1) of every head turn by row t's (cos, sin) `rope[t, i]`.
extern "C" __global__ void __launch_bounds__(256) enc_rope(float* __restrict__ qkv, const float* __restrict__ rope,
                                                           int rows, int width, int head_dim) {
    const int pairs = width / 2, i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * 2 * pairs) return;
    const int t = i / (2 * pairs), rest = i - t * 2 * pairs, part = rest / pairs, p = rest - part * pairs;
    const int d = 2 * p, f = (d % head_dim) / 2;
    float* v = qkv + (size_t)t * 3 * width + part * width + d;
    const float c = rope[((size_t)t * head_dim / 2 + f) * 2], s = rope[((size_t)t * head_dim / 2 + f) * 2 + 1];
    const float x0 = v[0], x1 = v[1];
    v[0] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
    v[1] = __fadd_rn(__fmul_rn(x1, c), __fmul_rn(x0, s));
}

// The k and v thirds of fused q|k|v rows ([rows, 3·width]) into rows `at..at + rows` of the
// key and value windows ([*, width]).
extern "C" __global__ void __launch_bounds__(256) enc_split_kv(const float* __restrict__ qkv, float* __restrict__ keys,
                                                               float* __restrict__ values, int rows, int width, int at) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * width) return;
    const int t = i / width, c = i - t * width;
    keys[(size_t)(at + t) * width + c] = qkv[(size_t)t * 3 * width + width + c];
    values[(size_t)(at + t) * width + c] = qkv[(size_t)t * 3 * width + 2 * width + c];
}

// Windowed causal attention, one warp per (query row, head), head_dim 64 (two dims per lane).
// Query t (at position past + t of `keys`) attends keys first..last, last = past + t, first =
// max(0, last + 1 − window), oldest first. Scores in shared memory; the softmax's max and sum
// and each output's weighted sum run over the keys in order (the sum lane-strided from the
// oldest key, then a fixed xor tree). q sits in the fused q|k|v rows ([rows, 3·width]).
constexpr int ATT_WARPS = 4;
extern "C" __global__ void __launch_bounds__(ATT_WARPS * 32)
    enc_attention(const float* __restrict__ qkv, const float* __restrict__ keys, const float* __restrict__ values,
                  float* __restrict__ out, int rows, int past, int heads, int window, float scale) {
    extern __shared__ float probs[];  // [ATT_WARPS][window]
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int item = blockIdx.x * ATT_WARPS + warp;
    if (item >= rows * heads) return;
    const int t = item / heads, h = item - t * heads, width = heads * 64;
    const int last = past + t, first = max(0, last + 1 - window), n = last - first + 1;
    float* p = probs + warp * window;
    const float* q = qkv + (size_t)t * 3 * width + h * 64;
    const float q0 = q[lane], q1 = q[lane + 32];
    float mx = -INFINITY;
    for (int j = 0; j < n; ++j) {
        const float* k = keys + (size_t)(first + j) * width + h * 64;
        const float s = __fmul_rn(warp_sum(__fmaf_rn(q1, k[lane + 32], __fmul_rn(q0, k[lane]))), scale);
        if (lane == 0) p[j] = s;
        mx = fmaxf(mx, s);
    }
    __syncwarp();
    float sum = 0.f;
    for (int j = lane; j < n; j += 32) {
        const float e = expf(__fsub_rn(p[j], mx));
        p[j] = e;
        sum = __fadd_rn(sum, e);
    }
    sum = warp_sum(sum);
    __syncwarp();
    float o0 = 0.f, o1 = 0.f;
    for (int j = 0; j < n; ++j) {
        const float* v = values + (size_t)(first + j) * width + h * 64;
        o0 = __fmaf_rn(p[j], v[lane], o0);
        o1 = __fmaf_rn(p[j], v[lane + 32], o1);
    }
    float* o = out + (size_t)t * width + h * 64;
    o[lane] = __fdiv_rn(o0, sum);
    o[lane + 32] = __fdiv_rn(o1, sum);
}

// The quantizers over each frame (one block per frame, 256 threads): the residual r starts as
// the frame's row of z; for each quantizer in turn, e = in_proj·r + b (dim ≤ 32), the codeword of
// greatest cosine similarity with e (first on equals), q = out_proj·(e + (c − e)) + b, r ← r − q.
// `table` holds 5 addresses per quantizer (in_proj [dim, latent], in_bias [dim], codebook [size,
// dim], out_proj [latent, dim], out_bias [latent]) and `sizes` each codebook's size.
constexpr int VQ_MAX_DIM = 32;
extern "C" __global__ void __launch_bounds__(256) enc_quantize(const float* __restrict__ z, const uint64_t* __restrict__ table,
                                                               const int* __restrict__ sizes, uint32_t* __restrict__ codes,
                                                               int quantizers, int latent, int dim) {
    extern __shared__ float r[];  // [latent]
    __shared__ float scratch[32], e[VQ_MAX_DIM], st[VQ_MAX_DIM];
    __shared__ float best_v[256];
    __shared__ int best_i[256];
    const int frame = blockIdx.x, tid = threadIdx.x;
    for (int c = tid; c < latent; c += blockDim.x) r[c] = z[(size_t)frame * latent + c];
    __syncthreads();
    for (int qi = 0; qi < quantizers; ++qi) {
        const float* in_proj = reinterpret_cast<const float*>(table[5 * qi]);
        const float* in_bias = reinterpret_cast<const float*>(table[5 * qi + 1]);
        const float* book = reinterpret_cast<const float*>(table[5 * qi + 2]);
        const float* out_proj = reinterpret_cast<const float*>(table[5 * qi + 3]);
        const float* out_bias = reinterpret_cast<const float*>(table[5 * qi + 4]);
        for (int d = 0; d < dim; ++d) {
            float s = 0.f;
            for (int c = tid; c < latent; c += blockDim.x) s = __fmaf_rn(in_proj[(size_t)d * latent + c], r[c], s);
            s = block_sum(s, scratch);
            if (tid == 0) e[d] = __fadd_rn(s, in_bias[d]);
        }
        __syncthreads();
        float bv = -INFINITY;
        int bi = 0x7fffffff;
        for (int j = tid; j < sizes[qi]; j += blockDim.x) {
            const float* cj = book + (size_t)j * dim;
            float dot = 0.f, nn = 0.f;
            for (int d = 0; d < dim; ++d) {
                dot = __fmaf_rn(cj[d], e[d], dot);
                nn = __fmaf_rn(cj[d], cj[d], nn);
            }
            const float sim = __fdiv_rn(dot, __fsqrt_rn(nn));
            if (sim > bv) bv = sim, bi = j;
        }
        best_v[tid] = bv;
        best_i[tid] = bi;
        __syncthreads();
        for (int half = blockDim.x / 2; half > 0; half >>= 1) {
            if (tid < half) {
                const float ov = best_v[tid + half];
                const int oi = best_i[tid + half];
                if (ov > best_v[tid] || (ov == best_v[tid] && oi < best_i[tid])) best_v[tid] = ov, best_i[tid] = oi;
            }
            __syncthreads();
        }
        const int code = best_i[0];
        if (tid == 0) codes[(size_t)frame * quantizers + qi] = (uint32_t)code;
        if (tid < dim) st[tid] = __fadd_rn(e[tid], __fsub_rn(book[(size_t)code * dim + tid], e[tid]));
        __syncthreads();
        for (int c = tid; c < latent; c += blockDim.x) {
            float q = out_bias[c];
            for (int d = 0; d < dim; ++d) q = __fmaf_rn(out_proj[(size_t)c * dim + d], st[d], q);
            r[c] = __fsub_rn(r[c], q);
        }
        __syncthreads();
    }
}
