//! `limelight bench soak`: a long run of closed-loop clients against a running server (issue 16).
//! Each client sends one speech request after another, each with a random response format,
//! delivery (chunked, whole, SSE), length and seed, and leaves a share of them at a random moment
//! (before its first byte or mid-stream). Meanwhile the server's host RSS, open descriptors and
//! engine memory are sampled.
//!
//! Every request the client did not leave must end in a known way: complete (a chunked body's
//! terminator with its `x-finish-reason` trailer, a whole body of its `Content-Length`, an SSE
//! `speech.audio.done`), or a 4xx/429/503 refusal. A 5xx, and a body that ends any other way (a
//! broken stream, or one that ends with a terminator but no finish reason, so it looks complete
//! without being so), fail the soak.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde::Serialize;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use super::bench_serve::{Head, Target, read_head};
use super::soak_plot;
use crate::cli::BenchSoakArgs;

const FORMATS: [&str; 5] = ["pcm", "wav", "mp3", "opus", "flac"];

/// How one request ended, as its client saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Complete,
    /// The client left on purpose (the soak's random disconnects).
    Left,
    /// A 4xx, 429 or 503 answer (a refusal in OpenAI's shape).
    Refused,
    ServerError,
    /// The body ended without its end marker (the client did not leave).
    Broken,
    /// The body ended with its end marker but no finish reason: it looks complete.
    LooksComplete,
    /// No answer, or a malformed one (connection refused, a garbled head).
    Failed,
}

/// One sample of the server's resources.
#[derive(Clone, Debug, Serialize)]
pub struct Sample {
    pub elapsed_s: f64,
    pub rss_mib: Option<f64>,
    pub open_fds: Option<usize>,
    /// `limelight_memory_in_use_bytes` from `/metrics` (the engine's resident and pooled bytes).
    pub engine_memory_mib: Option<f64>,
    pub active_streams: Option<f64>,
    pub requests_done: usize,
}

#[derive(Debug, Serialize)]
pub struct SoakReport {
    pub url: String,
    pub clients: usize,
    pub duration_s: f64,
    pub counts: Vec<(Outcome, usize)>,
    pub samples: Vec<Sample>,
    /// RSS of the last third of the samples over the first third's (after the first sample).
    pub rss_drift: Option<f64>,
    pub fd_drift: Option<f64>,
}

impl SoakReport {
    pub fn count(&self, outcome: Outcome) -> usize {
        self.counts.iter().find(|(o, _)| *o == outcome).map_or(0, |(_, n)| *n)
    }

    /// What makes the soak fail: 5xx answers and bodies that ended wrongly.
    pub fn faults(&self) -> usize {
        [Outcome::ServerError, Outcome::Broken, Outcome::LooksComplete, Outcome::Failed]
            .iter()
            .map(|&o| self.count(o))
            .sum()
    }

    pub fn summary(&self) -> String {
        let mut out = format!(
            "{} — {} clients for {:.0} s\n| outcome | requests |\n|---|---|\n",
            self.url, self.clients, self.duration_s
        );
        for (outcome, n) in &self.counts {
            out.push_str(&format!("| {outcome:?} | {n} |\n"));
        }
        let ratio = |r: Option<f64>| r.map_or(String::from("n/a"), |r| format!("{r:.3}"));
        out.push_str(&format!(
            "host RSS last third / first third: {}; open descriptors: {}\n",
            ratio(self.rss_drift),
            ratio(self.fd_drift)
        ));
        out
    }

    /// The samples as CSV.
    pub fn csv(&self) -> String {
        let cell = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v:.1}"));
        let mut out = String::from("elapsed_s,rss_mib,open_fds,engine_memory_mib,active_streams,requests_done\n");
        for s in &self.samples {
            out.push_str(&format!(
                "{:.1},{},{},{},{},{}\n",
                s.elapsed_s,
                cell(s.rss_mib),
                s.open_fds.map_or(String::new(), |n| n.to_string()),
                cell(s.engine_memory_mib),
                cell(s.active_streams),
                s.requests_done
            ));
        }
        out
    }

    pub fn svg(&self) -> String {
        soak_plot::svg(self)
    }
}

pub fn soak(args: &BenchSoakArgs) -> anyhow::Result<SoakReport> {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(run(args))
}

