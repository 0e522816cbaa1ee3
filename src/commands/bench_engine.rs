//! `limelight bench engine`: the whole engine on the GPU, one generated frame at a time. Times
//! the per-frame step both ways the server can run it (one captured CUDA graph per frame, and
//! the host-driven loop that reads logits back for host sampling), the prompt, and the codec's
//! calls, and compares the step with its floor: the bytes one frame must read (the backbone's
//! decode row, the tower's 13 layers and 9 heads, their KV caches) over measured bandwidth.

use std::time::Instant;

use anyhow::Context;
use serde::Serialize;

use super::bench::decode_bytes_per_row;
use crate::backend::cuda::admission::{MemoryPlan, admit, gib};
use crate::backend::cuda::profile::external_range;
use crate::backend::cuda::{Cuda, CudaOptions};
use crate::cli::{BenchEngineArgs, ProfilerRange};
use crate::engine::cuda_frames::CudaFrames;
use crate::engine::generate::{Engine, GenerateOptions, ResidentModel};
use crate::model::codec::StreamingDecoder;
use crate::model::config::ModelConfig;
use crate::model::frame::Rows;
use crate::model::load::Checkpoint;
use crate::model::sampling::SamplingParams;

const TEXT: &str = "Hello from limelight, streaming a random-weight Drama three from the GPU, frame by frame.";

/// Everything one run measured.
#[derive(Debug, Serialize)]
pub struct EngineBench {
    pub gpu: String,
    pub model: String,
    pub context: usize,
    pub load_s: f64,
    pub graph_capture_ms: f64,
    pub prompt_rows: usize,
    /// Prompt rows per prefill chunk of the timed path.
    pub prefill_chunk: usize,
    /// Backbone + tower prefill of the prompt, to the first frame's inputs (synced).
    pub prompt_ms: f64,
    pub frames: usize,
    /// One replay and one read-back of the frame row per frame.
    pub graph_ms_per_frame: f64,
    /// Separate launches, logits read back and sampled on the host (`--no-cuda-graph`).
    pub host_loop_ms_per_frame: f64,
    pub step_bytes_per_frame: u64,
    pub copy_bandwidth_gb_per_s: f64,
    pub step_floor_ms: f64,
    pub graph_ratio_to_floor: f64,
    /// The codec's first call of a request (one frame).
    pub codec_first_frame_ms: f64,
    /// Steady calls of `group` frames each (the server's groups grow to `codec_group`'s
    /// maximum, 8): `(group, ms per frame)`.
    pub codec_ms_per_frame_by_group: Vec<(usize, f64)>,
    pub used_bytes: u64,
    pub pool_driver_allocations_while_timed: u64,
}

