//! The one table of checkpoint tensor names (`model.md` §3.2–3.3, `codec.md` §3).
//!
//! Each part of the model has a builder that walks its tensors in a fixed order and asks a
//! [`TensorSource`] for each one by name, with the shape and dtypes the config implies. The same
//! builders serve every purpose, so a tensor name is spelled in exactly one place:
//! - the loader's source checks presence, shape and dtype against a mapped checkpoint and
//!   hands back views (typed per-layer structs such as [`BackboneWeights`]);
//! - the checkpoint writer's source records the specs and writes random tensors in that layout;
//! - `inspect` sums bytes by dtype from the loaded views.

mod backbone;
pub mod codec;
mod tower;

use std::fmt;

use crate::checkpoint::Dtype;

pub use backbone::{
    AttentionWeights, BackboneLayer, BackboneWeights, Fp8Expert, Fp8Linear, GdnWeights, Mixer, MoeWeights, SwiGlu,
    backbone_weights,
};
pub use codec::{
    CODEC_IGNORED_BUFFERS, CodecDims, CodecWeights, ConvNeXt, DecoderBlock, EncoderBlock, ResampleStage, ResidualUnit,
    Transformer, TransformerLayer, Vq, WnConv, codec_buffer_specs, codec_weights,
};
pub use tower::{TowerLayer, TowerWeights, tower_weights};

/// Which stored dtypes a tensor may have.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Accept {
    /// Large bf16 matrices, exactly as published.
    Bf16,
    /// Small vectors (norm gains, `A_log`, `dt_bias`): bf16 or f32; both are read exactly.
    SmallFloat,
    /// Block-FP8 routed-expert weights.
    Fp8E4M3,
    /// Block-FP8 scale grids (`weight_scale_inv`): f32 as published; bf16 and f16 read exactly
    /// (both references accept them).
    Scale,
    /// `codec.pth` parameters: f32 as published; f16 and bf16 read exactly.
    CodecFloat,
}

impl Accept {
    pub fn allows(self, d: Dtype) -> bool {
        match self {
            Accept::Bf16 => d == Dtype::BF16,
            Accept::SmallFloat => matches!(d, Dtype::BF16 | Dtype::F32),
            Accept::Scale => matches!(d, Dtype::BF16 | Dtype::F32 | Dtype::F16),
            Accept::Fp8E4M3 => d == Dtype::F8E4M3,
            Accept::CodecFloat => matches!(d, Dtype::F32 | Dtype::F16 | Dtype::BF16),
        }
    }

    /// Human description for error messages.
    pub fn describe(self) -> &'static str {
        match self {
            Accept::Bf16 => "BF16",
            Accept::SmallFloat => "BF16 or F32",
            Accept::Scale => "F32, BF16 or F16",
            Accept::Fp8E4M3 => "F8_E4M3",
            Accept::CodecFloat => "F32, F16 or BF16",
        }
    }
}

/// How the checkpoint writer fills a tensor with random values. Chosen so that the common
/// mistakes (`w` for `1 + w`, a transposed scale grid, a wrong fan-in) change results visibly.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Init {
    /// Uniform with standard deviation `1/sqrt(fan_in)`.
    Linear { fan_in: usize },
    /// Uniform with standard deviation `std`.
    Normalish { std: f32 },
    /// Zero-centred gain `w` of a `(1 + w)` norm: uniform in [-0.25, 0.25].
    ZeroCenteredGain,
    /// Uniform in [lo, hi]: plain gains, Snake α, layer scales, biases.
    Uniform { lo: f32, hi: f32 },
    /// `A_log` of a Gated DeltaNet head: `ln(A)` with A uniform in [1, 16].
    ALog,
    /// `dt_bias`: inverse softplus of a time step in [1e-3, 1e-1].
    DtBias,
    /// FP8 e4m3 codes spread over the whole finite range, as a block quantiser produces.
    Fp8Codes,
    /// A block scale grid: `sqrt(3/fan_in)/448` times a factor in [0.5, 1.5].
    Fp8Scale { fan_in: usize },
    /// The codec's RoPE table buffer (ignored by the loader; written for layout fidelity).
    RopeTable,
    /// A lower-triangular boolean mask buffer (ignored by the loader).
    CausalMask,
}

