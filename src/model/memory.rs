//! Device-memory arithmetic of the model, independent of any backend: the weights as stored,
//! the codec's FP16 decode path, its f32 encoder, and what each request's state costs (KV rows per position, GDN
//! conv and recurrent state). `inspect` prints it; the CUDA admission plan and the engine
//! loaders build on it.

use crate::model::config::{Dims, LayerType};
use crate::model::load::Checkpoint;
use crate::model::weights::codec::{CODEC_IGNORED_BUFFERS, is_decode_path};

/// Device-resident sizes for serving, in bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceBudget {
    /// Backbone and tower weights as stored (bf16, FP8 experts with f32 scale grids).
    pub model_weights: usize,
    /// The codec's decode path in FP16, as the reference runs it.
    pub codec_weights: usize,
    /// KV caches (backbone full-attention and tower layers, bf16) per request at the context length.
    pub kv_cache_per_request: usize,
    /// Gated DeltaNet conv and recurrent state (fp32) per request.
    pub recurrent_state_per_request: usize,
}

impl DeviceBudget {
    pub fn total(&self, requests: usize) -> usize {
        self.model_weights
            + self.codec_weights
            + requests * (self.kv_cache_per_request + self.recurrent_state_per_request)
    }
}

/// KV rows cost per position: backbone full-attention layers plus every tower layer.
pub fn kv_bytes_per_position(d: &Dims) -> usize {
    let full_layers = d.layer_types.iter().filter(|t| **t == LayerType::FullAttention).count();
    (full_layers + d.tower_layers()) * 2 * d.kv_heads * d.head_dim * 2
}

/// Conv window and `[Hv, Dv, Dk]` recurrent state of every GDN layer, in fp32.
pub fn recurrent_state_bytes(d: &Dims) -> usize {
    let gdn_layers = d.layer_types.iter().filter(|t| **t == LayerType::LinearAttention).count();
    let conv = (d.gdn_conv_kernel - 1) * d.gdn_qkv_dim();
    let state = d.gdn_value_heads * d.gdn_value_dim * d.gdn_key_dim;
    gdn_layers * (conv + state) * 4
}

/// The codec encoder's weights in f32 (voice cloning: the encoder, the quantizer's downsampling,
/// `pre_module` and the quantizers), as the GPU encoder holds them.
pub fn encoder_weight_bytes(ckpt: &Checkpoint) -> usize {
    let decode_only = |name: &str| {
        name.starts_with("decoder.")
            || name.starts_with("quantizer.post_module.")
            || name.starts_with("quantizer.upsample.")
    };
    (ckpt.codec.tensors())
        .filter(|(name, _)| !decode_only(name) && !CODEC_IGNORED_BUFFERS.contains(name))
        .map(|(_, t)| t.shape.iter().product::<usize>() * 4)
        .sum()
}

pub fn device_budget(ckpt: &Checkpoint, context_length: usize) -> DeviceBudget {
    let model_weights = ckpt.shards.names().filter_map(|n| ckpt.shards.get(n)).map(|(_, v)| v.bytes.len()).sum();
    let codec_weights = ckpt
        .codec
        .tensors()
        .filter(|(name, _)| is_decode_path(name))
        .map(|(_, t)| t.shape.iter().product::<usize>() * 2)
        .sum();
    DeviceBudget {
        model_weights,
        codec_weights,
        kv_cache_per_request: kv_bytes_per_position(&ckpt.dims) * context_length,
        recurrent_state_per_request: recurrent_state_bytes(&ckpt.dims),
    }
}
