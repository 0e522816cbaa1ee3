// Zero-centred RMSNorm of the backbone (`backbone.md` §4): y = x · rsqrt(mean(x²) + eps) · (1 + w),
// in fp32 with one rounding to bf16; optionally fused with the residual add before it
// (`residual ← bf16(residual + delta)`, then the norm of the rounded sum, as transformers does).
#include "norm.cuh"

// Rows up to NORM_REGS · NORM_THREADS columns (2048: every backbone and tower row) are read in one
// go: each thread issues its NORM_REGS loads together and keeps the values, so a row costs one
// memory round trip, not one per column a thread visits. A thread still visits its columns
// c = tid, tid + blockDim, … and sums their squares in that order, as the loop for wider rows
// does: both give the same bits. Blocks are NORM_THREADS threads (norm.rs).

// The gain of thread t's columns t + j · NORM_THREADS for the register path (0 past the row, and
// for rows too wide for it). A weight: the norms load it before waiting on the kernel before.
__device__ __forceinline__ void load_gain(float (&g)[NORM_REGS], const float* __restrict__ w, int cols, bool in_regs) {
#pragma unroll
    for (int j = 0; j < NORM_REGS; ++j) {
        const int c = threadIdx.x + j * NORM_THREADS;
        g[j] = in_regs && c < cols ? w[c] : 0.f;
    }
}

// One block per row. x, y: [rows, cols] bf16; w: [cols] f32 (the stored gain w, not 1 + w).
extern "C" __global__ void rms_norm_zc(const bf16* __restrict__ x, const float* __restrict__ w,
                                       bf16* __restrict__ y, int cols, float eps) {
    __shared__ float scratch[32];
    const bf16* xr = x + (size_t)blockIdx.x * cols;
    bf16* yr = y + (size_t)blockIdx.x * cols;
    const int t = threadIdx.x, n = blockDim.x;
    const bool in_regs = cols <= NORM_REGS * NORM_THREADS;
    float g[NORM_REGS];
    load_gain(g, w, cols, in_regs);
    pdl_begin();
    float ss = 0.f;
    if (in_regs) {
        float v[NORM_REGS];
#pragma unroll
        for (int j = 0; j < NORM_REGS; ++j) {
            const int c = t + j * n;
            v[j] = c < cols ? to_f32(xr[c]) : 0.f;
        }
#pragma unroll
        for (int j = 0; j < NORM_REGS; ++j)
            if (t + j * n < cols) ss += v[j] * v[j];
        const float inv = rsqrtf(block_sum(ss, scratch) / cols + eps);
#pragma unroll
        for (int j = 0; j < NORM_REGS; ++j)
            if (t + j * n < cols) yr[t + j * n] = to_bf16(v[j] * inv * (1.f + g[j]));
        return;
    }
    for (int c = t; c < cols; c += n) {
        float v = to_f32(xr[c]);
        ss += v * v;
    }
    const float inv = rsqrtf(block_sum(ss, scratch) / cols + eps);
    for (int c = t; c < cols; c += n) yr[c] = to_bf16(to_f32(xr[c]) * inv * (1.f + w[c]));
}

// residual += delta (rounded to bf16), then y = rms_norm_zc(residual).
extern "C" __global__ void add_rms_norm_zc(bf16* __restrict__ residual, const bf16* __restrict__ delta,
                                           const float* __restrict__ w, bf16* __restrict__ y, int cols, float eps) {
    __shared__ float scratch[32];
    bf16* rr = residual + (size_t)blockIdx.x * cols;
    const bf16* dr = delta + (size_t)blockIdx.x * cols;
    bf16* yr = y + (size_t)blockIdx.x * cols;
    const int t = threadIdx.x, n = blockDim.x;
    const bool in_regs = cols <= NORM_REGS * NORM_THREADS;
    float g[NORM_REGS];
    load_gain(g, w, cols, in_regs);
    pdl_begin();
    float ss = 0.f;
    if (in_regs) {
        bf16 a[NORM_REGS], b[NORM_REGS];
#pragma unroll
        for (int j = 0; j < NORM_REGS; ++j) {
            const int c = t + j * n;
            a[j] = c < cols ? rr[c] : to_bf16(0.f);
            b[j] = c < cols ? dr[c] : to_bf16(0.f);
        }
        add_rms_norm_row(rr, a, b, g, yr, cols, eps, scratch);
        return;
    }
    for (int c = t; c < cols; c += n) {
        bf16 s = to_bf16(to_f32(rr[c]) + to_f32(dr[c]));
        rr[c] = s;
        float v = to_f32(s);
        ss += v * v;
    }
    const float inv = rsqrtf(block_sum(ss, scratch) / cols + eps);
    for (int c = t; c < cols; c += n) yr[c] = to_bf16(to_f32(rr[c]) * inv * (1.f + w[c]));
}

// x += y elementwise (bf16, rounded once).
extern "C" __global__ void add_bf16(bf16* __restrict__ x, const bf16* __restrict__ y, int n) {
    pdl_begin();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = to_bf16(to_f32(x[i]) + to_f32(y[i]));
}