/// One tensor of the published layout.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorSpec {
    /// The name the published checkpoint uses.
    pub name: String,
    /// An equivalent older spelling (weight norm's `weight_g`/`weight_v` vs
    /// `parametrizations.weight.original0/1`) that readers accept as well.
    pub alias: Option<String>,
    pub shape: Vec<usize>,
    pub accept: Accept,
    /// The dtype the published checkpoint stores (what the writer writes).
    pub stored: Dtype,
    pub init: Init,
    /// The tensor's output is added into the backbone's residual stream (a mixer's or an MLP's
    /// last projection): the checkpoint writer may shrink its init (see `SynthPlan`).
    pub residual_branch: bool,
}

impl TensorSpec {
    pub fn new(name: impl Into<String>, shape: &[usize], accept: Accept, stored: Dtype, init: Init) -> TensorSpec {
        TensorSpec {
            name: name.into(),
            alias: None,
            shape: shape.to_vec(),
            accept,
            stored,
            init,
            residual_branch: false,
        }
    }

    /// Marks a residual branch's output projection (or its FP8 scales).
    pub fn residual_branch(mut self) -> TensorSpec {
        self.residual_branch = true;
        self
    }

    pub fn with_alias(mut self, alias: impl Into<String>) -> TensorSpec {
        self.alias = Some(alias.into());
        self
    }

    /// A bf16 matrix `[out, in]` as a linear layer stores it.
    pub fn linear(name: impl Into<String>, out: usize, inp: usize) -> TensorSpec {
        Self::new(name, &[out, inp], Accept::Bf16, Dtype::BF16, Init::Linear { fan_in: inp })
    }

    /// A `(1 + w)` norm gain of width `n`.
    pub fn zero_centered_norm(name: impl Into<String>, n: usize) -> TensorSpec {
        Self::new(name, &[n], Accept::SmallFloat, Dtype::BF16, Init::ZeroCenteredGain)
    }

    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn stored_bytes(&self) -> usize {
        self.numel() * self.stored.size()
    }
}

/// Where the builders get tensors from.
pub trait TensorSource {
    type Tensor;
    fn tensor(&mut self, spec: TensorSpec) -> Result<Self::Tensor, WeightError>;
}

/// A source that only records the specs: the layout without any data.
#[derive(Default)]
pub struct SpecRecorder {
    pub specs: Vec<TensorSpec>,
}

impl TensorSource for SpecRecorder {
    type Tensor = ();
    fn tensor(&mut self, spec: TensorSpec) -> Result<(), WeightError> {
        self.specs.push(spec);
        Ok(())
    }
}

/// Why a checkpoint's tensors were refused. Every variant names the file and the tensor.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum WeightError {
    #[error("{file}: tensor `{tensor}` is missing")]
    Missing { file: String, tensor: String },
    #[error("{file}: tensor `{tensor}` has shape {found:?}, expected {expected:?}")]
    Shape { file: String, tensor: String, expected: Vec<usize>, found: Vec<usize> },
    #[error("{file}: tensor `{tensor}` has dtype {found}, expected {expected}")]
    Dtype { file: String, tensor: String, expected: &'static str, found: Dtype },
    #[error(
        "{file}: tensor `{tensor}` is in an unknown namespace (expected `model.language_model.`, `lm_head.` or `audio_decoder`)"
    )]
    UnknownNamespace { file: String, tensor: String },
    #[error("{file}: tensor `{tensor}` is not part of the model")]
    Unexpected { file: String, tensor: String },
    #[error("{file}: tensor `{tensor}`: {message}")]
    Invalid { file: String, tensor: String, message: String },
    #[error("{file}: tensor `{tensor}`: element {index} is NaN or infinite (the file is corrupt)")]
    NonFinite { file: String, tensor: String, index: usize },
    #[error("{file}: {message}")]
    Read { file: String, message: String },
}

impl fmt::Display for Accept {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.describe())
    }
}

/// Everything in the safetensors shards: backbone and tower.
pub struct ModelWeights<T> {
    pub backbone: BackboneWeights<T>,
    pub tower: TowerWeights<T>,
}

/// Builds the backbone and tower from `src` in checkpoint order.
pub fn model_weights<S: TensorSource>(
    dims: &crate::model::config::Dims,
    src: &mut S,
) -> Result<ModelWeights<S::Tensor>, WeightError> {
    Ok(ModelWeights { backbone: backbone_weights(dims, src)?, tower: tower_weights(dims, src)? })
}

/// The namespaces the reference routes; anything else in the shards is refused as unknown.
pub const MODEL_NAMESPACES: [&str; 3] = ["model.language_model.", "lm_head.", "audio_decoder"];

/// Whether a shard tensor name lies in a namespace the model owns.
pub fn in_model_namespace(name: &str) -> bool {
    MODEL_NAMESPACES.iter().any(|ns| name.starts_with(ns))
}

#[cfg(test)]
mod tests;
