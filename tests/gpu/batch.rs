//! The decode batch on the GPU, on the tiny checkpoint (`verification.md`'s batch-invariance
//! rows), with the draws on the GPU (`CudaDraws`, what the server runs) and on the host
//! (`--no-cuda-graph`): every request's frames and PCM are bit for bit what it produces alone,
//! inside batches of 2, 8, 32 and 64 streams with staggered arrivals, a long prompt run in chunks
//! between steps, different sampling knobs per row, and cancellations; the GPU's draws give each
//! request the host's frames and PCM; the step captured as a CUDA graph and replayed gives the
//! bytes of its launches run one by one; a repeated batch of the same requests makes no driver
//! allocation.

use limelight::backend::cuda::Cuda;
use limelight::engine::cuda_draws::CudaDraws;
use limelight::engine::generate::{Engine, GenerateOptions, PREFILL_CHUNK, ResidentModel};
use limelight::engine::prefix::SharedPrefix;
use limelight::model::frame::Rows;
use limelight::model::sampling::SamplingParams;
use limelight::request::prompt::PromptBuilder;

use crate::backbone;
use crate::batch_driver::{Outcome, Planned, alone, batched, difference};
use crate::harness::Ctx;

/// Batch sizes checked (the most streams planned at once; arrivals are staggered).
const SIZES: [usize; 4] = [2, 8, 32, 64];

