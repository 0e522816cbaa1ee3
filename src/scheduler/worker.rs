//! The worker thread: loads the model, then runs the decode batch. It owns the model (and on the
//! GPU the CUDA context) and is the only thread that touches it.
//!
//! Each turn of its loop:
//! 1. **admits** queued jobs into free slots, first come first served: the prompt is built and a
//!    stream opened (a job refused here fails alone);
//! 2. runs the oldest waiting **reference encode** (voice cloning), if any, then **prompt chunks**, oldest stream first, up to one chunk's worth of rows per turn (the
//!    bound on how long new prompts hold up the streams already speaking); a job that only
//!    warms a voice (`Scheduler::warm`) ends once its prefix ran and was kept;
//! 3. **steps** every stream that is generating and whose client is keeping up: one frame each.
//!    Where the engine runs its codec on a thread of its own (`scheduler::codec`), the step's
//!    frame groups go there as codes and the worker goes straight on; their PCM joins the
//!    stream's events as it comes back, and a stream's last event waits for its last group;
//! 4. **delivers** each stream's events to its client without ever waiting: a client that reads
//!    slowly has its events buffered (up to [`OUTBOX_EVENTS`]; its stream pauses while the buffer
//!    is full) and is given up after `stall_timeout` without progress, or when it reads slower
//!    than `min_read_rate` × real time ([`pace`]), while the batch goes on;
//! 5. **retires** streams that ended, failed, or whose client left: the slot is free at once.
//!
//! A failure inside one stream (a sampler fault on its row, a panic in its prompt) fails that
//! job alone. After any failure the worker asks the engine's health: a GPU fault that poisoned
//! the context fails every job and turns readiness to failed, and `serve` exits for a restart.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TryRecvError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tracing::{debug, error, info, warn};

mod active;
mod chunks;
mod first_audio;
mod lane;
pub mod pace;

use self::active::Active;
use self::first_audio::FirstAudio;
use self::lane::CodecLane;
use super::codec::CodecLink;
use super::job::{Command, JobEvent, Queued, QueuedEncode};
use super::{LoadState, Loader, ModelHost, ModelInfo, Opened, Shared, StreamId, Synthesizer, WorkerConfig};
use crate::backend::OutOfDeviceMemory;
use crate::backend::panic_message;
use crate::engine::generate::{FinishReason, Stepped};
use crate::telemetry;

/// Events buffered per stream beyond its reply channel before the stream pauses (each event
/// holds at most one codec group, 8 frames ≈ 0.37 s): about 12 s of audio.
pub const OUTBOX_EVENTS: usize = 32;
/// How long an idle worker waits for a job or a reader before it looks again.
const IDLE_POLL: Duration = Duration::from_millis(2);
/// Prompt chunks (`--prefill-chunk` rows each) one turn runs at most, over all the streams on
/// their prompts together: a burst of arrivals is prefilled in a few turns, and a turn's prompt
/// rows, hence how long it holds up the running streams, stay bounded.
pub const PREFILL_TURN_CHUNKS: usize = 8;

/// Starts the worker thread; returns the sending end of its job queue (`max_queue` deep).
pub(super) fn spawn(config: WorkerConfig, loader: Loader, shared: Arc<Shared>) -> SyncSender<Command> {
    let (tx, rx) = std::sync::mpsc::sync_channel(config.max_queue);
    std::thread::Builder::new()
        .name(String::from("limelight-worker"))
        .spawn(move || {
            let mut host = Host {
                config,
                shared,
                jobs: rx,
                encodes: RefCell::new(VecDeque::new()),
                codec: None,
                next_key: Cell::new(0),
            };
            let outcome = catch_unwind(AssertUnwindSafe(|| loader(&mut host)));
            let failure = match outcome {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(e.to_string()),
                Err(panic) => Some(format!("the loader panicked: {}", panic_message(&*panic))),
            };
            let shared = &host.shared;
            if let Some(message) = failure {
                error!(reason = %message, "model load failed");
                shared.load.send_replace(LoadState::Failed(message));
            } else if *shared.load.borrow() == LoadState::Loading {
                shared.load.send_replace(LoadState::Failed(String::from("the loader returned without a model")));
            }
        })
        .expect("spawning the worker thread");
    tx
}

