//! Each codec operation on random f16-rounded inputs and weights, GPU against the CPU op (the
//! same f16 values on both sides), at the tiny and the real codec dims. Stateful operations run
//! as two or three calls carrying their state, then their final state is compared; the GPU's
//! chunked calls must also equal one GPU call over all rows, bit for bit.
//!
//! Bound: rel L2 ≤ 1e-2 for every operation. The CPU computes in f32 with f64 sums; the GPU
//! rounds to f16 between the kernels inside an op (a transformer layer rounds about eight
//! times, each ≈ 3e-4 RMS relative), so ~1e-3 is expected; 1e-2 leaves room without hiding a
//! wrong index, which moves a result by O(1).

use limelight::backend::BackendTypes;
use limelight::backend::codec::{CausalConv, CodecAttentionShape, CodecOps};
use limelight::backend::cpu::Matrix;
use limelight::backend::cuda::tensor::GpuMatrix;
use limelight::model::codec::rope::{inverse_frequencies, rope_rows};
use limelight::model::weights::codec::{DECODER_RATES, RESIDUAL_DILATIONS};

use super::{Dims, Maker, REAL, TINY, both, differing, input};
use crate::harness::Ctx;

const BOUND: f64 = 1e-2;

pub fn run(ctx: &mut Ctx) {
    for d in [&TINY, &REAL] {
        rvq(ctx, d);
        rms_norm(ctx, d);
        transformer_layer(ctx, d);
        upsample_stage(ctx, d);
        convs(ctx, d);
        decoder_blocks(ctx, d);
    }
    tanh(ctx);
}

/// Rows `a..b` of `m`.
fn rows(m: &Matrix, a: usize, b: usize) -> Matrix {
    Matrix::from_vec(b - a, m.cols, m.data[a * m.cols..b * m.cols].to_vec())
}

/// Runs `cpu` and `gpu` over `x` cut into `chunks` (each call gets its rows and its first row's
/// index), comparing every call; then one GPU call over all rows from a fresh state against the
/// concatenated GPU calls, bit for bit. `states`: the CPU's, the chunked GPU's, the whole GPU's.
/// Returns the final CPU and chunked-GPU states.
fn chunked<CS, GS>(
    ctx: &mut Ctx,
    what: &str,
    x: &Matrix,
    chunks: &[usize],
    mut cpu: impl FnMut(&Matrix, usize, &mut CS) -> Matrix,
    mut gpu: impl FnMut(&GpuMatrix, usize, &mut GS) -> GpuMatrix,
    (mut cs, mut gs, mut whole_state): (CS, GS, GS),
) -> (CS, GS) {
    let cuda = ctx.cuda;
    let mut streamed = Vec::new();
    let mut at = 0;
    for (i, &n) in chunks.iter().enumerate() {
        let part = rows(x, at, at + n);
        let want = cpu(&part, at, &mut cs);
        let got = cuda.to_host(&gpu(&cuda.upload_matrix_f16(&part), at, &mut gs));
        ctx.rel_l2(format!("codec {what} call {} of {} rows", i + 1, n), &got.data, &want.data, BOUND);
        streamed.extend(got.data);
        at += n;
    }
    let whole = cuda.to_host(&gpu(&cuda.upload_matrix_f16(x), 0, &mut whole_state));
    let d = differing(&streamed, &whole.data);
    ctx.check(
        format!("codec {what} GPU calls {chunks:?} vs one call of {at} rows"),
        "differing values",
        "0".into(),
        format!("{d} of {}", whole.data.len()),
        d == 0,
    );
    (cs, gs)
}

fn rvq(ctx: &mut Ctx, d: &Dims) {
    let (cpu_books, gpu_books) = both(ctx, |m| super::books(m, d), |m| super::books(m, d));
    let frames = 37;
    let codes: Vec<u32> = (0..frames * 10)
        .map(|i| {
            let size = if i % 10 == 0 { d.semantic_size } else { d.residual_size };
            (ctx.rng.next_u64() % size as u64) as u32
        })
        .collect();
    let want = ctx.cpu.codec_rvq(&cpu_books, &codes);
    let got = ctx.cuda.to_host(&ctx.cuda.codec_rvq(&gpu_books, &codes));
    ctx.rel_l2(format!("codec RVQ lookup [{} {frames} frames]", d.name), &got.data, &want.data, BOUND);
}

