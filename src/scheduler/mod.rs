//! Admission and the synthesis thread: [`Scheduler`] is the handle requests use to submit jobs
//! (bounded queue: 429 when full, 503 while loading or draining); one worker thread owns the
//! model and runs the admitted jobs together as the decode batch (`worker.rs`), in the slots a
//! [`Synthesizer`] offers. Reference clips for voice cloning take the same queue
//! ([`Scheduler::encode`]) and are encoded one per turn between steps. The codec runs beside
//! the worker on a thread of its own (`codec.rs`), decoding the frame groups the steps hand out.

mod codec;
mod engines;
mod gpu;
mod job;
mod worker;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError};
use std::sync::{Arc, Mutex, OnceLock};

use tokio::sync::{Notify, watch};

pub use codec::{AudioCodec, CodecCommand, CodecLink, CodecThread, Decoded};
pub use engines::{BatchLimits, BatchOptions, DEFAULT_VOICE_CACHE_BYTES, EngineModel, GpuOptions, cpu_loader};
pub use gpu::{cuda_loader, gpu_present};
pub use job::{
    ChunkPrompt, EncodeJob, Encoded, Job, JobEvent, JobStream, MoreChunks, REPLY_CAPACITY, chunk_seed, holds_chunk,
    retries_chunk, retry_seed,
};
pub use worker::pace::{RATE_WINDOW, ReaderPolicy};

use crate::engine::batch::GraphStats;
use crate::engine::generate::{GenerateError, GenerateOptions, LoadModelError, Stepped};
use crate::engine::prefix::{PrefixCacheStats, SharedPrefix};
use crate::model::frame::Rows;
use crate::model::load::LoadError;
use crate::model::vocabulary::Vocabulary;
use crate::telemetry;

/// What the worker thread needs to start.
#[derive(Clone, Debug)]
pub struct WorkerConfig {
    /// Checkpoint directory in the published layout.
    pub model_dir: PathBuf,
    /// Jobs admitted but not yet running; one more is refused with [`SubmitError::QueueFull`].
    pub max_queue: usize,
    /// Frames per request when the request gives no `max_frames`; also its ceiling.
    pub default_max_frames: usize,
    /// The model id clients send (`--served-model-name`).
    pub served_model_name: String,
    /// Other names accepted for it (`--model-alias`).
    pub model_aliases: Vec<String>,
    /// How a client must keep up with its stream before the worker gives its job up (a stalled
    /// or crawling reader must not hold a slot of the batch forever).
    pub reader: ReaderPolicy,
}

/// Whether the server can take work (`/ready`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Readiness {
    /// The worker is loading the model.
    Loading,
    /// Jobs are admitted.
    Ready,
    /// Shutting down: no new jobs; queued and running ones finish.
    Draining,
    /// The model could not be loaded; the message says why.
    Failed(String),
}

/// Why a job was not admitted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    /// The admission queue is full (HTTP 429 with `Retry-After`).
    #[error("the server is busy: {max_queue} requests are already waiting")]
    QueueFull { retry_after_secs: u64, max_queue: usize },
    /// The model is not loaded (HTTP 503). Also returned after a failed load, until the process
    /// exits: not ready is all a client needs to know.
    #[error("the model is still loading")]
    Loading,
    /// The server is shutting down (HTTP 503).
    #[error("the server is shutting down")]
    Draining,
}

/// Facts about the served model, known once it is loaded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelInfo {
    /// The model id (`--served-model-name`).
    pub id: String,
    pub aliases: Vec<String>,
    /// When the model finished loading, in seconds since the Unix epoch (`/v1/models` `created`).
    pub created: u64,
    pub default_max_frames: usize,
    /// Native output rate of the PCM in [`JobEvent::Audio`] (44 100 Hz).
    pub sample_rate: u32,
    /// PCM samples per generated frame (2048).
    pub samples_per_frame: usize,
    pub model_dir: PathBuf,
    /// Whether the engine has a codec encoder (voice uploads and inline references).
    pub encodes_references: bool,
}

/// Device memory, in bytes: what the model holds now and what serving is budgeted to need.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryUse {
    pub in_use: usize,
    pub budget: usize,
    /// Device allocations made since the engine's warm-up (zero while serving is the contract;
    /// the CPU engine makes none it counts).
    pub allocations_after_warm_up: u64,
}

