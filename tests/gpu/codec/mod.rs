//! The codec decode path (`kernels/codec.cu`, `CodecOps for Cuda`) against the CPU backend.
//! - `ops`: every operation on fresh random f16-rounded inputs and weights, at the tiny
//!   checkpoint's codec dims and the real ones, in two calls that carry the op's state
//!   (histories, attention window), against the CPU op; and the GPU's two calls against one GPU
//!   call over the same rows, bit for bit.
//! - `decode`: the whole decode of a random tiny codec (written by the checkpoint synth) against
//!   the CPU, stage by stage; streamed == whole bit for bit over 160 frames (the attention window
//!   wraps); no driver allocation after warm-up; and a random codec at the real dims: streaming
//!   exactness and frames per second against real time.
//! - `thread`: the codec on its own thread and stream (as `serve` runs it) against the whole
//!   decode on the main stream, bit for bit, with no allocation after its warm-up.
//!
//! The oracle is the CPU backend with the same f16-rounded weights ([`F16Cpu`]); the GPU adds
//! f16 activations between operations. Bounds are stated where they are used.

mod decode;
mod ops;
mod thread;

use limelight::backend::BackendTypes;
use limelight::backend::codec::{
    CausalConv, CausalConvTranspose, CodecLayerOps, CodecOps, ConvNext, DecoderUpsample, ResidualUnitParams,
    RvqCodebook, UpsampleStage,
};
use limelight::backend::cpu::codec::{ConvHistory, KvWindow};
use limelight::backend::cpu::{Cpu, CpuWeight, Matrix};
use limelight::backend::cuda::tensor::{GpuMatrix, GpuWeight, round_to_f16, round_to_f16_vec};
use limelight::checkpoint::TensorView;
use limelight::model::weights::{TensorSpec, TransformerLayer};
use limelight::synth::rng::Rng;

use crate::harness::Ctx;

pub fn run(ctx: &mut Ctx) {
    ops::run(ctx);
    decode::run(ctx);
}

/// Codec widths of one check case.
pub struct Dims {
    pub name: &'static str,
    pub latent: usize,
    pub intermediate: usize,
    pub semantic_size: usize,
    pub residual_size: usize,
    /// Channels after `decoder.model.0`; each block halves them.
    pub decoder: usize,
}

/// The tiny preset's codec (`synth::presets`) and the published one (`codec.md` §1).
pub const TINY: Dims =
    Dims { name: "tiny", latent: 128, intermediate: 384, semantic_size: 256, residual_size: 64, decoder: 96 };
pub const REAL: Dims =
    Dims { name: "real", latent: 1024, intermediate: 3072, semantic_size: 4096, residual_size: 1024, decoder: 1536 };

/// Draws random weights, rounds them to f16 and places them with `place`: run once for the CPU
/// and once for the GPU from the same seed, the two get the same values.
pub struct Maker<'a, W> {
    rng: Rng,
    place: &'a dyn Fn(&[usize], Vec<f32>) -> W,
}

impl<W> Maker<'_, W> {
    /// Uniform in `[center − spread, center + spread]`, rounded to f16.
    pub fn w(&mut self, shape: &[usize], center: f32, spread: f32) -> W {
        let n = shape.iter().product();
        let data: Vec<f32> = (0..n).map(|_| center + self.rng.uniform(-spread, spread)).collect();
        (self.place)(shape, round_to_f16_vec(&data))
    }

    /// A matrix `[out, fan_in]`-like weight whose products keep unit variance.
    pub fn fan_in(&mut self, shape: &[usize], fan_in: usize) -> W {
        self.w(shape, 0.0, (3.0 / fan_in as f32).sqrt())
    }
}

