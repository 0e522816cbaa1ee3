// `gdn_chunk_intra` of the Gated DeltaNet's chunked prefill; the algorithm, the precision and
// the scratch layouts it shares with the other kernel are in gdn_chunk.cuh.
#include "gdn_chunk.cuh"

// Rows [0, n) × columns [0, cols) of a chunk's row-major f32 matrix (row stride `stride`) into
// registers as float4s: thread (warp, lane) holds rows warp + 8u, columns 4·lane + [0, 4) (zeros
// outside), all eight loads in flight at once, a warp reading 512 contiguous bytes a row.
// Requires cols ≤ 128, cols and stride multiples of 4, src 16-byte aligned.
struct GdnRows {
    float4 v[GDN_CHUNK / 8];
};
__device__ __forceinline__ GdnRows gdn_rows_load(const float* __restrict__ src, size_t stride, int n, int cols) {
    const int warp = threadIdx.x / 32, d = 4 * (threadIdx.x % 32);
    GdnRows x;
#pragma unroll
    for (int u = 0; u < GDN_CHUNK / 8; ++u) {
        const int r = warp + 8 * u;
        x.v[u] = r < n && d < cols ? __ldg(reinterpret_cast<const float4*>(src + (size_t)r * stride + d))
                                   : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    return x;
}

// Four floats as hi and lo bf16 quadruples (`split_bf16`), each packed in 8 bytes.
__device__ __forceinline__ void split_bf16x4(float4 x, uint2& hi, uint2& lo) {
    bf16 h[4], l[4];
    split_bf16(x.x, h[0], l[0]);
    split_bf16(x.y, h[1], l[1]);
    split_bf16(x.z, h[2], l[2]);
    split_bf16(x.w, h[3], l[3]);
    const auto word = [](bf16 a, bf16 b) {
        const __nv_bfloat162 v = __halves2bfloat162(a, b);
        return *reinterpret_cast<const uint32_t*>(&v);
    };
    hi = make_uint2(word(h[0], h[1]), word(h[2], h[3]));
    lo = make_uint2(word(l[0], l[1]), word(l[2], l[3]));
}

// The rows of `gdn_rows_load`, row r scaled by scale[r] where `scale` is given, into shared rows
// of GDN_TILE_STRIDE bf16 as hi + lo, columns [0, padded) (zeros past the loaded ones; padded a
// multiple of 4); with `g_hi`, rows [0, n) also to global rows of stride `g_stride` (lo at
// g_hi + GDN_MAX_DK).
__device__ __forceinline__ void gdn_rows_store(const GdnRows& x, const float* scale, int padded, bf16* hi, bf16* lo,
                                               bf16* __restrict__ g_hi, size_t g_stride, int n) {
    const int warp = threadIdx.x / 32, d = 4 * (threadIdx.x % 32);
    if (d >= padded) return;
#pragma unroll
    for (int u = 0; u < GDN_CHUNK / 8; ++u) {
        const int r = warp + 8 * u;
        float4 v = x.v[u];
        if (scale) {
            const float s = scale[r];
            v = make_float4(v.x * s, v.y * s, v.z * s, v.w * s);
        }
        uint2 h, l;
        split_bf16x4(v, h, l);
        *reinterpret_cast<uint2*>(hi + r * GDN_TILE_STRIDE + d) = h;
        *reinterpret_cast<uint2*>(lo + r * GDN_TILE_STRIDE + d) = l;
        if (g_hi && r < n) {
            *reinterpret_cast<uint2*>(g_hi + r * g_stride + d) = h;
            *reinterpret_cast<uint2*>(g_hi + r * g_stride + GDN_MAX_DK + d) = l;
        }
    }
}

// L [B0 | B1] for the rows [0, 64) of a chunk, with L a lower-triangular 64 × 64 (hi, lo; rows of
// GDN_SQUARE_STRIDE) and B0 [64][n0], B1 [64][n1] (hi, lo; rows of GDN_TILE_STRIDE; n0, n1
// multiples of 16): the columns of both in one pass, walked 32 at a time. Row block rb's k16
// steps stop at the diagonal block (L is zero past it), so warp (p, q) = (warp % 2, warp / 2)
// takes row blocks p and 3 − p (five k16 steps between them, every warp alike) and the 32-column
// groups q, q + 4, … Hands each pair of results to store(i, d, v_d, v_{d+1}), d even, d < n0 + n1
// (d ≥ n0: column d − n0 of B1).
template <typename Store>
__device__ __forceinline__ void gdn_times_tiles(const bf16* LH, const bf16* LL, const bf16* B0H, const bf16* B0L, int n0,
                                                const bf16* B1H, const bf16* B1L, int n1, Store store) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
    const int p = warp % 2, cols = n0 + n1;
#pragma unroll 1
    for (int half = 0; half < 2; ++half) {
        const int rb = half ? 3 - p : p;
#pragma unroll 1
        for (int col0 = 32 * (warp / 2); col0 < cols; col0 += 128) {
            float acc[4][4] = {};
            // Each 16 columns lie wholly in B0 or in B1 (n0 is a multiple of 16).
            const bf16* bh[2];
            const bf16* bl[2];
#pragma unroll
            for (int s = 0; s < 2; ++s) {
                const int col = col0 + 16 * s;
                bh[s] = col < n0 ? B0H + col : B1H + (col - n0);
                bl[s] = col < n0 ? B0L + col : B1L + (col - n0);
            }
            const bool pair2 = col0 + 16 < cols;
#pragma unroll 1
            for (int k0 = 0; k0 <= 16 * rb; k0 += 16) {
                uint32_t ah[4], al[4];
                const int a_at = (16 * rb + lane % 16) * GDN_SQUARE_STRIDE + k0 + 8 * (lane / 16);
                ldmatrix_x4(ah, LH + a_at);
                ldmatrix_x4(al, LL + a_at);
                const int b_at = (k0 + lane % 8 + 8 * ((lane / 8) % 2)) * GDN_TILE_STRIDE + 8 * (lane / 16);
#pragma unroll
                for (int s = 0; s < 2; ++s) {
                    if (s == 1 && !pair2) break;
                    uint32_t fh[4], fl[4];
                    ldmatrix_x4_trans(fh, bh[s] + b_at);
                    ldmatrix_x4_trans(fl, bl[s] + b_at);
#pragma unroll
                    for (int h = 0; h < 2; ++h)
                        mma_split_k16(acc[2 * s + h], ah, al, fh[2 * h], fh[2 * h + 1], fl[2 * h], fl[2 * h + 1]);
                }
            }
#pragma unroll
            for (int t = 0; t < 4; ++t) {
                const int d = col0 + 8 * t + 2 * c;
                if (d >= cols) break;
                store(16 * rb + g, d, acc[t][0], acc[t][1]);
                store(16 * rb + g + 8, d, acc[t][2], acc[t][3]);
            }
        }
    }
}

