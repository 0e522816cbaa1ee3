// Shared device helpers for limelight's kernels: bf16 <-> f32, warp and block reductions.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <stdint.h>

typedef __nv_bfloat16 bf16;

__device__ __forceinline__ float to_f32(bf16 v) { return __bfloat162float(v); }
// Round to nearest even, as torch's .to(bfloat16).
__device__ __forceinline__ bf16 to_bf16(float v) { return __float2bfloat16_rn(v); }

// Programmatic dependent launch (Hopper and newer; no-ops before sm_90). The modules the decode
// step runs are loaded "overlapping" (`Module::load_overlapping`, src/backend/cuda/launch.rs):
// each kernel may start while the kernel before it on the stream still runs, so its launch and
// block scheduling hide under that kernel's tail. Hence every such kernel begins with
// `pdl_begin()`: `pdl_wait()` returns once its predecessor has finished and its writes are
// visible (the predecessor waited for its own, so the stream's order holds transitively), and
// only then `pdl_launch_dependents()` lets the next kernel start. The exceptions fetch weights,
// which no kernel writes, before waiting: the decode GEMVs (kernels/linear.cu), the decode router
// (`moe_router_logits`), and the norms' gains (norm.cu, `moe_combine_add_norm`, `gdn_gated_norm`).
// `moe_rows_down` with h (the decode step) also reads its tile from the grouping two launches
// back: its predecessor, gate/up, let it launch only after waiting for that grouping.
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_begin() {
    pdl_wait();
    pdl_launch_dependents();
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over the whole block (blockDim.x a multiple of 32, at most 1024). Every thread gets the
// result. `scratch` holds 32 floats of shared memory; the call contains barriers.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();  // scratch may still be read by a previous call
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float t = lane < warps ? scratch[lane] : 0.f;
    return warp_sum(t);
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float t = lane < warps ? scratch[lane] : -INFINITY;
    return warp_max(t);
}

__device__ __forceinline__ float sigmoidf_(float x) { return 1.f / (1.f + expf(-x)); }
__device__ __forceinline__ float siluf_(float x) { return x / (1.f + expf(-x)); }

// The first position of a call: `start` from the host, plus the device counter `dev_start` when
// one is given (a captured CUDA-graph step advances its positions on the device, so a replay needs
// no new kernel arguments; `start` is then the offset from that counter).
__device__ __forceinline__ int first_position(int start, const int* dev_start) {
    return dev_start ? start + *dev_start : start;
}

// The decode batch's rows (`BackboneOps::*_rows`): row t of a call is its own sequence, with its
// own KV cache (keys[t], values[t]: device addresses) and position pos[t] (the cache length before
// the row). All three null: the call is one sequence, with the caches and positions it is given.
// A row computes exactly what it computes alone: only where it reads and writes changes.
struct DecodeRows {
    const unsigned long long* keys;
    const unsigned long long* values;
    const int* pos;

    __device__ __forceinline__ int row_position(int t, int own) const { return pos ? pos[t] : own; }

    template <class T>
    __device__ __forceinline__ void row_cache(int t, T*& k, T*& v) const {
        if (keys) {
            k = reinterpret_cast<T*>(keys[t]);
            v = reinterpret_cast<T*>(values[t]);
        }
    }
};

// Kernel parameters of a DecodeRows (passed as three pointers: the launcher passes scalars).
#define DECODE_ROWS_PARAMS                                                                         \
    const unsigned long long *seq_keys, const unsigned long long *seq_values, const int *seq_pos
#define DECODE_ROWS (DecodeRows{seq_keys, seq_values, seq_pos})
