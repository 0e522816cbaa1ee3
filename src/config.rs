//! `ServeConfig`: the `serve` flags checked once at start (limits, addresses, names, keys), in
//! the terms the worker and the HTTP layer use. Nothing downstream re-checks them.

use std::collections::BTreeMap;
use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

use crate::cli::ServeArgs;
use crate::request::validate::OPENAI_VOICES;
use crate::scheduler::{GpuOptions, RATE_WINDOW, ReaderPolicy, WorkerConfig, gpu_present};
use crate::telemetry::LogFormat;
use crate::voice::isolated::ClipDecoder;

/// The CPU engine's decode batch unless `--max-batch` says otherwise.
pub const CPU_MAX_BATCH: usize = 8;
/// The smallest `--max-body-bytes` accepted: below it even a short request would be refused.
pub const MIN_BODY_BYTES: usize = 1024;
/// Positions each request's caches hold on the GPU unless `--context-length` says otherwise
/// (the reference's default).
pub const DEFAULT_CONTEXT: usize = 16384;
/// Context positions kept for a prompt on top of `--max-frames` (the shortest prompt with its
/// system block is about this long; longer prompts get fewer frames, as in the reference).
pub const PROMPT_ROOM: usize = 64;

/// Where generation runs, as asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Device {
    /// The CUDA engine when a supported GPU (compute capability 8.0 or newer) is present, else the CPU.
    Auto,
    /// The CPU reference engine (slow; for development and tests).
    Cpu,
    /// The CUDA engine; refuses to start without a supported GPU.
    Cuda,
}

/// Where generation runs, once `auto` is decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EngineChoice {
    Cpu,
    Cuda(GpuOptions),
}

/// Which checkpoint to serve.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModelSource {
    /// A checkpoint directory in the published layout.
    Dir(PathBuf),
    /// The tiny random-weight checkpoint, synthesized once into this cache directory.
    Demo(PathBuf),
}

impl ModelSource {
    pub fn dir(&self) -> &PathBuf {
        match self {
            ModelSource::Dir(d) | ModelSource::Demo(d) => d,
        }
    }
}

/// The validated `serve` configuration.
#[derive(Clone, PartialEq, Eq)]
pub struct ServeConfig {
    pub model: ModelSource,
    pub device: Device,
    /// The GPU engine's options (used when the device is, or resolves to, CUDA).
    pub gpu: GpuOptions,
    pub listen: SocketAddr,
    pub served_model_name: String,
    /// Other accepted model names; never empty strings, never the served name, no repeats.
    pub model_aliases: Vec<String>,
    /// Bearer keys accepted on every route but `/health` and `/ready`; empty leaves the API open.
    pub api_keys: Vec<String>,
    pub max_queue: usize,
    pub max_input_chars: usize,
    pub max_body_bytes: usize,
    pub max_frames: usize,
    /// `--max-batch`, if given (else the engine's default).
    pub max_batch: Option<usize>,
    pub prefill_chunk: usize,
    pub stall_timeout: Duration,
    /// `--min-read-rate`, in thousandths of real time (a whole number, so the config stays `Eq`).
    pub min_read_rate_milli: u32,
    /// `--max-connections`, `--header-timeout`, `--body-timeout`, `--write-timeout`
    /// (`http::server`, `http::deadline`).
    pub max_connections: usize,
    pub header_timeout: Duration,
    pub body_timeout: Duration,
    pub write_timeout: Duration,
    pub drain_timeout: Duration,
    pub log_format: LogFormat,
    /// Where named voices persist; `None`: in memory only.
    pub voices_dir: Option<PathBuf>,
    /// OpenAI built-in names (lower case) → stored voice names.
    pub voice_aliases: BTreeMap<String, String>,
    pub max_voices: usize,
    pub max_voice_upload_bytes: usize,
    /// Bytes for saved voices' prompt state (`--voice-cache-mib`).
    pub voice_cache_bytes: usize,
    /// The codec on its own thread, overlapping the steps (`--no-codec-thread` turns it off).
    pub codec_thread: bool,
    /// How reference clips are decoded (`--clip-decode-memory-mib`), and how many at once
    /// (`--clip-decoders`).
    pub clip_decoder: ClipDecoder,
    pub clip_decoders: usize,
}

