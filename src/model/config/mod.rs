//! `config.json` of a `fish_omni` checkpoint as typed structures (`model.md` §2), parsed with
//! the JSON path of any type error, validated against the rules the reference enforces
//! (`validate.rs`), and the dimensions the rest of the program derives from it.

mod validate;

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use validate::ConfigError;

/// The whole `config.json`. Unknown keys are kept in `other` so `inspect` can show them and
/// the checkpoint writer can round-trip a config unchanged.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ModelConfig {
    pub model_type: String,
    #[serde(default)]
    pub architectures: Vec<String>,
    pub text_config: TextConfig,
    pub audio_decoder_config: AudioDecoderConfig,
    #[serde(default)]
    pub audio_encoder_config: Option<Value>,
    pub semantic_start_token_id: u32,
    pub semantic_end_token_id: u32,
    pub eos_token_id: u32,
    pub speech_template_version: String,
    #[serde(default = "one")]
    pub fish_schema_version: u32,
    #[serde(default)]
    pub extra_samplable_token_ids: Vec<u32>,
    pub quantization_config: QuantizationConfig,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

/// The Qwen3.5-MoE backbone (`model.md` §2.2).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TextConfig {
    pub model_type: String,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub layer_types: Vec<LayerType>,
    pub mlp_layer_types: Vec<String>,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub rope_parameters: RopeParameters,
    pub rms_norm_eps: f64,
    pub max_position_embeddings: usize,
    pub linear_num_key_heads: usize,
    pub linear_num_value_heads: usize,
    pub linear_key_head_dim: usize,
    pub linear_value_head_dim: usize,
    pub linear_conv_kernel_dim: usize,
    pub num_experts: usize,
    pub num_experts_per_tok: usize,
    pub moe_intermediate_size: usize,
    pub shared_expert_intermediate_size: usize,
    #[serde(default = "yes")]
    pub norm_topk_prob: bool,
    #[serde(default = "silu")]
    pub hidden_act: String,
    #[serde(default = "yes")]
    pub attn_output_gate: bool,
    /// The reference defaults this to false, so a config without it is refused.
    #[serde(default)]
    pub layernorm_zero_centered_gamma: bool,
    #[serde(default)]
    pub rotary_interleaved: bool,
    #[serde(default = "yes")]
    pub use_qk_norm: bool,
    #[serde(default = "yes")]
    pub shared_expert_gate: bool,
    #[serde(default)]
    pub mtp_num_hidden_layers: usize,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

/// Mixer kind of one backbone layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LayerType {
    /// Gated DeltaNet.
    LinearAttention,
    /// Gated full (softmax) attention.
    FullAttention,
}

