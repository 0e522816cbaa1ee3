//! `kernels/sampling.cu` against the CPU sampler (`model::sampling`, the oracle) on the same
//! values: main-token draws with RAS (first draw, RAS draw, window check and push, c0, the
//! semantic flag) and codebook-head draws on fresh random logits rows (several scales, exact
//! ties, -inf entries, a flat row; rows of a few finite logits at top-p 1) under every combination of temperature {0, 0.3, 1, 1.7},
//! top-p {0.1, 0.5, 0.9, 0.95, 1} and top-k {none, 1, 5, 50, 100000}, at random (seed, frame)
//! keys, with RAS windows that do and do not hold the first draw; faults (NaN, +inf, overflow,
//! no finite logit) reported as the CPU reports them; 40 consecutive frames (counter, window,
//! frame rows), replayed after a reset, also across the 2³² frame boundary; one captured CUDA
//! graph replayed frame after frame; and rows of the decode batch (37 requests in one launch per
//! draw, each with its own knobs, key, window and logits, one row faulting) against each row
//! alone on the CPU. Every comparison counts mismatching decisions, bound 0.

use half::bf16;
use limelight::backend::cpu::Matrix;
use limelight::backend::cuda::sampling::{DeviceState, GpuSampler, candidate_rows};
use limelight::model::rng::{DrawKey, MAIN_STREAM, RAS_STREAM};
use limelight::model::sampling::{
    MainCandidates, RAS_WINDOW, RasWindow, SamplingError, SamplingParams, sample_head, sample_main, sample_top_k_top_p,
};

use crate::harness::Ctx;

mod frame_runs;
use frame_runs::FrameRun;

const HEADS: usize = 9;
const TEMPERATURES: [f32; 4] = [0.0, 0.3, 1.0, 1.7];
const TOP_PS: [f32; 5] = [0.1, 0.5, 0.9, 0.95, 1.0];
const TOP_KS: [Option<u32>; 5] = [None, Some(1), Some(5), Some(50), Some(100_000)];
/// Output words the draw kernels must write every frame (row, flags, picks, per-draw faults);
/// the sticky fault record after them stays as `begin_request` cleared it.
const WRITTEN_WORDS: usize = 28;

/// A main-token vocabulary: the band, EOS, and the restricted head's order (band, then EOS).
struct Band {
    name: &'static str,
    candidates: MainCandidates,
    restricted: Vec<u32>,
    head_vocab: usize,
}

impl Band {
    fn new(name: &'static str, start: u32, codes: u32, eos: u32, head_vocab: usize) -> Band {
        let restricted = (start..start + codes).chain([eos]).collect();
        Band { name, candidates: MainCandidates::new(start, codes, eos), restricted, head_vocab }
    }

    /// Restricted logits in the head's order from logits in candidate order.
    fn head_order(&self, logits: &[f32]) -> Vec<f32> {
        let mut out = vec![f32::NAN; logits.len()];
        for (i, row) in candidate_rows(self.candidates.ids(), &self.restricted).into_iter().enumerate() {
            out[row as usize] = logits[i];
        }
        out
    }

    fn semantic(&self) -> Vec<u32> {
        self.candidates.ids().iter().copied().filter(|&t| self.candidates.is_semantic(t)).collect()
    }
}

#[derive(Clone, Copy, Debug)]
enum Shape {
    Uniform(f32),
    /// Values on a 0.5 grid: many exact ties.
    Ties,
    /// A few large logits over noise (trained-model-like).
    Peaked,
    /// Most logits -inf.
    NegInf,
    /// Every logit equal.
    Flat,
    /// 2..25 finite logits, drawn at top_p = 1 only: the prefix holds every non-zero weight, so
    /// the head rule's last keep/drop hinges on Σp rounding to 1.0 (the total's summation order).
    Sparse,
}

const SHAPES: [Shape; 8] = [
    Shape::Uniform(0.05),
    Shape::Uniform(2.0),
    Shape::Uniform(30.0),
    Shape::Ties,
    Shape::Peaked,
    Shape::NegInf,
    Shape::Flat,
    Shape::Sparse,
];

