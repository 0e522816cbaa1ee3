//! `limelight serve` as an operator runs it, a process under systemd:
//! - the drain on SIGTERM (sd_notify states, `/ready` 503, the stream in flight finished);
//! - text logs written to a file (not a terminal) carry no ANSI colour codes (issue 16,
//!   finding 10);
//! - a demo start killed while writing its checkpoint left `.demo-tiny.<pid>`; the next start
//!   removes the folder of a process that is gone, and leaves a live one's (finding 9);
//! - servers started at once on one empty cache all load the demo checkpoint (a later writer
//!   once removed the first one's copy while it was loading it);
//! - a client's clip is decoded in a child of the running binary, which survives the binary's
//!   file being removed and the decoder being killed by its memory limit.

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

/// A client's reference clip is decoded by the server's own binary in a child process
/// (`voice::isolated`), through `/proc/self/exe`: it still works after the file the server was
/// started from is gone (an upgrade replacing it). An honest clip makes a voice; a clip that makes
/// the decoder reserve 64 GB (`fuzz/seeds/voice_clip/m4a-stsc-64gb`) kills only the child and is
/// refused with a 400 naming the field; the server goes on.
#[test]
fn clips_are_decoded_in_a_child_of_the_running_binary_even_after_its_file_is_gone() {
    use base64::Engine as _;
    use std::io::{Read, Write};
    use std::net::TcpStream;

    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("bin")).unwrap();
    let binary = dir.path().join("bin/limelight");
    std::fs::copy(env!("CARGO_BIN_EXE_limelight"), &binary).unwrap();
    let mut child = Command::new(&binary)
        .args(["serve", "--demo", "--port", "0", "--log-format", "json"])
        .env("XDG_CACHE_HOME", dir.path().join("cache"))
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    struct KillOnDrop(std::process::Child);
    impl Drop for KillOnDrop {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _child = KillOnDrop(child);
    let mut lines = BufReader::new(stdout).lines().map_while(Result::ok);
    let addr = lines
        .find_map(|l| {
            let v: serde_json::Value = serde_json::from_str(&l).ok()?;
            (v["message"] == "listening; loading the model").then(|| v["addr"].as_str().unwrap().to_owned())
        })
        .expect("the server listens");
    std::thread::spawn(move || lines.for_each(drop));
    std::fs::remove_file(&binary).unwrap();

    let http = |head: &str, body: &[u8]| -> (u16, String) {
        let mut s = TcpStream::connect(&addr).unwrap();
        s.set_read_timeout(Some(LIMIT)).unwrap();
        s.write_all(
            format!("{head}\r\nHost: t\r\nConnection: close\r\nContent-Length: {}\r\n\r\n", body.len()).as_bytes(),
        )
        .unwrap();
        s.write_all(body).unwrap();
        let mut out = Vec::new();
        s.read_to_end(&mut out).unwrap();
        let text = String::from_utf8_lossy(&out).into_owned();
        (text[9..12].parse().unwrap(), text)
    };
    let started = std::time::Instant::now();
    while http("GET /ready HTTP/1.1", b"").0 != 200 {
        assert!(started.elapsed() < LIMIT, "the demo model loads");
        std::thread::sleep(Duration::from_millis(100));
    }
    let upload = |name: &str, audio: &[u8]| {
        let body = serde_json::json!({
            "name": name, "consent": "yes", "ref_text": "Hello there, friend.",
            "audio_sample": base64::engine::general_purpose::STANDARD.encode(audio),
        });
        http("POST /v1/audio/voices HTTP/1.1\r\nContent-Type: application/json", body.to_string().as_bytes())
    };
    let bomb = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/fuzz/seeds/voice_clip/m4a-stsc-64gb")).unwrap();
    let (status, reply) = upload("bomb", &bomb[1..]);
    assert_eq!(status, 400, "{reply}");
    assert!(reply.contains("\"param\":\"audio_sample\"") && reply.contains("decoder was stopped"), "{reply}");
    let (status, reply) = upload("honest", &tone_wav());
    assert_eq!(status, 200, "{reply}");
    assert!(reply.contains("\"name\":\"honest\""), "{reply}");
    assert_eq!(http("GET /health HTTP/1.1", b"").0, 200);
}

/// 1.2 s of a 220 Hz tone, mono 16-bit WAV at 24 kHz.
fn tone_wav() -> Vec<u8> {
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate: 24_000,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let mut out = std::io::Cursor::new(Vec::new());
    let mut writer = hound::WavWriter::new(&mut out, spec).unwrap();
    for i in 0..28_800 {
        let t = f64::from(i) / 24_000.0;
        writer.write_sample((8000.0 * (std::f64::consts::TAU * 220.0 * t).sin()) as i16).unwrap();
    }
    writer.finalize().unwrap();
    out.into_inner()
}