/// A flag the server cannot start with; says which and why.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("`--device cuda`: {0}")]
    CudaUnavailable(String),
    #[error("`--{flag}` applies to the CUDA engine only; it cannot be used with `--device cpu`")]
    GpuFlagOnCpu { flag: &'static str },
    #[error(
        "`--context-length {context}` leaves no room for `--max-frames {max_frames}` after a prompt: it must be at least max-frames + {PROMPT_ROOM}"
    )]
    ContextTooShort { context: usize, max_frames: usize },
    #[error("`--{flag}` must be at least {min}; got {value}")]
    TooSmall { flag: &'static str, min: usize, value: usize },
    #[error("`--{flag}` {value} is too large")]
    TooLarge { flag: &'static str, value: usize },
    #[error("`--{flag}` must be from {range}; got {value}")]
    OutOfRange { flag: &'static str, value: String, range: &'static str },
    #[error("`--served-model-name` must not be empty")]
    EmptyModelName,
    #[error("`--host {host}`/`--port {port}`: {message}")]
    Listen { host: String, port: u16, message: String },
    #[error("`--api-key-file {path}`: {message}")]
    KeyFile { path: PathBuf, message: String },
    #[error("`--api-key` must not be empty")]
    EmptyKey,
    #[error("`--demo`: no cache directory (set XDG_CACHE_HOME or HOME)")]
    NoCacheDir,
    #[error("give `--model DIR` or `--demo`")]
    NoModel,
    #[error("`--voice-alias {0}`: {1}")]
    VoiceAlias(String, String),
    #[error("the clip decoder (this binary, run as a child): {0}")]
    ClipDecoder(std::io::Error),
}

impl ServeConfig {
    /// Checks every flag; reads the key file and resolves the listen address.
    pub fn from_args(args: &ServeArgs) -> Result<ServeConfig, ConfigError> {
        if args.device == Device::Cpu {
            if args.gpu_memory_budget.is_some() {
                return Err(ConfigError::GpuFlagOnCpu { flag: "gpu-memory-budget" });
            }
            if args.context_length.is_some() {
                return Err(ConfigError::GpuFlagOnCpu { flag: "context-length" });
            }
            if args.no_cuda_graph {
                return Err(ConfigError::GpuFlagOnCpu { flag: "no-cuda-graph" });
            }
        }
        let model = match (&args.model, args.demo) {
            (_, true) => ModelSource::Demo(demo_cache_dir()?),
            (Some(dir), false) => ModelSource::Dir(dir.clone()),
            (None, false) => return Err(ConfigError::NoModel),
        };
        at_least("max-queue", 1, args.max_queue)?;
        at_least("max-input-chars", 1, args.max_input_chars)?;
        at_least("max-frames", 1, args.max_frames)?;
        at_least("max-body-bytes", MIN_BODY_BYTES, args.max_body_bytes)?;
        at_least("prefill-chunk", 1, args.prefill_chunk)?;
        at_least("max-voices", 1, args.max_voices)?;
        at_least("max-voice-upload-bytes", 1024, args.max_voice_upload_bytes)?;
        at_least("stall-timeout", 1, args.stall_timeout as usize)?;
        at_least("max-connections", 1, args.max_connections)?;
        if args.max_connections > MAX_CONNECTIONS {
            return Err(ConfigError::TooLarge { flag: "max-connections", value: args.max_connections });
        }
        at_least("header-timeout", 1, args.header_timeout as usize)?;
        at_least("body-timeout", 1, args.body_timeout as usize)?;
        at_least("write-timeout", 1, args.write_timeout as usize)?;
        at_least("clip-decoders", 1, args.clip_decoders)?;
        // A child needs its own binary's mappings and a decoded minute of audio.
        at_least("clip-decode-memory-mib", MIN_CLIP_DECODE_MIB, args.clip_decode_memory_mib as usize)?;
        // Above 1× no live listener keeps up; NaN and negatives are nonsense.
        if !(0.0..=1.0).contains(&args.min_read_rate) {
            return Err(ConfigError::OutOfRange {
                flag: "min-read-rate",
                value: args.min_read_rate.to_string(),
                range: "0 to 1",
            });
        }
        if let Some(n) = args.max_batch {
            at_least("max-batch", 1, n)?;
            if n > MAX_BATCH {
                return Err(ConfigError::TooLarge { flag: "max-batch", value: n });
            }
        }
        let served_model_name = args.served_model_name.trim().to_owned();
        if served_model_name.is_empty() {
            return Err(ConfigError::EmptyModelName);
        }
        let context = args.context_length.unwrap_or(DEFAULT_CONTEXT);
        if args.device != Device::Cpu && context < args.max_frames + PROMPT_ROOM {
            return Err(ConfigError::ContextTooShort { context, max_frames: args.max_frames });
        }
        Ok(ServeConfig {
            model,
            device: args.device,
            gpu: GpuOptions {
                ordinal: 0,
                memory_budget: args.gpu_memory_budget,
                context,
                graph: !args.no_cuda_graph,
                weights_io: args.weights_io,
                weights_readers: match args.weights_readers {
                    0 => default_weights_readers(),
                    n => n,
                },
            },
            listen: resolve(&args.host, args.port)?,
            model_aliases: aliases(&served_model_name, &args.model_aliases),
            served_model_name,
            api_keys: api_keys(args)?,
            max_queue: args.max_queue,
            max_input_chars: args.max_input_chars,
            max_body_bytes: args.max_body_bytes,
            max_frames: args.max_frames,
            max_batch: args.max_batch,
            prefill_chunk: args.prefill_chunk,
            stall_timeout: Duration::from_secs(args.stall_timeout),
            min_read_rate_milli: (args.min_read_rate * 1000.0).round() as u32,
            max_connections: args.max_connections,
            header_timeout: Duration::from_secs(args.header_timeout),
            body_timeout: Duration::from_secs(args.body_timeout),
            write_timeout: Duration::from_secs(args.write_timeout),
            drain_timeout: Duration::from_secs(args.drain_timeout),
            log_format: args.log_format,
            voices_dir: args.voices_dir.clone(),
            voice_aliases: voice_aliases(&args.voice_aliases)?,
            max_voices: args.max_voices,
            max_voice_upload_bytes: args.max_voice_upload_bytes,
            voice_cache_bytes: args
                .voice_cache_mib
                .checked_mul(1 << 20)
                .ok_or(ConfigError::TooLarge { flag: "voice-cache-mib", value: args.voice_cache_mib })?,
            codec_thread: !args.no_codec_thread,
            clip_decoder: ClipDecoder::this_binary(args.clip_decode_memory_mib).map_err(ConfigError::ClipDecoder)?,
            clip_decoders: args.clip_decoders,
        })
    }

    /// Decides `--device auto` (a supported GPU present → CUDA) and checks `--device cuda` has one.
    pub fn engine(&self) -> Result<EngineChoice, ConfigError> {
        match (self.device, gpu_present(self.gpu.ordinal)) {
            (Device::Cpu, _) | (Device::Auto, Err(_)) => Ok(EngineChoice::Cpu),
            (Device::Auto | Device::Cuda, Ok(())) => Ok(EngineChoice::Cuda(self.gpu.clone())),
            (Device::Cuda, Err(why)) => Err(ConfigError::CudaUnavailable(why)),
        }
    }

    /// Whether `name` is the served model or one of its aliases.
    pub fn accepts_model(&self, name: &str) -> bool {
        name == self.served_model_name || self.model_aliases.iter().any(|a| a == name)
    }

    pub fn worker_config(&self) -> WorkerConfig {
        WorkerConfig {
            model_dir: self.model.dir().clone(),
            max_queue: self.max_queue,
            default_max_frames: self.max_frames,
            served_model_name: self.served_model_name.clone(),
            model_aliases: self.model_aliases.clone(),
            reader: ReaderPolicy {
                stall_timeout: self.stall_timeout,
                min_read_rate: f64::from(self.min_read_rate_milli) / 1000.0,
                rate_window: RATE_WINDOW,
            },
        }
    }
}

/// Never prints the API key.
impl fmt::Debug for ServeConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServeConfig")
            .field("model", &self.model)
            .field("device", &self.device)
            .field("gpu", &self.gpu)
            .field("listen", &self.listen)
            .field("served_model_name", &self.served_model_name)
            .field("model_aliases", &self.model_aliases)
            .field("api_keys", &format_args!("<{} redacted>", self.api_keys.len()))
            .field("max_queue", &self.max_queue)
            .field("max_input_chars", &self.max_input_chars)
            .field("max_body_bytes", &self.max_body_bytes)
            .field("max_frames", &self.max_frames)
            .field("max_batch", &self.max_batch)
            .field("prefill_chunk", &self.prefill_chunk)
            .field("stall_timeout", &self.stall_timeout)
            .field("max_connections", &self.max_connections)
            .field("header_timeout", &self.header_timeout)
            .field("body_timeout", &self.body_timeout)
            .field("write_timeout", &self.write_timeout)
            .field("min_read_rate_milli", &self.min_read_rate_milli)
            .field("drain_timeout", &self.drain_timeout)
            .field("log_format", &self.log_format)
            .field("voices_dir", &self.voices_dir)
            .field("voice_aliases", &self.voice_aliases)
            .field("max_voices", &self.max_voices)
            .field("max_voice_upload_bytes", &self.max_voice_upload_bytes)
            .field("voice_cache_bytes", &self.voice_cache_bytes)
            .field("codec_thread", &self.codec_thread)
            .field("clip_decoder", &self.clip_decoder)
            .field("clip_decoders", &self.clip_decoders)
            .finish()
    }
}

