// Saved request state (backend::cuda::saved): one launch copies every piece of a save or a restore
// between a request's state buffers and the pages of the saved-state arena.
#include "common.cuh"

// One block per piece. table: `n` pieces of three u64 words {src, dst, bytes}; src and dst are
// 16-byte aligned (buffers and pages are 256-aligned, pieces start on 256-byte boundaries of
// both). A plain copy: the bytes arrive unchanged, so a restored state is the saved one bit for bit.
extern "C" __global__ void saved_copy_pieces(const unsigned long long* __restrict__ table, int n) {
    const int p = blockIdx.x;
    if (p >= n) return;
    const char* src = reinterpret_cast<const char*>(table[3 * p]);
    char* dst = reinterpret_cast<char*>(table[3 * p + 1]);
    const size_t bytes = (size_t)table[3 * p + 2];
    const size_t vectors = bytes / 16;
    const uint4* s = reinterpret_cast<const uint4*>(src);
    uint4* d = reinterpret_cast<uint4*>(dst);
    for (size_t i = threadIdx.x; i < vectors; i += blockDim.x) d[i] = s[i];
    for (size_t i = vectors * 16 + threadIdx.x; i < bytes; i += blockDim.x) dst[i] = src[i];
}
