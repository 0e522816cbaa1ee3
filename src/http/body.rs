//! A job's events → response bodies (`api.md`): chunked audio ending in an `X-Finish-Reason`
//! trailer, one whole body, or SSE `speech.audio.delta` / `speech.audio.done` events. Audio is
//! encoded as each chunk arrives and sent at once; dropping a body drops the job, which cancels it.

use std::convert::Infallible;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderName, HeaderValue, header};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use bytes::Bytes;
use futures_util::stream;
use http_body::Frame;
use http_body_util::StreamBody;

use super::ApiError;
use super::speech::Tracker;
use crate::api::speech::{SpeechEvent, Usage};
use crate::audio::Encoder;
use crate::engine::generate::FinishReason;
use crate::scheduler::{JobEvent, JobStream};

pub const FINISH_REASON: HeaderName = HeaderName::from_static("x-finish-reason");
/// `no` keeps nginx from buffering a stream, which would destroy time to first audio.
pub const ACCEL_BUFFERING: HeaderName = HeaderName::from_static("x-accel-buffering");
/// The rate of the encoded audio; for headerless `pcm` the only place a client can learn it.
pub const SAMPLE_RATE: HeaderName = HeaderName::from_static("x-sample-rate");

/// One admitted job on its way out: its events, its encoder and its log record.
pub struct Reply {
    job: JobStream,
    /// Taken by `finish`, which consumes the encoder.
    encoder: Option<Box<dyn Encoder>>,
    pub tracker: Tracker,
}

/// What the next event amounts to for the body.
pub enum Step {
    /// Encoded bytes, possibly none (an encoder may hold samples back).
    Bytes(Bytes),
    /// Generation ended; `tail` is the encoder's flush.
    End { reason: FinishReason, usage: Usage, tail: Bytes },
    /// The job or its encoding failed; the detail is logged, the client gets the request id.
    Failed,
    /// The engine could not take the job (device memory): a 503 with `Retry-After`. Comes only
    /// before any audio, so only [`Reply::head`] sees it.
    Refused,
}

/// The stream broke after its headers were sent: hyper then ends the response without the
/// chunked terminator, so the client sees a broken transfer, never audio that looks complete.
#[derive(Debug, thiserror::Error)]
#[error("speech stream {request_id} failed after it began")]
pub struct BrokenStream {
    request_id: String,
}

impl Reply {
    pub fn new(job: JobStream, encoder: Box<dyn Encoder>, tracker: Tracker) -> Reply {
        Reply { job, encoder: Some(encoder), tracker }
    }

    /// Steps up to the first audio bytes, the end, or a failure, before anything is sent, so
    /// that a failure here can still be an HTTP error.
    pub async fn head(&mut self) -> Step {
        loop {
            match self.step().await {
                Step::Bytes(b) if b.is_empty() => continue,
                step => return step,
            }
        }
    }

    /// The next event, encoded.
    async fn step(&mut self) -> Step {
        let Some(encoder) = self.encoder.as_mut() else { return Step::Failed };
        let event = self.job.next().await;
        let result = match event {
            Some(JobEvent::Started { .. }) => Ok(Step::Bytes(Bytes::new())),
            Some(JobEvent::Audio(pcm)) => {
                self.tracker.audio(pcm.len());
                encoder.push(&pcm).map(|b| Step::Bytes(b.into()))
            }
            Some(JobEvent::Finished { reason, frames, prompt_rows }) => {
                self.tracker.finished(reason, frames);
                let usage = Usage::new(prompt_rows as u64, frames as u64);
                let encoder = self.encoder.take().expect("checked above");
                encoder.finish().map(|tail| Step::End { reason, usage, tail: tail.into() })
            }
            Some(JobEvent::Failed { message }) => {
                self.tracker.failed(&message);
                return Step::Failed;
            }
            Some(JobEvent::Refused { message }) => {
                tracing::warn!(request_id = %self.tracker.request_id(), reason = %message, "speech request refused");
                return Step::Refused;
            }
            None => {
                // The worker drops a job without a last event only when it gives its client up.
                self.tracker.given_up();
                return Step::Failed;
            }
        };
        result.unwrap_or_else(|e| {
            self.tracker.failed(&e.to_string());
            Step::Failed
        })
    }

    fn broken(&self) -> BrokenStream {
        BrokenStream { request_id: self.tracker.request_id().to_owned() }
    }
}

/// `stream: false`: every byte in one body with `Content-Length`, the finish reason a header.
pub async fn whole(mut reply: Reply, content_type: &'static str, sample_rate: u32, head: Step) -> Response {
    let mut audio = Vec::new();
    let mut step = head;
    let reason = loop {
        match step {
            Step::Bytes(b) => audio.extend_from_slice(&b),
            Step::End { reason: FinishReason::Cancelled, .. } => return reply.tracker.refuse(ApiError::Cancelled),
            Step::End { reason, tail, .. } => {
                audio.extend_from_slice(&tail);
                break reason;
            }
            Step::Failed | Step::Refused => return reply.tracker.internal_error(),
        }
        step = reply.step().await;
    };
    let mut headers = audio_headers(content_type, sample_rate);
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(audio.len()));
    headers.insert(FINISH_REASON, HeaderValue::from_static(reason.as_str()));
    reply.tracker.sent(200);
    (headers, audio).into_response()
}

