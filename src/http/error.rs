//! Every failure a client can see → status + OpenAI error body (`api.md` "Errors"): `ApiError`
//! and its one mapping, plus `ApiJson`, our JSON extractor, so that a malformed body, a wrong
//! content type or an unknown field is a 400 in OpenAI's shape instead of axum's own 4xx text.

use axum::body::Body;
use axum::extract::{FromRequest, Request};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;

use super::AppState;
use crate::api::error::{ErrorBody, ErrorDetail};
use crate::audio::AudioError;
use crate::request::prompt::PromptError;
use crate::request::validate::ValidateError;
use crate::scheduler::SubmitError;

/// `Retry-After` while the model loads: loading takes a while, so a client should not spin.
pub const LOADING_RETRY_AFTER_SECS: u64 = 10;
/// `Retry-After` while draining: this process is going away; a retry reaches its successor.
pub const DRAINING_RETRY_AFTER_SECS: u64 = 5;
/// `Retry-After` when device memory ran out at admission: streams end every few seconds.
pub const OUT_OF_MEMORY_RETRY_AFTER_SECS: u64 = 2;

/// A refusal or failure of one request.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// A field broke a rule of the field table (400, or 404 for an unknown model).
    #[error(transparent)]
    Invalid(#[from] ValidateError),
    /// The body is not a JSON object of the request type: syntax, type, unknown or duplicate field.
    #[error("{message}")]
    BadBody { message: String, param: Option<String>, code: &'static str },
    /// The encoder refused the request's options (validation checks them first, so this is a
    /// fallback); an encoder library failure is `Internal` instead.
    #[error("{0}")]
    Format(AudioError),
    #[error("Invalid or missing API key: send `Authorization: Bearer <key>`")]
    Unauthorized,
    #[error("No route for {method} {path}")]
    NoRoute { method: String, path: String },
    #[error("{path} does not take {method}")]
    WrongMethod { method: String, path: String },
    #[error("The request body is larger than this server's limit of {limit} bytes")]
    BodyTooLarge { limit: usize },
    /// The body did not arrive within `--body-timeout` of the request's head (issue 16, finding 1).
    #[error("The request body did not arrive within {secs} s; send it whole and promptly")]
    BodyTimeout { secs: u64 },
    /// The request was not parsable HTTP/1.1, so hyper refused it before routing (its bare reply
    /// gets this body: `parse_errors.rs`).
    #[error("{}", unparsable_message(*status))]
    Unparsable { status: u16 },
    /// Past `--max-connections` (written by the accept loop, `server.rs`, before closing).
    #[error("This server has {limit} connections open, its limit; retry shortly")]
    TooManyConnections { limit: usize },
    /// A compressed body: it would be read as garbage (issue 16, finding 10).
    #[error("Content-Encoding {encoding:?} is not supported: send the body uncompressed")]
    UnsupportedEncoding { encoding: String },
    /// The prompt builder refused a field (validation checks the text first; references are
    /// the builder's own to check).
    #[error("{0}")]
    Prompt(PromptError),
    #[error(transparent)]
    Submit(#[from] SubmitError),
    /// The job was stopped by the server (drain deadline) before its audio was complete.
    #[error("The server stopped this request while shutting down; retry it")]
    Cancelled,
    /// A voice upload's field broke a rule (400 naming it).
    #[error("{message}")]
    VoiceField { param: &'static str, message: String },
    #[error("No voice named `{name}`")]
    VoiceNotFound { name: String },
    #[error("A voice named `{name}` already exists; delete it first to replace it")]
    VoiceExists { name: String },
    #[error("This server already holds {max} voices; delete one first")]
    VoicesFull { max: usize },
    #[error("Voice cloning is unavailable on this server: its engine has no codec encoder (see its start-up log)")]
    NoEncoder,
    /// The engine had no device memory for this request's stream when it joined the batch; the
    /// streams already running are unaffected, and a retry may find room.
    #[error("The server has no GPU memory free for this request now; retry shortly")]
    OutOfMemory,
    /// Something failed inside this request only; the detail went to the log under the id.
    #[error("The server failed on this request; quote request id {request_id} when reporting it")]
    Internal { request_id: String },
}

impl ApiError {
    /// The one mapping: status, OpenAI `type`, `param`, `code`, and `Retry-After` where a retry helps.
    fn parts(&self) -> (StatusCode, &'static str, Option<String>, Option<&'static str>, Option<u64>) {
        const INVALID: &str = "invalid_request_error";
        const SERVER: &str = "server_error";
        match self {
            ApiError::Invalid(e @ ValidateError::ModelNotFound { .. }) => {
                (StatusCode::NOT_FOUND, INVALID, Some(e.param().to_owned()), Some(e.code()), None)
            }
            ApiError::Invalid(e) => {
                (StatusCode::BAD_REQUEST, INVALID, Some(e.param().to_owned()), Some(e.code()), None)
            }
            ApiError::BadBody { param, code, .. } => {
                (StatusCode::BAD_REQUEST, INVALID, param.clone(), Some(code), None)
            }
            ApiError::Format(e) => {
                (StatusCode::BAD_REQUEST, INVALID, e.param().map(str::to_owned), Some("invalid_value"), None)
            }
            ApiError::Prompt(e) => {
                (StatusCode::BAD_REQUEST, INVALID, e.field().map(|f| f.to_string()), Some("invalid_value"), None)
            }
            ApiError::Unauthorized => (StatusCode::UNAUTHORIZED, INVALID, None, Some("invalid_api_key"), None),
            ApiError::NoRoute { .. } => (StatusCode::NOT_FOUND, INVALID, None, Some("unknown_url"), None),
            ApiError::WrongMethod { .. } => {
                (StatusCode::METHOD_NOT_ALLOWED, INVALID, None, Some("method_not_allowed"), None)
            }
            ApiError::BodyTooLarge { .. } => {
                (StatusCode::PAYLOAD_TOO_LARGE, INVALID, None, Some("request_too_large"), None)
            }
            ApiError::BodyTimeout { .. } => (StatusCode::REQUEST_TIMEOUT, INVALID, None, Some("request_timeout"), None),
            ApiError::Unparsable { status } => {
                let code = match status {
                    431 => "request_header_fields_too_large",
                    414 => "uri_too_long",
                    _ => "malformed_request",
                };
                let status = StatusCode::from_u16(*status).unwrap_or(StatusCode::BAD_REQUEST);
                (status, INVALID, None, Some(code), None)
            }
            ApiError::TooManyConnections { .. } => {
                (StatusCode::SERVICE_UNAVAILABLE, SERVER, None, Some("too_many_connections"), Some(1))
            }
            ApiError::UnsupportedEncoding { .. } => {
                (StatusCode::UNSUPPORTED_MEDIA_TYPE, INVALID, None, Some("unsupported_content_encoding"), None)
            }
            ApiError::Submit(SubmitError::QueueFull { retry_after_secs, .. }) => {
                (StatusCode::TOO_MANY_REQUESTS, "rate_limit_error", None, Some("queue_full"), Some(*retry_after_secs))
            }
            ApiError::Submit(SubmitError::Loading) => {
                (StatusCode::SERVICE_UNAVAILABLE, SERVER, None, Some("model_loading"), Some(LOADING_RETRY_AFTER_SECS))
            }
            ApiError::Submit(SubmitError::Draining) | ApiError::Cancelled => {
                (StatusCode::SERVICE_UNAVAILABLE, SERVER, None, Some("shutting_down"), Some(DRAINING_RETRY_AFTER_SECS))
            }
            ApiError::VoiceField { param, .. } => {
                (StatusCode::BAD_REQUEST, INVALID, Some((*param).to_owned()), Some("invalid_value"), None)
            }
            ApiError::VoiceNotFound { .. } => (StatusCode::NOT_FOUND, INVALID, None, Some("voice_not_found"), None),
            ApiError::VoiceExists { .. } => {
                (StatusCode::CONFLICT, INVALID, Some(String::from("name")), Some("voice_exists"), None)
            }
            ApiError::VoicesFull { .. } => (StatusCode::CONFLICT, INVALID, None, Some("voice_limit_reached"), None),
            ApiError::NoEncoder => {
                (StatusCode::SERVICE_UNAVAILABLE, SERVER, None, Some("voice_cloning_unavailable"), None)
            }
            ApiError::OutOfMemory => (
                StatusCode::SERVICE_UNAVAILABLE,
                SERVER,
                None,
                Some("insufficient_memory"),
                Some(OUT_OF_MEMORY_RETRY_AFTER_SECS),
            ),
            ApiError::Internal { .. } => {
                (StatusCode::INTERNAL_SERVER_ERROR, SERVER, None, Some("internal_error"), None)
            }
        }
    }

    pub fn status(&self) -> StatusCode {
        self.parts().0
    }

    /// The OpenAI error body for this error.
    pub fn body(&self) -> ErrorBody {
        let (_, kind, param, code, _) = self.parts();
        ErrorBody {
            error: ErrorDetail {
                message: self.to_string(),
                kind: kind.to_owned(),
                param,
                code: code.map(str::to_owned),
            },
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, _, _, _, retry_after) = self.parts();
        let json = serde_json::to_vec(&self.body()).expect("an error body always serialises");
        let mut response = Response::new(Body::from(json));
        *response.status_mut() = status;
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if let Some(secs) = retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

/// What an [`ApiError::Unparsable`] says, by the status hyper chose.
fn unparsable_message(status: u16) -> &'static str {
    match status {
        431 => "The request's headers are larger than this server accepts",
        414 => "The request's URI is longer than this server accepts",
        _ => {
            "The request is not valid HTTP/1.1 (its request line, a header, or its Content-Length or \
             Transfer-Encoding framing)"
        }
    }
}

/// A JSON body parsed with our refusals: the body limit (413), `Content-Type` (400 unless it is
/// JSON or absent), syntax and schema errors (400 naming the field where there is one).
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned> FromRequest<AppState> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
        let limit = state.config().max_body_bytes;
        check_content_type(req.headers().get(header::CONTENT_TYPE))?;
        check_content_encoding(req.headers())?;
        // A declared length over the limit is refused before reading a byte of it.
        let declared = req.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        if declared.is_some_and(|n| n > limit as u64) {
            return Err(ApiError::BodyTooLarge { limit });
        }
        let bytes = axum::body::to_bytes(req.into_body(), limit).await.map_err(|e| read_error(e, limit))?;
        parse_json(&bytes).map(ApiJson)
    }
}

/// A JSON object → `T`, with serde's complaint turned into an OpenAI error naming the field.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    // Every body of this API is an object; serde would otherwise read `[…]` as a struct's fields
    // in order and name them `[0]`, `[1]`.
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(ApiError::BadBody {
            message: String::from("The request body must be a JSON object"),
            param: None,
            code: "invalid_json",
        });
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut de).map_err(serde_refusal)?;
    // Trailing data after the object is malformed JSON too.
    de.end().map_err(malformed)?;
    Ok(value)
}