/// The worker's side of loading and serving.
struct Host {
    config: WorkerConfig,
    shared: Arc<Shared>,
    jobs: Receiver<Command>,
    /// Reference clips waiting for the codec encoder, oldest first (one runs per turn).
    encodes: RefCell<VecDeque<QueuedEncode>>,
    /// The codec thread's channels, while one runs (`scheduler::codec`).
    codec: Option<CodecLane>,
    /// The key of the next job's stream on the codec thread (keys rise: its oldest-first order).
    next_key: Cell<u64>,
}

impl ModelHost for Host {
    fn progress(&self, stage: &str) {
        info!(stage, "loading");
        if let Ok(mut s) = self.shared.stage.lock() {
            *s = stage.to_owned();
        }
    }

    fn serve(&mut self, model: &dyn Synthesizer) {
        let created = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let info = ModelInfo {
            id: self.config.served_model_name.clone(),
            aliases: self.config.model_aliases.clone(),
            created,
            default_max_frames: self.config.default_max_frames,
            sample_rate: model.sample_rate(),
            samples_per_frame: model.samples_per_frame(),
            model_dir: self.config.model_dir.clone(),
            encodes_references: model.encodes_references(),
        };
        let _ = self.shared.info.set(info);
        let _ = self.shared.vocabulary.set(model.vocabulary());
        self.publish_memory(model);
        self.progress("ready");
        self.shared.load.send_replace(LoadState::Ready);
        let Some(codec) = model.audio_codec() else {
            self.run_batch(model);
            return;
        };
        std::thread::scope(|scope| {
            let (commands, commands_rx) = std::sync::mpsc::channel();
            let (decoded_tx, decoded) = std::sync::mpsc::channel();
            let link = CodecLink { commands: commands_rx, decoded: decoded_tx };
            std::thread::Builder::new()
                .name(String::from("limelight-codec"))
                .spawn_scoped(scope, move || codec.run(link))
                .expect("spawning the codec thread");
            self.codec = Some(CodecLane { commands, decoded });
            self.run_batch(model);
            // Its sender dropped, the codec thread ends and the scope joins it.
            self.codec = None;
        });
    }
}

impl Host {
    /// The worker's loop over the decode batch, until the scheduler is gone or the engine is lost.
    fn run_batch(&self, model: &dyn Synthesizer) {
        let mut batch: Vec<Active> = Vec::new();
        loop {
            if !self.admit(model, &mut batch) {
                return; // every Scheduler handle is gone
            }
            let mut failed = self.encode(model);
            failed |= self.prefill(model, &mut batch);
            let stepped = self.step(model, &mut batch, &mut failed);
            let idle = !stepped && !batch.is_empty();
            let on_codec = batch.iter().any(|job| job.codec_pending > 0);
            if let Err(why) = self.collect_decoded(model, &mut batch, &mut failed, idle) {
                self.engine_lost(&mut batch, &why);
                return;
            }
            let now = Instant::now();
            for job in &mut batch {
                job.deliver(&self.config.reader, model.sample_rate(), now);
            }
            self.retire(model, &mut batch);
            // A failure that broke the engine itself (a GPU fault poisons its context) would fail
            // every later job: stop serving instead, so the service is restarted.
            if failed && let Err(why) = model.health() {
                self.engine_lost(&mut batch, &why);
                return;
            }
            if idle && !on_codec {
                // Every stream waits on its client: let the readers catch up. (Streams waiting
                // on the codec waited for its PCM instead.)
                std::thread::sleep(IDLE_POLL);
            }
        }
    }
    /// Moves queued jobs into free slots (waiting for one when the batch is empty). Returns
    /// `false` once the queue is closed and nothing is left to run.
    fn admit(&self, model: &dyn Synthesizer, batch: &mut Vec<Active>) -> bool {
        loop {
            let open = batch.iter().filter(|a| a.stream.is_some()).count();
            if open >= model.max_batch() {
                return true;
            }
            let idle = batch.is_empty() && self.encodes.borrow().is_empty();
            let command = if idle {
                match self.jobs.recv_timeout(Duration::from_secs(1)) {
                    Ok(command) => command,
                    Err(RecvTimeoutError::Timeout) => continue,
                    Err(RecvTimeoutError::Disconnected) => return false,
                }
            } else {
                match self.jobs.try_recv() {
                    Ok(command) => command,
                    Err(TryRecvError::Empty) => return true,
                    Err(TryRecvError::Disconnected) => return !batch.is_empty() || !self.encodes.borrow().is_empty(),
                }
            };
            let queued = match command {
                Command::Speech(queued) => queued,
                Command::Encode(encode) => {
                    self.encodes.borrow_mut().push_back(encode);
                    continue;
                }
            };
            self.shared.queued.fetch_sub(1, Ordering::SeqCst);
            if let Some(active) = self.join(model, queued) {
                self.shared.active.fetch_add(1, Ordering::SeqCst);
                batch.push(active);
            } else {
                self.shared.job_left();
            }
            self.shared.publish_gauges();
        }
    }

