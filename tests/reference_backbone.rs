//! The CPU backbone against transformers' `Qwen3_5MoeForCausalLM` (`backbone.md`, `model.md` §4–5):
//! every layer, the final norm and the restricted logits of a 70-row prefill and of 4 decode steps,
//! from `tests/fixtures/backbone/golden.safetensors` (written by `tools/reference/backbone.py`);
//! prefill/decode equivalences across the 64-row GDN chunk; the embedding mix for k = 0, 1, 3.
//! Run with `--nocapture` to see the measured errors.

mod common;

use std::path::PathBuf;
use std::sync::OnceLock;

use limelight::backend::backbone::{BackboneOps, ExpertActivations, MoeShape};
use limelight::backend::cpu::backbone::GdnState;
use limelight::backend::cpu::{Cpu, CpuWeight, Matrix};
use limelight::checkpoint::Dtype;
use limelight::checkpoint::safetensors::SafetensorsFile;
use limelight::model::backbone::{Backbone, BackboneConfig, BackboneError, BackboneState, LayerState, Stage};
use limelight::model::frame::Rows;
use limelight::model::load::Checkpoint;
use limelight::model::weights::{Mixer, ModelWeights};

const PROMPT_ROWS: usize = 70;
const DECODE_STEPS: usize = 4;
/// CPU (f32, f64 accumulation) vs transformers in f32 (`verification.md`).
const GOLDEN_BOUND: f64 = 1e-4;
/// Two algorithms of our own for the same quantity (`backbone.md` §3.6–3.7).
const EQUIVALENCE_BOUND: f64 = 1e-5;

struct Setup {
    config: BackboneConfig,
    weights: ModelWeights<CpuWeight>,
    golden: SafetensorsFile,
}

/// The tiny checkpoint the golden was made from (seed 7, k = 1), uploaded once for all tests.
fn setup() -> &'static Setup {
    static SETUP: OnceLock<Setup> = OnceLock::new();
    SETUP.get_or_init(|| {
        let dir = common::tiny_checkpoint();
        let ckpt = Checkpoint::open(dir.path()).unwrap();
        let config = BackboneConfig::from_model_config(&ckpt.config);
        let weights = ckpt.upload_model_weights(&Cpu).unwrap();
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/backbone/golden.safetensors");
        Setup { config, weights, golden: SafetensorsFile::open(&path).unwrap() }
    })
}

fn backbone(s: &'static Setup, config: BackboneConfig) -> Backbone<'static, Cpu> {
    Backbone::new(&Cpu, config, &s.weights.backbone, &s.weights.tower.codebook_embeddings).unwrap()
}

fn golden(name: &str) -> Matrix {
    let view = setup().golden.view(name).unwrap_or_else(|| panic!("golden tensor `{name}` missing"));
    assert_eq!(view.dtype, Dtype::F32, "{name}");
    Matrix::from_vec(view.shape[0], view.shape[1], view.to_f32_vec().unwrap())
}

/// All 74 rows `[token, c0..c9]`: the prompt, then the decode rows.
fn golden_rows() -> Rows {
    let view = setup().golden.view("rows").unwrap();
    assert_eq!((view.dtype, view.shape), (Dtype::I64, &[PROMPT_ROWS + DECODE_STEPS, 11][..]));
    let ids = view.bytes.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap()) as u32).collect();
    Rows::from_flat(10, ids)
}

fn slice_rows(rows: &Rows, range: std::ops::Range<usize>) -> Rows {
    Rows::from_flat(rows.codebooks(), rows.as_flat()[range.start * rows.width()..range.end * rows.width()].to_vec())
}

/// ‖a − b‖ / ‖b‖ in f64; NaN anywhere makes it NaN, which no bound accepts.
fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len(), "compared tensors differ in size");
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (&x, &y) in a.iter().zip(b) {
        num += (x as f64 - y as f64).powi(2);
        den += (y as f64).powi(2);
    }
    (num / den).sqrt()
}

fn check(stage: &str, ours: &[f32], reference: &[f32], bound: f64) -> f64 {
    let err = rel_l2(ours, reference);
    println!("{stage:<32} rel L2 {err:.2e}  (bound {bound:.0e})");
    assert!(err <= bound, "{stage}: relative L2 {err:.3e} exceeds {bound:.0e}");
    err
}

fn logits_of(bb: &Backbone<'_, Cpu>, hidden: &Matrix) -> Vec<f32> {
    (0..hidden.rows).flat_map(|r| bb.restricted_logits(hidden, r)).collect()
}

