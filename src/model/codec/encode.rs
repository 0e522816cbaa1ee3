//! The Fish modded-DAC encode path (`codec.md` §5.3), for voice cloning: a reference clip, mono at
//! 44.1 kHz, → codes `[frames, 10]`, one frame per 2048 samples (the clip right-padded with
//! zeros to whole frames).
//!
//! Encoder: causal conv k7 (1 → 64) → 4 blocks, each 3 residual units (d = 1, 3, 9), Snake and a
//! strided causal conv (k = 2s; strides 2, 4, 8, 8) doubling the channels, the last followed by
//! a 4-layer windowed transformer (window 512) → Snake + causal conv k3: one row per 512 samples.
//! Quantizer: 2 downsample stages (conv k = s = 2, ConvNeXt) → `pre_module` (8 layers, window
//! 128) → the semantic quantizer, then the 9 residual ones on what it leaves.
//!
//! A clip is encoded whole (nothing streams): every causal conv and attention window starts from
//! the reference's zeros, and RoPE positions count from the clip's first row.

use super::params::{HostTensor, Reader, permute3};
use super::rope::{inverse_frequencies, rope_rows};
use super::{CodecError, NORM_EPS};
use crate::backend::codec::{CausalConv, CodecAttentionShape, ConvNext, ResidualUnitParams};
use crate::backend::codec_encode::{CodecEncodeOps, DownsampleStage, StridedConv, VqEncoder};
use crate::model::load::{Checkpoint, CodecTensor};
use crate::model::weights::codec::{
    CONV_KERNEL, ENCODER_RATES, QUANTIZER_RESAMPLE, RESIDUAL_DILATIONS, TRANSFORMER_HEAD_DIM, TRANSFORMER_WINDOW,
};
use crate::model::weights::{CodecDims, ResampleStage, Transformer, TransformerLayer, Vq, WnConv};

/// The longest reference clip, in seconds (sglang-omni's reference hook takes at most 60 s).
pub const MAX_REFERENCE_SECONDS: f64 = 60.0;

/// The attention window of the encoder's own transformer (`EncoderBlock`'s default: the
/// config partial has no `window_size`, so `getattr(…, 512)` applies).
pub const ENCODER_WINDOW: usize = 512;

/// Input samples per encoder output row (`hop_length`, the product of the encoder's strides).
pub fn encoder_hop() -> usize {
    ENCODER_RATES.iter().product()
}

/// Input samples per code frame (`frame_length`): the encoder's hop times the quantizer's
/// downsampling.
pub fn samples_per_code_frame() -> usize {
    encoder_hop() * QUANTIZER_RESAMPLE.iter().product::<usize>()
}

/// A windowed transformer: its layers and final RMSNorm.
pub struct TransformerParams<W> {
    pub layers: Vec<TransformerLayer<W>>,
    pub norm: W,
}

/// An encoder block: residual units (d = 1, 3, 9), Snake, the strided conv, maybe a transformer.
pub struct EncoderBlockParams<W> {
    pub units: Vec<ResidualUnitParams<W>>,
    pub snake: W,
    pub down: StridedConv<W>,
    pub transformer: Option<TransformerParams<W>>,
}

/// Every weight on the encode path, resident on the backend.
pub struct EncoderParams<W> {
    pub conv_in: CausalConv<W>,
    pub blocks: Vec<EncoderBlockParams<W>>,
    pub out_snake: W,
    pub conv_out: CausalConv<W>,
    pub downsample: Vec<DownsampleStage<W>>,
    pub pre_module: TransformerParams<W>,
    /// The semantic quantizer, then the residual ones in order.
    pub quantizers: Vec<VqEncoder<W>>,
}

/// Each stage's output of one encode (for checks against references), rows in time.
pub struct EncodeTrace<A> {
    /// The encoder's output: one row per 512 samples, `latent` wide.
    pub encoder: A,
    /// After the quantizer's downsample stages: one row per code frame.
    pub downsample: A,
    /// After `pre_module` (its final norm included): what the quantizers read.
    pub pre_module: A,
}

/// A codec encoder ready on backend `B`.
pub struct CodecEncoder<B: CodecEncodeOps> {
    pub dims: CodecDims,
    pub params: EncoderParams<B::Weight>,
}