/// `stream: true`: chunked bytes as they are encoded, then the finish reason as a trailer
/// (declared up front; hyper sends it when the request carried `TE: trailers`).
pub fn chunked(reply: Reply, content_type: &'static str, sample_rate: u32, head: Step) -> Response {
    enum State {
        Pending(Reply, Step),
        Running(Reply),
        Trailers(HeaderMap),
        Done,
    }
    let frames = stream::unfold(State::Pending(reply, head), |state| async move {
        let (mut reply, mut step) = match state {
            State::Pending(reply, step) => (reply, step),
            State::Running(mut reply) => {
                let step = reply.step().await;
                (reply, step)
            }
            State::Trailers(map) => return Some((Ok(Frame::trailers(map)), State::Done)),
            State::Done => return None,
        };
        loop {
            match step {
                Step::Bytes(b) if b.is_empty() => step = reply.step().await,
                Step::Bytes(b) => return Some((Ok(Frame::data(b)), State::Running(reply))),
                Step::End { reason, tail, .. } if reason != FinishReason::Cancelled => {
                    let mut map = HeaderMap::new();
                    map.insert(FINISH_REASON, HeaderValue::from_static(reason.as_str()));
                    // The reply (and its log line) ends here; the last frames need nothing of it.
                    drop(reply);
                    return Some(if tail.is_empty() {
                        (Ok(Frame::trailers(map)), State::Done)
                    } else {
                        (Ok(Frame::data(tail)), State::Trailers(map))
                    });
                }
                Step::End { .. } | Step::Failed | Step::Refused => return Some((Err(reply.broken()), State::Done)),
            }
        }
    });
    let mut headers = audio_headers(content_type, sample_rate);
    headers.insert(header::TRAILER, HeaderValue::from_static("X-Finish-Reason"));
    (headers, Body::new(StreamBody::new(frames))).into_response()
}

/// `stream_format: sse`: one `speech.audio.delta` per chunk of encoded bytes, then
/// `speech.audio.done` with usage and the finish reason, or an `error` event if the job fails.
pub fn sse(reply: Reply, sample_rate: u32, head: Step) -> Response {
    let events = stream::unfold(Some((reply, head)), |state| async move {
        let (mut reply, mut step) = state?;
        loop {
            let event = match step {
                Step::Bytes(b) if b.is_empty() => {
                    step = reply.step().await;
                    continue;
                }
                Step::Bytes(b) => SpeechEvent::Delta { audio: base64::engine::general_purpose::STANDARD.encode(&b) },
                Step::End { reason: FinishReason::Cancelled, .. } => {
                    SpeechEvent::Error { error: ApiError::Cancelled.body().error }
                }
                Step::End { reason, usage, tail } if !tail.is_empty() => {
                    // Flush the tail as one more delta; `done` follows on the next poll.
                    let delta = SpeechEvent::Delta { audio: base64::engine::general_purpose::STANDARD.encode(&tail) };
                    let next = Step::End { reason, usage, tail: Bytes::new() };
                    return Some((Ok::<_, Infallible>(data_event(&delta)), Some((reply, next))));
                }
                Step::End { reason, usage, .. } => {
                    SpeechEvent::Done { usage, finish_reason: reason.as_str().to_owned() }
                }
                Step::Failed | Step::Refused => {
                    let request_id = reply.tracker.request_id().to_owned();
                    SpeechEvent::Error { error: ApiError::Internal { request_id }.body().error }
                }
            };
            let last = !matches!(event, SpeechEvent::Delta { .. });
            let next = if last { None } else { Some((reply, Step::Bytes(Bytes::new()))) };
            return Some((Ok(data_event(&event)), next));
        }
    });
    let mut response = Sse::new(events).into_response();
    response.headers_mut().insert(ACCEL_BUFFERING, HeaderValue::from_static("no"));
    // The deltas' audio rate, as `audio_headers` declares it for the other deliveries.
    response.headers_mut().insert(SAMPLE_RATE, HeaderValue::from(sample_rate));
    response
}

/// A `data:` line only, with no `event:` name: EventSource's `onmessage` and line splitters
/// both see every event, and the payload's `type` says which it is.
fn data_event(event: &SpeechEvent) -> Event {
    Event::default().data(serde_json::to_string(event).expect("events always serialise"))
}

fn audio_headers(content_type: &'static str, sample_rate: u32) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(SAMPLE_RATE, HeaderValue::from(sample_rate));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(ACCEL_BUFFERING, HeaderValue::from_static("no"));
    headers
}
