//! The whole codec decode through `model::codec` on the GPU.
//! - A random tiny codec written by the checkpoint synth, 160 frames (past the 128-frame window):
//!   every stage's output and the PCM against the CPU with the same f16 weights. Bound: the
//!   GPU's rel L2 from that oracle ≤ 2 × the f16 yardstick's + 1e-2, where the yardstick is the
//!   same CPU decode with every operation's output rounded to f16 (what FP16 activations alone
//!   change in this random codec, through 8 attention layers and ~30 convs).
//! - Streamed == whole, bit for bit: one frame per call, the engine's grouping, irregular groups;
//!   count of differing samples, bound 0. Every pool buffer is NaN-poisoned when handed out.
//! - One-frame calls after warm-up make no driver allocation.
//! - A random codec at the real dims: streamed == whole bit for bit, and frames per second of a
//!   whole decode and of one frame per call, against twice real time (2 × 21.5 frames/s).

use std::time::Instant;

use limelight::backend::BackendTypes;
use limelight::backend::codec::CodecLayerOps;
use limelight::backend::cuda::Cuda;
use limelight::model::codec::{CodecModel, CodecParams, DecoderBlockParams, StreamingDecoder};
use limelight::model::weights::CodecDims;
use limelight::model::weights::codec::{DECODER_RATES, RESIDUAL_DILATIONS};
use limelight::synth::presets::Preset;
use limelight::synth::rng::Rng;

use super::{Dims, F16Cpu, Maker, differing, groups};
use crate::harness::{Ctx, rel_l2};

const FRAMES: usize = 160;
const SENSITIVITY_FACTOR: f64 = 2.0;
const FLOOR: f64 = 1e-2;
/// Code frames per second of audio (44 100 Hz / 2048 samples).
const REAL_TIME: f64 = 44_100.0 / 2048.0;
const REAL_FRAMES: usize = 64;

pub fn run(ctx: &mut Ctx) {
    tiny_checkpoint(ctx);
    real_dims(ctx);
}

/// Random codes, a few past the codebooks (the decode clamps them).
pub fn random_codes(ctx: &mut Ctx, d: &CodecDims, frames: usize) -> Vec<u32> {
    let mut codes = Vec::with_capacity(frames * (1 + d.residual_codebooks));
    for _ in 0..frames {
        codes.push((ctx.rng.next_u64() % (d.semantic_codebook_size as u64 + 8)) as u32);
        for _ in 0..d.residual_codebooks {
            codes.push((ctx.rng.next_u64() % (d.residual_codebook_size as u64 + 4)) as u32);
        }
    }
    codes
}

fn tiny_checkpoint(ctx: &mut Ctx) {
    let (_dir, ckpt) = ctx.tiny_checkpoint();
    let cuda: &Cuda = ctx.cuda;
    let (oracle, yardstick) = (F16Cpu { activations: false }, F16Cpu { activations: true });
    let cpu_model = CodecModel::load(&ckpt, &oracle).expect("CPU codec");
    let gpu_model = CodecModel::load(&ckpt, cuda).expect("GPU codec");
    let codes = random_codes(ctx, &cpu_model.dims, FRAMES);

    let (want_pcm, want) = cpu_model.decode_traced(&oracle, &codes).expect("CPU decode");
    let (yard_pcm, yard) = cpu_model.decode_traced(&yardstick, &codes).expect("yardstick decode");
    let (got_pcm, got) = gpu_model.decode_traced(cuda, &codes).expect("GPU decode");
    let stages = [
        ("RVQ sum", &got.rvq, &yard.rvq, &want.rvq),
        ("post_module", &got.post_module, &yard.post_module, &want.post_module),
        ("upsample stages", &got.upsample, &yard.upsample, &want.upsample),
        ("final conv (pre-tanh)", &got.pre_tanh, &yard.pre_tanh, &want.pre_tanh),
    ];
    for (stage, g, y, w) in stages {
        let gpu = rel_l2(&cuda.to_host(g).data, &w.data);
        judged(ctx, stage, gpu, rel_l2(&y.data, &w.data));
    }
    judged(ctx, "PCM", rel_l2(&got_pcm, &want_pcm), rel_l2(&yard_pcm, &want_pcm));

    streamed(ctx, "tiny", &gpu_model, &codes, &got_pcm);
    together(ctx, &gpu_model);
    allocations(ctx, &gpu_model, &codes);
    super::thread::run(ctx, &gpu_model);
}