impl<B: CodecEncodeOps> CodecEncoder<B> {
    /// Reads, folds and uploads the encode-path weights of `ckpt`'s codec.
    pub fn load(ckpt: &Checkpoint, backend: &B) -> Result<CodecEncoder<B>, CodecError> {
        let place = |shape: &[usize], data: Vec<f32>| backend.codec_weight(shape, data);
        Ok(CodecEncoder { dims: ckpt.codec_dims.clone(), params: read_params(ckpt, &place)? })
    }

    /// Makes a host image ([`host_params`]) resident: the same weights [`CodecEncoder::load`]
    /// gives.
    pub fn from_host(ckpt: &Checkpoint, backend: &B, host: EncoderParams<HostTensor>) -> CodecEncoder<B> {
        let params = host.map(&mut |t| backend.codec_weight(&t.shape, t.data));
        CodecEncoder { dims: ckpt.codec_dims.clone(), params }
    }

    /// Codes per frame: the semantic code, then the residual codes.
    pub fn codes_per_frame(&self) -> usize {
        self.params.quantizers.len()
    }

    /// Code frames of a clip of `samples` samples.
    pub fn frames_for(samples: usize) -> usize {
        samples.div_ceil(samples_per_code_frame())
    }

    /// Encodes a clip (mono, 44.1 kHz, any length ≥ 1 sample): codes row-major
    /// `[frames, codes_per_frame]`.
    pub fn encode(&self, backend: &B, samples: &[f32]) -> Result<Vec<u32>, CodecError> {
        Ok(self.encode_traced(backend, samples)?.0)
    }

    /// [`Self::encode`], also returning each stage's output.
    pub fn encode_traced(&self, backend: &B, samples: &[f32]) -> Result<(Vec<u32>, EncodeTrace<B::Act>), CodecError> {
        if samples.is_empty() {
            return Err(CodecError::EmptyAudio);
        }
        if let Some(at) = samples.iter().position(|v| !v.is_finite()) {
            return Err(CodecError::NonFiniteSample { at });
        }
        let p = &self.params;
        let mut padded = samples.to_vec();
        let frames = Self::frames_for(samples.len());
        padded.resize(frames * samples_per_code_frame(), 0.0);
        let x = backend.codec_samples(&padded);
        let mut h = backend.codec_causal_conv(&p.conv_in, None, &x, &mut fresh(backend, &p.conv_in, 1));
        let (mut rows, mut channels) = (padded.len(), self.dims.encoder_dim);
        for (block, stride) in p.blocks.iter().zip(ENCODER_RATES) {
            for unit in &block.units {
                h = backend.codec_residual_unit(unit, &h, &mut fresh(backend, &unit.conv1, channels));
            }
            h = backend.codec_strided_conv(&block.down, Some(&block.snake), &h);
            (rows, channels) = (rows / stride, 2 * channels);
            if let Some(t) = &block.transformer {
                h = transformer(backend, t, ENCODER_WINDOW, &h, rows, channels);
            }
        }
        let latent = self.dims.latent;
        assert_eq!(channels, latent, "the encoder's last block is latent wide");
        let encoder =
            backend.codec_causal_conv(&p.conv_out, Some(&p.out_snake), &h, &mut fresh(backend, &p.conv_out, latent));
        let mut z = encoder.clone();
        for stage in &p.downsample {
            z = backend.codec_downsample_stage(stage, &z);
        }
        let downsample = z.clone();
        let pre_module = transformer(backend, &p.pre_module, TRANSFORMER_WINDOW, &z, frames, latent);
        let quantizers: Vec<&VqEncoder<B::Weight>> = p.quantizers.iter().collect();
        let codes = backend.codec_quantize(&quantizers, &pre_module);
        Ok((codes, EncodeTrace { encoder, downsample, pre_module }))
    }
}

/// A windowed causal transformer over all `rows` of `x` (`width` wide, positions from 0), then its
/// norm.
fn transformer<B: CodecEncodeOps>(
    backend: &B,
    t: &TransformerParams<B::Weight>,
    window: usize,
    x: &B::Act,
    rows: usize,
    width: usize,
) -> B::Act {
    let shape = CodecAttentionShape {
        heads: width / TRANSFORMER_HEAD_DIM,
        head_dim: TRANSFORMER_HEAD_DIM,
        window,
        norm_eps: NORM_EPS,
    };
    let rope = rope_rows(&inverse_frequencies(TRANSFORMER_HEAD_DIM), 0, rows);
    let mut h = x.clone();
    for layer in &t.layers {
        let mut kv = backend.new_kv_window(&shape);
        h = backend.codec_transformer_layer(&shape, layer, &rope, &h, &mut kv);
    }
    backend.codec_rms_norm(&t.norm, NORM_EPS, &h)
}

