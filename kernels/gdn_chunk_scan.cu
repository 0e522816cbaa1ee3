// `gdn_chunk_scan` of the Gated DeltaNet's chunked prefill; the algorithm, the precision and
// the scratch layouts it shares with the other kernel are in gdn_chunk.cuh.
#include "gdn_chunk.cuh"

// Element (r, col) of a shared bf16 tile with rows of `row` elements (a multiple of 64), its
// 16-byte units XOR-swizzled by r % 8: the eight rows an ldmatrix reads at one column fall in
// distinct bank groups, with no padding.
__device__ __forceinline__ int gdn_swz(int r, int col, int row) { return r * row + (((col >> 3) ^ (r & 7)) << 3) + (col & 7); }

// Starts copying rows [0, n) of a chunk's bf16 hi and lo rows (global row i at src + i·stride,
// lo `lo_at` elements after hi; `units` ≤ 16 units of 16 bytes each) into swizzled shared tiles
// hi, lo with rows of `row` elements; rows [n, 64) are zero-filled. The caller commits.
__device__ __forceinline__ void gdn_tile_async(bf16* hi, bf16* lo, int row, const bf16* src, size_t stride, int lo_at,
                                               int n, int units) {
    const int q = threadIdx.x % 16;
    if (q >= units) return;
    for (int i = threadIdx.x / 16; i < GDN_CHUNK; i += GDN_THREADS / 16) {
        const bool ok = i < n;
        const bf16* from = ok ? src + (size_t)i * stride + 8 * q : src;
        cp_async16_zfill(hi + gdn_swz(i, 8 * q, row), from, ok);
        cp_async16_zfill(lo + gdn_swz(i, 8 * q, row), ok ? from + lo_at : src, ok);
    }
}

// One k16 step (k0) of acc += A B for the scan's warp (rb, nt): rows 16rb + [0, 16) of A (hi at
// a, lo at a + lo_at; swizzled rows of ROW elements) times the n8 column tile nt of B, given as
// Bᵀ (hi at bt, lo at bt + bt_lo_at; swizzled rows of ROW).
template <int ROW>
__device__ __forceinline__ void gdn_scan_step(float (&acc)[3][4], const bf16* a, int lo_at, const bf16* bt, int bt_lo_at,
                                              int rb, int nt, int k0) {
    const int lane = threadIdx.x % 32;
    uint32_t ah[4], al[4], b[4];
    const int ar = 16 * rb + lane % 16, ac = k0 + 8 * (lane / 16);
    ldmatrix_x4(ah, a + gdn_swz(ar, ac, ROW));
    ldmatrix_x4(al, a + lo_at + gdn_swz(ar, ac, ROW));
    // Lanes 0–15 address Bᵀ hi, 16–31 Bᵀ lo: b = {hi k0, hi k0 + 8, lo k0, lo k0 + 8}.
    const int bn = 8 * nt + lane % 8, bk = k0 + 8 * ((lane / 8) % 2);
    ldmatrix_x4(b, bt + (lane / 16) * bt_lo_at + gdn_swz(bn, bk, ROW));
    mma_split3_k16(acc, ah, al, b[0], b[1], b[2], b[3]);
}

