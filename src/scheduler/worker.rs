//! The worker thread: loads the model, then runs admitted jobs one at a time, each inside
//! `catch_unwind`, so a failing or panicking request fails alone and the next one runs.
//!
//! It is the single owner of the model: jobs arrive over a bounded channel and events go back
//! over each job's own bounded channel. A job whose client is gone stops at the next audio
//! chunk; a client that stops reading is given up after `stall_timeout`.

use std::any::Any;
use std::ops::ControlFlow;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, SyncSender};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use tracing::{debug, error, info, warn};

use super::job::{JobEvent, Queued, Reply};
use super::{LoadState, Loader, ModelHost, ModelInfo, Shared, SynthError, Synthesizer, WorkerConfig};
use crate::engine::generate::{AudioSink, FinishReason, GenerateOptions};
use crate::telemetry;

/// Starts the worker thread; returns the sending end of its job queue (`max_queue` deep).
pub(super) fn spawn(config: WorkerConfig, loader: Loader, shared: Arc<Shared>) -> SyncSender<Queued> {
    let (tx, rx) = std::sync::mpsc::sync_channel(config.max_queue);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a current-thread runtime with only a timer cannot fail to build");
    std::thread::Builder::new()
        .name(String::from("limelight-worker"))
        .spawn(move || {
            let mut host = Host { config, shared, jobs: rx, runtime };
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
    jobs: Receiver<Queued>,
    /// Only for waiting on a full reply channel with a deadline; never runs tasks.
    runtime: tokio::runtime::Runtime,
}

/// The client is gone or stalled: nothing more can be told to it.
struct Gone;

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
        };
        let _ = self.shared.info.set(info);
        let memory = model.memory();
        metrics::gauge!(telemetry::MEMORY_IN_USE_BYTES).set(memory.in_use as f64);
        metrics::gauge!(telemetry::MEMORY_BUDGET_BYTES).set(memory.budget as f64);
        self.progress("ready");
        self.shared.load.send_replace(LoadState::Ready);
        // Ends when every Scheduler handle is dropped.
        while let Ok(queued) = self.jobs.recv() {
            self.shared.queued.fetch_sub(1, Ordering::SeqCst);
            self.shared.active.fetch_add(1, Ordering::SeqCst);
            self.shared.publish_gauges();
            let started = Instant::now();
            // `run_job` contains the job's own failures; this catches one in reporting them, so
            // even then only this job is lost and the worker goes on.
            let failed = catch_unwind(AssertUnwindSafe(|| self.run_job(model, queued))).unwrap_or_else(|_| {
                error!("a job's failure could not be reported");
                true
            });
            self.shared.record_job_secs(started.elapsed().as_secs_f64());
            // The GPU's activation pool grows to what jobs need (and keeps it): report it.
            metrics::gauge!(telemetry::MEMORY_IN_USE_BYTES).set(model.memory().in_use as f64);
            self.shared.active.fetch_sub(1, Ordering::SeqCst);
            self.shared.publish_gauges();
            self.shared.job_left();
            // A failure that broke the engine itself (a GPU fault poisons its context) would fail
            // every later job: stop serving instead, so the service is restarted.
            if failed && let Err(why) = model.health() {
                self.engine_lost(&why);
                return;
            }
        }
    }
}

impl Host {
    /// The engine cannot run jobs any more: readiness turns to failed (new requests get 503) and
    /// the queued jobs fail with the reason; `serve` sees the state and exits non-zero.
    fn engine_lost(&self, why: &str) {
        let message = format!("the engine is unusable after a failed request: {why}");
        error!(reason = %message, "engine lost");
        self.shared.load.send_replace(LoadState::Failed(message.clone()));
        while let Ok(queued) = self.jobs.try_recv() {
            self.shared.queued.fetch_sub(1, Ordering::SeqCst);
            let _ = self.send(&queued.reply, JobEvent::Failed { message: message.clone() });
            self.shared.job_left();
        }
        self.shared.publish_gauges();
    }

