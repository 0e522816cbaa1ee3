//! The codec encoder on the GPU in f32 (`backend::cuda::codec_encode`, voice cloning) against the
//! CPU encoder, which matches sglang-omni's own module (tests/reference_codec_encode.rs).
//!
//! Each operation on random f32 inputs and weights at the tiny and the real codec widths, the
//! stateful ones (causal conv, residual unit, transformer layer) in chunks that carry their state,
//! state compared after the last chunk; then a whole encode of a random clip on a fresh tiny
//! checkpoint, stage by stage and code for code.
//!
//! Bounds: an operation rel L2 ≤ 1e-5 (f32 on both sides, the CPU's sums in f64: ~1e-7 expected,
//! a wrong index or tap is O(1)); a whole encode's stages ≤ 1e-4 (≈ 30 layers deep). Codes: equal,
//! except at near-ties: where the CPU's best and second-best codewords are within 1e-4 in cosine,
//! either pick is right and the frame's later codes follow from it; those are counted, and must
//! stay under 1 % of the codes.

use limelight::backend::BackendTypes;
use limelight::backend::codec::{CausalConv, CodecAttentionShape, CodecLayerOps, ResidualUnitParams};
use limelight::backend::codec_encode::{CodecEncodeOps, DownsampleStage, StridedConv, VqEncoder};
use limelight::backend::cpu::{Cpu, CpuWeight, Matrix};
use limelight::backend::cuda::codec_encode::CudaF32;
use limelight::backend::cuda::tensor::GpuWeight;
use limelight::model::codec::encode::{CodecEncoder, samples_per_code_frame};
use limelight::model::codec::rope::{inverse_frequencies, rope_rows};
use limelight::synth::rng::Rng;

use crate::codec::{Dims, Maker, REAL, TINY, both_f32, conv, convnext, layer};
use crate::harness::{Ctx, rel_l2};

const OP_BOUND: f64 = 1e-5;
const STAGE_BOUND: f64 = 1e-4;
const NEAR_TIE: f64 = 1e-4;

pub fn run(ctx: &mut Ctx) {
    for w in [&TINY, &REAL] {
        strided_conv(ctx, w);
        causal_convs(ctx, w);
        transformer_layer(ctx, w);
        downsample_stage(ctx, w);
        quantize(ctx, w);
    }
    whole_encode(ctx);
}

fn gpu<'a>(ctx: &'a Ctx<'_>) -> CudaF32<'a> {
    CudaF32::new(ctx.cuda)
}

fn strided<W>(m: &mut Maker<'_, W>, out: usize, kernel: usize, inp: usize, stride: usize) -> StridedConv<W> {
    StridedConv { weight: m.fan_in(&[out, kernel, inp], kernel * inp), bias: m.w(&[out], 0.0, 0.1), kernel, stride }
}

/// A Snake α, a dilated k7 conv and a residual unit (d = 9), all `c` wide.
fn convs<W>(m: &mut Maker<'_, W>, c: usize) -> (CausalConv<W>, W, ResidualUnitParams<W>) {
    let unit = ResidualUnitParams {
        snake1: m.w(&[c], 0.5, 0.4),
        conv1: conv(m, c, 7, c, 9),
        snake2: m.w(&[c], 0.5, 0.4),
        conv2: conv(m, c, 1, c, 1),
    };
    (conv(m, c, 7, c, 3), m.w(&[c], 0.5, 0.4), unit)
}

fn downsample<W>(m: &mut Maker<'_, W>, l: usize) -> DownsampleStage<W> {
    let conv = StridedConv { weight: m.fan_in(&[l, 2, l], 2 * l), bias: m.w(&[l], 0.0, 0.1), kernel: 2, stride: 2 };
    DownsampleStage { conv, convnext: convnext(m, l) }
}

