// The Codebook-MTP tower's own steps (`model.md` §5–6) around the projections `linear.cu`
// computes, the norms `norm.cu` computes and the attention kernels of `attention.cu`:
//   tower_unseen  U = Σ_{i=first..} CB[i·V + c_i] per semantic row (layer 0's extra vector);
//   tower_mix     concat(enorm(mask ? Emb[code] : 0 (+ U)), hnorm(h)), the input of eh_proj;
//   tower_prep    split of wqkv's [Q | gates | K | V], zero-centred q/k norms, interleaved RoPE,
//                 q (f32, scaled for the log2 softmax) and the gates in the layout the attention
//                 kernels read, K/V written into the layer's cache.
// Codes, masks and positions come as device arrays, so a captured step can replay them.
#include "common.cuh"

// One block per row, 256 threads. table: [codebooks·V, dim] bf16; codes: [rows, codebooks];
// semantic: [rows] (nonzero = the row is an audio row); out: [rows, dim] bf16. Codes are clamped
// into the table as the reference clamps them. Sums in f32, one rounding.
extern "C" __global__ void tower_unseen(const bf16* __restrict__ table, const uint32_t* __restrict__ codes,
                                        const uint32_t* __restrict__ semantic, bf16* __restrict__ out, int codebooks,
                                        int first, int vocab, int dim) {
    pdl_begin();
    const int r = blockIdx.x;
    const uint32_t* cr = codes + (size_t)r * codebooks;
    bf16* o = out + (size_t)r * dim;
    const bool on = semantic[r] != 0;
    for (int d = threadIdx.x; d < dim; d += blockDim.x) {
        float acc = 0.f;
        if (on) {
            for (int i = first; i < codebooks; ++i) {
                const uint32_t c = min(cr[i], (uint32_t)(vocab - 1));
                acc += to_f32(table[((size_t)i * vocab + c) * dim + d]);
            }
        }
        o[d] = to_bf16(acc);
    }
}

// Column d of e = (mask ? Emb[code] : 0) + U (U may be null), in f32: e is normed at once, so it is
// never rounded to bf16 (it is recomputed for the second pass rather than stored).
__device__ __forceinline__ float embedding_value(const bf16* emb_row, const bf16* u_row, bool on, int d) {
    float e = on ? to_f32(emb_row[d]) : 0.f;
    if (u_row) e += to_f32(u_row[d]);
    return e;
}

// Columns per thread held in registers by tower_mix's one-pass path.
#define MIX_REGS 8

// One block per row, 256 threads. hidden: [rows, dim] bf16; emb: [V, dim] bf16; codes, mask: row
// r's at r · label_stride words (1 for packed arrays, a `SamplerOut`'s words for the sampler's
// rows); unseen: [rows, dim] bf16 or null; enorm, hnorm: [dim] f32 (stored gains w, applied as
// 1 + w); out: [rows, 2·dim] bf16 = [enorm(e) | hnorm(h)].
extern "C" __global__ void tower_mix(const bf16* __restrict__ hidden, const bf16* __restrict__ emb,
                                     const uint32_t* __restrict__ codes, const uint32_t* __restrict__ mask,
                                     int label_stride, const bf16* __restrict__ unseen,
                                     const float* __restrict__ enorm, const float* __restrict__ hnorm,
                                     bf16* __restrict__ out, int dim, int vocab, float eps) {
    pdl_begin();
    __shared__ float scratch[32];
    const int r = blockIdx.x;
    const bool on = mask[(size_t)r * label_stride] != 0;
    const bf16* emb_row = emb + (size_t)min(codes[(size_t)r * label_stride], (uint32_t)(vocab - 1)) * dim;
    const bf16* u_row = unseen ? unseen + (size_t)r * dim : nullptr;
    const bf16* h_row = hidden + (size_t)r * dim;
    bf16* o = out + (size_t)r * 2 * dim;
    float se = 0.f, sh = 0.f;
    if (dim <= MIX_REGS * (int)blockDim.x) {
        // The whole row in one go (every tower width up to 2048): each thread issues its loads
        // together, one memory round trip; same columns, same order, same bits as the loop below.
        const int t = threadIdx.x, n = blockDim.x;
        float e[MIX_REGS], h[MIX_REGS], ge[MIX_REGS], gh[MIX_REGS];
#pragma unroll
        for (int j = 0; j < MIX_REGS; ++j) {
            const int d = t + j * n;
            const bool in = d < dim;
            e[j] = in && on ? to_f32(emb_row[d]) : 0.f;
            const float u = in && u_row ? to_f32(u_row[d]) : 0.f;
            h[j] = in ? to_f32(h_row[d]) : 0.f;
            ge[j] = in ? enorm[d] : 0.f;
            gh[j] = in ? hnorm[d] : 0.f;
            if (u_row) e[j] += u;
        }
#pragma unroll
        for (int j = 0; j < MIX_REGS; ++j)
            if (t + j * n < dim) {
                se += e[j] * e[j];
                sh += h[j] * h[j];
            }
        const float inv_e = rsqrtf(block_sum(se, scratch) / dim + eps);
        const float inv_h = rsqrtf(block_sum(sh, scratch) / dim + eps);
#pragma unroll
        for (int j = 0; j < MIX_REGS; ++j) {
            const int d = t + j * n;
            if (d < dim) {
                o[d] = to_bf16(e[j] * inv_e * (1.f + ge[j]));
                o[dim + d] = to_bf16(h[j] * inv_h * (1.f + gh[j]));
            }
        }
        return;
    }
    for (int d = threadIdx.x; d < dim; d += blockDim.x) {
        const float e = embedding_value(emb_row, u_row, on, d), h = to_f32(h_row[d]);
        se += e * e;
        sh += h * h;
    }
    const float inv_e = rsqrtf(block_sum(se, scratch) / dim + eps);
    const float inv_h = rsqrtf(block_sum(sh, scratch) / dim + eps);
    for (int d = threadIdx.x; d < dim; d += blockDim.x) {
        o[d] = to_bf16(embedding_value(emb_row, u_row, on, d) * inv_e * (1.f + enorm[d]));
        o[dim + d] = to_bf16(to_f32(h_row[d]) * inv_h * (1.f + hnorm[d]));
    }
}