fn logits(ctx: &mut Ctx, n: usize, shape: Shape) -> Vec<f32> {
    let mut x: Vec<f32> = match shape {
        Shape::Uniform(s) => (0..n).map(|_| ctx.rng.uniform(-s, s)).collect(),
        Shape::Ties => (0..n).map(|_| (ctx.rng.uniform(-3.0, 3.0) * 2.0).round() / 2.0).collect(),
        Shape::Peaked => (0..n).map(|_| ctx.rng.uniform(-1.0, 1.0)).collect(),
        Shape::NegInf => {
            (0..n).map(|_| if ctx.rng.unit() < 0.9 { f32::NEG_INFINITY } else { ctx.rng.uniform(-2.0, 2.0) }).collect()
        }
        Shape::Flat => vec![0.5; n],
        Shape::Sparse => vec![f32::NEG_INFINITY; n],
    };
    if matches!(shape, Shape::Peaked) {
        for _ in 0..5 {
            let i = index(ctx, n);
            x[i] = ctx.rng.uniform(6.0, 10.0);
        }
    }
    if matches!(shape, Shape::NegInf) {
        let i = index(ctx, n);
        x[i] = 1.0;
    }
    if matches!(shape, Shape::Sparse) {
        for _ in 0..2 + index(ctx, 24) {
            let i = index(ctx, n);
            x[i] = ctx.rng.uniform(-2.0, 2.0);
        }
    }
    x
}

fn index(ctx: &mut Ctx, n: usize) -> usize {
    (ctx.rng.next_u64() % n as u64) as usize
}

/// Values rounded to bf16 (what a head GEMV writes), widened back.
fn bf16_values(x: &[f32]) -> Vec<f32> {
    x.iter().map(|&v| bf16::from_f32(v).to_f32()).collect()
}

/// Every parameter combination (100); for `Sparse`, top_p = 1 with every temperature and top-k,
/// five times over.
fn params_grid(shape: Shape) -> Vec<SamplingParams> {
    let (top_ps, repeats): (&[f32], usize) =
        if matches!(shape, Shape::Sparse) { (&[1.0], 5) } else { (TOP_PS.as_slice(), 1) };
    let mut grid = Vec::new();
    for _ in 0..repeats {
        for temperature in TEMPERATURES {
            for &top_p in top_ps {
                for top_k in TOP_KS {
                    grid.push(SamplingParams { temperature, top_p, top_k });
                }
            }
        }
    }
    grid
}

/// Random keys: small frames, and frames above 2³² (their high word enters the Philox key).
fn key(ctx: &mut Ctx, case: usize) -> (u64, u64) {
    let seed = ctx.rng.next_u64();
    let frame = if case.is_multiple_of(2) { ctx.rng.next_u64() % 5000 } else { ctx.rng.next_u64() };
    (seed, frame)
}

/// Fills what the draw kernels must write with 0xFFFFFFFF, so a word they skip cannot match.
fn poison_outputs(ctx: &Ctx, sampler: &GpuSampler) {
    ctx.cuda.copy_to_device(sampler.row_ptr(), &[u32::MAX; WRITTEN_WORDS]);
}

