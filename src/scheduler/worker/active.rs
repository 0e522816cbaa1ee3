//! One admitted job as the worker holds it: its stream's slot, its client, the events the
//! client has not taken yet, and the audio still on the codec thread.

use std::collections::VecDeque;
use std::time::Instant;

use tokio::sync::mpsc::error::TrySendError;
use tracing::{error, warn};

use super::first_audio::FirstAudio;
use super::pace::{ReaderPace, ReaderPolicy, Verdict};

use crate::engine::generate::GenerateOptions;
use crate::scheduler::job::{ChunkPrompt, JobEvent, MoreChunks, Reply};
use crate::scheduler::{StreamId, Synthesizer};
use crate::telemetry;

/// One admitted job: its stream in the model (while it has one), its client, and the events the
/// client has not taken yet.
pub(super) struct Active {
    /// The model's stream; `None` once it ended (the slot is free) while events still drain.
    pub(super) stream: Option<StreamId>,
    /// Its prompt is done: it takes a frame every step.
    pub(super) prefilled: bool,
    pub(super) reply: Reply,
    pub(super) span: tracing::Span,
    pub(super) outbox: VecDeque<JobEvent>,
    /// How its client keeps up (`--stall-timeout`, `--min-read-rate`).
    pub(super) pace: ReaderPace,
    pub(super) prompt_rows: usize,
    /// Prompt rows not yet run.
    pub(super) prompt_left: usize,
    /// When it joined the batch.
    pub(super) joined: Instant,
    /// The job is over for the worker: its client left or stalled (nothing more is sent).
    pub(super) gone: bool,
    /// The last event was queued: retire once the outbox is empty.
    pub(super) ended: bool,
    /// Its stream's key on the codec thread.
    pub(super) audio_key: u64,
    /// Frame groups sent to the codec thread whose PCM has not come back.
    pub(super) codec_pending: usize,
    /// Whether any group was sent (the codec thread then holds a decoder to drop).
    pub(super) codec_used: bool,
    /// Its first group is on the codec thread: the worker waits for it before the next step.
    pub(super) awaiting_first_audio: bool,
    /// The job's last event, held until its PCM is all back from the codec thread.
    pub(super) held_end: Option<JobEvent>,
    /// A long request's chunks after the one running (`None`: none left).
    pub(super) more: Option<Box<dyn MoreChunks>>,
    /// The request's own options (each chunk samples with its own seed, `chunk_seed`).
    pub(super) options: GenerateOptions,
    /// The running chunk (0 for the first).
    pub(super) chunk: usize,
    /// The running chunk's prompt, after the first (a retry runs it again).
    pub(super) chunk_prompt: Option<ChunkPrompt>,
    /// The running chunk's audio is held until it ends (the runaway guard may retry it).
    pub(super) holding: bool,
    /// The running chunk is a retry (its first take was cut and dropped).
    pub(super) retried: bool,
    /// Frames the ended chunks produced.
    pub(super) frames_before: usize,
    /// A chunk ended at its frame bound (`length`): so does the request.
    pub(super) cut: bool,
    /// Where its wait for its first audio went.
    pub(super) first_audio: FirstAudio,
    /// It runs its prompt's shared prefix only (`Scheduler::warm`): it ends once this many rows ran.
    pub(super) prefix_only: Option<usize>,
}

impl Active {
    /// Frees its slot, if it still holds one, counting its frames; returns the request's frames
    /// (every chunk's; 0 if it held no slot).
    pub(super) fn close(&mut self, model: &dyn Synthesizer) -> usize {
        let Some(id) = self.stream.take() else { return 0 };
        let frames = self.frames_before + model.close(id);
        metrics::counter!(telemetry::FRAMES_GENERATED).increment((frames - self.frames_before) as u64);
        let audio_secs = (frames * model.samples_per_frame()) as f64 / f64::from(model.sample_rate());
        if audio_secs > 0.0 {
            let rtf = self.joined.elapsed().as_secs_f64() / audio_secs;
            metrics::histogram!(telemetry::STREAM_REAL_TIME_FACTOR).record(rtf);
        }
        frames
    }

