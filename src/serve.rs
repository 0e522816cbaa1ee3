//! `limelight serve`: checks the flags, starts logging and metrics, binds the socket, starts the
//! worker, answers HTTP while the model loads (`/health` 200, `/ready` 503), tells systemd when it
//! is ready, and drains on SIGTERM or SIGINT: no new jobs, running ones finish until
//! `--drain-timeout`, then the rest are cancelled and the process exits 0.

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{error, info, warn};

use crate::cli::ServeArgs;
use crate::config::{ConfigError, EngineChoice, ModelSource, ServeConfig};
use crate::http::server::ServerLimits;
use crate::http::{self, AppState, HttpConfig, voice_warm};
use crate::request::validate::SpeechPolicy;
use crate::scheduler::{BatchLimits, Loader, Scheduler, cpu_loader, cuda_loader};
use crate::service;
use crate::synth::presets::Preset;
use crate::synth::{SynthOptions, SynthPlan};
use crate::telemetry::{self, TelemetryError};
use crate::voice::store::{StoreLimits, VoiceStore};

/// How often loading progress goes to systemd's `STATUS=`. The start timeout is not extended:
/// `TimeoutStartSec` stays the bound that catches a load that hangs (`docs/operations.md` §4).
const LOAD_STATUS_INTERVAL: Duration = Duration::from_secs(5);
/// How often the Prometheus recorder drains its histograms.
const METRICS_UPKEEP_INTERVAL: Duration = Duration::from_secs(5);
/// Time for streams to send their last bytes once their jobs have ended.
const CLOSE_GRACE: Duration = Duration::from_secs(2);
/// Marks a complete demo checkpoint (written last, so a half-written one is never used).
const DEMO_STAMP_FILE: &str = ".limelight-demo";

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Telemetry(#[from] TelemetryError),
    #[error("writing the demo checkpoint into {dir}: {source}")]
    Demo { dir: PathBuf, source: io::Error },
    #[error("starting the async runtime: {0}")]
    Runtime(io::Error),
    #[error("binding {addr}: {source}")]
    Bind { addr: SocketAddr, source: io::Error },
    #[error("installing the SIGTERM/SIGINT handlers: {0}")]
    Signals(io::Error),
    #[error("the model failed to load: {0}")]
    Load(String),
    #[error("{0}")]
    EngineLost(String),
    #[error("voices: {0}")]
    Voices(#[from] crate::voice::store::StoreError),
}

/// Requests to shut down: the first drains, a second stops at once.
pub type ShutdownRequests = mpsc::Receiver<()>;

/// The `serve` command: runs until a signal has drained the server.
pub fn run(args: &ServeArgs) -> Result<(), ServeError> {
    let config = ServeConfig::from_args(args)?;
    telemetry::init_logging(config.log_format)?;
    if let ModelSource::Demo(dir) = &config.model {
        ensure_demo_checkpoint(dir)?;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().map_err(ServeError::Runtime)?;
    runtime.block_on(async {
        let listener = TcpListener::bind(config.listen)
            .await
            .map_err(|source| ServeError::Bind { addr: config.listen, source })?;
        let shutdown = signals().map_err(ServeError::Signals)?;
        serve(config, listener, shutdown).await
    })
}

/// Serves on `listener` until `shutdown` asks twice or a drain completes.
pub async fn serve(
    config: ServeConfig,
    listener: TcpListener,
    mut shutdown: ShutdownRequests,
) -> Result<(), ServeError> {
    let addr = listener.local_addr().map_err(|source| ServeError::Bind { addr: config.listen, source })?;
    let http_config = http_config(&config);
    let scheduler = Scheduler::start_with(config.worker_config(), loader(&config)?);
    crate::audio::prepare_default_resampler();
    let metrics = telemetry::metrics_handle();
    let upkeep = tokio::spawn(async move {
        let mut tick = tokio::time::interval(METRICS_UPKEEP_INTERVAL);
        loop {
            tick.tick().await;
            metrics.run_upkeep();
        }
    });
    let voices = open_voices(&config)?;
    let state = AppState::with_voices(scheduler.clone(), http_config, voices);
    let app = http::router(state.clone());
    let limits = ServerLimits {
        max_connections: config.max_connections,
        header_timeout: config.header_timeout,
        write_timeout: config.write_timeout,
    };
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let server = tokio::spawn(http::server::run(listener, app, limits, async move {
        let _ = stop_rx.await;
    }));
    info!(%addr, model = %config.model.dir().display(), "listening; loading the model");

    let outcome = tokio::select! {
        loaded = await_load(&scheduler) => match loaded {
            Ok(()) => {
                service::ready(&format!("serving {} on {addr}", config.served_model_name));
                info!(%addr, model = %config.served_model_name, "ready");
                // Stored voices warmed beside the first requests, which queue with them.
                tokio::spawn(async move { voice_warm::warm_stored(&state, voice_warm::WARM_AT_START).await });
                tokio::select! {
                    _ = shutdown.recv() => {
                        drain(&scheduler, config.drain_timeout, &mut shutdown).await;
                        Ok(())
                    }
                    why = scheduler.engine_lost() => {
                        // Exiting non-zero lets the supervisor (systemd: Restart=on-failure) start
                        // a fresh process with a fresh GPU context.
                        service::status(&format!("failed: {why}"));
                        Err(ServeError::EngineLost(why))
                    }
                }
            }
            Err(message) => {
                error!(reason = %message, "the model failed to load");
                service::status(&format!("failed: {message}"));
                Err(ServeError::Load(message))
            }
        },
        _ = shutdown.recv() => {
            info!("shutdown requested while loading");
            Ok(())
        }
    };
    let _ = stop_tx.send(());
    finish_http(server, CLOSE_GRACE).await;
    upkeep.abort();
    outcome
}

/// The engine the worker loads: `--device` decided (`auto` takes a supported GPU if present).
fn loader(config: &ServeConfig) -> Result<Loader, ConfigError> {
    let dir = config.model.dir().clone();
    let limits = BatchLimits {
        max_batch: config.max_batch,
        prefill_chunk: config.prefill_chunk,
        voice_cache_bytes: config.voice_cache_bytes,
        codec_thread: config.codec_thread,
    };
    match config.engine()? {
        EngineChoice::Cpu => {
            info!(device = "cpu", "engine: the CPU reference engine");
            Ok(cpu_loader(dir, config.max_frames, limits))
        }
        EngineChoice::Cuda(gpu) => {
            info!(
                device = "cuda",
                ordinal = gpu.ordinal,
                context = gpu.context,
                cuda_graph = gpu.graph,
                "engine: CUDA"
            );
            // Prompt rows are tokens of at most `max_input_chars` characters (a few bytes each,
            // a byte at most one token) plus the prompt's fixed block.
            let max_prompt_rows = 4 * config.max_input_chars + crate::config::PROMPT_ROOM;
            Ok(cuda_loader(dir, gpu, max_prompt_rows, limits))
        }
    }
}

/// The named voices: loaded from `--voices-dir` (files that do not hold a voice are refused by
/// name and left alone), or kept in memory.
fn open_voices(config: &ServeConfig) -> Result<Arc<VoiceStore>, ServeError> {
    let limits = StoreLimits { max_voices: config.max_voices };
    let Some(dir) = &config.voices_dir else {
        info!("voices: in memory only (no --voices-dir); uploads are lost at exit");
        return Ok(Arc::new(VoiceStore::in_memory(limits)));
    };
    let (store, refused) = VoiceStore::open(dir, limits)?;
    for r in &refused {
        error!(file = %r.path.display(), reason = %r.reason, "voice file refused");
    }
    info!(dir = %dir.display(), voices = store.list().len(), refused = refused.len(), "voices loaded");
    for (builtin, voice) in &config.voice_aliases {
        if store.get(voice).is_none() {
            warn!(alias = %builtin, voice = %voice, "--voice-alias names a voice that does not exist yet");
        }
    }
    Ok(Arc::new(store))
}

/// The HTTP layer's share of the configuration.
pub fn http_config(config: &ServeConfig) -> HttpConfig {
    HttpConfig {
        policy: SpeechPolicy {
            served_model: config.served_model_name.clone(),
            aliases: config.model_aliases.clone(),
            max_input_chars: config.max_input_chars,
            max_frames: config.max_frames,
        },
        api_keys: config.api_keys.clone(),
        max_body_bytes: config.max_body_bytes,
        voice_aliases: config.voice_aliases.clone(),
        max_voice_upload_bytes: config.max_voice_upload_bytes,
        body_timeout: config.body_timeout,
        clip_decoder: config.clip_decoder.clone(),
        clip_decoders: config.clip_decoders,
    }
}

/// Waits for the worker to load, telling systemd the stage every few seconds while it does.
async fn await_load(scheduler: &Scheduler) -> Result<(), String> {
    let loaded = scheduler.loaded();
    tokio::pin!(loaded);
    let mut tick = tokio::time::interval(LOAD_STATUS_INTERVAL);
    loop {
        tokio::select! {
            result = &mut loaded => return result,
            _ = tick.tick() => {
                service::status(&format!("loading: {}", scheduler.loading_stage()));
            }
        }
    }
}

/// Stops admitting, lets queued and running jobs finish until `timeout` (or a second shutdown
/// request), then cancels what is left so its streams end with an error rather than a cut.
async fn drain(scheduler: &Scheduler, timeout: Duration, shutdown: &mut ShutdownRequests) {
    scheduler.begin_drain();
    let (running, queued) = (scheduler.active(), scheduler.queue_depth());
    service::stopping(&format!("draining: {running} running, {queued} queued"));
    info!(running, queued, timeout_secs = timeout.as_secs(), "draining");
    let deadline = Instant::now() + timeout;
    let drained = tokio::select! {
        finished = tokio::time::timeout_at(deadline, scheduler.drained()) => finished.is_ok(),
        _ = shutdown.recv() => {
            warn!("second shutdown request: stopping now");
            false
        }
    };
    if drained {
        info!("drained");
    } else {
        warn!(running = scheduler.active(), queued = scheduler.queue_depth(), "drain cut short; cancelling the rest");
        scheduler.cancel_all();
        // Cancelled jobs report within a frame; give their streams that long to say so.
        let _ = tokio::time::timeout(CLOSE_GRACE, scheduler.drained()).await;
    }
}

/// Lets the HTTP server close its connections, for at most `grace`.
async fn finish_http(server: JoinHandle<io::Result<()>>, grace: Duration) {
    match tokio::time::timeout(grace, server).await {
        Ok(Ok(Ok(()))) => info!("stopped"),
        Ok(Ok(Err(e))) => warn!(error = %e, "the HTTP server ended with an error"),
        Ok(Err(e)) => warn!(error = %e, "the HTTP server task failed"),
        Err(_) => warn!("connections still open after the grace period; closing them"),
    }
}

/// SIGTERM and SIGINT, as a stream of shutdown requests.
fn signals() -> io::Result<ShutdownRequests> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let (tx, rx) = mpsc::channel(4);
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            if tx.send(()).await.is_err() {
                break;
            }
        }
    });
    Ok(rx)
}

