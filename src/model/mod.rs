//! Drama 3's structure: typed config, the one table of checkpoint tensor names, the order of
//! operations of backbone, tower and codec (for one request, or one row per request in the
//! decode batch), and the per-request state types.

pub mod backbone;
pub mod codec;
pub mod config;
pub mod frame;
pub mod load;
pub mod tower;
pub mod weights;
