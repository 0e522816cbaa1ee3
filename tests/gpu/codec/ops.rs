//! Each codec operation on random f16-rounded inputs and weights, GPU against the CPU op (the
//! same f16 values on both sides), at the tiny and the real codec dims. Stateful operations run
//! as two or three calls carrying their state, then their final state is compared; the GPU's
//! chunked calls must also equal one GPU call over all rows, bit for bit.
//!
//! Bound: rel L2 ≤ 1e-2 for every operation. The CPU computes in f32 with f64 sums; the GPU
//! rounds to f16 between the kernels inside an op (a transformer layer rounds about eight
//! times, each ≈ 3e-4 RMS relative), so ~1e-3 is expected; 1e-2 leaves room without hiding a
//! wrong index, which moves a result by O(1).
//!
//! The GEMM alone (`codec::gemm`), at every layer shape of the real and the tiny codec and with
//! each tile: against the exact sum (f64 on the host) with the bound 2 × the f16 yardstick (the
//! exact result rounded to f16: the GPU rounds its f32 sum once, so it sits at the yardstick
//! and a wrong index or tap is O(1) away); and row invariance: every row of calls of 1 to 200
//! rows, with either tile, bit-identical to the row computed alone.

use limelight::backend::BackendTypes;
use limelight::backend::codec::{CausalConv, CodecAttentionShape, CodecLayerOps, CodecOps};
use limelight::backend::cpu::Matrix;
use limelight::backend::cuda::codec::gemm::{Epilogue, Gemm, Taps, Tile, gemm, gemm_tiled, uses_tensor_cores};
use limelight::backend::cuda::tensor::{GpuMatrix, GpuWeight, round_to_f16_vec};
use limelight::model::codec::rope::{inverse_frequencies, rope_rows};
use limelight::model::weights::codec::{DECODER_RATES, RESIDUAL_DILATIONS};

use super::{Dims, Maker, REAL, TINY, both, differing, input};
use crate::harness::{Ctx, rel_l2};

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
    gemm_shapes(ctx);
    gemm_rows(ctx);
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

/// One layer's GEMM: `cin` input channels, its taps, `n` outputs per row.
struct GemmShape {
    name: &'static str,
    cin: usize,
    taps: Taps,
    n: usize,
}

const fn shape(name: &'static str, cin: usize, taps: Taps, n: usize) -> GemmShape {
    GemmShape { name, cin, taps, n }
}

const fn conv(kernel: usize, dilation: usize) -> Taps {
    Taps::Conv { kernel, dilation }
}

/// Every GEMM shape of the published codec (`codec.md` §1.3–1.5), and the tiny codec's widths
/// that are not multiples of 32 (24: k32 steps that straddle taps) or of 8 (6, 12: CUDA cores).
const GEMM_SHAPES: &[GemmShape] = &[
    shape("post_module wqkv", 1024, Taps::Linear, 3072),
    shape("post_module wo", 1024, Taps::Linear, 1024),
    shape("post_module w2", 3072, Taps::Linear, 1024),
    shape("upsample transposed conv", 1024, Taps::Linear, 2048),
    shape("upsample pw1", 1024, Taps::Linear, 4096),
    shape("upsample pw2", 4096, Taps::Linear, 1024),
    shape("decoder conv in", 1024, conv(7, 1), 1536),
    shape("block 1 transposed conv", 1536, Taps::Transposed { stride: 8, out: 768 }, 6144),
    shape("block 1 unit conv d9", 768, conv(7, 9), 768),
    shape("block 1 unit conv k1", 768, conv(1, 1), 768),
    shape("block 2 transposed conv", 768, Taps::Transposed { stride: 8, out: 384 }, 3072),
    shape("block 2 unit conv d3", 384, conv(7, 3), 384),
    shape("block 3 transposed conv", 384, Taps::Transposed { stride: 4, out: 192 }, 768),
    shape("block 3 unit conv d1", 192, conv(7, 1), 192),
    shape("block 4 transposed conv", 192, Taps::Transposed { stride: 2, out: 96 }, 192),
    shape("block 4 unit conv d9", 96, conv(7, 9), 96),
    shape("conv out", 96, conv(7, 1), 1),
    shape("tiny block 2 unit conv d9", 24, conv(7, 9), 24),
    shape("tiny block 3 transposed conv", 24, Taps::Transposed { stride: 4, out: 12 }, 48),
    shape("tiny block 4 transposed conv", 12, Taps::Transposed { stride: 2, out: 6 }, 12),
    shape("tiny block 4 unit conv d3", 6, conv(7, 3), 6),
];

/// A GEMM's operands: f16-rounded on the host, the same values on the GPU.
struct GemmCase {
    x: Matrix,
    gx: GpuMatrix,
    w: Vec<f32>,
    gw: GpuWeight,
    bias: Vec<f32>,
    gbias: GpuWeight,
}

fn gemm_case(ctx: &mut Ctx, s: &GemmShape, rows: usize) -> GemmCase {
    let (x, gx) = input(ctx, s.taps.input_rows(rows), s.cin, 1.0);
    let a = s.taps.args(s.cin);
    let spread = (3.0 / (a.taps * s.cin) as f32).sqrt();
    let mut draw =
        |n: usize, spread: f32| round_to_f16_vec(&(0..n).map(|_| ctx.rng.uniform(-spread, spread)).collect::<Vec<_>>());
    let w = draw(s.taps.weight_len(s.n, s.cin), spread);
    let bias = draw(if let Taps::Transposed { out, .. } = s.taps { out } else { s.n }, 0.1);
    let (gw, gbias) =
        (ctx.cuda.codec_weight(&[w.len()], w.clone()), ctx.cuda.codec_weight(&[bias.len()], bias.clone()));
    GemmCase { x, gx, w, gw, bias, gbias }
}

