//! Hostile events against the `serve` process itself (issue 16, "a hostile-client suite"), each
//! with its stated outcome:
//! - SIGKILL mid-stream: the client's stream is broken off (never a chunked end, so it cannot
//!   look complete), and a restarted server binds the same port at once and serves;
//! - a second server on a port in use: it exits non-zero at once, naming the address, and the
//!   first keeps serving;
//! - a client that leaves while its request waits in the queue: the request never runs (no
//!   frames), is logged `cancelled`, and the stream ahead of it is unharmed;
//! - a client that leaves during the drain: its job is cancelled and the drain ends without
//!   waiting for it, exit 0;
//! - a truncated voice file in `--voices-dir` (an injected fault): that voice is refused by its
//!   file's name in the log, and the server starts and serves.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

use serde_json::Value;

const LIMIT: Duration = Duration::from_secs(120);

/// A `limelight serve --demo` process, killed on drop, with its JSON log lines.
struct Serve {
    child: Child,
    addr: String,
    lines: Receiver<String>,
    log: Vec<Value>,
    _cache: tempfile::TempDir,
}

impl Serve {
    /// Starts a server on `port` with `args` and waits until it is ready.
    fn start(port: u16, args: &[&str]) -> Serve {
        let cache = tempfile::tempdir().unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_limelight"))
            .args(["serve", "--demo", "--port", &port.to_string(), "--log-format", "json"])
            .args(args)
            .env("XDG_CACHE_HOME", demo_cache())
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = channel::<String>();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let mut serve = Serve { child, addr: String::new(), lines, log: Vec::new(), _cache: cache };
        serve.addr = serve.wait_for("listening; loading the model")["addr"].as_str().unwrap().to_owned();
        serve.wait_for("ready");
        serve
    }

