//! The published layout: a synthesized tiny checkpoint loads, and every malformation is
//! refused with a message naming the file and the tensor or key.

mod common;

use std::path::Path;

use common::{SEED, first_shard, tiny_checkpoint, tiny_plan, write_plan};
use limelight::backend::cpu::Cpu;
use limelight::checkpoint::Dtype;
use limelight::checkpoint::pth::PthArchive;
use limelight::engine::generate::ResidentModel;
use limelight::inspect::summary;
use limelight::model::load::Checkpoint;
use limelight::model::weights::Mixer;
use limelight::synth::fill::tensor_bytes;
use limelight::synth::presets::Preset;
use limelight::synth::{SynthOptions, SynthPlan};
use serde_json::{Value, json};

fn refusal(dir: &Path) -> String {
    match Checkpoint::open(dir) {
        Ok(_) => panic!("checkpoint in {} must be refused", dir.display()),
        Err(e) => e.to_string(),
    }
}

fn assert_contains(msg: &str, parts: &[&str]) {
    for p in parts {
        assert!(msg.contains(p), "expected {p:?} in: {msg}");
    }
}

#[test]
fn tiny_round_trip_loads_with_exact_values() {
    let plan = tiny_plan();
    let dir = write_plan(&plan);
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    assert!(ckpt.shards.shard_paths().count() >= 3, "tiny checkpoints are sharded");
    let weights = ckpt.model_weights().unwrap();
    assert_eq!(weights.backbone.layers.len(), 8);
    assert!(matches!(weights.backbone.layers[3].mixer, Mixer::Attention(_)));
    assert!(matches!(weights.backbone.layers[0].mixer, Mixer::GatedDeltaNet(_)));
    assert_eq!(weights.tower.layers.len(), 13);
    assert_eq!(weights.tower.heads.len(), 9);
    // Every tensor reads back exactly what the writer produced.
    for spec in &plan.model_specs {
        let (_, view) = ckpt.shards.get(&spec.name).unwrap();
        assert_eq!(view.dtype, spec.stored, "{}", spec.name);
        assert!(view.bytes == tensor_bytes(spec, SEED).as_slice(), "{} differs", spec.name);
    }
    for spec in &plan.codec_specs {
        let t = ckpt.codec.get(&spec.name).unwrap();
        assert!(
            ckpt.codec.contiguous_bytes(t).as_ref() == tensor_bytes(spec, SEED).as_slice(),
            "{} differs",
            spec.name
        );
    }
    let codec = ckpt.codec_weights().unwrap();
    assert_eq!(codec.residual_vqs.len(), 9);
    assert_eq!(ckpt.codec_dims.samples_per_frame(), 2048);
}

#[test]
fn synth_is_deterministic_per_seed() {
    let a = tiny_checkpoint();
    let b = tiny_checkpoint();
    for name in ["config.json", "tokenizer.json", "model.safetensors.index.json", "codec.pth"] {
        assert!(
            std::fs::read(a.path().join(name)).unwrap() == std::fs::read(b.path().join(name)).unwrap(),
            "{name} differs"
        );
    }
    assert!(std::fs::read(first_shard(a.path())).unwrap() == std::fs::read(first_shard(b.path())).unwrap());
    let other = SynthPlan::new(&SynthOptions { preset: Preset::Tiny, seed: SEED + 1, vq_backbone_codebooks: 1 });
    let c = write_plan(&other);
    assert!(std::fs::read(first_shard(a.path())).unwrap() != std::fs::read(first_shard(c.path())).unwrap());
}

#[test]
fn both_vq_placements_load() {
    for k in [0, 3, 9] {
        let plan = SynthPlan::new(&SynthOptions { preset: Preset::Tiny, seed: 1, vq_backbone_codebooks: k });
        let dir = write_plan(&plan);
        let ckpt = Checkpoint::open(dir.path()).unwrap();
        assert_eq!(ckpt.dims.vq_backbone_codebooks, k);
    }
}

#[test]
fn summary_reports_the_model() {
    let dir = tiny_checkpoint();
    let text = summary(&Checkpoint::open(dir.path()).unwrap(), 16384);
    assert_contains(
        &text,
        &[
            "is valid",
            "8 layers (6 gated deltanet, 2 gated attention)",
            "13 layers (4 shared + 9 residual)",
            "F8_E4M3",
            "2048 samples per frame",
            "<|im_end|>",
        ],
    );
}