// T = (I + A)⁻¹ for the strictly lower 64 × 64 A (f32, rows of GDN_SQ_STRIDE) in 16 × 16 blocks,
// into T's lower blocks (f32, block (b, c) at tb + (b(b+1)/2 + c)·256, rows of 16) with the
// help of 3 × 256 floats of scratch:
//   T_bb = (I + A_bb)⁻¹ by forward substitution (a column per thread of the first two warps);
//   T_bc = −T_bb Σ_{c≤m<b} A_bm T_mc, the blocks at distance b − c = 1, 2, 3 in turn.
// Every sum in increasing index. All threads call it; it starts and ends with a barrier.
__device__ __forceinline__ int gdn_tblock(int b, int c) { return (b * (b + 1) / 2 + c) * 256; }
__device__ __forceinline__ void gdn_invert_unit_lower(const float* A, float* tb, float* scratch) {
    __syncthreads();
    if (threadIdx.x < GDN_CHUNK) {
        const int b = threadIdx.x / 16, col = threadIdx.x % 16;
        const float* a = A + 16 * b * GDN_SQ_STRIDE + 16 * b;
        float x[16];
#pragma unroll
        for (int r = 0; r < 16; ++r) {
            float s = 0.f;
#pragma unroll
            for (int k = 0; k < r; ++k) s = fmaf(a[r * GDN_SQ_STRIDE + k], x[k], s);
            x[r] = (r == col ? 1.f : 0.f) - s;
        }
        float* t = tb + gdn_tblock(b, b);
#pragma unroll
        for (int r = 0; r < 16; ++r) t[r * 16 + col] = x[r];
    }
    const int r = threadIdx.x / 16, col = threadIdx.x % 16;
    for (int dist = 1; dist < 4; ++dist) {
        __syncthreads();
        // P_b = Σ_{c≤m<b} A_bm T_mc, c = b − dist, entry (r, col) of each block b ≥ dist.
        for (int b = dist; b < 4; ++b) {
            const int c = b - dist;
            const float* a = A + (16 * b + r) * GDN_SQ_STRIDE;
            float s = 0.f;
            for (int m = c; m < b; ++m) {
                const float* t = tb + gdn_tblock(m, c);
#pragma unroll
                for (int k = 0; k < 16; ++k) s = fmaf(a[16 * m + k], t[k * 16 + col], s);
            }
            scratch[(b - dist) * 256 + r * 16 + col] = s;
        }
        __syncthreads();
        // T_bc = −T_bb P_b (T_bb unit lower: k ≤ r).
        for (int b = dist; b < 4; ++b) {
            const float* tbb = tb + gdn_tblock(b, b) + r * 16;
            const float* pb = scratch + (b - dist) * 256;
            float s = 0.f;
            for (int k = 0; k <= r; ++k) s = fmaf(tbb[k], pb[k * 16 + col], s);
            tb[gdn_tblock(b, b - dist) + r * 16 + col] = -s;
        }
    }
    __syncthreads();
}