/// Removes the staging folders (`.demo-tiny.<pid>`) of earlier starts whose process is gone: a
/// start killed while writing the demo checkpoint left its 43 MB there (issue 16). A folder of a
/// live process (another server writing now) is left alone; without `/proc` nothing is removed.
fn remove_dead_staging(parent: &Path) {
    let Ok(entries) = std::fs::read_dir(parent) else { return };
    if !Path::new("/proc/self").exists() {
        return;
    }
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.strip_prefix(".demo-tiny.")).and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if pid != std::process::id() && !Path::new("/proc").join(pid.to_string()).exists() {
            info!(dir = %entry.path().display(), "removing a dead start's demo staging folder");
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// Writes the tiny random checkpoint into `dir` unless a complete one from this version is there.
pub fn ensure_demo_checkpoint(dir: &Path) -> Result<(), ServeError> {
    let stamp = format!("limelight {} tiny seed 0\n", env!("CARGO_PKG_VERSION"));
    let is_complete = || std::fs::read_to_string(dir.join(DEMO_STAMP_FILE)).is_ok_and(|s| s == stamp);
    if is_complete() {
        return Ok(());
    }
    let demo_error = |source| ServeError::Demo { dir: dir.to_owned(), source };
    let parent = dir.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).map_err(demo_error)?;
    // One writer at a time: without the lock, a second server finishing later removed the
    // first one's fresh copy while the first was loading it. The lock is released when the
    // file closes, also when the process dies.
    let lock = std::fs::File::create(parent.join(".demo-tiny.lock")).map_err(demo_error)?;
    lock.lock().map_err(demo_error)?;
    if is_complete() {
        return Ok(());
    }
    remove_dead_staging(parent);
    // Written beside its final place and renamed, so a start killed midway never leaves half a
    // checkpoint where the next start looks.
    let staging = parent.join(format!(".demo-tiny.{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&staging);
    info!(dir = %dir.display(), "writing the demo checkpoint (tiny, random weights)");
    SynthPlan::new(&SynthOptions { preset: Preset::Tiny, seed: 0, vq_backbone_codebooks: 1 })
        .write(&staging)
        .and_then(|()| std::fs::write(staging.join(DEMO_STAMP_FILE), &stamp))
        .map_err(demo_error)?;
    // What is there now is another version's or half-written: nobody loads it.
    let _ = std::fs::remove_dir_all(dir);
    std::fs::rename(&staging, dir).map_err(demo_error)
}