fn malformed(e: serde_json::Error) -> ApiError {
    ApiError::BadBody { message: format!("Malformed JSON body: {e}"), param: None, code: "invalid_json" }
}

fn serde_refusal(e: serde_path_to_error::Error<serde_json::Error>) -> ApiError {
    let path = e.path().to_string();
    let inner = e.into_inner();
    if !inner.is_data() {
        return malformed(inner);
    }
    let message = inner.to_string();
    if let Some(field) = duplicate_field(&message) {
        return ApiError::BadBody {
            message: format!("Duplicate parameter `{field}`: give each field once"),
            param: Some(field),
            code: "invalid_value",
        };
    }
    if let Some(field) = unknown_field(&message) {
        // serde_path_to_error's path ends in the unknown key when serde tracked it, but not for a
        // top-level complaint or one raised by a hand-written visitor (`voice`).
        let param = match path.as_str() {
            "." => field,
            p if p == field || p.ends_with(&format!(".{field}")) => path,
            _ => format!("{path}.{field}"),
        };
        return ApiError::BadBody {
            message: format!("Unknown parameter `{param}`: this server refuses fields it would otherwise ignore"),
            param: Some(param),
            code: "unknown_parameter",
        };
    }
    let param = (path != ".").then_some(path);
    let message = match &param {
        Some(p) => format!("Invalid value for `{p}`: {message}"),
        None => format!("Invalid request body: {message}"),
    };
    ApiError::BadBody { message, param, code: "invalid_value" }
}

