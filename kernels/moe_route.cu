// The MoE block's routing (`backbone.md` §5): the router's fp32 logits, softmax, top-k and
// renormalisation, the shared expert's sigmoid gate, and the grouping of (row, slot) pairs by
// expert that every grouped expert path (moe.cu's prefill GEMMs, moe_rows.cu's and
// moe_rows_wide.cu's tiles) reads. Nothing here leaves the device: the tile lists the expert
// kernels' grids walk are bounded on the host and filled here.
#include "kernel_constants.cuh"  // ROUTER_* (src/backend/cuda/kernel_constants.rs)
#include "moe.cuh"

// ---------------------------------------------------------------------------------------------
// Router

// logits[row, e] = x[row] · W_g[e] in fp32 (not rounded), for e < E; column E holds the shared
// expert's gate logit x[row] · w_sg. One warp per logit, 8 per block: grid (ceil((E+1)/8), rows),
// 256 threads. x: [rows, K] bf16; wg: [E, K] bf16; wsg: [1, K] bf16; logits: [rows, E+1] f32.
// Where K ≤ 32 · 8 · ROUTER_PREFETCH (and K % 8 == 0), a lane's slice of its weight row is loaded
// into registers before `pdl_wait` (no kernel writes weights), overlapping the kernel before it
// (run 44's trace: 4.4 µs a layer on the critical path); the dot is the same either way: lane ℓ's
// elements ℓ·8 + 256t + j in increasing t then j, then warp_sum.
constexpr int ROUTER_PREFETCH = 8;
extern "C" __global__ void moe_router_logits(const bf16* __restrict__ x, const bf16* __restrict__ wg,
                                             const bf16* __restrict__ wsg, float* __restrict__ logits, int E,
                                             int K) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int e = blockIdx.x * (blockDim.x >> 5) + warp;
    const int row = blockIdx.y;
    const bf16* wr = e < E ? wg + (size_t)e * K : wsg;
    const bool prefetch = (K & 7) == 0 && K <= 32 * 8 * ROUTER_PREFETCH;
    uint4 wv[ROUTER_PREFETCH];
    if (prefetch && e <= E) {
#pragma unroll
        for (int t = 0; t < ROUTER_PREFETCH; ++t) {
            const int i = lane * 8 + 256 * t;
            wv[t] = i < K ? __ldg(reinterpret_cast<const uint4*>(wr + i)) : make_uint4(0u, 0u, 0u, 0u);
        }
    }
    pdl_begin();
    if (e > E) return;
    const bf16* xr = x + (size_t)row * K;
    float acc = 0.f;
    if (prefetch) {
#pragma unroll
        for (int t = 0; t < ROUTER_PREFETCH; ++t) {
            const int i = lane * 8 + 256 * t;
            if (i >= K) break;
            const uint4 xv = *reinterpret_cast<const uint4*>(xr + i);
            const bf16* xs = reinterpret_cast<const bf16*>(&xv);
            const bf16* ws = reinterpret_cast<const bf16*>(&wv[t]);
#pragma unroll
            for (int j = 0; j < 8; ++j) acc = fmaf(to_f32(xs[j]), to_f32(ws[j]), acc);
        }
    } else if ((K & 7) == 0) {
        for (int i = lane * 8; i < K; i += 32 * 8) {
            const uint4 xv = *reinterpret_cast<const uint4*>(xr + i);
            const uint4 wv = *reinterpret_cast<const uint4*>(wr + i);
            const bf16* xs = reinterpret_cast<const bf16*>(&xv);
            const bf16* ws = reinterpret_cast<const bf16*>(&wv);
#pragma unroll
            for (int j = 0; j < 8; ++j) acc = fmaf(to_f32(xs[j]), to_f32(ws[j]), acc);
        }
    } else {
        for (int i = lane; i < K; i += 32) acc = fmaf(to_f32(xr[i]), to_f32(wr[i]), acc);
    }
    acc = warp_sum(acc);
    if (lane == 0) logits[(size_t)row * (E + 1) + e] = acc;
}

