//! The decode batch on the CPU engine (the same batched engine the server runs): a request's
//! frames and PCM are bit for bit the same alone or stepped beside others, joining at any step,
//! with others joining, finishing, being cancelled and running their prompts in chunks around it.

mod common;

#[path = "common/batch_driver.rs"]
mod batch_driver;

use batch_driver::{Planned, alone, batched};
use limelight::backend::cpu::Cpu;
use limelight::engine::generate::{Engine, GenerateOptions, PREFILL_CHUNK, ResidentModel};
use limelight::engine::prefix::SharedPrefix;
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
