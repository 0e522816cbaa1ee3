//! The sampler (`model.md` §8.1-8.3) against the golden of tools/reference/sampling.py (a PyTorch restatement of
//! sglang-omni 0.1.9 `sampling.py` fed our Philox uniforms), Philox against Random123's published vectors, and the
//! exponential race against the probabilities it should realise.
//! Regenerate: `.cache/reference/venv/bin/python (tools/reference/setup.sh) tools/reference/sampling.py`.

use std::path::Path;

use limelight::model::frame::Rows;
use limelight::model::rng::{DrawKey, philox4x32_10};
use limelight::model::sampling::{
    Crossing, Filter, MainCandidates, ParamsError, RasWindow, SamplingError, SamplingParams, kept_candidates,
    sample_head, sample_main, sample_top_k_top_p,
};
use serde_json::Value;

fn golden() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sampling/golden.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn u64_of(v: &Value) -> u64 {
    v.as_u64().unwrap()
}

fn logits_of(case: &Value) -> Vec<f32> {
    // The golden writes each f32 as the f64 of the same value, so the cast is exact.
    case["logits"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect()
}

fn top_k_of(case: &Value) -> Option<u32> {
    case["top_k"].as_u64().map(|k| k as u32)
}

#[test]
fn philox_matches_random123_known_answers() {
    // Random123 tests/kat_vectors, philox4x32 10 (also in the golden, checked by the Python side).
    let kat: [([u32; 4], [u32; 2], [u32; 4]); 3] = [
        ([0; 4], [0; 2], [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]),
        ([u32::MAX; 4], [u32::MAX; 2], [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd]),
        (
            [0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344],
            [0xa4093822, 0x299f31d0],
            [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1],
        ),
    ];
    for (counter, key, out) in kat {
        assert_eq!(philox4x32_10(counter, key), out);
    }
    let words = |v: &Value| -> Vec<u32> { v.as_array().unwrap().iter().map(|w| u64_of(w) as u32).collect() };
    for case in golden()["philox_kat"].as_array().unwrap() {
        let (c, k) = (words(&case["counter"]), words(&case["key"]));
        let got = philox4x32_10([c[0], c[1], c[2], c[3]], [k[0], k[1]]);
        assert_eq!(got.to_vec(), words(&case["out"]));
    }
}

#[test]
fn draw_keys_match_the_python_philox() {
    for case in golden()["draw_keys"].as_array().unwrap() {
        let key = DrawKey::new(u64_of(&case["seed"]), u64_of(&case["frame"]), u64_of(&case["stream"]) as u32);
        let candidate = u64_of(&case["candidate"]) as u32;
        assert_eq!(u64::from(key.bits(candidate)), u64_of(&case["bits"]), "{case}");
        assert_eq!(key.uniform(candidate), case["uniform"].as_f64().unwrap() as f32, "{case}");
    }
}

#[test]
fn head_picks_match_the_reference() {
    let g = golden();
    for case in g["heads"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let logits = logits_of(case);
        let params = SamplingParams {
            temperature: case["temperature"].as_f64().unwrap() as f32,
            top_p: case["top_p"].as_f64().unwrap() as f32,
            // The golden's head top_k is already min(request, 30); a request of 30 and none both give 30.
            top_k: top_k_of(case).filter(|&k| k != 30),
        };
        let seed = u64_of(&case["seed"]);
        for pick in case["picks"].as_array().unwrap() {
            let (frame, head) = (u64_of(&pick["frame"]), u64_of(&pick["head"]) as usize);
            let code = sample_head(&logits, head, &params, seed, frame).unwrap();
            assert_eq!(u64::from(code), u64_of(&pick["code"]), "case {name}, frame {frame}, head {head}");
            let kept = kept_candidates(&logits, &params.head_filter()).unwrap().len();
            assert_eq!(kept as u64, u64_of(&pick["kept"]), "case {name}: kept set size");
        }
    }
}

#[test]
fn main_picks_with_ras_match_the_reference() {
    let g = golden();
    let mut ras_used = 0;
    for case in g["mains"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let logits = logits_of(case);
        let candidates = MainCandidates::new(
            u64_of(&case["semantic_start"]) as u32,
            u64_of(&case["codes"]) as u32,
            u64_of(&case["eos"]) as u32,
        );
        assert_eq!(candidates.len(), logits.len(), "case {name}");
        let params = SamplingParams {
            temperature: case["temperature"].as_f64().unwrap() as f32,
            top_p: case["top_p"].as_f64().unwrap() as f32,
            top_k: top_k_of(case),
        };
        params.validate().unwrap();
        let seed = u64_of(&case["seed"]);
        let mut window =
            RasWindow::from_tokens(case["initial_window"].as_array().unwrap().iter().map(|t| u64_of(t) as u32));
        for pick in case["picks"].as_array().unwrap() {
            let frame = u64_of(&pick["frame"]);
            let got = sample_main(&logits, &candidates, &window, &params, seed, frame).unwrap();
            let at = format!("case {name}, frame {frame}");
            assert_eq!(u64::from(got.first), u64_of(&pick["first"]), "{at}: first draw");
            assert_eq!(u64::from(got.ras), u64_of(&pick["ras"]), "{at}: RAS draw");
            assert_eq!(got.ras_used, pick["ras_used"].as_bool().unwrap(), "{at}: RAS decision");
            assert_eq!(u64::from(got.token), u64_of(&pick["token"]), "{at}: main token");
            let kept = kept_candidates(&logits, &params.main_filter()).unwrap().len();
            assert_eq!(kept as u64, u64_of(&pick["first_kept"]), "{at}: first draw's kept set");
            ras_used += usize::from(got.ras_used);
            window.push(got.token);
        }
    }
    assert!(ras_used > 0, "the golden exercises RAS");
}

#[test]
fn same_key_same_pick_and_seeds_differ() {
    let logits: Vec<f32> = (0..256).map(|i| ((i * 37 % 101) as f32) / 50.0).collect();
    let filter = Filter { temperature: 1.0, top_k: usize::MAX, top_p: 1.0, crossing: Crossing::Keep };
    let picks = |seed| -> Vec<usize> {
        (0..64).map(|f| sample_top_k_top_p(&logits, &filter, &DrawKey::new(seed, f, 0)).unwrap()).collect()
    };
    assert_eq!(picks(9), picks(9));
    assert_ne!(picks(9), picks(10));
    // Streams of one frame are independent draws too.
    let by_stream: Vec<usize> =
        (0..11).map(|s| sample_top_k_top_p(&logits, &filter, &DrawKey::new(9, 0, s)).unwrap()).collect();
    assert!(by_stream.iter().any(|&p| p != by_stream[0]), "{by_stream:?}");
}

/// Draws `n` frames and returns how often each index was picked.
fn histogram(logits: &[f32], filter: &Filter, n: u64) -> Vec<u64> {
    let mut counts = vec![0u64; logits.len()];
    for frame in 0..n {
        counts[sample_top_k_top_p(logits, filter, &DrawKey::new(0xC0FFEE, frame, 3)).unwrap()] += 1;
    }
    counts
}

/// Each kept candidate's frequency within 5 sigma of its renormalised probability, Pearson's chi-square within
/// 6 sigma of its mean, and no dropped candidate ever picked.
fn assert_realises(logits: &[f32], filter: &Filter, n: u64) {
    let kept = kept_candidates(logits, filter).unwrap();
    let total: f64 = kept.iter().map(|k| k.1).sum();
    let counts = histogram(logits, filter, n);
    let mut chi2 = 0.0;
    for &(index, weight) in &kept {
        let p = weight / total;
        let expected = p * n as f64;
        let sigma = (n as f64 * p * (1.0 - p)).sqrt();
        let z = (counts[index] as f64 - expected) / sigma.max(1e-12);
        assert!(z.abs() < 5.0, "candidate {index}: {} picks, expected {expected:.1} (z = {z:.2})", counts[index]);
        chi2 += (counts[index] as f64 - expected).powi(2) / expected;
    }
    let df = (kept.len() - 1) as f64;
    assert!(chi2 < df + 6.0 * (2.0 * df).sqrt(), "chi-square {chi2:.1} with {df} degrees of freedom");
    let picked_kept: u64 = kept.iter().map(|k| counts[k.0]).sum();
    assert_eq!(picked_kept, n, "a dropped candidate was picked");
}

#[test]
fn exponential_race_realises_the_kept_probabilities() {
    // Probabilities 0.4, 0.3, 0.15, 0.1, 0.05 (as logits), no truncation.
    let p = [0.4f64, 0.3, 0.15, 0.1, 0.05];
    let logits: Vec<f32> = p.iter().map(|x| x.ln() as f32).collect();
    let full = Filter { temperature: 1.0, top_k: usize::MAX, top_p: 1.0, crossing: Crossing::Drop };
    assert_realises(&logits, &full, 200_000);
    // Temperature 2 flattens; top-p 0.8 with the crossing token kept keeps the first three (0.4 + 0.3 < 0.8).
    let hot = Filter { temperature: 2.0, top_k: usize::MAX, top_p: 0.8, crossing: Crossing::Keep };
    assert_realises(&logits, &hot, 100_000);
    // A head-like draw over 256 codes with top-k 30.
    let wide: Vec<f32> = (0..256).map(|i| ((i * 7919 % 256) as f32) / 40.0).collect();
    let head = Filter { temperature: 1.0, top_k: 30, top_p: 0.9, crossing: Crossing::Drop };
    assert_realises(&wide, &head, 60_000);
}

#[test]
fn uniforms_and_exponentials_have_the_right_moments() {
    let key = DrawKey::new(123, 456, 7);
    let n = 100_000u32;
    let (mut su, mut se) = (0.0f64, 0.0f64);
    for c in 0..n {
        su += f64::from(key.uniform(c));
        se += key.exponential(c);
    }
    let (mu, me) = (su / f64::from(n), se / f64::from(n));
    // Standard errors: 0.289 / sqrt(n) and 1 / sqrt(n); allow 5 sigma.
    assert!((mu - 0.5).abs() < 5.0 * 0.2887 / f64::from(n).sqrt(), "uniform mean {mu}");
    assert!((me - 1.0).abs() < 5.0 / f64::from(n).sqrt(), "exponential mean {me}");
}

#[test]
fn parameters_defaults_ranges_and_head_cap() {
    let d = SamplingParams::default();
    assert_eq!((d.temperature, d.top_p, d.top_k), (1.0, 0.9, None));
    assert_eq!(d.main_filter().top_k, usize::MAX);
    assert_eq!(d.head_filter().top_k, 30);
    assert_eq!(d.head_filter().crossing, Crossing::Drop);
    assert_eq!(d.main_filter().crossing, Crossing::Keep);
    assert_eq!(SamplingParams { top_k: Some(12), ..d }.head_filter().top_k, 12);
    assert_eq!(SamplingParams { top_k: Some(500), ..d }.head_filter().top_k, 30);
    assert_eq!(SamplingParams { top_k: Some(500), ..d }.main_filter().top_k, 500);
    let bad = [
        (SamplingParams { temperature: -0.1, ..d }, "temperature"),
        (SamplingParams { temperature: f32::NAN, ..d }, "temperature"),
        (SamplingParams { temperature: f32::INFINITY, ..d }, "temperature"),
        (SamplingParams { top_p: 0.0, ..d }, "top_p"),
        (SamplingParams { top_p: 1.01, ..d }, "top_p"),
        (SamplingParams { top_k: Some(0), ..d }, "top_k"),
        (SamplingParams { top_k: Some(i32::MAX as u32 + 1), ..d }, "top_k"),
    ];
    for (params, field) in bad {
        let e: ParamsError = params.validate().unwrap_err();
        assert_eq!(e.field(), field);
        assert!(e.to_string().starts_with(field), "{e}");
    }
    assert_eq!(SamplingParams { temperature: 0.0, top_p: 1.0, top_k: Some(1) }.validate(), Ok(()));
}

#[test]
fn unsampleable_logits_are_errors() {
    let f = SamplingParams::default().head_filter();
    let key = DrawKey::new(1, 0, 2);
    assert!(matches!(
        sample_top_k_top_p(&[0.0, f32::NAN, 1.0], &f, &key),
        Err(SamplingError::NonFinite { index: 1, .. })
    ));
    assert!(matches!(
        sample_top_k_top_p(&[0.0, f32::INFINITY], &f, &key),
        Err(SamplingError::NonFinite { index: 1, .. })
    ));
    assert_eq!(sample_top_k_top_p(&[f32::NEG_INFINITY; 4], &f, &key), Err(SamplingError::NoCandidates));
    assert_eq!(sample_top_k_top_p(&[], &f, &key), Err(SamplingError::NoCandidates));
    // -inf logits are simply never picked.
    assert_eq!(sample_top_k_top_p(&[f32::NEG_INFINITY, 0.5, f32::NEG_INFINITY], &f, &key), Ok(1));
}

#[test]
fn main_candidates_window_and_code0() {
    // EOS below the band: restricted row 0 is EOS (S1's sorted candidate ids).
    let c = MainCandidates::new(984, 256, 958);
    assert_eq!((c.len(), c.token(0), c.token(1), c.token(256)), (257, 958, 984, 1239));
    assert_eq!((c.code0(958), c.code0(984), c.code0(1239)), (0, 0, 255));
    // EOS above the band: it is the last row, and its c0 clamps to V - 1.
    let c = MainCandidates::new(100, 8, 500);
    assert_eq!((c.token(8), c.code0(500)), (500, 7));
    assert!(c.is_semantic(107) && !c.is_semantic(500) && !c.is_semantic(108));

    let mut rows = Rows::new(2);
    for t in 0..20 {
        rows.push_text(t);
    }
    let mut w = RasWindow::from_prompt(&rows);
    assert!(!w.contains(3) && w.contains(4) && w.contains(19));
    w.push(77);
    assert!(w.contains(77) && !w.contains(4) && w.contains(5));
    let mut short = Rows::new(2);
    short.push_audio(100, &[7, 1]);
    short.push_text(9);
    let w = RasWindow::from_prompt(&short);
    assert!(w.contains(107) && w.contains(9) && !w.contains(0));
}