/// Runs prefill recording the residual stream after every layer.
fn prefill_layers(bb: &Backbone<'_, Cpu>, state: &mut BackboneState<Cpu>, rows: &Rows) -> (Vec<Matrix>, Matrix) {
    let mut layers = Vec::new();
    let out = bb.prefill_observed(state, rows, &mut |stage, x| {
        if let Stage::Layer(_) = stage {
            layers.push(x.clone())
        }
    });
    (layers, out.unwrap())
}

#[test]
fn prefill_matches_transformers() {
    let s = setup();
    let bb = backbone(s, s.config.clone());
    let rows = slice_rows(&golden_rows(), 0..PROMPT_ROWS);
    let embedding = bb.embed(&rows).unwrap();
    check("prefill embedding (k=1)", &embedding.data, &golden("embed.k1").data[..embedding.data.len()], 1e-6);
    let mut state = bb.new_state();
    let (layers, hidden) = prefill_layers(&bb, &mut state, &rows);
    assert_eq!(layers.len(), 8);
    for (l, x) in layers.iter().enumerate() {
        check(&format!("prefill layer {l}"), &x.data, &golden(&format!("prefill.layer.{l}")).data, GOLDEN_BOUND);
    }
    check("prefill final norm", &hidden.data, &golden("prefill.final_norm").data, GOLDEN_BOUND);
    check("prefill restricted logits", &logits_of(&bb, &hidden), &golden("prefill.logits").data, GOLDEN_BOUND);
    assert_eq!(state.position, PROMPT_ROWS);
}

#[test]
fn decode_steps_match_transformers() {
    let s = setup();
    let bb = backbone(s, s.config.clone());
    let rows = golden_rows();
    let mut state = bb.new_state();
    bb.prefill(&mut state, &slice_rows(&rows, 0..PROMPT_ROWS)).unwrap();
    for step in 0..DECODE_STEPS {
        let mut layers = Vec::new();
        let row = rows.row(PROMPT_ROWS + step);
        let hidden = bb
            .decode_observed(&mut state, row, &mut |stage, x| {
                if let Stage::Layer(_) = stage {
                    layers.push(x.clone())
                }
            })
            .unwrap();
        for (l, x) in layers.iter().enumerate() {
            let name = format!("decode.{step}.layer.{l}");
            check(&format!("decode {step} layer {l}"), &x.data, &golden(&name).data, GOLDEN_BOUND);
        }
        check(
            &format!("decode {step} final norm"),
            &hidden.data,
            &golden(&format!("decode.{step}.final_norm")).data,
            GOLDEN_BOUND,
        );
        let logits = bb.restricted_logits(&hidden, 0);
        check(
            &format!("decode {step} restricted logits"),
            &logits,
            &golden(&format!("decode.{step}.logits")).data,
            GOLDEN_BOUND,
        );
    }
    assert_eq!(state.position, PROMPT_ROWS + DECODE_STEPS);
}

#[test]
fn embedding_mix_matches_restatement_for_k_0_1_3() {
    let s = setup();
    let rows = golden_rows();
    let e_text = &s.weights.backbone.embed_tokens;
    let cb = &s.weights.tower.codebook_embeddings;
    let v = s.config.codebook_vocab;
    for k in [0, 1, 3] {
        let bb = backbone(s, BackboneConfig { vq_backbone_codebooks: k, ..s.config.clone() });
        let x = bb.embed(&rows).unwrap();
        check(&format!("embedding k={k} vs PyTorch re-statement"), &x.data, &golden(&format!("embed.k{k}")).data, 1e-6);
        for t in 0..rows.len() {
            let token = rows.token(t);
            let text = e_text.row(token as usize);
            if k == 0 || !s.config.is_semantic(token) {
                // mtp_shared_pre and text rows: exactly the token's own embedding.
                assert_eq!(x.row(t), text, "row {t}, k={k}");
            } else if k == 3 {
                // (E[tok] + CB[V + c1] + CB[2V + c2] + CB[3V + c3]) / 2, codes clamped to V − 1.
                let code = |i: usize| i * v + (rows.code(t, i) as usize).min(v - 1);
                for (d, &got) in x.row(t).iter().enumerate() {
                    let sum: f64 = text[d] as f64 + (1..=3).map(|i| cb.row(code(i))[d] as f64).sum::<f64>();
                    assert!((got as f64 - sum / 2.0).abs() <= 1e-6 * sum.abs().max(1.0), "row {t} dim {d}");
                }
            }
        }
    }
    // Row 20 carries c2 = V + 5: the k=3 mix must have used row V − 1 of codebook 2.
    assert!(rows.code(20, 2) as usize >= v && s.config.is_semantic(rows.token(20)));
}

/// A deterministic pseudo-random `[rows, cols]` matrix with entries in [−1, 1].
fn random_matrix(rows: usize, cols: usize, seed: u64) -> Matrix {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let data = (0..rows * cols)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect();
    Matrix::from_vec(rows, cols, data)
}