    /// A queued job into the batch: its stream opened for its prompt rows. `None` when it ends
    /// here (client gone, draining past the deadline, or refused, which it is told).
    fn join(&self, model: &dyn Synthesizer, queued: Queued) -> Option<Active> {
        let Queued { job, reply, admitted, prefix_only } = queued;
        let _span = job.span.enter();
        metrics::histogram!(telemetry::QUEUE_WAIT_SECONDS).record(admitted.elapsed().as_secs_f64());
        if reply.cancelled() {
            debug!("client left before the job started");
            return None;
        }
        if self.shared.aborting.load(Ordering::SeqCst) {
            let end = JobEvent::Finished { reason: FinishReason::Cancelled, frames: 0, prompt_rows: 0 };
            let _ = reply.tx.try_send(end);
            return None;
        }
        debug!(waited_ms = admitted.elapsed().as_millis() as u64, "job joins the batch");
        let opening = Instant::now();
        let opened = catch_unwind(AssertUnwindSafe(|| model.open(&job.rows, job.prefix, &job.options)));
        let failure = match opened {
            Ok(Ok(Opened { id, restored_rows })) => {
                // The open looked the prefix up: the cache's counters move before any event.
                self.publish_memory(model);
                let prompt_rows = job.rows.len();
                if job.prefix.keep {
                    debug!(prefix_rows = job.prefix.rows, restored_rows, "voice prefix");
                }
                let keeps_none = model.prefix_cache().is_none_or(|cache| cache.budget == 0);
                if prefix_only && (restored_rows >= job.prefix.rows || keeps_none) {
                    // Nothing to run: the prefix is kept already (`stop`), or the engine keeps
                    // none (`cancelled`).
                    model.close(id);
                    let kept = restored_rows >= job.prefix.rows;
                    let reason = if kept { FinishReason::Stop } else { FinishReason::Cancelled };
                    let end = JobEvent::Finished { reason, frames: 0, prompt_rows: 0 };
                    let _ = reply.tx.try_send(end);
                    return None;
                }
                let mut outbox = VecDeque::new();
                outbox.push_back(JobEvent::Started { prompt_rows });
                let joined = Instant::now();
                return Some(Active {
                    stream: Some(id),
                    prefilled: false,
                    reply,
                    span: job.span.clone(),
                    outbox,
                    pace: Default::default(),
                    prompt_rows,
                    prompt_left: prompt_rows - restored_rows,
                    joined,
                    gone: false,
                    ended: false,
                    audio_key: self.next_key.replace(self.next_key.get() + 1),
                    codec_pending: 0,
                    codec_used: false,
                    awaiting_first_audio: false,
                    held_end: None,
                    more: job.more,
                    options: job.options.clone(),
                    chunk: 0,
                    chunk_prompt: None,
                    holding: false,
                    retried: false,
                    frames_before: 0,
                    cut: false,
                    first_audio: FirstAudio::new(admitted, opening, joined),
                    prefix_only: prefix_only.then_some(job.prefix.rows),
                });
            }
            Ok(Err(e)) => e.to_string(),
            Err(panic) => {
                if let Some(oom) = panic.downcast_ref::<OutOfDeviceMemory>() {
                    warn!(error = %oom, "no device memory for the job's stream; refused");
                    let _ = reply.tx.try_send(JobEvent::Refused { message: oom.to_string() });
                    return None;
                }
                format!("the engine panicked: {}", panic_message(&*panic))
            }
        };
        error!(error = %failure, "job failed");
        let _ = reply.tx.try_send(JobEvent::Failed { message: failure });
        None
    }

