//! The checkpoint presets: `tiny` keeps every ratio and pattern of Drama 3 at small widths
//! (`verification.md`), `full` has the real dimensions (`model.md` §2, values marked INFERRED
//! there are inferred here too).

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::model::config::{
    AudioDecoderConfig, LayerType, ModelConfig, MtpSpec, QuantizationConfig, RopeParameters, TextConfig,
    VqFeaturePlacement,
};
use crate::model::weights::CodecDims;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Preset {
    /// Small widths, every ratio and pattern of the real model; what tests use.
    Tiny,
    /// The real dimensions (about 40 GB): for speed and memory work on a GPU machine.
    Full,
}

/// Everything a preset fixes before the tokenizer assigns ids.
pub struct PresetDims {
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub gdn_key_heads: usize,
    pub gdn_value_heads: usize,
    pub gdn_head_dim: usize,
    pub experts: usize,
    pub experts_per_token: usize,
    pub expert_intermediate: usize,
    pub shared_expert_intermediate: usize,
    pub codebook_vocab: usize,
    pub tower_intermediate: usize,
    pub bpe_merges: usize,
    /// Rows of `embed_tokens` / `lm_head`; at least the tokenizer's size (padded like Qwen).
    pub min_vocab: usize,
    pub codec: CodecDims,
    /// Bytes per shard the writer aims for.
    pub shard_bytes: usize,
}

impl Preset {
    pub fn dims(self) -> PresetDims {
        match self {
            Preset::Tiny => PresetDims {
                hidden: 256,
                layers: 8,
                heads: 8,
                kv_heads: 1,
                head_dim: 32,
                gdn_key_heads: 4,
                gdn_value_heads: 8,
                gdn_head_dim: 32,
                experts: 8,
                experts_per_token: 2,
                expert_intermediate: 384,
                shared_expert_intermediate: 128,
                codebook_vocab: 256,
                tower_intermediate: 640,
                bpe_merges: 700,
                min_vocab: 0,
                codec: CodecDims {
                    latent: 128,
                    codebook_dim: 8,
                    semantic_codebook_size: 256,
                    residual_codebooks: 9,
                    residual_codebook_size: 64,
                    encoder_dim: 8,
                    decoder_dim: 96,
                    transformer_intermediate: 384,
                    pre_module_layers: 8,
                    post_module_layers: 8,
                    encoder_transformer_layers: 4,
                    buffer_positions: 256,
                },
                shard_bytes: 16 << 20,
            },
            Preset::Full => PresetDims {
                hidden: 2048,
                layers: 40,
                heads: 16,
                kv_heads: 2,
                head_dim: 256,
                gdn_key_heads: 16,
                gdn_value_heads: 32,
                gdn_head_dim: 128,
                experts: 256,
                experts_per_token: 8,
                expert_intermediate: 512,
                shared_expert_intermediate: 512,
                codebook_vocab: 4096,
                // UNKNOWN in the real config; `model.md` §3.5 sizes the tower with 6144.
                tower_intermediate: 6144,
                bpe_merges: 30_000,
                // Qwen3.5's 248,320 rows plus Drama 3's added tokens (INFERRED).
                min_vocab: 253_952,
                codec: CodecDims {
                    latent: 1024,
                    codebook_dim: 8,
                    semantic_codebook_size: 4096,
                    residual_codebooks: 9,
                    residual_codebook_size: 1024,
                    encoder_dim: 64,
                    decoder_dim: 1536,
                    transformer_intermediate: 3072,
                    pre_module_layers: 8,
                    post_module_layers: 8,
                    encoder_transformer_layers: 4,
                    buffer_positions: 4096,
                },
                shard_bytes: 5 << 30,
            },
        }
    }
}

/// Token ids the tokenizer assigned, as the config must record them.
pub struct TokenIds {
    pub semantic_start: u32,
    pub eos: u32,
    /// Number of ids the tokenizer defines.
    pub tokenizer_len: usize,
}