/// `--weights-readers 0`: half the cores, at most 8 (at 4, a warm start copied 10.5 GiB/s out of
/// the page cache on the 16-core H100 machine, `docs/perf/2026-12-05-load.md`).
fn default_weights_readers() -> usize {
    std::thread::available_parallelism().map_or(4, |n| (n.get() / 2).clamp(1, 8))
}

/// The smallest `--clip-decode-memory-mib`.
const MIN_CLIP_DECODE_MIB: usize = 256;

/// The largest `--max-connections`: far above any descriptor limit, and within what the accept
/// loop counts (`u32` permits).
const MAX_CONNECTIONS: usize = 1 << 20;
/// The most streams one step may take (`--max-batch`): the GPU's attention decode keeps a count
/// per (row, kv head) of a step in a fixed table (`backend::cuda::attention::MERGE_COUNTS`).
pub const MAX_BATCH: usize = 4096;
// Checked when the crate compiles: that table holds MAX_BATCH rows of up to 16 kv heads.
#[cfg(feature = "cuda")]
const _: () = assert!(MAX_BATCH * 16 <= crate::backend::cuda::attention::MERGE_COUNTS);

fn at_least(flag: &'static str, min: usize, value: usize) -> Result<(), ConfigError> {
    if value < min { Err(ConfigError::TooSmall { flag, min, value }) } else { Ok(()) }
}

