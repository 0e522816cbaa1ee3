//! `limelight bench serve`: a load tool for a running server. For each client count N, N
//! closed-loop clients each send `--requests` streamed `pcm` requests of `--frames` frames one
//! after another (distinct seeds), over plain HTTP/1.1, reading the chunked body as it arrives.
//! Reports aggregate frames/s and seconds of audio per second, the slowest stream's speed
//! against real time (with that request's audio and first audio), the pauses a client playing
//! each stream as it arrives would hear, p50/p95 time to first audio, and in the JSON every
//! request's timings.
//!
//! The client is deliberately small (one request per connection, chunked or sized bodies): it
//! measures the server, so it must not hide its own costs in a library.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde::Serialize;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use crate::audio::CODEC_SAMPLE_RATE;
use crate::cli::BenchServeArgs;

/// `pcm` is 16-bit mono at 24 kHz (`docs/api.md`).
const PCM_BYTES_PER_SECOND: f64 = 24_000.0 * 2.0;
/// Samples per frame at the codec's rate (a frame is 2048 samples at 44.1 kHz).
const SAMPLES_PER_FRAME: f64 = 2048.0;

/// A stream counts as paused when its player would have waited at least this long in all:
/// below it, the gaps are the network's and the server's frame pacing, not the stream's speed.
const PAUSED_AFTER_S: f64 = 0.1;

/// One request as a client saw it.
#[derive(Clone, Debug, Serialize)]
pub struct RequestTiming {
    /// Seconds to the first audio byte.
    pub first_audio_s: f64,
    pub total_s: f64,
    pub audio_s: f64,
    /// Seconds a player would have waited in all after the first audio ([`Playback`]): the
    /// stream falling behind real time, or a later chunk of long text held until it ends.
    pub paused_s: f64,
}

/// A client that plays a stream as it arrives: it starts at the first audio, plays in real time,
/// and waits whenever it has played everything received.
#[derive(Debug, Default)]
struct Playback {
    started_at: Option<f64>,
    received_s: f64,
    paused_s: f64,
}

impl Playback {
    /// `audio_s` more seconds of audio arrived `at` seconds after the request.
    fn arrive(&mut self, at: f64, audio_s: f64) {
        let started = *self.started_at.get_or_insert(at);
        // Unpaused, the player would be `at − started` into the stream; it can only have played
        // what came before this, so any excess is time it spent waiting (the largest such
        // excess so far is all its waiting, since a wait never ends before new audio arrives).
        self.paused_s = self.paused_s.max(at - started - self.received_s);
        self.received_s += audio_s;
    }
}

/// One client count's results.
#[derive(Debug, Serialize)]
pub struct LoadRow {
    pub clients: usize,
    pub requests: usize,
    pub failed: usize,
    pub wall_s: f64,
    pub frames_per_s: f64,
    pub audio_s_per_s: f64,
    /// The slowest stream: its audio seconds over its wall seconds (1 = exactly real time).
    pub slowest_stream_x_real_time: f64,
    /// The request that set it: how much audio it got and how long its first audio took (a
    /// short request is slow against real time mostly by its wait for first audio).
    pub slowest: Option<RequestTiming>,
    /// The longest a player of one stream waited in all after its first audio.
    pub most_paused_s: f64,
    /// Streams whose player waited at least `PAUSED_AFTER_S` (0.1 s) in all.
    pub paused_streams: usize,
    pub first_audio_p50_s: f64,
    pub first_audio_p95_s: f64,
    /// Every request, in the order the clients finished them.
    pub timings: Vec<RequestTiming>,
}

#[derive(Debug, Serialize)]
pub struct LoadBench {
    pub url: String,
    pub frames: usize,
    pub rows: Vec<LoadRow>,
}

pub fn bench_serve(args: &BenchServeArgs) -> anyhow::Result<LoadBench> {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(run(args))
}