// Grid (Hv, chunks of the longest sequence, sequences), 256 threads: one CTA per value head and
// chunk (CTAs past their sequence's end leave at once). Rows of a short last chunk are padded with
// q = k = v = 0, β = 0, g = 0, which the reference's padded chunk equals; only rows < n are
// written. The first value head of each key head also writes the chunk's q and k (hi, lo).
// Steps: K, Q as hi + lo → the grams (A to shared, C out) → T = (I + A)⁻¹ in blocks (into Q's
// place) while V's and K's loads are in flight → [U | W] = (T diag β) [V | diag(e^γ) K].
// Dynamic shared memory (bytes), TS = GDN_TILE_STRIDE bf16:
//   K hi, K lo [64][TS], then e^γ K | Q hi, Q lo [64][TS], then T's blocks (f32), then V hi, V lo
//   | A f32 [64][GDN_SQ_STRIDE], then T hi, T lo bf16 [64][GDN_SQUARE_STRIDE] | γ, β, e^γ f32 [64 each]
// A row of TS (or GDN_SQUARE_STRIDE) bf16 is an odd number of 16-byte units: the eight row
// addresses of an ldmatrix fall in distinct bank groups.
// Requires Dk ≤ 128, Dv ≤ 128, Dk % 4 == 0, Dv % 4 == 0 (float4 rows).
extern "C" __global__ void __launch_bounds__(GDN_THREADS, 2)
    gdn_chunk_intra(const float* __restrict__ prep, const float* __restrict__ gates, bf16* __restrict__ qk_out,
                    bf16* __restrict__ w_out, float* __restrict__ u_out, bf16* __restrict__ c_out,
                    float* __restrict__ decay_out, int rows, int key_heads, int value_heads, int key_dim,
                    int value_dim, const int* __restrict__ seq_starts) {
    static_assert(GDN_THREADS == 256 && GDN_CHUNK == 64, "8 warps; 16 × 16 blocks of T, one entry a thread");
    pdl_begin();
    extern __shared__ __align__(16) unsigned char smem_bytes[];
    const int dk = key_dim, dv = value_dim, hv = value_heads;
    const int dkp = (dk + 15) & ~15, dvp = (dv + 15) & ~15;
    const int group = value_heads / key_heads, j = blockIdx.x, kh = j / group;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
    int t_begin, t_end;
    gdn_sequence_rows(seq_starts, rows, blockIdx.z, t_begin, t_end);
    const int t0 = t_begin + GDN_CHUNK * blockIdx.y;
    if (t0 >= t_end) return;  // the whole block, before any barrier
    const int n = min(GDN_CHUNK, t_end - t0);
    const int channels = 2 * key_heads * dk + value_heads * dv;

    bf16* KH = reinterpret_cast<bf16*>(smem_bytes);
    bf16* KL = KH + GDN_CHUNK * GDN_TILE_STRIDE;
    bf16* QH = KL + GDN_CHUNK * GDN_TILE_STRIDE;  // then T's blocks, then V hi
    bf16* QL = QH + GDN_CHUNK * GDN_TILE_STRIDE;  // V lo
    float* A = reinterpret_cast<float*>(QL + GDN_CHUNK * GDN_TILE_STRIDE);
    bf16* TH = reinterpret_cast<bf16*>(A);  // once T is solved
    bf16* TL = TH + GDN_CHUNK * GDN_SQUARE_STRIDE;
    float* gam = A + GDN_SQUARE_FLOATS;
    float* beta = gam + GDN_CHUNK;
    float* egam = beta + GDN_CHUNK;
    float* tb = reinterpret_cast<float*>(QH);  // 10 blocks of 256, then 3 × 256 of scratch

    const size_t row0 = (size_t)t0 * channels;
    const size_t qk_stride = (size_t)key_heads * 4 * GDN_MAX_DK;
    bf16* qk_rows = j % group == 0 ? qk_out + (size_t)t0 * qk_stride + (size_t)kh * 4 * GDN_MAX_DK : nullptr;
    {
        const GdnRows k_rows = gdn_rows_load(prep + row0 + (size_t)(key_heads + kh) * dk, channels, n, dk);
        const GdnRows q_rows = gdn_rows_load(prep + row0 + (size_t)kh * dk, channels, n, dk);
        gdn_rows_store(k_rows, nullptr, dkp, KH, KL, qk_rows ? qk_rows + 2 * GDN_MAX_DK : nullptr, qk_stride, n);
        gdn_rows_store(q_rows, nullptr, dkp, QH, QL, qk_rows, qk_stride, n);
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
#pragma unroll
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

    // The grams: warp (rb, ch) = (warp % 4, warp / 4) owns rows 16rb + [0, 16) and columns
    // 32ch + [0, 32) (four n8 tiles) of both. Blocks wholly above the diagonal keep nothing:
    // their A entries are never read and their C entries are zeros.
    {
        const int rb = warp % 4, ch = warp / 4;
        float kk[4][4] = {}, qk[4][4] = {};
        if (32 * ch <= 16 * rb + 15) {
#pragma unroll 1
            for (int k0 = 0; k0 < dkp; k0 += 16) {
                uint32_t akh[4], akl[4], aqh[4], aql[4];
                const int a_at = (16 * rb + lane % 16) * GDN_TILE_STRIDE + k0 + 8 * (lane / 16);
                ldmatrix_x4(akh, KH + a_at);
                ldmatrix_x4(akl, KL + a_at);
                ldmatrix_x4(aqh, QH + a_at);
                ldmatrix_x4(aql, QL + a_at);
#pragma unroll
                for (int p = 0; p < 2; ++p) {
                    uint32_t bh[4], bl[4];
                    const int b_at =
                        (32 * ch + 16 * p + lane % 8 + 8 * (lane / 16)) * GDN_TILE_STRIDE + k0 + 8 * ((lane / 8) % 2);
                    ldmatrix_x4(bh, KH + b_at);
                    ldmatrix_x4(bl, KL + b_at);
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        mma_split_k16(kk[2 * p + h], akh, akl, bh[2 * h], bh[2 * h + 1], bl[2 * h], bl[2 * h + 1]);
                        mma_split_k16(qk[2 * p + h], aqh, aql, bh[2 * h], bh[2 * h + 1], bl[2 * h], bl[2 * h + 1]);
                    }
                }
            }
        }
        // The decays only where they are kept: e^{γ_i−γ_m} overflows above the diagonal.
#pragma unroll
        for (int t = 0; t < 4; ++t)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int i = 16 * rb + g + 8 * h, m = 32 * ch + 8 * t + 2 * c;
                const float d0 = m <= i ? expf(gam[i] - gam[m]) : 0.f;
                const float d1 = m + 1 <= i ? expf(gam[i] - gam[m + 1]) : 0.f;
                A[i * GDN_SQ_STRIDE + m] = m < i ? beta[i] * (kk[t][2 * h] * d0) : 0.f;
                A[i * GDN_SQ_STRIDE + m + 1] = m + 1 < i ? beta[i] * (kk[t][2 * h + 1] * d1) : 0.f;
                if (i < n) {
                    bf16 h0, l0, h1, l1;
                    split_bf16(qk[t][2 * h] * d0, h0, l0);
                    split_bf16(qk[t][2 * h + 1] * d1, h1, l1);
                    bf16* c_row = c_out + ((size_t)(t0 + i) * hv + j) * 2 * GDN_CHUNK + m;
                    *reinterpret_cast<__nv_bfloat162*>(c_row) = __halves2bfloat162(h0, h1);
                    *reinterpret_cast<__nv_bfloat162*>(c_row + GDN_CHUNK) = __halves2bfloat162(l0, l1);
                }
            }
    }

    // V's and K's loads in flight while T is solved in Q's place (K again, from L2: scaled by e^γ
    // from its f32 values, not from its split); then the left operand T diag(β) over A.
    const float* k_src = prep + row0 + (size_t)(key_heads + kh) * dk;
    const GdnRows v_rows = gdn_rows_load(prep + row0 + (size_t)2 * key_heads * dk + (size_t)j * dv, channels, n, dv);
    const GdnRows k_rows = gdn_rows_load(k_src, channels, n, dk);
    gdn_invert_unit_lower(A, tb, tb + 10 * 256);
