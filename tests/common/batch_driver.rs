//! Runs planned requests through one decode batch as the worker does (shared by the CPU batch
//! test and the GPU checks): each joins at its turn, every prompt still running takes one chunk
//! per turn (all of them in one prefill call), every ready stream steps together, and a planned cancellation ends its request
//! between frames. Also runs a request alone, for the comparison.

#![allow(dead_code)]

use std::ops::ControlFlow;

use limelight::backend::Backend;
use limelight::engine::generate::{Engine, FinishReason, Finished, GenerateOptions, Generation, PREFILL_CHUNK};
use limelight::engine::prefix::SharedPrefix;
use limelight::model::frame::Rows;
use limelight::model::load::Checkpoint;
use limelight::request::prompt::{PromptBuilder, Reference};
use limelight::request::text::{CallerText, Field};

/// One planned request: its prompt, knobs, the turn it joins at, and (maybe) the frame count
/// after which its caller cancels it.
#[derive(Clone, Debug)]
pub struct Planned {
    pub rows: Rows,
    /// The prompt's shared rows (a voice's), as the request layer marks them.
    pub prefix: SharedPrefix,
    pub opts: GenerateOptions,
    pub joins_at: usize,
    pub cancel_after: Option<usize>,
}

/// What a request produced: how it ended, its frames and its PCM.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub finished: Finished,
    pub pcm: Vec<f32>,
}

impl Outcome {
    pub fn pcm_bits(&self) -> Vec<u32> {
        self.pcm.iter().map(|x| x.to_bits()).collect()
    }

    /// Whether `self` (from a batch) is what `alone` produced for the same request: the same
    /// rows, reason and PCM bits; for a request cancelled after `n` frames, exactly the first `n`
    /// frames of the lone run and their audio. A request whose lone run ends by itself before its
    /// caller's cancel comes ends the same way in the batch: then it must equal the lone run
    /// whole. That is a run of fewer than `n` frames, or of exactly `n` ended by the `n`-th
    /// frame's own step (`max_frames`, the stall guard). EOS is a step of its own, after the
    /// last frame, so a lone run ending in EOS after exactly `n` frames is cancelled in the batch
    /// first, between frames: the first `n` frames rule applies.
    pub fn matches(&self, alone: &Outcome, cancel_after: Option<usize>, samples_per_frame: usize) -> bool {
        let whole = self.finished == alone.finished && self.pcm_bits() == alone.pcm_bits();
        match cancel_after {
            None => whole,
            Some(n) if ends_before_cancel(&alone.finished, n) => whole,
            Some(n) => {
                let w = alone.finished.rows.width();
                self.finished.reason == FinishReason::Cancelled
                    && self.finished.frames == n
                    && self.finished.rows.as_flat() == &alone.finished.rows.as_flat()[..self.finished.frames * w]
                    && self.pcm_bits()[..] == alone.pcm_bits()[..self.finished.frames * samples_per_frame]
            }
        }
    }
}

/// Whether a lone run that `finished` so ends before a caller who cancels after `n` frames
/// (between frames, as [`batched`] does) would cancel it.
fn ends_before_cancel(finished: &Finished, n: usize) -> bool {
    match finished.reason {
        FinishReason::Cancelled => false,
        FinishReason::Stop => finished.frames < n,
        FinishReason::Length | FinishReason::Stalled => finished.frames <= n,
    }
}

/// What differs between `self` (from a batch) and `alone`, for a failed [`Outcome::matches`]: how
/// each ended, the first frame whose codes differ, and the first PCM sample that differs.
pub fn difference(got: &Outcome, alone: &Outcome) -> String {
    let w = alone.finished.rows.width();
    let (g, a) = (got.finished.rows.as_flat(), alone.finished.rows.as_flat());
    let frame =
        (0..got.finished.frames.min(alone.finished.frames)).find(|&f| g[f * w..(f + 1) * w] != a[f * w..(f + 1) * w]);
    let (gp, ap) = (got.pcm_bits(), alone.pcm_bits());
    let sample = gp.iter().zip(&ap).position(|(x, y)| x != y);
    format!(
        "{:?} after {} frames ({} samples) against {:?} after {} ({} samples alone); first frame differing {:?}, \
         first sample differing {:?}",
        got.finished.reason,
        got.finished.frames,
        gp.len(),
        alone.finished.reason,
        alone.finished.frames,
        ap.len(),
        frame,
        sample
    )
}