fn rms_norm(ctx: &mut Ctx, d: &Dims) {
    let (cw, gw) = both(ctx, |m| m.w(&[d.latent], 1.0, 0.5), |m| m.w(&[d.latent], 1.0, 0.5));
    let (x, gx) = input(ctx, 33, d.latent, 2.0);
    let want = ctx.cpu.codec_rms_norm(&cw, 1e-5, &x);
    let got = ctx.cuda.to_host(&ctx.cuda.codec_rms_norm(&gw, 1e-5, &gx));
    ctx.rel_l2(format!("codec RMSNorm [{} 33 rows]", d.name), &got.data, &want.data, BOUND);
}

/// Tiny: 141 frames in calls of 100, 1, 40 (the window of 127 past frames fills and slides).
/// Real: 32 frames in calls of 1, 7, 24.
fn transformer_layer(ctx: &mut Ctx, d: &Dims) {
    let (cpu, cuda) = (ctx.cpu, ctx.cuda);
    let (cw, gw) = both(ctx, |m| super::layer(m, d), |m| super::layer(m, d));
    let shape = CodecAttentionShape { heads: d.latent / 64, head_dim: 64, window: 128, norm_eps: 1e-5 };
    let chunks: &[usize] = if d.name == "tiny" { &[100, 1, 40] } else { &[1, 7, 24] };
    let (x, _) = input(ctx, chunks.iter().sum(), d.latent, 1.0);
    let inv = inverse_frequencies(64);
    let states = (cpu.new_kv_window(&shape), cuda.new_kv_window(&shape), cuda.new_kv_window(&shape));
    let (ckv, gkv) = chunked(
        ctx,
        &format!("transformer layer [{}]", d.name),
        &x,
        chunks,
        |x, at, kv| cpu.codec_transformer_layer(&shape, &cw, &rope_rows(&inv, at, x.rows), x, kv),
        |x, at, kv| cuda.codec_transformer_layer(&shape, &gw, &rope_rows(&inv, at, x.rows), x, kv),
        states,
    );
    ctx.check(
        format!("codec transformer window length [{}]", d.name),
        "rows",
        ckv.len.to_string(),
        gkv.len.to_string(),
        gkv.len == ckv.len,
    );
    let n = ckv.len * ckv.keys.cols;
    for (what, c, g) in [("keys", &ckv.keys, &gkv.keys), ("values", &ckv.values, &gkv.values)] {
        let got = cuda.to_host(g);
        let stage = format!("codec transformer window {what} [{}]", d.name);
        ctx.rel_l2(stage, &got.data[..n.min(got.data.len())], &c.data[..n], BOUND);
    }
}

fn upsample_stage(ctx: &mut Ctx, d: &Dims) {
    let (cpu, cuda, c) = (ctx.cpu, ctx.cuda, d.latent);
    let (cw, gw) = both(ctx, |m| super::upsample_stage(m, c), |m| super::upsample_stage(m, c));
    let (x, _) = input(ctx, 8, c, 1.0);
    let states = (cpu.new_conv_history(6, c), cuda.new_conv_history(6, c), cuda.new_conv_history(6, c));
    let (ch, gh) = chunked(
        ctx,
        &format!("upsample stage [{}]", d.name),
        &x,
        &[3, 5],
        |x, _, h| cpu.codec_upsample_stage(&cw, x, h),
        |x, _, h| cuda.codec_upsample_stage(&gw, x, h),
        states,
    );
    let got = cuda.to_host(&gh.rows);
    ctx.rel_l2(format!("codec upsample stage history [{}]", d.name), &got.data, &ch.rows.data, BOUND);
}

