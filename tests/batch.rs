//! The decode batch on the CPU engine (the same batched engine the server runs): a request's
//! frames and PCM are bit for bit the same alone or stepped beside others, joining at any step,
//! with others joining, finishing, being cancelled and running their prompts in chunks around it.

mod common;

use std::ops::ControlFlow;

use limelight::backend::cpu::Cpu;
use limelight::engine::generate::{
    Engine, FinishReason, Finished, GenerateOptions, Generation, PREFILL_CHUNK, ResidentModel,
};
use limelight::engine::sampling::SamplingParams;
use limelight::model::frame::Rows;
use limelight::model::load::Checkpoint;
use limelight::request::prompt::PromptBuilder;

/// One request of the test: its prompt, knobs, the step it joins at, and (maybe) the frame
/// after which its caller cancels it.
struct Request {
    rows: Rows,
    opts: GenerateOptions,
    joins_at: usize,
    cancel_after: Option<usize>,
}

/// What a request produced: how it ended, its frames and its PCM.
#[derive(Debug)]
struct Outcome {
    finished: Finished,
    pcm: Vec<f32>,
}

fn requests(ckpt: &Checkpoint) -> Vec<Request> {
    let prompt = PromptBuilder::for_checkpoint(ckpt);
    let rows = |text: &str| prompt.build(text, &[]).unwrap();
    let opts = |seed, max_frames, params: SamplingParams| GenerateOptions { params, seed, max_frames };
    let hot = SamplingParams { temperature: 1.3, top_p: 0.9, top_k: Some(40) };
    let cold = SamplingParams { temperature: 0.5, top_p: 0.7, top_k: Some(8) };
    // Longer than a prefill chunk: its prompt runs over several turns while others step.
    let long = "A chapter long enough to need more than one prefill chunk. ".repeat(10);
    vec![
        Request { rows: rows("Hello there, how are you today?"), opts: opts(3, 14, SamplingParams::default()), joins_at: 0, cancel_after: None },
        Request { rows: rows("[whispering] A second voice."), opts: opts(5, 9, hot), joins_at: 0, cancel_after: None },
        Request { rows: rows(&long), opts: opts(7, 11, cold), joins_at: 2, cancel_after: None },
        Request { rows: rows("Cancelled part way."), opts: opts(11, 30, SamplingParams::default()), joins_at: 3, cancel_after: Some(6) },
        Request { rows: rows("Hello there, how are you today?"), opts: opts(13, 7, hot), joins_at: 9, cancel_after: None },
    ]
}

/// A request run alone, through the public one-request API.
fn alone(engine: &Engine<'_, Cpu>, r: &Request) -> Outcome {
    let mut pcm = Vec::new();
    let mut frames = 0;
    let finished = engine
        .generate(&r.rows, &r.opts, &mut |chunk: &[f32]| {
            pcm.extend_from_slice(chunk);
            ControlFlow::Continue(())
        })
        .unwrap();
    frames += finished.frames;
    assert_eq!(pcm.len(), frames * 2048);
    Outcome { finished, pcm }
}

