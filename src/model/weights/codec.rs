//! `codec.pth` tensor names (`codec.md` §1–3, `codec-keys.tsv`): the Fish modded DAC with its
//! causal encoder, residual VQ, windowed transformers, resampling stages and decoder.
//!
//! The codec's hyper-parameters are not in `config.json`; its widths are inferred from tensor
//! shapes ([`CodecDims::infer`]) and the fixed architecture constants below come from the
//! reference's `modded_dac_vq.yaml`.

use super::{Accept, Init, TensorSource, TensorSpec, WeightError};
use crate::checkpoint::Dtype;

/// Decoder upsampling strides, in order (`codec.md` §1.5).
pub const DECODER_RATES: [usize; 4] = [8, 8, 4, 2];
/// Encoder downsampling strides, in order (`model.md` §2.4).
pub const ENCODER_RATES: [usize; 4] = [2, 4, 8, 8];
/// Quantizer down/upsampling factors (`codec.md` §1.4).
pub const QUANTIZER_RESAMPLE: [usize; 2] = [2, 2];
/// Dilations of the three residual units in every encoder and decoder block.
pub const RESIDUAL_DILATIONS: [usize; 3] = [1, 3, 9];
/// Head width of every codec transformer (`n_head = dim / 64`).
pub const TRANSFORMER_HEAD_DIM: usize = 64;
/// Causal attention window of the codec transformers, in frames.
pub const TRANSFORMER_WINDOW: usize = 128;
/// Kernel of the WN convolutions and depthwise ConvNeXt convolutions.
pub const CONV_KERNEL: usize = 7;
/// Index of the encoder block that carries a transformer (`encoder_transformer_layers [0,0,0,4]`).
pub const ENCODER_TRANSFORMER_BLOCK: usize = 4;

/// Buffers that older codec checkpoints saved as persistent; they are recomputed, never read
/// (`codec.md` §3.3).
pub const CODEC_IGNORED_BUFFERS: [&str; 6] = [
    "quantizer.pre_module.causal_mask",
    "quantizer.pre_module.freqs_cis",
    "quantizer.post_module.causal_mask",
    "quantizer.post_module.freqs_cis",
    "encoder.block.4.block.5.causal_mask",
    "encoder.block.4.block.5.freqs_cis",
];

/// Widths of a codec, inferred from its tensors.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CodecDims {
    /// Latent (quantizer) width: 1024 in the published codec.
    pub latent: usize,
    /// Width of a codebook entry: 8.
    pub codebook_dim: usize,
    pub semantic_codebook_size: usize,
    pub residual_codebooks: usize,
    pub residual_codebook_size: usize,
    pub encoder_dim: usize,
    pub decoder_dim: usize,
    pub transformer_intermediate: usize,
    pub pre_module_layers: usize,
    pub post_module_layers: usize,
    pub encoder_transformer_layers: usize,
    /// Positions of the (ignored) RoPE/mask buffers, written by the checkpoint writer only.
    pub buffer_positions: usize,
}

impl CodecDims {
    /// Samples per code frame: quantizer resampling × decoder strides (2048).
    pub fn samples_per_frame(&self) -> usize {
        QUANTIZER_RESAMPLE.iter().product::<usize>() * DECODER_RATES.iter().product::<usize>()
    }