fn quantizers<W>(m: &mut Maker<'_, W>, d: &Dims) -> Vec<VqEncoder<W>> {
    (0..10)
        .map(|i| VqEncoder {
            in_proj: m.fan_in(&[8, d.latent], d.latent),
            in_bias: m.w(&[8], 0.0, 0.1),
            codebook: m.w(&[if i == 0 { d.semantic_size } else { d.residual_size }, 8], 0.0, 1.0),
            out_proj: m.fan_in(&[d.latent, 8], 8),
            out_bias: m.w(&[d.latent], 0.0, 0.1),
        })
        .collect()
}

fn rows(m: &Matrix, a: usize, b: usize) -> Matrix {
    Matrix::from_vec(b - a, m.cols, m.data[a * m.cols..b * m.cols].to_vec())
}

/// The last encoder block's downsampling (k = 16, s = 8) with its Snake, and a k = 4, s = 2 one.
fn strided_conv(ctx: &mut Ctx, w: &Dims) {
    for (stride, cin) in [(8, w.latent / 2), (2, 8)] {
        let ((c, alpha), (g, galpha)) = both_f32(
            ctx,
            |m| (strided(m, 2 * cin, 2 * stride, cin, stride), m.w(&[cin], 0.5, 0.4)),
            |m| (strided(m, 2 * cin, 2 * stride, cin, stride), m.w(&[cin], 0.5, 0.4)),
        );
        let x = ctx.random(48 * stride, cin, 1.0);
        let want = Cpu.codec_strided_conv(&c, Some(&alpha), &x);
        let got = gpu(ctx).codec_strided_conv(&g, Some(&galpha), &gpu(ctx).upload(&x));
        let got = ctx.cuda.to_host(&got);
        ctx.rel_l2(
            format!("encode {}: Snake + strided conv s={stride} {cin}→{}", w.name, 2 * cin),
            &got.data,
            &want.data,
            OP_BOUND,
        );
    }
}

/// A dilated causal conv and a residual unit, each over three chunks carrying its history.
fn causal_convs(ctx: &mut Ctx, w: &Dims) {
    let c = if w.name == "real" { 512 } else { 16 };
    let ((cc, alpha, unit), (gc, galpha, gunit)) = both_f32(ctx, |m| convs(m, c), |m| convs(m, c));
    let x = ctx.random(200, c, 1.0);
    let g = gpu(ctx);
    let (mut ch, mut gh) = (Cpu.new_conv_history(cc.history(), c), g.new_conv_history(gc.history(), c));
    let (mut cu, mut gu) =
        (Cpu.new_conv_history(unit.conv1.history(), c), g.new_conv_history(gunit.conv1.history(), c));
    let (mut conv_err, mut unit_err) = (0.0f64, 0.0f64);
    for (a, b) in [(0, 37), (37, 150), (150, 200)] {
        let part = rows(&x, a, b);
        let gpart = g.upload(&part);
        let want = Cpu.codec_causal_conv(&cc, Some(&alpha), &part, &mut ch);
        let got = ctx.cuda.to_host(&g.codec_causal_conv(&gc, Some(&galpha), &gpart, &mut gh));
        conv_err = conv_err.max(rel_l2(&got.data, &want.data));
        let want = Cpu.codec_residual_unit(&unit, &part, &mut cu);
        let got = ctx.cuda.to_host(&g.codec_residual_unit(&gunit, &gpart, &mut gu));
        unit_err = unit_err.max(rel_l2(&got.data, &want.data));
    }
    let stage = format!("encode {}: Snake + causal conv k7 d3 {c}, 3 chunks (worst chunk)", w.name);
    ctx.check(stage, "rel L2", "1e-5".into(), format!("{conv_err:.2e}"), conv_err <= OP_BOUND);
    let stage = format!("encode {}: residual unit d9 {c}, 3 chunks (worst chunk)", w.name);
    ctx.check(stage, "rel L2", "1e-5".into(), format!("{unit_err:.2e}"), unit_err <= OP_BOUND);
    let history = ctx.cuda.to_host(&gu.rows);
    ctx.rel_l2(
        format!("encode {}: residual unit's history after the chunks", w.name),
        &history.data,
        &cu.rows.data,
        OP_BOUND,
    );
}