/// Aliases as given, minus empty ones (`--model-alias ''` turns them all off), the served name
/// itself, and repeats.
fn aliases(served: &str, given: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for alias in given.iter().map(|a| a.trim()) {
        if !alias.is_empty() && alias != served && !out.iter().any(|a| a == alias) {
            out.push(alias.to_owned());
        }
    }
    out
}

fn resolve(host: &str, port: u16) -> Result<SocketAddr, ConfigError> {
    let listen_error = |message: String| ConfigError::Listen { host: host.to_owned(), port, message };
    let mut addrs = (host, port).to_socket_addrs().map_err(|e| listen_error(e.to_string()))?;
    addrs.next().ok_or_else(|| listen_error(String::from("the host resolves to no address")))
}

/// `--api-key`, or every key in `--api-key-file`: one per line, surrounding whitespace ignored,
/// blank lines and `#` comments skipped (several keys let a key be rotated without downtime).
/// `alloy=narrator` pairs: an OpenAI built-in name (any case) → a valid stored-voice name.
fn voice_aliases(pairs: &[String]) -> Result<BTreeMap<String, String>, ConfigError> {
    let mut out = BTreeMap::new();
    for pair in pairs.iter().filter(|p| !p.trim().is_empty()) {
        let bad = |why: &str| ConfigError::VoiceAlias(pair.clone(), why.to_owned());
        let (from, to) = pair.split_once('=').ok_or_else(|| bad("write it as BUILTIN=VOICE, e.g. alloy=narrator"))?;
        let from = from.trim().to_ascii_lowercase();
        if !OPENAI_VOICES.contains(&from.as_str()) {
            return Err(bad("the left side must be one of OpenAI's built-in voice names"));
        }
        let to = to.trim();
        crate::voice::store::validate_name(to).map_err(|e| bad(&e.to_string()))?;
        if out.insert(from, to.to_owned()).is_some() {
            return Err(bad("that built-in name is mapped twice"));
        }
    }
    Ok(out)
}