/// The zero history of a causal conv reading `channels`-wide rows: the reference's padding.
fn fresh<B: CodecEncodeOps>(backend: &B, conv: &CausalConv<B::Weight>, channels: usize) -> B::ConvHistory {
    backend.new_conv_history(conv.history(), channels)
}

fn read_params<W>(ckpt: &Checkpoint, place: &dyn Fn(&[usize], Vec<f32>) -> W) -> Result<EncoderParams<W>, CodecError> {
    let w = ckpt.codec_weights()?;
    let r = Reader { archive: &ckpt.codec, place };
    let mut blocks = Vec::new();
    for (b, &stride) in w.encoder_blocks.iter().zip(&ENCODER_RATES) {
        let units = (b.residual_units.iter().zip(RESIDUAL_DILATIONS))
            .map(|(u, d)| r.residual_unit(u, d))
            .collect::<Result<_, _>>()?;
        let transformer = b.transformer.as_ref().map(|t| transformer_params(&r, t)).transpose()?;
        blocks.push(EncoderBlockParams {
            units,
            snake: r.vector(&b.snake_alpha)?,
            down: strided_wn(&r, &b.downsample, stride)?,
            transformer,
        });
    }
    let conv_in = r.conv(&w.encoder_conv_in, 1)?;
    debug_assert_eq!(conv_in.kernel, CONV_KERNEL);
    let quantizers = std::iter::once(&w.semantic_vq).chain(&w.residual_vqs).map(|vq| vq_encoder(&r, vq));
    Ok(EncoderParams {
        conv_in,
        blocks,
        out_snake: r.vector(&w.encoder_snake_alpha)?,
        conv_out: r.conv(&w.encoder_conv_out, 1)?,
        downsample: w.downsample.iter().map(|s| downsample_stage(&r, s)).collect::<Result<_, _>>()?,
        pre_module: transformer_params(&r, &w.pre_module)?,
        quantizers: quantizers.collect::<Result<_, _>>()?,
    })
}

/// Every encode-path weight prepared on the host (reading `codec.pth`, folding weight norm): the
/// part of loading the encoder that needs no backend, so a loader runs it on another thread while
/// the backbone's weights stream (`ResidentModel::load_in_file_order`).
pub fn host_params(ckpt: &Checkpoint) -> Result<EncoderParams<HostTensor>, CodecError> {
    read_params(ckpt, &|shape: &[usize], data| HostTensor { shape: shape.to_vec(), data })
}

