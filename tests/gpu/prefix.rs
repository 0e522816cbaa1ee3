//! Kept voice prefixes on the GPU (`engine::prefix`, `backend::cuda::saved`), on the tiny
//! checkpoint: a request that starts from its voice's kept state gives, bit for bit, the frames
//! and PCM of a full prefill, alone and in batches of many streams in many voices (GPU draws, as
//! the server runs), with a cache small enough that voices are evicted and their pages reused; and
//! the CUDA-graph step (`--max-batch 1`) restores and keeps the same way.

use limelight::engine::cuda_draws::CudaDraws;
use limelight::engine::cuda_frames::CudaFrames;
use limelight::engine::generate::{Engine, GenerateOptions, PREFILL_CHUNK, ResidentModel};
use limelight::engine::prefix::PrefixCache;
use limelight::model::sampling::SamplingParams;
use limelight::request::prompt::Reference;

use crate::backbone;
use crate::batch_driver::{Outcome, Planned, alone, batched, in_voice, voice};
use crate::harness::Ctx;

/// Voices in the plan; the small cache holds fewer than this.
const VOICES: usize = 6;
/// The arena reserved for the checks.
const ARENA_BYTES: usize = 256 << 20;

pub fn run(ctx: &mut Ctx) {
    let (_dir, ckpt) = ctx.tiny_checkpoint_scaled(backbone::CONDITIONED);
    let cuda = ctx.cuda;
    cuda.reserve_saved_states(ARENA_BYTES).expect("the saved-state arena");
    let model = ResidentModel::load(&ckpt, cuda).expect("GPU upload");
    let draws = CudaDraws::for_model(cuda, &ckpt, &model, 48).expect("device draws");
    let plain = Engine::new(cuda, &ckpt, &model).expect("GPU engine").with_device_draws(&draws);
    let samples_per_frame = ckpt.codec_dims.samples_per_frame();

    // Voice 0 takes more than one prefill chunk.
    let voices: Vec<Reference> = (0..VOICES)
        .map(|v| voice(&ckpt, ctx.rng.next_u64(), if v == 0 { PREFILL_CHUNK + 40 } else { 8 + 13 * v }))
        .collect();
    let texts = ["Good morning, everyone.", "A second sentence, somewhat longer than the first.", "Short."];
    let knobs = [SamplingParams::default(), SamplingParams { temperature: 1.3, top_p: 0.9, top_k: Some(40) }];
    let plan: Vec<Planned> = (0..32)
        .map(|i| {
            let opts = GenerateOptions {
                params: knobs[i % knobs.len()],
                seed: ctx.rng.next_u64(),
                max_frames: 4 + (i * 5) % 9,
                stall: None,
            };
            // Four requests per voice in a row, the voices in turn: hits within each run of four,
            // and a small cache evicts as the turn comes round.
            in_voice(&ckpt, texts[i % texts.len()], &voices[(i / 4) % VOICES], opts, i / 3)
        })
        .collect();
    let want: Vec<Outcome> = plan.iter().map(|r| alone(&plain, r)).collect();

    // One prefix's bytes, so the small cache can be sized to hold two.
    let one = {
        let probe = PrefixCache::new(cuda, ARENA_BYTES);
        let mut engine = Engine::new(cuda, &ckpt, &model).expect("GPU engine").with_device_draws(&draws);
        engine.set_prefix_cache(&probe);
        alone(&engine, &plan[1]);
        probe.stats().bytes
    };
    for (label, budget) in [("roomy cache", ARENA_BYTES), ("cache of two voices", 2 * one)] {
        let cache = PrefixCache::new(cuda, budget);
        let mut cached = Engine::new(cuda, &ckpt, &model).expect("GPU engine").with_device_draws(&draws);
        cached.set_prefix_cache(&cache);
        let (got, most) = batched(&cached, &plan);
        let mismatched: Vec<usize> =
            (0..plan.len()).filter(|&i| !got[i].matches(&want[i], None, samples_per_frame)).collect();
        let stats = cache.stats();
        ctx.check(
            format!(
                "{label}: {} requests in {VOICES} voices ({} stepping, {} prefilling together; {} hits, {} kept, \
                 {} evicted) vs a full prefill alone, bits",
                plan.len(),
                most.stepped,
                most.prefilled,
                stats.hits,
                stats.saved,
                stats.evicted
            ),
            "requests differing",
            "0, with hits (and evictions in the small cache)".into(),
            format!("{} {mismatched:?}", mismatched.len()),
            mismatched.is_empty()
                && stats.hits > 0
                && stats.bytes <= budget
                && (budget == ARENA_BYTES || stats.evicted > 0),
        );
        let alone_mismatched: Vec<usize> =
            (0..plan.len()).filter(|&i| !alone(&cached, &plan[i]).matches(&want[i], None, samples_per_frame)).collect();
        ctx.check(
            format!("{label}: each request alone from the kept prefix vs a full prefill, bits"),
            "requests differing",
            "0".into(),
            format!("{} {alone_mismatched:?}", alone_mismatched.len()),
            alone_mismatched.is_empty(),
        );
    }

    // The graph step: from a kept prefix, the frames and PCM of its own full prefill.
    let frames = CudaFrames::for_model(cuda, &ckpt, &model).expect("capturing the frame step");
    let graph_plain = Engine::new(cuda, &ckpt, &model).expect("GPU engine").with_device_frames(&frames);
    let graph_want: Vec<Outcome> = plan.iter().take(8).map(|r| alone(&graph_plain, r)).collect();
    let cache = PrefixCache::new(cuda, ARENA_BYTES);
    let kept_frames =
        CudaFrames::for_model(cuda, &ckpt, &model).expect("capturing the frame step").with_prefix_cache(&cache);
    let graph = Engine::new(cuda, &ckpt, &model).expect("GPU engine").with_device_frames(&kept_frames);
    // Twice over: the first pass keeps each voice, the second starts every request from it.
    let mismatched: Vec<usize> = (0..16)
        .filter(|&i| !alone(&graph, &plan[i % 8]).matches(&graph_want[i % 8], None, samples_per_frame))
        .collect();
    let stats = cache.stats();
    ctx.check(
        format!("graph step: 8 requests twice, {} hits, vs a full prefill alone, bits", stats.hits),
        "requests differing",
        "0, with hits".into(),
        format!("{} {mismatched:?}", mismatched.len()),
        mismatched.is_empty() && stats.hits >= 8,
    );
}