impl LayerType {
    /// The spelling `config.json` uses.
    pub fn as_str(self) -> &'static str {
        match self {
            LayerType::LinearAttention => "linear_attention",
            LayerType::FullAttention => "full_attention",
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RopeParameters {
    #[serde(default = "default_rope")]
    pub rope_type: String,
    pub rope_theta: f64,
    /// The reference defaults this to 1.0 (full rotary) when absent.
    #[serde(default = "one_f64")]
    pub partial_rotary_factor: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mrope_section: Option<Value>,
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

/// The Codebook-MTP tower (`model.md` §2.3).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct AudioDecoderConfig {
    #[serde(default = "audio_decoder_model_type")]
    pub model_type: String,
    pub decoder_type: String,
    pub num_codebooks: usize,
    pub vocab_size: usize,
    pub shared_enrichment_layers: usize,
    pub n_layer: usize,
    pub dim: usize,
    pub text_dim: usize,
    pub n_head: usize,
    pub n_local_heads: usize,
    pub head_dim: usize,
    pub intermediate_size: usize,
    pub norm_eps: f64,
    pub rope_base: f64,
    pub rotary_percent: f64,
    /// Stored but ignored: the tower always uses interleaved RoPE (`model.md` §2.3).
    #[serde(default)]
    pub rotary_interleaved: bool,
    /// Stored but ignored: q/k norm is always applied (`model.md` §2.3).
    #[serde(default)]
    pub attention_qk_norm: bool,
    pub attention_output_gate: bool,
    #[serde(default)]
    pub layernorm_zero_centered_gamma: bool,
    #[serde(default)]
    pub attention_qkv_bias: bool,
    #[serde(default)]
    pub attention_o_bias: bool,
    #[serde(default)]
    pub use_moe: bool,
    #[serde(default)]
    pub mtp_use_swa: bool,
    #[serde(default)]
    pub dropout: f64,
    pub max_seq_len: usize,
    #[serde(default = "all_vq")]
    pub vq_feature_scope: String,
    pub vq_feature_placement: VqFeaturePlacement,
    #[serde(default)]
    pub vq_backbone_codebooks: usize,
    #[serde(default)]
    pub mtp_spec: Option<MtpSpec>,
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

/// Where the residual codebooks' embeddings enter the model (`model.md` §5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VqFeaturePlacement {
    /// c1..ck are summed into the backbone input; the rest into tower layer 0.
    BackbonePartial,
    /// Nothing enters the backbone input; all residual codes go into tower layer 0.
    MtpSharedPre,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MtpSpec {
    pub attention_variant: String,
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

/// Block-FP8 routed experts (`model.md` §3.4).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct QuantizationConfig {
    pub quant_method: String,
    pub activation_scheme: String,
    pub weight_block_size: Vec<usize>,
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

fn yes() -> bool {
    true
}

fn silu() -> String {
    "silu".to_owned()
}

fn default_rope() -> String {
    "default".to_owned()
}

fn one() -> u32 {
    1
}

fn one_f64() -> f64 {
    1.0
}

fn audio_decoder_model_type() -> String {
    "fish_qwen3_audio_decoder".to_owned()
}

fn all_vq() -> String {
    "all_vq".to_owned()
}

impl ModelConfig {
    /// Reads, parses and validates `config.json`.
    pub fn from_file(path: &Path) -> Result<ModelConfig, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::Io { path: path.display().to_string(), message: e.to_string() })?;
        Self::from_json(&text)
    }

    /// Parses and validates a `config.json` text.
    pub fn from_json(text: &str) -> Result<ModelConfig, ConfigError> {
        let de = &mut serde_json::Deserializer::from_str(text);
        let cfg: ModelConfig = serde_path_to_error::deserialize(de).map_err(parse_error)?;
        cfg.validate()?;
        Ok(cfg)
    }

    pub fn to_json_pretty(&self) -> String {
        serde_json::to_string_pretty(self).expect("config serialises")
    }

    /// Dimensions derived from the config; valid only after `validate`.
    pub fn dims(&self) -> Dims {
        Dims::from_config(self)
    }
}

/// Names the offending key; for a missing field serde reports the enclosing object, so the
/// field is appended to make the path name the key itself.
fn parse_error(e: serde_path_to_error::Error<serde_json::Error>) -> ConfigError {
    let mut key = e.path().to_string();
    let message = e.inner().to_string();
    if let Some(field) = message.strip_prefix("missing field `").and_then(|m| m.split('`').next()) {
        key = if key == "." { field.to_owned() } else { format!("{key}.{field}") };
    }
    let message = message.split(" at line ").next().unwrap_or(&message).to_owned();
    ConfigError::Parse { key, message }
}

/// Every dimension the model code needs, derived once from a validated config.
#[derive(Clone, Debug, PartialEq)]
pub struct Dims {
    pub hidden: usize,
    pub vocab: usize,
    pub layers: usize,
    pub layer_types: Vec<LayerType>,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Rotary dims per head (`head_dim × partial_rotary_factor`), backbone and tower alike.
    pub rotary_dim: usize,
    pub gdn_key_heads: usize,
    pub gdn_value_heads: usize,
    pub gdn_key_dim: usize,
    pub gdn_value_dim: usize,
    pub gdn_conv_kernel: usize,
    pub experts: usize,
    pub experts_per_token: usize,
    pub expert_intermediate: usize,
    pub shared_expert_intermediate: usize,
    pub fp8_block: [usize; 2],
    pub codebooks: usize,
    /// Size of each codebook's code space and of the semantic band.
    pub codebook_vocab: usize,
    pub tower_shared_layers: usize,
    pub tower_intermediate: usize,
    pub tower_rotary_dim: usize,
    pub vq_backbone_codebooks: usize,
    pub semantic_start: u32,
    pub eos: u32,
}

impl Dims {
    fn from_config(c: &ModelConfig) -> Dims {
        let t = &c.text_config;
        let a = &c.audio_decoder_config;
        let b = &c.quantization_config.weight_block_size;
        Dims {
            hidden: t.hidden_size,
            vocab: t.vocab_size,
            layers: t.num_hidden_layers,
            layer_types: t.layer_types.clone(),
            heads: t.num_attention_heads,
            kv_heads: t.num_key_value_heads,
            head_dim: t.head_dim,
            rotary_dim: rotary_dim(t.head_dim, t.rope_parameters.partial_rotary_factor),
            gdn_key_heads: t.linear_num_key_heads,
            gdn_value_heads: t.linear_num_value_heads,
            gdn_key_dim: t.linear_key_head_dim,
            gdn_value_dim: t.linear_value_head_dim,
            gdn_conv_kernel: t.linear_conv_kernel_dim,
            experts: t.num_experts,
            experts_per_token: t.num_experts_per_tok,
            expert_intermediate: t.moe_intermediate_size,
            shared_expert_intermediate: t.shared_expert_intermediate_size,
            fp8_block: [b[0], b[1]],
            codebooks: a.num_codebooks,
            codebook_vocab: a.vocab_size,
            tower_shared_layers: a.shared_enrichment_layers,
            tower_intermediate: a.intermediate_size,
            tower_rotary_dim: rotary_dim(a.head_dim, a.rotary_percent),
            vq_backbone_codebooks: a.vq_backbone_codebooks,
            semantic_start: c.semantic_start_token_id,
            eos: c.eos_token_id,
        }
    }

    /// Channels of the GDN q|k|v projection and of its causal conv.
    pub fn gdn_qkv_dim(&self) -> usize {
        2 * self.gdn_key_heads * self.gdn_key_dim + self.gdn_value_heads * self.gdn_value_dim
    }

    /// Channels of the GDN output gate `z` and of the mixer output before `out_proj`.
    pub fn gdn_value_total(&self) -> usize {
        self.gdn_value_heads * self.gdn_value_dim
    }

    /// Rows of the backbone `q_proj`: per head a query block then a gate block.
    pub fn attn_q_proj_rows(&self) -> usize {
        2 * self.heads * self.head_dim
    }

    pub fn attn_kv_dim(&self) -> usize {
        self.kv_heads * self.head_dim
    }

    pub fn attn_out_dim(&self) -> usize {
        self.heads * self.head_dim
    }

    /// Rows of a tower layer's fused `wqkv`: [all Q | all gates | K | V].
    pub fn tower_qkv_rows(&self) -> usize {
        2 * self.heads * self.head_dim + 2 * self.kv_heads * self.head_dim
    }

    /// Shared enrichment layers plus one residual layer per codebook after the first.
    pub fn tower_layers(&self) -> usize {
        self.tower_shared_layers + self.codebooks - 1
    }

    pub fn tower_residual_layers(&self) -> usize {
        self.codebooks - 1
    }

    pub fn is_full_attention(&self, layer: usize) -> bool {
        self.layer_types[layer] == LayerType::FullAttention
    }

    /// Main-token candidates: the semantic band plus EOS.
    pub fn restricted_head_rows(&self) -> usize {
        self.codebook_vocab + 1
    }
}

/// `head_dim × factor`, the rotary width per head.
pub fn rotary_dim(head_dim: usize, factor: f64) -> usize {
    (head_dim as f64 * factor).round() as usize
}

#[cfg(test)]
mod tests;
