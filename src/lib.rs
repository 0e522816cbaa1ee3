//! limelight: an OpenAI-compatible text-to-speech server for Fish Audio Drama 3.
//!
//! Modules follow the data flow; see `ARCHITECTURE.md` for the bird's-eye view and code map.

pub mod audio;
pub mod backend;
pub mod checkpoint;
pub mod cli;
pub mod commands;
pub mod engine;
pub mod inspect;
pub mod model;
pub mod request;
pub mod synth;
