use serde_json::{Value, json};

use super::*;
use crate::synth::presets::{Preset, TokenIds, model_config};

fn ids() -> TokenIds {
    TokenIds { semantic_start: 1000, eos: 990, tokenizer_len: 1300 }
}

fn tiny_json() -> Value {
    serde_json::to_value(model_config(&Preset::Tiny.dims(), &ids(), 1)).unwrap()
}

/// Applies `edit` to the tiny config and returns the refusal message.
fn refusal(edit: impl FnOnce(&mut Value)) -> String {
    let mut v = tiny_json();
    edit(&mut v);
    ModelConfig::from_json(&v.to_string()).expect_err("config must be refused").to_string()
}

#[test]
fn presets_are_valid_and_round_trip() {
    for preset in [Preset::Tiny, Preset::Full] {
        let cfg = model_config(&preset.dims(), &ids(), 1);
        cfg.validate().unwrap();
        let back = ModelConfig::from_json(&cfg.to_json_pretty()).unwrap();
        assert_eq!(back.to_json_pretty(), cfg.to_json_pretty());
    }
}

#[test]
fn full_preset_has_the_published_dimensions() {
    let d = model_config(&Preset::Full.dims(), &ids(), 1).dims();
    assert_eq!((d.hidden, d.layers, d.heads, d.kv_heads, d.head_dim), (2048, 40, 16, 2, 256));
    assert_eq!(d.gdn_qkv_dim(), 8192);
    assert_eq!(d.attn_q_proj_rows(), 8192);
    assert_eq!(d.tower_qkv_rows(), 9216);
    assert_eq!(d.tower_layers(), 13);
    assert_eq!(d.rotary_dim, 64);
    assert_eq!(d.restricted_head_rows(), 4097);
    let full: Vec<usize> = (0..40).filter(|&l| d.is_full_attention(l)).collect();
    assert_eq!(full, (0..10).map(|i| 4 * i + 3).collect::<Vec<_>>());
}

#[test]
fn both_text_model_type_spellings_are_accepted() {
    let mut v = tiny_json();
    assert_eq!(v["text_config"]["model_type"], json!("fish_omni_text"));
    v["text_config"]["model_type"] = json!("qwen3_5_moe_text");
    let msg = ModelConfig::from_json(&v.to_string()).unwrap_err().to_string();
    assert!(msg.contains("`text_config.full_attention_interval` must be 4"), "{msg}");
    v["text_config"]["full_attention_interval"] = json!(4);
    ModelConfig::from_json(&v.to_string()).unwrap();
}

#[test]
fn unknown_keys_are_kept() {
    let mut v = tiny_json();
    v["transformers_version"] = json!("5.17.0");
    let cfg = ModelConfig::from_json(&v.to_string()).unwrap();
    assert_eq!(cfg.other["transformers_version"], json!("5.17.0"));
}

