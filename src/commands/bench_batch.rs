//! `limelight bench batch`: the decode batch on the GPU. For each batch size B it opens B streams
//! (one prompt, distinct seeds), runs their prompts, then times steps of all B together: the
//! frame step alone (`Engine::next_frames`: restricted head, draws on the GPU (`--host-draws`:
//! on the host), tower, backbone) and the
//! whole step with each stream's codec (`Engine::step`). Each is compared with its floor: the
//! bytes one step must read over the measured copy bandwidth. A step reads the dense weights
//! once for every row, the routed experts its rows use (the union; expected under uniform
//! routing, `E·(1 − (1 − k/E)^B)` per layer, as random weights route), and each row's own state.

use std::time::Instant;

use anyhow::Context;
use serde::Serialize;

use super::bench::decode_bytes_per_row;
use super::bench_engine::tower_bytes_per_frame;
use crate::backend::cuda::admission::{MemoryPlan, admit, gib};
use crate::backend::cuda::profile::{self, KernelTime};
use crate::backend::cuda::{Cuda, CudaOptions};
use crate::cli::BenchBatchArgs;
use crate::engine::batch::Stream;
use crate::engine::cuda_draws::{CudaDraws, GraphStats};
use crate::engine::generate::{Engine, GenerateOptions, Generation, ResidentModel};
use crate::model::config::{Dims, LayerType, ModelConfig};
use crate::model::load::Checkpoint;
use crate::model::sampling::SamplingParams;

const TEXT: &str = "Hello from limelight, streaming a random-weight Drama three from the GPU, frame by frame.";

/// One batch size's timings.
#[derive(Debug, Serialize)]
pub struct BatchRow {
    pub batch: usize,
    /// The frame step over all B streams, no codec (ms per step).
    pub frame_step_ms: f64,
    /// The whole step: frames and each stream's codec calls (ms per step).
    pub step_ms: f64,
    /// Frames per second of the whole step (B frames per step).
    pub frames_per_s: f64,
    /// The frame step's phases, each synced (`StepPhase`), its launches run one by one (a
    /// captured step is one launch): restricted logits and main draws, the tower with its head
    /// draws, the backbone decode.
    pub main_draws_ms: f64,
    pub tower_ms: f64,
    pub backbone_ms: f64,
    /// The B prompts run together (`Engine::prefill_streams`, chunk by chunk), ms.
    pub prefill_ms: f64,
    /// That prefill per kernel, where `--profile` asked for this size.
    pub prefill_profile: Option<StepProfile>,
    /// Bytes the frame step must read at least.
    pub floor_bytes: u64,
    pub floor_ms: f64,
    pub frame_step_ratio_to_floor: f64,
    pub driver_allocations_while_timed: u64,
    /// Streams that drew EOS during the whole-step timing and were replaced by fresh ones.
    pub streams_restarted: usize,
    /// The whole step per kernel, where `--profile` asked for this size.
    pub profile: Option<StepProfile>,
}

/// Device time per kernel in one whole step (averaged over the profiled steps), against the
/// step's wall time with the events on: what the device is not busy with is host work and syncs.
#[derive(Debug, Serialize)]
pub struct StepProfile {
    pub wall_ms: f64,
    pub kernels: Vec<KernelTime>,
}

impl StepProfile {
    fn table(&self) -> String {
        let busy: f64 = self.kernels.iter().map(|k| k.total_ms).sum();
        let mut out = format!(
            "  profiled step {:.2} ms wall, {:.2} ms of kernels ({:.0}% busy)\n",
            self.wall_ms,
            busy,
            100.0 * busy / self.wall_ms
        );
        for k in self.kernels.iter().take(24) {
            out.push_str(&format!(
                "  {:>8.3} ms {:>5.1}% {:>6} launches  {}\n",
                k.total_ms,
                100.0 * k.total_ms / busy,
                k.launches,
                k.name
            ));
        }
        out
    }
}

/// Everything one run measured.
#[derive(Debug, Serialize)]
pub struct BatchBench {
    pub gpu: String,
    pub model: String,
    pub context: usize,
    pub prompt_rows: usize,
    pub frames: usize,
    /// Where the draws ran: "device" or "host" (`--host-draws`).
    pub draws: &'static str,
    /// Steps captured as CUDA graphs and replays of them, over the whole bench (0 with
    /// `--no-step-graphs` or `--host-draws`).
    pub step_graphs: GraphStats,
    pub copy_bandwidth_gb_per_s: f64,
    pub rows: Vec<BatchRow>,
    pub used_bytes: u64,
}