// moe_router_logits for many rows: the same dots, each with the same lanes' elements in the same
// order and the same warp_sum (so the same bits), in register tiles. A warp holds 4 rows × 4
// logits (16 sums), so each 16-byte load of a row or weight feeds 4 dots; a block is 2 × 4 warps,
// 8 rows × 16 logits, its rows and weights shared through L1. (One warp per dot re-read each
// weight row per row from L2: 71× its DRAM floor at 1000 rows, run 31.) Grid
// (ceil((E+1) / ROUTER_BLOCK_LOGITS), ceil(rows / ROUTER_BLOCK_ROWS)), 256 threads. K % 8 == 0.
extern "C" __global__ void moe_router_logits_tiled(const bf16* __restrict__ x, const bf16* __restrict__ wg,
                                                   const bf16* __restrict__ wsg, float* __restrict__ logits,
                                                   int rows, int E, int K) {
    pdl_begin();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int r0 = blockIdx.y * ROUTER_BLOCK_ROWS + (warp >> 2) * ROUTER_TILE;
    const int e0 = blockIdx.x * ROUTER_BLOCK_LOGITS + (warp & 3) * ROUTER_TILE;
    if (r0 >= rows || e0 > E) return;  // the warp's whole tile is past the matrix
    const bf16* xr[ROUTER_TILE];
    const bf16* wr[ROUTER_TILE];
#pragma unroll
    for (int i = 0; i < ROUTER_TILE; ++i) {
        xr[i] = x + (size_t)min(r0 + i, rows - 1) * K;  // rows past the end: computed, not stored
        const int e = min(e0 + i, E);
        wr[i] = e < E ? wg + (size_t)e * K : wsg;
    }
    float acc[ROUTER_TILE][ROUTER_TILE] = {};
    for (int k = lane * 8; k < K; k += 32 * 8) {
        float xs[ROUTER_TILE][8], ws[ROUTER_TILE][8];
#pragma unroll
        for (int i = 0; i < ROUTER_TILE; ++i) {
            const uint4 xv = __ldg(reinterpret_cast<const uint4*>(xr[i] + k));
            const uint4 wv = __ldg(reinterpret_cast<const uint4*>(wr[i] + k));
            const bf16* xb = reinterpret_cast<const bf16*>(&xv);
            const bf16* wb = reinterpret_cast<const bf16*>(&wv);
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                xs[i][j] = to_f32(xb[j]);
                ws[i][j] = to_f32(wb[j]);
            }
        }
#pragma unroll
        for (int r = 0; r < ROUTER_TILE; ++r)
#pragma unroll
            for (int l = 0; l < ROUTER_TILE; ++l)
#pragma unroll
                for (int j = 0; j < 8; ++j) acc[r][l] = fmaf(xs[r][j], ws[l][j], acc[r][l]);
    }
#pragma unroll
    for (int r = 0; r < ROUTER_TILE; ++r)
#pragma unroll
        for (int l = 0; l < ROUTER_TILE; ++l) {
            const float v = warp_sum(acc[r][l]);
            if (lane == 0 && r0 + r < rows && e0 + l <= E) logits[(size_t)(r0 + r) * (E + 1) + e0 + l] = v;
        }
}

// Softmax over the E logits of a row (fp32), the top_k most probable experts (ties to the lower
// index, as the CPU `route`), their probabilities renormalised to sum to one; and the shared
// expert's gate sigmoid(logit[E]). One warp per row, 4 rows per block: grid ceil(rows/4), 128
// threads, dynamic shared 4·E floats. ids/weights: [rows, top_k] (most probable first);
// shared_gate: [rows]. top_k ≤ 32 and ≤ E (checked by the wrapper).
// One pick of a row's routing: the warp's best (bv, bi) over every lane's own best (ties to the
// lower index), its probability added to `kept`, and lane j keeps it as the row's pick j.
// A lane's best is -1 (nothing left to pick) or an exp ≥ 0, never NaN (a NaN fails the lanes'
// `v > bv`), so the key bits(bv) + 1 (0 for -1) orders the bests as floats do, and equal keys
// are equal values: the warp's largest key, then the least index among the lanes that hold it,
// is the (value, lower index) maximum — in two `redux.sync` instead of five dependent rounds of
// two shuffles (a row's 8 picks are most of `moe_route_group`'s time: ncu, run 33).
__device__ __forceinline__ void route_pick(float& bv, int& bi, float total, int j, float& kept, float& my_p,
                                           int& my_id) {
    const unsigned key = bv >= 0.f ? __float_as_uint(bv) + 1u : 0u;
    const unsigned best = __reduce_max_sync(0xffffffffu, key);
    bi = (int)__reduce_min_sync(0xffffffffu, key == best ? (unsigned)bi : 0xFFFFFFFFu);
    bv = best ? __uint_as_float(best - 1u) : -1.f;
    const float p = bv / total;
    kept += p;
    if ((int)(threadIdx.x & 31) == j) {
        my_p = p;
        my_id = bi;
    }
}

