//! A job and its reply stream: what a request hands the worker thread, and the events it gets
//! back. Dropping the stream cancels the job.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use tokio::sync::{mpsc, oneshot};

use crate::engine::generate::{FinishReason, GenerateOptions, StallGuard};
use crate::engine::prefix::SharedPrefix;
use crate::model::frame::Rows;

/// Events buffered per job before the worker waits for the client: at most this many PCM
/// chunks (each up to 8 frames, about 0.37 s) sit between the engine and a slow reader.
pub const REPLY_CAPACITY: usize = 16;

/// One speech request as the worker runs it.
#[derive(Debug)]
pub struct Job {
    pub request_id: String,
    /// The prompt rows, built from the checked text before the job was submitted.
    pub rows: Rows,
    /// The rows other prompts share (a voice's system message) and whether to keep their state.
    pub prefix: SharedPrefix,
    pub options: GenerateOptions,
    /// The request's span: the worker logs inside it, so its lines carry the request id.
    pub span: tracing::Span,
    /// A long request's further chunks, after the one `rows` holds (`None`: one chunk).
    pub more: Option<Box<dyn MoreChunks>>,
}

/// The prompts of a long request's further chunks (issue 15), each built when the chunk before
/// it ends, from the frames that chunk produced. The request layer implements it (it knows the
/// prompt format; the worker does not). Every chunk of a request is one stream in the batch,
/// its audio one continuous decode.
pub trait MoreChunks: Send + std::fmt::Debug {
    /// The next chunk's prompt, given the frames `[main, c0..c9]` the chunk before it produced;
    /// `None` once the text is done. `Err` fails the request (the message is for the log).
    fn next(&mut self, previous: &Rows) -> Option<Result<ChunkPrompt, String>>;
}

/// One further chunk's prompt.
#[derive(Clone, Debug)]
pub struct ChunkPrompt {
    pub rows: Rows,
    /// The rows other prompts share (the voice's system message), as [`Job::prefix`].
    pub prefix: SharedPrefix,
    /// Frames the chunk may produce (its runaway bound; it ends `length` there).
    pub max_frames: usize,
    /// Whether `max_frames` is the runaway guard's bound (below the request's `max_frames`): a
    /// chunk that reaches it is taken for a runaway and generated once more ([`retry_seed`]).
    pub guarded: bool,
}