pub fn bench_batch(args: &BenchBatchArgs) -> anyhow::Result<BatchBench> {
    let ckpt = Checkpoint::open(&args.model).context("checkpoint refused")?;
    let options =
        CudaOptions { memory_budget: args.gpu_memory_budget, context: args.context_length, ..CudaOptions::default() };
    let cuda = Cuda::open(&options)?;
    let prompt = super::bench::bench_prompt(&ckpt, TEXT, args.prompt_rows)?;
    // Steps per stream: a warm-up long enough for the codec's largest group (every shape the
    // timed steps run has then been allocated), the timed ones, then the phase-timed ones.
    let (warm_up, phased) = (crate::engine::generate::frames_to_largest_group(), args.frames.min(8));
    let steps = warm_up + args.frames + phased;
    anyhow::ensure!(prompt.len() + steps <= args.context_length, "--frames past --context-length");
    let largest = args.batch.iter().copied().max().context("no --batch sizes")?;
    let plan = MemoryPlan::for_engine_streams(&ckpt, args.context_length, prompt.len(), largest);
    admit(&plan, cuda.budget().cap() - cuda.budget().used(), "the budget")?;
    let model = ResidentModel::load(&ckpt, &cuda)?;
    let draws = CudaDraws::for_model(&cuda, &ckpt, &model, largest)?;
    let draws = if args.no_step_graphs { draws.without_graphs() } else { draws };
    let engine = Engine::new(&cuda, &ckpt, &model)?;
    let engine = if args.host_draws { engine } else { engine.with_device_draws(&draws) };
    // The phases are timed launch by launch (a sync between a captured step's phases cannot be).
    let eager_draws = CudaDraws::for_model(&cuda, &ckpt, &model, largest)?.without_graphs();
    let phased_engine = Engine::new(&cuda, &ckpt, &model)?;
    let phased_engine = if args.host_draws { phased_engine } else { phased_engine.with_device_draws(&eager_draws) };
    let copy_bandwidth_gb_per_s = cuda.measure_copy_bandwidth(1 << 30)?;
    let position = prompt.len() + args.frames / 2;
    let mut rows = Vec::new();
    for &batch in &args.batch {
        let opts =
            |seed| GenerateOptions { params: SamplingParams::default(), seed, max_frames: steps + 1, stall: None };
        // The frame step alone, over streams.
        // The B prompts together (as a burst of arrivals is run): once to warm up, once profiled
        // where asked, then timed; the timed streams go on to the frame step.
        let prefilled = |profiled: bool| -> anyhow::Result<(Vec<Stream<Cuda>>, f64, Option<StepProfile>)> {
            let mut streams: Vec<Stream<Cuda>> =
                (0..batch).map(|i| engine.stream(&prompt, &opts(i as u64))).collect::<Result<_, _>>()?;
            cuda.synchronize();
            if profiled {
                profile::start();
            }
            let t = Instant::now();
            let mut refs: Vec<&mut Stream<Cuda>> = streams.iter_mut().collect();
            while !engine.prefill_streams(&mut refs, crate::engine::generate::PREFILL_CHUNK)?.iter().all(|d| *d) {}
            cuda.synchronize();
            let wall_ms = t.elapsed().as_secs_f64() * 1e3;
            let profile = profiled.then(|| StepProfile { wall_ms, kernels: profile::finish() });
            Ok((streams, wall_ms, profile))
        };
        drop(prefilled(false)?);
        let prefill_profile = if args.profile.contains(&batch) { prefilled(true)?.2 } else { None };
        let (mut streams, prefill_ms, _) = prefilled(false)?;
        let mut refs: Vec<&mut Stream<Cuda>> = streams.iter_mut().collect();
        for _ in 0..warm_up {
            check(engine.next_frames(&mut refs))?;
        }
        cuda.synchronize();
        let mut allocations = cuda.pool().stats().driver_allocations;
        let t = Instant::now();
        for _ in 0..args.frames {
            check(engine.next_frames(&mut refs))?;
        }
        cuda.synchronize();
        let frame_step_ms = t.elapsed().as_secs_f64() * 1e3 / args.frames as f64;
        allocations = cuda.pool().stats().driver_allocations - allocations;
        // The same step once more per frame with a sync after each phase: where the time goes.
        let mut phase_ms = [0.0f64; 3];
        for _ in 0..phased {
            let mut t = Instant::now();
            check(phased_engine.next_frames_observed(&mut refs, &mut |phase| {
                cuda.synchronize();
                phase_ms[phase as usize] += t.elapsed().as_secs_f64() * 1e3;
                t = Instant::now();
            }))?;
        }
        let phase_ms = phase_ms.map(|ms| ms / phased as f64);
        drop(refs);
        drop(streams);
        // The whole step, codec included, over generations.
        let mut generations: Vec<Generation<'_, Cuda>> =
            (0..batch).map(|i| engine.start(&prompt, &opts(i as u64))).collect::<Result<_, _>>()?;
        for g in &mut generations {
            while !engine.prefill_generation(g, crate::engine::generate::PREFILL_CHUNK)? {}
        }
        // A stream that draws EOS is replaced by a fresh one (its prompt runs inside the step
        // that replaced it; `restarted` counts them), so every timed step has `batch` streams.
        let mut restarted = 0;
        let mut step = || -> anyhow::Result<()> {
            let mut refs: Vec<&mut Generation<'_, Cuda>> = generations.iter_mut().collect();
            let results = engine.step(&mut refs);
            for (i, result) in results.into_iter().enumerate() {
                if result?.finished.is_some() {
                    let mut fresh = engine.start(&prompt, &opts(i as u64))?;
                    while !engine.prefill_generation(&mut fresh, crate::engine::generate::PREFILL_CHUNK)? {}
                    generations[i] = fresh;
                    restarted += 1;
                }
            }
            Ok(())
        };
        for _ in 0..warm_up {
            step()?;
        }
        cuda.synchronize();
        let before = cuda.pool().stats().driver_allocations;
        let t = Instant::now();
        for _ in 0..args.frames {
            step()?;
        }
        cuda.synchronize();
        let step_ms = t.elapsed().as_secs_f64() * 1e3 / args.frames as f64;
        allocations += cuda.pool().stats().driver_allocations - before;
        let profile = if args.profile.contains(&batch) {
            let t = Instant::now();
            profile::start();
            for _ in 0..phased {
                step()?;
            }
            cuda.synchronize();
            let wall_ms = t.elapsed().as_secs_f64() * 1e3 / phased as f64;
            let kernels = profile::finish()
                .into_iter()
                .map(|k| KernelTime { total_ms: k.total_ms / phased as f64, launches: k.launches / phased, ..k })
                .collect();
            Some(StepProfile { wall_ms, kernels })
        } else {
            None
        };
        let floor_bytes = batch_step_bytes(&ckpt.dims, &ckpt.config, batch, position);
        let floor_ms = floor_bytes as f64 / (copy_bandwidth_gb_per_s * 1e9) * 1e3;
        rows.push(BatchRow {
            batch,
            frame_step_ms,
            step_ms,
            frames_per_s: batch as f64 * 1e3 / step_ms,
            prefill_ms,
            prefill_profile,
            main_draws_ms: phase_ms[0],
            tower_ms: phase_ms[1],
            backbone_ms: phase_ms[2],
            floor_bytes,
            floor_ms,
            frame_step_ratio_to_floor: frame_step_ms / floor_ms,
            driver_allocations_while_timed: allocations,
            streams_restarted: restarted,
            profile,
        });
        let row = rows.last().expect("just pushed");
        eprintln!("{}", row.line());
        if let Some(p) = &row.profile {
            eprintln!("{}", p.table());
        }
        if let Some(p) = &row.prefill_profile {
            eprintln!("  the prompts' prefill:\n{}", p.table());
        }
    }
    Ok(BatchBench {
        gpu: cuda.info().name.clone(),
        model: args.model.display().to_string(),
        context: args.context_length,
        prompt_rows: prompt.len(),
        frames: args.frames,
        draws: if args.host_draws { "host" } else { "device" },
        step_graphs: draws.graph_stats(),
        copy_bandwidth_gb_per_s,
        rows,
        used_bytes: cuda.budget().used(),
    })
}