pub fn run(ctx: &mut Ctx) {
    ctx.cuda.pool().set_poison(true);
    let bands = [
        // The published layout: EOS (151645) below the band, so candidate order is a rotation
        // of the head's order.
        Band::new("band 4096, EOS below", 151_678, 4096, 151_645, 4096),
        Band::new("band 4096, EOS above", 1000, 4096, 9000, 4096),
        // Fewer logits than threads: the padded sort.
        Band::new("band 37, EOS below", 500, 37, 3, 100),
    ];
    let mut ras_used = (0, 0);
    for band in &bands {
        let sampler = GpuSampler::new(ctx.cuda, &band.candidates, &band.restricted, HEADS, band.head_vocab)
            .expect("sampler buffers");
        let used = main_draws(ctx, band, &sampler);
        if band.candidates.len() > 1000 {
            wide_draws(ctx, band, &sampler);
        }
        ras_used = (ras_used.0 + used.0, ras_used.1 + used.1);
        head_draws(ctx, band, &sampler);
    }
    // The window checks must exercise both outcomes.
    let pass = ras_used.0 > 0 && ras_used.0 < ras_used.1;
    let value = format!("{} of {}", ras_used.0, ras_used.1);
    ctx.check("main: RAS replaced the first draw", "cases", "some, not all".into(), value, pass);

    for band in [&bands[0], &bands[2]] {
        rows(ctx, band);
    }
    let band = &bands[0];
    let sampler =
        GpuSampler::new(ctx.cuda, &band.candidates, &band.restricted, HEADS, band.head_vocab).expect("sampler buffers");
    faults(ctx, band, &sampler);
    for start in [0, (1u64 << 32) - 20] {
        let run = FrameRun::new(ctx, band, start);
        frame_runs::frames(ctx, &sampler, &run);
        frame_runs::graph(ctx, &sampler, &run);
    }
}

/// One main-draw case's decisions: first, RAS, chosen token, RAS used, c0, semantic, window after.
type MainDecisions = (u32, u32, u32, bool, u32, bool, Vec<u32>);

/// Main draws on every shape × parameter combination; returns (RAS used, cases).
fn main_draws(ctx: &mut Ctx, band: &Band, sampler: &GpuSampler) -> (usize, usize) {
    let n = band.candidates.len();
    let semantic = band.semantic();
    let mut used = (0, 0);
    for shape in SHAPES {
        let (mut got, mut want) = (Vec::new(), Vec::new());
        for (case, params) in params_grid(shape).into_iter().enumerate() {
            let x = logits(ctx, n, shape);
            let (seed, frame) = key(ctx, case);
            let first = sample_top_k_top_p(&x, &params.main_filter(), &DrawKey::new(seed, frame, MAIN_STREAM))
                .map(|i| band.candidates.token(i))
                .expect("finite logits");
            let tokens = window_tokens(ctx, &semantic, first, case);
            let pick = sample_main(
                &x,
                &band.candidates,
                &RasWindow::from_tokens(tokens.iter().copied()),
                &params,
                seed,
                frame,
            )
            .expect("finite logits");
            let mut after = tokens.clone();
            after.push(pick.token);
            let after = after[after.len().saturating_sub(RAS_WINDOW)..].to_vec();
            let c0 = band.candidates.code0(pick.token);
            want.push((
                pick.first,
                pick.ras,
                pick.token,
                pick.ras_used,
                c0,
                band.candidates.is_semantic(pick.token),
                after,
            ));
            used = (used.0 + usize::from(pick.ras_used), used.1 + 1);

            sampler.begin_request_at(ctx.cuda, &params, seed, &tokens, frame);
            poison_outputs(ctx, sampler);
            let buf = ctx.cuda.upload_f32_scratch(&band.head_order(&x));
            sampler.sample_main(ctx.cuda, &buf);
            let out = sampler.read_outputs(ctx.cuda);
            let state = sampler.read_state(ctx.cuda);
            let decisions: MainDecisions = (
                out.first,
                out.ras,
                out.row[0],
                out.ras_used != 0,
                out.row[1],
                out.semantic != 0,
                state.window().to_vec(),
            );
            got.push(decisions);
        }
        let stage = format!("main {}, {shape:?}: first + RAS draw + window per case", band.name);
        ctx.exact(stage, &got, &want);
    }
    used
}

