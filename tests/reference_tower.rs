//! The CPU tower (`model.md` §6, §8.1) against golden tensors from mlx-audio 0.6.2's and
//! sglang-omni 0.1.9's own towers (tools/reference/tower.py), for both vq placements, plus the
//! identities the model relies on: prefill then per-frame steps equals one longer prefill,
//! chunked prefill equals whole prefill, and several requests prefilled together equal each
//! alone.

mod common;

use std::path::Path;

use limelight::backend::BackendTypes;
use limelight::backend::cpu::{Cpu, CpuTowerKv, CpuWeight, Matrix};
use limelight::backend::tower::{TowerError, TowerLayerInput, TowerOps};
use limelight::checkpoint::Dtype;
use limelight::checkpoint::safetensors::SafetensorsFile;
use limelight::model::frame::Rows;
use limelight::model::load::Checkpoint;
use limelight::model::tower::{Tower, TowerTrace};
use limelight::model::weights::ModelWeights;
use limelight::synth::presets::Preset;
use limelight::synth::{SynthOptions, SynthPlan};

/// CPU (f32 storage, f64 sums) vs a float32 reference, per tensor.
const GOLDEN_BOUND: f64 = 1e-4;
/// Two schedules of the same rows on the same backend.
const SCHEDULE_BOUND: f64 = 1e-5;

struct Golden {
    rows: Rows,
    prompt: usize,
    hidden: Matrix,
    /// `[13][23 · dim]` (mlx-audio).
    layers: Vec<Vec<f32>>,
    /// `[9][23 · V]` (mlx-audio).
    heads: Vec<Vec<f32>>,
    s1_heads: Vec<Vec<f32>>,
    s1_last: Vec<f32>,
}

fn f32s(f: &SafetensorsFile, name: &str) -> (Vec<usize>, Vec<f32>) {
    let v = f.view(name).unwrap_or_else(|| panic!("fixture lacks `{name}`"));
    (v.shape.to_vec(), v.to_f32_vec().expect("float tensor"))
}

fn i32s(f: &SafetensorsFile, name: &str) -> Vec<u32> {
    let v = f.view(name).unwrap_or_else(|| panic!("fixture lacks `{name}`"));
    assert_eq!(v.dtype, Dtype::I32);
    v.bytes.chunks_exact(4).map(|c| u32::try_from(i32::from_le_bytes(c.try_into().unwrap())).unwrap()).collect()
}

/// `[a, rows·cols]` → one Vec per leading index.
fn split(shape: &[usize], data: Vec<f32>) -> Vec<Vec<f32>> {
    data.chunks_exact(shape[1..].iter().product()).map(<[f32]>::to_vec).collect()
}

fn golden(k: usize) -> Golden {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/fixtures/tower/tower_k{k}.safetensors"));
    let f = SafetensorsFile::open(&path).unwrap();
    let (hs, hidden) = f32s(&f, "hidden");
    let (ls, layers) = f32s(&f, "layers");
    let (heads_shape, heads) = f32s(&f, "heads");
    let (s1s, s1_heads) = f32s(&f, "s1_heads");
    Golden {
        rows: Rows::from_flat(10, i32s(&f, "rows")),
        prompt: i32s(&f, "prompt_len")[0] as usize,
        hidden: Matrix::from_vec(hs[0], hs[1], hidden),
        layers: split(&ls, layers),
        heads: split(&heads_shape, heads),
        s1_heads: split(&s1s, s1_heads),
        s1_last: f32s(&f, "s1_last").1,
    }
}

/// The tiny checkpoint the fixture was made from (`--seed 7 --vq-backbone-codebooks k`).
fn checkpoint(k: usize) -> (tempfile::TempDir, Checkpoint, ModelWeights<CpuWeight>) {
    let plan = SynthPlan::new(&SynthOptions { preset: Preset::Tiny, seed: common::SEED, vq_backbone_codebooks: k });
    let dir = common::write_plan(&plan);
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    assert_eq!(ckpt.config.audio_decoder_config.vq_backbone_codebooks, k);
    let weights = ckpt.upload_model_weights(&Cpu).unwrap();
    (dir, ckpt, weights)
}

fn rows_range(rows: &Rows, start: usize, end: usize) -> Rows {
    let w = rows.width();
    Rows::from_flat(rows.codebooks(), rows.as_flat()[start * w..end * w].to_vec())
}

fn hidden_rows(h: &Matrix, start: usize, count: usize) -> Matrix {
    Cpu.act_rows(h, start, count)
}

