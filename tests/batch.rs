//! The decode batch on the CPU engine (the same batched engine the server runs): a request's
//! frames and PCM are bit for bit the same alone or stepped beside others, joining at any step,
//! with others joining, finishing, being cancelled and running their prompts in chunks around it.

mod common;

#[path = "common/batch_driver.rs"]
mod batch_driver;

use batch_driver::{Outcome, Planned, alone, batched};
use limelight::backend::cpu::Cpu;
use limelight::engine::generate::{Engine, FinishReason, Finished, GenerateOptions, PREFILL_CHUNK, ResidentModel};
use limelight::engine::prefix::SharedPrefix;
use limelight::model::frame::Rows;
use limelight::model::load::Checkpoint;
use limelight::model::sampling::SamplingParams;
use limelight::request::prompt::PromptBuilder;

fn requests(ckpt: &Checkpoint) -> Vec<Planned> {
    let prompt = PromptBuilder::for_checkpoint(ckpt);
    let rows = |text: &str| prompt.build(text, &[]).unwrap();
    let opts = |seed, max_frames, params: SamplingParams| GenerateOptions { params, seed, max_frames, stall: None };
    let hot = SamplingParams { temperature: 1.3, top_p: 0.9, top_k: Some(40) };
    let cold = SamplingParams { temperature: 0.5, top_p: 0.7, top_k: Some(8) };
    // Longer than a prefill chunk: its prompt runs over several turns while others step.
    let long = "A chapter long enough to need more than one prefill chunk. ".repeat(10);
    vec![
        Planned {
            prefix: SharedPrefix::NONE,
            rows: rows("Hello there, how are you today?"),
            opts: opts(3, 14, SamplingParams::default()),
            joins_at: 0,
            cancel_after: None,
        },
        Planned {
            prefix: SharedPrefix::NONE,
            rows: rows("[whispering] A second voice."),
            opts: opts(5, 9, hot),
            joins_at: 0,
            cancel_after: None,
        },
        Planned {
            prefix: SharedPrefix::NONE,
            rows: rows(&long),
            opts: opts(7, 11, cold),
            joins_at: 2,
            cancel_after: None,
        },
        Planned {
            prefix: SharedPrefix::NONE,
            rows: rows("Cancelled part way."),
            opts: opts(11, 30, SamplingParams::default()),
            joins_at: 3,
            cancel_after: Some(6),
        },
        Planned {
            prefix: SharedPrefix::NONE,
            rows: rows("Hello there, how are you today?"),
            opts: opts(13, 7, hot),
            joins_at: 9,
            cancel_after: None,
        },
    ]
}

#[test]
fn a_request_is_bit_identical_alone_and_in_any_batch() {
    let dir = common::tiny_checkpoint();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let model = ResidentModel::load(&ckpt, &Cpu).unwrap();
    let engine = Engine::new(&Cpu, &ckpt, &model).unwrap();
    let requests = requests(&ckpt);
    assert!(requests[2].rows.len() > PREFILL_CHUNK, "the long prompt needs several chunks");
    let want: Vec<_> = requests.iter().map(|r| alone(&engine, r)).collect();
    let (got, most) = batched(&engine, &requests);
    assert!(most.stepped >= 3, "several streams must step together (at most {} did)", most.stepped);
    assert!(most.prefilled >= 2, "prompts must run together (at most {} did)", most.prefilled);
    for (i, (r, (want, got))) in requests.iter().zip(want.iter().zip(&got)).enumerate() {
        assert!(
            got.matches(want, r.cancel_after, 2048),
            "request {i}: {:?} vs alone {:?}",
            got.finished,
            want.finished
        );
        if let Some(n) = r.cancel_after {
            assert_eq!(got.finished.frames, n, "request {i} was cancelled after {n} frames");
        }
    }
    // The same requests again, arriving in another order: the same bytes per request.
    let mut shuffled = requests;
    shuffled.reverse();
    for (r, joins_at) in shuffled.iter_mut().zip([0, 1, 1, 4, 6]) {
        r.joins_at = joins_at;
    }
    let (again, _) = batched(&engine, &shuffled);
    for (i, (r, got)) in shuffled.iter().zip(&again).enumerate() {
        let want = &want[shuffled.len() - 1 - i];
        assert!(got.matches(want, r.cancel_after, 2048), "reordered request {i}");
    }
}

/// A made-up outcome: `frames` frames of 2 codebooks (frame f's codes all f) and 4 samples a
/// frame (sample s of frame f is f + s/10).
fn outcome(reason: FinishReason, frames: usize) -> Outcome {
    let rows = Rows::from_flat(2, (0..frames).flat_map(|f| [f as u32; 3]).collect());
    let pcm = (0..frames).flat_map(|f| (0..4).map(move |s| f as f32 + s as f32 / 10.0)).collect();
    Outcome { finished: Finished { reason, frames, rows }, pcm }
}

/// The comparison's rule for a caller who cancels after 3 frames. EOS is a step of its own after
/// the last frame, so a lone run ending in EOS after exactly 3 frames is, in a batch, cancelled
/// first (GPU seed 1796508956315357660's request 22 of the batch of 32 was such a run, and the
/// earlier rule called it a mismatch); `max_frames` ends with the frame's own step, before it.
#[test]
fn the_cancel_rule_follows_when_each_ending_is_decided() {
    use FinishReason::{Cancelled, Length, Stop};
    let cancelled = outcome(Cancelled, 3);
    assert!(cancelled.matches(&outcome(Stop, 3), Some(3), 4), "EOS after the 3rd frame comes after the cancel");
    assert!(outcome(Stop, 3).matches(&outcome(Stop, 3), Some(4), 4), "EOS before the cancel: the whole run");
    assert!(!cancelled.matches(&outcome(Stop, 2), Some(3), 4), "EOS after 2 frames ends it before any cancel");
    assert!(outcome(Stop, 2).matches(&outcome(Stop, 2), Some(3), 4));
    assert!(outcome(Length, 3).matches(&outcome(Length, 3), Some(3), 4), "max_frames ends it with the 3rd frame");
    assert!(!cancelled.matches(&outcome(Length, 3), Some(3), 4));
    assert!(cancelled.matches(&outcome(Cancelled, 3), Some(3), 4));
    assert!(cancelled.matches(&outcome(Length, 9), Some(3), 4), "the first 3 frames of a longer run");
    let mut other = outcome(Length, 9);
    let kept = other.pcm[11];
    other.pcm[11] = 0.5;
    assert!(!cancelled.matches(&other, Some(3), 4), "a differing sample within the first 3 frames");
    other.pcm[11] = kept;
    other.pcm[12] = 0.5;
    assert!(cancelled.matches(&other, Some(3), 4), "a sample after them is not compared");
}