    /// Runs the oldest waiting reference encode, if any (one per turn: an encode holds up the
    /// running streams for its duration, as a prompt chunk does). Returns whether it failed.
    fn encode(&self, model: &dyn Synthesizer) -> bool {
        let Some(QueuedEncode { job, reply }) = self.encodes.borrow_mut().pop_front() else { return false };
        let _enter = job.span.enter();
        let failed = if reply.is_closed() {
            debug!("client left before its reference was encoded");
            false
        } else {
            let started = Instant::now();
            let result = match catch_unwind(AssertUnwindSafe(|| model.encode_reference(&job.samples))) {
                Ok(Ok(encoded)) => Ok(encoded),
                Ok(Err(e)) => Err(e.to_string()),
                Err(panic) => Err(format!("the engine panicked: {}", panic_message(&*panic))),
            };
            let seconds = job.samples.len() as f64 / f64::from(model.sample_rate());
            match &result {
                Ok(e) => info!(
                    audio_secs = seconds,
                    frames = e.codes.len() / e.codebooks.max(1),
                    ms = started.elapsed().as_millis() as u64,
                    "reference encoded"
                ),
                Err(message) => error!(error = %message, "reference encode failed"),
            }
            let failed = result.is_err();
            let _ = reply.send(result);
            failed
        };
        self.shared.job_left();
        failed
    }

    /// Runs the next prompt chunk of the streams still on their prompts, oldest first, all in one
    /// call (`Synthesizer::prefill`: each stream's rows are what they are alone), until the turn's
    /// rows reach [`PREFILL_TURN_CHUNKS`] chunks: the bound on how long prompts hold up the
    /// running streams between two steps. Returns whether a job failed.
    fn prefill(&self, model: &dyn Synthesizer, batch: &mut [Active]) -> bool {
        let budget = model.prefill_chunk() * PREFILL_TURN_CHUNKS;
        let (mut planned, mut turn) = (0, Vec::new());
        for (i, job) in batch.iter_mut().enumerate().filter(|(_, a)| a.stream.is_some() && !a.prefilled) {
            if planned >= budget {
                break;
            }
            if let Some(last) = self.interrupted(job, model) {
                job.end(model, last);
                continue;
            }
            planned += job.prompt_left.min(model.prefill_chunk()).max(1);
            turn.push(i);
        }
        if turn.is_empty() {
            return false;
        }
        let ids: Vec<StreamId> = turn.iter().map(|&i| batch[i].stream.expect("filtered on a stream")).collect();
        let results = match catch_unwind(AssertUnwindSafe(|| model.prefill(&ids))) {
            Ok(results) => results.into_iter().map(|r| r.map_err(|e| e.to_string())).collect(),
            Err(panic) => {
                let message = format!("the engine panicked: {}", panic_message(&*panic));
                vec![Err(message); ids.len()]
            }
        };
        let mut failed = false;
        for (&i, result) in turn.iter().zip(results) {
            let job = &mut batch[i];
            match result {
                Ok(progress) => {
                    job.prefilled = progress.done;
                    if progress.done {
                        job.first_audio.prefilled(Instant::now());
                    }
                    job.prompt_left -= progress.rows.min(job.prompt_left);
                    let ran = job.prompt_rows - job.prompt_left;
                    if job.prefix_only.is_some_and(|prefix| ran >= prefix) {
                        // Its prefix ran and was kept (a chunk never crosses the prefix's end).
                        // The cache's gauges count it before its caller hears it is done (they
                        // are otherwise published when a job retires, after its last event).
                        self.publish_memory(model);
                        job.end(model, JobEvent::Finished { reason: FinishReason::Stop, frames: 0, prompt_rows: ran });
                    }
                }
                Err(message) => {
                    let span = job.span.clone();
                    let _enter = span.enter();
                    error!(error = %message, "job failed");
                    job.end(model, JobEvent::Failed { message });
                    failed = true;
                }
            }
        }
        failed
    }

