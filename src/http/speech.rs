//! `POST /v1/audio/speech`: extract → validate → build the encoder → submit → wait for the first
//! audio → respond (chunked, whole or SSE). Everything up to the first audio can still fail
//! with a proper status; after it, failure breaks the stream (`body.rs`).

use std::time::{Duration, Instant};

use axum::extract::State;
use axum::response::{IntoResponse, Response};

use super::body::{self, Reply, Step};
use super::{ApiError, ApiJson, AppState, RequestId, voices};
use crate::api::speech::{SpeechRequest, StreamFormat};
use crate::audio::{self, CODEC_SAMPLE_RATE, EncodeOptions};
use crate::engine::generate::{FinishReason, GenerateOptions};
use crate::request::chunked::{CHUNK_LIMITS, ChunkedText, chunk_texts, stall_guard};
use crate::request::prompt::PromptBuilder;
use crate::request::validate::{Delivery, quoted_name, validate};
use crate::scheduler::{Job, MoreChunks};
use crate::telemetry::{self, RequestLog};

/// Status logged for a request whose client left before any response was sent (nginx's code).
pub const CLIENT_CLOSED: u16 = 499;

/// The handler. A body the extractor refused is answered here too, so that it is logged.
pub async fn create_speech(
    State(state): State<AppState>,
    RequestId(request_id): RequestId,
    body: Result<ApiJson<SpeechRequest>, ApiError>,
) -> Response {
    let mut tracker = Tracker::new(request_id.clone());
    let req = match body {
        Ok(ApiJson(req)) => req,
        Err(e) => return tracker.refuse(e),
    };
    tracker.model = quoted_name(req.model.as_deref().unwrap_or_default());
    tracker.format = match req.stream_format {
        Some(StreamFormat::Sse) => "sse",
        _ => req.response_format.unwrap_or_default().name(),
    };
    let valid = match validate(req, &state.config().policy) {
        Ok(valid) => valid,
        Err(e) => return tracker.refuse(ApiError::Invalid(e)),
    };
    tracker.input_chars = valid.input_chars;

    let streaming = valid.delivery != Delivery::Whole;
    let options = EncodeOptions { sample_rate: Some(valid.sample_rate), speed: valid.speed, streaming };
    let encoder = match audio::encoder(valid.format, options) {
        Ok(encoder) => encoder,
        Err(e) if e.param().is_some() => return tracker.refuse(ApiError::Format(e)),
        Err(e) => {
            tracker.failed(&e.to_string());
            return tracker.internal_error();
        }
    };
    let (content_type, sample_rate) = (encoder.content_type(), encoder.sample_rate());

    // The prompt rows, built here so that the queue carries rows and a prompt the tokenizer
    // refuses is this request's 400 (or 500), before it waits for a slot.
    // A stored voice's prompt prefix is kept across requests; inline references run whole each
    // time (one-off clips would push saved voices out of the cache).
    let stored_voice = valid.references.is_empty();
    let references = if stored_voice {
        voices::references(&state, &valid.voice)
    } else {
        voices::encode_inline(&state, &request_id, &valid.references).await
    };
    let references = match references {
        Ok(references) => references,
        Err(e) => return tracker.refuse(e),
    };
    let voices = match voices::speaker_references(&state, &valid.speaker_voices, references) {
        Ok(voices) => voices,
        Err(e) => return tracker.refuse(e),
    };
    // Long text runs as chunks, one stream whose later prompts are built as each chunk ends.
    let texts = chunk_texts(&valid.text, CHUNK_LIMITS);
    let stall = stall_guard(texts.len());
    let (prompt, first_frames, more) = match state.scheduler().vocabulary() {
        Ok(vocabulary) => {
            let builder = PromptBuilder::new(vocabulary);
            // The whole text first: later chunks' prompts are built only as the stream runs.
            let started = (builder.check_text(&valid.text))
                .and_then(|()| ChunkedText::start(builder, voices, stored_voice, texts, valid.options.max_frames));
            match started {
                Ok(started) => started,
                Err(e) if e.field().is_some() => return tracker.refuse(ApiError::Prompt(e)),
                Err(e) => {
                    tracker.failed(&e.to_string());
                    return tracker.internal_error();
                }
            }
        }
        Err(e) => return tracker.refuse(ApiError::Submit(e)),
    };
    let span = tracing::info_span!("speech", request_id = %request_id);
    let prefix = prompt.voice_prefix(stored_voice);
    let more = more.map(|m| Box::new(m) as Box<dyn MoreChunks>);
    let options = GenerateOptions { max_frames: first_frames, stall, ..valid.options };
    span.in_scope(|| {
        let ms = tracker.start.elapsed().as_secs_f64() * 1e3;
        tracing::debug!(prompt_rows = prompt.rows.len(), ms, "prompt built");
    });
    let job = Job { request_id, rows: prompt.rows, prefix, options, span, more };
    let stream = match state.scheduler().submit(job) {
        Ok(stream) => stream,
        Err(e) => return tracker.refuse(ApiError::Submit(e)),
    };

    let mut reply = Reply::new(stream, encoder, tracker);
    let head = reply.head().await;
    match head {
        Step::Failed => return reply.tracker.internal_error(),
        Step::Refused => return reply.tracker.refuse(ApiError::OutOfMemory),
        Step::End { reason: FinishReason::Cancelled, .. } => return reply.tracker.refuse(ApiError::Cancelled),
        _ => {}
    }
    match valid.delivery {
        Delivery::Whole => body::whole(reply, content_type, sample_rate, head).await,
        Delivery::Streamed => {
            reply.tracker.sent(200);
            body::chunked(reply, content_type, sample_rate, head)
        }
        Delivery::Sse => {
            reply.tracker.sent(200);
            body::sse(reply, sample_rate, head)
        }
    }
}