async fn run(args: &BenchSoakArgs) -> anyhow::Result<SoakReport> {
    let host_port = Target::parse(&args.url)?.host_port;
    let start = Instant::now();
    let deadline = start + Duration::from_secs(args.duration_secs);
    let done = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let clients: Vec<_> = (0..args.clients)
        .map(|c| {
            let plan = Plan { host_port: host_port.clone(), args: args.clone(), rng: Rng(args.seed ^ (c as u64 + 1)) };
            let done = done.clone();
            tokio::spawn(async move { plan.run(deadline, &done).await })
        })
        .collect();
    let mut samples = Vec::new();
    while Instant::now() < deadline {
        samples.push(sample(&host_port, args.server_pid, start, done.load(std::sync::atomic::Ordering::Relaxed)).await);
        let next = Instant::now() + Duration::from_secs(args.sample_every_secs);
        tokio::time::sleep_until(next.min(deadline).into()).await;
    }
    let mut counts = std::collections::BTreeMap::<String, (Outcome, usize)>::new();
    for client in clients {
        for outcome in client.await? {
            counts.entry(format!("{outcome:?}")).or_insert((outcome, 0)).1 += 1;
        }
    }
    samples.push(sample(&host_port, args.server_pid, start, done.load(std::sync::atomic::Ordering::Relaxed)).await);
    let drift = |f: &dyn Fn(&Sample) -> Option<f64>| {
        let values: Vec<f64> = samples.iter().skip(1).filter_map(f).collect();
        let third = values.len() / 3;
        if third == 0 {
            return None;
        }
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        Some(mean(&values[values.len() - third..]) / mean(&values[..third]))
    };
    Ok(SoakReport {
        url: args.url.clone(),
        clients: args.clients,
        duration_s: start.elapsed().as_secs_f64(),
        rss_drift: drift(&|s| s.rss_mib),
        fd_drift: drift(&|s| s.open_fds.map(|n| n as f64)),
        counts: counts.into_values().collect(),
        samples,
    })
}

/// SplitMix64: the soak's plan is reproducible from `--seed`.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn chance(&mut self, p: f64) -> bool {
        ((self.next() >> 11) as f64 / (1u64 << 53) as f64) < p
    }
}

/// One client's requests.
struct Plan {
    host_port: String,
    args: BenchSoakArgs,
    rng: Rng,
}

/// How a request is delivered.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Delivery {
    Chunked,
    Whole,
    Sse,
}

