//! Logs and metrics: the tracing subscriber (text or JSON), the Prometheus recorder, every metric
//! name as a constant, and the one structured line logged per request.

use std::sync::OnceLock;
use std::time::Duration;

pub use metrics_exporter_prometheus::PrometheusHandle;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use tracing_subscriber::EnvFilter;

/// Requests answered, labelled `status` (HTTP code) and `format` (`response_format`).
pub const REQUESTS_TOTAL: &str = "limelight_requests_total";
/// Connections refused past `--max-connections` (answered 503 and closed).
pub const CONNECTIONS_REFUSED_TOTAL: &str = "limelight_connections_refused_total";
/// Connections closed because their client took none of the reply for `--write-timeout`.
pub const CONNECTIONS_WRITE_TIMED_OUT_TOTAL: &str = "limelight_connections_write_timed_out_total";
/// Jobs given up because their client fell behind (`--stall-timeout`, `--min-read-rate`).
pub const SLOW_CLIENTS_GIVEN_UP_TOTAL: &str = "limelight_slow_clients_given_up_total";
/// Jobs admitted and waiting for the worker.
pub const QUEUE_DEPTH: &str = "limelight_queue_depth";
/// Streams in the engine's decode batch now (prefilling or generating).
pub const ACTIVE_STREAMS: &str = "limelight_active_streams";
/// Streams advanced by each decode step.
pub const BATCH_SIZE: &str = "limelight_batch_size";
/// Seconds of each decode step (one frame of every stream in it, the codec included).
pub const STEP_SECONDS: &str = "limelight_step_seconds";
/// Seconds a job waited in the queue before it joined the batch.
pub const QUEUE_WAIT_SECONDS: &str = "limelight_queue_wait_seconds";
/// Per stream: seconds from joining the batch to its end, over the seconds of audio it produced.
pub const STREAM_REAL_TIME_FACTOR: &str = "limelight_stream_real_time_factor";
/// Seconds from a request's arrival to its first audio.
pub const TIME_TO_FIRST_AUDIO_SECONDS: &str = "limelight_time_to_first_audio_seconds";
/// Seconds a request's wait for its first audio spent in each phase inside the worker, by
/// `phase`: `queue`, `open`, `prefill`, `first_frame`, `codec` (`scheduler::worker::first_audio`).
pub const FIRST_AUDIO_PHASE_SECONDS: &str = "limelight_first_audio_phase_seconds";
/// A request's wall time over the duration of the audio it produced (< 1 is faster than real time).
pub const REAL_TIME_FACTOR: &str = "limelight_real_time_factor";
/// Frames generated (2048 samples each); its rate is frames per second.
pub const FRAMES_GENERATED: &str = "limelight_frames_generated_total";
/// Chunks of long requests cut at a bound, by `bound`: `frames` (the runaway guard's frame
/// bound, or `max_frames` where lower), `stall` (the stall guard: the audio stood still).
pub const CHUNKS_CUT: &str = "limelight_chunks_cut_total";
/// Chunks after a long request's first that a guard cut and that were generated once more with
/// another seed, their first take dropped unheard.
pub const CHUNKS_RETRIED: &str = "limelight_chunks_retried_total";
/// Bytes the resident model holds on its device (on the CPU: weights as stored).
pub const MEMORY_IN_USE_BYTES: &str = "limelight_memory_in_use_bytes";
/// Bytes serving is budgeted to need: weights plus one request's caches at the longest context.
pub const MEMORY_BUDGET_BYTES: &str = "limelight_memory_budget_bytes";
/// Device allocations the engine made after its warm-up (serving's contract: none).
pub const ALLOCATIONS_AFTER_WARM_UP: &str = "limelight_device_allocations_after_warm_up";
/// Decode steps captured as a CUDA graph (one per new list of streams stepping together).
pub const STEP_GRAPH_CAPTURES: &str = "limelight_step_graph_captures_total";
/// Decode steps run as a replay of a captured graph (the rest ran launch by launch).
pub const STEP_GRAPH_REPLAYS: &str = "limelight_step_graph_replays_total";
/// Requests in a saved voice that started from its kept prompt prefix.
pub const VOICE_CACHE_HITS: &str = "limelight_voice_cache_hits_total";
/// Requests in a saved voice that ran its prompt prefix (and kept it).
pub const VOICE_CACHE_MISSES: &str = "limelight_voice_cache_misses_total";
/// Kept voice prefixes dropped to make room (least recently used first).
pub const VOICE_CACHE_EVICTIONS: &str = "limelight_voice_cache_evictions_total";
/// Voice prefixes kept now.
pub const VOICE_CACHE_ENTRIES: &str = "limelight_voice_cache_entries";
/// Bytes the kept voice prefixes take, and the budget they are kept within (`--voice-cache-mib`).
pub const VOICE_CACHE_BYTES: &str = "limelight_voice_cache_bytes";
pub const VOICE_CACHE_BUDGET_BYTES: &str = "limelight_voice_cache_budget_bytes";

