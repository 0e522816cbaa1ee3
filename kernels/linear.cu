// Dense bf16 projections y = x · Wᵀ (W: [n, k] row-major as stored), fp32 accumulation,
// one rounding to bf16.
#include "common.cuh"

// One warp per output element; 8 warps per block cover 8 consecutive outputs of one row.
// grid = (ceil(n / 8), rows). Reads 16-byte vectors when k % 8 == 0.
extern "C" __global__ void linear_bf16_warp(const bf16* __restrict__ x, const bf16* __restrict__ w,
                                            bf16* __restrict__ y, int n, int k) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int col = blockIdx.x * (blockDim.x >> 5) + warp;
    const int row = blockIdx.y;
    if (col >= n) return;
    const bf16* xr = x + (size_t)row * k;
    const bf16* wr = w + (size_t)col * k;
    float acc = 0.f;
    if ((k & 7) == 0) {
        for (int i = lane * 8; i < k; i += 32 * 8) {
            uint4 xv = *reinterpret_cast<const uint4*>(xr + i);
            uint4 wv = *reinterpret_cast<const uint4*>(wr + i);
            const bf16* xs = reinterpret_cast<const bf16*>(&xv);
            const bf16* ws = reinterpret_cast<const bf16*>(&wv);
#pragma unroll
            for (int j = 0; j < 8; ++j) acc += to_f32(xs[j]) * to_f32(ws[j]);
        }
    } else {
        for (int i = lane; i < k; i += 32) acc += to_f32(xr[i]) * to_f32(wr[i]);
    }
    acc = warp_sum(acc);
    if (lane == 0) y[(size_t)row * n + col] = to_bf16(acc);
}