/// `decoder.model.0` (no Snake) and `decoder.model.5/6` (Snake, one output channel).
fn convs(ctx: &mut Ctx, d: &Dims) {
    let (cpu, cuda) = (ctx.cpu, ctx.cuda);
    let (l, c_in, c_last) = (d.latent, d.decoder, d.decoder >> DECODER_RATES.len());
    let (cw, gw) = both(ctx, |m| super::conv(m, c_in, 7, l, 1), |m| super::conv(m, c_in, 7, l, 1));
    let (x, _) = input(ctx, 16, l, 1.0);
    let states = (cpu.new_conv_history(6, l), cuda.new_conv_history(6, l), cuda.new_conv_history(6, l));
    chunked(
        ctx,
        &format!("conv in [{} {l}→{c_in} k7]", d.name),
        &x,
        &[4, 12],
        |x, _, h| cpu.codec_causal_conv(&cw, None, x, h),
        |x, _, h| cuda.codec_causal_conv(&gw, None, x, h),
        states,
    );

    let ((c_snake, c_conv), (g_snake, g_conv)) = both(ctx, |m| conv_out(m, c_last), |m| conv_out(m, c_last));
    let (x, _) = input(ctx, 2049, c_last, 1.0);
    let states = (cpu.new_conv_history(6, c_last), cuda.new_conv_history(6, c_last), cuda.new_conv_history(6, c_last));
    chunked(
        ctx,
        &format!("Snake + conv out [{} {c_last}→1 k7]", d.name),
        &x,
        &[700, 1349],
        |x, _, h| cpu.codec_causal_conv(&c_conv, Some(&c_snake), x, h),
        |x, _, h| cuda.codec_causal_conv(&g_conv, Some(&g_snake), x, h),
        states,
    );
}

/// `decoder.model.5` (Snake) and `decoder.model.6` (k7 conv to one channel).
fn conv_out<W>(m: &mut Maker<'_, W>, c: usize) -> (W, CausalConv<W>) {
    (super::snake(m, c), super::conv(m, 1, 7, c, 1))
}

/// Every decoder block's Snake + transposed conv, and its residual units at d = 1, 3, 9 (calls
/// of 5 then 70 rows: the first call is shorter than the d = 9 history of 54 rows).
fn decoder_blocks(ctx: &mut Ctx, d: &Dims) {
    let (cpu, cuda) = (ctx.cpu, ctx.cuda);
    for (i, &stride) in DECODER_RATES.iter().enumerate() {
        let cin = d.decoder >> i;
        let (cw, gw) =
            both(ctx, |m| super::decoder_upsample(m, cin, stride), |m| super::decoder_upsample(m, cin, stride));
        let (x, _) = input(ctx, 12, cin, 1.0);
        let states = (cpu.new_conv_history(1, cin), cuda.new_conv_history(1, cin), cuda.new_conv_history(1, cin));
        chunked(
            ctx,
            &format!("block {} Snake + transposed conv [{} {cin}→{} s{stride}]", i + 1, d.name, cin / 2),
            &x,
            &[3, 9],
            |x, _, h| cpu.codec_decoder_upsample(&cw, x, h),
            |x, _, h| cuda.codec_decoder_upsample(&gw, x, h),
            states,
        );
        let c = cin / 2;
        // At the real dims the CPU oracle of the widest blocks is slow: blocks 1 and 4 only.
        if d.name == "real" && (i == 1 || i == 2) {
            continue;
        }
        for dilation in RESIDUAL_DILATIONS {
            let (cw, gw) =
                both(ctx, |m| super::residual_unit(m, c, dilation), |m| super::residual_unit(m, c, dilation));
            let (x, _) = input(ctx, 75, c, 1.0);
            let h = 6 * dilation;
            let states = (cpu.new_conv_history(h, c), cuda.new_conv_history(h, c), cuda.new_conv_history(h, c));
            let (ch, gh) = chunked(
                ctx,
                &format!("block {} residual unit [{} {c} ch d{dilation}]", i + 1, d.name),
                &x,
                &[5, 70],
                |x, _, h| cpu.codec_residual_unit(&cw, x, h),
                |x, _, h| cuda.codec_residual_unit(&gw, x, h),
                states,
            );
            let got = cuda.to_host(&gh.rows);
            let stage = format!("codec block {} residual unit history [{} {c} ch d{dilation}]", i + 1, d.name);
            ctx.rel_l2(stage, &got.data, &ch.rows.data, BOUND);
        }
    }
}

fn tanh(ctx: &mut Ctx) {
    let (x, gx) = input(ctx, 5000, 1, 3.0);
    let want = ctx.cpu.codec_tanh_pcm(&x);
    let got = ctx.cuda.codec_tanh_pcm(&gx);
    ctx.rel_l2("codec tanh → PCM [5000 samples]", &got, &want, BOUND);
}
