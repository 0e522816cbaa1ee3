// Prefill attention on tensor cores (`attn_prefill_hd*`): causal GQA attention of many query
// rows at once, online softmax, · sigmoid(gate), one rounding to bf16. Layouts are
// kernels/attention.cu's: q [T, H, HD] f32 (normed, rotated, · scale·log2(e): scores in log2
// units), qg [T, H·2·HD] bf16 (per head HD query then HD gate columns), the K/V cache
// [capacity, Hkv, HD] bf16 each, out [T, H·HD] bf16.
//
// Work split. For kv head `kvh` the query rows are the flattened (t, g) pairs r = t·G + g (the
// G = H / Hkv q heads that share it, so one K/V tile serves all of them). CTA (bx, kvh) takes
// rows bx·64 .. +63, four warps of 16; it walks keys 0 ..= the causal limit of its last row in
// tiles of 64 (keys from 0, whatever the CTA).
//
// Arithmetic on mma.sync m16n8k16 bf16 with f32 accumulators, kept close to f32: K and V are bf16
// already (exact operands); q (f32) and the probabilities p (f32) enter as two bf16 each, hi =
// bf16(v) and lo = bf16(v − hi), 16 significant bits, so S = q_hi·K + q_lo·K and O += p_hi·V +
// p_lo·V (two MMAs each). The softmax statistics (running max m, sum l) and the rescaling stay
// f32, as in the CPU oracle.
//
// Row invariance (a prompt's bits do not depend on the prompts or rows beside it): every sum
// of a row uses only that row's values, in an order fixed by the key and head-dim positions
// alone (k16 steps in increasing order, hi before lo; key tiles in increasing order). A tile
// past a row's causal limit (its CTA walks further for a later row) changes nothing: its
// scores are −∞, so the max stays, the rescale is exp2(0) = 1, and p = 0 adds +0 to l and O.
//
// Pipelining: K and V have one buffer each, filled by cp.async. Tile j's V loads while its scores
// are computed and its softmax taken; tile j + 1's K loads while tile j's P·V runs.
//
// Shared memory (bf16, rows padded by 8 so that ldmatrix's 8 rows fall in 8 bank groups):
// Q_hi, Q_lo [64][HD + 8], K, V [64][HD + 8]: 512 · (HD + 8) bytes (attention.rs
// `prefill_smem_bytes`; 132 KiB at HD = 256).
//
// Several prompts in one launch (`seqs` given, grid.z = prompts): prompt z's rows are rows
// seqs[5z + 2] .. + seqs[5z + 3] of q, qg and out, its cache keys seqs[5z], values seqs[5z + 1],
// its first position seqs[5z + 4] (rows and start from the arguments are then unused).
#include "common.cuh"
#include "kernel_constants.cuh"  // ATTN_PREFILL_* (src/backend/cuda/kernel_constants.rs)
#include "mma.cuh"

namespace {

constexpr int NT = ATTN_PREFILL_THREADS;  // four warps
constexpr int BM = ATTN_PREFILL_ROWS;     // query rows per CTA, 16 a warp
constexpr int BK = ATTN_PREFILL_KEYS;     // keys per tile
static_assert(NT == 128 && BM == 64 && BK == 64, "the fragment walk below assumes 4 warps × 16 rows, 64 keys");

// Keys k0 .. k0 + BK of kv head `kvh` of `cache` into `dst` [BK][HD + 8] by cp.async (one group);
// keys at or past `kend` are zero-filled.
template <int HD>
__device__ __forceinline__ void load_tile(bf16* dst, const bf16* __restrict__ cache, int kv_heads, int kvh, int k0,
                                          int kend) {
    constexpr int CH = HD / 8, S = HD + 8;
#pragma unroll
    for (int i = 0; i < BK * CH / NT; ++i) {
        const int idx = threadIdx.x + i * NT, key = idx / CH, c = idx % CH;
        const bool ok = k0 + key < kend;
        const bf16* src = ok ? cache + ((size_t)(k0 + key) * kv_heads + kvh) * HD + c * 8 : cache;
        cp_async16_zfill(dst + key * S + c * 8, src, ok);
    }
    cp_async_commit();
}

}  // namespace