/// Every stream's result of one step, or the first failure.
fn check<T, E: std::error::Error + Send + Sync + 'static>(results: Vec<Result<T, E>>) -> anyhow::Result<()> {
    for r in results {
        r?;
    }
    Ok(())
}

/// Bytes a decode step of `batch` rows at `position` must read at least: the dense weights once
/// (backbone, restricted head, tower and its heads), the routed experts the rows use (their
/// expected union under uniform routing), and each row's state (KV caches up to `position`,
/// GDN recurrent states read and written, tower caches).
pub fn batch_step_bytes(d: &Dims, c: &ModelConfig, batch: usize, position: usize) -> u64 {
    let [br, bc] = d.fp8_block;
    let fp8 = |rows: usize, cols: usize| (rows * cols + rows.div_ceil(br) * cols.div_ceil(bc) * 4) as u64;
    let (h, i) = (d.hidden, d.expert_intermediate);
    let expert = 2 * fp8(i, h) + fp8(h, i);
    let layers = d.layer_types.len() as u64;
    let gdn_layers = d.layer_types.iter().filter(|t| **t == LayerType::LinearAttention).count() as u64;
    let gdn_state = 2 * 4 * (d.gdn_value_heads * d.gdn_key_dim * d.gdn_value_dim) as u64;
    let kv_per_row = decode_bytes_per_row(d, position) - decode_bytes_per_row(d, 0);
    // One row's bytes at position 0, less its experts and its GDN states: the dense weights.
    let dense = decode_bytes_per_row(d, 0) - layers * d.experts_per_token as u64 * expert - gdn_layers * gdn_state;
    let (e, k) = (d.experts as f64, d.experts_per_token as f64);
    let union = e * (1.0 - (1.0 - k / e).powi(batch as i32));
    let experts = (layers as f64 * union * expert as f64) as u64;
    let tower_kv = tower_bytes_per_frame(c, position) - tower_bytes_per_frame(c, 0);
    let per_row = kv_per_row + gdn_layers * gdn_state + tower_kv;
    dense + experts + tower_bytes_per_frame(c, 0) + batch as u64 * per_row
}