impl<W> EncoderParams<W> {
    /// The same parameters with every weight passed through `f`.
    pub fn map<V>(self, f: &mut impl FnMut(W) -> V) -> EncoderParams<V> {
        fn conv<W, V>(c: CausalConv<W>, f: &mut impl FnMut(W) -> V) -> CausalConv<V> {
            CausalConv { weight: f(c.weight), bias: f(c.bias), kernel: c.kernel, dilation: c.dilation }
        }
        fn strided<W, V>(c: StridedConv<W>, f: &mut impl FnMut(W) -> V) -> StridedConv<V> {
            StridedConv { weight: f(c.weight), bias: f(c.bias), kernel: c.kernel, stride: c.stride }
        }
        fn transformer<W, V>(t: TransformerParams<W>, f: &mut impl FnMut(W) -> V) -> TransformerParams<V> {
            let layers = t.layers.into_iter().map(|l| TransformerLayer {
                attention_norm: f(l.attention_norm),
                wqkv: f(l.wqkv),
                wo: f(l.wo),
                attention_layer_scale: f(l.attention_layer_scale),
                ffn_norm: f(l.ffn_norm),
                w1: f(l.w1),
                w3: f(l.w3),
                w2: f(l.w2),
                ffn_layer_scale: f(l.ffn_layer_scale),
            });
            TransformerParams { layers: layers.collect(), norm: f(t.norm) }
        }
        let conv_in = conv(self.conv_in, f);
        let mut blocks = Vec::with_capacity(self.blocks.len());
        for b in self.blocks {
            let units = b
                .units
                .into_iter()
                .map(|u| ResidualUnitParams {
                    snake1: f(u.snake1),
                    conv1: conv(u.conv1, f),
                    snake2: f(u.snake2),
                    conv2: conv(u.conv2, f),
                })
                .collect();
            let snake = f(b.snake);
            let down = strided(b.down, f);
            blocks.push(EncoderBlockParams {
                units,
                snake,
                down,
                transformer: b.transformer.map(|t| transformer(t, f)),
            });
        }
        let out_snake = f(self.out_snake);
        let conv_out = conv(self.conv_out, f);
        let downsample = (self.downsample.into_iter())
            .map(|s| DownsampleStage {
                conv: strided(s.conv, f),
                convnext: ConvNext {
                    dw_weight: f(s.convnext.dw_weight),
                    dw_bias: f(s.convnext.dw_bias),
                    norm_weight: f(s.convnext.norm_weight),
                    norm_bias: f(s.convnext.norm_bias),
                    pw1_weight: f(s.convnext.pw1_weight),
                    pw1_bias: f(s.convnext.pw1_bias),
                    pw2_weight: f(s.convnext.pw2_weight),
                    pw2_bias: f(s.convnext.pw2_bias),
                    gamma: f(s.convnext.gamma),
                },
            })
            .collect();
        let pre_module = transformer(self.pre_module, f);
        let quantizers = (self.quantizers.into_iter())
            .map(|q| VqEncoder {
                in_proj: f(q.in_proj),
                in_bias: f(q.in_bias),
                codebook: f(q.codebook),
                out_proj: f(q.out_proj),
                out_bias: f(q.out_bias),
            })
            .collect();
        EncoderParams { conv_in, blocks, out_snake, conv_out, downsample, pre_module, quantizers }
    }
}

fn transformer_params<W>(
    r: &Reader<'_, W>,
    t: &Transformer<CodecTensor<'_>>,
) -> Result<TransformerParams<W>, CodecError> {
    Ok(TransformerParams {
        layers: t.layers.iter().map(|l| r.layer(l)).collect::<Result<_, _>>()?,
        norm: r.plain(&t.norm)?,
    })
}

/// A weight-normed strided `Conv1d` `[out, in, 2s]` as `[out, 2s, in]`.
fn strided_wn<W>(r: &Reader<'_, W>, wn: &WnConv<CodecTensor<'_>>, stride: usize) -> Result<StridedConv<W>, CodecError> {
    let (w, shape) = r.folded(wn)?;
    let (w, tap_major) = permute3(&w, shape, [0, 2, 1]);
    Ok(StridedConv { weight: (r.place)(&tap_major, w), bias: r.plain(&wn.bias)?, kernel: shape[2], stride })
}

/// A downsample stage: its plain `Conv1d` `[out, in, 2]` (stride 2) as `[out, 2, in]`, then ConvNeXt.
fn downsample_stage<W>(
    r: &Reader<'_, W>,
    s: &ResampleStage<CodecTensor<'_>>,
) -> Result<DownsampleStage<W>, CodecError> {
    let (w, shape) = r.values(&s.conv_weight)?;
    let (w, tap_major) = permute3(&w, [shape[0], shape[1], shape[2]], [0, 2, 1]);
    let conv = StridedConv {
        weight: (r.place)(&tap_major, w),
        bias: r.plain(&s.conv_bias)?,
        kernel: shape[2],
        stride: shape[2],
    };
    Ok(DownsampleStage { conv, convnext: r.convnext(&s.convnext)? })
}

/// A quantizer's projections (weight norm folded; `[out, in, 1]` as `[out, in]`) and codebook.
fn vq_encoder<W>(r: &Reader<'_, W>, vq: &Vq<CodecTensor<'_>>) -> Result<VqEncoder<W>, CodecError> {
    let (in_proj, in_shape) = r.folded(&vq.in_proj)?;
    let (out_proj, out_shape) = r.folded(&vq.out_proj)?;
    Ok(VqEncoder {
        in_proj: (r.place)(&in_shape[..2], in_proj),
        in_bias: r.plain(&vq.in_proj.bias)?,
        codebook: r.plain(&vq.codebook)?,
        out_proj: (r.place)(&out_shape[..2], out_proj),
        out_bias: r.plain(&vq.out_proj.bias)?,
    })
}