    /// The next log line whose message is `message` (earlier lines are kept in `log`).
    fn wait_for(&mut self, message: &str) -> Value {
        let deadline = Instant::now() + LIMIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self.lines.recv_timeout(left).unwrap_or_else(|_| panic!("no `{message}` line: {:#?}", self.log));
            let value: Value = serde_json::from_str(&line).expect("JSON log lines");
            self.log.push(value.clone());
            if value["message"] == message {
                return value;
            }
        }
    }

    /// Every log line until the process's output ends.
    fn rest_of_log(&mut self) -> &[Value] {
        while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(10)) {
            self.log.push(serde_json::from_str(&line).expect("JSON log lines"));
        }
        &self.log
    }

    fn signal(&self, signal: &str) {
        let pid = self.child.id().to_string();
        assert!(Command::new("kill").args([signal, &pid]).status().unwrap().success());
    }

    /// Sends a speech request for `frames` frames of streamed PCM; returns the connection with
    /// the response's status line read.
    fn speech(&self, frames: usize) -> TcpStream {
        let body = format!(
            r#"{{"model":"tts-1","input":"Hello there, how are you today?","response_format":"pcm","max_frames":{frames},"seed":3}}"#
        );
        let mut tcp = TcpStream::connect(&self.addr).unwrap();
        tcp.set_read_timeout(Some(LIMIT)).unwrap();
        let head = format!(
            "POST /v1/audio/speech HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nTE: trailers\r\n\
             Connection: close\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        tcp.write_all(head.as_bytes()).unwrap();
        tcp
    }

    fn get(&self, path: &str) -> String {
        let mut tcp = TcpStream::connect(&self.addr).unwrap();
        tcp.set_read_timeout(Some(LIMIT)).unwrap();
        tcp.write_all(format!("GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n").as_bytes()).unwrap();
        read_all(&mut tcp)
    }

    /// The request log lines (one per request).
    fn requests(&self) -> Vec<&Value> {
        self.log.iter().filter(|l| l["target"] == "limelight::request").collect()
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One demo checkpoint for every server of this file (written by the first start).
fn demo_cache() -> std::path::PathBuf {
    static CACHE: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
    CACHE.get_or_init(|| tempfile::tempdir().unwrap()).path().to_owned()
}

fn read_all(tcp: &mut TcpStream) -> String {
    let mut out = Vec::new();
    let _ = tcp.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// Reads until `needle` has arrived (the response so far).
fn read_until(tcp: &mut TcpStream, needle: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    while !out.windows(needle.len()).any(|w| w == needle) {
        let n = tcp.read(&mut buf).expect("the response arrives");
        assert!(n > 0, "the connection closed before {:?}", String::from_utf8_lossy(needle));
        out.extend_from_slice(&buf[..n]);
    }
    out
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[test]
fn sigkill_mid_stream_breaks_the_stream_and_a_restart_serves_on_the_same_port() {
    let port = free_port();
    let first = Serve::start(port, &[]);
    let mut stream = first.speech(2048);
    let head = read_until(&mut stream, b"\r\n\r\n");
    assert!(head.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&head));
    first.signal("-KILL");
    let rest = read_all(&mut stream);
    assert!(!rest.contains("\r\n0\r\n"), "a killed server's stream must not end like a complete one");
    drop(first);

    // The port is free for the restart at once, despite the killed server's connections.
    let second = Serve::start(port, &[]);
    assert!(second.get("/ready").starts_with("HTTP/1.1 200"));
    let mut stream = second.speech(8);
    let whole = read_all(&mut stream);
    assert!(whole.contains("\r\n0\r\nx-finish-reason: "), "the restart serves a whole stream");
}

#[test]
fn a_second_server_on_a_taken_port_exits_non_zero_and_the_first_serves_on() {
    let port = free_port();
    let first = Serve::start(port, &[]);
    let output = Command::new(env!("CARGO_BIN_EXE_limelight"))
        .args(["serve", "--demo", "--port", &port.to_string(), "--log-format", "json"])
        .env("XDG_CACHE_HOME", demo_cache())
        .output()
        .unwrap();
    assert!(!output.status.success(), "the second server exits with an error");
    let said = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(said.contains(&format!("127.0.0.1:{port}")), "names the address: {said}");
    assert_eq!(said.matches("Address already in use").count(), 1, "says why, once: {said}");
    assert!(first.get("/health").starts_with("HTTP/1.1 200"), "the first server serves on");
}

#[test]
fn a_client_gone_while_queued_never_runs_and_the_stream_ahead_is_unharmed() {
    let mut serve = Serve::start(0, &["--max-batch", "1"]);
    let mut ahead = serve.speech(400);
    let head = read_until(&mut ahead, b"\r\n\r\n");
    assert!(head.starts_with(b"HTTP/1.1 200"));
    // The batch's one slot is taken: this one waits in the queue, and its client leaves.
    let queued = serve.speech(400);
    std::thread::sleep(Duration::from_millis(300));
    drop(queued);
    let whole = read_all(&mut ahead);
    assert!(whole.contains("\r\n0\r\nx-finish-reason: "), "the stream ahead ended whole");
    // Both requests are logged; the queued one ran no frame.
    let deadline = Instant::now() + LIMIT;
    while serve.requests().len() < 2 {
        assert!(Instant::now() < deadline, "two request lines: {:#?}", serve.log);
        if let Ok(line) = serve.lines.recv_timeout(Duration::from_secs(1)) {
            serve.log.push(serde_json::from_str(&line).unwrap());
        }
    }
    let requests = serve.requests();
    let gone = requests.iter().find(|r| r["finish_reason"] == "cancelled").expect("a cancelled request");
    assert_eq!(gone["frames"], 0, "the queued request never ran: {gone}");
    let ahead = requests.iter().find(|r| r["finish_reason"] != "cancelled").expect("the stream ahead's line");
    assert_eq!(ahead["status"], 200, "{ahead}");
    assert!(ahead["frames"].as_u64().is_some_and(|f| f > 0), "{ahead}");
}

#[test]
fn a_client_gone_during_the_drain_ends_the_drain_without_waiting() {
    let mut serve = Serve::start(0, &["--drain-timeout", "100"]);
    let mut stream = serve.speech(2048);
    let head = read_until(&mut stream, b"\r\n\r\n");
    assert!(head.starts_with(b"HTTP/1.1 200"));
    serve.signal("-TERM");
    serve.wait_for("draining");
    let began = Instant::now();
    drop(stream);
    let status = serve.child.wait().unwrap();
    assert!(status.success(), "exit status {status}");
    assert!(began.elapsed() < Duration::from_secs(30), "the drain waited {:?}", began.elapsed());
    let log = serve.rest_of_log();
    assert!(log.iter().any(|l| l["message"] == "drained"), "{log:#?}");
    let request = log.iter().find(|l| l["target"] == "limelight::request").expect("a request line");
    assert_eq!(request["finish_reason"], "cancelled", "{request}");
}

#[test]
fn a_truncated_voice_file_is_refused_by_name_and_the_server_starts() {
    let voices = tempfile::tempdir().unwrap();
    std::fs::write(
        voices.path().join("narrator.voice.json"),
        br#"{"format":"limelight-voice-1","voice":{"name":"narr"#,
    )
    .unwrap();
    let dir = voices.path().to_str().unwrap().to_owned();
    let mut serve = Serve::start(0, &["--voices-dir", &dir]);
    let refused = serve.log.iter().find(|l| l["message"] == "voice file refused").cloned();
    let refused = refused.unwrap_or_else(|| panic!("a refusal line: {:#?}", serve.log));
    assert!(refused["file"].as_str().is_some_and(|f| f.ends_with("narrator.voice.json")), "{refused}");
    let loaded = serve.log.iter().find(|l| l["message"] == "voices loaded").expect("a voices line");
    assert_eq!((loaded["voices"].as_u64(), loaded["refused"].as_u64()), (Some(0), Some(1)), "{loaded}");
    assert!(serve.get("/ready").starts_with("HTTP/1.1 200"), "the server serves");
    let mut stream = serve.speech(8);
    assert!(read_all(&mut stream).contains("\r\n0\r\nx-finish-reason: "));
    serve.signal("-TERM");
    assert!(serve.child.wait().unwrap().success());
}