/// Every request through one batch: joining at its step, prompts one chunk per turn (oldest
/// first, as the worker runs them), every ready stream stepped together, cancellations honoured.
fn batched(engine: &Engine<'_, Cpu>, requests: &[Request]) -> Vec<Outcome> {
    struct Live<'w> {
        index: usize,
        generation: Generation<'w, Cpu>,
        pcm: Vec<f32>,
    }
    let mut outcomes: Vec<Option<Outcome>> = requests.iter().map(|_| None).collect();
    let mut live: Vec<Live<'_>> = Vec::new();
    let mut most = 0;
    for turn in 0.. {
        for (index, r) in requests.iter().enumerate().filter(|(_, r)| r.joins_at == turn) {
            live.push(Live { index, generation: engine.start(&r.rows, &r.opts).unwrap(), pcm: Vec::new() });
        }
        if let Some(l) = live.iter_mut().find(|l| !l.generation.ready()) {
            engine.prefill_generation(&mut l.generation, PREFILL_CHUNK).unwrap();
        }
        // The caller cancels between frames.
        if let Some(at) = live.iter().position(|l| {
            requests[l.index].cancel_after.is_some_and(|n| l.generation.ready() && l.generation.frames() == n)
        }) {
            let mut l = live.remove(at);
            l.pcm.extend(l.generation.cancel().unwrap());
            outcomes[l.index] = Some(Outcome { finished: l.generation.finish(FinishReason::Cancelled), pcm: l.pcm });
        }
        let mut ready: Vec<&mut Live<'_>> = live.iter_mut().filter(|l| l.generation.ready()).collect();
        most = most.max(ready.len());
        let mut generations: Vec<&mut Generation<'_, Cpu>> = ready.iter_mut().map(|l| &mut l.generation).collect();
        let stepped = engine.step(&mut generations);
        let mut ended = Vec::new();
        for (l, s) in ready.iter_mut().zip(stepped) {
            let s = s.unwrap();
            l.pcm.extend(s.pcm);
            if let Some(reason) = s.finished {
                ended.push((l.index, reason));
            }
        }
        for (index, reason) in ended {
            let at = live.iter().position(|l| l.index == index).unwrap();
            let l = live.remove(at);
            outcomes[index] = Some(Outcome { finished: l.generation.finish(reason), pcm: l.pcm });
        }
        if live.is_empty() && requests.iter().all(|r| r.joins_at <= turn) {
            break;
        }
    }
    assert!(most >= 3, "the test must step several streams together (at most {most} did)");
    outcomes.into_iter().map(|o| o.expect("every request ended")).collect()
}

fn bits(pcm: &[f32]) -> Vec<u32> {
    pcm.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn a_request_is_bit_identical_alone_and_in_any_batch() {
    let dir = common::tiny_checkpoint();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let model = ResidentModel::load(&ckpt, &Cpu).unwrap();
    let engine = Engine::new(&Cpu, &ckpt, &model).unwrap();
    let requests = requests(&ckpt);
    assert!(requests[2].rows.len() > PREFILL_CHUNK, "the long prompt needs several chunks");
    let want: Vec<Outcome> = requests.iter().map(|r| alone(&engine, r)).collect();
    let got = batched(&engine, &requests);
    for (i, (r, (want, got))) in requests.iter().zip(want.iter().zip(&got)).enumerate() {
        match r.cancel_after {
            None => {
                assert_eq!(got.finished, want.finished, "request {i}: rows and finish reason");
                assert_eq!(bits(&got.pcm), bits(&want.pcm), "request {i}: PCM bit for bit");
            }
            Some(n) => {
                // Cancelled after n frames: exactly the first n frames, and their audio.
                assert_eq!((got.finished.reason, got.finished.frames), (FinishReason::Cancelled, n), "request {i}");
                let w = want.finished.rows.width();
                assert_eq!(got.finished.rows.as_flat(), &want.finished.rows.as_flat()[..n * w], "request {i}");
                assert_eq!(bits(&got.pcm), bits(&want.pcm[..n * 2048]), "request {i}: PCM of its frames");
            }
        }
    }
    // The same batch again, in another order of arrival: the same bytes per request.
    let mut shuffled = requests;
    shuffled.reverse();
    for (r, joins_at) in shuffled.iter_mut().zip([0, 1, 1, 4, 6]) {
        r.joins_at = joins_at;
    }
    let again = batched(&engine, &shuffled);
    for (i, (r, got)) in shuffled.iter().zip(&again).enumerate().filter(|(_, (r, _))| r.cancel_after.is_none()) {
        let want = &want[shuffled.len() - 1 - i];
        assert_eq!(got.finished, want.finished, "reordered request {i} ({} frames)", r.opts.max_frames);
        assert_eq!(bits(&got.pcm), bits(&want.pcm), "reordered request {i}: PCM bit for bit");
    }
}