// A routed row's outputs: lane j < top_k writes pick j renormalised; lane 0 the shared gate.
__device__ __forceinline__ void route_store(int row, int top_k, int my_id, float my_p, float kept, float gate_logit,
                                            int* __restrict__ ids, float* __restrict__ weights,
                                            float* __restrict__ shared_gate) {
    const int lane = threadIdx.x & 31;
    if (lane < top_k) {
        ids[(size_t)row * top_k + lane] = my_id;
        weights[(size_t)row * top_k + lane] = my_p / kept;
    }
    if (lane == 0) shared_gate[row] = sigmoidf_(gate_logit);
}

// One row's routing, by one warp (ex: E floats of shared memory, the warp's own).
__device__ __forceinline__ void route_row(const float* __restrict__ logits, int row, int E, int top_k, float* ex,
                                          int* __restrict__ ids, float* __restrict__ weights,
                                          float* __restrict__ shared_gate) {
    const int lane = threadIdx.x & 31;
    const float* l = logits + (size_t)row * (E + 1);

    float m = -INFINITY;
    for (int e = lane; e < E; e += 32) m = fmaxf(m, l[e]);
    m = warp_max(m);
    float total = 0.f;
    for (int e = lane; e < E; e += 32) {
        const float v = expf(l[e] - m);
        ex[e] = v;
        total += v;
    }
    total = warp_sum(total);
    __syncwarp();

    // Selected entries are marked -1 (every exp is ≥ 0, so they are never picked again).
    float my_p = 0.f, kept = 0.f;
    int my_id = 0;
    for (int j = 0; j < top_k; ++j) {
        float bv = -1.f;
        int bi = 0x7FFFFFFF;
        for (int e = lane; e < E; e += 32) {
            const float v = ex[e];
            if (v > bv) {  // ascending e: an equal value keeps the lower index
                bv = v;
                bi = e;
            }
        }
        route_pick(bv, bi, total, j, kept, my_p, my_id);
        __syncwarp();
        if (lane == 0) ex[bi] = -1.f;
        __syncwarp();
    }
    route_store(row, top_k, my_id, my_p, kept, l[E], ids, weights, shared_gate);
    __syncwarp();  // ex is reused for the warp's next row
}

// route_row with the row's exps in registers (lane holds experts lane + 32i, i < PER): the same
// operations in the same order (the max, the exps and their lane-order sum and warp_sum, then per
// pick each lane's best in ascending index and the same shuffle reduction), so the same ids,
// weights and gate, without the shared-memory round trips and warp barriers of each pick.
// Requires E ≤ 32 · PER.
template <int PER>
__device__ __forceinline__ void route_row_registers(const float* __restrict__ logits, int row, int E, int top_k,
                                                    int* __restrict__ ids, float* __restrict__ weights,
                                                    float* __restrict__ shared_gate) {
    const int lane = threadIdx.x & 31;
    const float* l = logits + (size_t)row * (E + 1);
    float v[PER];
    float m = -INFINITY;
#pragma unroll
    for (int i = 0; i < PER; ++i) {
        const int e = lane + 32 * i;
        v[i] = e < E ? l[e] : -INFINITY;
        m = fmaxf(m, v[i]);
    }
    m = warp_max(m);
    float total = 0.f;
#pragma unroll
    for (int i = 0; i < PER; ++i) {
        if (lane + 32 * i < E) {
            v[i] = expf(v[i] - m);
            total += v[i];
        } else {
            v[i] = -1.f;  // never picked: every exp is ≥ 0
        }
    }
    total = warp_sum(total);

    float my_p = 0.f, kept = 0.f;
    int my_id = 0;
    for (int j = 0; j < top_k; ++j) {
        float bv = -1.f;
        int bi = 0x7FFFFFFF;
#pragma unroll
        for (int i = 0; i < PER; ++i)
            if (v[i] > bv) {  // ascending index: an equal value keeps the lower one
                bv = v[i];
                bi = lane + 32 * i;
            }
        route_pick(bv, bi, total, j, kept, my_p, my_id);
#pragma unroll
        for (int i = 0; i < PER; ++i)
            if (lane + 32 * i == bi) v[i] = -1.f;
    }
    route_store(row, top_k, my_id, my_p, kept, l[E], ids, weights, shared_gate);
}

