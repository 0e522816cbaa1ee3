//! `x-request-id` on every response: a sane id the client sent is echoed, otherwise one is made.
//! Handlers read it with the [`RequestId`] extractor (500 messages and logs carry it).

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::extract::{FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{HeaderName, HeaderValue};
use axum::middleware::Next;
use axum::response::Response;

pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
/// Longest client id echoed; longer ones are replaced, not truncated (a truncated id would
/// silently stop matching the client's logs).
pub const MAX_CLIENT_ID_LEN: usize = 128;

/// The id of the request being handled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestId(pub String);

/// Middleware: settles the id, stores it for handlers, and sets it on the response.
pub async fn assign(mut req: Request, next: Next) -> Response {
    let id = req.headers().get(&REQUEST_ID).and_then(|v| v.to_str().ok()).filter(|s| is_sane(s)).map(str::to_owned);
    let id = RequestId(id.unwrap_or_else(new_id));
    let header = HeaderValue::from_str(&id.0).expect("ids are visible ASCII");
    req.extensions_mut().insert(id);
    let mut response = next.run(req).await;
    response.headers_mut().insert(REQUEST_ID, header);
    response
}

impl<S: Send + Sync> FromRequestParts<S> for RequestId {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<RequestId, Self::Rejection> {
        // Without the middleware (it is always installed by `router`) an id is still made.
        Ok(parts.extensions.get::<RequestId>().cloned().unwrap_or_else(|| RequestId(new_id())))
    }
}

/// Safe to echo into headers and logs: 1..=128 of `[A-Za-z0-9._:-]`.
pub fn is_sane(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_CLIENT_ID_LEN
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
}

/// `req_` + 24 hex digits: a per-process counter mixed with randomly keyed hashes, so ids are
/// unique within the process and unlikely to repeat across restarts.
pub fn new_id() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let high = RandomState::new().hash_one(n);
    format!("req_{high:016x}{:08x}", n as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids() {
        let (a, b) = (new_id(), new_id());
        assert_ne!(a, b);
        assert!(is_sane(&a) && a.len() == 28, "{a}");
        assert!(is_sane("client-123_abc.def:9"));
        for bad in ["", "has space", "new\nline", "ü", &"x".repeat(129)] {
            assert!(!is_sane(bad), "{bad:?}");
        }
    }
}