pub fn bench_engine(args: &BenchEngineArgs) -> anyhow::Result<EngineBench> {
    let t = Instant::now();
    let ckpt = Checkpoint::open(&args.model).context("checkpoint refused")?;
    let options =
        CudaOptions { memory_budget: args.gpu_memory_budget, context: args.context_length, ..CudaOptions::default() };
    let cuda = Cuda::open(&options)?;
    let prompt = super::bench::bench_prompt(&ckpt, TEXT, args.prompt_rows)?;
    anyhow::ensure!(prompt.len() + args.frames <= args.context_length, "--frames past --context-length");
    let plan = MemoryPlan::for_engine(&ckpt, args.context_length, prompt.len());
    admit(&plan, cuda.budget().cap() - cuda.budget().used(), "the budget")?;
    let model = ResidentModel::load(&ckpt, &cuda)?;
    cuda.synchronize();
    let load_s = t.elapsed().as_secs_f64();

    let host_loop = Engine::new(&cuda, &ckpt, &model)?;
    let t = Instant::now();
    anyhow::ensure!(args.prefill_chunk > 0, "--prefill-chunk must be at least 1");
    let frames = CudaFrames::for_model(&cuda, &ckpt, &model)?.with_prefill_chunk(args.prefill_chunk);
    let graph_capture_ms = t.elapsed().as_secs_f64() * 1e3;
    let graph = Engine::new(&cuda, &ckpt, &model)?.with_device_frames(&frames);

    let opts = GenerateOptions { params: SamplingParams::default(), seed: 7, max_frames: args.frames, stall: None };
    // Warm-up of both paths (lazily built tables, the pool's size classes, the codec).
    time_frames(&cuda, &host_loop, &prompt, &GenerateOptions { max_frames: 4, ..opts.clone() })?;
    time_frames(&cuda, &graph, &prompt, &GenerateOptions { max_frames: 4, ..opts.clone() })?;
    let before = cuda.pool().stats().driver_allocations;
    let timed = time_frames(&cuda, &graph, &prompt, &opts)?;
    let allocations = cuda.pool().stats().driver_allocations - before;
    let host = time_frames(&cuda, &host_loop, &prompt, &opts)?;
    let codec_first_frame_ms = time_codec(&cuda, &model, &timed.rows, 1)?.0;
    let codec_ms_per_frame_by_group = [8, 16, 32]
        .into_iter()
        .map(|group| Ok((group, time_codec(&cuda, &model, &timed.rows, group)?.1)))
        .collect::<anyhow::Result<Vec<_>>>()?;

    let copy_bandwidth_gb_per_s = cuda.measure_copy_bandwidth(1 << 30)?;
    let position = prompt.len() + args.frames / 2;
    let step_bytes_per_frame =
        decode_bytes_per_row(&ckpt.dims, position) + tower_bytes_per_frame(&ckpt.config, position);
    let step_floor_ms = step_bytes_per_frame as f64 / (copy_bandwidth_gb_per_s * 1e9) * 1e3;
    if let Some(range) = args.profiler_range {
        run_profiler_range(&cuda, &graph, &prompt, &opts, range)?;
    }
    Ok(EngineBench {
        gpu: cuda.info().name.clone(),
        model: args.model.display().to_string(),
        context: args.context_length,
        load_s,
        graph_capture_ms,
        prompt_rows: prompt.len(),
        prefill_chunk: args.prefill_chunk,
        prompt_ms: timed.prompt_ms,
        frames: args.frames,
        graph_ms_per_frame: timed.ms_per_frame,
        host_loop_ms_per_frame: host.ms_per_frame,
        step_bytes_per_frame,
        copy_bandwidth_gb_per_s,
        step_floor_ms,
        graph_ratio_to_floor: timed.ms_per_frame / step_floor_ms,
        codec_first_frame_ms,
        codec_ms_per_frame_by_group,
        used_bytes: cuda.budget().used(),
        pool_driver_allocations_while_timed: allocations,
    })
}

struct FrameTiming {
    prompt_ms: f64,
    ms_per_frame: f64,
    rows: Rows,
}

/// The prompt, then `max_frames` frames (EOS or not: the bench times the step), no codec.
fn time_frames(
    cuda: &Cuda,
    engine: &Engine<'_, Cuda>,
    prompt: &Rows,
    opts: &GenerateOptions,
) -> anyhow::Result<FrameTiming> {
    cuda.synchronize();
    let t = Instant::now();
    let mut frames = engine.frames(prompt, opts)?;
    cuda.synchronize();
    let prompt_ms = t.elapsed().as_secs_f64() * 1e3;
    let mut rows = Rows::new(prompt.codebooks());
    let t = Instant::now();
    for f in 0..opts.max_frames {
        rows.push_row(&frames.next_frame(f + 1 == opts.max_frames)?);
    }
    let ms_per_frame = t.elapsed().as_secs_f64() * 1e3 / opts.max_frames.max(1) as f64;
    Ok(FrameTiming { prompt_ms, ms_per_frame, rows })
}

/// The graph path's prompt, or two of its frame steps after eight unprofiled ones, inside an
/// external profiler's range (nothing else runs on the device meanwhile).
fn run_profiler_range(
    cuda: &Cuda,
    engine: &Engine<'_, Cuda>,
    prompt: &Rows,
    opts: &GenerateOptions,
    range: ProfilerRange,
) -> anyhow::Result<()> {
    const WARM_FRAMES: usize = 8;
    const PROFILED_FRAMES: usize = 2;
    let opts = GenerateOptions { max_frames: WARM_FRAMES + PROFILED_FRAMES, ..opts.clone() };
    cuda.synchronize();
    let mut frames = match range {
        ProfilerRange::Prompt => external_range(|| {
            let frames = engine.frames(prompt, &opts);
            cuda.synchronize();
            frames
        })?,
        ProfilerRange::Step => engine.frames(prompt, &opts)?,
    };
    for _ in 0..WARM_FRAMES {
        frames.next_frame(false)?;
    }
    cuda.synchronize();
    if range == ProfilerRange::Step {
        external_range(|| {
            for f in 0..PROFILED_FRAMES {
                frames.next_frame(f + 1 == PROFILED_FRAMES)?;
            }
            cuda.synchronize();
            anyhow::Ok(())
        })?;
    }
    Ok(())
}