/// A job's failure inside the engine (the job fails; the worker goes on).
#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    #[error("generation: {0}")]
    Generate(#[from] GenerateError),
    #[error("encoding a reference: {0}")]
    Encode(String),
}

/// Why the worker could not load a model.
#[derive(Debug, thiserror::Error)]
pub enum ModelLoadError {
    #[error("checkpoint refused: {0}")]
    Checkpoint(#[from] LoadError),
    #[error("loading the model: {0}")]
    Model(#[from] LoadModelError),
    #[error("GPU: {0}")]
    Gpu(String),
}

/// A stream's handle inside a [`Synthesizer`] (its slot).
pub type StreamId = usize;

/// A loaded model the worker runs jobs on (`EngineModel` over either backend): streams that are
/// opened, prefilled in chunks, stepped together and closed. Implementations need no locking:
/// only the worker thread calls them.
pub trait Synthesizer {
    fn sample_rate(&self) -> u32;
    fn samples_per_frame(&self) -> usize;
    fn memory(&self) -> MemoryUse;
    /// The model's vocabulary: the request layer builds each job's rows with it before
    /// submitting (`Scheduler::vocabulary`).
    fn vocabulary(&self) -> Vocabulary;
    /// Whether the engine can still run jobs, asked after a job failed: a GPU fault leaves the
    /// context unusable for every later job. `Err` says why.
    fn health(&self) -> Result<(), String> {
        Ok(())
    }
    /// Streams it steps together at most (slots).
    fn max_batch(&self) -> usize;
    /// Opens a stream for `rows` in a free slot (the caller keeps at most `max_batch` open), its
    /// first `prefix.rows` rows shared with other prompts (`engine::prefix`: a kept prefix is
    /// restored here, else the prompt's chunks restart at its end). Nothing else runs yet; a
    /// request the engine cannot take is refused here.
    fn open(&self, rows: &Rows, prefix: SharedPrefix, options: &GenerateOptions) -> Result<Opened, SynthError>;
    /// Goes on with a long request's next chunk in stream `id`, whose last chunk ended (and, if
    /// held, was settled): a new prompt `rows` (as [`Synthesizer::open`] takes one), its audio
    /// continuing in the stream's decoder so the chunks join as one decode. With `hold`, the
    /// chunk's audio waits undecoded until [`Synthesizer::settle_chunk`] (the runaway guard may
    /// cut the chunk and have it generated again).
    fn continue_stream(
        &self,
        id: StreamId,
        rows: &Rows,
        prefix: SharedPrefix,
        options: &GenerateOptions,
        hold: bool,
    ) -> Result<Opened, SynthError>;
    /// Settles the held audio of stream `id`'s chunk, which ended: `keep` sends it on to the codec
    /// now (its PCM, or codes for [`Synthesizer::audio_codec`]), else it is dropped before the
    /// decoder sees it (an empty result).
    fn settle_chunk(&self, id: StreamId, keep: bool) -> Result<Stepped, SynthError>;
    /// The frames `[main, c0..c9]` stream `id` produced since it was opened or continued.
    fn produced(&self, id: StreamId) -> Rows;
    /// The counters of the engine's kept prompt prefixes, if it keeps them.
    fn prefix_cache(&self) -> Option<PrefixCacheStats> {
        None
    }
    /// Decode steps captured as a CUDA graph and replayed, if the engine captures them.
    fn step_graphs(&self) -> Option<GraphStats> {
        None
    }
    /// Prompt rows one [`Synthesizer::prefill`] runs at most: the budget of prompt rows the
    /// worker spends between two steps.
    fn prefill_chunk(&self) -> usize;
    /// Runs the next chunk of each stream's prompt, all of them together (each stream's result is
    /// what it is alone); one result per id, in order.
    fn prefill(&self, ids: &[StreamId]) -> Vec<Result<Prefilled, SynthError>>;
    /// One frame of each stream (all prefilled): each result is that stream's alone.
    fn step(&self, ids: &[StreamId]) -> Vec<Result<Stepped, SynthError>>;
    /// Ends a stream before its last frame: the audio of its frames not yet decoded (PCM, or
    /// codes for [`Synthesizer::audio_codec`]).
    fn cancel(&self, id: StreamId) -> Result<Stepped, SynthError>;
    /// The codec on a thread of its own, if the engine runs it there: its streams' steps then
    /// hand their frame groups out as codes ([`Stepped::codes`]) for the worker to send it, and
    /// the step goes on while they are decoded.
    fn audio_codec(&self) -> Option<&dyn AudioCodec> {
        None
    }
    /// Frees the stream's slot; returns its audio frames.
    fn close(&self, id: StreamId) -> usize;
    /// Encodes a reference clip (mono, 44.1 kHz) with the codec encoder: codes row-major
    /// `[frames, codebooks]` and the codebook count. A long clip holds up the batch for its
    /// encode (about 7 ms per second of audio on an H200).
    fn encode_reference(&self, samples: &[f32]) -> Result<job::Encoded, SynthError>;
    /// Whether [`Synthesizer::encode_reference`] can work (the GPU loader leaves the encoder out
    /// when it does not fit the memory the decode batch left).
    fn encodes_references(&self) -> bool {
        true
    }
}

/// A stream [`Synthesizer::open`] opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Opened {
    pub id: StreamId,
    /// Prompt rows restored from a kept prefix (0: the whole prompt runs).
    pub restored_rows: usize,
}

/// What one [`Synthesizer::prefill`] call did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Prefilled {
    /// Prompt rows it ran.
    pub rows: usize,
    /// The prompt is done: the stream can step.
    pub done: bool,
}