    /// Closes its stream and queues `last`, the job's final event (unless its client is gone).
    /// A finish waits for the PCM still on the codec thread; a failure does not.
    pub(super) fn end(&mut self, model: &dyn Synthesizer, last: JobEvent) {
        self.close(model);
        if self.codec_pending > 0 && !self.gone && matches!(last, JobEvent::Finished { .. }) {
            self.held_end = Some(last);
            return;
        }
        if !self.gone {
            self.outbox.push_back(last);
        }
        self.ended = true;
    }

    /// Takes a group's PCM back from the codec thread (or its failure, which fails the job).
    /// Returns whether the job failed.
    pub(super) fn decoded(&mut self, model: &dyn Synthesizer, pcm: Result<Vec<f32>, String>) -> bool {
        self.codec_pending -= 1;
        self.awaiting_first_audio = false;
        if self.ended || self.gone {
            return false;
        }
        match pcm {
            Ok(pcm) => {
                self.push_audio(pcm);
                if self.codec_pending == 0
                    && let Some(last) = self.held_end.take()
                {
                    self.outbox.push_back(last);
                    self.ended = true;
                }
                false
            }
            Err(message) => {
                self.span.in_scope(|| error!(error = %message, "job failed"));
                self.held_end = None;
                self.end(model, JobEvent::Failed { message });
                true
            }
        }
    }

    /// Queues PCM for its client (none if empty); the first marks its first audio.
    pub(super) fn push_audio(&mut self, pcm: Vec<f32>) {
        if pcm.is_empty() {
            return;
        }
        self.first_audio.heard(&self.span, self.prompt_rows, Instant::now());
        self.outbox.push_back(JobEvent::Audio(pcm));
    }

    /// Events queued or on their way from the codec thread (the stream pauses at [`super::OUTBOX_EVENTS`]).
    pub(super) fn backlog(&self) -> usize {
        self.outbox.len() + self.codec_pending
    }

    /// Hands waiting events to the client without blocking; gives the client up once it falls
    /// behind `policy` (audio at `sample_rate`).
    pub(super) fn deliver(&mut self, policy: &ReaderPolicy, sample_rate: u32, now: Instant) {
        let mut progressed = false;
        while let Some(event) = self.outbox.pop_front() {
            let samples = match &event {
                JobEvent::Audio(pcm) => pcm.len(),
                _ => 0,
            };
            match self.reply.tx.try_send(event) {
                Ok(()) => {
                    self.pace.took(samples);
                    progressed = true;
                }
                Err(TrySendError::Full(event)) => {
                    self.outbox.push_front(event);
                    break;
                }
                Err(TrySendError::Closed(_)) => {
                    self.gone = true;
                    break;
                }
            }
        }
        if self.gone {
            return;
        }
        let waiting = !self.outbox.is_empty();
        match self.pace.judge(waiting, progressed, now, policy, sample_rate) {
            Verdict::KeepsUp => {}
            Verdict::Stalled => {
                let _enter = self.span.enter();
                warn!(stall_secs = policy.stall_timeout.as_secs_f64(), "client stopped reading; job given up");
                metrics::counter!(telemetry::SLOW_CLIENTS_GIVEN_UP_TOTAL, "why" => "stalled").increment(1);
                self.gone = true;
            }
            Verdict::TooSlow { rate } => {
                let _enter = self.span.enter();
                warn!(
                    read_rate = rate,
                    min_read_rate = policy.min_read_rate,
                    "client reads slower than the least rate; job given up"
                );
                metrics::counter!(telemetry::SLOW_CLIENTS_GIVEN_UP_TOTAL, "why" => "too_slow").increment(1);
                self.gone = true;
            }
        }
    }
}