/// serde's "duplicate field `x`" → `x` (finding 7: it was a 400 with `param: null`).
fn duplicate_field(message: &str) -> Option<String> {
    let rest = message.strip_prefix("duplicate field `")?;
    Some(rest[..rest.find('`')?].to_owned())
}

/// serde's "unknown field `x`, expected …" → `x`.
fn unknown_field(message: &str) -> Option<String> {
    let rest = message.strip_prefix("unknown field `")?;
    Some(rest[..rest.find('`')?].to_owned())
}

fn check_content_type(value: Option<&HeaderValue>) -> Result<(), ApiError> {
    // No Content-Type is taken as JSON (curl users forget it); anything else must say JSON.
    let Some(value) = value else { return Ok(()) };
    let essence = value.to_str().unwrap_or("").split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    if essence == "application/json" || (essence.starts_with("application/") && essence.ends_with("+json")) {
        return Ok(());
    }
    Err(ApiError::BadBody {
        message: format!("Content-Type must be application/json; got {:?}", value.to_str().unwrap_or("<binary>")),
        param: None,
        code: "invalid_content_type",
    })
}

/// Refuses a body with a `Content-Encoding` other than `identity` (this server decompresses
/// nothing; before this check a gzip body was read as malformed JSON or, worse, as audio).
pub fn check_content_encoding(headers: &axum::http::HeaderMap) -> Result<(), ApiError> {
    for value in headers.get_all(header::CONTENT_ENCODING) {
        let text = value.to_str().unwrap_or("<binary>");
        if text.split(',').map(str::trim).any(|e| !e.is_empty() && !e.eq_ignore_ascii_case("identity")) {
            return Err(ApiError::UnsupportedEncoding { encoding: text.chars().take(64).collect() });
        }
    }
    Ok(())
}