/// A transformer layer over more rows than its window, in two chunks carrying the window.
fn transformer_layer(ctx: &mut Ctx, w: &Dims) {
    let (window, total, cut) = if w.name == "real" { (512, 540, 300) } else { (16, 45, 20) };
    let shape = CodecAttentionShape { heads: w.latent / 64, head_dim: 64, window, norm_eps: 1e-5 };
    let (cl, gl) = both_f32(ctx, |m| layer(m, w), |m| layer(m, w));
    let x = ctx.random(total, w.latent, 1.0);
    let g = gpu(ctx);
    let (mut ckv, mut gkv) = (Cpu.new_kv_window(&shape), g.new_kv_window(&shape));
    let inv = inverse_frequencies(64);
    let mut worst = 0.0f64;
    for (a, b) in [(0, cut), (cut, total)] {
        let part = rows(&x, a, b);
        let rope = rope_rows(&inv, a, b - a);
        let want = Cpu.codec_transformer_layer(&shape, &cl, &rope, &part, &mut ckv);
        let got = ctx.cuda.to_host(&g.codec_transformer_layer(&shape, &gl, &rope, &g.upload(&part), &mut gkv));
        worst = worst.max(rel_l2(&got.data, &want.data));
    }
    let stage = format!("encode {}: transformer layer, window {window}, {total} rows in 2 chunks (worst)", w.name);
    ctx.check(stage, "rel L2", "1e-5".into(), format!("{worst:.2e}"), worst <= OP_BOUND);
    let keys = ctx.cuda.to_host(&gkv.keys);
    let n = ckv.len * ckv.keys.cols;
    ctx.exact(format!("encode {}: transformer window rows kept", w.name), &[gkv.len], &[ckv.len]);
    ctx.rel_l2(format!("encode {}: transformer window keys", w.name), &keys.data[..n], &ckv.keys.data[..n], OP_BOUND);
}

fn downsample_stage(ctx: &mut Ctx, w: &Dims) {
    let l = w.latent;
    let (c, g) = both_f32(ctx, |m| downsample(m, l), |m| downsample(m, l));
    let x = ctx.random(96, l, 1.0);
    let want = Cpu.codec_downsample_stage(&c, &x);
    let got = ctx.cuda.to_host(&gpu(ctx).codec_downsample_stage(&g, &gpu(ctx).upload(&x)));
    ctx.rel_l2(format!("encode {}: downsample stage (conv k=s=2, ConvNeXt)", w.name), &got.data, &want.data, OP_BOUND);
}

/// The quantizers over random rows: codes against the CPU's, near-ties excused.
fn quantize(ctx: &mut Ctx, w: &Dims) {
    let l = w.latent;
    let (c, g) = both_f32(ctx, |m| quantizers(m, w), |m| quantizers(m, w));
    let z = ctx.random(300, l, 1.0);
    let cq: Vec<&VqEncoder<CpuWeight>> = c.iter().collect();
    let gq: Vec<&VqEncoder<GpuWeight>> = g.iter().collect();
    let want = Cpu.codec_quantize(&cq, &z);
    let got = gpu(ctx).codec_quantize(&gq, &gpu(ctx).upload(&z));
    codes_check(ctx, &format!("encode {}: 10 quantizers over 300 rows", w.name), &got, &want, &near_ties(&cq, &z));
}