    /// Whether the job must stop before its next frame: its client left (nothing more is said),
    /// or the drain deadline passed (it ends `cancelled`, keeping the audio of its frames).
    /// Returns the final event to queue.
    fn interrupted(&self, job: &mut Active, model: &dyn Synthesizer) -> Option<JobEvent> {
        if job.reply.cancelled() {
            let _enter = job.span.enter();
            debug!("client gone; job stopped");
            job.gone = true;
            return Some(JobEvent::Failed { message: String::from("client gone") });
        }
        if !self.shared.aborting.load(Ordering::SeqCst) {
            return None;
        }
        let id = job.stream.expect("asked only of jobs with a stream");
        if std::mem::take(&mut job.holding)
            && let Ok(audio) = model.settle_chunk(id, true)
        {
            // Stopped mid-chunk: what it made so far is heard, as for any stream.
            self.take_audio(job, audio);
        }
        if let Ok(audio) = model.cancel(id) {
            self.take_audio(job, audio);
        }
        let frames = job.close(model);
        Some(JobEvent::Finished { reason: FinishReason::Cancelled, frames, prompt_rows: job.prompt_rows })
    }

    /// One frame of every prefilled stream whose client keeps up. Returns whether any stepped.
    fn step(&self, model: &dyn Synthesizer, batch: &mut [Active], failed: &mut bool) -> bool {
        let mut members: Vec<usize> = Vec::with_capacity(batch.len());
        for (i, job) in batch.iter_mut().enumerate() {
            if job.stream.is_none() || !job.prefilled {
                continue;
            }
            if let Some(last) = self.interrupted(job, model) {
                job.end(model, last);
            } else if job.backlog() < OUTBOX_EVENTS {
                members.push(i);
            }
        }
        if members.is_empty() {
            return false;
        }
        let ids: Vec<StreamId> = members.iter().map(|&i| batch[i].stream.expect("a member has a stream")).collect();
        let started = Instant::now();
        let results = match catch_unwind(AssertUnwindSafe(|| model.step(&ids))) {
            Ok(results) => results.into_iter().map(|r| r.map_err(|e| e.to_string())).collect(),
            Err(panic) => {
                let message = format!("the engine panicked: {}", panic_message(&*panic));
                vec![Err(message); ids.len()]
            }
        };
        metrics::histogram!(telemetry::STEP_SECONDS).record(started.elapsed().as_secs_f64());
        metrics::histogram!(telemetry::BATCH_SIZE).record(ids.len() as f64);
        for (&i, result) in members.iter().zip(results) {
            let job = &mut batch[i];
            match result {
                Ok(stepped) => {
                    job.first_audio.stepped(Instant::now());
                    let finished = stepped.finished;
                    self.take_audio(job, stepped);
                    let Some(mut reason) = finished else { continue };
                    match self.chunk_ended(model, job, reason) {
                        Ok(true) => continue,
                        Ok(false) => {}
                        Err(message) => {
                            job.span.in_scope(|| error!(error = %message, "job failed"));
                            *failed = true;
                            job.end(model, JobEvent::Failed { message });
                            continue;
                        }
                    }
                    if job.cut {
                        reason = FinishReason::Length;
                    }
                    let frames = job.close(model);
                    let prompt_rows = job.prompt_rows;
                    job.end(model, JobEvent::Finished { reason, frames, prompt_rows });
                }
                Err(message) => {
                    job.span.in_scope(|| error!(error = %message, "job failed"));
                    *failed = true;
                    job.end(model, JobEvent::Failed { message });
                }
            }
        }
        true
    }

    /// A step's audio for `job`: its PCM into the outbox, or its codes to the codec thread.
    pub(super) fn take_audio(&self, job: &mut Active, stepped: Stepped) {
        job.push_audio(stepped.pcm);
        if stepped.codes.is_empty() {
            return;
        }
        let lane = self.codec.as_ref().expect("codes come only from an engine with a codec thread");
        lane.send(job, stepped.codes);
    }