fn api_keys(args: &ServeArgs) -> Result<Vec<String>, ConfigError> {
    match (&args.api_key, &args.api_key_file) {
        (Some(key), _) if key.trim().is_empty() => Err(ConfigError::EmptyKey),
        (Some(key), _) => Ok(vec![key.trim().to_owned()]),
        (None, Some(path)) => {
            let key_file_error = |message: String| ConfigError::KeyFile { path: path.clone(), message };
            let text = std::fs::read_to_string(path).map_err(|e| key_file_error(e.to_string()))?;
            let keys: Vec<String> = text
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with('#'))
                .map(str::to_owned)
                .collect();
            if keys.is_empty() {
                return Err(key_file_error(String::from("the file holds no key")));
            }
            Ok(keys)
        }
        (None, None) => Ok(Vec::new()),
    }
}

/// `$XDG_CACHE_HOME/limelight/demo-tiny`, else `~/.cache/limelight/demo-tiny`.
fn demo_cache_dir() -> Result<PathBuf, ConfigError> {
    let base = match (std::env::var_os("XDG_CACHE_HOME"), std::env::var_os("HOME")) {
        (Some(xdg), _) if !xdg.is_empty() => PathBuf::from(xdg),
        (_, Some(home)) if !home.is_empty() => PathBuf::from(home).join(".cache"),
        _ => return Err(ConfigError::NoCacheDir),
    };
    Ok(base.join("limelight").join("demo-tiny"))
}

#[cfg(test)]
mod tests {
    use crate::checkpoint::sequential::ReadMode;
    use clap::Parser;

    use super::*;
    use crate::cli::{Cli, Command};