impl Plan {
    async fn run(mut self, deadline: Instant, done: &std::sync::atomic::AtomicUsize) -> Vec<Outcome> {
        let mut outcomes = Vec::new();
        while Instant::now() < deadline {
            let format = FORMATS[self.rng.below(FORMATS.len() as u64) as usize];
            let delivery = [Delivery::Chunked, Delivery::Whole, Delivery::Sse][self.rng.below(3) as usize];
            let frames = 8 + self.rng.below(self.args.max_frames.saturating_sub(8) as u64 + 1);
            let mut body = serde_json::json!({
                "model": self.args.served_model_name, "input": self.args.text, "voice": "alloy",
                "response_format": format, "seed": self.rng.next() >> 12, "max_frames": frames,
            });
            match delivery {
                Delivery::Whole => body["stream"] = false.into(),
                Delivery::Sse => body["stream_format"] = "sse".into(),
                Delivery::Chunked => {}
            }
            // The bytes after which the client leaves (0: right after sending), if it does.
            let leave_after = self.rng.chance(self.args.disconnect).then(|| self.rng.below(16_384) as usize);
            let body = body.to_string();
            let request = exchange(&self.host_port, &body, delivery, leave_after, self.args.api_key.as_deref());
            let timeout = Duration::from_secs(self.args.timeout_secs);
            let outcome = match tokio::time::timeout(timeout, request).await {
                Ok(Ok(outcome)) => outcome,
                Ok(Err(e)) => {
                    eprintln!("soak: a request failed: {e:#}");
                    Outcome::Failed
                }
                Err(_) => Outcome::Failed,
            };
            if matches!(outcome, Outcome::ServerError | Outcome::Broken | Outcome::LooksComplete) {
                eprintln!("soak: {outcome:?} ({format}, {delivery:?}, {frames} frames)");
            }
            if outcome == Outcome::Refused {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            outcomes.push(outcome);
            done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        outcomes
    }
}

/// One request: sends it, reads the answer (or leaves after `leave_after` bytes of body).
async fn exchange(
    host_port: &str,
    body: &str,
    delivery: Delivery,
    leave_after: Option<usize>,
    api_key: Option<&str>,
) -> anyhow::Result<Outcome> {
    let mut tcp = TcpStream::connect(host_port).await.context("connecting")?;
    let auth = api_key.map(|k| format!("Authorization: Bearer {k}\r\n")).unwrap_or_default();
    let head = format!(
        "POST /v1/audio/speech HTTP/1.1\r\nHost: {host_port}\r\nContent-Type: application/json\r\n{auth}\
         TE: trailers\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    tcp.write_all(head.as_bytes()).await?;
    if leave_after == Some(0) {
        return Ok(Outcome::Left);
    }
    let mut reader = BufReader::new(tcp);
    let Some(Head { code, chunked, length }) = read_head(&mut reader).await? else { return Ok(Outcome::Broken) };
    match code {
        200 => {}
        500..=599 if code != 503 => return Ok(Outcome::ServerError),
        _ => return Ok(Outcome::Refused),
    }
    let leave = leave_after.unwrap_or(usize::MAX);
    if !chunked {
        let Some(length) = length else { return Ok(Outcome::Broken) };
        let mut body = vec![0u8; length.min(leave)];
        if reader.read_exact(&mut body).await.is_err() {
            return Ok(Outcome::Broken);
        }
        return Ok(if length > leave { Outcome::Left } else { Outcome::Complete });
    }
    let (mut read, mut text) = (0usize, Vec::new());
    loop {
        let mut size_line = String::new();
        if reader.read_line(&mut size_line).await? == 0 {
            return Ok(Outcome::Broken);
        }
        let size = usize::from_str_radix(size_line.trim().split(';').next().unwrap_or(""), 16)
            .with_context(|| format!("a chunk size line `{}`", size_line.trim()))?;
        if size == 0 {
            break;
        }
        let mut chunk = vec![0u8; size + 2];
        if reader.read_exact(&mut chunk).await.is_err() {
            return Ok(Outcome::Broken);
        }
        read += size;
        if delivery == Delivery::Sse {
            text.extend_from_slice(&chunk[..size]);
        }
        if read >= leave {
            return Ok(Outcome::Left);
        }
    }
    let mut trailers = String::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).await? == 0 || line.trim_end().is_empty() {
            break;
        }
        trailers.push_str(&line.to_ascii_lowercase());
    }
    let finished = match delivery {
        Delivery::Sse => String::from_utf8_lossy(&text).contains("\"speech.audio.done\""),
        _ => trailers.contains("x-finish-reason:"),
    };
    Ok(if finished { Outcome::Complete } else { Outcome::LooksComplete })
}

/// The server's resources now: RSS and descriptors from `/proc` (with `--server-pid`), engine
/// memory and active streams from `/metrics`.
async fn sample(host_port: &str, pid: Option<u32>, start: Instant, requests_done: usize) -> Sample {
    let rss_mib = pid.and_then(|pid| {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let kib: f64 =
            status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?.trim().trim_end_matches("kB").trim().parse().ok()?;
        Some(kib / 1024.0)
    });
    let open_fds = pid.and_then(|pid| Some(std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count()));
    let metrics = scrape(host_port).await.unwrap_or_default();
    // `name value` (an unlabelled gauge): the name whole, not a prefix of a longer one.
    let gauge = |name: &str| {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.split_whitespace().next()?.parse::<f64>().ok())
    };
    Sample {
        elapsed_s: start.elapsed().as_secs_f64(),
        rss_mib,
        open_fds,
        engine_memory_mib: gauge(crate::telemetry::MEMORY_IN_USE_BYTES).map(|b| b / (1u64 << 20) as f64),
        active_streams: gauge(crate::telemetry::ACTIVE_STREAMS),
        requests_done,
    }
}

async fn scrape(host_port: &str) -> anyhow::Result<String> {
    let mut tcp = TcpStream::connect(host_port).await?;
    tcp.write_all(format!("GET /metrics HTTP/1.1\r\nHost: {host_port}\r\nConnection: close\r\n\r\n").as_bytes())
        .await?;
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), tcp.read_to_end(&mut out)).await??;
    let text = String::from_utf8_lossy(&out).into_owned();
    if !text.starts_with("HTTP/1.1 200") {
        bail!("/metrics: {}", text.lines().next().unwrap_or_default());
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plan_is_reproducible_and_spread() {
        let (mut a, mut b) = (Rng(7), Rng(7));
        let draws: Vec<u64> = (0..1000).map(|_| a.below(5)).collect();
        assert!(draws.iter().zip((0..1000).map(|_| b.below(5))).all(|(x, y)| *x == y));
        for v in 0..5 {
            let n = draws.iter().filter(|&&d| d == v).count();
            assert!((150..250).contains(&n), "{v}: {n}");
        }
        let left = (0..10_000).filter(|_| a.chance(0.25)).count();
        assert!((2300..2700).contains(&left), "{left}");
    }
}