/// What a [`Loader`] reports to and hands its model to.
pub trait ModelHost {
    /// A loading stage, for logs and systemd's `STATUS=`.
    fn progress(&self, stage: &str);
    /// Runs jobs on `model` until the scheduler is dropped. Models that borrow their weights
    /// (the CPU engine does) live on the loader's stack frame for this call.
    fn serve(&mut self, model: &dyn Synthesizer);
}

/// Runs inside the worker thread: loads a model and passes it to [`ModelHost::serve`].
pub type Loader = Box<dyn FnOnce(&mut dyn ModelHost) -> Result<(), ModelLoadError> + Send>;

/// The handle requests use. Cheap to clone; the worker thread ends when the last clone is dropped.
#[derive(Clone)]
pub struct Scheduler {
    inner: Arc<Handle>,
}

struct Handle {
    commands: SyncSender<job::Command>,
    shared: Arc<Shared>,
}

/// State the handle and the worker thread share.
struct Shared {
    max_queue: usize,
    load: watch::Sender<LoadState>,
    stage: Mutex<String>,
    info: OnceLock<ModelInfo>,
    /// The loaded model's prompt builder (requests build their rows before they are queued).
    vocabulary: OnceLock<Vocabulary>,
    draining: AtomicBool,
    /// Set by [`Scheduler::cancel_all`]: every job, running or queued, ends as `Cancelled`.
    aborting: AtomicBool,
    /// Admitted and not yet finished (queued + running).
    in_flight: AtomicUsize,
    queued: AtomicUsize,
    active: AtomicUsize,
    /// Signalled whenever a job ends, for [`Scheduler::drained`].
    idle: Notify,
    /// Moving average of a job's wall time, f64 bits; 0 until the first job ends.
    mean_job_secs: AtomicU64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum LoadState {
    Loading,
    Ready,
    Failed(String),
}

impl Scheduler {
    /// Starts the worker thread, which loads the CPU engine from `config.model_dir`.
    pub fn start(config: WorkerConfig) -> Scheduler {
        let limits = BatchLimits {
            max_batch: None,
            prefill_chunk: crate::engine::generate::PREFILL_CHUNK,
            voice_cache_bytes: DEFAULT_VOICE_CACHE_BYTES,
            codec_thread: true,
        };
        let loader = cpu_loader(config.model_dir.clone(), config.default_max_frames, limits);
        Scheduler::start_with(config, loader)
    }

    /// Starts the worker thread with any model `loader` (tests, other engines).
    pub fn start_with(config: WorkerConfig, loader: Loader) -> Scheduler {
        let shared = Arc::new(Shared {
            max_queue: config.max_queue,
            load: watch::Sender::new(LoadState::Loading),
            stage: Mutex::new(String::from("starting")),
            info: OnceLock::new(),
            vocabulary: OnceLock::new(),
            draining: AtomicBool::new(false),
            aborting: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
            queued: AtomicUsize::new(0),
            active: AtomicUsize::new(0),
            idle: Notify::new(),
            mean_job_secs: AtomicU64::new(0),
        });
        let commands = worker::spawn(config, loader, shared.clone());
        Scheduler { inner: Arc::new(Handle { commands, shared }) }
    }

