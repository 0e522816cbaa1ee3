//! Operational routes (`api.md` "Other routes"): `/v1/models`, `/health` (liveness), `/ready`
//! (readiness: 503 while loading, draining or failed), `/metrics` (Prometheus text), and the
//! OpenAI-shaped answers for unknown routes and methods.

use axum::Json;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::error::{DRAINING_RETRY_AFTER_SECS, LOADING_RETRY_AFTER_SECS};
use super::{ApiError, AppState};
use crate::api::models::ModelList;
use crate::scheduler::Readiness;
use crate::telemetry;

/// Who `/v1/models` says owns the model.
pub const OWNED_BY: &str = "fishaudio";

/// `GET /v1/models`: the served name, then its aliases, so apps that check for `tts-1` find it.
pub async fn models(State(state): State<AppState>) -> Json<ModelList> {
    let policy = &state.config().policy;
    let created = state.scheduler().model_info().map_or(0, |info| info.created);
    let ids = std::iter::once(policy.served_model.as_str()).chain(policy.aliases.iter().map(String::as_str));
    Json(ModelList::new(ids, created, OWNED_BY))
}

/// `GET /health`: 200 for as long as the process answers HTTP.
pub async fn health() -> Json<serde_json::Value> {
    Json(json!({"status": "ok"}))
}

/// `GET /ready`: 200 once the model is loaded and the worker runs; 503 otherwise, with
/// `Retry-After` while a wait will help.
pub async fn ready(State(state): State<AppState>) -> Response {
    let (status, body, retry_after) = match state.scheduler().readiness() {
        Readiness::Ready => (StatusCode::OK, json!({"status": "ready"}), None),
        Readiness::Loading => (
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"status": "loading", "stage": state.scheduler().loading_stage()}),
            Some(LOADING_RETRY_AFTER_SECS),
        ),
        Readiness::Draining => {
            (StatusCode::SERVICE_UNAVAILABLE, json!({"status": "draining"}), Some(DRAINING_RETRY_AFTER_SECS))
        }
        Readiness::Failed(message) => {
            (StatusCode::SERVICE_UNAVAILABLE, json!({"status": "failed", "message": message}), None)
        }
    };
    let mut response = (status, Json(body)).into_response();
    if let Some(secs) = retry_after {
        response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    response
}

/// `GET /metrics`: the Prometheus text exposition of every `telemetry` metric.
pub async fn metrics() -> Response {
    let text = telemetry::metrics_handle().render();
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response()
}

/// Any other path: 404 in OpenAI's shape.
pub async fn no_route(req: Request) -> ApiError {
    ApiError::NoRoute { method: req.method().to_string(), path: req.uri().path().to_owned() }
}

/// A known path with the wrong method: 405 in OpenAI's shape.
pub async fn wrong_method(req: Request) -> ApiError {
    ApiError::WrongMethod { method: req.method().to_string(), path: req.uri().path().to_owned() }
}
