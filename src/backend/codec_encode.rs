//! The codec encoder's operations (`codec.md` §5.3): what voice cloning needs beyond the layers
//! it shares with the decoder ([`CodecLayerOps`]) — a strided causal conv (the encoder blocks' downsampling), a quantizer
//! downsample stage (conv k = s = 2, then ConvNeXt), and the quantizers' nearest-codeword search.
//! `model::codec::encode` composes them with the stride-1 convs, residual units and windowed
//! transformer layers of [`CodecLayerOps`].
//!
//! The encoder reads a whole reference clip at once (nothing streams), so these take no carried
//! state: every causal conv starts from the reference's zero left padding.

use super::codec::{CodecLayerOps, ConvNext};

/// A causal conv with kernel `k` and stride `s`: zero left padding `k − s`, input rows a
/// multiple of `s`, output row `t` reading padded input rows `t·s .. t·s + k`.
pub struct StridedConv<W> {
    /// `[out, kernel, in]` (tap-major).
    pub weight: W,
    /// `[out]`.
    pub bias: W,
    pub kernel: usize,
    pub stride: usize,
}

/// One quantizer downsample stage: a strided conv (k = s = 2, no weight norm), then ConvNeXt.
pub struct DownsampleStage<W> {
    pub conv: StridedConv<W>,
    pub convnext: ConvNext<W>,
}

/// One codebook's encoding side (`dac.nn.quantize.VectorQuantize`), weight norm folded.
pub struct VqEncoder<W> {
    /// `in_proj` `[codebook_dim, latent]` and its bias `[codebook_dim]`.
    pub in_proj: W,
    pub in_bias: W,
    /// `[size, codebook_dim]`, the raw entries.
    pub codebook: W,
    /// `out_proj` `[latent, codebook_dim]` and its bias `[latent]`.
    pub out_proj: W,
    pub out_bias: W,
}

/// The encoder's arithmetic beyond [`CodecLayerOps`]. Activations are `[rows, channels]`.
pub trait CodecEncodeOps: CodecLayerOps {
    /// Host samples as a one-channel activation `[samples, 1]`.
    fn codec_samples(&self, samples: &[f32]) -> Self::Act;

    /// Optional Snake (α per channel), then a strided causal conv; `x.rows` must be a multiple
    /// of the stride. Output rows: `x.rows / stride`.
    fn codec_strided_conv(
        &self,
        conv: &StridedConv<Self::Weight>,
        snake: Option<&Self::Weight>,
        x: &Self::Act,
    ) -> Self::Act;

    /// A quantizer downsample stage: rows halve.
    fn codec_downsample_stage(&self, w: &DownsampleStage<Self::Weight>, x: &Self::Act) -> Self::Act;

    /// The codes of each row of `z` (`[frames, latent]`): the first quantizer on `z`, each later
    /// one on what the earlier ones left (`r ← r − q`), as `DownsampleResidualVectorQuantize`
    /// does with its semantic quantizer and then its residual ones. A quantizer projects the
    /// row (`in_proj`), takes the codeword of greatest cosine similarity (the first on a tie),
    /// and gives back `out_proj(e + (c − e))`, the reference's straight-through form. Returns
    /// row-major `[frames, quantizers.len()]`.
    fn codec_quantize(&self, quantizers: &[&VqEncoder<Self::Weight>], z: &Self::Act) -> Vec<u32>;
}
