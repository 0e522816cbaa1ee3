//! The bodies of the CLI subcommands that run the model (`say`, `trace`): load, run, write.
//! Argument parsing stays in `cli.rs`; this is the only place besides `main.rs` using `anyhow`.

#[cfg(feature = "cuda")]
pub mod bench;
#[cfg(feature = "cuda")]
pub mod bench_batch;
#[cfg(feature = "cuda")]
pub mod bench_encode;
#[cfg(feature = "cuda")]
pub mod bench_engine;
pub mod bench_serve;
pub mod soak;
mod soak_plot;

use std::path::Path;

use anyhow::{Context, bail};

use crate::audio::CODEC_SAMPLE_RATE;
use crate::audio::wav::write_wav;
use crate::backend::cpu::Cpu;
use crate::checkpoint::Dtype;
use crate::checkpoint::safetensors::SafetensorsFile;
use crate::checkpoint::safetensors_writer::{TensorHeader, f32_bytes, write_safetensors};
use crate::cli::{
    BenchBackboneArgs, BenchBatchArgs, BenchEncodeArgs, BenchEngineArgs, BenchServeArgs, BenchSoakArgs, SayArgs,
    TraceArgs,
};
use crate::engine::generate::{Engine, FinishReason, Finished, GenerateOptions, PREFILL_CHUNK, ResidentModel};
use crate::engine::trace::trace;
use crate::model::codec::encode::CodecEncoder;
use crate::model::frame::Rows;
use crate::model::load::Checkpoint;
use crate::model::sampling::SamplingParams;
use crate::request::chunked::{CHUNK_LIMITS, ChunkVoices, ChunkedText, chunk_texts, stall_guard};
use crate::request::normalize::normalize;
use crate::request::prompt::{PromptBuilder, Reference};
use crate::request::text::{CallerText, Field};
use crate::scheduler::{ChunkPrompt, MoreChunks, chunk_seed, holds_chunk, retries_chunk, retry_seed};
use crate::voice::clip::{self, ClipLimits};
use crate::voice::store::{StoreLimits, VoiceStore};

/// `limelight say`: text → WAV on the CPU backend. Text is normalised and long text runs as
/// chunks of one generation, as `serve` runs a request (`request::chunked`), so the bytes are
/// the server's for the same text, voice and seed.
pub fn say(args: &SayArgs) -> anyhow::Result<Finished> {
    let ckpt = Checkpoint::open(&args.model).context("checkpoint refused")?;
    let model = ResidentModel::load(&ckpt, &Cpu)?;
    let engine = Engine::new(&Cpu, &ckpt, &model)?;
    let references = say_references(args, &ckpt)?;
    let text = if args.no_normalize { args.text.clone() } else { normalize(&args.text) };
    let text = CallerText::check(text, Field::Input).context("`--text`")?;
    let texts = chunk_texts(&text, CHUNK_LIMITS);
    let stall = stall_guard(texts.len());
    let builder = PromptBuilder::for_checkpoint(&ckpt);
    builder.check_text(&text).context("`--text`")?;
    let (prompt, first_frames, mut more) =
        ChunkedText::start(builder, ChunkVoices::All(references), false, texts, args.max_frames)
            .context("`--text` or the reference")?;
    let params = SamplingParams { temperature: args.temperature, top_p: args.top_p, top_k: args.top_k };
    params.validate().context("sampling parameters")?;
    let opts = |seed: u64, max_frames: usize| GenerateOptions { params, seed, max_frames, stall };
    // The served engine's prompt chunks (restarting after the voice's rows), so the bytes are the
    // same; and its chunk policy (`scheduler::worker::chunks`): a later chunk's audio is held
    // until it ends, and one the runaway guard cut is generated once more with its retry seed.
    let mut generation =
        engine.start_prompt(&prompt.rows, prompt.voice_prefix(false), &opts(chunk_seed(args.seed, 0), first_frames))?;
    let (mut pcm, mut rows, mut cut) = (Vec::new(), Rows::new(ckpt.dims.codebooks), false);
    let (mut chunk, mut current, mut retried): (usize, Option<ChunkPrompt>, bool) = (0, None, false);
    loop {
        while !engine.prefill_generation(&mut generation, PREFILL_CHUNK)? {}
        let reason = loop {
            let stepped = engine.step(&mut [&mut generation]).pop().expect("one result per generation")?;
            pcm.extend_from_slice(&stepped.pcm);
            if let Some(reason) = stepped.finished {
                break reason;
            }
        };
        let guarded = current.as_ref().is_some_and(|p| p.guarded);
        let held = current.as_ref().is_some_and(|p| holds_chunk(p, stall)) && !retried;
        let retry = held && retries_chunk(reason, chunk, guarded, retried);
        if held {
            pcm.extend(generation.settle_audio(!retry)?.pcm);
        }
        if retry {
            let again = current.as_ref().expect("a later chunk keeps its prompt");
            let options = opts(retry_seed(args.seed, chunk), again.max_frames);
            engine.continue_prompt(&mut generation, &again.rows, again.prefix, &options)?;
            retried = true;
            continue;
        }
        retried = false;
        cut |= reason.is_cut();
        let produced = generation.produced().clone();
        (0..produced.len()).for_each(|t| rows.push_row(produced.row(t)));
        let next = match more.as_mut().and_then(|m| m.next(&produced)) {
            Some(next) => next.map_err(anyhow::Error::msg)?,
            None => {
                let reason = if cut { FinishReason::Length } else { reason };
                write_wav(&args.out, &pcm, CODEC_SAMPLE_RATE)
                    .with_context(|| format!("writing {}", args.out.display()))?;
                return Ok(Finished { reason, frames: rows.len(), rows });
            }
        };
        chunk += 1;
        engine.continue_prompt(
            &mut generation,
            &next.rows,
            next.prefix,
            &opts(chunk_seed(args.seed, chunk), next.max_frames),
        )?;
        if holds_chunk(&next, stall) {
            generation.hold_audio();
        }
        current = Some(next);
    }
}

