//! A client's reference clip decoded in a child process, so that a decoder's fault stays that
//! upload's own.
//!
//! The decoders are third-party code (symphonia; ogg and opus-rs) fed a stranger's bytes, and
//! fuzzing keeps finding them allocating what a file declares, unchecked: 2–3 GB from an 80-byte
//! FLAC, and 16–64 GB from four bytes changed in an M4A's sample tables
//! (`fuzz/seeds/voice_clip/m4a-*`, `docs/fuzzing.md`). In the server's own process an allocation
//! that fails aborts it, and every stream in flight with it; checking each format's fields by
//! hand only closes the holes already found. So the server decodes a client's clip in a child,
//! `limelight decode-clip` (this binary), which limits its own address space and CPU time before
//! it reads a byte, and a watchdog kills it at a wall-clock limit. An allocation past the limit
//! fails in the child, the child dies, and the upload is refused as undecodable: the server and
//! its other requests never notice.
//!
//! The exchange, over the child's stdin and stdout: the parent writes one JSON line (the hint and
//! the [`ClipLimits`]) and then the file's bytes, and closes the pipe; the child answers one JSON
//! line ([`Answer`]) and, for a clip, its samples as little-endian f32.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use rustix::process::{Pid, PidfdFlags, Resource, Rlimit, Signal, getrlimit, pidfd_open, pidfd_send_signal, setrlimit};
use serde::{Deserialize, Serialize};

use super::clip::{self, Clip, ClipError, ClipLimits, ENCODER_RATE};

/// The hidden subcommand the child runs.
pub const SUBCOMMAND: &str = "decode-clip";

/// Default `--clip-decode-memory-mib`. The largest clip the limits allow, 60 s of 8-channel
/// 192 kHz audio, peaked at 728 MB resident decoding a 184 MB WAV (16 MiB is the default upload).
pub const DEFAULT_MEMORY_MIB: u64 = 2048;

/// CPU seconds a child may use: a 60 s clip decodes in well under one, so only a file built to
/// spin reaches this.
pub const CPU_SECONDS: u64 = 30;

/// The running process's own executable, whatever has become of its path since.
const RUNNING_BINARY: &str = "/proc/self/exe";

/// The longest JSON line either side writes.
const MAX_LINE_BYTES: u64 = 64 << 10;

/// How to start the child decoder.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClipDecoder {
    /// The binary whose [`SUBCOMMAND`] decodes: the running server's own.
    pub program: PathBuf,
    /// The child's address-space limit, in bytes.
    pub memory_bytes: u64,
    /// The child's CPU-time limit, in seconds.
    pub cpu_seconds: u64,
}

/// Why the child could not be asked: the server's fault, not the file's.
#[derive(Debug, thiserror::Error)]
#[error("the clip decoder `{program}` could not be run: {reason}")]
pub struct DecoderUnavailable {
    pub program: String,
    pub reason: String,
}

/// What the parent sends before the file's bytes.
#[derive(Serialize, Deserialize)]
struct Request {
    hint: Option<String>,
    limits: ClipLimits,
}

/// What the child answers; `Clip` is followed by `samples` little-endian f32.
#[derive(Serialize, Deserialize)]
enum Answer {
    Clip { samples: usize, source_rate: u32, source_channels: usize },
    Refused(ClipError),
}

impl ClipDecoder {
    /// The running binary as the decoder, with the given address-space limit. Through
    /// `/proc/self/exe` where there is one: the forked child execs the very file the server runs
    /// from, even after an upgrade has replaced or removed the path it was started by (a path
    /// would then run the new version, or nothing).
    pub fn this_binary(memory_mib: u64) -> io::Result<ClipDecoder> {
        let running = Path::new(RUNNING_BINARY);
        let program = if running.exists() { running.to_owned() } else { std::env::current_exe()? };
        Ok(ClipDecoder::new(program, memory_mib))
    }

    /// `program` (a `limelight` binary) as the decoder; tests name the one cargo built.
    pub fn new(program: impl Into<PathBuf>, memory_mib: u64) -> ClipDecoder {
        ClipDecoder { program: program.into(), memory_bytes: memory_mib << 20, cpu_seconds: CPU_SECONDS }
    }

