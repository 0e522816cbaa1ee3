//! Where a job's first audio spent its time, phase by phase: the number users feel most
//! (issue 14), split so that an operator (and a benchmark) can see which part to look at.
//!
//! The phases, each ending where the next begins:
//! - `queue`: admitted to the queue → the worker opens its stream;
//! - `open`: opening the stream (a kept voice prefix is copied in here);
//! - `prefill`: the stream's prompt rows, over as many worker turns as it takes (other streams'
//!   steps in those turns included: they are part of what this job waited for);
//! - `first_frame`: the step that made its first frame;
//! - `codec`: that frame's codes decoded to PCM (on the codec thread, or inside the step where the
//!   engine decodes there, then ~0).
//!
//! What happens before admission (parsing, the prompt built) and after (the encoder, the socket)
//! is the HTTP layer's: the request log's `time_to_first_audio_ms` covers all of it.

use std::time::{Duration, Instant};

use tracing::debug;

use crate::telemetry;

/// The instants a job passes on its way to its first audio.
#[derive(Debug)]
pub(super) struct FirstAudio {
    admitted: Instant,
    opening: Instant,
    joined: Instant,
    prefilled: Option<Instant>,
    first_frame: Option<Instant>,
    heard: bool,
}

impl FirstAudio {
    /// A job admitted at `admitted` whose stream was opened from `opening` to `joined`.
    pub(super) fn new(admitted: Instant, opening: Instant, joined: Instant) -> FirstAudio {
        FirstAudio { admitted, opening, joined, prefilled: None, first_frame: None, heard: false }
    }

    /// Its (first) prompt is done.
    pub(super) fn prefilled(&mut self, now: Instant) {
        self.prefilled.get_or_insert(now);
    }

    /// A step made one of its frames.
    pub(super) fn stepped(&mut self, now: Instant) {
        self.first_frame.get_or_insert(now);
    }

    /// Its audio went into its outbox: the first time, logs (at debug, in the job's span) and
    /// records each phase. Returns the phases then, `None` after.
    pub(super) fn heard(&mut self, span: &tracing::Span, prompt_rows: usize, now: Instant) -> Option<Phases> {
        if std::mem::replace(&mut self.heard, true) {
            return None;
        }
        let prefilled = self.prefilled.unwrap_or(self.joined);
        let first_frame = self.first_frame.unwrap_or(prefilled);
        let phases = Phases {
            queue: self.opening.saturating_duration_since(self.admitted),
            open: self.joined.saturating_duration_since(self.opening),
            prefill: prefilled.saturating_duration_since(self.joined),
            first_frame: first_frame.saturating_duration_since(prefilled),
            codec: now.saturating_duration_since(first_frame),
        };
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        span.in_scope(|| {
            debug!(
                prompt_rows,
                queue_ms = ms(phases.queue),
                open_ms = ms(phases.open),
                prefill_ms = ms(phases.prefill),
                first_frame_ms = ms(phases.first_frame),
                codec_ms = ms(phases.codec),
                "first audio"
            )
        });
        for (phase, took) in phases.named() {
            metrics::histogram!(telemetry::FIRST_AUDIO_PHASE_SECONDS, "phase" => phase).record(took.as_secs_f64());
        }
        Some(phases)
    }
}

/// How long each phase before a job's first audio took.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Phases {
    pub(super) queue: Duration,
    pub(super) open: Duration,
    pub(super) prefill: Duration,
    pub(super) first_frame: Duration,
    pub(super) codec: Duration,
}

impl Phases {
    /// Each phase with its metric label, in order.
    pub(super) fn named(&self) -> [(&'static str, Duration); 5] {
        [
            ("queue", self.queue),
            ("open", self.open),
            ("prefill", self.prefill),
            ("first_frame", self.first_frame),
            ("codec", self.codec),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_split_the_wait_at_each_instant_and_are_told_once() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut first = FirstAudio::new(t0, at(3), at(5));
        first.prefilled(at(30));
        first.prefilled(at(99)); // a later chunk's prompt: not the first audio's
        first.stepped(at(35));
        first.stepped(at(40));
        let phases = first.heard(&tracing::Span::none(), 200, at(37)).expect("the first audio");
        let ms = Duration::from_millis;
        assert_eq!(phases, Phases { queue: ms(3), open: ms(2), prefill: ms(25), first_frame: ms(5), codec: ms(2) });
        let total: Duration = phases.named().iter().map(|(_, d)| *d).sum();
        assert_eq!(total, ms(37), "the phases add up to admission → first audio");
        assert_eq!(first.heard(&tracing::Span::none(), 200, at(50)), None, "told once");
    }

    #[test]
    fn audio_without_a_separate_prefill_or_step_counts_from_joining() {
        // An engine that decodes inside its step, and a prompt restored whole from a kept prefix,
        // never mark some instants: the phases they would end are zero, never negative.
        let t0 = Instant::now();
        let mut first = FirstAudio::new(t0, t0, t0 + Duration::from_millis(4));
        let phases = first.heard(&tracing::Span::none(), 30, t0 + Duration::from_millis(9)).unwrap();
        assert_eq!(phases.prefill, Duration::ZERO);
        assert_eq!(phases.first_frame, Duration::ZERO);
        assert_eq!(phases.codec, Duration::from_millis(5));
    }
}
