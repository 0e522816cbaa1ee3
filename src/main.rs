//! The `limelight` binary: parses the command line and dispatches; no logic lives here.

use std::process::ExitCode;

use clap::Parser;
use limelight::cli::{BenchCommand, CheckpointCommand, Cli, Command, SynthArgs};
use limelight::commands;
use limelight::inspect::{human, summary};
use limelight::model::load::Checkpoint;
use limelight::synth::{SynthOptions, SynthPlan};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve(args) => limelight::serve::run(&args).map_err(anyhow::Error::from),
        Command::Checkpoint(CheckpointCommand::Synth(args)) => synth(args),
        Command::Inspect(args) => match Checkpoint::open(&args.model) {
            Ok(ckpt) => {
                print!("{}", summary(&ckpt, args.context_length));
                #[cfg(feature = "cuda")]
                print!(
                    "{}",
                    limelight::inspect::batch_plan(
                        &ckpt,
                        args.context_length,
                        args.prefill_chunk,
                        args.gpu_memory_budget
                    )
                );
                Ok(())
            }
            Err(e) => Err(anyhow::anyhow!("checkpoint refused: {e}")),
        },
        Command::Say(args) => commands::say(&args).map(|f| {
            println!("wrote {}: {} frames, finish reason {}", args.out.display(), f.frames, f.reason.as_str());
        }),
        Command::Trace(args) => commands::trace_command(&args).map(|n| {
            println!("wrote {}: {n} tensors", args.out.display());
        }),
        Command::Bench(BenchCommand::Backbone(args)) => commands::bench_backbone(&args),
        Command::Bench(BenchCommand::Engine(args)) => commands::bench_engine(&args),
        Command::Bench(BenchCommand::Batch(args)) => commands::bench_batch(&args),
        Command::Bench(BenchCommand::Serve(args)) => commands::bench_serve(&args),
        Command::Bench(BenchCommand::Soak(args)) => commands::bench_soak(&args),
        Command::Bench(BenchCommand::Encode(args)) => commands::bench_encode(&args),
        Command::DecodeClip(args) => {
            limelight::voice::isolated::run_child(args.memory_bytes, args.cpu_seconds).map_err(anyhow::Error::from)
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", error_chain(&e));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes, each said once: a message that already ends with its cause's text
/// (`binding …: {source}`) does not repeat it (issue 16, finding 10: "Address already in use"
/// came out twice).
fn error_chain(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.ends_with(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

fn synth(args: SynthArgs) -> anyhow::Result<()> {
    let opts = SynthOptions { preset: args.preset, seed: args.seed, vq_backbone_codebooks: args.vq_backbone_codebooks };
    let started = std::time::Instant::now();
    let plan = SynthPlan::new(&opts);
    println!(
        "{:?} checkpoint, seed {}: {} model tensors ({}) in {} shards, {} codec tensors ({})",
        opts.preset,
        opts.seed,
        plan.model_specs.len(),
        human(plan.model_bytes()),
        plan.shards().len(),
        plan.codec_specs.len(),
        human(plan.codec_bytes()),
    );
    if args.dry_run {
        return Ok(());
    }
    let out = args.out.expect("clap requires --out without --dry-run");
    plan.write(&out).map_err(|e| anyhow::anyhow!("writing {}: {e}", out.display()))?;
    println!("wrote {} in {:.1} s", out.display(), started.elapsed().as_secs_f64());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cause_the_message_already_ends_with_is_said_once() {
        let refused = std::io::Error::new(std::io::ErrorKind::AddrInUse, "Address already in use (os error 98)");
        let bind = limelight::serve::ServeError::Bind { addr: "127.0.0.1:8080".parse().unwrap(), source: refused };
        assert_eq!(
            error_chain(&anyhow::Error::new(bind)),
            "binding 127.0.0.1:8080: Address already in use (os error 98)"
        );
        let context = anyhow::anyhow!("disk full").context("writing out.wav");
        assert_eq!(error_chain(&context), "writing out.wav: disk full", "other causes still follow");
    }
}