/// Streams decoded together (`StreamingDecoder::push_many`, the decode batch's codec pass): each
/// joins at its own call, sits some calls out and takes groups of its own sizes; its samples
/// must equal its own whole decode, bit for bit.
fn together(ctx: &mut Ctx, model: &CodecModel<Cuda>) {
    let cuda: &Cuda = ctx.cuda;
    let width = model.codes_per_frame();
    let lens = [20usize, 33, 7, 48, 130, 9];
    let all: Vec<Vec<u32>> = lens.iter().map(|&f| random_codes(ctx, &model.dims, f)).collect();
    let wholes: Vec<Vec<f32>> = all.iter().map(|c| model.decode(cuda, c).expect("GPU whole decode")).collect();
    let mut decoders: Vec<StreamingDecoder<Cuda>> = lens.iter().map(|_| StreamingDecoder::new(model, cuda)).collect();
    let (mut at, mut pcm) = (vec![0usize; lens.len()], vec![Vec::new(); lens.len()]);
    let (mut call, mut most) = (0, 0);
    while at.iter().zip(&lens).any(|(a, l)| a < l) {
        let mut chunks: Vec<(usize, Vec<u32>)> = Vec::new();
        for s in 0..lens.len() {
            if call < s || (call + s) % 5 == 0 || at[s] == lens[s] {
                continue;
            }
            let n = (1 + (call + 2 * s) % 8).min(lens[s] - at[s]);
            chunks.push((s, all[s][at[s] * width..(at[s] + n) * width].to_vec()));
            at[s] += n;
        }
        most = most.max(chunks.len());
        let mut picked: Vec<&mut StreamingDecoder<Cuda>> = (decoders.iter_mut().enumerate())
            .filter(|(i, _)| chunks.iter().any(|(s, _)| s == i))
            .map(|(_, d)| d)
            .collect();
        let code_refs: Vec<&[u32]> = chunks.iter().map(|(_, c)| c.as_slice()).collect();
        for ((s, _), result) in chunks.iter().zip(StreamingDecoder::push_many(&mut picked, &code_refs)) {
            pcm[*s].extend(result.expect("GPU decode of streams together"));
        }
        call += 1;
    }
    let differ: usize = pcm.iter().zip(&wholes).map(|(got, whole)| differing(got, whole)).sum();
    let samples: usize = wholes.iter().map(Vec::len).sum();
    ctx.check(
        format!("codec streams decoded together == each whole decode [{} streams, up to {most} per call]", lens.len()),
        "differing samples",
        "0".into(),
        format!("{differ} of {samples}"),
        differ == 0,
    );
}

fn judged(ctx: &mut Ctx, stage: &str, gpu: f64, yard: f64) {
    let bound = SENSITIVITY_FACTOR * yard + FLOOR;
    ctx.check(
        format!("codec decode [tiny checkpoint, {FRAMES} frames]: {stage}"),
        "rel L2",
        format!("{bound:.1e} (2 × f16 yardstick {yard:.1e} + {FLOOR:.0e})"),
        format!("{gpu:.2e}"),
        gpu <= bound,
    );
}

/// Streamed decodes of `codes` in several groupings against the whole decode `whole`.
fn streamed(ctx: &mut Ctx, name: &str, model: &CodecModel<Cuda>, codes: &[u32], whole: &[f32]) {
    let width = model.codes_per_frame();
    let frames = codes.len() / width;
    // The generation loop's grouping: the first frame alone, then groups doubling up to 8.
    let mut engine = Vec::new();
    while engine.iter().sum::<usize>() < frames {
        let left = frames - engine.iter().sum::<usize>();
        engine.push(limelight::engine::generate::codec_group(engine.len()).min(left));
    }
    let cases = [
        ("one frame per call", groups(frames, &[1])),
        ("the engine's groups 1, 2, 4, 8, 8, …", engine),
        ("irregular groups 1, 3, 2, 7, 5, 11, 4, 64, 9", groups(frames, &[1, 3, 2, 7, 5, 11, 4, 64, 9])),
    ];
    for (what, sizes) in cases {
        let mut decoder = StreamingDecoder::new(model, ctx.cuda);
        let (mut pcm, mut at, mut short) = (Vec::new(), 0, 0);
        for n in sizes {
            let part = decoder.push(&codes[at * width..(at + n) * width]).expect("GPU streamed decode");
            short += usize::from(part.len() != 2048 * n);
            pcm.extend(part);
            at += n;
        }
        let d = differing(&pcm, whole);
        ctx.check(
            format!("codec streamed == whole [{name}, {frames} frames, {what}]"),
            "differing samples",
            "0".into(),
            format!("{d} of {} ({short} calls of the wrong length)", whole.len()),
            d == 0 && short == 0,
        );
    }
}

