//! Command-line interface: `checkpoint synth` and `inspect` (the server arrives with `serve`).

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
