//! The Fish modded-DAC decode path (`codec.md` §1–2): codes `[frames, 10]` → clamp → RVQ sum →
//! post_module (8-layer causal transformer, window 128, RoPE at absolute frame positions) → two
//! ×2 upsample stages → DAC decoder → tanh: 2048 samples per frame. [`CodecModel::decode`]
//! decodes a whole utterance; [`StreamingDecoder`] decodes frames as they come, bit-identical to
//! the whole decode for every chunking.

pub mod encode;
mod params;
pub mod rope;
mod stream;

pub use params::{
    CodecParams, DecoderBlockParams, HostTensor, fold_weight_norm, host_params, load_params, upload_params,
};
pub use stream::{DecodeTrace, StreamingDecoder};

use crate::backend::codec::{CodecAttentionShape, CodecOps};
use crate::checkpoint::pth::PthError;
use crate::model::load::Checkpoint;
use crate::model::weights::codec::{TRANSFORMER_HEAD_DIM, TRANSFORMER_WINDOW};
use crate::model::weights::{CodecDims, WeightError};

/// `norm_eps` of the codec transformers (`modded_dac_vq.yaml`).
pub const NORM_EPS: f32 = 1e-5;

/// Why a codec could not be loaded or codes could not be decoded.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    #[error(transparent)]
    Weights(#[from] WeightError),
    #[error(transparent)]
    Pth(#[from] PthError),
    #[error("codes: {len} values are not whole frames of {width} codes")]
    Codes { len: usize, width: usize },
    #[error("codes: no frames to decode")]
    Empty,
    #[error("audio: no samples to encode")]
    EmptyAudio,
    #[error("audio: sample {at} is not a finite number")]
    NonFiniteSample { at: usize },
    #[error("codes: a decode of {frames} frames exceeds the codec's {max} positions")]
    TooLong { frames: usize, max: usize },
}

/// A codec ready to decode on backend `B`.
pub struct CodecModel<B: CodecOps> {
    pub dims: CodecDims,
    pub params: CodecParams<B::Weight>,
}

impl<B: CodecOps> CodecModel<B> {
    /// Reads, folds and uploads the decode-path weights of `ckpt`'s codec.
    pub fn load(ckpt: &Checkpoint, backend: &B) -> Result<CodecModel<B>, CodecError> {
        Ok(CodecModel { dims: ckpt.codec_dims.clone(), params: load_params(ckpt, backend)? })
    }

    /// A codec from its host image ([`host_params`], prepared on any thread), made resident on
    /// `backend` here.
    pub fn from_host(ckpt: &Checkpoint, backend: &B, host: CodecParams<HostTensor>) -> CodecModel<B> {
        CodecModel { dims: ckpt.codec_dims.clone(), params: upload_params(backend, host) }
    }

    /// Codes per frame: the semantic code, then the residual codes.
    pub fn codes_per_frame(&self) -> usize {
        1 + self.dims.residual_codebooks
    }

    pub fn attention_shape(&self) -> CodecAttentionShape {
        CodecAttentionShape {
            heads: self.dims.latent / TRANSFORMER_HEAD_DIM,
            head_dim: TRANSFORMER_HEAD_DIM,
            window: TRANSFORMER_WINDOW,
            norm_eps: NORM_EPS,
        }
    }

    /// Decodes a whole utterance: `codes` row-major `[frames, codes_per_frame]` → `2048 · frames`
    /// samples in (−1, 1).
    pub fn decode(&self, backend: &B, codes: &[u32]) -> Result<Vec<f32>, CodecError> {
        StreamingDecoder::new(self, backend).push(codes)
    }

    /// [`Self::decode`], also returning each stage's output (for checks against references).
    pub fn decode_traced(&self, backend: &B, codes: &[u32]) -> Result<(Vec<f32>, DecodeTrace<B::Act>), CodecError> {
        StreamingDecoder::new(self, backend).push_traced(codes)
    }
}

/// Clamps codes in place from above as the reference does (`codec.md` §1.1): the semantic code
/// to `semantic_size − 1`, residual codes to `residual_size − 1`. The tower may sample residual
/// codes from a wider slice than the codec's codebooks, so these are clamped, not refused.
pub fn clamp_codes(dims: &CodecDims, codes: &mut [u32]) {
    let width = 1 + dims.residual_codebooks;
    let sem_max = (dims.semantic_codebook_size - 1) as u32;
    let res_max = (dims.residual_codebook_size - 1) as u32;
    for frame in codes.chunks_mut(width) {
        frame[0] = frame[0].min(sem_max);
        for c in &mut frame[1..] {
            *c = (*c).min(res_max);
        }
    }
}