impl GemmShape {
    /// The call of `rows` outputs over `input` (its first rows) with `c`'s weight and bias.
    fn call<'a>(&self, c: &'a GemmCase, input: &'a GpuMatrix, rows: usize, epilogue: Epilogue<'a>) -> Gemm<'a> {
        let (taps, n, bias) = (self.taps, self.n, Some(&c.gbias));
        Gemm { input, rows, taps, weight: &c.gw, n, bias, epilogue, residual: None }
    }

    /// Which kernel and tile run, for the checks' names.
    fn kernel(&self, tile: Tile) -> String {
        if uses_tensor_cores(self.cin) { format!("{tile:?} tile") } else { "CUDA cores".into() }
    }

    /// The tiles to run: both on tensor cores; the CUDA-core kernel has one.
    fn tiles(&self) -> &'static [Tile] {
        if uses_tensor_cores(self.cin) { &[Tile::M32, Tile::M128] } else { &[Tile::M32] }
    }
}

/// Runs `g` on `tile`, or on the one `gemm` picks; the output on the host.
fn run_gemm(ctx: &Ctx, g: &Gemm<'_>, tile: Option<Tile>) -> Vec<f32> {
    let y = match tile {
        Some(tile) => gemm_tiled(ctx.cuda, g, tile),
        None => gemm(ctx.cuda, g),
    };
    ctx.cuda.to_host(&y).data
}

/// `Σ_t Σ_c x[m + a_base + t·a_tap, c] · w[n·b_row + t·b_tap + c] + bias`, exactly (f64).
fn gemm_exact(s: &GemmShape, c: &GemmCase, rows: usize) -> Vec<f32> {
    let a = s.taps.args(s.cin);
    let mut y = Vec::with_capacity(rows * s.n);
    for m in 0..rows {
        for n in 0..s.n {
            let mut acc = f64::from(c.bias[n % c.bias.len()]);
            for t in 0..a.taps {
                let row = c.x.row((m as i64 + i64::from(a.a_base) + t as i64 * i64::from(a.a_tap)) as usize);
                let w = &c.w[n * a.b_row + t * a.b_tap..][..s.cin];
                acc += row.iter().zip(w).map(|(x, w)| f64::from(*x) * f64::from(*w)).sum::<f64>();
            }
            y.push(acc as f32);
        }
    }
    y
}

/// Each shape at 40 rows (one partial tile of either size), every tile, against the exact sum.
fn gemm_shapes(ctx: &mut Ctx) {
    const ROWS: usize = 40;
    for s in GEMM_SHAPES {
        let c = gemm_case(ctx, s, ROWS);
        let want = gemm_exact(s, &c, ROWS);
        let bound = 2.0 * rel_l2(&round_to_f16_vec(&want), &want);
        for &tile in s.tiles() {
            let got = run_gemm(ctx, &s.call(&c, &c.gx, ROWS, Epilogue::None), Some(tile));
            let value = rel_l2(&got, &want);
            let kernel = s.kernel(tile);
            ctx.check(
                format!("codec GEMM vs exact [{} {}→{}, {ROWS} rows, {kernel}]", s.name, s.cin, s.n),
                "rel L2",
                format!("{bound:.1e} (2 × f16 yardstick)"),
                format!("{value:.2e}"),
                value <= bound,
            );
        }
    }
}

/// Every row of calls of 1, 5, 16, 17, 64 and 200 rows, on each tile, against the same row
/// computed alone (a one-row call over its own input rows), bit for bit: the sum and the
/// epilogue depend on the row only, not on M or the row's place in a tile.
fn gemm_rows(ctx: &mut Ctx) {
    const CALLS: [usize; 6] = [1, 5, 16, 17, 64, 200];
    let most = CALLS[CALLS.len() - 1];
    let picked = ["upsample pw2", "block 1 transposed conv", "block 2 unit conv d3", "tiny block 4 unit conv d3"];
    for s in GEMM_SHAPES.iter().filter(|s| picked.contains(&s.name)) {
        let c = gemm_case(ctx, s, most);
        // Snake with α per output channel (a unit's first conv), so the epilogue's reads are
        // checked too.
        let alpha: Vec<f32> = (0..s.n).map(|_| ctx.rng.uniform(0.5, 1.5)).collect();
        let alpha = ctx.cuda.codec_weight(&[s.n], round_to_f16_vec(&alpha));
        let alone: Vec<Vec<f32>> = (0..most)
            .map(|r| {
                let own = cuda_rows(ctx, &c.x, r, r + s.taps.input_rows(1));
                run_gemm(ctx, &s.call(&c, &own, 1, Epilogue::Snake(&alpha)), None)
            })
            .collect();
        for &tile in s.tiles() {
            let (mut differ, mut total) = (0, 0);
            for rows in CALLS {
                let got = run_gemm(ctx, &s.call(&c, &c.gx, rows, Epilogue::Snake(&alpha)), Some(tile));
                for (r, row) in got.chunks_exact(s.n).enumerate() {
                    differ += differing(row, &alone[r]);
                    total += s.n;
                }
            }
            ctx.check(
                format!(
                    "codec GEMM rows in calls of {CALLS:?} == alone [{} {}→{}, {}]",
                    s.name,
                    s.cin,
                    s.n,
                    s.kernel(tile)
                ),
                "differing values",
                "0".into(),
                format!("{differ} of {total}"),
                differ == 0,
            );
        }
    }
}

/// Rows `a..b` of `m` on the GPU.
fn cuda_rows(ctx: &Ctx, m: &Matrix, a: usize, b: usize) -> GpuMatrix {
    ctx.cuda.upload_matrix_f16(&rows(m, a, b))
}