template <int HD>
__device__ __forceinline__ void attn_prefill_mma(const float* __restrict__ q, const bf16* __restrict__ qg,
                                                 const bf16* __restrict__ kc, const bf16* __restrict__ vc,
                                                 bf16* __restrict__ out, int rows, int heads, int kv_heads,
                                                 int start, const unsigned long long* __restrict__ seqs) {
    pdl_begin();
    static_assert(HD % 16 == 0 && (BK * HD / 8) % NT == 0, "head_dim must be a multiple of 16");
    constexpr int S = HD + 8;  // padded row stride (bf16)
    constexpr int NO = HD / 8;  // n8 tiles of the output
    if (seqs) {
        const unsigned long long* sq = seqs + 5 * blockIdx.z;
        kc = reinterpret_cast<const bf16*>(sq[0]);
        vc = reinterpret_cast<const bf16*>(sq[1]);
        const size_t row0 = sq[2];
        rows = (int)sq[3];
        start = (int)sq[4];
        q += row0 * heads * HD;
        qg += row0 * 2 * heads * HD;
        out += row0 * heads * HD;
    }
    extern __shared__ __align__(16) unsigned char smem[];
    bf16* Qh = reinterpret_cast<bf16*>(smem);
    bf16* Ql = Qh + BM * S;
    bf16* Ks = Ql + BM * S;
    bf16* Vs = Ks + BK * S;

    const int group = heads / kv_heads, kvh = blockIdx.y, r0 = blockIdx.x * BM, tid = threadIdx.x;
    const int nrows = rows * group;
    if (r0 >= nrows) return;
    const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3;
    const int nkeys = start + (min(r0 + BM, nrows) - 1) / group + 1;  // keys the last row sees
    const int total = start + rows;                                     // keys in the cache

    load_tile<HD>(Ks, kc, kv_heads, kvh, 0, total);
    // Q as hi + lo bf16; rows past the prompt are zero (their outputs are never written).
    for (int idx = tid; idx < BM * HD / 4; idx += NT) {
        const int r = idx / (HD / 4), d = (idx % (HD / 4)) * 4, fr = r0 + r;
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (fr < nrows) {
            const int t = fr / group, head = kvh * group + fr % group;
            v = *reinterpret_cast<const float4*>(q + ((size_t)t * heads + head) * HD + d);
        }
        const float f[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) split_bf16(f[e], Qh[r * S + d + e], Ql[r * S + d + e]);
    }

    // This thread's rows of the warp's 16: g and g + 8; their causal limits (−1: past the prompt).
    int limit[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int fr = r0 + warp * 16 + g + 8 * h;
        limit[h] = fr < nrows ? start + fr / group : -1;
    }
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    float o[NO][4];
#pragma unroll
    for (int j = 0; j < NO; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;

    const int qrow = warp * 16 + (lane & 15), qcol = (lane >> 4) * 8;  // this lane's ldmatrix row of Q
    for (int k0 = 0; k0 < nkeys; k0 += BK) {
        load_tile<HD>(Vs, vc, kv_heads, kvh, k0, total);
        cp_async_wait<1>();  // K landed (V may still be in flight)
        __syncthreads();     // ... for every thread; Q is visible

        // Scores of the warp's 16 rows × 64 keys: s[t] is n8 tile t (keys k0 + 8t ..).
        float s[BK / 8][4];
#pragma unroll
        for (int t = 0; t < BK / 8; ++t) s[t][0] = s[t][1] = s[t][2] = s[t][3] = 0.f;
#pragma unroll 2
        for (int kd = 0; kd < HD / 16; ++kd) {
            uint32_t ah[4], al[4];
            ldmatrix_x4(ah, Qh + qrow * S + kd * 16 + qcol);
            ldmatrix_x4(al, Ql + qrow * S + kd * 16 + qcol);
#pragma unroll
            for (int p = 0; p < BK / 16; ++p) {
                // matrix i = lane / 8: keys 16p + 8·(i / 2) .., head-dim half i % 2 of this k16 step.
                uint32_t b[4];
                const int i = lane >> 3;
                ldmatrix_x4(b, Ks + (16 * p + (i >> 1) * 8 + (lane & 7)) * S + kd * 16 + (i & 1) * 8);
                mma_bf16_k16(s[2 * p], ah[0], ah[1], ah[2], ah[3], b[0], b[1]);
                mma_bf16_k16(s[2 * p], al[0], al[1], al[2], al[3], b[0], b[1]);
                mma_bf16_k16(s[2 * p + 1], ah[0], ah[1], ah[2], ah[3], b[2], b[3]);
                mma_bf16_k16(s[2 * p + 1], al[0], al[1], al[2], al[3], b[2], b[3]);
            }
        }

        // Online softmax of rows g (h = 0: s[t][0..1]) and g + 8 (h = 1: s[t][2..3]); the four
        // lanes c of a row hold its 64 keys between them.
        float alpha[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float mx = -INFINITY;
#pragma unroll
            for (int t = 0; t < BK / 8; ++t)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int key = k0 + 8 * t + 2 * c + e;
                    float& v = s[t][2 * h + e];
                    v = key <= limit[h] ? v : -INFINITY;
                    mx = fmaxf(mx, v);
                }
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float m_new = fmaxf(m[h], mx);
            const float m_use = m_new == -INFINITY ? 0.f : m_new;  // a row that has seen no key yet
            float sum = 0.f;
#pragma unroll
            for (int t = 0; t < BK / 8; ++t)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    float& v = s[t][2 * h + e];
                    v = exp2f(v - m_use);
                    sum += v;
                }
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            sum += __shfl_xor_sync(0xffffffffu, sum, 2);
            alpha[h] = exp2f(m[h] - m_use);
            l[h] = l[h] * alpha[h] + sum;
            m[h] = m_new;
        }
#pragma unroll
        for (int j = 0; j < NO; ++j) {
            o[j][0] *= alpha[0];
            o[j][1] *= alpha[0];
            o[j][2] *= alpha[1];
            o[j][3] *= alpha[1];
        }

        __syncthreads();  // every warp is done reading K
        if (k0 + BK < nkeys) load_tile<HD>(Ks, kc, kv_heads, kvh, k0 + BK, total);
        else cp_async_commit();  // an empty group keeps the wait count below uniform
        cp_async_wait<1>();      // V landed
        __syncthreads();

        // O += P · V, k16 step kk over keys k0 + 16kk ..: P's A fragment is the score tiles 2kk and
        // 2kk + 1 of this thread (the m16n8 accumulator layout is the m16k16 A layout).
#pragma unroll
        for (int kk = 0; kk < BK / 16; ++kk) {
            const float* s0 = s[2 * kk];
            const float* s1 = s[2 * kk + 1];
            uint32_t ph[4], pl[4];
            const float pv[4][2] = {{s0[0], s0[1]}, {s0[2], s0[3]}, {s1[0], s1[1]}, {s1[2], s1[3]}};
#pragma unroll
            for (int a = 0; a < 4; ++a) {
                ph[a] = pack_bf16x2(pv[a][0], pv[a][1]);
                const __nv_bfloat162 hb = *reinterpret_cast<const __nv_bfloat162*>(&ph[a]);
                pl[a] = pack_bf16x2(pv[a][0] - __low2float(hb), pv[a][1] - __high2float(hb));
            }
#pragma unroll
            for (int j = 0; j < NO; j += 2) {
                // matrix i = lane / 8: keys 16kk + 8·(i % 2) .., head dims 8(j + i / 2) .., transposed.
                uint32_t b[4];
                const int i = lane >> 3;
                ldmatrix_x4_trans(b, Vs + (16 * kk + (i & 1) * 8 + (lane & 7)) * S + (j + (i >> 1)) * 8);
                mma_bf16_k16(o[j], ph[0], ph[1], ph[2], ph[3], b[0], b[1]);
                mma_bf16_k16(o[j], pl[0], pl[1], pl[2], pl[3], b[0], b[1]);
                mma_bf16_k16(o[j + 1], ph[0], ph[1], ph[2], ph[3], b[2], b[3]);
                mma_bf16_k16(o[j + 1], pl[0], pl[1], pl[2], pl[3], b[2], b[3]);
            }
        }
        __syncthreads();  // every warp is done reading V before the next tile's V lands there
    }
    cp_async_wait<0>();

    // Epilogue: normalise, · sigmoid(gate), one rounding to bf16 (pairs of columns 8j + 2c).
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int fr = r0 + warp * 16 + g + 8 * h;
        if (fr >= nrows) continue;
        const int t = fr / group, head = kvh * group + fr % group;
        const float inv_l = 1.f / l[h];
        const bf16* gate = qg + (size_t)t * 2 * heads * HD + (size_t)head * 2 * HD + HD;
        bf16* dst = out + ((size_t)t * heads + head) * HD;
