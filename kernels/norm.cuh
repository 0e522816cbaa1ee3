// The residual add and zero-centred RMSNorm of one row held in registers (`backbone.md` §4):
// `residual ← bf16(residual + delta)`, then y = r · rsqrt(mean(r²) + eps) · (1 + w) in fp32 with
// one rounding to bf16. norm.cu's `add_rms_norm_zc` and moe.cu's `moe_combine_add_norm` (the
// decode MoE ending in the next norm) both run it, so the two give the same bits.
#pragma once
#include "common.cuh"
#include "kernel_constants.cuh"  // NORM_THREADS, NORM_REGS (src/backend/cuda/kernel_constants.rs)

// One block of NORM_THREADS threads per row of `cols` ≤ NORM_REGS · NORM_THREADS: thread t holds
// columns c = t + j · NORM_THREADS (a[j] the residual, b[j] the delta, g[j] the gain w) and sums
// their squares in that order, as the loop over wider rows does. rr: the row's residual (written),
// yr: its normed output.
__device__ __forceinline__ void add_rms_norm_row(bf16* __restrict__ rr, const bf16 (&a)[NORM_REGS],
                                                 const bf16 (&b)[NORM_REGS], const float (&g)[NORM_REGS],
                                                 bf16* __restrict__ yr, int cols, float eps, float* scratch) {
    const int t = threadIdx.x;
    float v[NORM_REGS];
    float ss = 0.f;
#pragma unroll
    for (int j = 0; j < NORM_REGS; ++j) {
        const int c = t + j * NORM_THREADS;
        if (c < cols) {
            const bf16 s = to_bf16(to_f32(a[j]) + to_f32(b[j]));
            rr[c] = s;
            v[j] = to_f32(s);
            ss += v[j] * v[j];
        }
    }
    const float inv = rsqrtf(block_sum(ss, scratch) / cols + eps);
#pragma unroll
    for (int j = 0; j < NORM_REGS; ++j)
        if (t + j * NORM_THREADS < cols) yr[t + j * NORM_THREADS] = to_bf16(v[j] * inv * (1.f + g[j]));
}
