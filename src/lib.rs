//! limelight: an OpenAI-compatible text-to-speech server for Fish Audio Drama 3.
//!
//! Modules follow the data flow; see `ARCHITECTURE.md` for the bird's-eye view and code map.

pub mod api;
pub mod audio;
pub mod backend;
pub mod checkpoint;
pub mod cli;
pub mod commands;
pub mod config;
pub mod engine;
pub mod http;
pub mod inspect;
pub mod model;
pub mod request;
pub mod scheduler;
pub mod serve;
pub mod service;
pub mod synth;
pub mod telemetry;
pub mod voice;