#[test]
fn each_rule_is_refused_naming_the_key() {
    type Edit = Box<dyn FnOnce(&mut Value)>;
    let cases: Vec<(&str, Edit)> = vec![
        ("`model_type`", Box::new(|v| v["model_type"] = json!("qwen3"))),
        ("`text_config.model_type`", Box::new(|v| v["text_config"]["model_type"] = json!("llama"))),
        ("`text_config.layer_types[5]`", Box::new(|v| v["text_config"]["layer_types"][5] = json!("full_attention"))),
        (
            "`text_config.layer_types`",
            Box::new(|v| {
                v["text_config"]["layer_types"].as_array_mut().unwrap().pop();
            }),
        ),
        ("`text_config.mlp_layer_types`", Box::new(|v| v["text_config"]["mlp_layer_types"][0] = json!("dense"))),
        ("`quantization_config.quant_method`", Box::new(|v| v["quantization_config"]["quant_method"] = json!("fp8"))),
        (
            "`quantization_config.weight_block_size`",
            Box::new(|v| v["quantization_config"]["weight_block_size"] = json!([64, 64])),
        ),
        (
            "`quantization_config.activation_scheme`",
            Box::new(|v| v["quantization_config"]["activation_scheme"] = json!("static")),
        ),
        ("`tie_word_embeddings`", Box::new(|v| v["tie_word_embeddings"] = json!(true))),
        ("`speech_template_version`", Box::new(|v| v["speech_template_version"] = json!("v2"))),
        ("`extra_samplable_token_ids`", Box::new(|v| v["extra_samplable_token_ids"] = json!([5]))),
        ("`audio_encoder_config`", Box::new(|v| v["audio_encoder_config"] = json!({}))),
        ("`semantic_end_token_id`", Box::new(|v| v["semantic_end_token_id"] = json!(1100))),
        ("`eos_token_id`", Box::new(|v| v["eos_token_id"] = json!(1010))),
        ("`audio_decoder_config.dim`", Box::new(|v| v["audio_decoder_config"]["dim"] = json!(512))),
        ("`audio_decoder_config.n_head`", Box::new(|v| v["audio_decoder_config"]["n_head"] = json!(4))),
        ("`audio_decoder_config.head_dim`", Box::new(|v| v["audio_decoder_config"]["head_dim"] = json!(64))),
        ("`audio_decoder_config.n_layer`", Box::new(|v| v["audio_decoder_config"]["n_layer"] = json!(3))),
        ("`audio_decoder_config.max_seq_len`", Box::new(|v| v["audio_decoder_config"]["max_seq_len"] = json!(12))),
        (
            "`audio_decoder_config.vq_backbone_codebooks`",
            Box::new(|v| v["audio_decoder_config"]["vq_backbone_codebooks"] = json!(10)),
        ),
        (
            "`audio_decoder_config.vq_backbone_codebooks`",
            Box::new(|v| {
                v["audio_decoder_config"]["vq_feature_placement"] = json!("mtp_shared_pre");
            }),
        ),
        (
            "`audio_decoder_config.decoder_type`",
            Box::new(|v| v["audio_decoder_config"]["decoder_type"] = json!("fast_ar")),
        ),
        (
            "`audio_decoder_config.attention_output_gate`",
            Box::new(|v| v["audio_decoder_config"]["attention_output_gate"] = json!(false)),
        ),
        ("`audio_decoder_config.use_moe`", Box::new(|v| v["audio_decoder_config"]["use_moe"] = json!(true))),
        ("`audio_decoder_config.window_size`", Box::new(|v| v["audio_decoder_config"]["window_size"] = json!(64))),
        (
            "`audio_decoder_config.mtp_spec.attention_variant`",
            Box::new(|v| v["audio_decoder_config"]["mtp_spec"]["attention_variant"] = json!("swa")),
        ),
        (
            "`text_config.rope_parameters.mrope_section`",
            Box::new(|v| v["text_config"]["rope_parameters"]["mrope_section"] = json!([11, 11, 10])),
        ),
        (
            "`text_config.rope_parameters.partial_rotary_factor`",
            Box::new(|v| v["text_config"]["rope_parameters"]["partial_rotary_factor"] = json!(0.3)),
        ),
        ("`text_config.num_experts_per_tok`", Box::new(|v| v["text_config"]["num_experts_per_tok"] = json!(9))),
        (
            "`text_config.layernorm_zero_centered_gamma`",
            Box::new(|v| v["text_config"]["layernorm_zero_centered_gamma"] = json!(false)),
        ),
        (
            "`text_config.hidden_size`",
            Box::new(|v| {
                v["text_config"].as_object_mut().unwrap().remove("hidden_size");
            }),
        ),
        ("`text_config.num_experts`", Box::new(|v| v["text_config"]["num_experts"] = json!("many"))),
    ];
    for (key, edit) in cases {
        let msg = refusal(edit);
        assert!(msg.contains(key), "expected {key} in: {msg}");
        assert!(msg.starts_with("config.json"), "{msg}");
    }
}

#[test]
fn layer_pattern_follows_the_first_full_layer() {
    let msg = refusal(|v| v["text_config"]["layer_types"][2] = json!("full_attention"));
    assert_eq!(
        msg,
        "config.json: `text_config.layer_types[3]` must be \"linear_attention\" (full attention every 3 layers), found \"full_attention\""
    );
}

#[test]
fn refusal_states_expected_and_found() {
    let msg = refusal(|v| v["fish_schema_version"] = json!(2));
    assert_eq!(msg, "config.json: `fish_schema_version` must be 1, found 2");
}

#[test]
fn placement_rules_follow_the_reference() {
    let mut v = tiny_json();
    v["audio_decoder_config"]["vq_feature_placement"] = json!("mtp_shared_pre");
    v["audio_decoder_config"]["vq_backbone_codebooks"] = json!(0);
    ModelConfig::from_json(&v.to_string()).unwrap();
    let mut v = tiny_json();
    v["audio_decoder_config"]["vq_backbone_codebooks"] = json!(0);
    assert!(ModelConfig::from_json(&v.to_string()).is_err());
}