/// The voice `say` speaks in: a stored voice, a reference clip encoded here, or none.
fn say_references(args: &SayArgs, ckpt: &Checkpoint) -> anyhow::Result<Vec<Reference>> {
    if let (Some(name), Some(dir)) = (&args.voice, &args.voices_dir) {
        let (store, refused) = VoiceStore::open(dir, StoreLimits::default())?;
        for r in refused {
            eprintln!("warning: voice file {} refused: {}", r.path.display(), r.reason);
        }
        let voice = store.get(name).with_context(|| format!("`--voice {name}`: no such voice in {}", dir.display()))?;
        return Ok(vec![Reference::from_frames(voice.ref_text.clone(), &voice.codes, voice.codebooks)]);
    }
    let (Some(path), Some(text)) = (&args.reference_audio, &args.reference_text) else { return Ok(Vec::new()) };
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let hint = path.extension().and_then(|e| e.to_str());
    let clip = clip::decode(&bytes, hint, &ClipLimits { max_bytes: usize::MAX, ..ClipLimits::default() })
        .with_context(|| format!("`--reference-audio {}`", path.display()))?;
    let encoder = CodecEncoder::load(ckpt, &Cpu)?;
    let codes = encoder.encode(&Cpu, &clip.samples)?;
    Ok(vec![Reference::from_frames(text.clone(), &codes, encoder.codes_per_frame())])
}

/// `limelight trace`: every stage's tensors for given prompt rows, as safetensors.
pub fn trace_command(args: &TraceArgs) -> anyhow::Result<usize> {
    let ckpt = Checkpoint::open(&args.model).context("checkpoint refused")?;
    let model = ResidentModel::load(&ckpt, &Cpu)?;
    let engine = Engine::new(&Cpu, &ckpt, &model)?;
    let rows = read_rows(&args.prompt_rows, ckpt.dims.codebooks)?;
    let tensors = trace(&engine, &rows)?;
    let headers: Vec<TensorHeader<'_>> =
        tensors.iter().map(|t| TensorHeader { name: &t.name, dtype: Dtype::F32, shape: &t.shape }).collect();
    write_safetensors(&args.out, &headers, |i| f32_bytes(&tensors[i].values))
        .with_context(|| format!("writing {}", args.out.display()))?;
    Ok(tensors.len())
}

/// Prompt rows from a safetensors file holding an integer tensor `rows` `[T, 1 + codebooks]`
/// (e.g. a golden fixture), or from JSON: an array of rows.
fn read_rows(path: &Path, codebooks: usize) -> anyhow::Result<Rows> {
    let width = codebooks + 1;
    let flat: Vec<u32> = if path.extension().is_some_and(|e| e == "safetensors") {
        let file = SafetensorsFile::open(path)?;
        let view = file.view("rows").with_context(|| format!("{}: no tensor `rows`", path.display()))?;
        if view.shape.len() != 2 || view.shape[1] != width {
            bail!("{}: `rows` has shape {:?}, expected [T, {width}]", path.display(), view.shape);
        }
        match view.dtype {
            Dtype::I64 => {
                view.bytes.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap()) as u32).collect()
            }
            Dtype::I32 => {
                view.bytes.chunks_exact(4).map(|c| i32::from_le_bytes(c.try_into().unwrap()) as u32).collect()
            }
            d => bail!("{}: `rows` must be I64 or I32, found {d}", path.display()),
        }
    } else {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let rows: Vec<Vec<u32>> =
            serde_json::from_str(&text).with_context(|| format!("{}: rows JSON", path.display()))?;
        if let Some((i, r)) = rows.iter().enumerate().find(|(_, r)| r.len() != width) {
            bail!("{}: row {i} has {} values, expected {width}", path.display(), r.len());
        }
        rows.concat()
    };
    Ok(Rows::from_flat(codebooks, flat))
}