/// What one request did; logged (one line + metrics) when it is dropped, which is when the
/// response body ends, fails, or is abandoned by the client.
pub struct Tracker {
    request_id: String,
    model: String,
    format: &'static str,
    status: u16,
    input_chars: usize,
    frames: usize,
    finish_reason: Option<&'static str>,
    /// The job failed (else a request that ends with no finish reason was left by its client).
    failed: bool,
    start: Instant,
    first_audio: Option<Duration>,
    samples: usize,
}

impl Tracker {
    fn new(request_id: String) -> Tracker {
        Tracker {
            request_id,
            model: String::from("-"),
            format: "-",
            status: CLIENT_CLOSED,
            input_chars: 0,
            frames: 0,
            finish_reason: None,
            failed: false,
            start: Instant::now(),
            first_audio: None,
            samples: 0,
        }
    }

    pub fn request_id(&self) -> &str {
        &self.request_id
    }

    /// The status the response went out with.
    pub fn sent(&mut self, status: u16) {
        self.status = status;
    }

    /// Codec samples (44.1 kHz) arrived.
    pub fn audio(&mut self, samples: usize) {
        self.first_audio.get_or_insert_with(|| self.start.elapsed());
        self.samples += samples;
    }

    pub fn finished(&mut self, reason: FinishReason, frames: usize) {
        self.finish_reason = Some(reason.as_str());
        self.frames = frames;
    }

    /// The job failed; the detail goes to the log only.
    pub fn failed(&mut self, message: &str) {
        tracing::error!(request_id = %self.request_id, error = message, "speech request failed");
        self.finish_reason = None;
        self.failed = true;
    }

    /// The worker gave the job up before its end: its client stopped reading for
    /// `--stall-timeout` (the client's doing, so a warning, and `cancelled`, not a failure).
    pub fn given_up(&mut self) {
        tracing::warn!(request_id = %self.request_id, "the worker gave the job up: its client stopped reading");
        self.finish_reason = Some(FinishReason::Cancelled.as_str());
    }

    /// Answers with `error`, recording its status (a refused request has no finish reason).
    pub fn refuse(&mut self, error: ApiError) -> Response {
        self.status = error.status().as_u16();
        self.failed = true;
        error.into_response()
    }

    /// A 500 naming the request id (the detail was logged by `failed`).
    pub fn internal_error(&mut self) -> Response {
        self.refuse(ApiError::Internal { request_id: self.request_id.clone() })
    }
}

impl Drop for Tracker {
    fn drop(&mut self) {
        telemetry::log_request(&RequestLog {
            request_id: &self.request_id,
            model: &self.model,
            format: self.format,
            status: self.status,
            input_chars: self.input_chars,
            frames: self.frames,
            // Neither finished, failed nor refused: the client left first (mid-stream, or while
            // its request waited).
            finish_reason: self.finish_reason.or((!self.failed).then_some(FinishReason::Cancelled.as_str())),
            time_to_first_audio: self.first_audio,
            elapsed: self.start.elapsed(),
            audio_seconds: self.samples as f64 / f64::from(CODEC_SAMPLE_RATE),
        });
    }
}