impl BatchRow {
    fn line(&self) -> String {
        format!(
            "B = {:>3}: prompts together {:.1} ms; frame step {:.2} ms (floor {:.2} ms, {:.1}×; main draws {:.2}, \
             tower {:.2}, backbone {:.2} when synced), with the codec {:.2} ms = {:.0} frames/s{}",
            self.batch,
            self.prefill_ms,
            self.frame_step_ms,
            self.floor_ms,
            self.frame_step_ratio_to_floor,
            self.main_draws_ms,
            self.tower_ms,
            self.backbone_ms,
            self.step_ms,
            self.frames_per_s,
            if self.streams_restarted > 0 {
                format!(" ({} streams drew EOS and were replaced)", self.streams_restarted)
            } else {
                String::new()
            }
        )
    }
}

impl BatchBench {
    pub fn summary(&self) -> String {
        let mut out = format!(
            "GPU {}; context {}; prompt {} rows; {} frames timed per size; copy bandwidth {:.0} GB/s; \
             step graphs: {} captured, {} replays\n",
            self.gpu,
            self.context,
            self.prompt_rows,
            self.frames,
            self.copy_bandwidth_gb_per_s,
            self.step_graphs.captures,
            self.step_graphs.replays
        );
        for row in &self.rows {
            out.push_str(&row.line());
            out.push('\n');
        }
        out.push_str(&format!("device memory in use {}", gib(self.used_bytes)));
        out
    }

    /// Driver allocations while any size was timed.
    pub fn driver_allocations(&self) -> u64 {
        self.rows.iter().map(|r| r.driver_allocations_while_timed).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::presets::Preset;
    use crate::synth::{SynthOptions, SynthPlan};

    #[test]
    fn the_batch_floor_reads_dense_weights_once_and_the_expert_union() {
        let plan = SynthPlan::new(&SynthOptions { preset: Preset::Full, seed: 0, vq_backbone_codebooks: 1 });
        let d = plan.config.dims();
        let one = batch_step_bytes(&d, &plan.config, 1, 100);
        let row = decode_bytes_per_row(&d, 100) + tower_bytes_per_frame(&plan.config, 100);
        // One row: exactly one row's decode and tower frame (its 8 experts are the union).
        assert!((one as f64 - row as f64).abs() < 1e-6 * row as f64, "{one} vs {row}");
        // 64 rows: about 221 of 256 experts per layer, far less than 64 rows alone.
        let many = batch_step_bytes(&d, &plan.config, 64, 100);
        assert!(many < 8 * one && (25e9..45e9).contains(&(many as f64)), "{many} bytes at B = 64");
        assert!(batch_step_bytes(&d, &plan.config, 128, 100) > many);
    }
}
