//! A deadline on reading each request's body (issue 16, finding 1): a body shorter than its
//! `Content-Length`, or one that trickles in, was held forever. Every request's body is wrapped
//! in [`TimedBody`], which fails a read still pending `--body-timeout` after the request's head
//! arrived; the read then turns into a `408` in OpenAI's shape ([`super::error::read_error`]).
//! Heads have their own deadline in the accept loop ([`super::server`]).

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use bytes::Bytes;
use http_body::{Frame, SizeHint};
use tokio::time::Sleep;

use super::AppState;

/// A body read still pending at its deadline; the error [`TimedBody`] yields.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within {0:?}")]
pub struct BodyTimedOut(pub Duration);

/// Middleware: the request's body, under the server's `--body-timeout`.
pub async fn limit_body_time(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let timeout = state.config().body_timeout;
    next.run(req.map(|body| Body::new(TimedBody::new(body, timeout)))).await
}

/// A body whose frames must all arrive before a deadline.
pub struct TimedBody {
    inner: Body,
    deadline: Pin<Box<Sleep>>,
    timeout: Duration,
}

impl TimedBody {
    pub fn new(inner: Body, timeout: Duration) -> TimedBody {
        TimedBody { inner, deadline: Box::pin(tokio::time::sleep(timeout)), timeout }
    }
}

impl http_body::Body for TimedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Pending if this.deadline.as_mut().poll(cx).is_ready() => {
                Poll::Ready(Some(Err(axum::Error::new(BodyTimedOut(this.timeout)))))
            }
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
