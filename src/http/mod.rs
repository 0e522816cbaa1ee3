//! The only module that knows axum and HTTP: `router(state)` is the route table and its layers
//! (request id, API key, our own body limit). Handlers live beside it, one file per concern.

pub mod auth;
pub mod body;
pub mod deadline;
pub mod error;
pub mod ops;
pub mod parse_errors;
pub mod request_id;
pub mod server;
pub mod speech;
pub mod voice_warm;
pub mod voices;
pub mod write_deadline;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::middleware;
use axum::routing::{get, post};

use crate::voice::isolated::ClipDecoder;
use crate::voice::store::{StoreLimits, VoiceStore};

pub use error::{ApiError, ApiJson};
pub use request_id::RequestId;

use crate::request::validate::SpeechPolicy;
use crate::scheduler::Scheduler;
use crate::telemetry;

/// Default `--max-input-chars`: a book chapter (long text runs as chunks of one request).
pub const DEFAULT_MAX_INPUT_CHARS: usize = 100_000;

/// Default `--max-body-bytes`: a [`DEFAULT_MAX_INPUT_CHARS`] input in raw 4-byte UTF-8 (400 kB)
/// plus instructions and JSON overhead fits with room to spare; nginx's `client_max_body_size
/// 1m` in `deploy/` matches it.
pub const DEFAULT_MAX_BODY_BYTES: usize = 1 << 20;

/// What the HTTP layer needs from the server's configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpConfig {
    /// Model names and request limits applied by validation.
    pub policy: SpeechPolicy,
    /// `--api-key` / `--api-key-file`: when any is set, every route but `/health` and `/ready`
    /// needs `Authorization: Bearer` with one of them.
    pub api_keys: Vec<String>,
    /// `--max-body-bytes`: a larger request body is refused with 413.
    pub max_body_bytes: usize,
    /// `--voice-alias`: OpenAI built-in names (lower case) that speak in a stored voice.
    pub voice_aliases: BTreeMap<String, String>,
    /// `--max-voice-upload-bytes`: the largest reference clip a voice upload may carry.
    pub max_voice_upload_bytes: usize,
    /// `--body-timeout`: a request's body must arrive within this of its head, or it is
    /// refused with 408 ([`deadline`]).
    pub body_timeout: Duration,
    /// How a client's reference clip is decoded: in a child process, under limits.
    pub clip_decoder: ClipDecoder,
    /// `--clip-decoders`: clips decoded at once.
    pub clip_decoders: usize,
}

/// Default `--max-voice-upload-bytes`: a minute of 16-bit stereo WAV at 48 kHz fits (11 MB).
pub const DEFAULT_MAX_VOICE_UPLOAD_BYTES: usize = 16 << 20;

/// Shared by every handler: the scheduler handle and the configuration. Cheap to clone.
#[derive(Clone)]
pub struct AppState {
    inner: Arc<Inner>,
}

struct Inner {
    scheduler: Scheduler,
    config: HttpConfig,
    voices: Arc<VoiceStore>,
    /// One permit per clip decoder that may run at once (`--clip-decoders`).
    clip_decoders: Arc<Semaphore>,
}

impl AppState {
    /// With voices kept in memory only.
    pub fn new(scheduler: Scheduler, config: HttpConfig) -> AppState {
        AppState::with_voices(scheduler, config, Arc::new(VoiceStore::in_memory(StoreLimits::default())))
    }

    pub fn with_voices(scheduler: Scheduler, config: HttpConfig, voices: Arc<VoiceStore>) -> AppState {
        // Install the metrics recorder now, so the first request is counted and not lost to a
        // recorder that `/metrics` would only install later.
        telemetry::metrics_handle();
        let clip_decoders = Arc::new(Semaphore::new(config.clip_decoders));
        AppState { inner: Arc::new(Inner { scheduler, config, voices, clip_decoders }) }
    }

    pub fn voices(&self) -> &VoiceStore {
        &self.inner.voices
    }

    pub fn voices_arc(&self) -> Arc<VoiceStore> {
        Arc::clone(&self.inner.voices)
    }

    pub fn scheduler(&self) -> &Scheduler {
        &self.inner.scheduler
    }

    pub fn config(&self) -> &HttpConfig {
        &self.inner.config
    }

    /// Waits for a turn to run a clip decoder; the turn ends when the permit drops.
    pub async fn clip_decoder_turn(&self) -> tokio::sync::OwnedSemaphorePermit {
        Arc::clone(&self.inner.clip_decoders).acquire_owned().await.expect("the semaphore is never closed")
    }
}

/// The route table (`api.md` "Other routes"). Layers run outside in: the request id first, so
/// every response carries it, even a 401; then the key check. Body limits are enforced by
/// `ApiJson`, so axum's default 2 MB limit is off and a 413 has OpenAI's shape.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/v1/audio/speech", post(speech::create_speech))
        .route(
            "/v1/audio/voices",
            get(voices::list).post(voices::upload).layer(DefaultBodyLimit::max(
                state.config().max_voice_upload_bytes.div_ceil(3) * 4 + voices::UPLOAD_OVERHEAD_BYTES,
            )),
        )
        .route("/v1/audio/voices/{name}", get(voices::describe).delete(voices::delete))
        .route("/v1/models", get(ops::models))
        .route("/health", get(ops::health))
        .route("/ready", get(ops::ready))
        .route("/metrics", get(ops::metrics))
        .fallback(ops::no_route)
        .method_not_allowed_fallback(ops::wrong_method)
        .layer(DefaultBodyLimit::disable())
        .layer(middleware::from_fn_with_state(state.clone(), deadline::limit_body_time))
        .layer(middleware::from_fn_with_state(state.clone(), auth::require_key))
        .layer(middleware::from_fn(request_id::assign))
        .with_state(state)
}