/// First draws that keep hundreds to thousands of ranks: rows of random scale under top-p drawn
/// at random and wide or no top-k, some on a value grid (ties within and across buckets). Most of
/// them are decided by the kernel's descent over probability mass (`mass_draw`), which never
/// sorts the row, and must pick as the CPU's sorted loop does.
fn wide_draws(ctx: &mut Ctx, band: &Band, sampler: &GpuSampler) {
    const CASES: usize = 600;
    let n = band.candidates.len();
    let (mut got, mut want) = (Vec::new(), Vec::new());
    for case in 0..CASES {
        let scale = [0.01f32, 0.1, 0.5, 1.0, 3.0][case % 5];
        let on_grid = case % 3 == 0;
        let x: Vec<f32> = (0..n)
            .map(|_| {
                let v = ctx.rng.uniform(-scale, scale);
                if on_grid { (v * 16.0 / scale).round() * scale / 16.0 } else { v }
            })
            .collect();
        let top_k = match case % 4 {
            1 => Some(100 + index(ctx, n) as u32),
            2 => Some(100_000),
            _ => None,
        };
        let top_p = if case % 17 == 0 { 1.0 } else { ctx.rng.uniform(0.02, 1.0) };
        let params = SamplingParams { temperature: [0.5, 1.0, 1.7][(case / 5) % 3], top_p, top_k };
        let (seed, frame) = key(ctx, case);
        let first = sample_top_k_top_p(&x, &params.main_filter(), &DrawKey::new(seed, frame, MAIN_STREAM))
            .expect("finite logits");
        want.push(band.candidates.token(first));
        sampler.begin_request_at(ctx.cuda, &params, seed, &[], frame);
        poison_outputs(ctx, sampler);
        let buf = ctx.cuda.upload_f32_scratch(&band.head_order(&x));
        sampler.sample_main(ctx.cuda, &buf);
        got.push(sampler.read_outputs(ctx.cuda).first);
    }
    ctx.exact(format!("main {}: {CASES} first draws keeping hundreds to thousands of ranks", band.name), &got, &want);
}

/// Rows of the decode batch: the main draw and all nine head draws of `ROWS` requests at once,
/// each row with its own knobs, seed, frame and window and logits of its own shape, equal the
/// CPU's draws of each row alone; a row of NaN logits faults alone, with the CPU's error.
fn rows(ctx: &mut Ctx, band: &Band) {
    const ROWS: usize = 37;
    const NAN_ROW: usize = 11;
    let (n, v) = (band.candidates.len(), band.head_vocab);
    let semantic = band.semantic();
    let sampler = GpuSampler::with_rows(ctx.cuda, &band.candidates, &band.restricted, HEADS, v, ROWS + 3)
        .expect("sampler buffers");
    let (mut states, mut want) = (Vec::new(), Vec::new());
    let (mut main_logits, mut head_logits) = (Vec::new(), vec![Vec::new(); HEADS]);
    for b in 0..ROWS {
        let shape = SHAPES[b % (SHAPES.len() - 1)];
        let grid = params_grid(shape);
        let params = grid[index(ctx, grid.len())];
        let (seed, frame) = key(ctx, b);
        let mut x = logits(ctx, n, shape);
        if b == NAN_ROW {
            x[index(ctx, n)] = f32::NAN;
        }
        let first = sample_top_k_top_p(&x, &params.main_filter(), &DrawKey::new(seed, frame, MAIN_STREAM))
            .map(|i| band.candidates.token(i))
            .unwrap_or(semantic[0]);
        let tokens = window_tokens(ctx, &semantic, first, b);
        let window = RasWindow::from_tokens(tokens.iter().copied());
        let heads: Vec<Vec<f32>> = (0..HEADS).map(|_| bf16_values(&logits(ctx, v, Shape::Uniform(2.0)))).collect();
        // The CPU's frame row, or its error (the main draw's first).
        let row: Result<Vec<u32>, SamplingError> = sample_main(&x, &band.candidates, &window, &params, seed, frame)
            .and_then(|pick| {
                let mut row = vec![pick.token, band.candidates.code0(pick.token)];
                for (r, h) in heads.iter().enumerate() {
                    row.push(sample_head(h, r, &params, seed, frame)?);
                }
                Ok(row)
            });
        want.push(row.map_err(|e| format!("{e:?}")));
        states.push(DeviceState::new(&params, seed, &window.tokens(), frame));
        main_logits.extend(band.head_order(&x));
        for (r, h) in heads.into_iter().enumerate() {
            head_logits[r].extend(h);
        }
    }
    sampler.begin_rows(ctx.cuda, &states);
    let main = ctx.cuda.upload_f32_scratch(&main_logits);
    sampler.sample_main_rows(ctx.cuda, &main, ROWS);
    for (r, h) in head_logits.into_iter().enumerate() {
        sampler.sample_head_rows(ctx.cuda, r, &ctx.cuda.upload_matrix(&Matrix::from_vec(ROWS, v, h)), ROWS);
    }
    let got: Vec<Result<Vec<u32>, String>> = (sampler.read_rows(ctx.cuda, ROWS).iter())
        .map(|out| out.frame(2 + HEADS).map(|f| f.row).map_err(|f| format!("{:?}", f.error)))
        .collect();
    ctx.exact(
        format!("rows {}: {ROWS} requests at once vs each alone on the CPU (row {NAN_ROW} NaN)", band.name),
        &got,
        &want,
    );
    let faulted: Vec<usize> = (0..ROWS).filter(|&b| got[b].is_err()).collect();
    ctx.exact(format!("rows {}: the rows that fault", band.name), &faulted, &[NAN_ROW]);
}