    /// Decodes `bytes` as [`clip::decode`] does, in a child process. The outer error is the
    /// server's (the child could not be started or spoke nonsense); the inner one the file's,
    /// including a child that died on it.
    pub fn decode(
        &self,
        bytes: &[u8],
        hint: Option<&str>,
        limits: &ClipLimits,
    ) -> Result<Result<Clip, ClipError>, DecoderUnavailable> {
        if bytes.len() > limits.max_bytes {
            return Ok(Err(ClipError::TooLarge { bytes: bytes.len(), max: limits.max_bytes }));
        }
        let unavailable = |reason: String| DecoderUnavailable { program: self.program.display().to_string(), reason };
        let mut child = Command::new(&self.program)
            .args([SUBCOMMAND, "--memory-bytes", &self.memory_bytes.to_string()])
            .args(["--cpu-seconds", &self.cpu_seconds.to_string()])
            .env_clear()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| unavailable(e.to_string()))?;
        let _watchdog = Watchdog::start(&child, self.wall_limit());
        let request = Request { hint: hint.map(str::to_owned), limits: limits.clone() };
        let mut stdin = child.stdin.take().expect("stdin is piped");
        let sent = serde_json::to_writer(&mut stdin, &request)
            .map_err(io::Error::from)
            .and_then(|()| stdin.write_all(b"\n"))
            .and_then(|()| stdin.write_all(bytes));
        drop(stdin);
        // A child that died mid-read breaks the pipe; its exit status says why.
        if let Err(e) = sent
            && e.kind() != io::ErrorKind::BrokenPipe
        {
            let _ = child.kill();
            let _ = child.wait();
            return Err(unavailable(e.to_string()));
        }
        let stdout = child.stdout.take().expect("stdout is piped");
        let max_samples = (limits.max_seconds * f64::from(ENCODER_RATE)).ceil() as u64 + 1;
        // read_answer takes the pipe and closes it on return: a child still writing past its
        // answer then fails on its next write instead of blocking the wait below.
        let answer = read_answer(BufReader::new(stdout.take(MAX_LINE_BYTES + max_samples * 4)));
        let status = child.wait().map_err(|e| unavailable(e.to_string()))?;
        if !status.success() {
            return Ok(Err(self.died(status)));
        }
        answer.map_err(|e| unavailable(format!("its answer could not be read: {e}")))
    }

    /// How long a child may take by the clock: its CPU limit only counts while it runs, and one
    /// blocked before reading its input would block the write to it.
    fn wall_limit(&self) -> Duration {
        Duration::from_secs(2 * self.cpu_seconds + 2)
    }

    /// The file's refusal when the child did not finish: most often a limit it reached.
    fn died(&self, status: ExitStatus) -> ClipError {
        use std::os::unix::process::ExitStatusExt;
        let how = match status.signal() {
            Some(signal) => format!("was stopped by signal {signal}"),
            None => format!("exited with {status}"),
        };
        ClipError::Undecodable(format!(
            "the decoder {how} on this file (it may use {} MiB of memory and {} s of CPU)",
            self.memory_bytes >> 20,
            self.cpu_seconds
        ))
    }
}

/// Kills a child that outlives its wall-clock limit, through a pidfd (which names that process
/// alone, even once it is reaped: no other process can be hit by a reused pid). Dropping it ends
/// the watch. Where the kernel has no pidfds (before 5.3) there is no watch: the CPU limit stays.
struct Watchdog {
    _done: Option<mpsc::Sender<()>>,
}

impl Watchdog {
    fn start(child: &std::process::Child, limit: Duration) -> Watchdog {
        let Ok(pidfd) = pidfd_open(Pid::from_child(child), PidfdFlags::empty()) else {
            return Watchdog { _done: None };
        };
        let (done, watch) = mpsc::channel::<()>();
        let spawned = std::thread::Builder::new().name(String::from("limelight-clip-watchdog")).spawn(move || {
            if watch.recv_timeout(limit) == Err(mpsc::RecvTimeoutError::Timeout) {
                let _ = pidfd_send_signal(&pidfd, Signal::KILL);
            }
        });
        Watchdog { _done: spawned.is_ok().then_some(done) }
    }
}

/// The child's answer: its JSON line, then the samples it announces.
fn read_answer(mut out: impl BufRead) -> io::Result<Result<Clip, ClipError>> {
    let mut line = String::new();
    out.read_line(&mut line)?;
    let answer: Answer = serde_json::from_str(&line).map_err(io::Error::from)?;
    let (samples, source_rate, source_channels) = match answer {
        Answer::Refused(e) => return Ok(Err(e)),
        Answer::Clip { samples, source_rate, source_channels } => (samples, source_rate, source_channels),
    };
    let mut raw = vec![0u8; samples.checked_mul(4).ok_or(io::ErrorKind::InvalidData)?];
    out.read_exact(&mut raw)?;
    let samples = raw.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes"))).collect();
    Ok(Ok(Clip { samples, source_rate, source_channels }))
}

/// The child's side (`limelight decode-clip`): limits itself, reads the request from stdin,
/// decodes, and answers on stdout.
pub fn run_child(memory_bytes: u64, cpu_seconds: u64) -> io::Result<()> {
    // Before any byte of the file is read: nothing the file declares can raise these.
    limit(Resource::As, memory_bytes, memory_bytes)?;
    limit(Resource::Cpu, cpu_seconds, cpu_seconds + 1)?;
    limit(Resource::Core, 0, 0)?;
    let mut input = BufReader::new(io::stdin().lock());
    let mut line = String::new();
    (&mut input).take(MAX_LINE_BYTES).read_line(&mut line)?;
    let request: Request = serde_json::from_str(&line).map_err(io::Error::from)?;
    let mut bytes = Vec::new();
    // One byte past the limit is enough for `decode` to refuse it as too large.
    input.take(request.limits.max_bytes as u64 + 1).read_to_end(&mut bytes)?;
    let decoded = clip::decode(&bytes, request.hint.as_deref(), &request.limits);
    drop(bytes);
    let mut out = io::BufWriter::new(io::stdout().lock());
    match decoded {
        Ok(clip) => {
            let header = Answer::Clip {
                samples: clip.samples.len(),
                source_rate: clip.source_rate,
                source_channels: clip.source_channels,
            };
            serde_json::to_writer(&mut out, &header)?;
            out.write_all(b"\n")?;
            for s in &clip.samples {
                out.write_all(&s.to_le_bytes())?;
            }
        }
        Err(e) => {
            serde_json::to_writer(&mut out, &Answer::Refused(e))?;
            out.write_all(b"\n")?;
        }
    }
    out.flush()
}

/// Lowers a limit (never above the hard limit the process already has: raising it is refused).
fn limit(resource: Resource, soft: u64, hard: u64) -> io::Result<()> {
    let now = getrlimit(resource).maximum;
    let cap = |v: u64| Some(now.map_or(v, |m| v.min(m)));
    setrlimit(resource, Rlimit { current: cap(soft), maximum: cap(hard) }).map_err(io::Error::from)
}
