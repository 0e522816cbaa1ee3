//! `limelight inspect`: validates a checkpoint directory and prints what it holds and what the
//! model will need on the device.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::checkpoint::Dtype;
use crate::model::config::{Dims, LayerType};
use crate::model::load::Checkpoint;
use crate::model::weights::CODEC_IGNORED_BUFFERS;
use crate::model::weights::codec::is_decode_path;

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

/// The human summary `inspect` prints.
pub fn summary(ckpt: &Checkpoint, context_length: usize) -> String {
    let (c, d, s, k) = (&ckpt.config, &ckpt.dims, &ckpt.special_tokens, &ckpt.codec_dims);
    let full = d.layer_types.iter().filter(|t| **t == LayerType::FullAttention).count();
    let mut o = String::new();
    let _ = writeln!(o, "checkpoint {} is valid", ckpt.dir.display());
    let _ = writeln!(
        o,
        "  model_type {}, template {}, text_config {}",
        c.model_type, c.speech_template_version, c.text_config.model_type
    );
    let _ = writeln!(
        o,
        "backbone: {} layers ({} gated deltanet, {} gated attention), hidden {}, vocab {}",
        d.layers,
        d.layers - full,
        full,
        d.hidden,
        d.vocab
    );
    let _ = writeln!(
        o,
        "  attention: {} heads, {} kv heads, head_dim {}, rotary {} dims, theta {}",
        d.heads, d.kv_heads, d.head_dim, d.rotary_dim, c.text_config.rope_parameters.rope_theta
    );
    let _ = writeln!(
        o,
        "  gated deltanet: {} key heads x {}, {} value heads x {}, conv kernel {}",
        d.gdn_key_heads, d.gdn_key_dim, d.gdn_value_heads, d.gdn_value_dim, d.gdn_conv_kernel
    );
    let _ = writeln!(
        o,
        "  moe: {} experts, top-{}, intermediate {}, shared expert {}, block-FP8 {}x{}",
        d.experts,
        d.experts_per_token,
        d.expert_intermediate,
        d.shared_expert_intermediate,
        d.fp8_block[0],
        d.fp8_block[1]
    );
    let _ = writeln!(
        o,
        "tower: {} layers ({} shared + {} residual), {} codebooks x {} codes, intermediate {}, {:?} with {} backbone codebooks",
        d.tower_layers(),
        d.tower_shared_layers,
        d.tower_residual_layers(),
        d.codebooks,
        d.codebook_vocab,
        d.tower_intermediate,
        c.audio_decoder_config.vq_feature_placement,
        d.vq_backbone_codebooks
    );
    let _ = writeln!(
        o,
        "codec: latent {}, codebooks {} + {}x{} of dim {}, decoder width {}, encoder width {}, transformers {}/{}/{} layers, {} samples per frame",
        k.latent,
        k.semantic_codebook_size,
        k.residual_codebooks,
        k.residual_codebook_size,
        k.codebook_dim,
        k.decoder_dim,
        k.encoder_dim,
        k.encoder_transformer_layers,
        k.pre_module_layers,
        k.post_module_layers,
        k.samples_per_frame()
    );
    let _ = writeln!(
        o,
        "tokenizer: {} ids; <|im_start|>={} <|im_end|>={} (eos) <|voice|>={} semantic {}..={} speakers {}..={}",
        s.vocab_len, s.im_start, s.im_end, s.voice, s.semantic_start, s.semantic_end, s.speakers[0], s.speakers[15]
    );
    let mut by_dtype: BTreeMap<Dtype, (usize, usize)> = BTreeMap::new();
    for (_, view) in ckpt.shards.names().filter_map(|n| ckpt.shards.get(n)) {
        let e = by_dtype.entry(view.dtype).or_default();
        e.0 += 1;
        e.1 += view.bytes.len();
    }
    let shards = ckpt.shards.shard_paths().count();
    let _ = writeln!(o, "shards: {} tensors in {} files", ckpt.shards.names().count(), shards);
    for (dtype, (n, bytes)) in &by_dtype {
        let _ = writeln!(o, "  {dtype:>8}: {n:>6} tensors, {}", human(*bytes));
    }
    let codec_params = ckpt.codec.tensors().filter(|(n, _)| !CODEC_IGNORED_BUFFERS.contains(n)).count();
    let _ = writeln!(
        o,
        "codec.pth: {} parameters, {} ignored buffers present",
        codec_params,
        ckpt.codec.tensors().count() - codec_params
    );
    let b = device_budget(ckpt, context_length);
    let _ = writeln!(o, "device memory (context {context_length} rows):");
    let _ = writeln!(o, "  model weights      {}", human(b.model_weights));
    let _ = writeln!(o, "  codec decode fp16  {}", human(b.codec_weights));
    let _ = writeln!(o, "  kv cache/request   {}", human(b.kv_cache_per_request));
    let _ = writeln!(o, "  gdn state/request  {}", human(b.recurrent_state_per_request));
    let _ = writeln!(o, "  total, 1 request   {}", human(b.total(1)));
    o
}

/// Bytes in binary units with two decimals.
pub fn human(bytes: usize) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 { format!("{bytes} B") } else { format!("{v:.2} {}", UNITS[u]) }
}