    /// Admits `job` or refuses it at once; never waits.
    pub fn submit(&self, job: Job) -> Result<JobStream, SubmitError> {
        self.queue(job, false)
    }

    /// Admits a job that runs only its prompt's shared prefix (`job.prefix`, which must be
    /// kept), keeps the state after it in the engine's prefix cache, and ends `stop` with no
    /// frame: a stored voice warmed before its first request, which then starts from that state
    /// as every later one does (`engine::prefix`). It ends at once where the prefix is kept
    /// already (`stop`) or the engine keeps none (`cancelled`). Refused as [`Scheduler::submit`] is.
    pub fn warm(&self, job: Job) -> Result<JobStream, SubmitError> {
        self.queue(job, true)
    }

    fn queue(&self, job: Job, prefix_only: bool) -> Result<JobStream, SubmitError> {
        let shared = &self.inner.shared;
        self.admission()?;
        let (stream, reply) = job::channel();
        shared.queued.fetch_add(1, Ordering::SeqCst);
        let queued = job::Queued { job, reply, admitted: std::time::Instant::now(), prefix_only };
        match self.inner.commands.try_send(job::Command::Speech(queued)) {
            Ok(()) => {
                shared.publish_gauges();
                Ok(stream)
            }
            Err(e) => {
                shared.queued.fetch_sub(1, Ordering::SeqCst);
                Err(self.not_queued(e))
            }
        }
    }

    /// Queues a reference clip for the worker's codec encoder, or refuses it at once (as
    /// [`Scheduler::submit`]: busy, loading, draining). The receiver gets the codes, or why not.
    pub fn encode(
        &self,
        job: EncodeJob,
    ) -> Result<tokio::sync::oneshot::Receiver<Result<Encoded, String>>, SubmitError> {
        self.admission()?;
        let (reply, rx) = tokio::sync::oneshot::channel();
        match self.inner.commands.try_send(job::Command::Encode(job::QueuedEncode { job, reply })) {
            Ok(()) => Ok(rx),
            Err(e) => Err(self.not_queued(e)),
        }
    }

    /// Counts a command as in flight, unless the server is draining or not loaded.
    fn admission(&self) -> Result<(), SubmitError> {
        let shared = &self.inner.shared;
        // Count the job before looking at `draining`, so `drained()` (which looks the other way
        // round) can never miss a job admitted while the drain began.
        shared.in_flight.fetch_add(1, Ordering::SeqCst);
        let refusal = if shared.draining.load(Ordering::SeqCst) {
            Some(SubmitError::Draining)
        } else if *shared.load.borrow() != LoadState::Ready {
            Some(SubmitError::Loading)
        } else {
            None
        };
        match refusal {
            Some(e) => {
                shared.job_left();
                Err(e)
            }
            None => Ok(()),
        }
    }

    /// A counted command the queue refused: uncounted, and why.
    fn not_queued<T>(&self, e: TrySendError<T>) -> SubmitError {
        let shared = &self.inner.shared;
        shared.job_left();
        match e {
            TrySendError::Full(_) => SubmitError::QueueFull {
                retry_after_secs: retry_after_secs(shared.mean_job_secs()),
                max_queue: shared.max_queue,
            },
            // The worker thread is gone: its model failed to load.
            TrySendError::Disconnected(_) => SubmitError::Loading,
        }
    }

    pub fn readiness(&self) -> Readiness {
        let shared = &self.inner.shared;
        match &*shared.load.borrow() {
            LoadState::Failed(message) => Readiness::Failed(message.clone()),
            _ if shared.draining.load(Ordering::SeqCst) => Readiness::Draining,
            LoadState::Loading => Readiness::Loading,
            LoadState::Ready => Readiness::Ready,
        }
    }