    /// Runs one job to its end and tells the client how it ended; contains every failure.
    /// Returns whether the job failed inside the engine.
    fn run_job(&self, model: &dyn Synthesizer, queued: Queued) -> bool {
        let Queued { job, reply, admitted } = queued;
        let _span = job.span.enter();
        if reply.cancelled() {
            debug!("client left before the job started");
            return false;
        }
        if self.shared.aborting.load(Ordering::SeqCst) {
            let _ =
                self.send(&reply, JobEvent::Finished { reason: FinishReason::Cancelled, frames: 0, prompt_rows: 0 });
            return false;
        }
        debug!(waited_ms = admitted.elapsed().as_millis() as u64, "job started");
        let outcome = catch_unwind(AssertUnwindSafe(|| self.generate(model, &job.text, &job.options, &reply)));
        let (last, failed) = match outcome {
            Ok(Ok(finished)) => (finished, false),
            Ok(Err(JobError::Gone)) => {
                debug!("client gone; job stopped");
                return false;
            }
            Ok(Err(JobError::Synth(e))) => {
                error!(error = %e, "job failed");
                (JobEvent::Failed { message: e.to_string() }, true)
            }
            Err(panic) => {
                let message = format!("the engine panicked: {}", panic_message(&*panic));
                error!(reason = %message, "job failed");
                (JobEvent::Failed { message }, true)
            }
        };
        let _ = self.send(&reply, last);
        failed
    }

    fn generate(
        &self,
        model: &dyn Synthesizer,
        text: &str,
        options: &GenerateOptions,
        reply: &Reply,
    ) -> Result<JobEvent, JobError> {
        let rows = model.prompt(text)?;
        let prompt_rows = rows.len();
        self.send(reply, JobEvent::Started { prompt_rows })?;
        let mut sink = ReplySink { worker: self, reply, gone: false };
        let finished = model.generate(&rows, options, &mut sink)?;
        metrics::counter!(telemetry::FRAMES_GENERATED).increment(finished.frames as u64);
        if sink.gone {
            return Err(JobError::Gone);
        }
        Ok(JobEvent::Finished { reason: finished.reason, frames: finished.frames, prompt_rows })
    }

    /// Sends one event, waiting at most `stall_timeout` for room in the client's channel.
    fn send(&self, reply: &Reply, event: JobEvent) -> Result<(), Gone> {
        if reply.cancelled() {
            return Err(Gone);
        }
        let stall = self.config.stall_timeout;
        // The timer must be created inside the runtime, hence the async block.
        match self.runtime.block_on(async { tokio::time::timeout(stall, reply.tx.send(event)).await }) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_closed)) => Err(Gone),
            Err(_elapsed) => {
                warn!(stall_secs = stall.as_secs_f64(), "client stopped reading; job given up");
                Err(Gone)
            }
        }
    }
}

/// Sends a job's audio to its client and stops the engine, within a frame, once the client is
/// gone or the drain deadline has passed.
struct ReplySink<'a> {
    worker: &'a Host,
    reply: &'a Reply,
    gone: bool,
}

impl AudioSink for ReplySink<'_> {
    fn audio(&mut self, pcm: &[f32]) -> ControlFlow<()> {
        if self.worker.send(self.reply, JobEvent::Audio(pcm.to_vec())).is_err() {
            self.gone = true;
            return ControlFlow::Break(());
        }
        self.keep_going()
    }

    fn keep_going(&mut self) -> ControlFlow<()> {
        if self.reply.cancelled() {
            self.gone = true;
            return ControlFlow::Break(());
        }
        // The drain deadline passed: stop, and still tell the client how it ended.
        if self.worker.shared.aborting.load(Ordering::SeqCst) {
            return ControlFlow::Break(());
        }
        ControlFlow::Continue(())
    }
}

enum JobError {
    Gone,
    Synth(SynthError),
}

impl From<Gone> for JobError {
    fn from(_: Gone) -> JobError {
        JobError::Gone
    }
}

impl From<SynthError> for JobError {
    fn from(e: SynthError) -> JobError {
        JobError::Synth(e)
    }
}

/// The text of a panic payload (`panic!` with a literal or a format string).
fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        String::from("(no message)")
    }
}