/// Histogram buckets for time to first audio, in seconds.
const TTFA_BUCKETS: &[f64] = &[0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0, 30.0];
/// Histogram buckets for a phase of the wait for first audio, in seconds (milliseconds matter).
const PHASE_BUCKETS: &[f64] = &[0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.1, 0.25, 1.0, 5.0];
/// Histogram buckets for the real-time factor.
const RTF_BUCKETS: &[f64] = &[0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 5.0, 10.0, 50.0];
/// Histogram buckets for the decode batch's size.
const BATCH_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0];
/// Histogram buckets for a decode step, in seconds.
const STEP_BUCKETS: &[f64] = &[0.002, 0.005, 0.01, 0.02, 0.03, 0.046, 0.075, 0.1, 0.2, 0.5, 1.0, 5.0];
/// Histogram buckets for the queue wait, in seconds.
const WAIT_BUCKETS: &[f64] = &[0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0];

/// How log lines are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line (for journald or log shippers).
    Json,
}

#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("a global log subscriber is already installed")]
    SubscriberTaken,
    #[error("`RUST_LOG`: {0}")]
    Filter(String),
}

/// Installs the log subscriber: level filter from `RUST_LOG` (default `info`), lines to stdout.
pub fn init_logging(format: LogFormat) -> Result<(), TelemetryError> {
    let filter = match std::env::var("RUST_LOG") {
        Ok(spec) => EnvFilter::try_new(spec).map_err(|e| TelemetryError::Filter(e.to_string()))?,
        Err(_) => EnvFilter::new("info"),
    };
    // Colour only for a terminal: escape codes in a file or the journal are noise (issue 16).
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stdout).with_ansi(ansi);
    let installed = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).with_current_span(true).try_init(),
    };
    installed.map_err(|_| TelemetryError::SubscriberTaken)
}

/// The Prometheus handle (`/metrics` renders it). The first call installs the global recorder;
/// later calls return the same handle, so tests and the server can all ask for it.
pub fn metrics_handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(install_recorder).clone()
}

fn install_recorder() -> PrometheusHandle {
    let recorder = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Full(TIME_TO_FIRST_AUDIO_SECONDS.into()), TTFA_BUCKETS)
        .and_then(|b| b.set_buckets_for_metric(Matcher::Full(FIRST_AUDIO_PHASE_SECONDS.into()), PHASE_BUCKETS))
        .and_then(|b| b.set_buckets_for_metric(Matcher::Full(REAL_TIME_FACTOR.into()), RTF_BUCKETS))
        .and_then(|b| b.set_buckets_for_metric(Matcher::Full(STREAM_REAL_TIME_FACTOR.into()), RTF_BUCKETS))
        .and_then(|b| b.set_buckets_for_metric(Matcher::Full(BATCH_SIZE.into()), BATCH_BUCKETS))
        .and_then(|b| b.set_buckets_for_metric(Matcher::Full(STEP_SECONDS.into()), STEP_BUCKETS))
        .and_then(|b| b.set_buckets_for_metric(Matcher::Full(QUEUE_WAIT_SECONDS.into()), WAIT_BUCKETS))
        .expect("bucket lists are non-empty constants")
        .build_recorder();
    let handle = recorder.handle();
    if metrics::set_global_recorder(recorder).is_err() {
        tracing::warn!("another metrics recorder is installed; /metrics will be empty");
    }
    describe();
    handle
}

