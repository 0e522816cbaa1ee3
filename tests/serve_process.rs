//! `limelight serve` as an operator runs it, a process under systemd:
//! - the drain on SIGTERM (sd_notify states, `/ready` 503, the stream in flight finished);
//! - text logs written to a file (not a terminal) carry no ANSI colour codes (issue 16,
//!   finding 10);
//! - a demo start killed while writing its checkpoint left `.demo-tiny.<pid>`; the next start
//!   removes the folder of a process that is gone, and leaves a live one's (finding 9);
//! - servers started at once on one empty cache all load the demo checkpoint (a later writer
//!   once removed the first one's copy while it was loading it).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(120);

#[test]
fn text_logs_carry_no_colour_and_a_dead_starts_staging_is_removed() {
    let cache = tempfile::tempdir().unwrap();
    let parent = cache.path().join("limelight");
    // A pid no process has (above the kernel's pid_max), and this test's own (alive).
    let dead = parent.join(".demo-tiny.4294967290");
    let live = parent.join(format!(".demo-tiny.{}", std::process::id()));
    for dir in [&dead, &live] {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join("config.json"), "{}").unwrap();
    }
    let mut child = Command::new(env!("CARGO_BIN_EXE_limelight"))
        .args(["serve", "--demo", "--port", "0", "--log-format", "text"])
        .env("XDG_CACHE_HOME", cache.path())
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut lines = Vec::new();
    let listening = loop {
        match rx.recv_timeout(LIMIT) {
            Ok(line) => {
                let done = line.contains("listening");
                lines.push(line);
                if done {
                    break true;
                }
            }
            Err(_) => break false,
        }
    };
    let _ = child.kill();
    let _ = child.wait();
    assert!(listening, "the server started: {lines:?}");
    assert!(lines.iter().all(|l| !l.contains('\u{1b}')), "no escape codes in a piped log: {lines:?}");
    assert!(!dead.exists(), "the dead start's staging folder is gone");
    assert!(live.exists(), "a live process's staging folder is left alone");
}