extern "C" __global__ void moe_route(const float* __restrict__ logits, int rows, int E, int top_k,
                                     int* __restrict__ ids, float* __restrict__ weights,
                                     float* __restrict__ shared_gate) {
    pdl_begin();
    extern __shared__ float route_smem[];
    const int warp = threadIdx.x >> 5;
    const int row = blockIdx.x * (blockDim.x >> 5) + warp;
    if (row >= rows) return;  // warp-uniform; the kernel has no block barrier
    route_row(logits, row, E, top_k, route_smem + warp * E, ids, weights, shared_gate);
}

// ---------------------------------------------------------------------------------------------
// Grouping (row, slot) pairs by expert (prefill and the decode batch)

// Exclusive prefix sum over the block (blockDim a multiple of 32, ≤ 1024); *total gets the sum.
// Contains barriers: every thread of the block must call it.
__device__ __forceinline__ int block_exclusive_scan(int v, int* warp_totals, int* total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    int inc = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int n = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o) inc += n;
    }
    __syncthreads();  // warp_totals may still be read by a previous call
    if (lane == 31) warp_totals[warp] = inc;
    __syncthreads();
    if (warp == 0) {
        const int t = lane < warps ? warp_totals[lane] : 0;
        int ti = t;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int n = __shfl_up_sync(0xffffffffu, ti, o);
            if (lane >= o) ti += n;
        }
        warp_totals[lane] = ti - t;
        if (lane == 31) *total = ti;
    }
    __syncthreads();
    return warp_totals[warp] + inc - v;
}

// Sorts the pairs p = row·top_k + slot by expert: counts, exclusive scan → offsets [E+1],
// scatter of p into sorted [pairs] (order within an expert is arbitrary: every pair's result is
// computed independently of its neighbours), and the tile list for the grouped GEMMs:
// tiles = [n_tiles, (expert, first sorted position) × n_tiles], one tile per tile_rows pairs of
// an expert, at most max_tiles. One block of 1024 threads; dynamic shared 2·E ints.
// (ids without __restrict__: moe_route_group writes them earlier in the same kernel, so they must
// not be read through the read-only cache.)
__device__ __forceinline__ void group_pairs_block(const int* ids, int pairs, int E, int tile_rows,
                                                  int* __restrict__ offsets, int* __restrict__ sorted,
                                                  int* __restrict__ tiles, int max_tiles, int* group_smem) {
    __shared__ int warp_totals[32];
    __shared__ int totals[2];
    int* count = group_smem;
    int* cursor = group_smem + E;
    const int tid = threadIdx.x;
    for (int e = tid; e < E; e += blockDim.x) count[e] = 0;
    __syncthreads();
    for (int p = tid; p < pairs; p += blockDim.x) {
        const int e = ids[p];
        if (e >= 0 && e < E) atomicAdd(&count[e], 1);
    }
    __syncthreads();

    // Each thread owns a run of consecutive experts; one block scan of the run sums.
    const int per = (E + blockDim.x - 1) / blockDim.x;
    const int e0 = min(tid * per, E), e1 = min(e0 + per, E);
    int c = 0, t = 0;
    for (int e = e0; e < e1; ++e) {
        c += count[e];
        t += (count[e] + tile_rows - 1) / tile_rows;
    }
    int cbase = block_exclusive_scan(c, warp_totals, &totals[0]);
    int tbase = block_exclusive_scan(t, warp_totals, &totals[1]);
    for (int e = e0; e < e1; ++e) {
        offsets[e] = cbase;
        cursor[e] = cbase;
        const int n = (count[e] + tile_rows - 1) / tile_rows;
        for (int j = 0; j < n && tbase + j < max_tiles; ++j) {
            tiles[1 + 2 * (tbase + j)] = e;
            tiles[2 + 2 * (tbase + j)] = cbase + j * tile_rows;
        }
        cbase += count[e];
        tbase += n;
    }
    if (tid == 0) {
        offsets[E] = totals[0];
        tiles[0] = min(totals[1], max_tiles);
    }
    __syncthreads();
    for (int p = tid; p < pairs; p += blockDim.x) {
        const int e = ids[p];
        if (e >= 0 && e < E) sorted[atomicAdd(&cursor[e], 1)] = p;
    }
}

extern "C" __global__ void moe_group_pairs(const int* __restrict__ ids, int pairs, int E, int tile_rows,
                                           int* __restrict__ offsets, int* __restrict__ sorted,
                                           int* __restrict__ tiles, int max_tiles) {
    pdl_begin();
    extern __shared__ int group_smem[];
    group_pairs_block(ids, pairs, E, tile_rows, offsets, sorted, tiles, max_tiles, group_smem);
}

