//! Hostile clients against the real accept loop (`http::server::run`) and router, over TCP
//! (issue 16, finding 1): a head that trickles in, an idle keep-alive connection, a body shorter
//! than its `Content-Length`, more connections than `--max-connections`, and a client that never
//! reads its reply. Each must end in a stated way (the connection closed, or a 4xx/503 in
//! OpenAI's shape) and free what it held.

mod common;
#[path = "http_contract/fixtures.rs"]
#[allow(dead_code)]
mod fixtures;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

use limelight::http::server::{ServerLimits, run};
use limelight::http::{AppState, HttpConfig, router};
use limelight::request::validate::SpeechPolicy;

/// The deadlines under test: short, so the tests are quick; the slack absorbs a loaded machine.
const HEADER_TIMEOUT: Duration = Duration::from_secs(1);
const BODY_TIMEOUT: Duration = Duration::from_secs(1);
const WRITE_TIMEOUT: Duration = Duration::from_secs(1);
const SLACK: Duration = Duration::from_secs(5);

/// A server on a free port with the given connection cap; dropping the sender stops it.
async fn start(max_connections: usize) -> (SocketAddr, oneshot::Sender<()>) {
    let scheduler = fixtures::shared_scheduler().await;
    let config = HttpConfig {
        policy: SpeechPolicy {
            served_model: fixtures::MODEL.into(),
            aliases: Vec::new(),
            max_input_chars: 200,
            max_frames: fixtures::MAX_FRAMES,
        },
        api_keys: Vec::new(),
        max_body_bytes: fixtures::MAX_BODY,
        voice_aliases: Default::default(),
        max_voice_upload_bytes: limelight::http::DEFAULT_MAX_VOICE_UPLOAD_BYTES,
        body_timeout: BODY_TIMEOUT,
        clip_decoder: limelight::voice::isolated::ClipDecoder::new(env!("CARGO_BIN_EXE_limelight"), 2048),
        clip_decoders: 2,
    };
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let limits = ServerLimits { max_connections, header_timeout: HEADER_TIMEOUT, write_timeout: WRITE_TIMEOUT };
    tokio::spawn(run(listener, router(AppState::new(scheduler, config)), limits, async move {
        let _ = stop_rx.await;
    }));
    (addr, stop_tx)
}

/// Everything the server sends until it closes the connection (or `SLACK` passes: then panics).
async fn read_to_close(tcp: &mut TcpStream) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout(SLACK, tcp.read(&mut buf)).await.expect("the server closes the connection") {
            Ok(0) | Err(_) => return out,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    }
}

/// The status and JSON error body of a raw HTTP/1.1 response.
fn status_and_error(raw: &[u8]) -> (u16, Value) {
    let text = String::from_utf8_lossy(raw);
    let status = text.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("a response: {text:?}"));
    let body = text.split("\r\n\r\n").nth(1).unwrap_or_default();
    (status, serde_json::from_str::<Value>(body).map(|v| v["error"].clone()).unwrap_or(Value::Null))
}

async fn health(addr: SocketAddr) -> u16 {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await.unwrap();
    status_and_error(&read_to_close(&mut tcp).await).0
}

