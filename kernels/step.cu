// The glue of the per-frame step that runs as one CUDA graph (engine::cuda_frames): what the host
// did between the model's kernels, done on the device so that a replay needs no host data.
//   step_embed_recipe  the backbone's input-embedding recipe of the frame row the sampler wrote;
//   step_advance       the row becomes the next frame's input row, and the position counter moves.
#include "common.cuh"

// One thread. row: the sampler's frame row [main, c0, c1..] (u32); recipe: the `embed_gather`
// recipe of that one row (linear.cu): header {token, 4, count, scale bits}, then `count` codebook
// rows. Semantic rows (main in [semantic_start, semantic_start + vocab)) mix codebooks 1..=k,
// clamped into the table, scaled by `scale` = 1/sqrt(1 + k); other rows (EOS) are the plain token
// embedding (`model.md` §5, `BackboneConfig::embed_row`).
extern "C" __global__ void step_embed_recipe(const uint32_t* __restrict__ row, uint32_t* __restrict__ recipe,
                                             uint32_t semantic_start, int vocab, int k, float scale) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    const uint32_t token = row[0];
    const bool semantic = token >= semantic_start && token - semantic_start < (uint32_t)vocab;
    recipe[0] = token;
    recipe[1] = 4;
    recipe[2] = semantic ? (uint32_t)k : 0u;
    recipe[3] = __float_as_uint(semantic ? scale : 1.f);
    for (int i = 1; i <= k; ++i) recipe[3 + i] = (uint32_t)(i * vocab) + min(row[1 + i], (uint32_t)(vocab - 1));
}

// One warp. Copies the frame row (`width` words) and its semantic flag into the input row of the
// next frame, then advances the position counter by one.
extern "C" __global__ void step_advance(const uint32_t* __restrict__ row, const uint32_t* __restrict__ semantic,
                                        uint32_t* __restrict__ input_row, uint32_t* __restrict__ input_semantic,
                                        int* __restrict__ position, int width) {
    for (int i = threadIdx.x; i < width; i += blockDim.x) input_row[i] = row[i];
    if (threadIdx.x == 0) {
        *input_semantic = *semantic;
        *position += 1;
    }
}
