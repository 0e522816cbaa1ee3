//! The codec decoder's operations (`codec.md` §1–2): one method per stage of the Fish modded DAC
//! decode path — RVQ lookup, a layer of the windowed causal transformer, a quantizer upsample
//! stage, a causal conv, a decoder block's Snake + transposed conv, a residual unit, tanh.
//! `model::codec` composes them; each backend implements them. The layers the encoder shares
//! (convs, residual units, the transformer) form [`CodecLayerOps`]; [`CodecOps`] adds the rest.
//!
//! Every stage is causal, so every operation continues a stream: it takes the new input rows
//! and a state holding exactly the past its outputs need (`codec.md` §2), and advances that
//! state. Contract for exact streaming: each output element is computed by the same sequence of
//! floating-point operations, from the same input values, however the stream was cut into calls.
//! Hence a whole decode and any chunked decode agree bit for bit.

use super::BackendTypes;
use crate::model::weights::TransformerLayer;

/// A causal (left-padded, stride 1) convolution, weight norm already folded.
pub struct CausalConv<W> {
    /// `[out, kernel, in]` (tap-major: the rows a tap reads are contiguous).
    pub weight: W,
    /// `[out]`.
    pub bias: W,
    pub kernel: usize,
    pub dilation: usize,
}

impl<W> CausalConv<W> {
    /// Past input rows an output needs: the conv's zero left padding, `(k − 1)·d`.
    pub fn history(&self) -> usize {
        (self.kernel - 1) * self.dilation
    }
}

/// A transposed convolution with kernel `2·stride` whose last `stride` outputs are dropped
/// (`codec.md` §1.5): output `i·s + j` reads input rows `i` (tap `j`) and `i − 1` (tap `j + s`).
pub struct CausalConvTranspose<W> {
    /// `[2·stride, out, in]`.
    pub weight: W,
    /// `[out]`.
    pub bias: W,
    pub stride: usize,
}

/// One codebook of the residual VQ: `q = out_proj(codebook[code])`.
pub struct RvqCodebook<W> {
    /// `[size, codebook_dim]`, the raw (not normalised) entries.
    pub codebook: W,
    /// Folded `out_proj` weight `[latent, codebook_dim]`.
    pub proj: W,
    /// `[latent]`.
    pub bias: W,
}

/// Sizes of the post_module transformer (`codec.md` §1.3).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CodecAttentionShape {
    pub heads: usize,
    pub head_dim: usize,
    /// A query attends itself and the `window − 1` frames before it.
    pub window: usize,
    pub norm_eps: f32,
}

/// A ConvNeXt block (`rvq.py`): causal depthwise conv, LayerNorm (eps 1e-6), Linear, exact GELU,
/// Linear, γ, residual. It follows each quantizer upsample stage (decode) and downsample stage
/// (encode).
pub struct ConvNext<W> {
    /// Depthwise causal conv `[kernel, channels]`.
    pub dw_weight: W,
    pub dw_bias: W,
    pub norm_weight: W,
    pub norm_bias: W,
    /// `[4C, C]`.
    pub pw1_weight: W,
    pub pw1_bias: W,
    /// `[C, 4C]`.
    pub pw2_weight: W,
    pub pw2_bias: W,
    pub gamma: W,
}

/// One quantizer upsample stage (`codec.md` §1.4): transposed conv k = s = 2, then a ConvNeXt block.
pub struct UpsampleStage<W> {
    /// `[2, out, in]` (tap-major), no weight norm.
    pub conv_weight: W,
    pub conv_bias: W,
    pub convnext: ConvNext<W>,
}

/// Snake then the transposed conv: the head of a decoder block.
pub struct DecoderUpsample<W> {
    /// Snake α `[in]`.
    pub snake: W,
    pub conv: CausalConvTranspose<W>,
}

/// `x + conv2(snake2(conv1(snake1(x))))`, conv1 k7 dilated, conv2 k1.
pub struct ResidualUnitParams<W> {
    pub snake1: W,
    pub conv1: CausalConv<W>,
    pub snake2: W,
    pub conv2: CausalConv<W>,
}