#pragma unroll
        for (int j = 0; j < NO; ++j) {
            const int d = 8 * j + 2 * c;
            const float2 gv = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(gate + d));
            *reinterpret_cast<__nv_bfloat162*>(dst + d) = __floats2bfloat162_rn(
                o[j][2 * h] * inv_l * sigmoidf_(gv.x), o[j][2 * h + 1] * inv_l * sigmoidf_(gv.y));
        }
    }
}

// One entry point per compiled head_dim (attention.rs HEAD_DIMS); grid (ceil(T·G / 64), Hkv[, prompts]).
#define ATTN_PREFILL(HD)                                                                                   \
    extern "C" __global__ void __launch_bounds__(NT, 1) attn_prefill_hd##HD(                               \
        const float* __restrict__ q, const bf16* __restrict__ qg, const bf16* __restrict__ kc,             \
        const bf16* __restrict__ vc, bf16* __restrict__ out, int rows, int heads, int kv_heads, int start,  \
        const unsigned long long* __restrict__ seqs) {                                                     \
        attn_prefill_mma<HD>(q, qg, kc, vc, out, rows, heads, kv_heads, start, seqs);                      \
    }

ATTN_PREFILL(32)
ATTN_PREFILL(64)
ATTN_PREFILL(128)
ATTN_PREFILL(256)