#[test]
fn full_preset_plan_has_the_real_size_without_writing() {
    let plan = SynthPlan::new(&SynthOptions { preset: Preset::Full, seed: 0, vq_backbone_codebooks: 1 });
    let gb = plan.model_bytes() as f64 / 1e9;
    assert!((38.0..44.0).contains(&gb), "model bytes {gb} GB");
    assert_eq!(plan.model_specs.iter().filter(|s| s.stored == Dtype::F8E4M3).count(), 40 * 256 * 3);
    assert_eq!(plan.codec_specs.len(), 535 + 6);
    let codec_gb = plan.codec_bytes() as f64 / 1e9;
    assert!((1.5..1.7).contains(&codec_gb), "codec bytes {codec_gb} GB");
    assert!(plan.shards().len() >= 8, "{} shards", plan.shards().len());
}

fn refused_with_spec_edit(edit: impl FnOnce(&mut SynthPlan)) -> String {
    let mut plan = tiny_plan();
    edit(&mut plan);
    refusal(write_plan(&plan).path())
}

#[test]
fn missing_tensor_is_named() {
    let msg = refused_with_spec_edit(|p| {
        p.model_specs.retain(|s| s.name != "model.language_model.layers.2.linear_attn.A_log")
    });
    assert_contains(
        &msg,
        &["model.safetensors.index.json", "`model.language_model.layers.2.linear_attn.A_log` is missing"],
    );
}

#[test]
fn wrong_shape_is_named_with_file() {
    let msg = refused_with_spec_edit(|p| {
        let s = p
            .model_specs
            .iter_mut()
            .find(|s| s.name == "model.language_model.layers.3.self_attn.k_proj.weight")
            .unwrap();
        s.shape = vec![64, 256];
    });
    assert_contains(
        &msg,
        &[".safetensors", "`model.language_model.layers.3.self_attn.k_proj.weight`", "[64, 256]", "[32, 256]"],
    );
}

#[test]
fn wrong_dtype_is_named() {
    let msg = refused_with_spec_edit(|p| {
        let s = p.model_specs.iter_mut().find(|s| s.name.ends_with("layers.1.mlp.experts.3.up_proj.weight")).unwrap();
        s.stored = Dtype::BF16;
    });
    assert_contains(&msg, &["`model.language_model.layers.1.mlp.experts.3.up_proj.weight`", "BF16", "F8_E4M3"]);
}

#[test]
fn unknown_namespace_and_unexpected_tensor_are_refused() {
    let extra = |name: &str| {
        let name = name.to_owned();
        refused_with_spec_edit(move |p| {
            let mut s = p.model_specs[0].clone();
            s.name = name;
            p.model_specs.push(s);
        })
    };
    assert_contains(&extra("mtp.layers.0.eh_proj.weight"), &["`mtp.layers.0.eh_proj.weight`", "unknown namespace"]);
    assert_contains(
        &extra("model.language_model.layers.0.extra.weight"),
        &["`model.language_model.layers.0.extra.weight`", "not part of the model"],
    );
}

#[test]
fn truncated_shard_is_refused() {
    let dir = tiny_checkpoint();
    let shard = first_shard(dir.path());
    let len = std::fs::metadata(&shard).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&shard).unwrap().set_len(len - 100).unwrap();
    assert_contains(&refusal(dir.path()), &[shard.file_name().unwrap().to_str().unwrap(), "lie outside"]);
}

#[test]
fn header_length_past_end_is_refused() {
    let dir = tiny_checkpoint();
    let shard = first_shard(dir.path());
    let mut bytes = std::fs::read(&shard).unwrap();
    bytes[..8].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
    std::fs::write(&shard, bytes).unwrap();
    assert_contains(&refusal(dir.path()), &["header length", "past the end"]);
}

/// Rewrites a shard's header through `edit`, keeping the data bytes.
fn edit_header(shard: &Path, edit: impl FnOnce(&mut serde_json::Map<String, Value>)) {
    let bytes = std::fs::read(shard).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: serde_json::Map<String, Value> = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    edit(&mut header);
    let text = serde_json::to_vec(&header).unwrap();
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&text);
    out.extend_from_slice(&bytes[8 + n..]);
    std::fs::write(shard, out).unwrap();
}