async fn run(args: &BenchServeArgs) -> anyhow::Result<LoadBench> {
    let target = Target::parse(&args.url)?;
    let mut rows = Vec::new();
    for &clients in &args.clients {
        let start = Instant::now();
        let tasks: Vec<_> = (0..clients)
            .map(|client| {
                let (target, args) = (target.clone(), ClientPlan::from(args, client));
                tokio::spawn(async move { args.run(&target).await })
            })
            .collect();
        let mut timings = Vec::new();
        let mut failed = 0;
        for task in tasks {
            for outcome in task.await? {
                match outcome {
                    Ok(t) => timings.push(t),
                    Err(e) => {
                        failed += 1;
                        eprintln!("request failed: {e:#}");
                    }
                }
            }
        }
        let row = summarise(clients, &timings, failed, start.elapsed());
        eprintln!("{}", row.line());
        rows.push(row);
    }
    Ok(LoadBench { url: args.url.clone(), frames: args.frames, rows })
}

/// What one client sends.
struct ClientPlan {
    body: Vec<String>,
    api_key: Option<String>,
    timeout: Duration,
}

impl ClientPlan {
    fn from(args: &BenchServeArgs, client: usize) -> ClientPlan {
        let body = (0..args.requests)
            .map(|r| {
                let seed = (client * args.requests + r) as u64 + 1;
                serde_json::json!({
                    "model": args.served_model_name,
                    "input": args.text,
                    "voice": "alloy",
                    "response_format": "pcm",
                    "seed": seed,
                    "max_frames": args.frames,
                })
                .to_string()
            })
            .collect();
        ClientPlan { body, api_key: args.api_key.clone(), timeout: Duration::from_secs(args.timeout_secs) }
    }

    async fn run(self, target: &Target) -> Vec<anyhow::Result<RequestTiming>> {
        let mut out = Vec::with_capacity(self.body.len());
        for body in &self.body {
            let request = speak(target, body, self.api_key.as_deref());
            out.push(match tokio::time::timeout(self.timeout, request).await {
                Ok(result) => result,
                Err(_) => Err(anyhow::anyhow!("no answer within {:?}", self.timeout)),
            });
        }
        out
    }
}

/// `http://host:port` (the path of the API is fixed).
#[derive(Clone, Debug)]
pub(super) struct Target {
    pub host_port: String,
}

impl Target {
    pub(super) fn parse(url: &str) -> anyhow::Result<Target> {
        let rest = url.strip_prefix("http://").context("--url must start with http:// (no TLS in the load tool)")?;
        let host_port = rest.trim_end_matches('/').to_owned();
        if host_port.is_empty() || host_port.contains('/') {
            bail!("--url must be http://HOST:PORT, got {url}");
        }
        Ok(Target { host_port })
    }
}

/// What a response's head says about its body.
pub(super) struct Head {
    pub code: u16,
    pub chunked: bool,
    pub length: Option<usize>,
}

/// Reads a response's status line and headers; `None` if the connection closed inside them.
pub(super) async fn read_head(reader: &mut BufReader<TcpStream>) -> anyhow::Result<Option<Head>> {
    let mut status = String::new();
    if reader.read_line(&mut status).await? == 0 {
        return Ok(None);
    }
    let code: u16 = status.split_whitespace().nth(1).and_then(|c| c.parse().ok()).context("no HTTP status line")?;
    let (mut chunked, mut length) = (false, None);
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).await? == 0 {
            return Ok(None);
        }
        let line = line.trim_end();
        if line.is_empty() {
            return Ok(Some(Head { code, chunked, length }));
        }
        if let Some((name, value)) = line.split_once(':') {
            let (name, value) = (name.trim().to_ascii_lowercase(), value.trim());
            chunked |= name == "transfer-encoding" && value.eq_ignore_ascii_case("chunked");
            if name == "content-length" {
                length = value.parse::<usize>().ok();
            }
        }
    }
}