/// Relative L2 in f64; NaN (never `<=` anything) fails every bound.
fn rel_l2(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len(), "lengths");
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (&g, &w) in got.iter().zip(want) {
        num += (g as f64 - w as f64).powi(2);
        den += (w as f64).powi(2);
    }
    (num / den).sqrt()
}

/// Concatenates traces row-wise: per layer / head, the rows of each trace in order.
fn concat(traces: &[TowerTrace]) -> TowerTrace {
    let cat = |pick: &dyn Fn(&TowerTrace) -> &Vec<Vec<f32>>| -> Vec<Vec<f32>> {
        (0..pick(&traces[0]).len()).map(|i| traces.iter().flat_map(|t| pick(t)[i].iter().copied()).collect()).collect()
    };
    TowerTrace {
        rows: traces.iter().map(|t| t.rows).sum(),
        layers: cat(&|t: &TowerTrace| &t.layers),
        heads: cat(&|t: &TowerTrace| &t.heads),
    }
}

/// Prompt prefill, then one teacher-forced frame per generated row: the golden's schedule.
fn run_golden_schedule(tower: &Tower<'_, Cpu>, g: &Golden) -> (TowerTrace, Vec<CpuTowerKv>) {
    let mut state = tower.new_state();
    let mut traces = vec![
        tower
            .prefill_traced(&mut state, &hidden_rows(&g.hidden, 0, g.prompt), &rows_range(&g.rows, 0, g.prompt))
            .unwrap(),
    ];
    for t in g.prompt - 1..g.rows.len() - 1 {
        let h = hidden_rows(&g.hidden, t, 1);
        traces.push(tower.frame_traced(&mut state, &h, g.rows.row(t), g.rows.row(t + 1)).unwrap());
    }
    assert_eq!(state.len(), g.rows.len() - 1);
    (concat(&traces), state.caches().to_vec())
}

fn check_golden(k: usize) {
    let g = golden(k);
    let (_dir, ckpt, weights) = checkpoint(k);
    let tower = Tower::new(&Cpu, &weights.tower, &ckpt.config).unwrap();
    let (trace, _) = run_golden_schedule(&tower, &g);
    assert_eq!(trace.rows, g.rows.len() - 1);
    assert_eq!((trace.layers.len(), trace.heads.len()), (g.layers.len(), g.heads.len()));
    assert!(trace.layers.iter().chain(&trace.heads).flatten().all(|x| x.is_finite()), "every output finite");

    let mut worst = [0.0f64; 3];
    for (i, (got, want)) in trace.layers.iter().zip(&g.layers).enumerate() {
        let e = rel_l2(got, want);
        println!("k={k} layer {i:2}: rel L2 vs mlx-audio {e:.2e}");
        assert!(e <= GOLDEN_BOUND, "k={k} layer {i}: {e:e} vs mlx-audio");
        worst[0] = worst[0].max(e);
    }
    for (r, got) in trace.heads.iter().enumerate() {
        let (e_mlx, e_s1) = (rel_l2(got, &g.heads[r]), rel_l2(got, &g.s1_heads[r]));
        println!("k={k} head {r}: rel L2 vs mlx-audio {e_mlx:.2e}, vs sglang-omni {e_s1:.2e}");
        assert!(e_mlx <= GOLDEN_BOUND && e_s1 <= GOLDEN_BOUND, "k={k} head {r}: {e_mlx:e} / {e_s1:e}");
        worst[1] = worst[1].max(e_mlx);
        worst[2] = worst[2].max(e_s1);
    }
    let e_last = rel_l2(trace.layers.last().unwrap(), &g.s1_last);
    assert!(e_last <= GOLDEN_BOUND, "k={k} last layer vs sglang-omni: {e_last:e}");
    println!(
        "k={k}: worst rel L2 layers vs mlx-audio {:.2e}, heads vs mlx-audio {:.2e}, heads vs sglang-omni {:.2e}, \
         last layer vs sglang-omni {e_last:.2e}",
        worst[0], worst[1], worst[2]
    );
}

#[test]
fn golden_backbone_partial_k1() {
    check_golden(1);
}

#[test]
fn golden_mtp_shared_pre_k0() {
    check_golden(0);
}

