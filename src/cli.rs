//! Command-line interface: `checkpoint synth`, `inspect`, `say`, `trace` (the server arrives with `serve`).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::synth::presets::Preset;

#[derive(Debug, Parser)]
#[command(name = "limelight", version, about = "OpenAI-compatible text-to-speech server for Fish Audio Drama 3")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Work with checkpoints in the published `fishaudio/drama-3` layout.
    #[command(subcommand)]
    Checkpoint(CheckpointCommand),
    /// Validate a checkpoint directory and print a summary; exits 1 if it is refused.
    Inspect(InspectArgs),
    /// Speak a text into a WAV file with the CPU reference engine.
    Say(SayArgs),
    /// Dump every stage's tensors for given prompt rows (for comparison with references).
    Trace(TraceArgs),
}

#[derive(Debug, Subcommand)]
pub enum CheckpointCommand {
    /// Write a random-weight checkpoint in the exact published layout.
    Synth(SynthArgs),
}

#[derive(Debug, Args)]
pub struct SynthArgs {
    /// `tiny` (small widths, for tests) or `full` (the real dimensions, about 40 GB).
    #[arg(long, value_enum, default_value = "tiny")]
    pub preset: Preset,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Directory to write (created if missing; existing checkpoint files are overwritten).
    #[arg(long, required_unless_present = "dry_run")]
    pub out: Option<PathBuf>,
    /// Residual codebooks summed into the backbone input (`vq_backbone_codebooks`);
    /// 0 selects the `mtp_shared_pre` placement.
    #[arg(long, default_value_t = 1)]
    pub vq_backbone_codebooks: usize,
    /// Print the planned files and sizes without writing anything.
    #[arg(long)]
    pub dry_run: bool,
}

#[derive(Debug, Args)]
pub struct InspectArgs {
    /// Checkpoint directory (config.json, tokenizer.json, safetensors shards, codec.pth).
    #[arg(long)]
    pub model: PathBuf,
    /// Rows of context to budget KV caches for.
    #[arg(long, default_value_t = 16384)]
    pub context_length: usize,
}

#[derive(Debug, Args)]
pub struct SayArgs {
    /// Checkpoint directory.
    #[arg(long)]
    pub model: PathBuf,
    /// The text to speak (inline tags such as `[sighs]` and `<|speaker:N|>` are allowed).
    #[arg(long)]
    pub text: String,
    /// Output WAV file (16-bit mono, 44.1 kHz).
    #[arg(long)]
    pub out: PathBuf,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    #[arg(long, default_value_t = 1.0)]
    pub temperature: f32,
    #[arg(long, default_value_t = 0.9)]
    pub top_p: f32,
    /// Cap on main-token candidates (default: none); codebook heads use min(top_k, 30).
    #[arg(long)]
    pub top_k: Option<u32>,
    /// Frames to generate at most (2048 samples each); reaching it ends with reason `length`.
    #[arg(long, default_value_t = 2048)]
    pub max_frames: usize,
}

#[derive(Debug, Args)]
pub struct TraceArgs {
    /// Checkpoint directory.
    #[arg(long)]
    pub model: PathBuf,
    /// Prompt rows: a safetensors file with an integer tensor `rows` [T, 11], or a JSON array of rows.
    #[arg(long)]
    pub prompt_rows: PathBuf,
    /// Output safetensors file.
    #[arg(long)]
    pub out: PathBuf,
}
