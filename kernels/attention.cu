// Gated full attention (`backbone.md` §2) around the bf16 projections `linear.cu` computes:
//   attn_prep            q/gate split, zero-centred q/k norms, partial NeoX RoPE, K/V cache append;
//   attn_prefill_hd*     causal GQA attention of many rows (kernels/attention_prefill.cu);
//   attn_decode_hd*      one split of the keys for a few q heads of each query row
//                        (flash-decoding), partials in fp32; the last split of a (row, head set)
//                        to finish merges them, · sigmoid(gate), bf16 (no second launch: the merge
//                        ends the decode kernel); where the keys fit one split (the tower, a
//                        stream's first frames) it writes at once.
//
// Layouts (row-major): qg [T, H·2·HD] bf16 (per head: HD query columns, then HD gate columns);
// k, v [T, Hkv·HD] bf16; q [T, H, HD] f32, already multiplied by scale·log2(e) so that scores are in
// log2 units and the softmax uses exp2; the K/V cache [capacity, Hkv, HD] bf16 each (K after norm and
// RoPE, V raw); out [T, H·HD] bf16 (the gated attention output that o_proj reads).
// q head h reads kv head h / (H / Hkv). All accumulation and softmax statistics are fp32.
#include "common.cuh"
#include "kernel_constants.cuh"  // ATTN_* (src/backend/cuda/kernel_constants.rs)