// Grid (Hv, ceil(Dv / GDN_SCAN_BV), sequences), 256 threads: one CTA per value head and
// GDN_SCAN_BV = 16 value columns of one sequence (the delta rule never mixes value columns),
// walking the sequence's chunks in order. The state tile S [Dk][16] lives in the MMA
// accumulators of the state update (warp w: rows 16w + [0, 16), both n8 tiles) and, as hi + lo,
// transposed in shared memory for the products that read it.
// Each chunk is three phases, each reading one 64-row tile: W (V_new = U − W S), Q (O = e^γ ⊙
// (Q S) + C V_new), K (S ← e^{γ_n} S + Kᵀ (e^{γ_n−γ} ⊙ V_new)). A phase's tile and the next
// chunk's C are fetched by cp.async while the phase before computes: two tile buffers, taken in
// turn; U and the decays come straight to registers one phase ahead. In the first two phases
// warp (rb, nt) = (warp % 4, warp / 4) owns rows 16rb + [0, 16) and value columns 8nt + [0, 8).
// Dynamic shared memory (bf16, every tile swizzled by `gdn_swz`):
//   X [2][hi, lo][64][GDN_MAX_DK] (W, Q, K, W, … in turn) | C [hi, lo][64][64]
//   | Sᵀ [hi, lo][16][GDN_MAX_DK] | V_newᵀ [hi, lo][16][64] | (e^{γ_n−γ} ⊙ V_new)ᵀ [hi, lo][16][64]
// 96 KiB: within the 99 KiB sm_89 and sm_120 grant a block, two blocks an SM on sm_90.
// Requires Dk ≤ 128 and Dk % 4 == 0.
extern "C" __global__ void __launch_bounds__(GDN_THREADS, 2)
    gdn_chunk_scan(const bf16* __restrict__ qk_in, const bf16* __restrict__ w_in, const float* __restrict__ u_in,
                   const bf16* __restrict__ c_in, const float* __restrict__ decay_in, float* __restrict__ state,
                   float* __restrict__ out, int rows, int key_heads, int value_heads, int key_dim, int value_dim,
                   const unsigned long long* __restrict__ states, const int* __restrict__ seq_starts) {
    static_assert(GDN_SCAN_BV == 16 && GDN_THREADS == 256 && GDN_MAX_DK == 128, "8 warps × 16 state rows");
    pdl_begin();
    extern __shared__ __align__(16) unsigned char smem_bytes[];
    const int dk = key_dim, dv = value_dim, hv = value_heads, dkp = (dk + 15) & ~15;
    const int j = blockIdx.x, kh = j / (value_heads / key_heads);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
    const int rb = warp % 4, nt = warp / 4;
    const int v0 = blockIdx.y * GDN_SCAN_BV, v_cols = min(GDN_SCAN_BV, dv - v0);
    constexpr int TILE = GDN_CHUNK * GDN_MAX_DK, SQ = GDN_CHUNK * GDN_CHUNK, ST_N = GDN_SCAN_BV * GDN_MAX_DK,
                  VT_N = GDN_SCAN_BV * GDN_CHUNK;

    bf16* X = reinterpret_cast<bf16*>(smem_bytes);  // [2][2][TILE]
    bf16* C = X + 4 * TILE;                          // [2][SQ]
    bf16* ST = C + 2 * SQ;                           // [2][ST_N]
    bf16* VN = ST + 2 * ST_N;                        // [2][VT_N]
    bf16* VD = VN + 2 * VT_N;                        // [2][VT_N]
    auto tile = [&](int phase) { return X + (phase & 1) * 2 * TILE; };

    int t_begin, t_end;
    gdn_sequence_rows(seq_starts, rows, blockIdx.z, t_begin, t_end);
    if (states) state = reinterpret_cast<float*>(states[blockIdx.z]);
    float* s_global = state + (size_t)j * dk * dv;
    const size_t qk_stride = (size_t)key_heads * 4 * GDN_MAX_DK, w_stride = (size_t)hv * 2 * GDN_MAX_DK;
    const bf16* q_in = qk_in + (size_t)kh * 4 * GDN_MAX_DK;
    const bf16* k_in = q_in + 2 * GDN_MAX_DK;
    const int units = dkp / 8;

    // What a lane of phases 1 and 2 reads of the chunk at t0: U at its accumulator positions
    // (rows i = 16rb + g + 8h, columns 8nt + 2c + e), e^γ and e^{γ_n−γ} at its rows, and e^{γ_n}.
    struct Ahead {
        float u[2][2], eg[2], fd[2], e_last;
    };
    auto read_ahead = [&](int t0) {
        Ahead a;
        const int n = min(GDN_CHUNK, t_end - t0);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int i = 16 * rb + g + 8 * h;
            const size_t at = (size_t)(t0 + i) * hv + j;
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int v = 8 * nt + 2 * c + e;
                a.u[h][e] = i < n && v < v_cols ? __ldg(u_in + at * dv + v0 + v) : 0.f;
            }
            a.eg[h] = i < n ? __ldg(decay_in + at * 2) : 0.f;
            a.fd[h] = i < n ? __ldg(decay_in + at * 2 + 1) : 0.f;
        }
        a.e_last = __ldg(decay_in + ((size_t)(t0 + n - 1) * hv + j) * 2);
        return a;
    };
    auto fetch_c = [&](int t0) {
        const int n = min(GDN_CHUNK, t_end - t0);
        gdn_tile_async(C, C + SQ, GDN_CHUNK, c_in + ((size_t)t0 * hv + j) * 2 * GDN_CHUNK, (size_t)hv * 2 * GDN_CHUNK,
                       GDN_CHUNK, n, GDN_CHUNK / 8);
    };
    // Each phase: start the next phase's copies, wait for this phase's (all but the newest
    // group), make them visible to every thread.
    auto land = [&]() {
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
    };
    // S hi + lo into Sᵀ from the accumulators (rows d = 16·warp + g + 8(e / 2), columns 8t + 2c + e % 2).
    auto store_state = [&](const float (&s)[2][4]) {
#pragma unroll
        for (int t = 0; t < 2; ++t)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int d = 16 * warp + g + 8 * (e / 2), v = 8 * t + 2 * c + e % 2;
                if (d < dkp) split_bf16(s[t][e], ST[gdn_swz(v, d, GDN_MAX_DK)], ST[ST_N + gdn_swz(v, d, GDN_MAX_DK)]);
            }
    };

    float s[2][4];