pub fn run(ctx: &mut Ctx) {
    let (_dir, ckpt) = ctx.tiny_checkpoint_scaled(backbone::CONDITIONED);
    let cuda = ctx.cuda;
    let model = ResidentModel::load(&ckpt, cuda).expect("GPU upload");
    let host = Engine::new(cuda, &ckpt, &model).expect("GPU engine");
    // Fewer sampler rows than the largest batch: a batch of 64 is stepped in two passes.
    let draws = CudaDraws::for_model(cuda, &ckpt, &model, 48).expect("device draws");
    let device = Engine::new(cuda, &ckpt, &model).expect("GPU engine").with_device_draws(&draws);
    let eager_draws = CudaDraws::for_model(cuda, &ckpt, &model, 48).expect("device draws").without_graphs();
    let eager = Engine::new(cuda, &ckpt, &model).expect("GPU engine").with_device_draws(&eager_draws);
    let samples_per_frame = ckpt.codec_dims.samples_per_frame();
    let builder = PromptBuilder::for_checkpoint(&ckpt);
    let long = "A chapter long enough to need more than one prefill chunk. ".repeat(10);
    let prompts: Vec<Rows> = ["Hello there, how are you today?", "[whispering] A second voice.", &long, "Short."]
        .iter()
        .map(|text| builder.build(text, &[]).expect("prompt"))
        .collect();
    assert!(prompts[2].len() > PREFILL_CHUNK, "the long prompt needs several chunks");
    let knobs = [
        SamplingParams::default(),
        SamplingParams { temperature: 1.3, top_p: 0.9, top_k: Some(40) },
        SamplingParams { temperature: 0.5, top_p: 0.7, top_k: Some(8) },
    ];
    let mut last_plan = Vec::new();
    for size in SIZES {
        let plan: Vec<Planned> = (0..size)
            .map(|i| Planned {
                prefix: SharedPrefix::NONE,
                rows: prompts[i % prompts.len()].clone(),
                opts: GenerateOptions {
                    params: knobs[i % knobs.len()],
                    seed: ctx.rng.next_u64(),
                    max_frames: 6 + (i * 5) % 17,
                    stall: None,
                },
                joins_at: (i * 3) % size.min(8),
                cancel_after: (i % 9 == 4).then_some(3),
            })
            .collect();
        let host_alone: Vec<Outcome> = plan.iter().map(|r| alone(&host, r)).collect();
        for (draws, engine) in [("host", &host), ("GPU", &device)] {
            let want: Vec<Outcome> =
                if draws == "host" { host_alone.clone() } else { plan.iter().map(|r| alone(engine, r)).collect() };
            if draws == "GPU" {
                let differing: Vec<usize> =
                    (0..size).filter(|&i| !want[i].matches(&host_alone[i], None, samples_per_frame)).collect();
                ctx.check(
                    format!("batch of {size}: each request alone, GPU draws vs host draws, bits"),
                    "requests differing",
                    "0".into(),
                    format!("{} {differing:?}", differing.len()),
                    differing.is_empty(),
                );
            }
            let (got, most) = batched(engine, &plan);
            let mismatched: Vec<usize> =
                (0..size).filter(|&i| !got[i].matches(&want[i], plan[i].cancel_after, samples_per_frame)).collect();
            let frames: usize = got.iter().map(|o| o.finished.frames).sum();
            for &i in &mismatched {
                let r = &plan[i];
                eprintln!(
                    "batch of {size}, {draws} draws: request {i} ({} prompt rows, joins at turn {}, cancel after {:?}, \
                     {:?}, seed {}): {}",
                    r.rows.len(),
                    r.joins_at,
                    r.cancel_after,
                    r.opts.params,
                    r.opts.seed,
                    difference(&got[i], &want[i])
                );
            }
            ctx.check(
                format!(
                    "batch of {size}, {draws} draws ({} at most stepping, {} prefilling together, {frames} frames): \
                     requests vs alone, bits",
                    most.stepped, most.prefilled
                ),
                "requests differing",
                "0".into(),
                format!("{} {mismatched:?}", mismatched.len()),
                mismatched.is_empty(),
            );
        }
        // Staggered arrivals, early stops and cancellations change the list of streams nearly every
        // step here: replays may be few or none (the steady plans below must replay).
        let what = format!("batch of {size}");
        graphs_match_launches(ctx, (&device, &draws), &eager, &plan, samples_per_frame, &what, false);
        last_plan = plan;
    }
    // Steady streams, all joining at once with the same frame budget: once all have joined, the
    // steps of one pass replay. 64 streams step in two passes of the sampler's 48 rows, whose
    // lists alternate, so each pass drops the other's graph: bits only there.
    for (streams, frames, need_replays) in [(4, 40, true), (48, 24, true), (64, 12, false)] {
        let steady: Vec<Planned> = (0..streams)
            .map(|i| Planned {
                prefix: SharedPrefix::NONE,
                rows: prompts[i % 2].clone(),
                opts: GenerateOptions {
                    params: knobs[i % knobs.len()],
                    seed: ctx.rng.next_u64(),
                    max_frames: frames,
                    stall: None,
                },
                joins_at: 0,
                cancel_after: None,
            })
            .collect();
        let what = format!("{streams} steady streams");
        graphs_match_launches(ctx, (&device, &draws), &eager, &steady, samples_per_frame, &what, need_replays);
    }
    let before = cuda.pool().stats().driver_allocations;
    let _ = batched(&device, &last_plan);
    let repeated = cuda.pool().stats().driver_allocations - before;
    ctx.check(
        format!("batch of {}: driver allocations in a repeated batch", last_plan.len()),
        "count",
        "0".into(),
        repeated.to_string(),
        repeated == 0,
    );
}

/// The plan's requests with the batch step's graphs (`device`) and with its launches one by one
/// (`eager`): the same bytes, and (`need_replays`) replays among the steps.
fn graphs_match_launches(
    ctx: &mut Ctx,
    (device, draws): (&Engine<'_, Cuda>, &CudaDraws<'_>),
    eager: &Engine<'_, Cuda>,
    plan: &[Planned],
    samples_per_frame: usize,
    what: &str,
    need_replays: bool,
) {
    let before = draws.graph_stats();
    let (graphed, _) = batched(device, plan);
    let after = draws.graph_stats();
    let (launched, _) = batched(eager, plan);
    let differing: Vec<usize> =
        (0..plan.len()).filter(|&i| !graphed[i].matches(&launched[i], None, samples_per_frame)).collect();
    let (captures, replays) = (after.captures - before.captures, after.replays - before.replays);
    ctx.check(
        format!("{what}: step graphs ({captures} captures, {replays} replays) vs launches one by one, bits"),
        "requests differing; replays",
        if need_replays { "0; > 0" } else { "0; any" }.into(),
        format!("{} {differing:?}; {replays}", differing.len()),
        differing.is_empty() && (replays > 0 || !need_replays),
    );
}