    /// Infers the widths from a few anchor tensors; `shape_of` looks a name up in the file.
    /// Every other tensor is then checked against these by [`codec_weights`].
    pub fn infer(file: &str, shape_of: impl Fn(&str) -> Option<Vec<usize>>) -> Result<CodecDims, WeightError> {
        let need = |name: &str, rank: usize| -> Result<Vec<usize>, WeightError> {
            let shape =
                shape_of(name).ok_or_else(|| WeightError::Missing { file: file.into(), tensor: name.into() })?;
            if shape.len() != rank {
                return Err(WeightError::Invalid {
                    file: file.into(),
                    tensor: name.into(),
                    message: format!("expected a rank-{rank} tensor, found shape {shape:?}"),
                });
            }
            Ok(shape)
        };
        let count = |prefix: &str| {
            (0..).take_while(|n| shape_of(&format!("{prefix}.{n}.attention.wqkv.weight")).is_some()).count()
        };
        let semantic = need("quantizer.semantic_quantizer.quantizers.0.codebook.weight", 2)?;
        let residual = need("quantizer.quantizer.quantizers.0.codebook.weight", 2)?;
        let post_w1 = need("quantizer.post_module.layers.0.feed_forward.w1.weight", 2)?;
        let decoder_in = need(&format!("{}.original1", wn_prefix("decoder.model.0")), 3)
            .or_else(|_| need("decoder.model.0.conv.weight_v", 3))?;
        let encoder_in = need(&format!("{}.original1", wn_prefix("encoder.block.0")), 3)
            .or_else(|_| need("encoder.block.0.conv.weight_v", 3))?;
        let residual_codebooks = (0..)
            .take_while(|n| shape_of(&format!("quantizer.quantizer.quantizers.{n}.codebook.weight")).is_some())
            .count();
        Ok(CodecDims {
            latent: post_w1[1],
            codebook_dim: semantic[1],
            semantic_codebook_size: semantic[0],
            residual_codebooks,
            residual_codebook_size: residual[0],
            encoder_dim: encoder_in[0],
            decoder_dim: decoder_in[0],
            transformer_intermediate: post_w1[0],
            pre_module_layers: count("quantizer.pre_module.layers"),
            post_module_layers: count("quantizer.post_module.layers"),
            encoder_transformer_layers: count(&format!("encoder.block.{ENCODER_TRANSFORMER_BLOCK}.block.5.layers")),
            buffer_positions: 0,
        })
    }
}

fn wn_prefix(conv: &str) -> String {
    format!("{conv}.conv.parametrizations.weight")
}

/// A weight-normed convolution: `w = g · v / ‖v‖` over all dims but 0 (`codec.md` §1.6).
pub struct WnConv<T> {
    pub bias: T,
    /// `[dim0, 1, 1]`.
    pub g: T,
    /// The full weight shape: `[out, in, k]` (conv) or `[in, out, k]` (transposed conv).
    pub v: T,
}

pub struct ResidualUnit<T> {
    pub snake1_alpha: T,
    /// k7, dilated.
    pub conv1: WnConv<T>,
    pub snake2_alpha: T,
    /// k1.
    pub conv2: WnConv<T>,
}

pub struct EncoderBlock<T> {
    pub residual_units: Vec<ResidualUnit<T>>,
    pub snake_alpha: T,
    /// Strided conv `[2C, C, 2·stride]`.
    pub downsample: WnConv<T>,
    pub transformer: Option<Transformer<T>>,
}

pub struct DecoderBlock<T> {
    pub snake_alpha: T,
    /// Transposed conv `[Cin, Cout, 2·stride]`.
    pub upsample: WnConv<T>,
    pub residual_units: Vec<ResidualUnit<T>>,
}

pub struct TransformerLayer<T> {
    pub attention_norm: T,
    pub wqkv: T,
    pub wo: T,
    pub attention_layer_scale: T,
    pub ffn_norm: T,
    pub w1: T,
    pub w3: T,
    pub w2: T,
    pub ffn_layer_scale: T,
}

pub struct Transformer<T> {
    pub layers: Vec<TransformerLayer<T>>,
    pub norm: T,
}

pub struct ConvNeXt<T> {
    pub dwconv_weight: T,
    pub dwconv_bias: T,
    pub norm_weight: T,
    pub norm_bias: T,
    pub pwconv1_weight: T,
    pub pwconv1_bias: T,
    pub pwconv2_weight: T,
    pub pwconv2_bias: T,
    pub gamma: T,
}

/// One resampling stage of the quantizer: a k=s=2 conv (down) or transposed conv (up), then ConvNeXt.
pub struct ResampleStage<T> {
    pub conv_weight: T,
    pub conv_bias: T,
    pub convnext: ConvNeXt<T>,
}

pub struct Vq<T> {
    pub codebook: T,
    pub in_proj: WnConv<T>,
    pub out_proj: WnConv<T>,
}

pub struct CodecWeights<T> {
    pub encoder_conv_in: WnConv<T>,
    pub encoder_blocks: Vec<EncoderBlock<T>>,
    pub encoder_snake_alpha: T,
    pub encoder_conv_out: WnConv<T>,
    pub semantic_vq: Vq<T>,
    pub residual_vqs: Vec<Vq<T>>,
    pub pre_module: Transformer<T>,
    pub post_module: Transformer<T>,
    pub downsample: Vec<ResampleStage<T>>,
    pub upsample: Vec<ResampleStage<T>>,
    pub decoder_conv_in: WnConv<T>,
    pub decoder_blocks: Vec<DecoderBlock<T>>,
    pub decoder_snake_alpha: T,
    pub decoder_conv_out: WnConv<T>,
}