fn gdn_layer0() -> &'static limelight::model::weights::GdnWeights<CpuWeight> {
    match &setup().weights.backbone.layers[0].mixer {
        Mixer::GatedDeltaNet(w) => w,
        Mixer::Attention(_) => panic!("layer 0 is a GDN layer"),
    }
}

#[test]
fn chunked_and_recurrent_gdn_agree() {
    let s = setup();
    let (shape, w) = (&s.config.gdn, gdn_layer0());
    // 150 rows: two full 64-row chunks and a partial one.
    let x = random_matrix(150, s.config.hidden, 3);
    let (mut chunked, mut recurrent) = (Cpu.new_gdn_state(shape), Cpu.new_gdn_state(shape));
    let a = Cpu.gdn_prefill(shape, w, &x, &mut chunked);
    let b = Cpu.gdn_decode(shape, w, &x, &mut recurrent);
    check("gdn chunked vs recurrent output", &a.data, &b.data, EQUIVALENCE_BOUND);
    check("gdn chunked vs recurrent state", &chunked.recurrent, &recurrent.recurrent, EQUIVALENCE_BOUND);
    assert_eq!(chunked.conv, recurrent.conv, "both keep the last kernel−1 inputs");
    // Chunked prefill continuing a cached sequence: 70 rows, then 80 more.
    let mut split = Cpu.new_gdn_state(shape);
    let first = Cpu.gdn_prefill(shape, w, &Matrix::from_vec(70, x.cols, x.data[..70 * x.cols].to_vec()), &mut split);
    let rest = Cpu.gdn_prefill(shape, w, &Matrix::from_vec(80, x.cols, x.data[70 * x.cols..].to_vec()), &mut split);
    let joined: Vec<f32> = first.data.iter().chain(&rest.data).copied().collect();
    check("gdn prefill 70 + prefill 80 vs 150", &joined, &a.data, EQUIVALENCE_BOUND);
    check("gdn split prefill state", &split.recurrent, &chunked.recurrent, EQUIVALENCE_BOUND);
}

fn gdn_states(state: &BackboneState<Cpu>) -> Vec<&GdnState> {
    state.layers.iter().filter_map(|l| if let LayerState::Gdn(g) = l { Some(g) } else { None }).collect()
}

#[test]
fn prefill_then_decode_equals_one_longer_prefill() {
    let s = setup();
    let bb = backbone(s, s.config.clone());
    let rows = golden_rows();
    // n + m rows: within one chunk, crossing the 64-row boundary, and starting past it.
    for (n, m) in [(8, 4), (62, 4), (66, 4), (70, 4)] {
        let mut whole = bb.new_state();
        let reference = bb.prefill(&mut whole, &slice_rows(&rows, 0..n + m)).unwrap();
        let tail = &reference.data[n * reference.cols..];

        let mut stepped = bb.new_state();
        bb.prefill(&mut stepped, &slice_rows(&rows, 0..n)).unwrap();
        let decoded: Vec<f32> = (n..n + m).flat_map(|t| bb.decode(&mut stepped, rows.row(t)).unwrap().data).collect();
        check(&format!("prefill {n} + decode {m} vs prefill {}", n + m), &decoded, tail, EQUIVALENCE_BOUND);

        let mut continued = bb.new_state();
        bb.prefill(&mut continued, &slice_rows(&rows, 0..n)).unwrap();
        let more = bb.prefill(&mut continued, &slice_rows(&rows, n..n + m)).unwrap();
        check(&format!("prefill {n} + prefill {m} vs prefill {}", n + m), &more.data, tail, EQUIVALENCE_BOUND);

        for (a, b) in gdn_states(&stepped).into_iter().zip(gdn_states(&whole)) {
            assert!(rel_l2(&a.recurrent, &b.recurrent) <= EQUIVALENCE_BOUND, "GDN state after {n}+{m}");
            assert!(rel_l2(&a.conv.data, &b.conv.data) <= EQUIVALENCE_BOUND, "conv state after {n}+{m}");
        }
        assert_eq!((stepped.position, continued.position), (n + m, n + m));
    }
}

