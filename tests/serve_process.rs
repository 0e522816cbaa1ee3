//! `limelight serve` as an operator runs it, for issue 16's findings about its files:
//! - text logs written to a file (not a terminal) carry no ANSI colour codes (finding 10);
//! - a demo start killed while writing its checkpoint left `.demo-tiny.<pid>`; the next start
//!   removes the folder of a process that is gone, and leaves a live one's (finding 9).

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
