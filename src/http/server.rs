//! The HTTP/1.1 accept loop, with the limits `axum::serve` lacks (issue 16, finding 1): at most
//! `max_connections` open connections, and a deadline on reading each request's head.
//!
//! - **Connections past the cap** get a short `503` in OpenAI's error shape (`code`
//!   `too_many_connections`, `Retry-After`) and are closed at once, without reading the request.
//!   So idle sockets cannot exhaust the process's descriptors, and `/health` and speech keep
//!   answering once a connection frees.
//! - **The head deadline** (`header_timeout`) runs from the moment the connection waits for a
//!   request's head, so it cuts off both slowloris heads, which trickle a byte at a time, and
//!   keep-alive connections left idle between requests. Such a connection is closed.
//! - **Bodies** have their own deadline, per request: [`super::deadline`].
//! - **Writes** that take no byte for `write_timeout` (a client that stopped reading) close the
//!   connection: [`super::write_deadline`].
//! - **Unparsable requests**, which hyper answers itself, get OpenAI error bodies:
//!   [`super::parse_errors`].
//!
//! Shutdown: once `stop` resolves, no connection is accepted. Every open connection finishes its
//! request in flight and closes, as with `axum::serve`'s graceful shutdown, and [`run`] returns
//! when the last one has.

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tracing::{debug, warn};

use super::error::ApiError;
use super::parse_errors::OpenAiParseErrors;
use super::write_deadline::WriteDeadline;

/// What the accept loop enforces.
#[derive(Clone, Copy, Debug)]
pub struct ServerLimits {
    /// `--max-connections`: open connections at most; more are refused with a 503.
    pub max_connections: usize,
    /// `--header-timeout`: a request's head must arrive within this, and an idle keep-alive
    /// connection is closed after it.
    pub header_timeout: Duration,
    /// `--write-timeout`: a connection whose client takes no reply bytes for this is closed.
    pub write_timeout: Duration,
}

/// `Retry-After` of the refusal past the connection cap: connections come and go quickly.
const CAP_RETRY_AFTER_SECS: u64 = 1;
/// How long a refused connection may take to accept its 503.
const REFUSAL_WRITE_TIMEOUT: Duration = Duration::from_secs(2);
/// The pause after an accept error that is not one connection's (descriptors exhausted, say),
/// so the loop does not spin on it.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

/// Serves `app` on `listener` until `stop` resolves and the open connections have closed.
pub async fn run(
    listener: TcpListener,
    app: Router,
    limits: ServerLimits,
    stop: impl Future<Output = ()> + Send,
) -> io::Result<()> {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    // Connections watch `closing`; it changes once, when the server stops.
    let (closing_tx, closing_rx) = watch::channel(false);
    tokio::pin!(stop);
    loop {
        let tcp = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => tcp,
                Err(e) => {
                    accept_failed(&e).await;
                    continue;
                }
            },
            () = &mut stop => break,
        };
        // Small PCM chunks must leave at once, not wait for Nagle.
        let _ = tcp.set_nodelay(true);
        match slots.clone().try_acquire_owned() {
            Ok(slot) => {
                tokio::spawn(serve_connection(tcp, app.clone(), limits, closing_rx.clone(), slot));
            }
            Err(_) => {
                metrics::counter!(crate::telemetry::CONNECTIONS_REFUSED_TOTAL).increment(1);
                tokio::spawn(refuse(tcp, limits.max_connections));
            }
        }
    }
    drop(listener);
    let _ = closing_tx.send(true);
    // Every connection holds a slot until it ends.
    let every = u32::try_from(limits.max_connections).expect("--max-connections is bounded by the config");
    let _all = slots.acquire_many(every).await;
    Ok(())
}

/// One connection, until it ends or (after the server stops) its request in flight is done.
async fn serve_connection(
    tcp: TcpStream,
    app: Router,
    limits: ServerLimits,
    mut closing: watch::Receiver<bool>,
    _slot: OwnedSemaphorePermit,
) {
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(limits.header_timeout).keep_alive(true);
    let io = TokioIo::new(OpenAiParseErrors::new(WriteDeadline::new(tcp, limits.write_timeout)));
    let conn = builder.serve_connection(io, TowerToHyperService::new(app));
    tokio::pin!(conn);
    let mut stopping = false;
    loop {
        tokio::select! {
            result = conn.as_mut() => {
                if let Err(e) = result {
                    debug!(error = %e, "connection ended with an error");
                }
                return;
            }
            changed = closing.changed(), if !stopping => {
                if changed.is_err() || *closing.borrow() {
                    stopping = true;
                    conn.as_mut().graceful_shutdown();
                }
            }
        }
    }
}

/// The 503 a connection past the cap gets, before it is closed.
async fn refuse(mut tcp: TcpStream, cap: usize) {
    let error = ApiError::TooManyConnections { limit: cap };
    let body = serde_json::to_vec(&error.body()).expect("an error body always serialises");
    let head = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: \
         {CAP_RETRY_AFTER_SECS}\r\nconnection: close\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    let write = async {
        tcp.write_all(head.as_bytes()).await?;
        tcp.write_all(&body).await?;
        tcp.shutdown().await
    };
    let _ = tokio::time::timeout(REFUSAL_WRITE_TIMEOUT, write).await;
}

/// An accept error: one connection's (reset before it was accepted) is skipped; any other
/// (descriptors exhausted) is logged and waited out briefly.
async fn accept_failed(e: &io::Error) {
    use io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    if matches!(e.kind(), ConnectionAborted | ConnectionRefused | ConnectionReset) {
        return;
    }
    warn!(error = %e, "accepting a connection failed");
    tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
}
