//! Drama 3's structure: typed config, the one table of checkpoint tensor names, the order of
//! operations of backbone, tower and codec (for one request, or one row per request in the
//! decode batch), the per-request state types, and the sampler with its counter-based
//! randomness (`model.md` §8: the same draws on every backend).

pub mod backbone;
pub mod codec;
pub mod config;
pub mod file_order;
pub mod frame;
pub mod load;
pub mod memory;
pub mod rng;
pub mod sampling;
pub mod tower;
pub mod vocabulary;
pub mod weights;
