//! The CPU codec decode (`codec.md` §1) against golden tensors from sglang-omni 0.1.9's own Fish
//! modded-DAC module (tools/reference/codec.py), stage by stage, run in float32 and float64;
//! the bf16 RoPE table against the module's `freqs_cis` buffer; code clamping; PCM length.

mod common;

use std::path::Path;

use limelight::backend::cpu::{Cpu, Matrix};
use limelight::checkpoint::Dtype;
use limelight::checkpoint::safetensors::SafetensorsFile;
use limelight::model::codec::rope::{inverse_frequencies, rope_rows};
use limelight::model::codec::{CodecError, CodecModel, clamp_codes};
use limelight::model::load::Checkpoint;

/// CPU (f32 storage, f64 sums) vs a float32 or float64 reference, relative L2 per tensor.
const GOLDEN_BOUND: f64 = 1e-4;
const SAMPLES_PER_FRAME: usize = 2048;

fn fixture() -> SafetensorsFile {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/codec/decode.safetensors");
    SafetensorsFile::open(&path).unwrap()
}

fn f32s(f: &SafetensorsFile, name: &str) -> Vec<f32> {
    let v = f.view(name).unwrap_or_else(|| panic!("fixture lacks `{name}`"));
    v.to_f32_vec().expect("float tensor")
}

fn i32s(f: &SafetensorsFile, name: &str) -> (Vec<usize>, Vec<u32>) {
    let v = f.view(name).unwrap_or_else(|| panic!("fixture lacks `{name}`"));
    assert_eq!(v.dtype, Dtype::I32);
    let data = v.bytes.chunks_exact(4).map(|c| u32::try_from(i32::from_le_bytes(c.try_into().unwrap())).unwrap());
    (v.shape.to_vec(), data.collect())
}

/// The reference's codes `[books, frames]` as our frames `[frames, books]`.
fn frames(f: &SafetensorsFile, name: &str) -> Vec<u32> {
    let (shape, data) = i32s(f, name);
    let (books, n) = (shape[0], shape[1]);
    (0..n).flat_map(|t| (0..books).map(move |b| (t, b))).map(|(t, b)| data[b * n + t]).collect()
}

fn check(stage: &str, ours: &[f32], golden: &[f32]) {
    let err = common::rel_l2(ours, golden);
    eprintln!("{stage:>20}: relative L2 {err:.3e} (bound {GOLDEN_BOUND:.0e})");
    assert!(
        err <= GOLDEN_BOUND,
        "{stage}: relative L2 {err:.3e} > {GOLDEN_BOUND:.0e} (if the checkpoint writer changed, regenerate with tools/reference/codec.py)"
    );
}

/// The tiny checkpoint the fixture was made from (`--seed 7`).
fn model() -> (tempfile::TempDir, CodecModel<Cpu>) {
    let dir = common::tiny_checkpoint();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let model = CodecModel::load(&ckpt, &Cpu).unwrap();
    (dir, model)
}

fn data(m: &Matrix) -> &[f32] {
    &m.data
}

#[test]
fn decode_matches_sglang_omni_codec_stage_by_stage() {
    let f = fixture();
    let (_dir, model) = model();
    let codes = frames(&f, "codes");
    let n = codes.len() / model.codes_per_frame();
    assert!(n >= 40);
    let (pcm, trace) = model.decode_traced(&Cpu, &codes).unwrap();
    assert_eq!(pcm.len(), SAMPLES_PER_FRAME * n);
    assert_eq!((trace.upsample.rows, trace.pre_tanh.rows, trace.pre_tanh.cols), (4 * n, SAMPLES_PER_FRAME * n, 1));
    for run in ["f64", "f32"] {
        check(&format!("{run}.rvq"), data(&trace.rvq), &f32s(&f, &format!("{run}.rvq")));
        check(&format!("{run}.post_module"), data(&trace.post_module), &f32s(&f, &format!("{run}.post_module")));
        check(&format!("{run}.upsample"), data(&trace.upsample), &f32s(&f, &format!("{run}.upsample")));
        check(&format!("{run}.pcm"), &pcm, &f32s(&f, &format!("{run}.pcm")));
    }
    check("f64.pre_tanh", data(&trace.pre_tanh), &f32s(&f, "f64.pre_tanh"));
}

/// 160 frames: queries past frame 127 see only their 128-frame window.
#[test]
fn post_module_beyond_the_attention_window_matches() {
    let f = fixture();
    let (_dir, model) = model();
    let codes = frames(&f, "long.codes");
    assert!(codes.len() / model.codes_per_frame() > 128);
    let (_, trace) = model.decode_traced(&Cpu, &codes).unwrap();
    check("long.rvq", data(&trace.rvq), &f32s(&f, "long.rvq"));
    check("long.post_module", data(&trace.post_module), &f32s(&f, "long.post_module"));
}

#[test]
fn rope_table_equals_the_reference_bf16_buffer() {
    let f = fixture();
    let (_, positions) = i32s(&f, "rope.positions");
    let table = f32s(&f, "rope.table");
    let inv = inverse_frequencies(64);
    let mut mismatches = 0;
    for (i, &pos) in positions.iter().enumerate() {
        let ours = rope_rows(&inv, pos as usize, 1);
        let golden = &table[i * 64..(i + 1) * 64];
        mismatches += ours.iter().zip(golden).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
    }
    assert!(positions.len() > 500 && *positions.last().unwrap() == 327_679);
    assert_eq!(mismatches, 0, "RoPE entries differing from the reference's bf16 table");
}

#[test]
fn codes_above_the_codebooks_are_clamped_not_refused() {
    let (_dir, model) = model();
    let d = &model.dims;
    let (sem, res) = (d.semantic_codebook_size as u32, d.residual_codebook_size as u32);
    let mut wide: Vec<u32> = (0..3 * model.codes_per_frame() as u32).map(|i| (i * 37) % res).collect();
    wide[0] = sem + 5;
    wide[1] = res;
    wide[model.codes_per_frame() + 9] = 4095;
    wide[2 * model.codes_per_frame()] = u32::MAX;
    let mut clamped = wide.clone();
    clamp_codes(d, &mut clamped);
    assert_eq!(clamped[0], sem - 1);
    assert_eq!(clamped[1], res - 1);
    assert_eq!(clamped[model.codes_per_frame() + 9], res - 1);
    assert_eq!(clamped[2 * model.codes_per_frame()], sem - 1);
    assert_eq!(clamped[2], wide[2], "in-range codes are untouched");
    let a = model.decode(&Cpu, &wide).unwrap();
    let b = model.decode(&Cpu, &clamped).unwrap();
    assert_eq!(a.len(), 3 * SAMPLES_PER_FRAME);
    assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()));
}

#[test]
fn decode_is_deterministic_and_refuses_partial_frames() {
    let (_dir, model) = model();
    let codes: Vec<u32> = (0..2 * model.codes_per_frame() as u32).map(|i| (i * 13) % 50).collect();
    let a = model.decode(&Cpu, &codes).unwrap();
    let b = model.decode(&Cpu, &codes).unwrap();
    assert_eq!(a.len(), 2 * SAMPLES_PER_FRAME);
    assert!(a.iter().all(|v| v.is_finite() && v.abs() <= 1.0));
    assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()));
    assert!(model.decode(&Cpu, &[]).unwrap().is_empty());
    let err = model.decode(&Cpu, &codes[..7]).unwrap_err();
    assert!(matches!(err, CodecError::Codes { len: 7, width: 10 }), "{err}");
}