/// One streamed speech request: times the first audio byte and counts the audio.
async fn speak(target: &Target, body: &str, api_key: Option<&str>) -> anyhow::Result<RequestTiming> {
    let start = Instant::now();
    let mut stream = TcpStream::connect(&target.host_port).await.context("connecting")?;
    stream.set_nodelay(true)?;
    let auth = api_key.map(|k| format!("Authorization: Bearer {k}\r\n")).unwrap_or_default();
    let head = format!(
        "POST /v1/audio/speech HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n{auth}Content-Length: {}\r\nConnection: close\r\n\r\n",
        target.host_port,
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    let mut reader = BufReader::new(stream);
    let Head { code, chunked, length } =
        read_head(&mut reader).await?.context("the connection closed inside the response head")?;
    let mut first_audio = None;
    let mut bytes = 0usize;
    let mut playback = Playback::default();
    let mut note = |n: usize| {
        if n > 0 {
            let at = start.elapsed();
            first_audio.get_or_insert(at);
            playback.arrive(at.as_secs_f64(), n as f64 / PCM_BYTES_PER_SECOND);
        }
        bytes += n;
    };
    let mut error_body = Vec::new();
    if chunked {
        loop {
            let mut size_line = String::new();
            reader.read_line(&mut size_line).await?;
            let size = usize::from_str_radix(size_line.trim().split(';').next().unwrap_or(""), 16)
                .with_context(|| format!("a chunk size line `{}`", size_line.trim()))?;
            if size == 0 {
                break; // trailers follow; the body is complete
            }
            let mut chunk = vec![0u8; size + 2];
            reader.read_exact(&mut chunk).await?;
            if code != 200 {
                error_body.extend_from_slice(&chunk[..size]);
            }
            note(size);
        }
    } else {
        let mut rest = Vec::new();
        match length {
            Some(n) => {
                rest.resize(n, 0);
                reader.read_exact(&mut rest).await?;
            }
            None => {
                reader.read_to_end(&mut rest).await?;
            }
        }
        if code != 200 {
            error_body = rest.clone();
        }
        note(rest.len());
    }
    if code != 200 {
        bail!("HTTP {code}: {}", String::from_utf8_lossy(&error_body));
    }
    Ok(RequestTiming {
        first_audio_s: first_audio.context("no audio in the response")?.as_secs_f64(),
        total_s: start.elapsed().as_secs_f64(),
        audio_s: bytes as f64 / PCM_BYTES_PER_SECOND,
        paused_s: playback.paused_s,
    })
}

fn summarise(clients: usize, timings: &[RequestTiming], failed: usize, wall: Duration) -> LoadRow {
    let wall_s = wall.as_secs_f64();
    let audio: f64 = timings.iter().map(|t| t.audio_s).sum();
    let mut first: Vec<f64> = timings.iter().map(|t| t.first_audio_s).collect();
    first.sort_by(f64::total_cmp);
    let slowest = timings.iter().min_by(|a, b| (a.audio_s / a.total_s).total_cmp(&(b.audio_s / b.total_s)));
    let percentile = |p: f64| {
        if first.is_empty() {
            return f64::NAN;
        }
        first[((first.len() as f64 * p).ceil() as usize).clamp(1, first.len()) - 1]
    };
    LoadRow {
        clients,
        requests: timings.len(),
        failed,
        wall_s,
        frames_per_s: audio * f64::from(CODEC_SAMPLE_RATE) / SAMPLES_PER_FRAME / wall_s,
        audio_s_per_s: audio / wall_s,
        slowest_stream_x_real_time: slowest.map_or(f64::INFINITY, |t| t.audio_s / t.total_s),
        slowest: slowest.cloned(),
        most_paused_s: timings.iter().map(|t| t.paused_s).fold(0.0, f64::max),
        paused_streams: timings.iter().filter(|t| t.paused_s >= PAUSED_AFTER_S).count(),
        first_audio_p50_s: percentile(0.5),
        first_audio_p95_s: percentile(0.95),
        timings: timings.to_vec(),
    }
}

impl LoadRow {
    fn line(&self) -> String {
        format!(
            "{:>4} clients: {} requests ({} failed) in {:.1} s: {:.0} frames/s, {:.1} s of audio per s; \
             slowest stream {:.2}× real time{}; {} of {} streams paused (≥ {} s), the most {:.2} s; \
             first audio p50 {:.3} s, p95 {:.3} s",
            self.clients,
            self.requests,
            self.failed,
            self.wall_s,
            self.frames_per_s,
            self.audio_s_per_s,
            self.slowest_stream_x_real_time,
            self.slowest.as_ref().map_or(String::new(), |t| format!(
                " ({:.2} s of audio, first audio after {:.3} s)",
                t.audio_s, t.first_audio_s
            )),
            self.paused_streams,
            self.requests,
            PAUSED_AFTER_S,
            self.most_paused_s,
            self.first_audio_p50_s,
            self.first_audio_p95_s
        )
    }
}

impl LoadBench {
    pub fn summary(&self) -> String {
        let mut out = format!("{} — {} frames per request\n", self.url, self.frames);
        out.push_str(
            "| clients | requests | failed | frames/s | audio s/s | slowest stream × real time \
             | streams paused | longest pause | first audio p50 | p95 |\n",
        );
        out.push_str("|---|---|---|---|---|---|---|---|---|---|\n");
        for r in &self.rows {
            out.push_str(&format!(
                "| {} | {} | {} | {:.0} | {:.1} | {:.2} | {} | {:.2} s | {:.3} s | {:.3} s |\n",
                r.clients,
                r.requests,
                r.failed,
                r.frames_per_s,
                r.audio_s_per_s,
                r.slowest_stream_x_real_time,
                r.paused_streams,
                r.most_paused_s,
                r.first_audio_p50_s,
                r.first_audio_p95_s
            ));
        }
        out
    }

    pub fn failed(&self) -> usize {
        self.rows.iter().map(|r| r.failed).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_and_the_slowest_stream() {
        let t =
            |first, total, audio| RequestTiming { first_audio_s: first, total_s: total, audio_s: audio, paused_s: 0.0 };
        let timings: Vec<RequestTiming> =
            (1..=20).map(|i| t(i as f64 / 100.0, 2.0, 4.0)).chain([t(0.5, 8.0, 4.0)]).collect();
        let row = summarise(4, &timings, 1, Duration::from_secs(10));
        assert_eq!((row.requests, row.failed), (21, 1));
        assert_eq!(row.first_audio_p50_s, 0.11);
        assert_eq!(row.first_audio_p95_s, 0.20);
        assert_eq!(row.slowest_stream_x_real_time, 0.5);
        let slowest = row.slowest.as_ref().expect("a slowest request");
        assert_eq!((slowest.first_audio_s, slowest.total_s), (0.5, 8.0));
        assert_eq!(row.timings.len(), 21);
        assert!(summarise(1, &[], 1, Duration::from_secs(1)).slowest.is_none());
        assert!((row.audio_s_per_s - 8.4).abs() < 1e-9);
        assert!((row.frames_per_s - 8.4 * 44_100.0 / 2048.0).abs() < 1e-6);
    }

    /// A player starts at the first audio and waits only when it has played all it received.
    #[test]
    fn playback_counts_the_waits_a_player_would_hear() {
        let heard = |arrivals: &[(f64, f64)]| {
            let mut p = Playback::default();
            arrivals.iter().for_each(|&(at, audio)| p.arrive(at, audio));
            p.paused_s
        };
        // Ahead of real time throughout: no wait.
        assert_eq!(heard(&[(0.1, 1.0), (0.5, 1.0), (1.9, 1.0)]), 0.0);
        // 1 s of audio, then the next second only 3 s later: a 2 s wait.
        assert!((heard(&[(0.1, 1.0), (3.1, 1.0)]) - 2.0).abs() < 1e-12);
        // Two waits add up: 0.5 s, then (played 2 s by 4.1 − 0.5 s) another 1.6 s.
        assert!((heard(&[(0.1, 1.0), (1.6, 1.0), (4.1, 1.0)]) - 2.0).abs() < 1e-12);
        // A stream that falls behind and catches up later still paused.
        assert!((heard(&[(0.0, 0.5), (2.0, 10.0), (2.5, 0.1)]) - 1.5).abs() < 1e-12);
        let paused = |s| RequestTiming { first_audio_s: 0.1, total_s: 2.0, audio_s: 4.0, paused_s: s };
        let row = summarise(3, &[paused(0.0), paused(0.05), paused(1.25)], 0, Duration::from_secs(2));
        assert_eq!((row.paused_streams, row.most_paused_s), (1, 1.25));
    }

    #[test]
    fn only_plain_http_urls() {
        assert_eq!(Target::parse("http://127.0.0.1:8080/").unwrap().host_port, "127.0.0.1:8080");
        assert!(Target::parse("https://example.test").is_err());
        assert!(Target::parse("http://host/v1").is_err());
    }
}