namespace {

constexpr int NT = ATTN_THREADS;        // threads of the decode kernel
constexpr int BK = ATTN_TILE_KEYS;      // keys per tile: one lane per key in the softmax
constexpr int MAXH = ATTN_CTA_HEADS;    // most q heads (of one kv head) a decode CTA takes

__device__ __forceinline__ float dot4(float4 a, float4 b) { return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w; }

// 8 bf16 (one 16-byte load) widened into 8 consecutive floats of shared memory (16-byte aligned).
__device__ __forceinline__ void store8(float* dst, uint4 raw) {
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
    const float2 a = __bfloat1622float2(h[0]), b = __bfloat1622float2(h[1]);
    const float2 c = __bfloat1622float2(h[2]), d = __bfloat1622float2(h[3]);
    reinterpret_cast<float4*>(dst)[0] = make_float4(a.x, a.y, b.x, b.y);
    reinterpret_cast<float4*>(dst)[1] = make_float4(c.x, c.y, d.x, d.y);
}

// Keys k0 .. k0+BK of kv head `kvh` into shared memory as f32: Ks [BK][HD+4] (padded so that 8
// threads reading 8 different keys at the same offset hit 8 different banks), Vs [BK][HD].
// Keys at or past `kend` are zero (not yet written, or another split's): their probability is 0,
// and a zero V keeps 0 · V finite whatever the cache holds there. All loads are issued before the
// first store, so each thread has several 16-byte loads in flight.
template <int HD>
__device__ __forceinline__ void load_kv_tile(const bf16* __restrict__ kc, const bf16* __restrict__ vc, int kv_heads,
                                             int kvh, int k0, int kend, float* Ks, float* Vs) {
    constexpr int CH = HD / 8;  // 16-byte chunks per key
    constexpr int ITER = (BK * CH + NT - 1) / NT;
    uint4 kr[ITER], vr[ITER];
#pragma unroll
    for (int i = 0; i < ITER; ++i) {
        const int idx = threadIdx.x + i * NT;
        const int kk = idx / CH, c = idx % CH;
        kr[i] = vr[i] = make_uint4(0u, 0u, 0u, 0u);
        if (idx < BK * CH && k0 + kk < kend) {
            const size_t off = ((size_t)(k0 + kk) * kv_heads + kvh) * HD + c * 8;
            kr[i] = *reinterpret_cast<const uint4*>(kc + off);
            vr[i] = *reinterpret_cast<const uint4*>(vc + off);
        }
    }
#pragma unroll
    for (int i = 0; i < ITER; ++i) {
        const int idx = threadIdx.x + i * NT;
        if (idx < BK * CH) {
            const int kk = idx / CH, c = idx % CH;
            store8(Ks + kk * (HD + 4) + c * 8, kr[i]);
            store8(Vs + kk * HD + c * 8, vr[i]);
        }
    }
}

// The merge of row t's nonempty splits for its heads head0 .. head0 + nh, into out [T, H·HD] bf16:
// out[t, head·HD + d] = bf16(Σ_s 2^(m_s − M) o_s[d] / Σ_s 2^(m_s − M) l_s · sigmoid(gate[d])), the
// sums over s in order. Split 0 always holds key 0, so M is finite and the denominator positive.
// Partials other CTAs wrote are read through L2 (__ldcg): this SM's L1 may hold none of them, but
// nothing says so. A head's weights 2^(m_s − M) and denominator are computed once (warp g), then
// each thread sums 4 consecutive output elements over the splits, MERGE_BATCH splits' float4 loads
// in flight at a time: the merge is a chain of L2 round trips at the end of the decode, so it
// issues as few as it can. `ml` is shared memory for the nh heads' (m, l) pairs, [nh][nonempty][2];
// `wl` for their weights, [nh][ATTN_MAX_SPLITS + 1] (the denominator last).
constexpr int MERGE_BATCH = 16;
constexpr int MERGE_WS = ATTN_MAX_SPLITS + 1;
template <int HD>
__device__ __forceinline__ void merge_splits(const float* part_o, const float* part_ml, const bf16* __restrict__ qg,
                                             bf16* __restrict__ out, int heads, int nh, int head0, int t,
                                             int splits, int nonempty, float* ml, float* wl) {
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const size_t base = ((size_t)t * heads + head0) * splits;  // split 0 of the first head
    for (int i = tid; i < nh * 2 * nonempty; i += NT) {
        const int g = i / (2 * nonempty), r = i % (2 * nonempty);
        ml[i] = __ldcg(part_ml + (base + (size_t)g * splits) * 2 + r);
    }
    __syncthreads();
    for (int g = warp; g < nh; g += NT / 32) {
        const float* hml = ml + g * 2 * nonempty;
        float* w = wl + g * MERGE_WS;
        float mx = -INFINITY;
        for (int s = lane; s < nonempty; s += 32) mx = fmaxf(mx, hml[2 * s]);
        mx = warp_max(mx);
        for (int s = lane; s < nonempty; s += 32) w[s] = exp2f(hml[2 * s] - mx);
        __syncwarp();
        if (lane == 0) {
            float l = 0.f;
            for (int s = 0; s < nonempty; ++s)
                if (hml[2 * s] != -INFINITY) l += w[s] * hml[2 * s + 1];  // (cannot be −∞ in a nonempty split)
            w[ATTN_MAX_SPLITS] = l;
        }
    }
    __syncthreads();
    for (int e4 = tid; e4 < nh * HD / 4; e4 += NT) {
        const int g = e4 * 4 / HD, d = e4 * 4 % HD, head = head0 + g;
        const float4* po = reinterpret_cast<const float4*>(part_o + (base + (size_t)g * splits) * HD + d);
        const float* hml = ml + g * 2 * nonempty;
        const float* w = wl + g * MERGE_WS;
        const uint2 gate_raw =
            *reinterpret_cast<const uint2*>(qg + (size_t)t * 2 * heads * HD + (size_t)head * 2 * HD + HD + d);
        float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
        for (int s0 = 0; s0 < nonempty; s0 += MERGE_BATCH) {
            float4 o[MERGE_BATCH];
#pragma unroll
            for (int i = 0; i < MERGE_BATCH; ++i)
                o[i] = s0 + i < nonempty ? __ldcg(po + (size_t)(s0 + i) * (HD / 4)) : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
            for (int i = 0; i < MERGE_BATCH; ++i) {
                const int s = s0 + i;
                if (s >= nonempty) break;
                if (hml[2 * s] == -INFINITY) continue;
                const float ws = w[s];
                acc.x += ws * o[i].x;
                acc.y += ws * o[i].y;
                acc.z += ws * o[i].z;
                acc.w += ws * o[i].w;
            }
        }
        const float l = w[ATTN_MAX_SPLITS];
        const __nv_bfloat162* gate = reinterpret_cast<const __nv_bfloat162*>(&gate_raw);
        const float2 g01 = __bfloat1622float2(gate[0]), g23 = __bfloat1622float2(gate[1]);
        bf16* dst = out + ((size_t)t * heads + head) * HD + d;
        dst[0] = to_bf16(acc.x / l * sigmoidf_(g01.x));
        dst[1] = to_bf16(acc.y / l * sigmoidf_(g01.y));
        dst[2] = to_bf16(acc.z / l * sigmoidf_(g23.x));
        dst[3] = to_bf16(acc.w / l * sigmoidf_(g23.y));
    }
}

}  // namespace