// One block per (head slot, row): grid (H + Hkv, rows), blockDim = HD (a multiple of 32, ≤ 1024).
// qkv: [rows, 2·H·HD + 2·Hkv·HD] bf16 laid out [all Q | all gates | K | V]. Slots 0..H-1 are q heads:
// normed, rotated, · q_scale into q [rows, H, HD] f32, and the head's gate copied into qg
// [rows, H·2·HD] at columns head·2·HD + HD .. (the half the attention kernels read). Slots H.. are
// kv heads: k normed and rotated into kc, v copied into vc, both [capacity, Hkv, HD] at start + row
// (plus *dev_start when given: see first_position).
// Interleaved RoPE on the first rotary_dim dims: pair (2i, 2i+1) turns by the f32 angle
// pos · inv_freq[i] (the host computes inv_freq as the CPU oracle does); cos/sin in f64, rounded to
// f32, and the rotation in f32 without contraction, as the oracle computes it.
// The decode batch (`seq_*` given, see DecodeRows): row t is its own sequence, with its own cache
// and position.
extern "C" __global__ void tower_prep(const bf16* __restrict__ qkv, const float* __restrict__ q_norm,
                                      const float* __restrict__ k_norm, const float* __restrict__ inv_freq,
                                      float* __restrict__ q, bf16* __restrict__ qg, bf16* kc, bf16* vc, int heads,
                                      int kv_heads, int rotary_dim, int start, const int* __restrict__ dev_start,
                                      float eps, float q_scale, DECODE_ROWS_PARAMS) {
    pdl_begin();
    const DecodeRows seq = DECODE_ROWS;
    __shared__ float scratch[32];
    __shared__ float ys[1024];
    const int hd = blockDim.x, d = threadIdx.x, slot = blockIdx.x, t = blockIdx.y;
    const int pos = seq.row_position(t, first_position(start, dev_start) + t);
    seq.row_cache(t, kc, vc);
    const size_t row = (size_t)t * (2 * heads + 2 * kv_heads) * hd;
    const bool is_q = slot < heads;
    const int kvh = slot - heads;
    const size_t col = is_q ? (size_t)slot * hd : (size_t)2 * heads * hd + (size_t)kvh * hd;
    const float x = to_f32(qkv[row + col + d]);
    const float gain = is_q ? q_norm[d] : k_norm[d];
    const float inv = rsqrtf(block_sum(x * x, scratch) / hd + eps);
    float y = x * inv * (1.f + gain);
    ys[d] = y;
    __syncthreads();
    if (d < rotary_dim) {
        const float angle = __fmul_rn((float)pos, inv_freq[d / 2]);
        double sn, cs;
        sincos((double)angle, &sn, &cs);
        const float c = (float)cs, s = (float)sn;
        y = (d & 1) == 0 ? __fsub_rn(__fmul_rn(ys[d], c), __fmul_rn(ys[d + 1], s))
                         : __fadd_rn(__fmul_rn(ys[d], c), __fmul_rn(ys[d - 1], s));
    }
    if (is_q) {
        q[((size_t)t * heads + slot) * hd + d] = y * q_scale;
        qg[(size_t)t * 2 * heads * hd + (size_t)slot * 2 * hd + hd + d] = qkv[row + (size_t)(heads + slot) * hd + d];
    } else {
        const size_t c = ((size_t)pos * kv_heads + kvh) * hd + d;
        kc[c] = to_bf16(y);
        vc[c] = qkv[row + (size_t)(2 * heads + kv_heads + kvh) * hd + d];
    }
}
