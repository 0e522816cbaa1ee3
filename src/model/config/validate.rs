//! The rules a `fish_omni` config must satisfy before anything is loaded (`model.md` §2).
//! Each violated rule is refused with the key, what was expected and what was found.

use std::fmt::Display;

use super::{LayerType, ModelConfig, VqFeaturePlacement, rotary_dim};

/// Why a `config.json` was refused.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ConfigError {
    #[error("config.json: cannot read {path}: {message}")]
    Io { path: String, message: String },
    #[error("config.json: `{key}`: {message}")]
    Parse { key: String, message: String },
    #[error("config.json: `{key}` must be {expected}, found {found}")]
    Rule { key: String, expected: String, found: String },
}

fn rule(key: impl Into<String>, expected: impl Into<String>, found: impl Display) -> ConfigError {
    ConfigError::Rule { key: key.into(), expected: expected.into(), found: found.to_string() }
}

/// Checks `actual == expected`, reporting both in the config's own spelling.
fn equal<T: PartialEq + std::fmt::Debug>(key: &str, actual: &T, expected: &T) -> Result<(), ConfigError> {
    if actual == expected { Ok(()) } else { Err(rule(key, format!("{expected:?}"), format!("{actual:?}"))) }
}

fn check(ok: bool, key: &str, expected: impl Into<String>, found: impl Display) -> Result<(), ConfigError> {
    if ok { Ok(()) } else { Err(rule(key, expected, found)) }
}

