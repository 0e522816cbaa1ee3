//! Shared test helpers: tiny random checkpoints in the published layout.

#![allow(dead_code)]

use std::path::Path;

use std::sync::OnceLock;

use limelight::model::frame::Rows;
use limelight::model::load::Checkpoint;
use limelight::request::prompt::PromptBuilder;
use limelight::synth::presets::Preset;
use limelight::synth::{SynthOptions, SynthPlan};

pub const SEED: u64 = 7;

pub fn tiny_plan() -> SynthPlan {
    SynthPlan::new(&SynthOptions { preset: Preset::Tiny, seed: SEED, vq_backbone_codebooks: 1 })
}

/// Writes a tiny checkpoint into a fresh temporary directory.
pub fn tiny_checkpoint() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    tiny_plan().write(dir.path()).unwrap();
    dir
}

/// Prompt rows for `text` with the tiny checkpoint's tokenizer (every tiny checkpoint of
/// [`SEED`] has the same one), as the request layer builds them before it submits a job.
pub fn tiny_rows(text: &str) -> Rows {
    tiny_prompt_builder().build(text, &[]).expect("test text builds a prompt")
}

/// A prompt builder over the tiny checkpoint's vocabulary (every tiny checkpoint has the same).
pub fn tiny_prompt_builder() -> PromptBuilder {
    static BUILDER: OnceLock<PromptBuilder> = OnceLock::new();
    BUILDER
        .get_or_init(|| {
            let dir = tiny_checkpoint();
            PromptBuilder::for_checkpoint(&Checkpoint::open(dir.path()).expect("the tiny checkpoint opens"))
        })
        .clone()
}

/// Writes `plan` into a fresh temporary directory.
pub fn write_plan(plan: &SynthPlan) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    plan.write(dir.path()).unwrap();
    dir
}

/// The first shard file of a checkpoint directory.
pub fn first_shard(dir: &Path) -> std::path::PathBuf {
    let mut shards: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    shards.sort();
    shards.remove(0)
}

/// Whether `python3` can import every module in `modules`. Without them the calling test skips
/// with a visible notice, except under `LIMELIGHT_REQUIRE_PYTHON=1` (the test command), where a
/// missing package fails the test.
pub fn python_with(modules: &[&str]) -> bool {
    let imports = format!("import {}", modules.join(", "));
    let ok = std::process::Command::new("python3").args(["-c", &imports]).output().is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var_os("LIMELIGHT_REQUIRE_PYTHON").is_none(),
            "python3 cannot `{imports}` but LIMELIGHT_REQUIRE_PYTHON is set (run tools/python-env.sh)"
        );
        eprintln!("skipped: python3 cannot `{imports}` (tools/python-env.sh installs it)");
    }
    ok
}

/// Relative L2 `‖ours − golden‖ / ‖golden‖` in f64, for golden-fixture checks; lengths must match
/// and every value of `ours` be finite.
pub fn rel_l2(ours: &[f32], golden: &[f32]) -> f64 {
    assert_eq!(ours.len(), golden.len(), "tensor lengths");
    assert!(ours.iter().all(|v| v.is_finite()), "non-finite output");
    let num: f64 = ours.iter().zip(golden).map(|(a, b)| (f64::from(*a) - f64::from(*b)).powi(2)).sum();
    let den: f64 = golden.iter().map(|b| f64::from(*b).powi(2)).sum();
    (num / den).sqrt()
}