/// One-frame calls after three warm-up calls allocate nothing from the driver.
fn allocations(ctx: &mut Ctx, model: &CodecModel<Cuda>, codes: &[u32]) {
    let cuda = ctx.cuda;
    let width = model.codes_per_frame();
    let mut decoder = StreamingDecoder::new(model, cuda);
    let frame = |t: usize| &codes[t * width..(t + 1) * width];
    for t in 0..3 {
        decoder.push(frame(t)).expect("warm-up");
    }
    cuda.synchronize();
    let before = cuda.pool().stats().driver_allocations;
    for t in 3..10 {
        decoder.push(frame(t)).expect("decode");
    }
    cuda.synchronize();
    let allocations = cuda.pool().stats().driver_allocations - before;
    ctx.check(
        "codec one-frame calls 4..10 after warm-up: driver allocations",
        "count",
        "0".into(),
        allocations.to_string(),
        allocations == 0,
    );
}

/// A codec of the published dims with random f16 weights (no CPU oracle: its f64 decode of a
/// full-size codec would take minutes; the operations were compared at these dims in `ops`).
fn real_dims(ctx: &mut Ctx) {
    let cuda: &Cuda = ctx.cuda;
    let dims = Preset::Full.dims().codec;
    let place = |shape: &[usize], data: Vec<f32>| cuda.codec_weight(shape, data);
    let mut maker = Maker { rng: Rng::new(ctx.rng.next_u64()), place: &place };
    let model = CodecModel { params: params(&mut maker, &dims), dims };
    let codes = random_codes(ctx, &model.dims, REAL_FRAMES);
    model.decode(cuda, &codes[..2 * model.codes_per_frame()]).expect("warm-up decode");

    let start = Instant::now();
    let whole = model.decode(cuda, &codes).expect("GPU decode");
    let whole_fps = REAL_FRAMES as f64 / start.elapsed().as_secs_f64();
    let bad = whole.iter().filter(|v| !v.is_finite()).count();
    ctx.check(
        format!("codec decode [real dims, {REAL_FRAMES} frames]: non-finite samples"),
        "count",
        "0".into(),
        bad.to_string(),
        bad == 0,
    );
    let mut decoder = StreamingDecoder::new(&model, cuda);
    let width = model.codes_per_frame();
    let start = Instant::now();
    let mut pcm = Vec::new();
    for frame in codes.chunks_exact(width) {
        pcm.extend(decoder.push(frame).expect("GPU streamed decode"));
    }
    let stream_fps = REAL_FRAMES as f64 / start.elapsed().as_secs_f64();
    let d = differing(&pcm, &whole);
    ctx.check(
        format!("codec streamed == whole [real dims, {REAL_FRAMES} frames, one frame per call]"),
        "differing samples",
        "0".into(),
        format!("{d} of {}", whole.len()),
        d == 0,
    );
    streamed(ctx, "real dims", &model, &codes, &whole);
    for (what, fps) in [("whole decode", whole_fps), ("one frame per call", stream_fps)] {
        ctx.check(
            format!("codec speed [real dims, {REAL_FRAMES} frames, {what}]"),
            "frames/s",
            format!("≥ {:.0} (2 × real time)", 2.0 * REAL_TIME),
            format!("{fps:.0} ({:.0}× real time)", fps / REAL_TIME),
            fps >= 2.0 * REAL_TIME,
        );
    }
}

/// Every decode-path weight of a codec of `d`'s widths, random.
fn params<W>(m: &mut Maker<'_, W>, d: &CodecDims) -> CodecParams<W> {
    let dims = Dims {
        name: "real",
        latent: d.latent,
        intermediate: d.transformer_intermediate,
        semantic_size: d.semantic_codebook_size,
        residual_size: d.residual_codebook_size,
        decoder: d.decoder_dim,
    };
    let mut blocks = Vec::new();
    for (i, &stride) in DECODER_RATES.iter().enumerate() {
        let cin = d.decoder_dim >> i;
        let upsample = super::decoder_upsample(m, cin, stride);
        let units = RESIDUAL_DILATIONS.iter().map(|&dil| super::residual_unit(m, cin / 2, dil)).collect();
        blocks.push(DecoderBlockParams { upsample, units });
    }
    let last = d.decoder_dim >> DECODER_RATES.len();
    CodecParams {
        books: super::books(m, &dims),
        post_layers: (0..d.post_module_layers).map(|_| super::layer(m, &dims)).collect(),
        post_norm: m.w(&[d.latent], 1.0, 0.5),
        upsample: (0..2).map(|_| super::upsample_stage(m, d.latent)).collect(),
        conv_in: super::conv(m, d.decoder_dim, 7, d.latent, 1),
        blocks,
        out_snake: super::snake(m, last),
        conv_out: super::conv(m, 1, 7, last, 1),
    }
}