/// A fresh stream's first call (one frame), then the rest in calls of `group` frames (each call
/// returns its PCM to the host, as the server's do): (first call ms, ms per frame of the rest).
fn time_codec(cuda: &Cuda, model: &ResidentModel<Cuda>, rows: &Rows, group: usize) -> anyhow::Result<(f64, f64)> {
    let codes = |t: usize| rows.row(t)[1..].to_vec();
    let mut decoder = StreamingDecoder::new(&model.codec, cuda);
    cuda.synchronize();
    let t = Instant::now();
    decoder.push(&codes(0))?;
    let first_ms = t.elapsed().as_secs_f64() * 1e3;
    let groups = (rows.len() - 1) / group;
    let t = Instant::now();
    for g in 0..groups {
        let frames: Vec<u32> = (1 + group * g..1 + group * (g + 1)).flat_map(codes).collect();
        decoder.push(&frames)?;
    }
    let per_frame = t.elapsed().as_secs_f64() * 1e3 / (group * groups).max(1) as f64;
    Ok((first_ms, per_frame))
}

/// Bytes one tower frame must read at least: every tower layer's dense weights once (eh_proj,
/// wqkv, wo, w1, w3, w2, one embedding row, the small norms), each layer's KV cache up to
/// `position`, and the 9 heads.
pub fn tower_bytes_per_frame(c: &ModelConfig, position: usize) -> u64 {
    let a = &c.audio_decoder_config;
    let (dim, hd, inter, vocab) = (a.dim, a.head_dim, a.intermediate_size, a.vocab_size);
    let bf16 = |rows: usize, cols: usize| (rows * cols * 2) as u64;
    let qkv_rows = 2 * a.n_head * hd + 2 * a.n_local_heads * hd;
    let layer = bf16(dim, 2 * dim)
        + bf16(qkv_rows, dim)
        + bf16(dim, a.n_head * hd)
        + 3 * bf16(inter, dim)
        + bf16(1, dim)
        + (6 * dim + 2 * hd) as u64 * 4
        + (2 * a.n_local_heads * hd * 2 * position) as u64;
    let layers = (a.shared_enrichment_layers + a.num_codebooks - 1) as u64;
    layers * layer + (a.num_codebooks - 1) as u64 * bf16(vocab, dim)
}

impl EngineBench {
    pub fn summary(&self) -> String {
        format!(
            "GPU {gpu}; context {ctx}; loaded in {load:.1} s; graph captured in {cap:.1} ms\n\
             prompt {rows} rows in chunks of {chunk}: {pm:.1} ms\n\
             frame step over {frames} frames: {g:.3} ms/frame as a CUDA graph, {h:.3} ms/frame as the host loop\n\
             step floor: {bytes} bytes/frame at {bw:.0} GB/s = {floor:.3} ms; graph/floor = {ratio:.1}\n\
             codec: first frame {cf:.2} ms; ms/frame by group size: {cg}\n\
             device memory in use {used}; driver allocations while timed: {allocs}",
            gpu = self.gpu,
            ctx = self.context,
            load = self.load_s,
            cap = self.graph_capture_ms,
            rows = self.prompt_rows,
            chunk = self.prefill_chunk,
            pm = self.prompt_ms,
            frames = self.frames,
            g = self.graph_ms_per_frame,
            h = self.host_loop_ms_per_frame,
            bytes = self.step_bytes_per_frame,
            bw = self.copy_bandwidth_gb_per_s,
            floor = self.step_floor_ms,
            ratio = self.graph_ratio_to_floor,
            cf = self.codec_first_frame_ms,
            cg = self
                .codec_ms_per_frame_by_group
                .iter()
                .map(|(g, ms)| format!("{g}: {ms:.3}"))
                .collect::<Vec<_>>()
                .join(", "),
            used = gib(self.used_bytes),
            allocs = self.pool_driver_allocations_while_timed,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::presets::Preset;
    use crate::synth::{SynthOptions, SynthPlan};

    #[test]
    fn full_tower_floor_counts_thirteen_layers_and_nine_heads() {
        let plan = SynthPlan::new(&SynthOptions { preset: Preset::Full, seed: 0, vq_backbone_codebooks: 1 });
        let a = &plan.config.audio_decoder_config;
        let bytes = tower_bytes_per_frame(&plan.config, 0);
        let heads = 9 * (a.vocab_size * a.dim * 2) as u64;
        // 13 layers × 73.4 M bf16 parameters (1.91 GB) plus the heads (0.15 GB).
        assert!(bytes > heads && (1.9e9..2.2e9).contains(&(bytes as f64)), "{bytes} bytes per tower frame");
        let kv = 13 * 2 * a.n_local_heads * a.head_dim * 2;
        assert_eq!(tower_bytes_per_frame(&plan.config, 10) - bytes, 10 * kv as u64);
    }
}