// One block per (head slot, row): grid (H + Hkv, T), blockDim = HD (a multiple of 32, ≤ 1024).
// Slots 0..H-1 are q heads: norm, RoPE, · q_scale, into q (f32). Slots H.. are kv heads: k is normed
// and rotated into the K cache, v copied into the V cache, both at position start + row (start
// plus *dev_start when a captured step reads its position from device memory).
// RoPE matches the CPU oracle: the angle is the f32 product pos · inv_freq[i] (inv_freq computed on
// the host exactly as the oracle does), its sin/cos and the rotation in f64.
// The decode batch (`seq` given, see DecodeRows in common.cuh): row t is its own sequence, whose
// cache is seq.keys[t] / seq.values[t] and whose position is seq.pos[t].
extern "C" __global__ void attn_prep(const bf16* __restrict__ qg, const bf16* __restrict__ kp,
                                     const bf16* __restrict__ vp, const float* __restrict__ q_norm,
                                     const float* __restrict__ k_norm, const float* __restrict__ inv_freq,
                                     float* __restrict__ q, bf16* kc, bf16* vc, int heads,
                                     int kv_heads, int rotary_dim, int start, const int* __restrict__ dev_start,
                                     float eps, float q_scale, DECODE_ROWS_PARAMS) {
    pdl_begin();
    const DecodeRows seq = DECODE_ROWS;
    __shared__ float scratch[32];
    __shared__ float ys[1024];
    const int hd = blockDim.x, d = threadIdx.x, slot = blockIdx.x, t = blockIdx.y;
    const int pos = seq.row_position(t, first_position(start, dev_start) + t);
    seq.row_cache(t, kc, vc);
    const bool is_q = slot < heads;
    const int kvh = slot - heads;
    const float x = is_q ? to_f32(qg[(size_t)t * 2 * heads * hd + (size_t)slot * 2 * hd + d])
                         : to_f32(kp[((size_t)t * kv_heads + kvh) * hd + d]);
    const float gain = is_q ? q_norm[d] : k_norm[d];
    const float inv = rsqrtf(block_sum(x * x, scratch) / hd + eps);
    float y = x * inv * (1.f + gain);
    ys[d] = y;
    __syncthreads();
    if (d < rotary_dim) {
        const int half = rotary_dim / 2;
        const int i = d < half ? d : d - half;
        const float angle = __fmul_rn((float)pos, inv_freq[i]);
        double sn, cs;
        sincos((double)angle, &sn, &cs);
        y = d < half ? (float)((double)ys[d] * cs - (double)ys[d + half] * sn)
                     : (float)((double)ys[d] * cs + (double)ys[d - half] * sn);
    }
    if (is_q) {
        q[((size_t)t * heads + slot) * hd + d] = y * q_scale;
    } else {
        const size_t c = ((size_t)pos * kv_heads + kvh) * hd + d;
        kc[c] = to_bf16(y);
        vc[c] = vp[((size_t)t * kv_heads + kvh) * hd + d];
    }
}