    /// Waits until loading ends: `Ok` once the model is ready, `Err` with the reason if it failed.
    pub async fn loaded(&self) -> Result<(), String> {
        let mut rx = self.inner.shared.load.subscribe();
        let state = rx.wait_for(|s| *s != LoadState::Loading).await.map(|s| s.clone());
        match state {
            Ok(LoadState::Ready) => Ok(()),
            Ok(LoadState::Failed(message)) => Err(message),
            _ => Err(String::from("the worker thread ended while loading")),
        }
    }

    /// Waits until a loaded engine is lost (it failed a job and then its health check); returns why.
    pub async fn engine_lost(&self) -> String {
        let mut rx = self.inner.shared.load.subscribe();
        let lost = rx.wait_for(|s| matches!(s, LoadState::Failed(_))).await.map(|s| s.clone());
        match lost {
            Ok(LoadState::Failed(message)) => message,
            _ => String::from("the worker thread ended"),
        }
    }

    /// The current loading stage (e.g. "uploading weights"), for status lines.
    pub fn loading_stage(&self) -> String {
        self.inner.shared.stage.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Stops admitting: new submissions get [`SubmitError::Draining`]; queued and running jobs finish.
    pub fn begin_drain(&self) {
        self.inner.shared.draining.store(true, Ordering::SeqCst);
    }

    /// Stops admitting and ends every job, running or queued, at its next frame with
    /// [`FinishReason::Cancelled`](crate::engine::generate::FinishReason): the drain deadline passed.
    pub fn cancel_all(&self) {
        self.begin_drain();
        self.inner.shared.aborting.store(true, Ordering::SeqCst);
    }

    /// Resolves once no job is queued or running.
    pub async fn drained(&self) {
        let shared = &self.inner.shared;
        loop {
            let notified = shared.idle.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if shared.in_flight.load(Ordering::SeqCst) == 0 {
                return;
            }
            notified.await;
        }
    }

    /// Jobs admitted and waiting for the worker.
    pub fn queue_depth(&self) -> usize {
        self.inner.shared.queued.load(Ordering::SeqCst)
    }

    /// Jobs in the decode batch now (prefilling, generating, or delivering their last events).
    pub fn active(&self) -> usize {
        self.inner.shared.active.load(Ordering::SeqCst)
    }

    /// The served model, once loaded.
    pub fn model_info(&self) -> Option<ModelInfo> {
        self.inner.shared.info.get().cloned()
    }

    /// The loaded model's vocabulary: a request builds its rows with it (refused there, as a
    /// 400 naming the field) before it is submitted, so the queue carries rows, not text.
    /// `Loading` until the model is loaded.
    pub fn vocabulary(&self) -> Result<Vocabulary, SubmitError> {
        self.inner.shared.vocabulary.get().cloned().ok_or(SubmitError::Loading)
    }
}

impl Shared {
    /// A job ended or was refused after being counted.
    fn job_left(&self) {
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        self.idle.notify_waiters();
    }

    fn publish_gauges(&self) {
        metrics::gauge!(telemetry::QUEUE_DEPTH).set(self.queued.load(Ordering::SeqCst) as f64);
        metrics::gauge!(telemetry::ACTIVE_STREAMS).set(self.active.load(Ordering::SeqCst) as f64);
    }

    fn mean_job_secs(&self) -> f64 {
        f64::from_bits(self.mean_job_secs.load(Ordering::Relaxed))
    }

    /// Folds one job's wall time into the moving average (only the worker thread writes it).
    fn record_job_secs(&self, secs: f64) {
        let old = self.mean_job_secs();
        let new = if old == 0.0 { secs } else { 0.8 * old + 0.2 * secs };
        self.mean_job_secs.store(new.to_bits(), Ordering::Relaxed);
    }
}

/// `Retry-After` for a full queue: a slot opens when the running job ends, so about one job's
/// time; at least 1 s, at most a minute.
pub fn retry_after_secs(mean_job_secs: f64) -> u64 {
    if !mean_job_secs.is_finite() || mean_job_secs <= 0.0 {
        return 1;
    }
    (mean_job_secs.ceil() as u64).clamp(1, 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_is_about_one_job_and_bounded() {
        assert_eq!(retry_after_secs(0.0), 1, "no job has finished yet");
        assert_eq!(retry_after_secs(f64::NAN), 1);
        assert_eq!(retry_after_secs(0.2), 1);
        assert_eq!(retry_after_secs(2.5), 3);
        assert_eq!(retry_after_secs(3600.0), 60);
    }
}