#[test]
fn overlapping_offsets_are_refused() {
    let dir = tiny_checkpoint();
    let shard = first_shard(dir.path());
    edit_header(&shard, |h| {
        let mut entries: Vec<(String, (u64, u64))> = h
            .iter()
            .filter(|(k, _)| *k != "__metadata__")
            .map(|(k, v)| (k.clone(), (v["data_offsets"][0].as_u64().unwrap(), v["data_offsets"][1].as_u64().unwrap())))
            .collect();
        entries.sort_by_key(|(_, o)| o.0);
        // Two same-size norm gains: point the second at the first one's bytes.
        let (a, b) = entries
            .windows(2)
            .map(|w| (w[0].clone(), w[1].clone()))
            .find(|(a, b)| a.1.1 - a.1.0 == b.1.1 - b.1.0)
            .unwrap();
        h[&b.0]["data_offsets"] = json!([a.1.0, a.1.1]);
    });
    assert_contains(&refusal(dir.path()), &["overlaps"]);
}

#[test]
fn config_rule_violation_is_refused() {
    let dir = tiny_checkpoint();
    let path = dir.path().join("config.json");
    let mut cfg: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    cfg["audio_decoder_config"]["n_layer"] = json!(5);
    std::fs::write(&path, cfg.to_string()).unwrap();
    assert_contains(&refusal(dir.path()), &["config.json", "`audio_decoder_config.n_layer`", "must be 4", "found 5"]);
}

#[test]
fn token_id_mismatch_is_refused() {
    let dir = tiny_checkpoint();
    let path = dir.path().join("config.json");
    let mut cfg: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let eos = cfg["eos_token_id"].as_u64().unwrap();
    cfg["eos_token_id"] = json!(eos - 1);
    std::fs::write(&path, cfg.to_string()).unwrap();
    assert_contains(&refusal(dir.path()), &["tokenizer.json", "<|im_end|>", "eos_token_id"]);
}

#[test]
fn codec_tensor_shape_is_checked() {
    let msg = refused_with_spec_edit(|p| {
        let s = p.codec_specs.iter_mut().find(|s| s.name == "decoder.model.2.block.3.block.1.conv.bias").unwrap();
        s.shape = vec![7];
    });
    assert_contains(&msg, &["codec.pth", "`decoder.model.2.block.3.block.1.conv.bias`", "[7]"]);
}

#[test]
fn missing_file_is_named() {
    let dir = tiny_checkpoint();
    std::fs::remove_file(dir.path().join("codec.pth")).unwrap();
    assert_contains(&refusal(dir.path()), &["codec.pth", "not found"]);
}

#[test]
fn inspect_binary_exit_codes() {
    let dir = tiny_checkpoint();
    let bin = env!("CARGO_BIN_EXE_limelight");
    let ok = std::process::Command::new(bin).args(["inspect", "--model"]).arg(dir.path()).output().unwrap();
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));
    assert!(String::from_utf8_lossy(&ok.stdout).contains("is valid"));
    std::fs::remove_file(dir.path().join("tokenizer.json")).unwrap();
    let bad = std::process::Command::new(bin).args(["inspect", "--model"]).arg(dir.path()).output().unwrap();
    assert_eq!(bad.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("tokenizer.json"));
}

#[test]
fn integer_tensor_where_a_float_is_needed_is_refused() {
    let dir = tiny_checkpoint();
    let index: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("model.safetensors.index.json")).unwrap())
            .unwrap();
    let name = "model.language_model.layers.0.linear_attn.A_log";
    let shard = dir.path().join(index["weight_map"][name].as_str().unwrap());
    edit_header(&shard, |h| h[name]["dtype"] = json!("I32"));
    assert_contains(&refusal(dir.path()), &[&format!("`{name}`"), "dtype I32", "BF16 or F32"]);
}

/// The first tensor of `shard` stored as `dtype`: its name and the absolute byte offset of its data.
fn first_tensor_of(shard: &Path, dtype: &str) -> Option<(String, usize)> {
    let bytes = std::fs::read(shard).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Map<String, Value> = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let mut found: Vec<(String, usize)> = header
        .iter()
        .filter(|(k, v)| *k != "__metadata__" && v["dtype"] == dtype)
        .map(|(k, v)| (k.clone(), 8 + n + v["data_offsets"][0].as_u64().unwrap() as usize))
        .collect();
    found.sort();
    found.into_iter().next()
}