    /// Takes the PCM the codec thread has decoded into its jobs' outboxes (`CodecLane::collect`).
    /// `Err`: the codec thread is gone.
    fn collect_decoded(
        &self,
        model: &dyn Synthesizer,
        batch: &mut [Active],
        failed: &mut bool,
        idle: bool,
    ) -> Result<(), String> {
        self.codec.as_ref().map_or(Ok(()), |lane| lane.collect(model, batch, failed, idle))
    }

    /// Drops jobs that are over: ended with every event delivered, or whose client is gone.
    fn retire(&self, model: &dyn Synthesizer, batch: &mut Vec<Active>) {
        let before = batch.len();
        batch.retain_mut(|job| {
            let over = job.gone || (job.ended && job.outbox.is_empty());
            if over {
                job.close(model);
                if let Some(lane) = &self.codec {
                    lane.end(job);
                }
                // A slot frees when a job ends: `Retry-After` follows their wall time.
                self.shared.record_job_secs(job.joined.elapsed().as_secs_f64());
            }
            !over
        });
        let left = before - batch.len();
        if left > 0 {
            self.shared.active.fetch_sub(left, Ordering::SeqCst);
            for _ in 0..left {
                self.shared.job_left();
            }
            self.publish_memory(model);
            self.shared.publish_gauges();
        }
    }

    /// The engine cannot run jobs any more: readiness turns to failed (new requests get 503),
    /// the batch's and the queued jobs fail with the reason; `serve` sees the state and exits
    /// non-zero.
    fn engine_lost(&self, batch: &mut Vec<Active>, why: &str) {
        let message = format!("the engine is unusable after a failed request: {why}");
        error!(reason = %message, "engine lost");
        self.shared.load.send_replace(LoadState::Failed(message.clone()));
        // Their streams are not touched again: the engine is unusable.
        for job in batch.iter() {
            let _ = job.reply.tx.try_send(JobEvent::Failed { message: message.clone() });
        }
        self.shared.active.fetch_sub(batch.len(), Ordering::SeqCst);
        for _ in batch.drain(..) {
            self.shared.job_left();
        }
        for encode in self.encodes.borrow_mut().drain(..) {
            let _ = encode.reply.send(Err(message.clone()));
            self.shared.job_left();
        }
        while let Ok(command) = self.jobs.try_recv() {
            match command {
                Command::Speech(queued) => {
                    self.shared.queued.fetch_sub(1, Ordering::SeqCst);
                    let _ = queued.reply.tx.try_send(JobEvent::Failed { message: message.clone() });
                }
                Command::Encode(encode) => {
                    let _ = encode.reply.send(Err(message.clone()));
                }
            }
            self.shared.job_left();
        }
        self.shared.publish_gauges();
    }

    /// The GPU's activation pool grows to what jobs need (and keeps it): report it.
    fn publish_memory(&self, model: &dyn Synthesizer) {
        let memory = model.memory();
        metrics::gauge!(telemetry::MEMORY_IN_USE_BYTES).set(memory.in_use as f64);
        metrics::gauge!(telemetry::MEMORY_BUDGET_BYTES).set(memory.budget as f64);
        metrics::gauge!(telemetry::ALLOCATIONS_AFTER_WARM_UP).set(memory.allocations_after_warm_up as f64);
        if let Some(graphs) = model.step_graphs() {
            metrics::counter!(telemetry::STEP_GRAPH_CAPTURES).absolute(graphs.captures);
            metrics::counter!(telemetry::STEP_GRAPH_REPLAYS).absolute(graphs.replays);
        }
        if let Some(cache) = model.prefix_cache() {
            metrics::counter!(telemetry::VOICE_CACHE_HITS).absolute(cache.hits);
            metrics::counter!(telemetry::VOICE_CACHE_MISSES).absolute(cache.misses);
            metrics::counter!(telemetry::VOICE_CACHE_EVICTIONS).absolute(cache.evicted);
            metrics::gauge!(telemetry::VOICE_CACHE_ENTRIES).set(cache.entries as f64);
            metrics::gauge!(telemetry::VOICE_CACHE_BYTES).set(cache.bytes as f64);
            metrics::gauge!(telemetry::VOICE_CACHE_BUDGET_BYTES).set(cache.budget as f64);
        }
    }
}