/// The request alone, through the public one-request API.
pub fn alone<B: Backend>(engine: &Engine<'_, B>, r: &Planned) -> Outcome {
    let mut pcm = Vec::new();
    let finished = engine
        .generate_prompt(&r.rows, r.prefix, &r.opts, &mut |chunk: &[f32]| {
            pcm.extend_from_slice(chunk);
            ControlFlow::Continue(())
        })
        .expect("generate alone");
    Outcome { finished, pcm }
}

/// How many streams shared a call at most.
#[derive(Clone, Copy, Debug, Default)]
pub struct Together {
    pub stepped: usize,
    pub prefilled: usize,
}

/// Every request through one batch; returns the outcomes in plan order and how many streams
/// stepped and prefilled together at most.
pub fn batched<B: Backend>(engine: &Engine<'_, B>, plan: &[Planned]) -> (Vec<Outcome>, Together) {
    struct Live<'w, B: Backend> {
        index: usize,
        generation: Generation<'w, B>,
        pcm: Vec<f32>,
    }
    let mut outcomes: Vec<Option<Outcome>> = plan.iter().map(|_| None).collect();
    let mut live: Vec<Live<'_, B>> = Vec::new();
    let mut most = Together::default();
    for turn in 0.. {
        for (index, r) in plan.iter().enumerate().filter(|(_, r)| r.joins_at == turn) {
            let generation = engine.start_prompt(&r.rows, r.prefix, &r.opts).expect("start");
            live.push(Live { index, generation, pcm: Vec::new() });
        }
        // One prompt chunk of every stream still on its prompt, all in one call as the worker
        // runs them (a long prompt runs over several turns while others step).
        let mut prefilling: Vec<&mut Generation<'_, B>> =
            live.iter_mut().filter(|l| !l.generation.ready()).map(|l| &mut l.generation).collect();
        most.prefilled = most.prefilled.max(prefilling.len());
        if !prefilling.is_empty() {
            engine.prefill_generations(&mut prefilling, PREFILL_CHUNK).expect("prefill");
        }
        // The caller cancels between frames.
        while let Some(at) = live.iter().position(|l| {
            plan[l.index].cancel_after.is_some_and(|n| l.generation.ready() && l.generation.frames() == n)
        }) {
            let mut l = live.remove(at);
            l.pcm.extend(l.generation.cancel().expect("cancel").pcm);
            outcomes[l.index] = Some(Outcome { finished: l.generation.finish(FinishReason::Cancelled), pcm: l.pcm });
        }
        let mut ready: Vec<&mut Live<'_, B>> = live.iter_mut().filter(|l| l.generation.ready()).collect();
        most.stepped = most.stepped.max(ready.len());
        let mut generations: Vec<&mut Generation<'_, B>> = ready.iter_mut().map(|l| &mut l.generation).collect();
        let stepped = if generations.is_empty() { Vec::new() } else { engine.step(&mut generations) };
        let mut ended = Vec::new();
        for (l, s) in ready.iter_mut().zip(stepped) {
            let s = s.expect("step");
            l.pcm.extend(s.pcm);
            if let Some(reason) = s.finished {
                ended.push((l.index, reason));
            }
        }
        for (index, reason) in ended {
            let at = live.iter().position(|l| l.index == index).expect("live");
            let l = live.remove(at);
            outcomes[index] = Some(Outcome { finished: l.generation.finish(reason), pcm: l.pcm });
        }
        if live.is_empty() && plan.iter().all(|r| r.joins_at <= turn) {
            break;
        }
    }
    (outcomes.into_iter().map(|o| o.expect("every request ended")).collect(), most)
}

/// A voice for voice-prefix checks: random codes of `frames` frames (from `seed`) and a
/// transcript.
pub fn voice(ckpt: &Checkpoint, seed: u64, frames: usize) -> Reference {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % ckpt.dims.codebook_vocab as u64) as u32
    };
    let codes = (0..ckpt.dims.codebooks).map(|_| (0..frames).map(|_| next()).collect()).collect();
    Reference { transcript: format!("Reference number {seed}."), codes }
}

/// A request saying `text` in `voice`, its prefix kept as a stored voice's is.
pub fn in_voice(ckpt: &Checkpoint, text: &str, voice: &Reference, opts: GenerateOptions, joins_at: usize) -> Planned {
    let text = CallerText::check(text.to_owned(), Field::Input).expect("test text");
    let prompt = PromptBuilder::for_checkpoint(ckpt).build_prompt(&text, std::slice::from_ref(voice)).expect("prompt");
    Planned { prefix: prompt.voice_prefix(true), rows: prompt.rows, opts, joins_at, cancel_after: None }
}