// Decode attention, one split: CTA (s, y, t) takes keys [s·chunk, min((s+1)·chunk, visible)) of
// query row t (visible = start + t + 1, chunk = ceil(visible / splits) rounded up to a tile) for
// `cta_heads` consecutive q heads of one kv head (its group of G = H / Hkv split into G / cta_heads
// head sets: kv head y / sets, set y % sets), and writes unnormalised partials: part_o [T, H,
// splits, HD] (Σ p·v) and part_ml [T, H, splits, 2] (max in log2 units, Σ p). Splits past the last
// key (s ≥ nonempty) have nothing to do and return at once. The last of a (row, head set)'s
// nonempty splits to finish — counted in merge_counts[t·gridDim.y + y], which it resets to 0 for the
// next launch — merges them (`merge_splits`) into out [T, H·HD] bf16.
// grid (splits, Hkv · G / cta_heads, T), NT threads, dynamic shared memory decode_smem_bytes(HD)
// (attention.rs); cta_heads ≤ MAXH divides G.
// A head's arithmetic is the same whichever CTA takes it and with whichever heads: its scores, its
// softmax and each output's sum over the keys in key order. The head sets only spread a row's work
// over more SMs: with the whole group in one CTA, a tower layer's attention (a few keys, one split)
// ran on two SMs, each thread summing 8 outputs' products from shared memory (13 µs a launch, run 24).
// Scores: lane = key of the tile, warp w takes heads w, w + 8, .. (and runs their softmax).
// Output element e = tid + NT·j (j < MAXO) is (head e / HD, dim e % HD).
// `start` is the cache length before this call (plus *dev_start when a captured step reads its
// position from device memory; the grid is independent of it).
// The decode batch (`seq` given): row t is its own sequence (cache seq.keys[t] / seq.values[t],
// seq.pos[t] keys before this row).
template <int HD>
__device__ __forceinline__ void attn_decode(const float* __restrict__ q, const bf16* kc, const bf16* vc,
                                            float* __restrict__ part_o, float* __restrict__ part_ml,
                                            const bf16* __restrict__ qg, bf16* __restrict__ out,
                                            unsigned* __restrict__ merge_counts, int heads, int kv_heads,
                                            int cta_heads, int start, const int* __restrict__ dev_start, int splits,
                                            DecodeRows seq) {
    pdl_begin();
    static_assert(HD % 32 == 0, "head_dim must be a multiple of 32");
    static_assert(BK * (2 * HD + 4) >= MAXH * ATTN_MAX_SPLITS * 2, "the merge's (m, l) pairs fit in Ks and Vs");
    constexpr int QS = HD + 4;
    constexpr int MAXO = (MAXH * HD + NT - 1) / NT;
    extern __shared__ float4 smem4[];
    float* Qs = reinterpret_cast<float*>(smem4);  // [MAXH][HD]
    float* Ks = Qs + MAXH * HD;                   // [BK][QS]
    float* Vs = Ks + BK * QS;                     // [BK][HD]
    float* Ps = Vs + BK * HD;                     // [MAXH][BK]
    float* row_m = Ps + MAXH * BK;
    float* row_l = row_m + MAXH;
    float* row_a = row_l + MAXH;

    const int sets = heads / kv_heads / cta_heads, s = blockIdx.x, kvh = blockIdx.y / sets, t = blockIdx.z;
    const int head0 = kvh * sets * cta_heads + blockIdx.y % sets * cta_heads, tid = threadIdx.x;
    const int warp = tid / 32, lane = tid % 32, nout = cta_heads * HD;
    const int visible = seq.row_position(t, first_position(start, dev_start) + t) + 1;
    seq.row_cache(t, kc, vc);
    const int chunk = ((visible + splits - 1) / splits + BK - 1) / BK * BK;
    const int nonempty = (visible + chunk - 1) / chunk;  // splits s with s·chunk < visible
    if (s >= nonempty) return;
    const int kbeg = s * chunk, kend = min(visible, kbeg + chunk);
    // Partial of (head head0 + g, split s) of row t.
    const size_t part0 = ((size_t)t * heads + head0) * splits + s;

    // The CTA's heads are contiguous in q.
    const float* qrow = q + ((size_t)t * heads + head0) * HD;
    for (int e = tid * 4; e < nout; e += NT * 4)
        *reinterpret_cast<float4*>(Qs + e) = *reinterpret_cast<const float4*>(qrow + e);
    if (tid < cta_heads) {
        row_m[tid] = -INFINITY;
        row_l[tid] = 0.f;
    }

    float o[MAXO];
#pragma unroll
    for (int j = 0; j < MAXO; ++j) o[j] = 0.f;

    for (int k0 = kbeg; k0 < kend; k0 += BK) {
        __syncthreads();
        load_kv_tile<HD>(kc, vc, kv_heads, kvh, k0, kend, Ks, Vs);
        __syncthreads();

        for (int g = warp; g < cta_heads; g += NT / 32) {
            float acc = 0.f;
#pragma unroll 8
            for (int d = 0; d < HD; d += 4)
                acc += dot4(*reinterpret_cast<const float4*>(Qs + g * HD + d),
                            *reinterpret_cast<const float4*>(Ks + lane * QS + d));
            const float v = k0 + lane < kend ? acc : -INFINITY;
            const float m_old = row_m[g];
            const float m_new = fmaxf(m_old, warp_max(v));  // finite: key k0 < kend is in every tile
            const float p = exp2f(v - m_new);
            const float sum = warp_sum(p);
            Ps[g * BK + lane] = p;
            __syncwarp();
            if (lane == 0) {
                const float a = exp2f(m_old - m_new);
                row_a[g] = a;
                row_l[g] = row_l[g] * a + sum;
                row_m[g] = m_new;
            }
        }
        __syncthreads();

#pragma unroll
        for (int j = 0; j < MAXO; ++j) {
            const int e = tid + j * NT;
            if (e < nout) {
                const int g = e / HD, d = e % HD;
                float acc = o[j] * row_a[g];
#pragma unroll 8
                for (int kk = 0; kk < BK; ++kk) acc += Ps[g * BK + kk] * Vs[kk * HD + d];
                o[j] = acc;
            }
        }
    }

    if (nonempty == 1) {
        // The only split holds every key: its partial is the result, with the bits the merge of
        // one split gives (its weight 2^0 = 1, l and o times 1 exactly; o is never −0). No
        // partials, no count, no merge: the tower's attention (a few keys) always ends here.
#pragma unroll
        for (int j = 0; j < MAXO; ++j) {
            const int e = tid + j * NT;
            if (e < nout) {
                const int g = e / HD, d = e % HD, head = head0 + g;
                const float gate = to_f32(qg[(size_t)t * 2 * heads * HD + (size_t)head * 2 * HD + HD + d]);
                out[((size_t)t * heads + head) * HD + d] = to_bf16(o[j] / row_l[g] * sigmoidf_(gate));
            }
        }
        return;
    }
#pragma unroll
    for (int j = 0; j < MAXO; ++j) {
        const int e = tid + j * NT;
        if (e < nout) part_o[(part0 + (size_t)(e / HD) * splits) * HD + e % HD] = o[j];
    }
    if (tid < cta_heads) {
        part_ml[(part0 + (size_t)tid * splits) * 2] = row_m[tid];
        part_ml[(part0 + (size_t)tid * splits) * 2 + 1] = row_l[tid];
    }

    // The last nonempty split of (t, head set) to get here merges them all. Every thread's partials
    // are made visible device-wide before the block's count (the threadfence reduction pattern).
    __shared__ bool merges;
    __shared__ float merge_weights[MAXH * MERGE_WS];
    __threadfence();
    __syncthreads();
    if (tid == 0) {
        unsigned* count = merge_counts + (size_t)t * gridDim.y + blockIdx.y;
        merges = atomicAdd(count, 1u) == (unsigned)nonempty - 1;
        if (merges) *count = 0u;  // every split of this launch has counted
    }
    __syncthreads();
    if (!merges) return;
    __threadfence();
    merge_splits<HD>(part_o, part_ml, qg, out, heads, cta_heads, head0, t, splits, nonempty, Ks, merge_weights);
}

// One decode entry point per compiled head_dim (attention.rs HEAD_DIMS); the prefill's are
// kernels/attention_prefill.cu's. The `, 1` of __launch_bounds__ lifts ptxas's own register
// target, under which the small variants spilled.
#define ATTN_VARIANTS(HD)                                                                                              \
    extern "C" __global__ void __launch_bounds__(NT, 1) attn_decode_hd##HD(                                            \
        const float* __restrict__ q, const bf16* kc, const bf16* vc, float* __restrict__ part_o,                       \
        float* __restrict__ part_ml, const bf16* __restrict__ qg, bf16* __restrict__ out,                              \
        unsigned* __restrict__ merge_counts, int heads, int kv_heads, int cta_heads, int start,                        \
        const int* __restrict__ dev_start, int splits, DECODE_ROWS_PARAMS) {                                           \
        attn_decode<HD>(q, kc, vc, part_o, part_ml, qg, out, merge_counts, heads, kv_heads, cta_heads, start,          \
                        dev_start, splits, DECODE_ROWS);                                                               \
    }

ATTN_VARIANTS(32)
ATTN_VARIANTS(64)
ATTN_VARIANTS(128)
ATTN_VARIANTS(256)