/// `limelight bench engine`: the per-frame step (graph and host loop), prompt and codec timed.
pub fn bench_engine(args: &BenchEngineArgs) -> anyhow::Result<()> {
    #[cfg(feature = "cuda")]
    {
        let result = bench_engine::bench_engine(args)?;
        report(&result.summary(), &result, args.json.as_deref())?;
        if result.pool_driver_allocations_while_timed != 0 {
            bail!(
                "the frame step allocated {} buffers from the driver while timed",
                result.pool_driver_allocations_while_timed
            );
        }
        Ok(())
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = args;
        bail!("this binary was built without the `cuda` feature: rebuild with default features to use the GPU")
    }
}

/// `limelight bench encode`: the codec encoder on the GPU, in seconds of audio per second.
pub fn bench_encode(args: &BenchEncodeArgs) -> anyhow::Result<()> {
    #[cfg(feature = "cuda")]
    {
        let result = bench_encode::bench_encode(args)?;
        report(&result.summary(), &result, args.json.as_deref())
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = args;
        bail!("this binary was built without the `cuda` feature: rebuild with default features to use the GPU")
    }
}

/// `limelight bench batch`: the decode batch's step timed per batch size against its floor.
pub fn bench_batch(args: &BenchBatchArgs) -> anyhow::Result<()> {
    #[cfg(feature = "cuda")]
    {
        let result = bench_batch::bench_batch(args)?;
        report(&result.summary(), &result, args.json.as_deref())?;
        if result.driver_allocations() != 0 {
            bail!("the decode batch allocated {} buffers from the driver while timed", result.driver_allocations());
        }
        Ok(())
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = args;
        bail!("this binary was built without the `cuda` feature: rebuild with default features to use the GPU")
    }
}

/// `limelight bench serve`: the load test's table, optionally as JSON too; fails if a request did.
pub fn bench_serve(args: &BenchServeArgs) -> anyhow::Result<()> {
    let result = bench_serve::bench_serve(args)?;
    println!("{}", result.summary());
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&result)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if result.failed() != 0 {
        bail!("{} requests failed", result.failed());
    }
    Ok(())
}

/// `limelight bench soak`: prints the outcome table and drift; writes the JSON, the samples as
/// CSV and their plot as SVG into `--out`; fails on any 5xx or wrongly ended body.
pub fn bench_soak(args: &BenchSoakArgs) -> anyhow::Result<()> {
    let report = soak::soak(args)?;
    println!("{}", report.summary());
    if let Some(dir) = &args.out {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let write = |name: &str, text: String| {
            let path = dir.join(name);
            std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))
        };
        write("soak.json", serde_json::to_string_pretty(&report)?)?;
        write("soak.csv", report.csv())?;
        write("soak.svg", report.svg())?;
    }
    if report.faults() != 0 {
        bail!("{} requests ended in a 5xx or a wrongly ended body", report.faults());
    }
    if report.count(soak::Outcome::Complete) == 0 {
        bail!("no request completed");
    }
    Ok(())
}

/// `limelight bench backbone`: prints the summary and optionally writes the JSON.
pub fn bench_backbone(args: &BenchBackboneArgs) -> anyhow::Result<()> {
    #[cfg(feature = "cuda")]
    {
        let result = bench::bench_backbone(args)?;
        report(&result.summary(), &result, args.json.as_deref())?;
        if result.pool_allocations_after_seal != 0 {
            bail!(
                "the decode path allocated {} buffers from the driver after warm-up",
                result.pool_allocations_after_seal
            );
        }
        Ok(())
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = args;
        bail!("this binary was built without the `cuda` feature: rebuild with default features to use the GPU")
    }
}

/// Prints a bench's summary and, when asked, writes every number as JSON.
#[cfg(feature = "cuda")]
fn report(summary: &str, numbers: &impl serde::Serialize, json: Option<&Path>) -> anyhow::Result<()> {
    println!("{summary}");
    if let Some(path) = json {
        std::fs::write(path, serde_json::to_string_pretty(numbers)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