#pragma unroll
    for (int t = 0; t < 2; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int d = 16 * warp + g + 8 * (e / 2), v = 8 * t + 2 * c + e % 2;
            s[t][e] = d < dk && v < v_cols ? s_global[(size_t)d * dv + v0 + v] : 0.f;
        }
    store_state(s);
    Ahead ahead;
    if (t_begin < t_end) {
        gdn_tile_async(tile(0), tile(0) + TILE, GDN_MAX_DK, w_in + ((size_t)t_begin * hv + j) * 2 * GDN_MAX_DK, w_stride,
                       GDN_MAX_DK, min(GDN_CHUNK, t_end - t_begin), units);
        fetch_c(t_begin);
        ahead = read_ahead(t_begin);
    }
    cp_async_commit();

    for (int t0 = t_begin, chunk = 0; t0 < t_end; t0 += GDN_CHUNK, ++chunk) {
        const int n = min(GDN_CHUNK, t_end - t0);
        const Ahead now = ahead;

        // Phase 1: V_new = U − W S, and e^{γ_n−γ_i} V_new; both hi + lo, transposed.
        {
            bf16* q_tile = tile(3 * chunk + 1);
            gdn_tile_async(q_tile, q_tile + TILE, GDN_MAX_DK, q_in + (size_t)t0 * qk_stride, qk_stride, GDN_MAX_DK, n, units);
        }
        land();
        {
            float acc[3][4] = {};
#pragma unroll
            for (int k0 = 0; k0 < GDN_MAX_DK; k0 += 16) {
                if (k0 >= dkp) break;
                gdn_scan_step<GDN_MAX_DK>(acc, tile(3 * chunk), TILE, ST, ST_N, rb, nt, k0);
            }
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int h = e / 2, i = 16 * rb + g + 8 * h, v = 8 * nt + 2 * c + e % 2;
                const float vn = now.u[h][e % 2] - split_sum(acc, e);
                split_bf16(vn, VN[gdn_swz(v, i, GDN_CHUNK)], VN[VT_N + gdn_swz(v, i, GDN_CHUNK)]);
                split_bf16(now.fd[h] * vn, VD[gdn_swz(v, i, GDN_CHUNK)], VD[VT_N + gdn_swz(v, i, GDN_CHUNK)]);
            }
        }
        __syncthreads();

        // Phase 2: O_i = e^{γ_i} q_iᵀ S + Σ_{m≤i} C[i, m] V_new[m], with S the chunk-start state.
        {
            bf16* k_tile = tile(3 * chunk + 2);
            gdn_tile_async(k_tile, k_tile + TILE, GDN_MAX_DK, k_in + (size_t)t0 * qk_stride, qk_stride, GDN_MAX_DK, n, units);
        }
        land();
        {
            float qs[3][4] = {}, cv[3][4] = {};
#pragma unroll
            for (int k0 = 0; k0 < GDN_MAX_DK; k0 += 16) {
                if (k0 >= dkp) break;
                gdn_scan_step<GDN_MAX_DK>(qs, tile(3 * chunk + 1), TILE, ST, ST_N, rb, nt, k0);
            }
            for (int k0 = 0; k0 <= 16 * rb; k0 += 16) gdn_scan_step<GDN_CHUNK>(cv, C, SQ, VN, VT_N, rb, nt, k0);
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int h = e / 2, i = 16 * rb + g + 8 * h, v = 8 * nt + 2 * c + e % 2;
                if (i < n && v < v_cols)
                    out[((size_t)(t0 + i) * hv + j) * dv + v0 + v] = fmaf(split_sum(qs, e), now.eg[h], split_sum(cv, e));
            }
        }
        __syncthreads();

        // Phase 3: S ← e^{γ_n} S + Kᵀ Vd, Vd = e^{γ_n−γ} ⊙ V_new; warp w: state rows 16w + [0, 16).
        // C and V_new were last read above, so the next chunk's W and C may land now.
        const bool more = t0 + GDN_CHUNK < t_end;
        if (more) {
            bf16* w_tile = tile(3 * chunk + 3);
            gdn_tile_async(w_tile, w_tile + TILE, GDN_MAX_DK, w_in + ((size_t)(t0 + GDN_CHUNK) * hv + j) * 2 * GDN_MAX_DK,
                           w_stride, GDN_MAX_DK, min(GDN_CHUNK, t_end - t0 - GDN_CHUNK), units);
            fetch_c(t0 + GDN_CHUNK);
            ahead = read_ahead(t0 + GDN_CHUNK);
        }
        land();
        {
            const bf16* K = tile(3 * chunk + 2);
            if (16 * warp < dkp) {
                float add[2][3][4] = {};
                for (int k0 = 0; k0 < n; k0 += 16) {
                    // Kᵀ's fragments from K's rows: ldmatrix .trans of K[k0 + i][16·warp + d].
                    uint32_t ah[4], al[4], bh[4], bl[4];
                    const int kr = k0 + lane % 8 + 8 * (lane / 16), kc = 16 * warp + 8 * ((lane / 8) % 2);
                    ldmatrix_x4_trans(ah, K + gdn_swz(kr, kc, GDN_MAX_DK));
                    ldmatrix_x4_trans(al, K + TILE + gdn_swz(kr, kc, GDN_MAX_DK));
                    const int bv = lane % 8 + 8 * (lane / 16), bi = k0 + 8 * ((lane / 8) % 2);
                    ldmatrix_x4(bh, VD + gdn_swz(bv, bi, GDN_CHUNK));
                    ldmatrix_x4(bl, VD + VT_N + gdn_swz(bv, bi, GDN_CHUNK));
#pragma unroll
                    for (int t = 0; t < 2; ++t) mma_split3_k16(add[t], ah, al, bh[2 * t], bh[2 * t + 1], bl[2 * t], bl[2 * t + 1]);
                }
#pragma unroll
                for (int t = 0; t < 2; ++t)
#pragma unroll
                    for (int e = 0; e < 4; ++e) s[t][e] = fmaf(s[t][e], now.e_last, split_sum(add[t], e));
                store_state(s);
            }
        }
        __syncthreads();
    }
    cp_async_wait<0>();

#pragma unroll
    for (int t = 0; t < 2; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int d = 16 * warp + g + 8 * (e / 2), v = 8 * t + 2 * c + e % 2;
            if (d < dk && v < v_cols) s_global[(size_t)d * dv + v0 + v] = s[t][e];
        }
}