/// What a device-side step relies on: decoding a row from its precomputed embedding is decoding
/// the row, and a restarted state (caches emptied, GDN states zeroed, in place) runs a new
/// request exactly as a fresh state does.
#[test]
fn embedded_decode_and_restarted_state_match_the_plain_paths() {
    let s = setup();
    let bb = backbone(s, s.config.clone());
    let rows = golden_rows();
    let prompt = slice_rows(&rows, 0..PROMPT_ROWS);
    let next = slice_rows(&rows, PROMPT_ROWS..PROMPT_ROWS + 1);

    let mut plain = bb.new_state();
    bb.prefill(&mut plain, &prompt).unwrap();
    let want = bb.decode(&mut plain, next.row(0)).unwrap();

    // A state that first served another request, then restarted.
    let mut reused = bb.new_state();
    bb.prefill(&mut reused, &slice_rows(&rows, 5..40)).unwrap();
    bb.restart_state(&mut reused, &mut |layer| match layer {
        LayerState::Gdn(g) => {
            g.conv.data.fill(0.0);
            g.recurrent.fill(0.0);
        }
        LayerState::Attention(kv) => {
            kv.len = 0;
            kv.keys.clear();
            kv.values.clear();
        }
    })
    .unwrap();
    assert_eq!(reused.position, 0);
    bb.prefill(&mut reused, &prompt).unwrap();
    let got = bb.decode_embedded(&mut reused, bb.embed(&next).unwrap()).unwrap();
    assert_eq!(got.data, want.data, "embedded decode on a restarted state");
    assert_eq!(reused.position, plain.position);
}

#[test]
fn fp8_activation_emulation_is_a_small_perturbation() {
    let s = setup();
    let moe = &s.weights.backbone.layers[0].moe;
    let x = random_matrix(16, s.config.hidden, 5);
    let exact = Cpu.moe(&s.config.moe, moe, &x);
    let w8a8 = Cpu.moe(&MoeShape { activations: ExpertActivations::Fp8Dynamic, ..s.config.moe }, moe, &x);
    let err = rel_l2(&w8a8.data, &exact.data);
    println!("{:<32} rel L2 {err:.2e}  (expected 1e-3 .. 1e-1)", "MoE block, W8A8 vs exact");
    // e4m3 keeps 3 mantissa bits (≤ 6.25% per element): visibly different, still the same block.
    assert!(err > 1e-3 && err < 1e-1, "W8A8 emulation moved the MoE output by {err:.3e}");

    // End to end on random weights the perturbation compounds through the 8 layers.
    let mut config = s.config.clone();
    config.moe.activations = ExpertActivations::Fp8Dynamic;
    let bb = backbone(s, config);
    let hidden = bb.prefill(&mut bb.new_state(), &slice_rows(&golden_rows(), 0..PROMPT_ROWS)).unwrap();
    let err = rel_l2(&logits_of(&bb, &hidden), &golden("prefill.logits").data);
    println!("{:<32} rel L2 {err:.2e}  (informational)", "prefill logits, W8A8 vs golden");
    assert!(err.is_finite() && err > GOLDEN_BOUND, "the switch reaches the experts");
}

#[test]
fn bad_rows_are_refused() {
    let s = setup();
    let bb = backbone(s, s.config.clone());
    let mut state = bb.new_state();
    assert_eq!(bb.prefill(&mut state, &Rows::new(10)).unwrap_err(), BackboneError::Empty);
    let mut wide = Rows::new(11);
    wide.push_text(1);
    assert!(matches!(bb.prefill(&mut state, &wide), Err(BackboneError::RowWidth { found: 12, .. })));
    let mut out_of_vocab = Rows::new(10);
    out_of_vocab.push_text(s.config.vocab as u32);
    assert!(matches!(bb.prefill(&mut state, &out_of_vocab), Err(BackboneError::TokenOutOfRange { row: 0, .. })));
    assert!(matches!(bb.decode(&mut state, &[1, 2]), Err(BackboneError::RowWidth { found: 2, .. })));
    assert_eq!(state.position, 0, "refused calls leave the state alone");
    let mut too_many = s.config.clone();
    too_many.vq_backbone_codebooks = 10;
    let refused = Backbone::new(&Cpu, too_many, &s.weights.backbone, &s.weights.tower.codebook_embeddings);
    assert!(matches!(refused, Err(BackboneError::Codebooks { k: 10, .. })));
}

#[test]
fn restricted_order_is_band_then_eos() {
    let s = setup();
    let bb = backbone(s, s.config.clone());
    let ids = bb.restricted_token_ids();
    assert_eq!(ids.len(), s.config.codebook_vocab + 1);
    assert_eq!(ids[0], s.config.semantic_start);
    assert_eq!(ids[s.config.codebook_vocab - 1], s.config.semantic_start + s.config.codebook_vocab as u32 - 1);
    assert_eq!(ids[s.config.codebook_vocab], s.config.eos);
    // Index i is the dot product with lm_head row ids[i].
    let hidden = random_matrix(1, s.config.hidden, 9);
    let logits = bb.restricted_logits(&hidden, 0);
    let eos_row = s.weights.backbone.lm_head.row(s.config.eos as usize);
    let want: f64 = hidden.data.iter().zip(eos_row).map(|(&a, &b)| a as f64 * b as f64).sum();
    assert!((logits[s.config.codebook_vocab] as f64 - want).abs() < 1e-5);
}
