// The glue of the per-frame step that runs as one CUDA graph (engine::cuda_frames): what the host
// did between the model's kernels, done on the device so that a replay needs no host data.
//   step_embed_recipe  the backbone's input-embedding recipe of the frame row the sampler wrote;
//   step_advance       the row becomes the next frame's input row, and the position counter moves.
#include "common.cuh"

// One thread per row, rows = n. rows: the sampler's frame rows [main, c0, c1..] (u32), row b's at
// b · row_stride words; recipe: the `embed_gather` recipe of the n rows (linear.cu): row b's header
// {token, first, count, scale bits} at 4b, its codebook rows at first = 4n + b·k. Semantic rows
// (main in [semantic_start, semantic_start + vocab)) mix codebooks 1..=k, clamped into the table,
// scaled by `scale` = 1/sqrt(1 + k); other rows (EOS) are the plain token embedding (`model.md`
// §5, `BackboneConfig::embed_row`).
extern "C" __global__ void step_embed_recipe(const uint32_t* __restrict__ rows, int row_stride, int n,
                                             uint32_t* __restrict__ recipe, uint32_t semantic_start, int vocab,
                                             int k, float scale) {
    pdl_begin();
    const int b = blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= n) return;
    const uint32_t* row = rows + (size_t)b * row_stride;
    const uint32_t token = row[0];
    const bool semantic = token >= semantic_start && token - semantic_start < (uint32_t)vocab;
    const uint32_t first = (uint32_t)(4 * n + b * k);
    recipe[4 * b] = token;
    recipe[4 * b + 1] = first;
    recipe[4 * b + 2] = semantic ? (uint32_t)k : 0u;
    recipe[4 * b + 3] = __float_as_uint(semantic ? scale : 1.f);
    for (int i = 1; i <= k; ++i) recipe[first + i - 1] = (uint32_t)(i * vocab) + min(row[1 + i], (uint32_t)(vocab - 1));
}

// One warp. Copies the frame row (`width` words) and its semantic flag into the input row of the
// next frame, then advances the position counter by one.
extern "C" __global__ void step_advance(const uint32_t* __restrict__ row, const uint32_t* __restrict__ semantic,
                                        uint32_t* __restrict__ input_row, uint32_t* __restrict__ input_semantic,
                                        int* __restrict__ position, int width) {
    pdl_begin();
    for (int i = threadIdx.x; i < width; i += blockDim.x) input_row[i] = row[i];
    if (threadIdx.x == 0) {
        *input_semantic = *semantic;
        *position += 1;
    }
}