/// The codec's layers that decoder and encoder share: causal convs, residual units, the
/// windowed transformer, RMSNorm, and the state they carry. Activations are `[rows, channels]`,
/// one row per time step.
pub trait CodecLayerOps: BackendTypes {
    /// The last inputs of a causal conv (after its Snake, where it has one), or of a transposed
    /// conv; a fresh one holds zeros, the reference's left padding.
    type ConvHistory;
    /// Post-RoPE keys and values of the last `window − 1` frames of one attention layer.
    type KvWindow;

    /// Makes a host-prepared codec weight resident (every codec tensor goes through this,
    /// after the weight-norm fold and re-layout in f32). By default exactly as `upload_f32`; a
    /// backend that computes in lower precision rounds here.
    fn codec_weight(&self, shape: &[usize], data: Vec<f32>) -> Self::Weight {
        self.upload_f32(shape, data)
    }

    /// A history of `rows` zero rows of width `channels`.
    fn new_conv_history(&self, rows: usize, channels: usize) -> Self::ConvHistory;
    /// An empty key/value window for frames of width `heads · head_dim`.
    fn new_kv_window(&self, shape: &CodecAttentionShape) -> Self::KvWindow;

    /// One pre-norm transformer layer with LayerScale over new frames; `rope` holds the
    /// `(cos, sin)` pairs `[rows, head_dim / 2, 2]` of the frames' absolute positions. Appends the
    /// frames' keys and values to `kv` and drops those no later frame can see.
    fn codec_transformer_layer(
        &self,
        shape: &CodecAttentionShape,
        w: &TransformerLayer<Self::Weight>,
        rope: &[f32],
        x: &Self::Act,
        kv: &mut Self::KvWindow,
    ) -> Self::Act;

    /// `x · rsqrt(mean(x²) + eps) · w` over each row (the reference's RMSNorm, no `1 +`).
    fn codec_rms_norm(&self, weight: &Self::Weight, eps: f32, x: &Self::Act) -> Self::Act;

    /// Optional Snake (α per channel), then a causal conv.
    fn codec_causal_conv(
        &self,
        conv: &CausalConv<Self::Weight>,
        snake: Option<&Self::Weight>,
        x: &Self::Act,
        history: &mut Self::ConvHistory,
    ) -> Self::Act;

    /// A residual unit; `history` holds the last `6·d` inputs of its dilated conv (after Snake).
    fn codec_residual_unit(
        &self,
        w: &ResidualUnitParams<Self::Weight>,
        x: &Self::Act,
        history: &mut Self::ConvHistory,
    ) -> Self::Act;
}

/// The codec decoder's own arithmetic on top of [`CodecLayerOps`].
pub trait CodecOps: CodecLayerOps {
    /// Sum of the codebook projections of each frame: `q₀ + (((q₁ + q₂) + …) + q₉)`.
    /// `codes` is row-major `[frames, books.len()]`, every code already clamped in range.
    fn codec_rvq(&self, books: &[RvqCodebook<Self::Weight>], codes: &[u32]) -> Self::Act;

    /// Transposed conv k = s = 2 (rows double), then ConvNeXt: causal depthwise conv (its
    /// input history in `dw_history`), LayerNorm (eps 1e-6), Linear, exact GELU, Linear, γ,
    /// residual.
    fn codec_upsample_stage(
        &self,
        w: &UpsampleStage<Self::Weight>,
        x: &Self::Act,
        dw_history: &mut Self::ConvHistory,
    ) -> Self::Act;

    /// Snake then the causal transposed conv (rows × stride); `history` holds one row.
    fn codec_decoder_upsample(
        &self,
        w: &DecoderUpsample<Self::Weight>,
        x: &Self::Act,
        history: &mut Self::ConvHistory,
    ) -> Self::Act;

