//! Generation (`model.md` §8): sampling and its counter-based randomness; the decode loop joins later.

#[cfg(feature = "cuda")]
pub mod cuda_frames;
pub mod generate;
pub mod rng;
pub mod sampling;
pub mod trace;