#[tokio::test]
async fn a_trickling_head_is_cut_off_at_the_header_timeout() {
    let (addr, _stop) = start(16).await;
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    let began = Instant::now();
    tcp.write_all(b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\n").await.unwrap();
    // A header line every 200 ms: the connection is never idle, yet the head never ends.
    let trickle = async {
        for i in 0.. {
            tokio::time::sleep(Duration::from_millis(200)).await;
            if tcp.write_all(format!("X-Slow-{i}: y\r\n").as_bytes()).await.is_err() {
                return;
            }
        }
    };
    tokio::time::timeout(SLACK, trickle).await.expect("the server stops taking the head");
    let held = began.elapsed();
    assert!(held >= HEADER_TIMEOUT && held < HEADER_TIMEOUT + SLACK, "held {held:?}");
    assert_eq!(health(addr).await, 200, "the server still answers");
}

#[tokio::test]
async fn an_idle_keep_alive_connection_is_closed_after_the_header_timeout() {
    let (addr, _stop) = start(16).await;
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    let began = Instant::now();
    let raw = read_to_close(&mut tcp).await;
    let held = began.elapsed();
    assert!(String::from_utf8_lossy(&raw).starts_with("HTTP/1.1 200"), "{raw:?}");
    assert!(held >= HEADER_TIMEOUT && held < HEADER_TIMEOUT + SLACK, "held {held:?}");
}

#[tokio::test]
async fn a_body_shorter_than_its_length_is_refused_with_408() {
    let (addr, _stop) = start(16).await;
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    let head = "POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
                Content-Length: 100\r\n\r\n{\"model\":";
    tcp.write_all(head.as_bytes()).await.unwrap();
    let began = Instant::now();
    let (status, error) = status_and_error(&read_to_close(&mut tcp).await);
    let held = began.elapsed();
    assert_eq!((status, error["code"].as_str()), (408, Some("request_timeout")), "{error}");
    assert_eq!(error["type"], "invalid_request_error");
    assert!(held >= BODY_TIMEOUT && held < BODY_TIMEOUT + SLACK, "held {held:?}");
}

#[tokio::test]
async fn connections_past_the_cap_get_503_and_a_freed_slot_serves_again() {
    let cap = 3;
    let (addr, _stop) = start(cap).await;
    let mut idle = Vec::new();
    for _ in 0..cap {
        idle.push(TcpStream::connect(addr).await.unwrap());
    }
    // The accept loop takes connections in order; let it take the idle ones first.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut extra = TcpStream::connect(addr).await.unwrap();
    let raw = read_to_close(&mut extra).await;
    let (status, error) = status_and_error(&raw);
    assert_eq!((status, error["code"].as_str()), (503, Some("too_many_connections")), "{error}");
    assert!(String::from_utf8_lossy(&raw).to_ascii_lowercase().contains("retry-after: 1"), "{raw:?}");

    drop(idle.pop());
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(health(addr).await, 200, "a freed slot serves again");
}

#[tokio::test]
async fn stopping_answers_the_request_sent_closes_the_connection_and_the_listener() {
    let (addr, stop) = start(16).await;
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    stop.send(()).unwrap();
    let raw = read_to_close(&mut tcp).await;
    assert!(String::from_utf8_lossy(&raw).starts_with("HTTP/1.1 200"), "{raw:?}");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(TcpStream::connect(addr).await.is_err(), "the listener is closed");
}

/// What the server answers to `raw`, sent whole on a fresh connection.
async fn answer(addr: SocketAddr, raw: &[u8]) -> (u16, Value) {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(raw).await.unwrap();
    status_and_error(&read_to_close(&mut tcp).await)
}

/// Issue 16, finding 7: requests hyper refuses before routing answer in OpenAI's shape too.
#[tokio::test]
async fn unparsable_requests_get_openai_error_bodies() {
    let (addr, _stop) = start(16).await;
    let long_uri = format!("GET /{} HTTP/1.1\r\nHost: x\r\n\r\n", "a".repeat(70_000));
    let big_headers = format!("GET /health HTTP/1.1\r\nHost: x\r\n{}\r\n", "X-Big: y\r\n".repeat(200));
    let cases: [(&str, &[u8], u16, &str); 8] = [
        (
            "Transfer-Encoding: identity",
            b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: identity\r\n\r\n{}",
            400,
            "malformed_request",
        ),
        ("a folded header", b"GET /health HTTP/1.1\r\nHost: x\r\nX-A: a\r\n b\r\n\r\n", 400, "malformed_request"),
        (
            "two Content-Lengths",
            b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n{}x",
            400,
            "malformed_request",
        ),
        (
            "a bad Content-Length",
            b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Length: ten\r\n\r\n",
            400,
            "malformed_request",
        ),
        ("a NUL in a header", b"GET /health HTTP/1.1\r\nHost: x\r\nX-A: a\0b\r\n\r\n", 400, "malformed_request"),
        ("an HTTP/2.0 request line", b"GET /health HTTP/2.0\r\nHost: x\r\n\r\n", 400, "malformed_request"),
        ("too many headers", big_headers.as_bytes(), 431, "request_header_fields_too_large"),
        ("a URI over the limit", long_uri.as_bytes(), 414, "uri_too_long"),
    ];
    for (what, raw, status, code) in cases {
        let (got, error) = answer(addr, raw).await;
        assert_eq!((got, error["code"].as_str()), (status, Some(code)), "{what}: {error}");
        assert_eq!(error["type"], "invalid_request_error", "{what}");
        assert!(error["message"].as_str().is_some_and(|m| !m.is_empty()), "{what}: {error}");
    }
    assert_eq!(health(addr).await, 200, "the server still answers");
}

/// Pipelining: requests sent back to back on one connection are answered in order.
#[tokio::test]
async fn pipelined_requests_are_answered_in_order() {
    let (addr, _stop) = start(16).await;
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    let pipelined = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\nGET /nowhere HTTP/1.1\r\nHost: x\r\n\r\n\
                      GET /ready HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    tcp.write_all(pipelined).await.unwrap();
    let raw = String::from_utf8_lossy(&read_to_close(&mut tcp).await).into_owned();
    let statuses: Vec<&str> = raw.match_indices("HTTP/1.1 ").map(|(i, _)| &raw[i + 9..i + 12]).collect();
    assert_eq!(statuses, ["200", "404", "200"], "{raw}");
    assert!(raw.contains("\"code\":\"unknown_url\""), "the 404 in OpenAI's shape: {raw}");
}

/// A body that never ends (64 KiB chunks as fast as they are taken), and a flag its drop raises:
/// the response body dropped is what cancels a speech job.
fn endless_body(dropped: Arc<AtomicBool>) -> axum::body::Body {
    struct Raise(Arc<AtomicBool>);
    impl Drop for Raise {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
    let raise = Raise(dropped);
    let chunks = futures_util::stream::repeat_with(move || {
        let _held = &raise;
        Ok::<_, std::io::Error>(bytes::Bytes::from(vec![0u8; 64 * 1024]))
    });
    axum::body::Body::from_stream(chunks)
}

/// A server whose `/endless` route streams [`endless_body`]; returns the flag and the task.
async fn start_endless(
    max_connections: usize,
) -> (SocketAddr, oneshot::Sender<()>, Arc<AtomicBool>, tokio::task::JoinHandle<std::io::Result<()>>) {
    let dropped = Arc::new(AtomicBool::new(false));
    let flag = dropped.clone();
    let app = axum::Router::new().route(
        "/endless",
        axum::routing::get(move || {
            let flag = flag.clone();
            async move { endless_body(flag) }
        }),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let limits = ServerLimits { max_connections, header_timeout: HEADER_TIMEOUT, write_timeout: WRITE_TIMEOUT };
    let server = tokio::spawn(run(listener, app, limits, async move {
        let _ = stop_rx.await;
    }));
    (addr, stop_tx, dropped, server)
}

/// A client that sends its request and never reads a byte of the reply: once the socket's
/// buffers are full, the write deadline closes the connection, which drops the response body
/// (for speech: cancels the job) and frees the connection's slot for the next client.
#[tokio::test]
async fn a_client_that_never_reads_is_cut_off_at_the_write_timeout() {
    let (addr, _stop, dropped, _server) = start_endless(1).await;
    let mut never_reads = TcpStream::connect(addr).await.unwrap();
    never_reads.write_all(b"GET /endless HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    let began = Instant::now();
    while !dropped.load(Ordering::SeqCst) {
        assert!(began.elapsed() < WRITE_TIMEOUT + SLACK, "the body is still held after {:?}", began.elapsed());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(began.elapsed() >= WRITE_TIMEOUT, "cut off after {:?}, before the timeout", began.elapsed());
    // The cap is one connection: the next client is served, so the slot was freed.
    let mut next = TcpStream::connect(addr).await.unwrap();
    next.write_all(b"GET /nowhere HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await.unwrap();
    let raw = read_to_close(&mut next).await;
    assert!(String::from_utf8_lossy(&raw).starts_with("HTTP/1.1 404"), "{}", String::from_utf8_lossy(&raw));
    drop(never_reads);
}

/// On shutdown the server waits for every connection's request in flight: one whose client
/// never reads ends at the write deadline, so the drain ends too.
#[tokio::test]
async fn a_client_that_never_reads_cannot_hold_the_shutdown() {
    let (addr, stop, dropped, server) = start_endless(16).await;
    let mut never_reads = TcpStream::connect(addr).await.unwrap();
    never_reads.write_all(b"GET /endless HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    stop.send(()).unwrap();
    let stopped = tokio::time::timeout(WRITE_TIMEOUT + SLACK, server).await;
    assert!(stopped.is_ok(), "the server stopped while the client still held its connection");
    assert!(dropped.load(Ordering::SeqCst));
    drop(never_reads);
}
