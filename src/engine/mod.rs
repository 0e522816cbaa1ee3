//! Generation (`model.md` §8): the loop from prompt rows to streamed PCM and its frame sources
//! (the host-driven loop, or on the GPU the per-frame step as one CUDA graph), sampling and its
//! counter-based randomness, and traces of every stage.

pub mod batch;
#[cfg(feature = "cuda")]
pub mod cuda_frames;
pub mod generate;
pub mod rng;
pub mod sampling;
pub mod trace;
