//! `--api-key` / `--api-key-file`: every route but `/health` and `/ready` needs
//! `Authorization: Bearer <key>` with one of the configured keys (several allow rotation),
//! compared in constant time so response timing does not reveal how much of a guess matched.

use std::time::Instant;

use axum::extract::{Request, State};
use axum::http::{HeaderValue, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::{ApiError, AppState, RequestId};
use crate::telemetry::{self, RequestLog};

/// Probes must work without the key (load balancers and systemd checks carry none).
pub const OPEN_PATHS: [&str; 2] = ["/health", "/ready"];

/// Middleware: passes the request on when no key is configured, the path is open, or the
/// bearer token matches; answers 401 otherwise.
pub async fn require_key(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let keys = &state.config().api_keys;
    if keys.is_empty() || OPEN_PATHS.contains(&req.uri().path()) {
        return next.run(req).await;
    }
    let presented = req.headers().get(header::AUTHORIZATION).and_then(|v| bearer_token(v.as_bytes()));
    // Every key is compared (no early exit), so timing does not tell which one nearly matched.
    let matched =
        presented.is_some_and(|token| keys.iter().fold(false, |m, k| constant_time_eq(token, k.as_bytes()) | m));
    if matched {
        return next.run(req).await;
    }
    let start = Instant::now();
    let request_id = req.extensions().get::<RequestId>().map_or_else(String::new, |id| id.0.clone());
    let mut response = ApiError::Unauthorized.into_response();
    response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    telemetry::log_request(&RequestLog {
        request_id: &request_id,
        model: "-",
        format: "-",
        status: response.status().as_u16(),
        input_chars: 0,
        frames: 0,
        finish_reason: None,
        time_to_first_audio: None,
        elapsed: start.elapsed(),
        audio_seconds: 0.0,
    });
    response
}

/// The token of `Bearer <token>` (the scheme is case-insensitive, RFC 9110 §11.1).
pub fn bearer_token(value: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = value.split_at_checked(7)?;
    scheme.eq_ignore_ascii_case(b"bearer ").then(|| rest.trim_ascii())
}

/// Equality whose running time depends only on the lengths, not on where the bytes differ.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = u64::from(a.len() != b.len());
    for i in 0..a.len().max(b.len()) {
        let (x, y) = (a.get(i).copied().unwrap_or(0), b.get(i).copied().unwrap_or(0));
        // black_box keeps the optimiser from turning the fold into an early exit.
        diff = std::hint::black_box(diff | u64::from(x ^ y));
    }
    diff == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_and_comparison() {
        assert_eq!(bearer_token(b"Bearer abc"), Some(&b"abc"[..]));
        assert_eq!(bearer_token(b"bearer  abc "), Some(&b"abc"[..]));
        assert_eq!(bearer_token(b"Basic abc"), None);
        assert_eq!(bearer_token(b"Bear"), None);
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
        assert!(!constant_time_eq(b"", b"x"));
        assert!(constant_time_eq(b"", b""));
    }
}