/// Prefill of n rows then m per-frame steps == prefill of n + m rows (same caches, same
/// outputs), and the sampling entry point returns the codes its sampler picked.
#[test]
fn frames_continue_a_prefill_exactly() {
    let g = golden(1);
    let (_dir, ckpt, weights) = checkpoint(1);
    let tower = Tower::new(&Cpu, &weights.tower, &ckpt.config).unwrap();
    let (stepped, stepped_caches) = run_golden_schedule(&tower, &g);

    let mut whole = tower.new_state();
    let long = tower.prefill_traced(&mut whole, &g.hidden, &g.rows).unwrap();
    assert_eq!(whole.len(), g.rows.len() - 1);
    for (a, b) in stepped.layers.iter().chain(&stepped.heads).zip(long.layers.iter().chain(&long.heads)) {
        let e = rel_l2(a, b);
        assert!(e <= SCHEDULE_BOUND, "outputs differ: {e:e}");
    }
    for (l, (a, b)) in stepped_caches.iter().zip(whole.caches()).enumerate() {
        assert_eq!(a.len(), b.len(), "layer {l} cache length");
        let (ek, ev) = (rel_l2(&a.k, &b.k), rel_l2(&a.v, &b.v));
        assert!(ek <= SCHEDULE_BOUND && ev <= SCHEDULE_BOUND, "layer {l} cache: K {ek:e}, V {ev:e}");
    }

    // `frame` with a sampler that returns the golden's codes and records what it saw.
    let mut state = tower.new_state();
    tower.prefill(&mut state, &hidden_rows(&g.hidden, 0, g.prompt), &rows_range(&g.rows, 0, g.prompt)).unwrap();
    for (step, t) in (g.prompt - 1..g.rows.len() - 1).enumerate() {
        let next = g.rows.row(t + 1);
        let mut seen = Vec::new();
        let mut sample = |r: usize, logits: &[f32]| {
            seen.push(logits.to_vec());
            next[2 + r]
        };
        let h = hidden_rows(&g.hidden, t, 1);
        let codes = tower.frame(&mut state, &h, g.rows.row(t), next[0], &mut sample).unwrap();
        let semantic = ckpt.config.semantic_start_token_id..=ckpt.config.semantic_end_token_id;
        let c0 = if semantic.contains(&next[0]) { next[1] } else { 0 }; // EOS: clamp(main − start) = 0
        assert_eq!(codes[0], c0);
        assert_eq!(&codes[1..], &next[2..], "step {step}: the frame is what the sampler picked");
        let row = g.prompt - 1 + step;
        for (r, logits) in seen.iter().enumerate() {
            let v = logits.len();
            assert_eq!(logits.as_slice(), &long.heads[r][row * v..(row + 1) * v], "step {step} head {r}");
        }
    }
    assert_eq!(state.caches(), whole.caches());
}

/// A state restarted in place after another request (what the CUDA-graph step does between
/// requests) prefills exactly as a fresh one.
#[test]
fn restarted_state_prefills_as_a_fresh_one() {
    let g = golden(1);
    let (_dir, ckpt, weights) = checkpoint(1);
    let tower = Tower::new(&Cpu, &weights.tower, &ckpt.config).unwrap();
    let mut fresh = tower.new_state();
    let want = tower.prefill_traced(&mut fresh, &g.hidden, &g.rows).unwrap();

    let mut reused = tower.new_state();
    let other = rows_range(&g.rows, 3, g.prompt);
    tower.prefill(&mut reused, &hidden_rows(&g.hidden, 3, other.len()), &other).unwrap();
    assert!(!reused.is_empty());
    reused.restart(&mut |kv| {
        kv.k.clear();
        kv.v.clear();
    });
    assert!(reused.is_empty());
    let got = tower.prefill_traced(&mut reused, &g.hidden, &g.rows).unwrap();
    assert_eq!(got, want);
    assert_eq!(reused.caches(), fresh.caches());
}

/// Prefill in chunks (each passing one extra row as the label of its last written row) equals
/// one prefill; and an omitted last backbone row changes nothing.
#[test]
fn chunked_prefill_equals_whole() {
    let g = golden(0);
    let (_dir, ckpt, weights) = checkpoint(0);
    let tower = Tower::new(&Cpu, &weights.tower, &ckpt.config).unwrap();
    let n = g.rows.len();
    let mut whole = tower.new_state();
    let all = tower.prefill_traced(&mut whole, &hidden_rows(&g.hidden, 0, n - 1), &g.rows).unwrap();

    let mut chunked = tower.new_state();
    let mut traces = Vec::new();
    for (a, b) in [(0, 7), (7, 8), (8, 16), (16, n)] {
        // Rows a..=b (b labels row b−1); backbone rows a..b.
        let end = (b + 1).min(n);
        let rows = rows_range(&g.rows, a, end);
        traces.push(tower.prefill_traced(&mut chunked, &hidden_rows(&g.hidden, a, end - 1 - a), &rows).unwrap());
        assert_eq!(chunked.len(), end - 1);
    }
    let parts = concat(&traces);
    for (x, y) in parts.layers.iter().chain(&parts.heads).zip(all.layers.iter().chain(&all.heads)) {
        assert!(rel_l2(x, y) <= SCHEDULE_BOUND);
    }
    assert_eq!(chunked.caches(), whole.caches());
}