/// Overwrites `value` at byte `at` of `path`.
fn poke(path: &Path, at: usize, value: &[u8]) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes[at..at + value.len()].copy_from_slice(value);
    std::fs::write(path, bytes).unwrap();
}

fn load_refusal(dir: &Path) -> String {
    // The layout is intact: the checkpoint opens; the values are refused when loaded.
    let ckpt = Checkpoint::open(dir).expect("the layout checks pass");
    match ResidentModel::load(&ckpt, &Cpu) {
        Ok(_) => panic!("the checkpoint in {} must be refused", dir.display()),
        Err(e) => e.to_string(),
    }
}

/// Issue 16, finding 8: a checkpoint with a NaN or an infinity in any weight loaded, reported
/// ready, and then failed every request. It is refused at load, naming the file, the tensor
/// and the element, whatever the stored dtype.
#[test]
fn non_finite_weights_are_refused_at_load_by_file_and_tensor() {
    // (dtype in the shard, element, its bytes: bf16 NaN, FP8 E4M3 NaN, f32 +inf).
    for (dtype, element, bad) in
        [("BF16", 3usize, &[0xC0u8, 0x7F][..]), ("F8_E4M3", 5, &[0x7F]), ("F32", 1, &[0, 0, 0x80, 0x7F])]
    {
        let dir = tiny_checkpoint();
        let mut shards: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
            .collect();
        shards.sort();
        // The published layout has all three: bf16 matrices, FP8 experts, f32 scale grids.
        let (shard, (tensor, at)) = shards
            .iter()
            .find_map(|s| Some((s.clone(), first_tensor_of(s, dtype)?)))
            .unwrap_or_else(|| panic!("the tiny checkpoint has {dtype} tensors"));
        poke(&shard, at + element * bad.len(), bad);
        let message = load_refusal(dir.path());
        let file = shard.file_name().unwrap().to_str().unwrap();
        assert_contains(&message, &[file, &tensor, &format!("element {element}"), "NaN or infinite"]);
    }
}

/// The same for `codec.pth`: a NaN in a decoder parameter is refused by file and tensor (the
/// encoder's, read by the same reader, when voice cloning loads it).
#[test]
fn a_non_finite_codec_parameter_is_refused_at_load() {
    let dir = tiny_checkpoint();
    let path = dir.path().join("codec.pth");
    let archive = PthArchive::open(&path).unwrap();
    let (name, tensor) = archive
        .tensors()
        .filter(|(n, t)| t.dtype == Dtype::F32 && t.numel() > 4 && n.starts_with("decoder."))
        .map(|(n, t)| (n.to_owned(), t.clone()))
        .next()
        .expect("an f32 codec parameter");
    drop(archive);
    let at = tensor.storage.start + 4 * (tensor.storage_offset + 2);
    poke(&path, at, &f32::NAN.to_le_bytes());
    assert_contains(&load_refusal(dir.path()), &["codec.pth", &name, "NaN or infinite"]);
}

/// The upload reports its progress (the server's log and systemd `STATUS=` while loading): each
/// time another `every` bytes are up, with the total; the reports rise and stay within it.
#[test]
fn the_upload_reports_its_progress() {
    let dir = tiny_checkpoint();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let every = 4 << 20;
    let mut reports = Vec::new();
    ckpt.upload_model_weights_reporting(&Cpu, every, &mut |done, total| reports.push((done, total))).unwrap();
    let total = reports.first().expect("reports on a 50 MB checkpoint").1;
    let bytes: u64 = (1..=4)
        .map(|i| std::fs::metadata(dir.path().join(format!("model-0000{i}-of-00004.safetensors"))).unwrap().len())
        .sum();
    assert!(total <= bytes && total > bytes * 9 / 10, "{total} of {bytes} file bytes are tensors");
    assert!(
        reports.len() as u64 >= total / every - 2 && reports.len() as u64 <= total / every,
        "{} reports",
        reports.len()
    );
    assert!(reports.windows(2).all(|w| w[1].0 >= w[0].0 + every && w[1].1 == total), "{reports:?}");
    assert!(reports.last().unwrap().0 <= total);
}
