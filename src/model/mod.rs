//! Drama 3's structure: typed config, the one table of checkpoint tensor names, and (later)
//! the order of operations of backbone, tower and codec.

pub mod backbone;
pub mod codec;
pub mod config;
pub mod frame;
pub mod load;
pub mod tower;
pub mod weights;