fn describe() {
    metrics::describe_counter!(REQUESTS_TOTAL, "Speech requests answered, by HTTP status and response format.");
    metrics::describe_gauge!(QUEUE_DEPTH, "Jobs admitted and waiting for the worker.");
    metrics::describe_gauge!(ACTIVE_STREAMS, "Streams in the decode batch now (prefilling or generating).");
    metrics::describe_histogram!(BATCH_SIZE, "Streams advanced by each decode step.");
    metrics::describe_histogram!(STEP_SECONDS, metrics::Unit::Seconds, "Seconds of each decode step.");
    metrics::describe_histogram!(
        QUEUE_WAIT_SECONDS,
        metrics::Unit::Seconds,
        "Seconds a job waited in the queue before joining the batch."
    );
    metrics::describe_histogram!(
        STREAM_REAL_TIME_FACTOR,
        "Per stream: seconds in the batch over the seconds of audio it produced."
    );
    metrics::describe_histogram!(
        TIME_TO_FIRST_AUDIO_SECONDS,
        metrics::Unit::Seconds,
        "Seconds from a request's arrival to its first audio."
    );
    metrics::describe_histogram!(
        FIRST_AUDIO_PHASE_SECONDS,
        metrics::Unit::Seconds,
        "Seconds of a request's wait for its first audio in each worker phase: queue, open, prefill, first_frame, codec."
    );
    metrics::describe_histogram!(REAL_TIME_FACTOR, "Request wall time over the duration of its audio.");
    metrics::describe_counter!(FRAMES_GENERATED, "Frames generated (2048 samples each at 44.1 kHz).");
    metrics::describe_counter!(CONNECTIONS_REFUSED_TOTAL, "Connections refused past --max-connections (503, closed).");
    metrics::describe_counter!(
        CONNECTIONS_WRITE_TIMED_OUT_TOTAL,
        "Connections closed because their client took no reply bytes for --write-timeout."
    );
    metrics::describe_counter!(
        SLOW_CLIENTS_GIVEN_UP_TOTAL,
        "Jobs given up because their client stalled (--stall-timeout) or read too slowly (--min-read-rate)."
    );
    metrics::describe_counter!(
        CHUNKS_CUT,
        "Chunks of long requests cut at a bound: `bound=frames` (the runaway guard's frame bound, or max_frames), `bound=stall` (the stall guard: the audio stood still)."
    );
    metrics::describe_counter!(
        CHUNKS_RETRIED,
        "Later chunks of long requests cut by a guard (frame bound or stall) and generated again with another seed."
    );
    metrics::describe_gauge!(
        MEMORY_IN_USE_BYTES,
        metrics::Unit::Bytes,
        "Bytes the engine holds: resident model, and on the GPU its caches and activation pool."
    );
    metrics::describe_gauge!(MEMORY_BUDGET_BYTES, metrics::Unit::Bytes, "Bytes serving is budgeted to need.");
    metrics::describe_gauge!(
        ALLOCATIONS_AFTER_WARM_UP,
        "Device allocations the engine made after its start-up warm-up (expected: 0)."
    );
}

