//! Generation (`model.md` §8): the decode batch's step over streams (its draws on the host, or
//! on the GPU with `cuda_draws`), the loop from prompt rows to streamed PCM and its frame sources
//! (the host-driven step, or on the GPU the per-frame step as one CUDA graph), and traces of
//! every stage. The sampler and its counter-based randomness
//! live in `model::sampling` and `model::rng`, below the backends that also draw.

pub mod audio;
pub mod batch;
#[cfg(feature = "cuda")]
pub mod cuda_draws;
#[cfg(feature = "cuda")]
pub mod cuda_frames;
pub mod generate;
pub mod generation;
pub mod prefix;
pub mod stall;
pub mod trace;