/// A body read failed: over the limit (chunked bodies give no length up front), past its
/// deadline, or broken.
pub fn read_error(e: axum::Error, limit: usize) -> ApiError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&e);
    while let Some(s) = source {
        if s.is::<http_body_util::LengthLimitError>() {
            return ApiError::BodyTooLarge { limit };
        }
        if let Some(late) = s.downcast_ref::<super::deadline::BodyTimedOut>() {
            return ApiError::BodyTimeout { secs: late.0.as_secs() };
        }
        source = s.source();
    }
    ApiError::BadBody { message: format!("Could not read the request body: {e}"), param: None, code: "invalid_body" }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::speech::SpeechRequest;

    fn bad(json: &str) -> (Option<String>, &'static str, String) {
        match parse_json::<SpeechRequest>(json.as_bytes()) {
            Err(ApiError::BadBody { param, code, message }) => (param, code, message),
            other => panic!("{json}: {other:?}"),
        }
    }

    #[test]
    fn serde_refusals_name_the_field() {
        assert_eq!(bad(r#"{"model": "m", "bogus": 1}"#).0.as_deref(), Some("bogus"));
        assert_eq!(bad(r#"{"model": "m", "bogus": 1}"#).1, "unknown_parameter");
        assert_eq!(bad(r#"{"voice": {"id": "a", "x": 1}}"#).0.as_deref(), Some("voice.x"));
        let (param, code, message) = bad(r#"{"speed": "fast"}"#);
        assert_eq!((param.as_deref(), code), (Some("speed"), "invalid_value"));
        assert!(message.contains("`speed`"), "{message}");
        assert_eq!(bad(r#"{"response_format": "ogg"}"#).0.as_deref(), Some("response_format"));
        assert_eq!(bad(r#"{"top_k": -1}"#).0.as_deref(), Some("top_k"));
        assert_eq!(bad(r#"{"model": "#).1, "invalid_json");
        assert_eq!(bad(r#"{} {}"#).1, "invalid_json");
        assert_eq!(bad(r#"[1]"#).0, None);
        let (param, code, message) = bad(r#"{"model": "m", "input": "a", "input": "b"}"#);
        assert_eq!((param.as_deref(), code), (Some("input"), "invalid_value"), "{message}");
        assert_eq!(bad(" ").1, "invalid_json");
    }

    #[test]
    fn content_types() {
        assert!(check_content_type(None).is_ok());
        assert!(check_content_type(Some(&HeaderValue::from_static("application/json; charset=utf-8"))).is_ok());
        assert!(check_content_type(Some(&HeaderValue::from_static("text/plain"))).is_err());
        assert!(check_content_type(Some(&HeaderValue::from_static("application/x-www-form-urlencoded"))).is_err());
    }

    #[test]
    fn statuses_and_retry_hints() {
        let queue_full = ApiError::Submit(SubmitError::QueueFull { retry_after_secs: 3, max_queue: 0 });
        let response = queue_full.into_response();
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(response.headers()[header::RETRY_AFTER], "3");
        let internal = ApiError::Internal { request_id: "req_1".into() };
        assert_eq!(internal.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert!(internal.body().error.message.contains("req_1"));
        let missing = ApiError::Invalid(ValidateError::ModelNotFound { model: "x".into(), served: "drama-3".into() });
        assert_eq!(
            (missing.status(), missing.body().error.code.as_deref()),
            (StatusCode::NOT_FOUND, Some("model_not_found"))
        );
    }

    #[test]
    fn a_refused_prompt_names_its_field() {
        use crate::request::{Field, TextError};
        let refused = ApiError::Prompt(PromptError::Text(TextError::Empty { field: Field::Reference(1) }));
        let body = refused.body().error;
        assert_eq!(refused.status(), StatusCode::BAD_REQUEST);
        assert_eq!((body.param.as_deref(), body.kind.as_str()), (Some("references.1"), "invalid_request_error"));
        assert!(body.message.contains("references.1"), "{}", body.message);
    }
}