/// Walks every codec parameter (encoder, quantizer, decoder) in `state_dict` order.
pub fn codec_weights<S: TensorSource>(d: &CodecDims, src: &mut S) -> Result<CodecWeights<S::Tensor>, WeightError> {
    let mut b = Builder { src };
    let (e, l) = (d.encoder_dim, d.latent);
    let encoder_conv_in = b.wn_conv("encoder.block.0", [e, 1, CONV_KERNEL])?;
    let mut encoder_blocks = Vec::new();
    for (i, &stride) in ENCODER_RATES.iter().enumerate() {
        let (p, c) = (format!("encoder.block.{}.block", i + 1), e << i);
        let residual_units = (0..3).map(|u| b.residual_unit(&format!("{p}.{u}"), c)).collect::<Result<_, _>>()?;
        let snake_alpha = b.snake(&format!("{p}.3"), c)?;
        let downsample = b.wn_conv(&format!("{p}.4"), [2 * c, c, 2 * stride])?;
        let transformer = if i + 1 == ENCODER_TRANSFORMER_BLOCK && d.encoder_transformer_layers > 0 {
            Some(b.transformer(&format!("{p}.5"), d.encoder_transformer_layers, 2 * c, d.transformer_intermediate)?)
        } else {
            None
        };
        encoder_blocks.push(EncoderBlock { residual_units, snake_alpha, downsample, transformer });
    }
    let encoder_snake_alpha = b.snake("encoder.block.5", l)?;
    let encoder_conv_out = b.wn_conv("encoder.block.6", [l, l, 3])?;
    let semantic_vq = b.vq("quantizer.semantic_quantizer.quantizers.0", d.semantic_codebook_size, d)?;
    let residual_vqs = (0..d.residual_codebooks)
        .map(|i| b.vq(&format!("quantizer.quantizer.quantizers.{i}"), d.residual_codebook_size, d))
        .collect::<Result<_, _>>()?;
    let pre_module = b.transformer("quantizer.pre_module", d.pre_module_layers, l, d.transformer_intermediate)?;
    let post_module = b.transformer("quantizer.post_module", d.post_module_layers, l, d.transformer_intermediate)?;
    let downsample = (0..QUANTIZER_RESAMPLE.len())
        .map(|i| b.resample(&format!("quantizer.downsample.{i}"), l))
        .collect::<Result<_, _>>()?;
    let upsample = (0..QUANTIZER_RESAMPLE.len())
        .map(|i| b.resample(&format!("quantizer.upsample.{i}"), l))
        .collect::<Result<_, _>>()?;
    let decoder_conv_in = b.wn_conv("decoder.model.0", [d.decoder_dim, l, CONV_KERNEL])?;
    let mut decoder_blocks = Vec::new();
    for (i, &stride) in DECODER_RATES.iter().enumerate() {
        let (p, cin) = (format!("decoder.model.{}.block", i + 1), d.decoder_dim >> i);
        let snake_alpha = b.snake(&format!("{p}.0"), cin)?;
        let upsample = b.wn_conv_transposed(&format!("{p}.1"), [cin, cin / 2, 2 * stride])?;
        let residual_units =
            (0..3).map(|u| b.residual_unit(&format!("{p}.{}", u + 2), cin / 2)).collect::<Result<_, _>>()?;
        decoder_blocks.push(DecoderBlock { snake_alpha, upsample, residual_units });
    }
    let out_channels = d.decoder_dim >> DECODER_RATES.len();
    let decoder_snake_alpha = b.snake("decoder.model.5", out_channels)?;
    let decoder_conv_out = b.wn_conv("decoder.model.6", [1, out_channels, CONV_KERNEL])?;
    Ok(CodecWeights {
        encoder_conv_in,
        encoder_blocks,
        encoder_snake_alpha,
        encoder_conv_out,
        semantic_vq,
        residual_vqs,
        pre_module,
        post_module,
        downsample,
        upsample,
        decoder_conv_in,
        decoder_blocks,
        decoder_snake_alpha,
        decoder_conv_out,
    })
}