/// What one request did, for its log line and metrics.
#[derive(Clone, Debug, PartialEq)]
pub struct RequestLog<'a> {
    pub request_id: &'a str,
    /// The model name the client sent.
    pub model: &'a str,
    /// `response_format` (`mp3`, `wav`, ...), or `sse` for SSE replies; `-` if the request was refused before parsing.
    pub format: &'a str,
    /// The HTTP status sent (a stream that failed after its headers still logs 200 with no finish reason).
    pub status: u16,
    pub input_chars: usize,
    pub frames: usize,
    /// `stop`, `length` or `cancelled` (also a client that left before the end); `None` if the
    /// request was refused or failed.
    pub finish_reason: Option<&'a str>,
    /// From the request's arrival to its first audio chunk, if any was produced.
    pub time_to_first_audio: Option<Duration>,
    /// From the request's arrival to its end.
    pub elapsed: Duration,
    /// Seconds of audio produced.
    pub audio_seconds: f64,
}

/// Logs the one structured line of a request and records its metrics. The HTTP layer calls
/// this once per request, at its end (also for refused requests).
pub fn log_request(log: &RequestLog<'_>) {
    let rtf = real_time_factor(log.elapsed, log.audio_seconds);
    let ttfa_ms = log.time_to_first_audio.map(|d| d.as_secs_f64() * 1e3);
    tracing::info!(
        target: "limelight::request",
        request_id = log.request_id,
        model = log.model,
        format = log.format,
        status = log.status,
        input_chars = log.input_chars,
        frames = log.frames,
        finish_reason = log.finish_reason,
        time_to_first_audio_ms = ttfa_ms,
        real_time_factor = rtf,
        elapsed_ms = log.elapsed.as_secs_f64() * 1e3,
        "request"
    );
    let labels = [
        ("status", log.status.to_string()),
        ("format", log.format.to_owned()),
        ("finish_reason", log.finish_reason.unwrap_or("none").to_owned()),
    ];
    metrics::counter!(REQUESTS_TOTAL, &labels).increment(1);
    if let Some(ttfa) = log.time_to_first_audio {
        metrics::histogram!(TIME_TO_FIRST_AUDIO_SECONDS).record(ttfa.as_secs_f64());
    }
    if let Some(rtf) = rtf {
        metrics::histogram!(REAL_TIME_FACTOR).record(rtf);
    }
}

/// Wall time over audio duration; `None` when no audio was produced.
pub fn real_time_factor(elapsed: Duration, audio_seconds: f64) -> Option<f64> {
    (audio_seconds > 0.0 && audio_seconds.is_finite()).then(|| elapsed.as_secs_f64() / audio_seconds)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn real_time_factor_is_wall_time_over_audio_time() {
        assert_eq!(real_time_factor(Duration::from_millis(500), 2.0), Some(0.25));
        assert_eq!(real_time_factor(Duration::from_secs(3), 1.5), Some(2.0));
        assert_eq!(real_time_factor(Duration::from_secs(1), 0.0), None);
    }

    #[test]
    fn a_logged_request_shows_up_in_the_prometheus_text() {
        let handle = metrics_handle();
        log_request(&RequestLog {
            request_id: "req-test",
            model: "drama-3",
            format: "flac",
            status: 200,
            input_chars: 12,
            frames: 43,
            finish_reason: Some("stop"),
            time_to_first_audio: Some(Duration::from_millis(120)),
            elapsed: Duration::from_secs(1),
            audio_seconds: 2.0,
        });
        let text = handle.render();
        let series = format!("{REQUESTS_TOTAL}{{status=\"200\",format=\"flac\",finish_reason=\"stop\"}} 1");
        assert!(text.contains(&series), "{text}");
        assert!(text.contains(&format!("{TIME_TO_FIRST_AUDIO_SECONDS}_bucket{{le=\"0.2\"}} 1")), "{text}");
        assert!(text.contains(&format!("{REAL_TIME_FACTOR}_bucket{{le=\"0.5\"}} 1")), "{text}");
        // A second call hands out the same recorder, not a fresh empty one.
        assert!(metrics_handle().render().contains(REQUESTS_TOTAL));
    }
}
