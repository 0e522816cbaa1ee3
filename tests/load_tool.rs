//! `limelight bench serve` against `limelight serve --demo` (the tiny CPU engine): a smoke test of
//! the load tool, not a timing. The server batches the clients; every request is answered whole
//! and the tool's table adds up.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(120);

/// Kills the server whatever happens, so a failure never leaves it running.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn the_load_tool_drives_a_batching_server() {
    let cache = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_limelight"))
        .args(["serve", "--demo", "--port", "0", "--log-format", "json", "--max-batch", "4"])
        .env("XDG_CACHE_HOME", cache.path())
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let _server = KillOnDrop(child);
    let (line_tx, line_rx) = std::sync::mpsc::channel::<serde_json::Value>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Ok(value) = serde_json::from_str(&line) {
                let _ = line_tx.send(value);
            }
        }
    });
    let mut addr = None;
    loop {
        let line = line_rx.recv_timeout(LIMIT).expect("the server logs");
        if line["message"] == "listening; loading the model" {
            addr = line["addr"].as_str().map(str::to_owned);
        }
        if line["message"] == "engine: decode batch" {
            assert_eq!(line["max_batch"], 4, "{line}");
        }
        if line["stage"] == "ready" {
            break;
        }
    }
    let addr = addr.expect("the listening address was logged before ready");
    let json = cache.path().join("load.json");
    let out = Command::new(env!("CARGO_BIN_EXE_limelight"))
        .args(["bench", "serve", "--url", &format!("http://{addr}"), "--clients", "1,3", "--requests", "2"])
        .args(["--frames", "6", "--timeout-secs", "100", "--json"])
        .arg(&json)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("| clients |"), "the table: {stdout}");
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let rows = report["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    for (row, clients) in rows.iter().zip([1, 3]) {
        assert_eq!(row["clients"], clients);
        assert_eq!(row["requests"], 2 * clients, "{row}");
        assert_eq!(row["failed"], 0, "{row}");
        // 6 frames of 2048 samples at 44.1 kHz per request, as 24 kHz PCM.
        let audio = row["audio_s_per_s"].as_f64().unwrap() * row["wall_s"].as_f64().unwrap();
        let expected = (2 * clients) as f64 * 6.0 * 2048.0 / 44_100.0;
        assert!((audio - expected).abs() < 0.01 * expected, "{audio} s of audio, expected {expected}: {row}");
        let (p50, p95) = (row["first_audio_p50_s"].as_f64().unwrap(), row["first_audio_p95_s"].as_f64().unwrap());
        assert!(p50 > 0.0 && p95 >= p50, "{row}");
        assert!(row["slowest_stream_x_real_time"].as_f64().unwrap() > 0.0, "{row}");
        // Every request's player waits are recorded, and the row's worst is the largest of them.
        let timings = row["timings"].as_array().unwrap();
        let most = timings.iter().map(|t| t["paused_s"].as_f64().unwrap()).fold(0.0, f64::max);
        assert!(most >= 0.0 && row["most_paused_s"].as_f64().unwrap() == most, "{row}");
        assert!(row["paused_streams"].as_u64().unwrap() <= row["requests"].as_u64().unwrap(), "{row}");
    }
}