/// The seed chunk `chunk` of a request with `seed` samples with: the request's own for the
/// first chunk (so a one-chunk request is unchanged), a fixed mix of the two after it (so the
/// same request gives the same bytes, and chunks do not replay one another's draws).
pub fn chunk_seed(seed: u64, chunk: usize) -> u64 {
    if chunk == 0 {
        return seed;
    }
    // SplitMix64's finaliser over the seed offset by the chunk's multiple of the golden ratio.
    let mut z = seed.wrapping_add((chunk as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The seed a chunk's second take samples with, after the runaway guard cut its first
/// (`chunk` ≥ 1): another fixed mix of the request's seed, so a retried request still gives the
/// same bytes every time, and the retry does not replay the draws that ran away.
pub fn retry_seed(seed: u64, chunk: usize) -> u64 {
    // A salt (the golden ratio's fraction, rotated) keeps it apart from every `chunk_seed`.
    chunk_seed(seed ^ 0x7F4A_7C15_9E37_79B9, chunk)
}

/// Whether a later chunk's audio is held undecoded until it ends: a guard may cut it (its frame
/// bound is the runaway guard's, or a stall guard runs), and its retry must be what is heard.
pub fn holds_chunk(prompt: &ChunkPrompt, stall: Option<StallGuard>) -> bool {
    prompt.guarded || stall.is_some()
}

/// Whether a chunk that ended with `reason` is generated once more: it is a later chunk (its
/// audio held, not yet heard), a guard cut it (the stall guard, or the runaway guard's frame
/// bound when that was its bound: `guarded`), and it is its first take.
pub fn retries_chunk(reason: FinishReason, chunk: usize, guarded: bool, retried: bool) -> bool {
    let cut = reason == FinishReason::Stalled || (reason == FinishReason::Length && guarded);
    cut && chunk > 0 && !retried
}

/// What a job reports, in this order: `Started`, zero or more `Audio`, then exactly one of
/// `Finished` or `Failed` (`Failed` may also come first, when the engine refuses the stream).
#[derive(Clone, Debug, PartialEq)]
pub enum JobEvent {
    /// The stream joined the batch and its prompt runs; `prompt_rows` is the prompt's length in rows.
    Started { prompt_rows: usize },
    /// Mono f32 PCM at the codec's rate (44.1 kHz), continuing the previous chunk exactly.
    Audio(Vec<f32>),
    /// Generation ended; the audio of all `frames` was sent before this.
    Finished { reason: FinishReason, frames: usize, prompt_rows: usize },
    /// This job failed (and only this job). `message` is safe to log; it is not meant for
    /// clients, who get a generic 500 naming the request id.
    Failed { message: String },
    /// The engine could not take this job when it joined the batch (device memory for its
    /// stream ran out): its client gets a 503 with `Retry-After`; nothing else is affected.
    Refused { message: String },
}

/// The receiving end of a job. Dropping it cancels the job: the worker stops it within one frame.
#[derive(Debug)]
pub struct JobStream {
    rx: mpsc::Receiver<JobEvent>,
    cancel: Arc<AtomicBool>,
}

impl JobStream {
    /// The next event, or `None` once the job has ended and every event was read.
    pub async fn next(&mut self) -> Option<JobEvent> {
        self.rx.recv().await
    }

    /// Stops the job at its next frame without dropping the stream.
    pub fn cancel(&self) {
        self.cancel.store(true, Ordering::Release);
    }
}

impl Drop for JobStream {
    fn drop(&mut self) {
        self.cancel();
    }
}

/// The worker's end of a job's channel.
#[derive(Debug)]
pub(crate) struct Reply {
    pub tx: mpsc::Sender<JobEvent>,
    cancel: Arc<AtomicBool>,
}

impl Reply {
    /// Whether the client is gone or asked to stop.
    pub fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::Acquire) || self.tx.is_closed()
    }
}

/// A job admitted to the queue, with its reply channel and admission time.
#[derive(Debug)]
pub(crate) struct Queued {
    pub job: Job,
    pub reply: Reply,
    pub admitted: Instant,
    /// Only the prompt's shared prefix runs, its state kept, then the job ends with no frame
    /// ([`Scheduler::warm`](super::Scheduler::warm)).
    pub prefix_only: bool,
}

/// A reference clip to encode into codes (voice cloning): mono samples at the codec's 44.1 kHz.
#[derive(Debug)]
pub struct EncodeJob {
    pub samples: Vec<f32>,
    pub span: tracing::Span,
}

/// What an encode gives back: codes row-major `[frames, codebooks]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Encoded {
    pub codes: Vec<u32>,
    pub codebooks: usize,
}

/// An encode admitted to the queue, and where its result goes (`Err`: why it failed, safe to log).
#[derive(Debug)]
pub(crate) struct QueuedEncode {
    pub job: EncodeJob,
    pub reply: oneshot::Sender<Result<Encoded, String>>,
}

/// What the worker's queue carries: speech jobs and encodes, in arrival order.
#[derive(Debug)]
pub(crate) enum Command {
    Speech(Queued),
    Encode(QueuedEncode),
}

/// A connected (stream, reply) pair for one job.
pub(crate) fn channel() -> (JobStream, Reply) {
    let (tx, rx) = mpsc::channel(REPLY_CAPACITY);
    let cancel = Arc::new(AtomicBool::new(false));
    (JobStream { rx, cancel: cancel.clone() }, Reply { tx, cancel })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_retry_seed_is_fixed_and_no_chunk_seed() {
        for seed in [0u64, 7, u64::MAX] {
            let chunk_seeds: Vec<u64> = (0..64).map(|c| chunk_seed(seed, c)).collect();
            for chunk in 1..64 {
                let retry = retry_seed(seed, chunk);
                assert_eq!(retry, retry_seed(seed, chunk), "the same request retries with the same seed");
                assert!(!chunk_seeds.contains(&retry), "seed {seed} chunk {chunk}: the retry replays no chunk's draws");
            }
        }
    }

    #[test]
    fn only_a_later_first_take_a_guard_cut_is_retried() {
        use FinishReason::{Length, Stalled, Stop};
        assert!(retries_chunk(Length, 1, true, false));
        assert!(!retries_chunk(Stop, 1, true, false), "it stopped on its own");
        assert!(!retries_chunk(Length, 0, true, false), "the first chunk streams live");
        assert!(!retries_chunk(Length, 2, false, false), "the request's max_frames cut it, not the guard");
        assert!(!retries_chunk(Length, 2, true, true), "a retry is not retried");
        assert!(retries_chunk(Stalled, 2, false, false), "the stall guard cut it, whatever its frame bound");
        assert!(!retries_chunk(Stalled, 0, true, false), "the first chunk streams live");
        assert!(!retries_chunk(Stalled, 1, true, true), "a retry is not retried");
    }
}