/// A random clip through the whole encoder on a fresh tiny checkpoint, both backends.
fn whole_encode(ctx: &mut Ctx) {
    let (_dir, ckpt) = ctx.tiny_checkpoint();
    let mut rng = Rng::new(ctx.rng.next_u64());
    let g = gpu(ctx);
    let (cpu_enc, gpu_enc) = (CodecEncoder::load(&ckpt, &Cpu).unwrap(), CodecEncoder::load(&ckpt, &g).unwrap());
    // About 3.1 s: a few tones with noise, not a whole number of frames.
    let n = 68 * samples_per_code_frame() - 321;
    let clip: Vec<f32> = (0..n)
        .map(|i| {
            let t = i as f32 / 44_100.0;
            0.4 * (2.0 * std::f32::consts::PI * 180.0 * t).sin()
                + 0.2 * (2.0 * std::f32::consts::PI * 523.0 * t).sin()
                + rng.uniform(-0.05, 0.05)
        })
        .collect();
    let (want, ct) = cpu_enc.encode_traced(&Cpu, &clip).unwrap();
    let (got, gt) = gpu_enc.encode_traced(&g, &clip).unwrap();
    for (stage, c, gm) in [
        ("encoder", &ct.encoder, &gt.encoder),
        ("downsample", &ct.downsample, &gt.downsample),
        ("pre_module", &ct.pre_module, &gt.pre_module),
    ] {
        let got = ctx.cuda.to_host(gm);
        ctx.rel_l2(format!("encode tiny checkpoint, 3.1 s clip: {stage} output"), &got.data, &c.data, STAGE_BOUND);
    }
    let quantizers: Vec<&VqEncoder<CpuWeight>> = cpu_enc.params.quantizers.iter().collect();
    codes_check(ctx, "encode tiny checkpoint, 3.1 s clip: codes", &got, &want, &near_ties(&quantizers, &ct.pre_module));
}

/// Whether each (row, quantizer) is a near-tie on the CPU's path: its two best codewords'
/// cosines within [`NEAR_TIE`].
fn near_ties(quantizers: &[&VqEncoder<CpuWeight>], z: &Matrix) -> Vec<bool> {
    let n = quantizers.len();
    let mut ties = vec![false; z.rows * n];
    let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| f64::from(*x) * f64::from(*y)).sum::<f64>();
    for t in 0..z.rows {
        let mut r: Vec<f32> = z.row(t).to_vec();
        for (i, q) in quantizers.iter().enumerate() {
            let dim = q.codebook.shape[1];
            let e: Vec<f32> =
                (0..dim).map(|d| (f64::from(q.in_bias.data[d]) + dot(q.in_proj.row(d), &r)) as f32).collect();
            let en = dot(&e, &e).sqrt();
            let mut sims: Vec<(f64, usize)> = (0..q.codebook.shape[0])
                .map(|j| (dot(q.codebook.row(j), &e) / (dot(q.codebook.row(j), q.codebook.row(j)).sqrt() * en), j))
                .collect();
            sims.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
            ties[t * n + i] = sims[0].0 - sims[1].0 < NEAR_TIE;
            let c = q.codebook.row(sims[0].1);
            let st: Vec<f32> = e.iter().zip(c).map(|(&ev, &cv)| ev + (cv - ev)).collect();
            for (o, v) in r.iter_mut().enumerate() {
                *v -= (f64::from(q.out_bias.data[o]) + dot(q.out_proj.row(o), &st)) as f32;
            }
        }
    }
    ties
}

/// Codes equal but at near-ties, where the rest of that row is excused; the excused share ≤ 1 %.
fn codes_check(ctx: &mut Ctx, stage: &str, got: &[u32], want: &[u32], ties: &[bool]) {
    let n = 10;
    let (mut wrong, mut excused) = (0, 0);
    for (t, (g, w)) in got.chunks(n).zip(want.chunks(n)).enumerate() {
        for i in 0..n {
            if g[i] != w[i] {
                if ties[t * n + i] {
                    excused += n - i;
                } else {
                    wrong += 1;
                }
                break;
            }
        }
    }
    let pass = got.len() == want.len() && wrong == 0 && excused * 100 <= want.len();
    let value = format!("{wrong} wrong, {excused} of {} excused at near-ties", want.len());
    ctx.check(stage, "codes", "0 wrong, ≤ 1 % excused".into(), value, pass);
}
