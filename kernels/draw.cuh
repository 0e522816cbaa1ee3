// One draw's arithmetic for kernels/sampling.cu: the block shape, the Philox draws and their
// exponentials, the candidates' weights, the block reductions and a draw's filter. Each function
// computes what the CPU sampler (src/model/sampling.rs, src/model/rng.rs) computes, bit for bit
// where sampling.cu's header says so.
#pragma once
#include "kernel_constants.cuh"  // SAMPLING_*, SORT_CAP (src/backend/cuda/kernel_constants.rs)
#include "rank.cuh"

constexpr int THREADS = SAMPLING_THREADS;
constexpr int WARPS = THREADS / 32;
// Ranks per thread at the largest sort; SORT_CAP = THREADS · ITEMS candidates at most.
constexpr int ITEMS = SAMPLING_ITEMS;

constexpr float MIN_TEMPERATURE = 1e-5f;  // src/model/sampling.rs

// ---------------------------------------------------------------------------------------------
// Philox4x32-10 and the uniform → Exp(1) mapping, exactly as src/model/rng.rs:
//   key = [seed_lo, seed_hi ^ frame_hi], counter = [candidate, 0, stream, frame_lo],
//   u = ((bits >> 9) + 0.5) · 2^-23 (exact in f32), E = −ln(u) in f64.
struct DrawKey {
    uint32_t k0, k1, stream, frame_lo;
};

__device__ __forceinline__ uint32_t philox_bits(const DrawKey& key, uint32_t candidate) {
    constexpr uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u, W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
    uint32_t c0 = candidate, c1 = 0, c2 = key.stream, c3 = key.frame_lo;
    uint32_t k0 = key.k0, k1 = key.k1;
#pragma unroll
    for (int round = 0; round < 10; ++round) {
        if (round > 0) {
            k0 += W0;
            k1 += W1;
        }
        const uint32_t hi0 = __umulhi(M0, c0), lo0 = M0 * c0;
        const uint32_t hi1 = __umulhi(M1, c2), lo1 = M1 * c2;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
    }
    return c0;
}

__device__ __forceinline__ double exponential(const DrawKey& key, uint32_t candidate) {
    const float k = (float)(philox_bits(key, candidate) >> 9);  // < 2^23: exact
    const float u = __fmul_rn(__fadd_rn(k, 0.5f), 1.0f / 8388608.0f);
    return -log((double)u);
}

// ---------------------------------------------------------------------------------------------
// w_r = exp(s_r − s_0) in f64, as the CPU computes it (every caller gets the same bits).
__device__ __forceinline__ double rank_weight(unsigned long long key, float best) {
    return exp(__dsub_rn((double)key_score(key), (double)best));
}

// ---------------------------------------------------------------------------------------------
// Block reductions (blockDim.x == THREADS). Each starts with a barrier, so its scratch may be the
// previous call's; every thread gets the result.
struct Scratch {
    double d[WARPS];
    uint32_t u[WARPS];
    unsigned long long k[WARPS];
    uint32_t end;   // the kept prefix's length, from warp 0 to the block
    uint32_t pick;  // the fast path's pick, or UINT32_MAX when it could not decide
};

__device__ uint32_t block_min_u32(uint32_t v, Scratch& s) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = min(v, __shfl_xor_sync(FULL, v, o));
    __syncthreads();
    if (lane == 0) s.u[warp] = v;
    __syncthreads();
    v = s.u[lane];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = min(v, __shfl_xor_sync(FULL, v, o));
    return v;
}

// The least of each thread's (v, key) over the block, both in one reduction: step 1's first
// non-finite index and its smallest key (rank 0).
__device__ void block_min_u32_key(uint32_t& v, unsigned long long& key, Scratch& s) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        v = min(v, __shfl_xor_sync(FULL, v, o));
        key = min(key, __shfl_xor_sync(FULL, key, o));
    }
    __syncthreads();
    if (lane == 0) {
        s.u[warp] = v;
        s.k[warp] = key;
    }
    __syncthreads();
    v = s.u[lane];
    key = s.k[lane];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        v = min(v, __shfl_xor_sync(FULL, v, o));
        key = min(key, __shfl_xor_sync(FULL, key, o));
    }
}

// Sum over the block (a tree; the order is not the CPU's, see the header).
__device__ double block_sum(double v, Scratch& s) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = __dadd_rn(v, __shfl_xor_sync(FULL, v, o));
    __syncthreads();
    if (lane == 0) s.d[warp] = v;
    __syncthreads();
    v = s.d[lane];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = __dadd_rn(v, __shfl_xor_sync(FULL, v, o));
    return v;
}

// The largest race value, ties to the lower rank (the CPU's strict `>` in rank order). `Order`
// is the rank (u32) or the key (u64: keys ascend in rank order, so the lower key is the lower
// rank).
template <class Order>
__device__ __forceinline__ void better(double& v, Order& r, double ov, Order orank) {
    if (ov > v || (ov == v && orank < r)) {
        v = ov;
        r = orank;
    }
}

__device__ __forceinline__ uint32_t* order_slots(Scratch& s, uint32_t) { return s.u; }
__device__ __forceinline__ unsigned long long* order_slots(Scratch& s, unsigned long long) { return s.k; }

// The best (value, order) over the block, by `better`.
template <class Order>
__device__ Order block_argmax(double v, Order r, Scratch& s) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    Order* slots = order_slots(s, r);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) better(v, r, __shfl_xor_sync(FULL, v, o), __shfl_xor_sync(FULL, r, o));
    __syncthreads();
    if (lane == 0) {
        s.d[warp] = v;
        slots[warp] = r;
    }
    __syncthreads();
    v = s.d[lane];
    r = slots[lane];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) better(v, r, __shfl_xor_sync(FULL, v, o), __shfl_xor_sync(FULL, r, o));
    return r;
}

// ---------------------------------------------------------------------------------------------
// One draw's parameters.
struct Filter {
    float temperature;
    uint32_t top_k;
    float top_p;
    bool keep_crossing;  // main draws keep the token that crosses top_p; heads drop it
};
