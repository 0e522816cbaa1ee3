use std::collections::{BTreeMap, BTreeSet};

use super::*;
use crate::synth::presets::{Preset, TokenIds, model_config};

fn specs(preset: Preset) -> Vec<TensorSpec> {
    let ids = TokenIds { semantic_start: 1000, eos: 990, tokenizer_len: 1300 };
    let cfg = model_config(&preset.dims(), &ids, 1);
    let mut rec = SpecRecorder::default();
    model_weights(&cfg.dims(), &mut rec).unwrap();
    rec.specs
}

fn shapes(specs: &[TensorSpec]) -> BTreeMap<String, Vec<usize>> {
    specs.iter().map(|s| (s.name.clone(), s.shape.clone())).collect()
}

#[test]
fn names_are_unique_and_in_model_namespaces() {
    for preset in [Preset::Tiny, Preset::Full] {
        let s = specs(preset);
        let unique: BTreeSet<&str> = s.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(unique.len(), s.len());
        assert!(s.iter().all(|s| in_model_namespace(&s.name)));
    }
}

#[test]
fn full_preset_matches_the_published_shapes() {
    let s = specs(Preset::Full);
    let m = shapes(&s);
    let l = "model.language_model.layers";
    let expect: &[(&str, &[usize])] = &[
        ("model.language_model.embed_tokens.weight", &[253_952, 2048]),
        ("lm_head.weight", &[253_952, 2048]),
        ("model.language_model.norm.weight", &[2048]),
        (&format!("{l}.0.linear_attn.in_proj_qkv.weight"), &[8192, 2048]),
        (&format!("{l}.0.linear_attn.in_proj_z.weight"), &[4096, 2048]),
        (&format!("{l}.0.linear_attn.in_proj_b.weight"), &[32, 2048]),
        (&format!("{l}.0.linear_attn.in_proj_a.weight"), &[32, 2048]),
        (&format!("{l}.0.linear_attn.conv1d.weight"), &[8192, 1, 4]),
        (&format!("{l}.0.linear_attn.dt_bias"), &[32]),
        (&format!("{l}.0.linear_attn.A_log"), &[32]),
        (&format!("{l}.0.linear_attn.norm.weight"), &[128]),
        (&format!("{l}.0.linear_attn.out_proj.weight"), &[2048, 4096]),
        (&format!("{l}.3.self_attn.q_proj.weight"), &[8192, 2048]),
        (&format!("{l}.3.self_attn.k_proj.weight"), &[512, 2048]),
        (&format!("{l}.3.self_attn.v_proj.weight"), &[512, 2048]),
        (&format!("{l}.3.self_attn.o_proj.weight"), &[2048, 4096]),
        (&format!("{l}.3.self_attn.q_norm.weight"), &[256]),
        (&format!("{l}.39.self_attn.k_norm.weight"), &[256]),
        (&format!("{l}.0.mlp.gate.weight"), &[256, 2048]),
        (&format!("{l}.0.mlp.experts.255.gate_proj.weight"), &[512, 2048]),
        (&format!("{l}.0.mlp.experts.0.gate_proj.weight_scale_inv"), &[4, 16]),
        (&format!("{l}.0.mlp.experts.0.up_proj.weight_scale_inv"), &[4, 16]),
        (&format!("{l}.0.mlp.experts.0.down_proj.weight"), &[2048, 512]),
        (&format!("{l}.0.mlp.experts.0.down_proj.weight_scale_inv"), &[16, 4]),
        (&format!("{l}.0.mlp.shared_expert.gate_proj.weight"), &[512, 2048]),
        (&format!("{l}.0.mlp.shared_expert.down_proj.weight"), &[2048, 512]),
        (&format!("{l}.0.mlp.shared_expert_gate.weight"), &[1, 2048]),
        ("audio_decoder.codebook_embeddings.weight", &[40_960, 2048]),
        ("audio_decoder_mtp_shared.layers.3.semantic_embedding.weight", &[4096, 2048]),
        ("audio_decoder_mtp.layers.8.codebook_embedding.weight", &[4096, 2048]),
        ("audio_decoder_mtp.layers.0.eh_proj.weight", &[2048, 4096]),
        ("audio_decoder_mtp.layers.0.transformer_layer.attention.wqkv.weight", &[9216, 2048]),
        ("audio_decoder_mtp.layers.0.transformer_layer.attention.wo.weight", &[2048, 4096]),
        ("audio_decoder_mtp_shared.layers.0.transformer_layer.feed_forward.w2.weight", &[2048, 6144]),
        ("audio_decoder_mtp_shared.layers.0.final_layernorm.weight", &[2048]),
        ("audio_decoder_mtp.heads.8.weight", &[4096, 2048]),
    ];
    for (name, shape) in expect {
        assert_eq!(m.get(*name).map(Vec::as_slice), Some(*shape), "{name}");
    }
    assert!(!m.contains_key("audio_decoder_mtp.heads.9.weight"));
    assert!(!m.contains_key(&format!("{l}.3.linear_attn.A_log")));
    let experts = s.iter().filter(|s| s.accept == Accept::Fp8E4M3).count();
    assert_eq!(experts, 40 * 256 * 3);
    let fp8_bytes: usize = s.iter().filter(|s| s.accept == Accept::Fp8E4M3).map(|s| s.stored_bytes()).sum();
    assert_eq!(fp8_bytes, 40 * 256 * 3 * 512 * 2048);
}

#[test]
fn full_codec_table_is_exactly_the_reference_state_dict() {
    let reference: BTreeMap<String, Vec<usize>> = include_str!("../../../tests/fixtures/codec-keys.tsv")
        .lines()
        .map(|line| {
            let mut cols = line.split('\t');
            let name = cols.next().unwrap().to_owned();
            let shape = cols.next().unwrap().trim_matches(['[', ']']).split(", ").map(|d| d.parse().unwrap()).collect();
            (name, shape)
        })
        .collect();
    assert_eq!(reference.len(), 535);
    let mut rec = SpecRecorder::default();
    codec_weights(&Preset::Full.dims().codec, &mut rec).unwrap();
    assert_eq!(shapes(&rec.specs), reference);
}

#[test]
fn codec_dims_are_inferred_back_from_shapes() {
    for preset in [Preset::Tiny, Preset::Full] {
        let dims = CodecDims { buffer_positions: 0, ..preset.dims().codec };
        let mut rec = SpecRecorder::default();
        codec_weights(&dims, &mut rec).unwrap();
        let m = shapes(&rec.specs);
        let inferred = CodecDims::infer("codec.pth", |n| m.get(n).cloned()).unwrap();
        assert_eq!(inferred, dims);
        assert_eq!(inferred.samples_per_frame(), 2048);
    }
}

#[test]
fn weight_norm_tensors_accept_both_spellings() {
    let mut rec = SpecRecorder::default();
    codec_weights(&Preset::Tiny.dims().codec, &mut rec).unwrap();
    let conv = rec.specs.iter().find(|s| s.name == "decoder.model.0.conv.parametrizations.weight.original1").unwrap();
    assert_eq!(conv.alias.as_deref(), Some("decoder.model.0.conv.weight_v"));
    let vq = rec.specs.iter().find(|s| s.name == "quantizer.quantizer.quantizers.0.out_proj.weight_g").unwrap();
    assert_eq!(
        vq.alias.as_deref(),
        Some("quantizer.quantizer.quantizers.0.out_proj.parametrizations.weight.original0")
    );
}
