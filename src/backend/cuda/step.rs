//! `kernels/step.cu`: the host's small jobs between the model's kernels in one generated frame
//! (building the next backbone input's embedding recipe from the sampled row, handing the row on
//! as the next frame's input, advancing the position), as kernels on fixed addresses so that the
//! whole frame can be captured as one CUDA graph.

use std::sync::Arc;

use cudarc::driver::CudaContext;

use super::Cuda;
use super::launch::{Dims, Kernel, KernelError, Module, embedded};
use crate::model::backbone::BackboneConfig;

pub struct StepKernels {
    embed_recipe: Kernel,
    advance: Kernel,
}

impl StepKernels {
    pub fn load(ctx: &Arc<CudaContext>) -> Result<StepKernels, KernelError> {
        let m = Module::load_overlapping(ctx, "step", embedded::STEP)?;
        Ok(StepKernels { embed_recipe: m.kernel("step_embed_recipe")?, advance: m.kernel("step_advance")? })
    }
}

/// How a frame row `[main, c0, c1..]` enters the backbone (`BackboneConfig::embed_row`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RowEmbedding {
    pub semantic_start: u32,
    /// Codes per codebook (the semantic band's width).
    pub codebook_vocab: usize,
    /// Codebooks 1..=k mixed into a semantic row.
    pub backbone_codebooks: usize,
    /// `1/√(1 + k)` as the host computes it, rounded to f32.
    pub scale: f32,
}

impl RowEmbedding {
    /// The backbone's embedding of a frame row, as `BackboneConfig::embed_row` computes it.
    pub fn for_backbone(c: &BackboneConfig) -> RowEmbedding {
        let k = c.vq_backbone_codebooks;
        RowEmbedding {
            semantic_start: c.semantic_start,
            codebook_vocab: c.codebook_vocab,
            backbone_codebooks: k,
            // As `BackboneConfig::embed_row` computes it (f64), rounded as `linear::embed` packs it.
            scale: (1.0 / ((1 + k) as f64).sqrt()) as f32,
        }
    }

    /// Words of the `embed_gather` recipe of one row: the header and at most k codebook rows.
    pub fn recipe_words(&self) -> usize {
        4 + self.backbone_codebooks
    }
}

/// Writes the one-row `embed_gather` recipe of the frame row at `row` into `recipe` (at least
/// [`RowEmbedding::recipe_words`] `u32`s). Capturable.
pub fn embed_recipe(cuda: &Cuda, e: &RowEmbedding, row: u64, recipe: u64) {
    embed_recipe_rows(cuda, e, row, 0, 1, recipe);
}

/// The `embed_gather` recipe of `n` frame rows, row b's at `row + 4 · stride · b` (`stride`
/// words apart, e.g. the GPU sampler's outputs), into `recipe` (at least `n` ·
/// [`RowEmbedding::recipe_words`] `u32`s). Capturable.
pub fn embed_recipe_rows(cuda: &Cuda, e: &RowEmbedding, rows: u64, stride: usize, n: usize, recipe: u64) {
    let args = [
        rows.into(),
        stride.into(),
        n.into(),
        recipe.into(),
        e.semantic_start.into(),
        e.codebook_vocab.into(),
        e.backbone_codebooks.into(),
        e.scale.into(),
    ];
    cuda.kernels.step.embed_recipe.launch(cuda.stream(), Dims::linear(n.div_ceil(32), 32), &args);
}

/// Copies the `width`-word frame row at `row` and its semantic flag to `input_row` and
/// `input_semantic`, then adds one to the `i32` counter at `position`. Capturable.
pub fn advance(cuda: &Cuda, row: u64, semantic: u64, input_row: u64, input_semantic: u64, position: u64, width: usize) {
    let args = [row.into(), semantic.into(), input_row.into(), input_semantic.into(), position.into(), width.into()];
    cuda.kernels.step.advance.launch(cuda.stream(), Dims::linear(1, 32), &args);
}