/// Prompt-like window tokens, by case: text only; the first draw among the last 16; the first
/// draw just evicted (17 frames ago); a short window holding it; an empty window.
fn window_tokens(ctx: &mut Ctx, semantic: &[u32], first: u32, case: usize) -> Vec<u32> {
    let other = |ctx: &mut Ctx| loop {
        let t = semantic[index(ctx, semantic.len())];
        if t != first {
            return t;
        }
    };
    match case % 5 {
        0 => (0..20).map(|i| 200_000 + i).collect(),
        1 => {
            let mut t: Vec<u32> = (0..RAS_WINDOW).map(|_| other(ctx)).collect();
            let slot = index(ctx, RAS_WINDOW);
            t[slot] = first;
            t
        }
        2 => std::iter::once(first).chain((0..RAS_WINDOW).map(|_| other(ctx))).collect(),
        3 => {
            let mut t: Vec<u32> = (0..5).map(|_| other(ctx)).collect();
            t[index(ctx, 5)] = first;
            t
        }
        _ => Vec::new(),
    }
}

/// Head draws on every shape × parameter combination, heads in turn, on bf16 logits.
fn head_draws(ctx: &mut Ctx, band: &Band, sampler: &GpuSampler) {
    let v = band.head_vocab;
    for shape in SHAPES {
        let (mut got, mut want) = (Vec::new(), Vec::new());
        for (case, params) in params_grid(shape).into_iter().enumerate() {
            let r = case % HEADS;
            let x = bf16_values(&logits(ctx, v, shape));
            let (seed, frame) = key(ctx, case);
            want.push(sample_head(&x, r, &params, seed, frame).expect("finite logits"));

            sampler.begin_request_at(ctx.cuda, &params, seed, &[], frame);
            poison_outputs(ctx, sampler);
            let row = Matrix::from_vec(1, v, x);
            let m = ctx.cuda.upload_matrix(&row);
            sampler.sample_head(ctx.cuda, r, &m, 0);
            let out = sampler.read_outputs(ctx.cuda);
            got.push(if out.failure().is_some() { u32::MAX } else { out.row[2 + r] });
            if got.last() != want.last() {
                // Enough to replay the case on the CPU (`sample_head` with these inputs).
                let finite: Vec<(usize, u32)> = (row.data.iter())
                    .enumerate()
                    .filter(|(_, l)| l.is_finite())
                    .map(|(i, l)| (i, l.to_bits()))
                    .take(64)
                    .collect();
                eprintln!(
                    "head draw mismatch: {} [{v}], {shape:?}, case {case}, head {r}, {params:?}, seed {seed}, frame {frame}: \
                     GPU {:?}, CPU {:?}; first finite logits (index, f32 bits): {finite:?}",
                    band.name,
                    got.last(),
                    want.last()
                );
            }
        }
        ctx.exact(format!("head [{v}], {shape:?}: one draw per case, heads 0..8 in turn"), &got, &want);
    }
}