#pragma unroll 1
    for (int e = threadIdx.x; e < GDN_CHUNK * GDN_CHUNK; e += GDN_THREADS) {
        const int i = e / GDN_CHUNK, m = e % GDN_CHUNK;
        const float t = i / 16 >= m / 16 ? tb[gdn_tblock(i / 16, m / 16) + (i % 16) * 16 + m % 16] : 0.f;
        split_bf16(t * beta[m], TH[i * GDN_SQUARE_STRIDE + m], TL[i * GDN_SQUARE_STRIDE + m]);
    }
    __syncthreads();
    gdn_rows_store(v_rows, nullptr, dvp, QH, QL, nullptr, 0, n);
    gdn_rows_store(k_rows, egam, dkp, KH, KL, nullptr, 0, n);
    __syncthreads();

    // [U | W] = T diag(β) [V | diag(e^γ) K] in one pass.
    float* u_head = u_out + (size_t)j * dv;
    bf16* w_head = w_out + (size_t)j * 2 * GDN_MAX_DK;
    gdn_times_tiles(TH, TL, QH, QL, dvp, KH, KL, dkp, [&](int i, int d, float v0, float v1) {
        if (i >= n) return;
        if (d < dvp) {
            if (d >= dv) return;  // dv is even (a multiple of 4), so d + 1 < dv too
            *reinterpret_cast<float2*>(u_head + (size_t)(t0 + i) * hv * dv + d) = make_float2(v0, v1);
            return;
        }
        bf16 h0, l0, h1, l1;
        split_bf16(v0, h0, l0);
        split_bf16(v1, h1, l1);
        bf16* w_row = w_head + (size_t)(t0 + i) * hv * 2 * GDN_MAX_DK + (d - dvp);
        *reinterpret_cast<__nv_bfloat162*>(w_row) = __halves2bfloat162(h0, h1);
        *reinterpret_cast<__nv_bfloat162*>(w_row + GDN_MAX_DK) = __halves2bfloat162(l0, l1);
    });
}
