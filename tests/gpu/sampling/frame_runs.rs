//! The sampler over consecutive frames: 40 frames through the device's own counter and RAS
//! window against the CPU's frame rows (replayed after a reset), and one captured CUDA graph
//! replayed frame after frame.

use limelight::backend::cpu::Matrix;
use limelight::backend::cuda::sampling::GpuSampler;
use limelight::model::sampling::{RAS_WINDOW, RasWindow, SamplingParams, sample_head, sample_main};

use super::{Band, HEADS, Shape, bf16_values, index, logits};
use crate::harness::Ctx;

/// Consecutive frames of the frame and graph checks (more than the RAS window).
const FRAMES: usize = 40;

/// The logits of consecutive frames and the CPU's frame rows for them.
pub(super) struct FrameRun {
    start: u64,
    params: SamplingParams,
    seed: u64,
    prompt: Vec<u32>,
    /// Per frame, the restricted logits in the head's order.
    main: Vec<Vec<f32>>,
    /// Per frame, the heads' bf16 logits `[HEADS, V]`.
    heads: Vec<Matrix>,
    /// The CPU's rows `[main, c0, c1..c9]`.
    rows: Vec<Vec<u32>>,
    ras_used: usize,
    /// The CPU's window after the last frame, oldest first.
    window: Vec<u32>,
}

impl FrameRun {
    /// Main logits peaked on a few semantic tokens, so the first draw repeats and RAS acts.
    pub(super) fn new(ctx: &mut Ctx, band: &Band, start: u64) -> FrameRun {
        let n = band.candidates.len();
        let semantic: Vec<usize> = (0..n).filter(|&i| band.candidates.is_semantic(band.candidates.token(i))).collect();
        let favourites: Vec<usize> = (0..6).map(|_| semantic[index(ctx, semantic.len())]).collect();
        let params = SamplingParams { temperature: 1.0, top_p: 0.95, top_k: None };
        let seed = ctx.rng.next_u64();
        let prompt: Vec<u32> = (0..20).map(|i| 100 + i).collect();
        let mut window = RasWindow::from_tokens(prompt.iter().copied());
        let mut tokens = prompt.clone();
        let mut run = FrameRun {
            start,
            params,
            seed,
            prompt,
            main: Vec::new(),
            heads: Vec::new(),
            rows: Vec::new(),
            ras_used: 0,
            window: Vec::new(),
        };
        for f in 0..FRAMES as u64 {
            let frame = start + f;
            let mut x = logits(ctx, n, Shape::Uniform(1.0));
            for &i in &favourites {
                x[i] = ctx.rng.uniform(7.0, 8.0);
            }
            let pick = sample_main(&x, &band.candidates, &window, &params, seed, frame).expect("finite logits");
            window.push(pick.token);
            tokens.push(pick.token);
            run.ras_used += usize::from(pick.ras_used);
            let h = Matrix::from_vec(
                HEADS,
                band.head_vocab,
                bf16_values(&logits(ctx, HEADS * band.head_vocab, Shape::Uniform(3.0))),
            );
            let mut row = vec![pick.token, band.candidates.code0(pick.token)];
            for r in 0..HEADS {
                row.push(sample_head(h.row(r), r, &params, seed, frame).expect("finite logits"));
            }
            run.main.push(band.head_order(&x));
            run.heads.push(h);
            run.rows.push(row);
        }
        run.window = tokens[tokens.len() - RAS_WINDOW..].to_vec();
        run
    }

    fn begin(&self, ctx: &Ctx, sampler: &GpuSampler) {
        sampler.begin_request_at(ctx.cuda, &self.params, self.seed, &self.prompt, self.start);
    }
}

/// Consecutive frames through the sampler's own counter and window; then the same launches
/// again after `begin_request` must give the same rows.
pub(super) fn frames(ctx: &mut Ctx, sampler: &GpuSampler, run: &FrameRun) {
    let name = format!("frames {}..{}", run.start, run.start + FRAMES as u64);
    let mains: Vec<_> = run.main.iter().map(|m| ctx.cuda.upload_f32_scratch(m)).collect();
    let heads: Vec<_> = run.heads.iter().map(|h| ctx.cuda.upload_matrix(h)).collect();
    let mut passes = Vec::new();
    for _ in 0..2 {
        run.begin(ctx, sampler);
        let mut rows = Vec::new();
        for (main, head) in mains.iter().zip(&heads) {
            sampler.sample_main(ctx.cuda, main);
            for r in 0..HEADS {
                sampler.sample_head(ctx.cuda, r, head, r);
            }
            sampler.end_frame(ctx.cuda);
            rows.push(sampler.read_frame(ctx.cuda).map(|f| f.row).unwrap_or_default());
        }
        passes.push((rows, sampler.read_state(ctx.cuda)));
    }
    let (rows, state) = &passes[0];
    ctx.exact(format!("{name}: rows [main, c0..c9] vs CPU"), rows, &run.rows);
    let value = format!("{} of {FRAMES}", run.ras_used);
    ctx.check(format!("{name}: RAS replaced the first draw"), "frames", "at least 1".into(), value, run.ras_used > 0);
    ctx.exact(format!("{name}: frame counter after"), &[state.frame()], &[run.start + FRAMES as u64]);
    ctx.exact(format!("{name}: RAS window after"), state.window(), &run.window);
    ctx.exact(format!("{name}: replay after begin_request vs first run"), &passes[1].0, rows);
}

/// One frame (main, 9 heads, end_frame) captured into a CUDA graph on fixed buffers, replayed
/// once per frame with that frame's logits copied in between.
pub(super) fn graph(ctx: &mut Ctx, sampler: &GpuSampler, run: &FrameRun) {
    use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    let name = format!("graph, frames {}..{}", run.start, run.start + FRAMES as u64);
    let main = ctx.cuda.upload_f32_scratch(&run.main[0]);
    let heads = ctx.cuda.upload_matrix(&run.heads[0]);
    run.begin(ctx, sampler);
    ctx.cuda.synchronize();
    let stream = ctx.cuda.stream();
    if let Err(e) = stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) {
        ctx.check(format!("{name}: capture"), "driver", "success".into(), e.to_string(), false);
        return;
    }
    sampler.sample_main(ctx.cuda, &main);
    for r in 0..HEADS {
        sampler.sample_head(ctx.cuda, r, &heads, r);
    }
    sampler.end_frame(ctx.cuda);
    let graph = match stream.end_capture(CUgraphInstantiate_flags(0)) {
        Ok(Some(g)) => g,
        other => {
            let value = format!("{:?}", other.map(|g| g.is_some()));
            ctx.check(format!("{name}: capture"), "driver", "a graph".into(), value, false);
            return;
        }
    };
    let mut rows = Vec::new();
    for (f, (m, h)) in run.main.iter().zip(&run.heads).enumerate() {
        if f > 0 {
            ctx.cuda.copy_to_device(main.ptr(), m);
            ctx.cuda.copy_to_device(heads.ptr(), &limelight::backend::cuda::tensor::to_bf16_vec(&h.data));
        }
        graph.launch().expect("graph launch");
        rows.push(sampler.read_frame(ctx.cuda).map(|f| f.row).unwrap_or_default());
    }
    ctx.exact(format!("{name}: rows vs CPU"), &rows, &run.rows);
    let frame = sampler.read_state(ctx.cuda).frame();
    ctx.exact(format!("{name}: frame counter after"), &[frame], &[run.start + FRAMES as u64]);
}