/// The same random structure on both backends: `build` runs once per backend from one seed.
pub fn both<C, G>(
    ctx: &mut Ctx,
    cpu: impl FnOnce(&mut Maker<'_, CpuWeight>) -> C,
    gpu: impl FnOnce(&mut Maker<'_, GpuWeight>) -> G,
) -> (C, G) {
    let cuda = ctx.cuda;
    both_placed(ctx, &|shape: &[usize], data: Vec<f32>| cuda.codec_weight(shape, data), cpu, gpu)
}

/// [`both`] with the GPU's weights kept in f32, as the codec encoder (`CudaF32`) holds them.
pub fn both_f32<C, G>(
    ctx: &mut Ctx,
    cpu: impl FnOnce(&mut Maker<'_, CpuWeight>) -> C,
    gpu: impl FnOnce(&mut Maker<'_, GpuWeight>) -> G,
) -> (C, G) {
    let cuda = ctx.cuda;
    both_placed(ctx, &|shape: &[usize], data: Vec<f32>| cuda.upload_f32(shape, data), cpu, gpu)
}

fn both_placed<C, G>(
    ctx: &mut Ctx,
    place_gpu: &dyn Fn(&[usize], Vec<f32>) -> GpuWeight,
    cpu: impl FnOnce(&mut Maker<'_, CpuWeight>) -> C,
    gpu: impl FnOnce(&mut Maker<'_, GpuWeight>) -> G,
) -> (C, G) {
    let seed = ctx.rng.next_u64();
    let place_cpu = |shape: &[usize], data: Vec<f32>| CpuWeight { shape: shape.to_vec(), data };
    let c = cpu(&mut Maker { rng: Rng::new(seed), place: &place_cpu });
    let g = gpu(&mut Maker { rng: Rng::new(seed), place: place_gpu });
    (c, g)
}

/// A random input, f16-rounded on the host and uploaded as an f16 activation.
pub fn input(ctx: &mut Ctx, rows: usize, cols: usize, scale: f32) -> (Matrix, GpuMatrix) {
    let m = round_to_f16(&ctx.random(rows, cols, scale));
    let g = ctx.cuda.upload_matrix_f16(&m);
    (m, g)
}

// Random weight structures, generic over the backend's weight type.

pub fn books<W>(m: &mut Maker<'_, W>, d: &Dims) -> Vec<RvqCodebook<W>> {
    (0..10)
        .map(|i| RvqCodebook {
            codebook: m.w(&[if i == 0 { d.semantic_size } else { d.residual_size }, 8], 0.0, 1.0),
            proj: m.fan_in(&[d.latent, 8], 8),
            bias: m.w(&[d.latent], 0.0, 0.1),
        })
        .collect()
}

pub fn layer<W>(m: &mut Maker<'_, W>, d: &Dims) -> TransformerLayer<W> {
    let (l, i) = (d.latent, d.intermediate);
    TransformerLayer {
        attention_norm: m.w(&[l], 1.0, 0.5),
        wqkv: m.fan_in(&[3 * l, l], l),
        wo: m.fan_in(&[l, l], l),
        attention_layer_scale: m.w(&[l], 0.0, 0.5),
        ffn_norm: m.w(&[l], 1.0, 0.5),
        w1: m.fan_in(&[i, l], l),
        w3: m.fan_in(&[i, l], l),
        w2: m.fan_in(&[l, i], i),
        ffn_layer_scale: m.w(&[l], 0.0, 0.5),
    }
}

pub fn upsample_stage<W>(m: &mut Maker<'_, W>, c: usize) -> UpsampleStage<W> {
    UpsampleStage { conv_weight: m.fan_in(&[2, c, c], c), conv_bias: m.w(&[c], 0.0, 0.1), convnext: convnext(m, c) }
}

pub fn convnext<W>(m: &mut Maker<'_, W>, c: usize) -> ConvNext<W> {
    ConvNext {
        dw_weight: m.fan_in(&[7, c], 7),
        dw_bias: m.w(&[c], 0.0, 0.1),
        norm_weight: m.w(&[c], 1.0, 0.5),
        norm_bias: m.w(&[c], 0.0, 0.1),
        pw1_weight: m.fan_in(&[4 * c, c], c),
        pw1_bias: m.w(&[4 * c], 0.0, 0.1),
        pw2_weight: m.fan_in(&[c, 4 * c], 4 * c),
        pw2_bias: m.w(&[c], 0.0, 0.1),
        gamma: m.w(&[c], 0.0, 0.5),
    }
}

pub fn conv<W>(m: &mut Maker<'_, W>, out: usize, kernel: usize, inp: usize, dilation: usize) -> CausalConv<W> {
    CausalConv { weight: m.fan_in(&[out, kernel, inp], kernel * inp), bias: m.w(&[out], 0.0, 0.1), kernel, dilation }
}

/// Snake α around 1, as the published codec's are.
pub fn snake<W>(m: &mut Maker<'_, W>, c: usize) -> W {
    m.w(&[c], 1.0, 0.5)
}

pub fn decoder_upsample<W>(m: &mut Maker<'_, W>, cin: usize, stride: usize) -> DecoderUpsample<W> {
    DecoderUpsample {
        snake: snake(m, cin),
        conv: CausalConvTranspose {
            weight: m.fan_in(&[2 * stride, cin / 2, cin], 2 * cin),
            bias: m.w(&[cin / 2], 0.0, 0.1),
            stride,
        },
    }
}

pub fn residual_unit<W>(m: &mut Maker<'_, W>, c: usize, dilation: usize) -> ResidualUnitParams<W> {
    ResidualUnitParams {
        snake1: snake(m, c),
        conv1: conv(m, c, 7, c, dilation),
        snake2: snake(m, c),
        conv2: conv(m, c, 1, c, 1),
    }
}

/// The CPU backend with the codec's weights rounded to f16 as the GPU holds them: the oracle.
/// With `activations`, every operation's output is also rounded to f16 — what any FP16 decoder
/// does between operations — the yardstick of how much that rounding alone moves a decode.
pub struct F16Cpu {
    pub activations: bool,
}

impl F16Cpu {
    fn out(&self, m: Matrix) -> Matrix {
        if self.activations { round_to_f16(&m) } else { m }
    }
}

impl BackendTypes for F16Cpu {
    type Act = Matrix;
    type Weight = CpuWeight;

    fn upload(&self, spec: &TensorSpec, view: TensorView<'_>) -> CpuWeight {
        Cpu.upload(spec, view)
    }

    fn upload_f32(&self, shape: &[usize], data: Vec<f32>) -> CpuWeight {
        Cpu.upload_f32(shape, data)
    }

    fn to_host(&self, a: &Matrix) -> Matrix {
        a.clone()
    }

    fn act_rows(&self, a: &Matrix, start: usize, count: usize) -> Matrix {
        Cpu.act_rows(a, start, count)
    }

    fn stack_rows(&self, parts: &[Matrix]) -> Matrix {
        Cpu.stack_rows(parts)
    }
}

impl CodecLayerOps for F16Cpu {
    type ConvHistory = ConvHistory;
    type KvWindow = KvWindow;

    fn codec_weight(&self, shape: &[usize], data: Vec<f32>) -> CpuWeight {
        Cpu.upload_f32(shape, round_to_f16_vec(&data))
    }

    fn new_conv_history(&self, rows: usize, channels: usize) -> ConvHistory {
        Cpu.new_conv_history(rows, channels)
    }

    fn new_kv_window(&self, shape: &limelight::backend::codec::CodecAttentionShape) -> KvWindow {
        Cpu.new_kv_window(shape)
    }

    fn codec_transformer_layer(
        &self,
        shape: &limelight::backend::codec::CodecAttentionShape,
        w: &TransformerLayer<CpuWeight>,
        rope: &[f32],
        x: &Matrix,
        kv: &mut KvWindow,
    ) -> Matrix {
        self.out(Cpu.codec_transformer_layer(shape, w, rope, x, kv))
    }

    fn codec_rms_norm(&self, weight: &CpuWeight, eps: f32, x: &Matrix) -> Matrix {
        self.out(Cpu.codec_rms_norm(weight, eps, x))
    }

    fn codec_causal_conv(
        &self,
        conv: &CausalConv<CpuWeight>,
        snake: Option<&CpuWeight>,
        x: &Matrix,
        h: &mut ConvHistory,
    ) -> Matrix {
        self.out(Cpu.codec_causal_conv(conv, snake, x, h))
    }

    fn codec_residual_unit(&self, w: &ResidualUnitParams<CpuWeight>, x: &Matrix, h: &mut ConvHistory) -> Matrix {
        self.out(Cpu.codec_residual_unit(w, x, h))
    }
}

impl CodecOps for F16Cpu {
    fn codec_rvq(&self, books: &[RvqCodebook<CpuWeight>], codes: &[u32]) -> Matrix {
        self.out(Cpu.codec_rvq(books, codes))
    }

    fn codec_upsample_stage(&self, w: &UpsampleStage<CpuWeight>, x: &Matrix, h: &mut ConvHistory) -> Matrix {
        self.out(Cpu.codec_upsample_stage(w, x, h))
    }

    fn codec_decoder_upsample(&self, w: &DecoderUpsample<CpuWeight>, x: &Matrix, h: &mut ConvHistory) -> Matrix {
        self.out(Cpu.codec_decoder_upsample(w, x, h))
    }

    fn codec_tanh_pcm(&self, x: &Matrix) -> Vec<f32> {
        let pcm = Cpu.codec_tanh_pcm(x);
        if self.activations { round_to_f16_vec(&pcm) } else { pcm }
    }
}

/// Number of positions where two runs differ in their bit patterns (a length mismatch counts
/// every position of the longer).
pub fn differing(a: &[f32], b: &[f32]) -> usize {
    if a.len() != b.len() {
        return a.len().max(b.len());
    }
    a.iter().zip(b).filter(|(x, y)| x.to_bits() != y.to_bits()).count()
}

/// Group sizes covering `total`, cycling through `pattern` (the last group may be cut short).
pub fn groups(total: usize, pattern: &[usize]) -> Vec<usize> {
    let (mut out, mut left) = (Vec::new(), total);
    for &g in pattern.iter().cycle() {
        if left == 0 {
            break;
        }
        out.push(g.min(left));
        left -= g.min(left);
    }
    out
}
