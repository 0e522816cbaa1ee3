//! The whole engine on the tiny checkpoint, GPU against CPU and against itself:
//! - the frame step captured as one CUDA graph (`engine::cuda_frames`) makes the same frames and
//!   PCM, bit for bit, as the host-driven loop over the same GPU kernels (both sample with the
//!   same Philox draws; the GPU sampler's decisions equal the CPU's, see the sampling section),
//!   and makes no driver allocation per frame;
//! - the same request with the same seed twice on the GPU gives the same frames and the same PCM
//!   bit for bit (the `verification.md` row "same request, same seed, same backend"), also after
//!   another request of another length ran in between (the graph's state restarts per request);
//! - the PCM the GPU engine streamed (first frame alone, then growing groups) equals one whole
//!   GPU codec decode of its frames, bit for bit;
//! - teacher-forced over the frames the CPU engine generated from a real prompt: the backbone's
//!   main-token top-1 and restricted-logit KL within `verification.md`'s bounds, as in the
//!   backbone section (`backbone::sequence`), on the same better-conditioned tiny model.

use std::ops::ControlFlow;

use limelight::backend::backbone::ExpertActivations;
use limelight::backend::cpu::Cpu;
use limelight::engine::cuda_frames::CudaFrames;
use limelight::engine::generate::{Engine, Finished, GenerateError, GenerateOptions, ResidentModel};
use limelight::model::backbone::BackboneConfig;
use limelight::model::frame::Rows;
use limelight::model::sampling::SamplingParams;
use limelight::request::prompt::PromptBuilder;

use crate::backbone;
use crate::harness::Ctx;

const TEXT: &str = "The quick brown fox jumps over the lazy dog, twice.";
/// Frames per run: crosses the codec's groups of 1, 2, 4 and 8 frames.
const FRAMES: usize = 24;

pub fn run(ctx: &mut Ctx) {
    // The better-conditioned model of the backbone section's end-to-end rows (see there).
    let (_dir, ckpt) = ctx.tiny_checkpoint_scaled(backbone::CONDITIONED);
    let cuda = ctx.cuda;
    let gpu_model = ResidentModel::load(&ckpt, cuda).expect("GPU upload");
    let host_loop = Engine::new(cuda, &ckpt, &gpu_model).expect("GPU engine");
    let frames = CudaFrames::for_model(cuda, &ckpt, &gpu_model).expect("capturing the frame step");
    let gpu = Engine::new(cuda, &ckpt, &gpu_model).expect("GPU engine").with_device_frames(&frames);
    let prompt = PromptBuilder::for_checkpoint(&ckpt).build(TEXT, &[]).expect("prompt");
    let other = PromptBuilder::for_checkpoint(&ckpt).build("Another, shorter one.", &[]).expect("prompt");
    // No EOS stop in the first frames is likely but not certain; min() below handles either.
    let opts = GenerateOptions {
        params: SamplingParams::default(),
        seed: ctx.rng.next_u64(),
        max_frames: FRAMES,
        stall: None,
    };

    let before = cuda.pool().stats().driver_allocations;
    let (first, first_pcm) = generate(&gpu, &prompt, &opts);
    let (host, host_pcm) = generate(&host_loop, &prompt, &opts);
    ctx.exact("engine: CUDA-graph frames vs the host-driven loop", first.rows.as_flat(), host.rows.as_flat());
    ctx.exact("engine: CUDA-graph PCM bits vs the host-driven loop", &bits(&first_pcm), &bits(&host_pcm));
    let _ = generate(&gpu, &other, &GenerateOptions { seed: opts.seed ^ 1, ..opts.clone() });
    let steady = cuda.pool().stats().driver_allocations;
    let (second, second_pcm) = generate(&gpu, &prompt, &opts);
    ctx.exact(
        "engine on the GPU, same seed twice (another request between): frames",
        second.rows.as_flat(),
        first.rows.as_flat(),
    );
    ctx.exact(
        "engine on the GPU, same seed twice (another request between): PCM bits",
        &bits(&second_pcm),
        &bits(&first_pcm),
    );
    let per_request = cuda.pool().stats().driver_allocations - steady;
    ctx.check(
        format!("engine with the CUDA graph: driver allocations in a repeated request ({} before it)", steady - before),
        "count",
        "0".into(),
        per_request.to_string(),
        per_request == 0,
    );
    let past =
        gpu.generate(&prompt, &GenerateOptions { max_frames: cuda.context(), ..opts.clone() }, &mut |_: &[f32]| {
            ControlFlow::Continue(())
        });
    ctx.check(
        "engine with the CUDA graph: prompt + max_frames past the context",
        "refused",
        "FramesPastContext".into(),
        format!("{:?}", past.as_ref().map(|f| f.frames).map_err(|e| e.to_string())),
        matches!(past, Err(GenerateError::FramesPastContext { .. })),
    );
    // The codec decodes each frame's codes c0..c9, the row without its main token.
    let codes: Vec<u32> = (0..first.rows.len()).flat_map(|t| first.rows.row(t)[1..].to_vec()).collect();
    let whole = gpu.codec.decode(cuda, &codes).expect("whole decode");
    ctx.exact("engine on the GPU: streamed PCM vs one whole decode, bits", &bits(&first_pcm), &bits(&whole));

    let cpu_model = ResidentModel::load(&ckpt, &Cpu).expect("CPU upload");
    let cpu = Engine::new(&Cpu, &ckpt, &cpu_model).expect("CPU engine");
    let (cpu_run, _) = generate(&cpu, &prompt, &opts);
    let mut rows = prompt.clone();
    rows.extend(&cpu_run.rows);
    let mut config = BackboneConfig::from_model_config(&ckpt.config);
    config.moe.activations = ExpertActivations::Fp8Dynamic;
    let what = format!("engine teacher-forced over the CPU's {} frames", cpu_run.frames);
    backbone::sequence(ctx, &what, &config, &cpu_model.weights, &gpu_model.weights, &rows, prompt.len());
}

/// One generation, collecting its PCM.
fn generate<B: limelight::backend::Backend>(
    engine: &Engine<'_, B>,
    prompt: &Rows,
    opts: &GenerateOptions,
) -> (Finished, Vec<f32>) {
    let mut pcm = Vec::new();
    let mut sink = |chunk: &[f32]| {
        pcm.extend_from_slice(chunk);
        ControlFlow::Continue(())
    };
    let finished = engine.generate(prompt, opts, &mut sink).expect("generate");
    (finished, pcm)
}

fn bits(pcm: &[f32]) -> Vec<u32> {
    pcm.iter().map(|v| v.to_bits()).collect()
}