// group_pairs_block's results for a few pairs (≤ GROUP_SMALL_PAIRS), with two barriers instead
// of its atomics and block scans: each pair counts its expert's pairs and its place among them,
// then each expert e counts the pairs and tiles of the experts below it (offsets[e], its first
// tile). The same offsets and tiles; the pairs of one expert land in `sorted` in pair order (any
// order is valid there). Every thread of the block must call it.
constexpr int GROUP_SMALL_PAIRS = 64;
__device__ __forceinline__ void group_pairs_small(const int* ids, int pairs, int E, int tile_rows,
                                                  int* __restrict__ offsets, int* __restrict__ sorted,
                                                  int* __restrict__ tiles, int max_tiles) {
    __shared__ int pair_expert[GROUP_SMALL_PAIRS], expert_tiles[GROUP_SMALL_PAIRS];
    const int tid = threadIdx.x;
    if (tid < pairs) pair_expert[tid] = ids[tid];
    __syncthreads();
    if (tid < pairs) {
        const int e = pair_expert[tid];
        int count = 0, before = 0, below = 0;
        for (int q = 0; q < pairs; ++q) {
            const int eq = pair_expert[q];
            count += eq == e;
            before += eq == e && q < tid;
            below += eq >= 0 && eq < e;
        }
        const bool valid = e >= 0 && e < E;
        // The expert's tile count, held by its first pair only.
        expert_tiles[tid] = valid && before == 0 ? (count + tile_rows - 1) / tile_rows : 0;
        if (valid) sorted[below + before] = tid;
    }
    __syncthreads();
    for (int e = tid; e <= E; e += blockDim.x) {
        int below = 0, first_tile = 0, count = 0;
        for (int p = 0; p < pairs; ++p) {
            const int ep = pair_expert[p];
            if (ep >= 0 && ep < e) {
                ++below;
                first_tile += expert_tiles[p];
            }
            count += ep == e;
        }
        offsets[e] = below;
        if (e == E) {
            tiles[0] = min(first_tile, max_tiles);
            continue;
        }
        const int n = (count + tile_rows - 1) / tile_rows;
        for (int j = 0; j < n && first_tile + j < max_tiles; ++j) {
            tiles[1 + 2 * (first_tile + j)] = e;
            tiles[2 + 2 * (first_tile + j)] = below + j * tile_rows;
        }
    }
}

// moe_route then moe_group_pairs in one block, for a decode step's few rows: one launch a layer
// fewer. Each warp routes rows warp, warp + 32, … with moe_route's arithmetic (in registers where
// E ≤ 256), the block waits, then groups the pairs with moe_group_pairs' results (by
// group_pairs_small where they are few). A multiple of 32 threads, ≥ 64 (moe.rs `route_group_threads`:
// a warp a row, 8 warps at least); dynamic shared max(warps·E floats, 2·E ints). At one row the
// launch ends ~5 µs after the router whatever its width (runs 24 and 33): warp 0's routing, the
// 8 picks, is most of it, and the other warps wait at the barrier. Up to 1024 threads
// (__launch_bounds__: at most 64 registers a thread, or the widest launch is refused).
constexpr int ROUTE_REGISTERS_PER_LANE = 8;
extern "C" __global__ void __launch_bounds__(1024) moe_route_group(const float* __restrict__ logits, int rows, int E, int top_k,
                                           int* __restrict__ ids, float* __restrict__ weights,
                                           float* __restrict__ shared_gate, int tile_rows,
                                           int* __restrict__ offsets, int* __restrict__ sorted,
                                           int* __restrict__ tiles, int max_tiles) {
    pdl_begin();
    extern __shared__ float route_group_smem[];
    const int warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    for (int row = warp; row < rows; row += warps) {
        if (E <= 32 * ROUTE_REGISTERS_PER_LANE)
            route_row_registers<ROUTE_REGISTERS_PER_LANE>(logits, row, E, top_k, ids, weights, shared_gate);
        else
            route_row(logits, row, E, top_k, route_group_smem + warp * E, ids, weights, shared_gate);
    }
    __syncthreads();  // the ids are written; the shared memory is free for the grouping
    if (rows * top_k <= GROUP_SMALL_PAIRS)
        group_pairs_small(ids, rows * top_k, E, tile_rows, offsets, sorted, tiles, max_tiles);
    else
        group_pairs_block(ids, rows * top_k, E, tile_rows, offsets, sorted, tiles, max_tiles,
                          reinterpret_cast<int*>(route_group_smem));
}