/// The six persistent buffers as the published file carries them (written, never read).
pub fn codec_buffer_specs(d: &CodecDims) -> Vec<TensorSpec> {
    let n = d.buffer_positions;
    CODEC_IGNORED_BUFFERS
        .iter()
        .map(|name| {
            if name.ends_with("causal_mask") {
                TensorSpec::new(*name, &[n, n], Accept::CodecFloat, Dtype::Bool, Init::CausalMask)
            } else {
                TensorSpec::new(
                    *name,
                    &[n, TRANSFORMER_HEAD_DIM / 2, 2],
                    Accept::CodecFloat,
                    Dtype::BF16,
                    Init::RopeTable,
                )
            }
        })
        .collect()
}

struct Builder<'s, S> {
    src: &'s mut S,
}

impl<S: TensorSource> Builder<'_, S> {
    fn param(&mut self, name: String, shape: &[usize], init: Init) -> Result<S::Tensor, WeightError> {
        self.src.tensor(TensorSpec::new(name, shape, Accept::CodecFloat, Dtype::F32, init))
    }

    /// Convs built by the modded code use the parametrizations API; VQ projections from the
    /// `dac` package the legacy `weight_g`/`weight_v` hooks. Either spelling is accepted.
    /// `bias_len` is the output width: `shape[0]` for a conv, `shape[1]` for a transposed conv.
    fn weight_norm(
        &mut self,
        p: &str,
        shape: [usize; 3],
        bias_len: usize,
        legacy_names: bool,
    ) -> Result<WnConv<S::Tensor>, WeightError> {
        let fan_in = shape[1] * shape[2];
        let (modern, legacy) = (format!("{p}.parametrizations.weight"), p.to_owned());
        let (g_main, g_alt, v_main, v_alt) = if legacy_names {
            (
                format!("{legacy}.weight_g"),
                format!("{modern}.original0"),
                format!("{legacy}.weight_v"),
                format!("{modern}.original1"),
            )
        } else {
            (
                format!("{modern}.original0"),
                format!("{legacy}.weight_g"),
                format!("{modern}.original1"),
                format!("{legacy}.weight_v"),
            )
        };
        let bias = self.param(format!("{p}.bias"), &[bias_len], Init::Uniform { lo: -0.05, hi: 0.05 })?;
        let g = self.src.tensor(
            TensorSpec::new(
                g_main,
                &[shape[0], 1, 1],
                Accept::CodecFloat,
                Dtype::F32,
                Init::Uniform { lo: 0.5, hi: 1.0 }, // row norms near 1: the decoder stays out of tanh saturation
            )
            .with_alias(g_alt),
        )?;
        let v = self.src.tensor(
            TensorSpec::new(v_main, &shape, Accept::CodecFloat, Dtype::F32, Init::Linear { fan_in }).with_alias(v_alt),
        )?;
        Ok(WnConv { bias, g, v })
    }

    fn wn_conv(&mut self, module: &str, shape: [usize; 3]) -> Result<WnConv<S::Tensor>, WeightError> {
        self.weight_norm(&format!("{module}.conv"), shape, shape[0], false)
    }

    /// Weight `[in, out, k]`, so the bias has `shape[1]` entries.
    fn wn_conv_transposed(&mut self, module: &str, shape: [usize; 3]) -> Result<WnConv<S::Tensor>, WeightError> {
        self.weight_norm(&format!("{module}.conv"), shape, shape[1], false)
    }

    fn snake(&mut self, module: &str, channels: usize) -> Result<S::Tensor, WeightError> {
        self.param(format!("{module}.alpha"), &[1, channels, 1], Init::Uniform { lo: 0.5, hi: 1.5 })
    }

    fn residual_unit(&mut self, p: &str, c: usize) -> Result<ResidualUnit<S::Tensor>, WeightError> {
        Ok(ResidualUnit {
            snake1_alpha: self.snake(&format!("{p}.block.0"), c)?,
            conv1: self.wn_conv(&format!("{p}.block.1"), [c, c, CONV_KERNEL])?,
            snake2_alpha: self.snake(&format!("{p}.block.2"), c)?,
            conv2: self.wn_conv(&format!("{p}.block.3"), [c, c, 1])?,
        })
    }

    fn transformer(
        &mut self,
        p: &str,
        layers: usize,
        dim: usize,
        inter: usize,
    ) -> Result<Transformer<S::Tensor>, WeightError> {
        let scale = Init::Uniform { lo: 0.1, hi: 0.5 };
        let gain = Init::Uniform { lo: 0.75, hi: 1.25 };
        let layers = (0..layers)
            .map(|i| {
                let q = format!("{p}.layers.{i}");
                Ok(TransformerLayer {
                    wqkv: self.param(
                        format!("{q}.attention.wqkv.weight"),
                        &[3 * dim, dim],
                        Init::Linear { fan_in: dim },
                    )?,
                    wo: self.param(format!("{q}.attention.wo.weight"), &[dim, dim], Init::Linear { fan_in: dim })?,
                    w1: self.param(
                        format!("{q}.feed_forward.w1.weight"),
                        &[inter, dim],
                        Init::Linear { fan_in: dim },
                    )?,
                    w3: self.param(
                        format!("{q}.feed_forward.w3.weight"),
                        &[inter, dim],
                        Init::Linear { fan_in: dim },
                    )?,
                    w2: self.param(
                        format!("{q}.feed_forward.w2.weight"),
                        &[dim, inter],
                        Init::Linear { fan_in: inter },
                    )?,
                    ffn_norm: self.param(format!("{q}.ffn_norm.weight"), &[dim], gain)?,
                    attention_norm: self.param(format!("{q}.attention_norm.weight"), &[dim], gain)?,
                    attention_layer_scale: self.param(format!("{q}.attention_layer_scale.gamma"), &[dim], scale)?,
                    ffn_layer_scale: self.param(format!("{q}.ffn_layer_scale.gamma"), &[dim], scale)?,
                })
            })
            .collect::<Result<_, WeightError>>()?;
        let norm = self.param(format!("{p}.norm.weight"), &[dim], gain)?;
        Ok(Transformer { layers, norm })
    }

    fn resample(&mut self, p: &str, c: usize) -> Result<ResampleStage<S::Tensor>, WeightError> {
        let small = Init::Uniform { lo: -0.05, hi: 0.05 };
        let conv_weight = self.param(format!("{p}.0.conv.weight"), &[c, c, 2], Init::Linear { fan_in: 2 * c })?;
        let conv_bias = self.param(format!("{p}.0.conv.bias"), &[c], small)?;
        let q = format!("{p}.1");
        let convnext = ConvNeXt {
            dwconv_weight: self.param(
                format!("{q}.dwconv.conv.weight"),
                &[c, 1, CONV_KERNEL],
                Init::Linear { fan_in: CONV_KERNEL },
            )?,
            dwconv_bias: self.param(format!("{q}.dwconv.conv.bias"), &[c], small)?,
            norm_weight: self.param(format!("{q}.norm.weight"), &[c], Init::Uniform { lo: 0.75, hi: 1.25 })?,
            norm_bias: self.param(format!("{q}.norm.bias"), &[c], small)?,
            pwconv1_weight: self.param(format!("{q}.pwconv1.weight"), &[4 * c, c], Init::Linear { fan_in: c })?,
            pwconv1_bias: self.param(format!("{q}.pwconv1.bias"), &[4 * c], small)?,
            pwconv2_weight: self.param(format!("{q}.pwconv2.weight"), &[c, 4 * c], Init::Linear { fan_in: 4 * c })?,
            pwconv2_bias: self.param(format!("{q}.pwconv2.bias"), &[c], small)?,
            gamma: self.param(format!("{q}.gamma"), &[c], Init::Uniform { lo: 0.1, hi: 0.5 })?,
        };
        Ok(ResampleStage { conv_weight, conv_bias, convnext })
    }

    fn vq(&mut self, p: &str, size: usize, d: &CodecDims) -> Result<Vq<S::Tensor>, WeightError> {
        Ok(Vq {
            codebook: self.param(
                format!("{p}.codebook.weight"),
                &[size, d.codebook_dim],
                Init::Normalish { std: 1.0 },
            )?,
            in_proj: self.weight_norm(&format!("{p}.in_proj"), [d.codebook_dim, d.latent, 1], d.codebook_dim, true)?,
            out_proj: self.weight_norm(&format!("{p}.out_proj"), [d.latent, d.codebook_dim, 1], d.latent, true)?,
        })
    }
}

/// Whether a codec parameter is read when decoding codes to audio (the server's path); the
/// rest (encoder, `pre_module`, downsampling, VQ input projections) serves voice cloning.
pub fn is_decode_path(name: &str) -> bool {
    let vq = name.starts_with("quantizer.semantic_quantizer.") || name.starts_with("quantizer.quantizer.");
    (vq && !name.contains(".in_proj."))
        || name.starts_with("quantizer.post_module.")
        || name.starts_with("quantizer.upsample.")
        || name.starts_with("decoder.")
}
