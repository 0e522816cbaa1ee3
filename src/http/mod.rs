//! The only module that knows axum and HTTP: `router(state)` is the route table and its layers
//! (request id, API key, our own body limit). Handlers live beside it, one file per concern.

pub mod auth;
pub mod body;
pub mod error;
pub mod ops;
pub mod request_id;
pub mod speech;

use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::middleware;
use axum::routing::{get, post};

pub use error::{ApiError, ApiJson};
pub use request_id::RequestId;

use crate::request::validate::SpeechPolicy;
use crate::scheduler::Scheduler;
use crate::telemetry;

/// Default `--max-body-bytes`: a 4096-character input in 4-byte UTF-8 plus instructions and
/// JSON overhead fits with room to spare.
pub const DEFAULT_MAX_BODY_BYTES: usize = 64 * 1024;

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
}

/// Shared by every handler: the scheduler handle and the configuration. Cheap to clone.
#[derive(Clone)]
pub struct AppState {
    inner: Arc<Inner>,
}

struct Inner {
    scheduler: Scheduler,
    config: HttpConfig,
}

impl AppState {
    pub fn new(scheduler: Scheduler, config: HttpConfig) -> AppState {
        // Install the metrics recorder now, so the first request is counted and not lost to a
        // recorder that `/metrics` would only install later.
        telemetry::metrics_handle();
        AppState { inner: Arc::new(Inner { scheduler, config }) }
    }

    pub fn scheduler(&self) -> &Scheduler {
        &self.inner.scheduler
    }

    pub fn config(&self) -> &HttpConfig {
        &self.inner.config
    }
}

/// The route table (`api.md` "Other routes"). Layers run outside in: the request id first, so
/// every response carries it, even a 401; then the key check. Body limits are enforced by
/// `ApiJson`, so axum's default 2 MB limit is off and a 413 has OpenAI's shape.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/v1/audio/speech", post(speech::create_speech))
        .route("/v1/models", get(ops::models))
        .route("/health", get(ops::health))
        .route("/ready", get(ops::ready))
        .route("/metrics", get(ops::metrics))
        .fallback(ops::no_route)
        .method_not_allowed_fallback(ops::wrong_method)
        .layer(DefaultBodyLimit::disable())
        .layer(middleware::from_fn_with_state(state.clone(), auth::require_key))
        .layer(middleware::from_fn(request_id::assign))
        .with_state(state)
}