    /// `tanh` of a one-channel activation, as host samples.
    fn codec_tanh_pcm(&self, x: &Self::Act) -> Vec<f32>;

    // Several streams at once (the decode batch's ready groups). `x` stacks each stream's new
    // rows in order, `rows[s]` of them for stream `s`; each stream continues its own state, and
    // the output stacks each stream's output rows in the same order. Contract: each stream's
    // rows equal what the single-stream operation gives it, bit for bit, whatever else shares
    // the call. The defaults run each stream alone; a backend overrides them to share launches.

    /// [`CodecLayerOps::codec_transformer_layer`] over streams; `ropes[s]` holds stream `s`'s rows.
    fn codec_transformer_layer_rows(
        &self,
        shape: &CodecAttentionShape,
        w: &TransformerLayer<Self::Weight>,
        ropes: &[Vec<f32>],
        x: &Self::Act,
        rows: &[usize],
        kvs: &mut [&mut Self::KvWindow],
    ) -> Self::Act {
        let mut kvs = kvs.iter_mut();
        let mut ropes = ropes.iter();
        each_stream(self, x, rows, |xs| {
            let (kv, rope) = (kvs.next().expect("one window per stream"), ropes.next().expect("one rope per stream"));
            self.codec_transformer_layer(shape, w, rope, xs, kv)
        })
    }

    /// [`CodecOps::codec_upsample_stage`] over streams (each stream's rows double).
    fn codec_upsample_stage_rows(
        &self,
        w: &UpsampleStage<Self::Weight>,
        x: &Self::Act,
        rows: &[usize],
        dw_histories: &mut [&mut Self::ConvHistory],
    ) -> Self::Act {
        let mut histories = dw_histories.iter_mut();
        each_stream(self, x, rows, |xs| self.codec_upsample_stage(w, xs, histories.next().expect("one per stream")))
    }

    /// [`CodecLayerOps::codec_causal_conv`] over streams.
    fn codec_causal_conv_rows(
        &self,
        conv: &CausalConv<Self::Weight>,
        snake: Option<&Self::Weight>,
        x: &Self::Act,
        rows: &[usize],
        histories: &mut [&mut Self::ConvHistory],
    ) -> Self::Act {
        let mut histories = histories.iter_mut();
        each_stream(self, x, rows, |xs| {
            self.codec_causal_conv(conv, snake, xs, histories.next().expect("one history per stream"))
        })
    }

    /// [`CodecOps::codec_decoder_upsample`] over streams (each stream's rows × stride).
    fn codec_decoder_upsample_rows(
        &self,
        w: &DecoderUpsample<Self::Weight>,
        x: &Self::Act,
        rows: &[usize],
        histories: &mut [&mut Self::ConvHistory],
    ) -> Self::Act {
        let mut histories = histories.iter_mut();
        each_stream(self, x, rows, |xs| {
            self.codec_decoder_upsample(w, xs, histories.next().expect("one history per stream"))
        })
    }

    /// [`CodecLayerOps::codec_residual_unit`] over streams.
    fn codec_residual_unit_rows(
        &self,
        w: &ResidualUnitParams<Self::Weight>,
        x: &Self::Act,
        rows: &[usize],
        histories: &mut [&mut Self::ConvHistory],
    ) -> Self::Act {
        let mut histories = histories.iter_mut();
        each_stream(self, x, rows, |xs| {
            self.codec_residual_unit(w, xs, histories.next().expect("one history per stream"))
        })
    }
}

/// Runs `op` on each stream's rows of `x` alone (in order) and stacks the outputs.
fn each_stream<B: BackendTypes + ?Sized>(
    backend: &B,
    x: &B::Act,
    rows: &[usize],
    mut op: impl FnMut(&B::Act) -> B::Act,
) -> B::Act {
    let mut start = 0;
    let outputs: Vec<B::Act> = rows
        .iter()
        .map(|&n| {
            let xs = backend.act_rows(x, start, n);
            start += n;
            op(&xs)
        })
        .collect();
    backend.stack_rows(&outputs)
}
