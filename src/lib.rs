//! limelight: an OpenAI-compatible text-to-speech server for Fish Audio Drama 3.
//!
//! Modules follow the data flow; see `ARCHITECTURE.md` for the bird's-eye view and code map.

pub mod backend;
pub mod checkpoint;
pub mod cli;
pub mod inspect;
pub mod model;
pub mod synth;