/// Several requests' prompt chunks through `prefill_many` leave every cache bit for bit as
/// `prefill` leaves it alone, whatever else shares the call: requests continuing their own
/// earlier chunks, one starting fresh, and one whose single row writes nothing yet.
#[test]
fn prefill_many_equals_each_alone() {
    let g = golden(1);
    let (_dir, ckpt, weights) = checkpoint(1);
    let tower = Tower::new(&Cpu, &weights.tower, &ckpt.config).unwrap();
    let n = g.rows.len();
    // (primer rows, then the chunk's rows a..end with backbone rows a..end−1) per request.
    let plans = [(0, 0, 9), (5, 5, n), (0, 0, 1), (9, 9, 17)];
    let primed = |primer: usize| {
        let mut state = tower.new_state();
        if primer > 0 {
            tower.prefill(&mut state, &hidden_rows(&g.hidden, 0, primer), &rows_range(&g.rows, 0, primer + 1)).unwrap();
        }
        state
    };
    let chunk = |a: usize, end: usize| {
        (hidden_rows(&g.hidden, a, end.saturating_sub(1).max(a) - a), rows_range(&g.rows, a, end))
    };
    let mut alone: Vec<_> = plans.iter().map(|&(p, _, _)| primed(p)).collect();
    for (state, &(_, a, end)) in alone.iter_mut().zip(&plans) {
        let (h, rows) = chunk(a, end);
        tower.prefill(state, &h, &rows).unwrap();
    }
    let mut together: Vec<_> = plans.iter().map(|&(p, _, _)| primed(p)).collect();
    let chunks: Vec<(Matrix, Rows)> = plans.iter().map(|&(_, a, end)| chunk(a, end)).collect();
    let hidden: Vec<&Matrix> = chunks.iter().map(|(h, _)| h).collect();
    let rows: Vec<Rows> = chunks.iter().map(|(_, r)| r.clone()).collect();
    let mut states: Vec<_> = together.iter_mut().collect();
    tower.prefill_many(&mut states, &hidden, &rows).unwrap();
    for (i, (a, b)) in together.iter().zip(&alone).enumerate() {
        assert_eq!(a.len(), b.len(), "request {i}: positions written");
        assert_eq!(a.caches(), b.caches(), "request {i}: caches");
    }
}

#[test]
fn bad_inputs_are_refused() {
    let g = golden(1);
    let (_dir, ckpt, weights) = checkpoint(1);
    let tower = Tower::new(&Cpu, &weights.tower, &ckpt.config).unwrap();
    let shape = tower.shape().clone();

    // A layer call that would leave a gap in its cache.
    let mut kv = Cpu.tower_kv(&shape);
    let h = hidden_rows(&g.hidden, 0, 1);
    let input = TowerLayerInput { hidden: &h, codes: &[0], label_semantic: &[true], unseen: None, start: 3 };
    let err = Cpu.tower_layer(&shape, &weights.tower.layers[0], &mut kv, input).unwrap_err();
    assert_eq!(err, TowerError::PositionGap { start: 3, cached: 0 });
    assert!(kv.is_empty(), "a refused call writes nothing");

    // Backbone rows that do not match the frame rows.
    let mut state = tower.new_state();
    let err = tower.prefill(&mut state, &hidden_rows(&g.hidden, 0, 5), &rows_range(&g.rows, 0, 10)).unwrap_err();
    assert_eq!(err, TowerError::Length { what: "backbone rows", expected: 10, found: 5 });
    assert_eq!(state.len(), 0);

    // A sampler that returns a code outside the codebook.
    tower.prefill(&mut state, &hidden_rows(&g.hidden, 0, g.prompt), &rows_range(&g.rows, 0, g.prompt)).unwrap();
    let t = g.prompt - 1;
    let mut bad = |_: usize, _: &[f32]| 256;
    let err = tower.frame(&mut state, &hidden_rows(&g.hidden, t, 1), g.rows.row(t), g.rows.token(t + 1), &mut bad);
    assert_eq!(err.unwrap_err(), TowerError::CodeOutOfRange { head: 0, code: 256, vocab: 256 });
    assert_eq!(state.len(), t, "a failed frame does not advance the request");
}