    fn parse(flags: &[&str]) -> Result<ServeConfig, ConfigError> {
        let argv = ["limelight", "serve"].iter().chain(flags);
        match Cli::try_parse_from(argv).expect("flags parse").command {
            Command::Serve(args) => ServeConfig::from_args(&args),
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn defaults_follow_the_contract() {
        let c = parse(&["--model", "/m"]).unwrap();
        assert_eq!(c.model, ModelSource::Dir("/m".into()));
        assert_eq!(c.listen, "127.0.0.1:8080".parse().unwrap());
        assert_eq!(c.served_model_name, "drama-3");
        assert_eq!(c.model_aliases, ["tts-1", "tts-1-hd", "gpt-4o-mini-tts"]);
        assert_eq!((c.max_input_chars, c.max_frames), (100_000, 2048));
        assert!(c.api_keys.is_empty());
        assert_eq!(c.device, Device::Auto);
        assert_eq!(
            c.gpu,
            GpuOptions {
                ordinal: 0,
                memory_budget: None,
                context: DEFAULT_CONTEXT,
                graph: true,
                weights_io: ReadMode::Auto,
                weights_readers: default_weights_readers(),
            }
        );
        assert!(c.accepts_model("tts-1") && c.accepts_model("drama-3") && !c.accepts_model("whisper-1"));
        assert_eq!(
            (c.max_connections, c.header_timeout, c.body_timeout, c.write_timeout),
            (4096, Duration::from_secs(10), Duration::from_secs(30), Duration::from_secs(30))
        );
        let reader = c.worker_config().reader;
        assert_eq!((reader.stall_timeout, reader.min_read_rate), (Duration::from_secs(30), 0.5));
        // Clips are decoded by this very binary (the running file, not its path), under 2 GiB.
        assert_eq!(c.clip_decoder.program, std::path::Path::new("/proc/self/exe"));
        assert_eq!((c.clip_decoder.memory_bytes, c.clip_decoders), (2 << 30, 4));
    }

    #[test]
    fn the_least_read_rate_is_a_fraction_of_real_time() {
        let rate = |v: &str| {
            parse(&["--model", "/m", &format!("--min-read-rate={v}")]).map(|c| c.worker_config().reader.min_read_rate)
        };
        assert_eq!(rate("0").unwrap(), 0.0);
        assert_eq!(rate("0.25").unwrap(), 0.25);
        for bad in ["1.5", "-0.1", "NaN"] {
            let e = rate(bad).unwrap_err().to_string();
            assert!(e.contains("--min-read-rate") && e.contains(bad), "{bad}: {e}");
        }
    }

    #[test]
    fn aliases_drop_empties_repeats_and_the_served_name() {
        let c = parse(&["--model", "/m", "--model-alias", "a,drama-3", "--model-alias", "a", "--model-alias", "b"]);
        assert_eq!(c.unwrap().model_aliases, ["a", "b"]);
        assert!(parse(&["--model", "/m", "--model-alias", ""]).unwrap().model_aliases.is_empty());
    }

    #[test]
    fn bad_flags_are_refused_by_name() {
        let refused = |flags: &[&str]| parse(flags).unwrap_err().to_string();
        assert!(
            refused(&["--model", "/m", "--device", "cpu", "--gpu-memory-budget", "8GiB"])
                .contains("--gpu-memory-budget")
        );
        assert!(
            refused(&["--model", "/m", "--device", "cpu", "--context-length", "9000"]).contains("--context-length")
        );
        assert!(refused(&["--model", "/m", "--device", "cpu", "--no-cuda-graph"]).contains("--no-cuda-graph"));
        assert!(refused(&["--model", "/m", "--context-length", "2000"]).contains("--max-frames 2048"));
        assert!(refused(&["--model", "/m", "--max-queue", "0"]).contains("--max-queue"));
        assert!(refused(&["--model", "/m", "--max-body-bytes", "10"]).contains("--max-body-bytes"));
        assert!(refused(&["--model", "/m", "--max-connections", "0"]).contains("--max-connections"));
        assert!(refused(&["--model", "/m", "--clip-decoders", "0"]).contains("--clip-decoders"));
        assert!(refused(&["--model", "/m", "--clip-decode-memory-mib", "64"]).contains("--clip-decode-memory-mib"));
        assert!(refused(&["--model", "/m", "--max-connections", "99999999999"]).contains("--max-connections"));
        assert!(refused(&["--model", "/m", "--max-batch", "0"]).contains("--max-batch"));
        assert!(refused(&["--model", "/m", "--max-batch", "4097"]).contains("--max-batch"));
        assert!(refused(&["--model", "/m", "--header-timeout", "0"]).contains("--header-timeout"));
        assert!(refused(&["--model", "/m", "--body-timeout", "0"]).contains("--body-timeout"));
        assert!(refused(&["--model", "/m", "--served-model-name", " "]).contains("--served-model-name"));
        assert!(refused(&["--model", "/m", "--api-key", " "]).contains("--api-key"));
        assert!(refused(&["--model", "/m", "--api-key-file", "/nonexistent/key"]).contains("--api-key-file"));
        assert!(Cli::try_parse_from(["limelight", "serve"]).is_err(), "--model or --demo is required");
        assert!(Cli::try_parse_from(["limelight", "serve", "--model", "/m", "--demo"]).is_err());
    }

    #[test]
    fn cuda_graph_is_on_unless_turned_off() {
        assert!(parse(&["--model", "/m"]).unwrap().gpu.graph);
        assert!(!parse(&["--model", "/m", "--no-cuda-graph"]).unwrap().gpu.graph);
    }

    #[test]
    fn the_cpu_device_never_probes_for_a_gpu() {
        let c = parse(&["--model", "/m", "--device", "cpu"]).unwrap();
        assert_eq!(c.engine().unwrap(), EngineChoice::Cpu);
    }

    /// On a machine without a GPU (CI) `auto` falls back to the CPU and `cuda` is refused with
    /// the reason; with one, both pick CUDA with the given options.
    #[test]
    fn auto_and_cuda_follow_the_gpu() {
        let auto = parse(&["--model", "/m", "--context-length", "4096", "--max-frames", "1000"]).unwrap();
        let cuda = parse(&["--model", "/m", "--device", "cuda"]).unwrap();
        match gpu_present(0) {
            Ok(()) => {
                assert!(matches!(auto.engine().unwrap(), EngineChoice::Cuda(GpuOptions { context: 4096, .. })));
                assert!(matches!(cuda.engine().unwrap(), EngineChoice::Cuda(_)));
            }
            Err(why) => {
                assert_eq!(auto.engine().unwrap(), EngineChoice::Cpu);
                let refused = cuda.engine().unwrap_err().to_string();
                assert!(refused.contains("--device cuda") && refused.contains(&why), "{refused}");
            }
        }
    }

    #[test]
    fn the_key_file_gives_one_key_a_line_and_debug_hides_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys");
        std::fs::write(&path, "  sk-first \n\n# old: sk-retired\nsk-second\n").unwrap();
        let c = parse(&["--model", "/m", "--api-key-file", path.to_str().unwrap()]).unwrap();
        assert_eq!(c.api_keys, ["sk-first", "sk-second"]);
        assert!(!format!("{c:?}").contains("sk-"));
        std::fs::write(&path, "# nothing\n\n").unwrap();
        let refused = parse(&["--model", "/m", "--api-key-file", path.to_str().unwrap()]).unwrap_err();
        assert!(refused.to_string().contains("no key"), "{refused}");
    }
}
