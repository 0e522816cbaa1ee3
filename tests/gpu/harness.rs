//! The GPU check harness: fresh random inputs, NaN-poisoned outputs, and a table of
//! (stage, metric, bound, value, pass) rows.

use limelight::backend::cpu::{Cpu, Matrix};
use limelight::backend::cuda::Cuda;
use limelight::model::load::Checkpoint;
use limelight::synth::presets::Preset;
use limelight::synth::rng::Rng;
use limelight::synth::{SynthOptions, SynthPlan};

/// One row of the table.
pub struct Row {
    pub stage: String,
    pub metric: &'static str,
    pub bound: String,
    pub value: String,
    pub pass: bool,
}

/// What every check gets: both backends, a random source and the table.
pub struct Ctx<'a> {
    pub cuda: &'a Cuda,
    pub cpu: Cpu,
    pub rng: Rng,
    pub rows: Vec<Row>,
}

impl Ctx<'_> {
    /// Relative L2 `‖got − want‖ / ‖want‖`; any non-finite value in `got` (an unwritten NaN
    /// poison, an overflow) fails.
    pub fn rel_l2(&mut self, stage: impl Into<String>, got: &[f32], want: &[f32], bound: f64) {
        let value = rel_l2(got, want);
        let pass = value <= bound;
        self.rows.push(Row {
            stage: stage.into(),
            metric: "rel L2",
            bound: short_e(bound),
            value: format!("{value:.2e}"),
            pass,
        });
    }

    /// Values that must match exactly (ids, counts, bit patterns).
    pub fn exact<T: PartialEq + std::fmt::Debug>(&mut self, stage: impl Into<String>, got: &[T], want: &[T]) {
        let mismatches = if got.len() == want.len() {
            got.iter().zip(want).filter(|(a, b)| a != b).count()
        } else {
            got.len().max(want.len())
        };
        self.rows.push(Row {
            stage: stage.into(),
            metric: "mismatches",
            bound: "0".into(),
            value: format!("{mismatches} of {}", want.len()),
            pass: mismatches == 0,
        });
    }

    /// A free-form check.
    pub fn check(&mut self, stage: impl Into<String>, metric: &'static str, bound: String, value: String, pass: bool) {
        self.rows.push(Row { stage: stage.into(), metric, bound, value, pass });
    }

    /// A fresh tiny random-weight checkpoint (its seed drawn from this run's), written into a
    /// temporary directory that lives as long as the returned guard.
    pub fn tiny_checkpoint(&mut self) -> (tempfile::TempDir, Checkpoint) {
        self.tiny_checkpoint_scaled(1.0)
    }

    /// A tiny checkpoint whose residual branches' init is scaled by `residual_scale`
    /// (`SynthPlan::residual_scale`: below 1, a better-conditioned model for end-to-end rows).
    pub fn tiny_checkpoint_scaled(&mut self, residual_scale: f32) -> (tempfile::TempDir, Checkpoint) {
        let dir = tempfile::tempdir().expect("temporary directory");
        let seed = self.rng.next_u64();
        let plan = SynthPlan::new(&SynthOptions { preset: Preset::Tiny, seed, vq_backbone_codebooks: 1 })
            .with_residual_scale(residual_scale);
        plan.write(dir.path()).expect("write the tiny checkpoint");
        let ckpt = Checkpoint::open(dir.path()).expect("open the tiny checkpoint");
        (dir, ckpt)
    }

    /// A `[rows, cols]` matrix of uniform values in `[-scale, scale]`.
    pub fn random(&mut self, rows: usize, cols: usize, scale: f32) -> Matrix {
        let data = (0..rows * cols).map(|_| self.rng.uniform(-scale, scale)).collect();
        Matrix::from_vec(rows, cols, data)
    }

    /// A random matrix already rounded to bf16, so both backends see the same input.
    pub fn random_bf16(&mut self, rows: usize, cols: usize, scale: f32) -> Matrix {
        let m = self.random(rows, cols, scale);
        limelight::backend::cuda::tensor::round_to_bf16(&m)
    }
}

/// `1e-2` where one digit says the value exactly, else `1.3e-1`.
fn short_e(v: f64) -> String {
    let one = format!("{v:.0e}");
    if one.parse::<f64>() == Ok(v) { one } else { format!("{v:.1e}") }
}

pub fn rel_l2(got: &[f32], want: &[f32]) -> f64 {
    if got.len() != want.len() || got.iter().any(|v| !v.is_finite()) {
        return f64::INFINITY;
    }
    let (mut num, mut den) = (0f64, 0f64);
    for (&g, &w) in got.iter().zip(want) {
        num += (g as f64 - w as f64).powi(2);
        den += (w as f64).powi(2);
    }
    if den == 0.0 { num.sqrt() } else { (num / den).sqrt() }
}

/// The table as Markdown.
pub fn markdown(rows: &[Row]) -> String {
    let mut s = String::from("| stage | metric | bound | value | pass |\n|---|---|---|---|---|\n");
    for r in rows {
        let pass = if r.pass { "yes" } else { "**NO**" };
        s.push_str(&format!("| {} | {} | {} | {} | {} |\n", r.stage, r.metric, r.bound, r.value, pass));
    }
    s
}
