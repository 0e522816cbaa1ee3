// Tensor-core primitives (mma.sync, sm_80 and newer) for the row-invariant GEMMs.
//
// Why row-invariant: a decode batch must give each row the bits it gets alone (issue 12). An
// mma.sync computes every output element from its own row of A and column of B only, so a GEMM
// whose K is walked in an order fixed by K alone (never by the row count: no split-K picked by
// M, no library heuristics, no atomics) gives each row the same sum whatever rows share its tile.
//
// Fragments of mma.m16n8k16 (PTX ISA, "Matrix fragments for mma.m16n8k16"), g = lane / 4,
// c = lane % 4, each 32-bit register two 16-bit elements (the lower k in the low half):
//   a[0] = A[g][2c, 2c+1]      a[1] = A[g+8][2c, 2c+1]
//   a[2] = A[g][2c+8, 2c+9]    a[3] = A[g+8][2c+8, 2c+9]
//   b[0] = B[2c, 2c+1][g]      b[1] = B[2c+8, 2c+9][g]
//   d[0], d[1] = D[g][2c, 2c+1]   d[2], d[3] = D[g+8][2c, 2c+1]
//
// Loading fragments straight from row-major global memory ("k permutation"): the sum over k is
// the same under any fixed bijection of k applied to both operands. If lane (g, c) holds four
// consecutive k of A's rows g and g+8 and of B's column g (two 32-bit words each, starting at the
// same k), then {a_g.lo, a_g8.lo, a_g.hi, a_g8.hi} and {b.lo, b.hi} are valid fragments of one
// k16 step over the 16 k the four lanes c = 0..3 of the group hold together. So a lane that
// loads 16 bytes (8 bf16 / f16) of each of its rows covers two k16 steps (`mma_*_k32`), and the
// four lanes of a group read 64 consecutive bytes of each row. The order of the MMAs over a
// tile's K is the order of the k32 (or k16) steps, fixed by the caller.
#pragma once
#include <cuda_fp16.h>

#include "common.cuh"

// d += A·B over one k16 step; bf16 operands, f32 accumulators.
__device__ __forceinline__ void mma_bf16_k16(float d[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                             uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// d += A·B over one k16 step; f16 operands, f32 accumulators.
__device__ __forceinline__ void mma_f16_k16(float d[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                            uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Two k16 steps from one 16-byte vector per operand (the k permutation above): ag / ag8 hold 8
// consecutive bf16 of A's rows g and g + 8, b the same 8 k of B's column g.
__device__ __forceinline__ void mma_bf16_k32(float d[4], uint4 ag, uint4 ag8, uint4 b) {
    mma_bf16_k16(d, ag.x, ag8.x, ag.y, ag8.y, b.x, b.y);
    mma_bf16_k16(d, ag.z, ag8.z, ag.w, ag8.w, b.z, b.w);
}

// As mma_bf16_k32, with f16 operands.
__device__ __forceinline__ void mma_f16_k32(float d[4], uint4 ag, uint4 ag8, uint4 b) {
    mma_f16_k16(d, ag.x, ag8.x, ag.y, ag8.y, b.x, b.y);
    mma_f16_k16(d, ag.z, ag8.z, ag.w, ag8.w, b.z, b.w);
}

// Four e4m3 codes (first element in the low byte) as two f16x2 words, exactly: every e4m3 value
// is an f16, so an e4m3 GEMM can run on the f16 MMA without rounding its operands.
__device__ __forceinline__ uint2 e4m3x4_to_f16x4(uint32_t v) {
    const __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(v & 0xFFFFu), __NV_E4M3);
    const __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(v >> 16), __NV_E4M3);
    return make_uint2((uint32_t)lo.x | ((uint32_t)lo.y << 16), (uint32_t)hi.x | ((uint32_t)hi.y << 16));
}

// 16 bytes that this call reads exactly once: non-coherent path, not kept in L1.
__device__ __forceinline__ uint4 load_stream(const uint4* p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

// cp.async of 16 bytes into shared memory; where !ok, src-size 0 reads nothing and zero-fills
// the 16 bytes (`gmem` must still be a valid address then).
__device__ __forceinline__ void cp_async16_zfill(void* smem, const void* gmem, bool ok) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(gmem), "r"(ok ? 16 : 0) : "memory");
}
// cp.async of 4 bytes into shared memory (through L1); where !ok it reads nothing and zero-fills
// them (`gmem` must still be a valid address then).
__device__ __forceinline__ void cp_async4_zfill(float* smem, const float* gmem, bool ok) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(s), "l"(gmem), "r"(ok ? 4 : 0) : "memory");
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}

// ldmatrix .trans: each 8×8 matrix transposed on the way, so a lane gets two elements of one
// column (consecutive rows). Rows stored [k][n] then give the col-major B fragments of mma.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}

// Two floats as one bf16x2 word (lo in the low half), rounded to nearest even.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
}

// x as hi + lo: hi = bf16(x), lo = bf16(x − hi), 16 significant bits of x between them.
__device__ __forceinline__ void split_bf16(float x, bf16& hi, bf16& lo) {
    hi = to_bf16(x);
    lo = to_bf16(x - to_f32(hi));
}

// d += A·B over one k16 step for f32 A and B each given as hi + lo fragments (`split_bf16`):
// lo·hi, then hi·lo, then hi·hi; the lo·lo term (2⁻¹⁶ of the product) is left out.
__device__ __forceinline__ void mma_split_k16(float d[4], const uint32_t (&ah)[4], const uint32_t (&al)[4], uint32_t bh0,
                                              uint32_t bh1, uint32_t bl0, uint32_t bl1) {
    mma_bf16_k16(d, al[0], al[1], al[2], al[3], bh0, bh1);
    mma_bf16_k16(d, ah[0], ah[1], ah[2], ah[3], bl0, bl1);
    mma_bf16_k16(d, ah[0], ah[1], ah[2], ah[3], bh0, bh1);
}

// As mma_split_k16 with each term in its own accumulator (d[0] += lo·hi, d[1] += hi·lo,
// d[2] += hi·hi): three independent MMA chains where one would wait on another; the product is
// `split_sum(d)`.
__device__ __forceinline__ void mma_split3_k16(float (&d)[3][4], const uint32_t (&ah)[4], const uint32_t (&al)[4],
                                               uint32_t bh0, uint32_t bh1, uint32_t bl0, uint32_t bl1) {
    mma_bf16_k16(d[0], al[0], al[1], al[2], al[3], bh0, bh1);
    mma_bf16_k16(d[1], ah[0], ah[1], ah[2], ah[3], bl0, bl1);
    mma_bf16_k16(d[2], ah[0], ah[1], ah[2], ah[3], bh0, bh1);
}
__device__ __forceinline__ float split_sum(const float (&d)[3][4], int e) { return d[2][e] + (d[0][e] + d[1][e]); }