/// The `serve` process end to end: systemd hears `STATUS=` then `READY=1`; SIGTERM makes it
/// say `STOPPING=1`, answer `/ready` with 503, finish the stream in flight, and exit 0.
#[test]
fn serve_drains_on_sigterm_and_exits_zero() {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::TcpStream;
    use std::os::unix::net::UnixDatagram;
    use std::process::{Command, Stdio};

    let cache = tempfile::tempdir().unwrap();
    let notify_path = cache.path().join("notify.sock");
    let notify = UnixDatagram::bind(&notify_path).unwrap();
    notify.set_read_timeout(Some(LIMIT)).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_limelight"))
        .args(["serve", "--demo", "--port", "0", "--log-format", "json", "--drain-timeout", "60"])
        .env("XDG_CACHE_HOME", cache.path())
        .env("NOTIFY_SOCKET", &notify_path)
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // Kill the server whatever happens below, so a failure never leaves it running.
    struct KillOnDrop(std::process::Child);
    impl Drop for KillOnDrop {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let stdout = child.stdout.take().unwrap();
    let mut child = KillOnDrop(child);
    let (line_tx, line_rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = line_tx.send(line);
        }
    });
    let mut log = Vec::new();
    let next_line = |log: &mut Vec<String>| {
        let line = line_rx.recv_timeout(LIMIT).expect("the server logs");
        log.push(line.clone());
        serde_json::from_str::<serde_json::Value>(&line).expect("JSON log lines")
    };
    let addr = loop {
        let line = next_line(&mut log);
        if line["message"] == "listening; loading the model" {
            break line["addr"].as_str().unwrap().to_owned();
        }
    };
    let mut messages = Vec::new();
    let mut buf = [0u8; 4096];
    while !messages.iter().any(|m: &String| m.contains("READY=1")) {
        let n = notify.recv(&mut buf).expect("sd_notify messages");
        messages.push(String::from_utf8_lossy(&buf[..n]).into_owned());
    }
    assert!(messages[0].contains("STATUS=loading"), "{messages:?}");

    let request = |text: &str| {
        let mut s = TcpStream::connect(&addr).unwrap();
        s.set_read_timeout(Some(LIMIT)).unwrap();
        s.write_all(text.as_bytes()).unwrap();
        s
    };
    let read_all = |mut s: TcpStream| {
        let mut out = Vec::new();
        s.read_to_end(&mut out).unwrap();
        String::from_utf8_lossy(&out).into_owned()
    };
    let body = r#"{"model":"tts-1","input":"Hello there, how are you today?","response_format":"pcm","max_frames":120,"seed":3}"#;
    let mut speech = request(&format!(
        "POST /v1/audio/speech HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nTE: trailers\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    ));
    let mut head = [0u8; 12];
    speech.read_exact(&mut head).unwrap();
    assert_eq!(&head, b"HTTP/1.1 200", "the stream has begun");

    let pid = child.0.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    loop {
        let n = notify.recv(&mut buf).expect("STOPPING=1");
        if String::from_utf8_lossy(&buf[..n]).contains("STOPPING=1") {
            break;
        }
    }
    let ready = read_all(request("GET /ready HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"));
    assert!(ready.starts_with("HTTP/1.1 503"), "{ready}");
    assert!(ready.contains("draining"), "{ready}");

    let rest = read_all(speech);
    assert!(
        rest.contains("\r\n0\r\nx-finish-reason: "),
        "the stream in flight ended whole: ...{}",
        &rest[rest.len().saturating_sub(200)..]
    );
    let status = child.0.wait().unwrap();
    assert!(status.success(), "exit status {status}");
    while let Ok(line) = line_rx.recv_timeout(Duration::from_secs(5)) {
        log.push(line);
    }
    let draining = log.iter().find(|l| l.contains("\"draining\"")).expect("a draining line");
    assert!(draining.contains("\"running\":1"), "SIGTERM came while the stream ran: {draining}");
    assert!(log.iter().any(|l| l.contains("\"drained\"")), "{log:#?}");
    assert!(log.iter().any(|l| l.contains("limelight::request") && l.contains("\"status\":200")), "{log:#?}");
}

/// Three `--demo` servers started together on one empty cache: each reaches `ready`, none sees
/// its checkpoint vanish under it.
#[test]
fn servers_started_at_once_share_one_demo_checkpoint() {
    let cache = tempfile::tempdir().unwrap();
    let mut servers: Vec<_> = (0..3)
        .map(|_| {
            Command::new(env!("CARGO_BIN_EXE_limelight"))
                .args(["serve", "--demo", "--port", "0", "--log-format", "json"])
                .env("XDG_CACHE_HOME", cache.path())
                .env("RUST_LOG", "info")
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    let readers: Vec<_> = servers
        .iter_mut()
        .map(|child| {
            let stdout = child.stdout.take().unwrap();
            std::thread::spawn(move || {
                let mut lines = Vec::new();
                for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                    let message = serde_json::from_str::<serde_json::Value>(&line).expect("JSON log lines")["message"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned();
                    lines.push(line);
                    if message == "ready" || message == "the model failed to load" {
                        break;
                    }
                }
                lines
            })
        })
        .collect();
    let deadline = std::time::Instant::now() + LIMIT;
    while readers.iter().any(|r| !r.is_finished()) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    for child in &mut servers {
        let _ = child.kill();
        let _ = child.wait();
    }
    let logs: Vec<Vec<String>> = readers.into_iter().map(|r| r.join().unwrap()).collect();
    for log in &logs {
        assert!(log.iter().any(|l| l.contains("\"message\":\"ready\"")), "every server loads: {log:#?}");
    }
    let writers = logs.iter().filter(|log| log.iter().any(|l| l.contains("writing the demo checkpoint"))).count();
    assert_eq!(writers, 1, "one server wrote the checkpoint, the others waited for it and used it");
}
