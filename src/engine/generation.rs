//! One request's generation (`engine::generate`'s unit of work): where its frames come from,
//! the frames it produced, its audio (`engine::audio`: grouped for the codec, or held while a
//! long request's chunk may still be retried), and when it ends.

use super::audio::AudioOut;
use super::batch::Stream;
use super::generate::{FinishReason, Finished, FrameSource, GenerateError};
use super::stall::StallGuard;
use crate::backend::Backend;
use crate::model::frame::Rows;

/// Where a generation's frames come from.
pub(super) enum Source<'a, B: Backend> {
    /// A stream of the decode batch.
    Batch(Box<Stream<B>>),
    /// A backend's device-side step (one request at a time), and the request's `max_frames`.
    Device(Box<dyn FrameSource + 'a>, usize),
}

/// One request's generation: its frames, the codec's grouping of them into PCM, and when it
/// ends (EOS, `max_frames`, its stall guard, or the caller cancelling it).
pub struct Generation<'a, B: Backend> {
    pub(super) source: Source<'a, B>,
    pub(super) audio: AudioOut<'a, B>,
    pub(super) produced: Rows,
    /// The running prompt's stall guard.
    pub(super) stall: Option<StallGuard>,
    pub(super) done: bool,
}

/// What one step gave a generation.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Stepped {
    /// PCM the codec produced this step (often none: frames are grouped).
    pub pcm: Vec<f32>,
    /// With the generation's audio detached ([`Generation::detach_audio`]): the codes of the
    /// frames due for the codec this step, row-major `[n, codes_per_frame]` (often none), for
    /// the caller's own decoder to take in order. Empty otherwise.
    pub codes: Vec<u32>,
    /// Set when this step ended the generation (its PCM is then all flushed).
    pub finished: Option<FinishReason>,
}

impl<B: Backend> Generation<'_, B> {
    /// Whether its prompt is done (it can step).
    pub fn ready(&self) -> bool {
        match &self.source {
            Source::Batch(stream) => stream.ready(),
            Source::Device(..) => true,
        }
    }

    /// Prompt rows run so far (all of them, with a device-side step).
    pub fn prefilled_rows(&self) -> usize {
        match &self.source {
            Source::Batch(stream) => stream.prefilled_rows(),
            Source::Device(..) => 0,
        }
    }

    /// Audio frames produced so far.
    pub fn frames(&self) -> usize {
        self.produced.len()
    }

    /// The frames `[main, c0..c9]` produced so far (since the last [`Engine::continue_prompt`](super::generate::Engine::continue_prompt)).
    pub fn produced(&self) -> &Rows {
        &self.produced
    }

    /// Takes one frame (its codes wait for their codec group); returns why the generation
    /// ended with it, if it did.
    pub(super) fn take_frame(&mut self, row: Vec<u32>, eos: u32) -> Option<FinishReason> {
        let max_frames = match &self.source {
            Source::Batch(stream) => stream.opts.max_frames,
            Source::Device(_, max_frames) => *max_frames,
        };
        let finished = if row[0] == eos {
            Some(FinishReason::Stop)
        } else {
            self.produced.push_row(&row);
            self.audio.add(&row[1..]);
            if self.produced.len() >= max_frames {
                Some(FinishReason::Length)
            } else {
                self.stall.filter(|guard| guard.stalled(&self.produced)).map(|_| FinishReason::Stalled)
            }
        };
        self.done |= finished.is_some();
        finished
    }

    /// Hands its frames' codes out ([`Stepped::codes`]) instead of decoding them: the caller
    /// runs the codec (on its own thread and stream, so it overlaps the steps). Call it before
    /// the first step.
    pub fn detach_audio(&mut self) {
        assert!(self.produced.is_empty(), "detach_audio after frames were produced");
        self.audio.detach();
    }

    /// Holds the audio of the frames it produces from now on (a long request's chunk after the
    /// first, which the runaway guard may cut and generate again): none of it is decoded or
    /// handed out until [`Generation::settle_audio`]. Call it with no frame pending (after
    /// [`Engine::continue_prompt`](super::generate::Engine::continue_prompt)).
    pub fn hold_audio(&mut self) {
        self.audio.hold();
    }

    /// Settles held audio: `keep` lets it go to the codec now (the returned PCM, or with its
    /// audio detached, codes), else it is dropped unheard, as if those frames had never been
    /// produced for the decoder (an empty result).
    pub fn settle_audio(&mut self, keep: bool) -> Result<Stepped, GenerateError> {
        if keep {
            self.audio.release();
            self.flush()
        } else {
            self.audio.discard();
            Ok(Stepped::default())
        }
    }

    /// Ends it before its last frame: the audio of frames produced but not yet decoded (PCM,
    /// or with its audio detached, their codes).
    pub fn cancel(&mut self) -> Result<Stepped, GenerateError> {
        self.done = true;
        self.flush()
    }

    /// The audio of every pending frame, decoded here (in pieces of at most a codec group) or,
    /// detached, as codes.
    fn flush(&mut self) -> Result<Stepped, GenerateError> {
        let mut out = Stepped::default();
        if !self.audio.due(true) {
            return Ok(out);
        }
        if self.audio.attached() {
            out.pcm = AudioOut::decode(&mut [&mut self.audio]).pop().expect("one result")?;
        } else {
            out.codes = self.audio.take_codes();
        }
        Ok(out)
    }

    /// What it produced, ending with `reason`.
    pub fn finish(self, reason: FinishReason) -> Finished {
        Finished { reason, frames: self.produced.len(), rows: self.produced }
    }
}