/// Same error: kind, index, and score (bits, or both NaN).
fn same_error(got: Option<SamplingError>, want: Option<SamplingError>) -> bool {
    match (got, want) {
        (
            Some(SamplingError::NonFinite { index: a, score: sa }),
            Some(SamplingError::NonFinite { index: b, score: sb }),
        ) => a == b && (sa.to_bits() == sb.to_bits() || (sa.is_nan() && sb.is_nan())),
        (a, b) => a == b,
    }
}

/// Logits the CPU refuses are reported with the CPU's error, the draw stream and the frame.
fn faults(ctx: &mut Ctx, band: &Band, sampler: &GpuSampler) {
    let n = band.candidates.len();
    let greedy = SamplingParams { temperature: 0.0, ..SamplingParams::default() };
    let cases: [(&str, f32, SamplingParams); 4] = [
        ("NaN", f32::NAN, SamplingParams::default()),
        ("+inf", f32::INFINITY, SamplingParams::default()),
        ("3e38 at T = 0 (overflows to +inf)", 3e38, greedy),
        ("all -inf", f32::NEG_INFINITY, SamplingParams::default()),
    ];
    for (name, value, params) in cases {
        let (seed, frame) = (ctx.rng.next_u64(), 7);
        // Main: the first draw fails first, as in `sample_main`.
        let mut x = logits(ctx, n, Shape::Uniform(2.0));
        if value == f32::NEG_INFINITY {
            x.fill(value);
        } else {
            let i = index(ctx, n);
            x[i] = value;
            x[index(ctx, n)] = value;
        }
        let want = sample_top_k_top_p(&x, &params.main_filter(), &DrawKey::new(seed, frame, MAIN_STREAM)).err();
        sampler.begin_request_at(ctx.cuda, &params, seed, &[], frame);
        sampler.sample_main(ctx.cuda, &ctx.cuda.upload_f32_scratch(&band.head_order(&x)));
        let out = sampler.read_outputs(ctx.cuda);
        let failure = out.failure();
        let pass = same_error(out.main_draw_error(MAIN_STREAM), want)
            && failure.is_some_and(|f| f.stream == MAIN_STREAM && f.frame == frame && same_error(Some(f.error), want));
        ctx.check(format!("fault main, {name}"), "error", format!("{want:?}"), format!("{failure:?}"), pass);
        let ras_want =
            sample_top_k_top_p(&x, &limelight::model::sampling::RAS_FILTER, &DrawKey::new(seed, frame, RAS_STREAM))
                .err();
        let pass = same_error(out.main_draw_error(RAS_STREAM), ras_want);
        let got = out.main_draw_error(RAS_STREAM);
        ctx.check(format!("fault main RAS draw, {name}"), "error", format!("{ras_want:?}"), format!("{got:?}"), pass);

        // Head 4 (stream 6).
        let mut x = bf16_values(&logits(ctx, band.head_vocab, Shape::Uniform(2.0)));
        if value == f32::NEG_INFINITY {
            x.fill(value);
        } else {
            let i = index(ctx, x.len());
            x[i] = bf16::from_f32(value).to_f32();
        }
        let want = sample_head(&x, 4, &params, seed, frame).err();
        sampler.begin_request_at(ctx.cuda, &params, seed, &[], frame);
        sampler.sample_head(ctx.cuda, 4, &ctx.cuda.upload_matrix(&Matrix::from_vec(1, x.len(), x)), 0);
        let failure = sampler.read_outputs(ctx.cuda).failure();
        let pass = failure.is_some_and(|f| f.stream == 6 && f.frame == frame && same_error(Some(f.error), want));
        ctx.check(format!("fault head 4, {name}"), "error", format!("{want:?}"), format!("{failure:?}"), pass);
    }
}