/// Builds a complete `config.json` (every key of `model.md` §2) for the preset.
/// `vq_backbone_codebooks` = 0 selects the `mtp_shared_pre` placement.
pub fn model_config(p: &PresetDims, ids: &TokenIds, vq_backbone_codebooks: usize) -> ModelConfig {
    let vocab = ids.tokenizer_len.max(p.min_vocab).next_multiple_of(128);
    let layer_types = (0..p.layers)
        .map(|i| if (i + 1) % 4 == 0 { LayerType::FullAttention } else { LayerType::LinearAttention })
        .collect();
    let placement =
        if vq_backbone_codebooks == 0 { VqFeaturePlacement::MtpSharedPre } else { VqFeaturePlacement::BackbonePartial };
    let num_codebooks = 10;
    ModelConfig {
        model_type: "fish_omni".into(),
        architectures: vec!["FishOmniModel".into()],
        text_config: TextConfig {
            // The published form; sglang-omni runs its Drama 3 checks only on this spelling.
            model_type: "fish_omni_text".into(),
            vocab_size: vocab,
            hidden_size: p.hidden,
            num_hidden_layers: p.layers,
            layer_types,
            mlp_layer_types: vec!["moe".into(); p.layers],
            num_attention_heads: p.heads,
            num_key_value_heads: p.kv_heads,
            head_dim: p.head_dim,
            rope_parameters: RopeParameters {
                rope_type: "default".into(),
                rope_theta: 1e7,
                partial_rotary_factor: 0.25,
                mrope_section: None,
                other: BTreeMap::new(),
            },
            rms_norm_eps: 1e-6,
            max_position_embeddings: 262_144,
            linear_num_key_heads: p.gdn_key_heads,
            linear_num_value_heads: p.gdn_value_heads,
            linear_key_head_dim: p.gdn_head_dim,
            linear_value_head_dim: p.gdn_head_dim,
            linear_conv_kernel_dim: 4,
            num_experts: p.experts,
            num_experts_per_tok: p.experts_per_token,
            moe_intermediate_size: p.expert_intermediate,
            shared_expert_intermediate_size: p.shared_expert_intermediate,
            norm_topk_prob: true,
            hidden_act: "silu".into(),
            attn_output_gate: true,
            layernorm_zero_centered_gamma: true,
            rotary_interleaved: false,
            use_qk_norm: true,
            shared_expert_gate: true,
            mtp_num_hidden_layers: 0,
            tie_word_embeddings: false,
            other: extra(&[("dtype", json!("bfloat16"))]),
        },
        audio_decoder_config: AudioDecoderConfig {
            model_type: "fish_qwen3_audio_decoder".into(),
            decoder_type: "codebook_mtp_shared".into(),
            num_codebooks,
            vocab_size: p.codebook_vocab,
            shared_enrichment_layers: 4,
            n_layer: 4,
            dim: p.hidden,
            text_dim: p.hidden,
            n_head: p.heads,
            n_local_heads: p.kv_heads,
            head_dim: p.head_dim,
            intermediate_size: p.tower_intermediate,
            norm_eps: 1e-6,
            rope_base: 1e7,
            rotary_percent: 0.25,
            rotary_interleaved: true,
            attention_qk_norm: false,
            attention_output_gate: true,
            layernorm_zero_centered_gamma: true,
            attention_qkv_bias: false,
            attention_o_bias: false,
            use_moe: false,
            mtp_use_swa: false,
            dropout: 0.0,
            max_seq_len: num_codebooks + 1,
            vq_feature_scope: "all_vq".into(),
            vq_feature_placement: placement,
            vq_backbone_codebooks,
            mtp_spec: Some(MtpSpec { attention_variant: "full_attention".into(), other: BTreeMap::new() }),
            other: extra(&[("window_size", Value::Null)]),
        },
        audio_encoder_config: None,
        semantic_start_token_id: ids.semantic_start,
        semantic_end_token_id: ids.semantic_start + p.codebook_vocab as u32 - 1,
        eos_token_id: ids.eos,
        speech_template_version: "reference-bracket-v1".into(),
        fish_schema_version: 1,
        extra_samplable_token_ids: vec![],
        quantization_config: QuantizationConfig {
            quant_method: "bsgemm-moe".into(),
            activation_scheme: "dynamic".into(),
            weight_block_size: vec![128, 128],
            other: BTreeMap::new(),
        },
        tie_word_embeddings: false,
        other: extra(&[("torch_dtype", json!("bfloat16"))]),
    }
}

fn extra(pairs: &[(&str, Value)]) -> BTreeMap<String, Value> {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), v.clone())).collect()
}
