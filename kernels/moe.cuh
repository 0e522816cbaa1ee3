// Pieces shared by the MoE kernel files (moe.cu, moe_route.cu, moe_rows.cu, moe_rows_wide.cu):
// the activation kinds and operand formats, the expert address table's layout, the dynamic e4m3
// quantiser (`backbone.md` §6.2) and e4m3 decoding.
#pragma once
#include "common.cuh"
#include "mma.cuh"

#define E4M3_MAX 448.f

enum { ACT_E4M3 = 0, ACT_BF16 = 1, ACT_F32 = 2 };

// Operand formats of the tensor-core expert kernels' activations (moe_rows.cu's header).
enum { FMT_E4M3 = 0, FMT_F16 = 1, FMT_F16X2 = 2 };

// The gate/up tile kernels' K slices: slice s sums the groups s, s + 8, … in increasing order,
// and the slices' totals are added in slice order (moe_rows.cu runs a slice per warp,
// moe_rows_wide.cu the slices one after another: the same sums, so the same bits).
#define ROWS_GATE_UP_SLICES 8

// Expert pointer table: 6 addresses per expert (gate w, gate scale, up w, up scale, down w, down scale).
enum { T_GATE_W = 0, T_GATE_S = 1, T_UP_W = 2, T_UP_S = 3, T_DOWN_W = 4, T_DOWN_S = 5, T_STRIDE = 6 };

// The dynamic quantiser's group scale, as the CPU `quantise`: max(amax, 1e-10) / 448 in f32.
__device__ __forceinline__ float quant_scale(float amax) { return fmaxf(amax, 1e-10f) / E4M3_MAX; }

// e4m3 code of v / s: IEEE division (not a reciprocal multiply), clamp to ±448, round to nearest even.
__device__ __forceinline__ unsigned char quant_e4m3(float v, float s) {
    const float q = fminf(fmaxf(v / s, -E4M3_MAX), E4M3_MAX);
    return (unsigned char)__nv_cvt_float_to_fp8(q, __NV_SATFINITE, __NV_E4M3);
}

// Two e4m3 codes (first element in the low byte) to floats, exactly (every e4m3 value is an f16).
__device__ __forceinline__ float2 e4m3x2_to_float2(unsigned short v) {
    const __half2 h(__nv_cvt_fp8x2_to_halfraw2(v, __NV_E4M3));
    return __half22float2(h);
}

__device__ __forceinline__ float e4m3_to_f32(unsigned char v) {
    return __half2float(__half(__nv_cvt_fp8_to_halfraw(v, __NV_E4M3)));
}

__device__ __forceinline__ float4 e4m3x4_to_float4(unsigned int v) {
    const float2 a = e4m3x2_to_float2((unsigned short)(v & 0xFFFFu));
    const float2 b = e4m3x2_to_float2((unsigned short)(v >> 16));
    return make_float4(a.x, a.y, b.x, b.y);
}

// Four consecutive activations starting at element `at` (a multiple of 4) of a buffer of `kind`.
__device__ __forceinline__ float4 load_act4(const void* act, int kind, size_t at) {
    if (kind == ACT_E4M3)
        return e4m3x4_to_float4(*reinterpret_cast<const unsigned int*>((const unsigned char*)act + at));
    if (kind == ACT_BF16) {
        const uint2 raw = *reinterpret_cast<const uint2*>((const bf16*)act + at);
        const bf16* b = reinterpret_cast<const bf16*>(&raw);
        return make_float4(to_f32(b[0]), to_f32(b[1]), to_f32(b[2]), to_f32(b[3]));
    }
    return *reinterpret_cast<const float4*>((const float*)act + at);
}

// The tile kernels' operand fragments (moe_rows.cu, moe_rows_wide.cu): a lane holds 16 codes of
// its pair's operand row per 64-wide K block, as 16-byte vectors (e4m3: 1, f16: 2, f16 hi then
// lo: 4).
__device__ __forceinline__ uint32_t word_of(const uint4& v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

template <int FMT>
struct OperandVecs {
    static constexpr int n = FMT == FMT_E4M3 ? 1 : FMT == FMT_F16 ? 2 : 4;
};

// B fragment of k16 step q (codes 4q..4q+3 of the lane's 16) as f16 pairs; l0/l1 the lo part.
template <int FMT>
__device__ __forceinline__ void operand_frag(const uint4 (&b)[OperandVecs<FMT>::n], int q, uint32_t& b0,
                                             uint32_t& b1, uint32_t& l0, uint32_t& l1) {
    if constexpr (FMT == FMT_E4M3) {
        const uint2 f = e4m3x4_to_f16x4(word_of(b[0], q));
        b0 = f.x;
        b1 = f.y;
    } else {
        b0 = word_of(b[q >> 1], 2 * (q & 1));
        b1 = word_of(b[q >> 1], 2 * (q & 1) + 1);
        if constexpr (FMT == FMT_F16X2) {
            l0 = word_of(b[OperandVecs<FMT>::n - 2 + (q >> 1)], 2 * (q & 1));
            l1 = word_of(b[OperandVecs<FMT>::n - 2 + (q >> 1)], 2 * (q & 1) + 1);
        }
    }
}