impl ModelConfig {
    /// Validates every rule; the first violation is returned.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_top_level()?;
        self.validate_text()?;
        self.validate_tower()
    }

    fn validate_top_level(&self) -> Result<(), ConfigError> {
        equal("model_type", &self.model_type.as_str(), &"fish_omni")?;
        if !self.architectures.is_empty() {
            check(
                self.architectures.iter().any(|a| a == "FishOmniModel"),
                "architectures",
                "a list containing \"FishOmniModel\"",
                format!("{:?}", self.architectures),
            )?;
        }
        check(
            self.audio_encoder_config.as_ref().is_none_or(|v| v.is_null()),
            "audio_encoder_config",
            "null or absent",
            "a value",
        )?;
        equal("speech_template_version", &self.speech_template_version.as_str(), &"reference-bracket-v1")?;
        equal("fish_schema_version", &self.fish_schema_version, &1)?;
        check(
            self.extra_samplable_token_ids.is_empty(),
            "extra_samplable_token_ids",
            "empty",
            format!("{:?}", self.extra_samplable_token_ids),
        )?;
        check(!self.tie_word_embeddings, "tie_word_embeddings", "false (a separate lm_head is required)", true)?;
        let q = &self.quantization_config;
        equal("quantization_config.quant_method", &q.quant_method.as_str(), &"bsgemm-moe")?;
        equal("quantization_config.activation_scheme", &q.activation_scheme.as_str(), &"dynamic")?;
        equal("quantization_config.weight_block_size", &q.weight_block_size, &vec![128, 128])?;
        self.validate_token_ids()
    }

    fn validate_token_ids(&self) -> Result<(), ConfigError> {
        let (start, end, eos) = (self.semantic_start_token_id, self.semantic_end_token_id, self.eos_token_id);
        let band = self.audio_decoder_config.vocab_size;
        check(
            end >= start && (end - start) as usize + 1 == band,
            "semantic_end_token_id",
            format!("semantic_start_token_id + audio_decoder_config.vocab_size - 1 = {}", start as usize + band - 1),
            end,
        )?;
        let vocab = self.text_config.vocab_size;
        check((end as usize) < vocab, "semantic_end_token_id", format!("< text_config.vocab_size ({vocab})"), end)?;
        check(eos < start || eos > end, "eos_token_id", format!("outside the semantic band {start}..={end}"), eos)?;
        check((eos as usize) < vocab, "eos_token_id", format!("< text_config.vocab_size ({vocab})"), eos)
    }

    fn validate_text(&self) -> Result<(), ConfigError> {
        let t = &self.text_config;
        check(
            t.model_type == "fish_omni_text" || t.model_type == "qwen3_5_moe_text",
            "text_config.model_type",
            "\"fish_omni_text\" or \"qwen3_5_moe_text\"",
            format!("{:?}", t.model_type),
        )?;
        check(t.num_hidden_layers > 0, "text_config.num_hidden_layers", "at least 1", t.num_hidden_layers)?;
        let interval = self.validate_layer_pattern()?;
        if t.model_type == "qwen3_5_moe_text" {
            // The re-saved (non-published) spelling carries the interval explicitly, and the
            // reference cannot load it without.
            let found = t.other.get("full_attention_interval");
            check(
                found.and_then(serde_json::Value::as_u64) == Some(interval as u64),
                "text_config.full_attention_interval",
                format!("{interval} (required with model_type \"qwen3_5_moe_text\")"),
                found.map_or("nothing".to_owned(), |v| v.to_string()),
            )?;
        }
        equal("text_config.mlp_layer_types", &t.mlp_layer_types, &vec!["moe".to_owned(); t.num_hidden_layers])?;
        equal("text_config.hidden_act", &t.hidden_act.as_str(), &"silu")?;
        equal("text_config.attn_output_gate", &t.attn_output_gate, &true)?;
        equal("text_config.layernorm_zero_centered_gamma", &t.layernorm_zero_centered_gamma, &true)?;
        equal("text_config.rotary_interleaved", &t.rotary_interleaved, &false)?;
        equal("text_config.use_qk_norm", &t.use_qk_norm, &true)?;
        equal("text_config.shared_expert_gate", &t.shared_expert_gate, &true)?;
        equal("text_config.mtp_num_hidden_layers", &t.mtp_num_hidden_layers, &0)?;
        check(!t.tie_word_embeddings, "text_config.tie_word_embeddings", "false", true)?;
        let r = &t.rope_parameters;
        equal("text_config.rope_parameters.rope_type", &r.rope_type.as_str(), &"default")?;
        check(r.mrope_section.is_none(), "text_config.rope_parameters.mrope_section", "absent (1-D RoPE)", "a value")?;
        check_rotary("text_config.rope_parameters.partial_rotary_factor", t.head_dim, r.partial_rotary_factor)?;
        check(r.rope_theta > 0.0, "text_config.rope_parameters.rope_theta", "positive", r.rope_theta)?;
        check(t.rms_norm_eps > 0.0, "text_config.rms_norm_eps", "positive", t.rms_norm_eps)?;
        positive(&[
            ("text_config.hidden_size", t.hidden_size),
            ("text_config.vocab_size", t.vocab_size),
            ("text_config.head_dim", t.head_dim),
            ("text_config.num_key_value_heads", t.num_key_value_heads),
            ("text_config.linear_num_key_heads", t.linear_num_key_heads),
            ("text_config.linear_key_head_dim", t.linear_key_head_dim),
            ("text_config.linear_value_head_dim", t.linear_value_head_dim),
            ("text_config.linear_conv_kernel_dim", t.linear_conv_kernel_dim),
            ("text_config.num_experts_per_tok", t.num_experts_per_tok),
            ("text_config.moe_intermediate_size", t.moe_intermediate_size),
            ("text_config.shared_expert_intermediate_size", t.shared_expert_intermediate_size),
            ("text_config.max_position_embeddings", t.max_position_embeddings),
        ])?;
        check(
            t.num_attention_heads.is_multiple_of(t.num_key_value_heads) && t.num_attention_heads > 0,
            "text_config.num_attention_heads",
            format!("a positive multiple of num_key_value_heads ({})", t.num_key_value_heads),
            t.num_attention_heads,
        )?;
        check(
            t.linear_num_value_heads.is_multiple_of(t.linear_num_key_heads) && t.linear_num_value_heads > 0,
            "text_config.linear_num_value_heads",
            format!("a positive multiple of linear_num_key_heads ({})", t.linear_num_key_heads),
            t.linear_num_value_heads,
        )?;
        check(
            t.moe_intermediate_size.is_multiple_of(128),
            "text_config.moe_intermediate_size",
            "a multiple of 128 (the FP8 weight block)",
            t.moe_intermediate_size,
        )?;
        self.validate_text_rope_mirrors()?;
        if let Some(count) = t.other.get("tower_layer_count") {
            let a = &self.audio_decoder_config;
            let want = a.shared_enrichment_layers + a.num_codebooks - 1;
            check(count.as_u64() == Some(want as u64), "text_config.tower_layer_count", format!("{want}"), count)?;
        }
        check(
            t.num_experts_per_tok <= t.num_experts,
            "text_config.num_experts_per_tok",
            format!("at most num_experts ({})", t.num_experts),
            t.num_experts_per_tok,
        )
    }

    /// Text-level `rope_theta`, `partial_rotary_factor` and `rope_scaling`, when present, must
    /// repeat what `rope_parameters` says (the reference refuses a disagreement).
    fn validate_text_rope_mirrors(&self) -> Result<(), ConfigError> {
        let t = &self.text_config;
        let r = &t.rope_parameters;
        let mirrors = [
            ("rope_theta", serde_json::json!(r.rope_theta)),
            ("partial_rotary_factor", serde_json::json!(r.partial_rotary_factor)),
            ("rope_scaling", serde_json::to_value(r).expect("rope parameters serialise")),
        ];
        for (key, want) in mirrors {
            if let Some(v) = t.other.get(key) {
                let same = match (v.as_f64(), want.as_f64()) {
                    (Some(a), Some(b)) => a == b,
                    _ => *v == want,
                };
                check(
                    same || v.is_null(),
                    &format!("text_config.{key}"),
                    format!("equal to rope_parameters ({want})"),
                    v,
                )?;
            }
        }
        Ok(())
    }

    /// Gated DeltaNet layers with every `interval`-th layer full attention, where the interval is
    /// the index of the first full-attention layer plus one (the reference's
    /// `full_attention_interval`); the published model uses 4.
    /// Returns the interval.
    fn validate_layer_pattern(&self) -> Result<usize, ConfigError> {
        let t = &self.text_config;
        check(
            t.layer_types.len() == t.num_hidden_layers,
            "text_config.layer_types",
            format!("a list of num_hidden_layers ({}) entries", t.num_hidden_layers),
            format!("{} entries", t.layer_types.len()),
        )?;
        let Some(first_full) = t.layer_types.iter().position(|l| *l == LayerType::FullAttention) else {
            return Err(rule("text_config.layer_types", "at least one \"full_attention\" layer", "none"));
        };
        let interval = first_full + 1;
        for (i, kind) in t.layer_types.iter().enumerate() {
            let want = if (i + 1) % interval == 0 { LayerType::FullAttention } else { LayerType::LinearAttention };
            if *kind != want {
                return Err(rule(
                    format!("text_config.layer_types[{i}]"),
                    format!("\"{}\" (full attention every {interval} layers)", want.as_str()),
                    format!("\"{}\"", kind.as_str()),
                ));
            }
        }
        Ok(interval)
    }

    fn validate_tower(&self) -> Result<(), ConfigError> {
        let a = &self.audio_decoder_config;
        let t = &self.text_config;
        equal("audio_decoder_config.model_type", &a.model_type.as_str(), &"fish_qwen3_audio_decoder")?;
        equal("audio_decoder_config.decoder_type", &a.decoder_type.as_str(), &"codebook_mtp_shared")?;
        check(a.num_codebooks >= 2, "audio_decoder_config.num_codebooks", "at least 2", a.num_codebooks)?;
        check(a.vocab_size > 0, "audio_decoder_config.vocab_size", "positive", a.vocab_size)?;
        check(
            a.shared_enrichment_layers > 0,
            "audio_decoder_config.shared_enrichment_layers",
            "positive",
            a.shared_enrichment_layers,
        )?;
        equal("audio_decoder_config.n_layer", &a.n_layer, &a.shared_enrichment_layers)?;
        equal("audio_decoder_config.dim", &a.dim, &t.hidden_size)?;
        equal("audio_decoder_config.text_dim", &a.text_dim, &t.hidden_size)?;
        equal("audio_decoder_config.n_head", &a.n_head, &t.num_attention_heads)?;
        equal("audio_decoder_config.n_local_heads", &a.n_local_heads, &t.num_key_value_heads)?;
        equal("audio_decoder_config.head_dim", &a.head_dim, &t.head_dim)?;
        check(a.intermediate_size > 0, "audio_decoder_config.intermediate_size", "positive", a.intermediate_size)?;
        check(a.norm_eps > 0.0, "audio_decoder_config.norm_eps", "positive", a.norm_eps)?;
        check(a.rope_base > 0.0, "audio_decoder_config.rope_base", "positive", a.rope_base)?;
        check_rotary("audio_decoder_config.rotary_percent", a.head_dim, a.rotary_percent)?;
        equal("audio_decoder_config.attention_output_gate", &a.attention_output_gate, &true)?;
        equal("audio_decoder_config.layernorm_zero_centered_gamma", &a.layernorm_zero_centered_gamma, &true)?;
        equal("audio_decoder_config.attention_qkv_bias", &a.attention_qkv_bias, &false)?;
        equal("audio_decoder_config.attention_o_bias", &a.attention_o_bias, &false)?;
        equal("audio_decoder_config.use_moe", &a.use_moe, &false)?;
        equal("audio_decoder_config.mtp_use_swa", &a.mtp_use_swa, &false)?;
        equal("audio_decoder_config.dropout", &a.dropout, &0.0)?;
        for (key, value) in &a.other {
            if key.starts_with("window_") {
                check(value.is_null(), &format!("audio_decoder_config.{key}"), "null (no sliding window)", value)?;
            }
        }
        equal("audio_decoder_config.max_seq_len", &a.max_seq_len, &(a.num_codebooks + 1))?;
        equal("audio_decoder_config.vq_feature_scope", &a.vq_feature_scope.as_str(), &"all_vq")?;
        let k = a.vq_backbone_codebooks;
        match a.vq_feature_placement {
            VqFeaturePlacement::BackbonePartial => check(
                (1..a.num_codebooks).contains(&k),
                "audio_decoder_config.vq_backbone_codebooks",
                format!("in 1..={} with vq_feature_placement \"backbone_partial\"", a.num_codebooks - 1),
                k,
            )?,
            VqFeaturePlacement::MtpSharedPre => check(
                k == 0,
                "audio_decoder_config.vq_backbone_codebooks",
                "0 with vq_feature_placement \"mtp_shared_pre\"",
                k,
            )?,
        }
        if let Some(spec) = &a.mtp_spec {
            equal(
                "audio_decoder_config.mtp_spec.attention_variant",
                &spec.attention_variant.as_str(),
                &"full_attention",
            )?;
            for key in spec.other.keys() {
                check(
                    !key.contains("moe"),
                    &format!("audio_decoder_config.mtp_spec.{key}"),
                    "absent (no MoE in the tower)",
                    "present",
                )?;
            }
        }
        Ok(())
    }
}

fn positive(values: &[(&str, usize)]) -> Result<(), ConfigError> {
    values.iter().try_for_each(|&(key, v)| check(v > 0, key, "positive", v))
}

/// The rotary width `head_dim × factor` must be a positive even whole number of dims.
fn check_rotary(key: &str, head_dim: usize, factor: f64) -> Result<(), ConfigError> {
    let dims = head_dim as f64 * factor;
    let rot = rotary_dim(head_dim, factor);
    check(
        factor > 0.0 && factor <= 1.0 && (dims - rot as f64).abs() < 1e-9 && rot.is_multiple_of(2),
        key,
        format!("in (0, 1] giving an even whole number of rotary dims of head_dim {head_dim}"),
        factor,
    )
}
