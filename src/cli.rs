//! Command-line interface: `serve`, `checkpoint synth`, `inspect`, `say`, `trace`.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::config::Device;
use crate::synth::presets::Preset;
use crate::telemetry::LogFormat;

#[derive(Debug, Parser)]
#[command(name = "limelight", version, about = "OpenAI-compatible text-to-speech server for Fish Audio Drama 3")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve OpenAI's speech API over HTTP (`POST /v1/audio/speech`, `/v1/models`, `/health`,
    /// `/ready`, `/metrics`). Every flag can also be set by its `LIMELIGHT_*` variable.
    Serve(ServeArgs),
    /// Work with checkpoints in the published `fishaudio/drama-3` layout.
    #[command(subcommand)]
    Checkpoint(CheckpointCommand),
    /// Validate a checkpoint directory and print a summary; exits 1 if it is refused.
    Inspect(InspectArgs),
    /// Speak a text into a WAV file with the CPU reference engine.
    Say(SayArgs),
    /// Dump every stage's tensors for given prompt rows (for comparison with references).
    Trace(TraceArgs),
    /// Measure the engine on this machine's GPU.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Internal: decode one reference clip from stdin under memory and CPU limits, for the
    /// server (`voice::isolated`).
    #[command(name = "decode-clip", hide = true)]
    DecodeClip(DecodeClipArgs),
}

/// `limelight decode-clip`: the limits the child sets on itself before it reads the clip.
#[derive(Debug, Args)]
pub struct DecodeClipArgs {
    #[arg(long)]
    pub memory_bytes: u64,
    #[arg(long)]
    pub cpu_seconds: u64,
}

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Load a checkpoint on the GPU and time the backbone: a prefill, then decode rows; compares
    /// decode with its floor (bytes per row / measured copy bandwidth).
    Backbone(BenchBackboneArgs),
    /// Load a checkpoint on the GPU and time the whole engine one frame at a time: the prompt,
    /// the per-frame step as a CUDA graph and as the host loop (against its floor), the codec.
    Engine(BenchEngineArgs),
    /// Load a checkpoint on the GPU and time the decode batch: B streams stepped together, for
    /// each batch size, against the batch's floor.
    Batch(BenchBatchArgs),
    /// Drive a running server with closed-loop streaming clients (a load test).
    Serve(BenchServeArgs),
    /// A long run of closed-loop clients with random formats, deliveries and disconnects,
    /// sampling the server's RSS, descriptors and memory (fails on any 5xx or broken stream).
    Soak(BenchSoakArgs),
    /// Load a checkpoint's codec encoder on the GPU and time the encode of a reference clip.
    Encode(BenchEncodeArgs),
}

#[derive(Debug, Args)]
pub struct BenchEncodeArgs {
    /// Checkpoint directory.
    #[arg(long)]
    pub model: PathBuf,
    /// Length of the synthetic clip timed (seconds).
    #[arg(long, default_value_t = 10.0)]
    pub seconds: f64,
    /// Timed encodes (after one warm-up).
    #[arg(long, default_value_t = 5)]
    pub repeats: usize,
    /// Length of the clip also encoded on the CPU to compare codes (seconds; the CPU encoder is
    /// slow at full size).
    #[arg(long, default_value_t = 0.5)]
    pub check_seconds: f64,
    /// Hard cap on GPU memory (bytes, or with a K/M/G/KiB/MiB/GiB suffix).
    #[arg(long, value_parser = parse_bytes)]
    pub gpu_memory_budget: Option<u64>,
    /// Also write every number as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct BenchBatchArgs {
    /// Checkpoint directory.
    #[arg(long)]
    pub model: PathBuf,
    /// Batch sizes to time (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = [1, 8, 32, 64, 128])]
    pub batch: Vec<usize>,
    /// Steps timed per batch size.
    #[arg(long, default_value_t = 32)]
    pub frames: usize,
    /// Positions each stream's caches are sized for.
    #[arg(long, default_value_t = 1024)]
    pub context_length: usize,
    /// Hard cap on GPU memory; default: free memory at start minus 1 GiB.
    #[arg(long, value_parser = parse_bytes)]
    pub gpu_memory_budget: Option<u64>,
    /// Batch sizes whose whole step to profile per kernel (CUDA events around every launch,
    /// after the timed steps; comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub profile: Vec<usize>,
    /// Draw on the host, as `serve --no-cuda-graph` does, instead of on the GPU.
    #[arg(long)]
    pub host_draws: bool,
    /// Run every step's launches one by one, never the step captured as a CUDA graph.
    #[arg(long)]
    pub no_step_graphs: bool,
    /// Prompt rows of each stream (the bench text repeated and cut); default: the text's own.
    #[arg(long)]
    pub prompt_rows: Option<usize>,
    /// Also write every number as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

#[derive(Clone, Debug, Args)]
pub struct BenchSoakArgs {
    /// The server, `http://HOST:PORT`.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// Closed-loop clients.
    #[arg(long, default_value_t = 64)]
    pub clients: usize,
    /// Seconds to run.
    #[arg(long, default_value_t = 1800)]
    pub duration_secs: u64,
    /// Share of requests whose client leaves at a random moment.
    #[arg(long, default_value_t = 0.25)]
    pub disconnect: f64,
    /// Each request asks for 8 to this many frames.
    #[arg(long, default_value_t = 160)]
    pub max_frames: usize,
    /// The server's process id, for its RSS and open descriptors (`/proc`; same host only).
    #[arg(long)]
    pub server_pid: Option<u32>,
    /// Seconds between two samples.
    #[arg(long, default_value_t = 10)]
    pub sample_every_secs: u64,
    /// Seed of the clients' random plan.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// The text every request speaks.
    #[arg(long, default_value = "A long night of many voices, each stream as if alone.")]
    pub text: String,
    /// The model name sent.
    #[arg(long, default_value = "drama-3")]
    pub served_model_name: String,
    #[arg(long, env = "LIMELIGHT_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Seconds one request may take before it counts as failed.
    #[arg(long, default_value_t = 600)]
    pub timeout_secs: u64,
    /// Folder for soak.json, soak.csv and soak.svg.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct BenchServeArgs {
    /// The server, `http://HOST:PORT`.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// Client counts to run, one after another (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = [1, 8, 32, 64, 128])]
    pub clients: Vec<usize>,
    /// Requests each client sends, one after another.
    #[arg(long, default_value_t = 2)]
    pub requests: usize,
    /// `max_frames` of every request.
    #[arg(long, default_value_t = 200)]
    pub frames: usize,
    /// The text every request speaks.
    #[arg(long, default_value = "Hello from limelight: many listeners at once, each stream as if alone.")]
    pub text: String,
    /// The model name sent.
    #[arg(long, default_value = "drama-3")]
    pub served_model_name: String,
    #[arg(long, env = "LIMELIGHT_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Seconds one request may take before it counts as failed.
    #[arg(long, default_value_t = 600)]
    pub timeout_secs: u64,
    /// Also write every number as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct BenchEngineArgs {
    /// Checkpoint directory.
    #[arg(long)]
    pub model: PathBuf,
    /// Frames timed per path (EOS does not stop them).
    #[arg(long, default_value_t = 256)]
    pub frames: usize,
    /// Prompt rows (the bench text repeated and cut); default: the text's own.
    #[arg(long)]
    pub prompt_rows: Option<usize>,
    /// Positions the caches are sized for.
    #[arg(long, default_value_t = 4096)]
    pub context_length: usize,
    /// Prompt rows per prefill chunk of the timed (graph) path, as `serve --prefill-chunk`.
    #[arg(long, default_value_t = crate::engine::generate::PREFILL_CHUNK)]
    pub prefill_chunk: usize,
    /// Hard cap on GPU memory; default: free memory at start minus 1 GiB.
    #[arg(long, value_parser = parse_bytes)]
    pub gpu_memory_budget: Option<u64>,
    /// After the timings, run one more prompt (`prompt`) or two graph frame steps (`step`)
    /// between cuProfilerStart and cuProfilerStop, for `ncu --profile-from-start off`
    /// (`tools/gpu/step-ncu.sh`).
    #[arg(long, value_enum)]
    pub profiler_range: Option<ProfilerRange>,
    /// Also write every number as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// What `bench engine --profiler-range` brackets for an external profiler.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ProfilerRange {
    /// One prompt's prefill (backbone and tower), synced.
    Prompt,
    /// Two frame steps as CUDA graph replays, after eight unprofiled ones.
    Step,
}

#[derive(Debug, Args)]
pub struct BenchBackboneArgs {
    /// Checkpoint directory.
    #[arg(long)]
    pub model: PathBuf,
    #[arg(long, default_value_t = 200)]
    pub prompt_rows: usize,
    #[arg(long, default_value_t = 100)]
    pub decode_rows: usize,
    /// Positions the KV caches are sized for.
    #[arg(long, default_value_t = 16384)]
    pub context_length: usize,
    /// Hard cap on GPU memory (bytes, or with a K/M/G/KiB/MiB/GiB suffix); default: free memory
    /// at start minus 1 GiB.
    #[arg(long, value_parser = parse_bytes)]
    pub gpu_memory_budget: Option<u64>,
    /// Also write every number as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// `123`, `64G`, `64GB`, `64GiB`, `512MiB`, `1.5G` → bytes (K/M/G/T are powers of 1000, KiB/MiB/GiB/TiB of 1024).
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let value: f64 = number.parse().map_err(|_| format!("`{text}` is not a size (e.g. 64GiB)"))?;
    let scale: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "m" | "mb" => 1e6,
        "g" | "gb" => 1e9,
        "t" | "tb" => 1e12,
        "kib" => 1024.0,
        "mib" => 1024f64.powi(2),
        "gib" => 1024f64.powi(3),
        "tib" => 1024f64.powi(4),
        other => return Err(format!("`{other}` is not a size unit (use K, M, G, T, KiB, MiB, GiB or TiB)")),
    };
    let bytes = value * scale;
    if !bytes.is_finite() || bytes < 1.0 || bytes > u64::MAX as f64 {
        return Err(format!("`{text}` is not a usable size"));
    }
    Ok(bytes as u64)
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Checkpoint directory in the published `fishaudio/drama-3` layout.
    #[arg(long, env = "LIMELIGHT_MODEL", required_unless_present = "demo", conflicts_with = "demo")]
    pub model: Option<PathBuf>,
    /// Serve a tiny random-weight checkpoint (written once into the cache directory) on the chosen device:
    /// exercises the whole API in seconds, but the "speech" is noise.
    #[arg(long, env = "LIMELIGHT_DEMO")]
    pub demo: bool,
    /// Where generation runs.
    #[arg(long, value_enum, env = "LIMELIGHT_DEVICE", default_value = "auto")]
    pub device: Device,
    /// Hard cap on GPU memory (bytes, or with a K/M/G/KiB/MiB/GiB suffix); the model is refused
    /// at start if it does not fit. Default: free memory at start minus 1 GiB.
    #[arg(long, env = "LIMELIGHT_GPU_MEMORY_BUDGET", value_parser = parse_bytes)]
    pub gpu_memory_budget: Option<u64>,
    /// Positions (prompt rows + audio frames) each request's GPU caches hold; default 16384.
    #[arg(long, env = "LIMELIGHT_CONTEXT_LENGTH")]
    pub context_length: Option<usize>,
    /// How the GPU engine reads the weights at start (front to back, by several threads):
    /// `auto` copies pieces the page cache holds and reads the rest by direct I/O; `direct`
    /// reads everything by direct I/O (a cold start's speed); `cached` reads through the page
    /// cache. Where the file system refuses direct I/O, reads fall back to the page cache.
    #[arg(long, value_enum, env = "LIMELIGHT_WEIGHTS_IO", default_value = "auto")]
    pub weights_io: crate::checkpoint::sequential::ReadMode,
    /// Threads reading the weights at start: the disk's queue depth on a cold start, the cores
    /// copying out of the page cache on a warm one. 0: half the cores, at most 8.
    #[arg(long, env = "LIMELIGHT_WEIGHTS_READERS", default_value_t = 0)]
    pub weights_readers: usize,
    /// Host round trips instead of the device-side step: with `--max-batch 1`, each frame as
    /// separate launches instead of one captured CUDA graph; with a batch, the draws on the host
    /// instead of the GPU (same audio, slower: for comparisons and as a fallback).
    #[arg(long, env = "LIMELIGHT_NO_CUDA_GRAPH")]
    pub no_cuda_graph: bool,
    /// Decode audio inside each step instead of on the codec's own thread (and, on the GPU, its
    /// own stream) overlapping the next steps (same audio: for comparisons and as a fallback).
    #[arg(long, env = "LIMELIGHT_NO_CODEC_THREAD")]
    pub no_codec_thread: bool,
    /// Streams the engine steps together, one frame each per step. Default: on the GPU as many
    /// as the memory budget holds at `--context-length` (at most 256; 1 while the CUDA-graph
    /// step serves one stream at a time, see `--no-cuda-graph`); on the CPU 8. At most 4096.
    #[arg(long, env = "LIMELIGHT_MAX_BATCH")]
    pub max_batch: Option<usize>,
    /// Prompt rows run between two steps of the batch: bounds how long a new request's prompt
    /// holds up the streams already speaking.
    #[arg(long, env = "LIMELIGHT_PREFILL_CHUNK", default_value_t = crate::engine::generate::PREFILL_CHUNK)]
    pub prefill_chunk: usize,
    /// Seconds a client may stop reading (its buffered audio full) before its request is given
    /// up; the rest of the batch goes on meanwhile.
    #[arg(long, env = "LIMELIGHT_STALL_TIMEOUT", default_value_t = 30)]
    pub stall_timeout: u64,
    /// Least rate, in multiples of real time, at which a streaming client must take its audio
    /// while its buffer is full, measured over 10 s; a slower one is given up and its slot freed.
    /// 0 turns the check off.
    #[arg(long, env = "LIMELIGHT_MIN_READ_RATE", default_value_t = 0.5)]
    pub min_read_rate: f64,
    /// Address to listen on; use 0.0.0.0 to accept connections from other machines.
    #[arg(long, env = "LIMELIGHT_HOST", default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0 picks a free one; the log says which).
    #[arg(long, env = "LIMELIGHT_PORT", default_value_t = 8080)]
    pub port: u16,
    /// The model id clients send and `/v1/models` lists.
    #[arg(long, env = "LIMELIGHT_SERVED_MODEL_NAME", default_value = "drama-3")]
    pub served_model_name: String,
    /// Another accepted model id (repeat, or separate with commas); `--model-alias ''` accepts none.
    #[arg(
        long = "model-alias",
        env = "LIMELIGHT_MODEL_ALIAS",
        value_delimiter = ',',
        default_values = ["tts-1", "tts-1-hd", "gpt-4o-mini-tts"]
    )]
    pub model_aliases: Vec<String>,
    /// Require `Authorization: Bearer KEY` on every route but `/health` and `/ready`.
    #[arg(long, env = "LIMELIGHT_API_KEY", hide_env_values = true, conflicts_with = "api_key_file")]
    pub api_key: Option<String>,
    /// Read API keys from this file, one per line (`#` comments and blank lines skipped); keeps
    /// keys out of `ps`.
    #[arg(long, env = "LIMELIGHT_API_KEY_FILE")]
    pub api_key_file: Option<PathBuf>,
    /// Requests that may wait for the engine; more are refused with 429 and `Retry-After`.
    #[arg(long, env = "LIMELIGHT_MAX_QUEUE", default_value_t = 16)]
    pub max_queue: usize,
    /// Longest `input` (and `instructions`), in characters. Long text runs as chunks of one
    /// request, so a chapter fits (OpenAI's own limit is 4096).
    #[arg(long, env = "LIMELIGHT_MAX_INPUT_CHARS", default_value_t = crate::http::DEFAULT_MAX_INPUT_CHARS)]
    pub max_input_chars: usize,
    /// Open HTTP connections at most; more are answered 503 (`too_many_connections`) and closed.
    /// Keep it below the process's descriptor limit (the units set `LimitNOFILE=65536`).
    #[arg(long, env = "LIMELIGHT_MAX_CONNECTIONS", default_value_t = 4096)]
    pub max_connections: usize,
    /// Seconds a request's head (request line and headers) may take to arrive; also how long an
    /// idle keep-alive connection stays open. Slower ones are closed.
    #[arg(long, env = "LIMELIGHT_HEADER_TIMEOUT", default_value_t = 10)]
    pub header_timeout: u64,
    /// Seconds a request's body may take to arrive after its head; a slower one is refused with
    /// 408 (`request_timeout`). Raise it for large voice uploads over slow links.
    #[arg(long, env = "LIMELIGHT_BODY_TIMEOUT", default_value_t = 30)]
    pub body_timeout: u64,
    /// Seconds a connection may take none of its reply's bytes (a client that stopped reading)
    /// before it is closed, which frees its request and, on shutdown, lets the drain end.
    #[arg(long, env = "LIMELIGHT_WRITE_TIMEOUT", default_value_t = 30)]
    pub write_timeout: u64,
    /// Largest request body, in bytes; larger ones are refused with 413.
    #[arg(long, env = "LIMELIGHT_MAX_BODY_BYTES", default_value_t = crate::http::DEFAULT_MAX_BODY_BYTES)]
    pub max_body_bytes: usize,
    /// Frames per request when it gives no `max_frames`, and the most it may ask for (2048
    /// samples each: 2048 frames are about 95 s of audio).
    #[arg(long, env = "LIMELIGHT_MAX_FRAMES", default_value_t = 2048)]
    pub max_frames: usize,
    /// Keep named voices (`/v1/audio/voices`) here, one file each; without it voices live in
    /// memory and are lost at exit.
    #[arg(long, env = "LIMELIGHT_VOICES_DIR")]
    pub voices_dir: Option<PathBuf>,
    /// Speak an OpenAI built-in voice name in a stored voice: `alloy=narrator` (repeat, or
    /// separate with commas). Unmapped built-in names keep the model's default voice.
    #[arg(long = "voice-alias", env = "LIMELIGHT_VOICE_ALIAS", value_delimiter = ',')]
    pub voice_aliases: Vec<String>,
    /// Most named voices the server keeps.
    #[arg(long, env = "LIMELIGHT_MAX_VOICES", default_value_t = 1000)]
    pub max_voices: usize,
    /// Largest reference clip a voice upload may carry, in bytes (the clip may also last at
    /// most 60 s).
    #[arg(long, env = "LIMELIGHT_MAX_VOICE_UPLOAD_BYTES", default_value_t = crate::http::DEFAULT_MAX_VOICE_UPLOAD_BYTES)]
    pub max_voice_upload_bytes: usize,
    /// Memory for saved voices' prompt state, in MiB: a request in a stored voice whose state
    /// is kept skips its reference rows (least recently used voices make room first; 0 keeps
    /// none). On the GPU it is reserved at start-up, out of the memory the decode batch could use.
    #[arg(long, env = "LIMELIGHT_VOICE_CACHE_MIB", default_value_t = crate::scheduler::DEFAULT_VOICE_CACHE_BYTES >> 20)]
    pub voice_cache_mib: usize,
    /// Memory a reference clip's decoder may use, in MiB. Each clip is decoded in a child
    /// process under this limit, so a file built to exhaust memory fails alone.
    #[arg(long, env = "LIMELIGHT_CLIP_DECODE_MEMORY_MIB", default_value_t = crate::voice::isolated::DEFAULT_MEMORY_MIB)]
    pub clip_decode_memory_mib: u64,
    /// Reference clips decoded at once (each in its own child process); more wait their turn.
    #[arg(long, env = "LIMELIGHT_CLIP_DECODERS", default_value_t = 4)]
    pub clip_decoders: usize,
    /// Seconds to let running requests finish after SIGTERM or SIGINT before exiting.
    #[arg(long, env = "LIMELIGHT_DRAIN_TIMEOUT", default_value_t = 30)]
    pub drain_timeout: u64,
    /// Log lines as human text or JSON objects; the level comes from `RUST_LOG` (default `info`).
    #[arg(long, value_enum, env = "LIMELIGHT_LOG_FORMAT", default_value = "text")]
    pub log_format: LogFormat,
}

#[derive(Debug, Subcommand)]
pub enum CheckpointCommand {
    /// Write a random-weight checkpoint in the exact published layout.
    Synth(SynthArgs),
}

#[derive(Debug, Args)]
pub struct SynthArgs {
    /// `tiny` (small widths, for tests) or `full` (the real dimensions, about 40 GB).
    #[arg(long, value_enum, default_value = "tiny")]
    pub preset: Preset,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Directory to write (created if missing; existing checkpoint files are overwritten).
    #[arg(long, required_unless_present = "dry_run")]
    pub out: Option<PathBuf>,
    /// Residual codebooks summed into the backbone input (`vq_backbone_codebooks`);
    /// 0 selects the `mtp_shared_pre` placement.
    #[arg(long, default_value_t = 1)]
    pub vq_backbone_codebooks: usize,
    /// Print the planned files and sizes without writing anything.
    #[arg(long)]
    pub dry_run: bool,
}

#[derive(Debug, Args)]
pub struct InspectArgs {
    /// Checkpoint directory (config.json, tokenizer.json, safetensors shards, codec.pth).
    #[arg(long)]
    pub model: PathBuf,
    /// Rows of context to budget KV caches for.
    #[arg(long, default_value_t = 16384)]
    pub context_length: usize,
    /// A GPU memory budget to plan the decode batch for: how many streams fit (as `serve`
    /// sizes `--max-batch`).
    #[arg(long, value_parser = parse_bytes)]
    pub gpu_memory_budget: Option<u64>,
    /// Prompt rows per prefill chunk, as `serve --prefill-chunk`.
    #[arg(long, default_value_t = crate::engine::generate::PREFILL_CHUNK)]
    pub prefill_chunk: usize,
}

#[derive(Debug, Args)]
pub struct SayArgs {
    /// Checkpoint directory.
    #[arg(long)]
    pub model: PathBuf,
    /// The text to speak (inline tags such as `[sighs]` and `<|speaker:N|>` are allowed).
    #[arg(long)]
    pub text: String,
    /// Output WAV file (16-bit mono, 44.1 kHz).
    #[arg(long)]
    pub out: PathBuf,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    #[arg(long, default_value_t = 1.0)]
    pub temperature: f32,
    #[arg(long, default_value_t = 0.9)]
    pub top_p: f32,
    /// Cap on main-token candidates (default: none); codebook heads use min(top_k, 30).
    #[arg(long)]
    pub top_k: Option<u32>,
    /// Frames to generate at most (2048 samples each), per chunk of long text; reaching it ends
    /// with reason `length`.
    #[arg(long, default_value_t = 2048)]
    pub max_frames: usize,
    /// Speak in this stored voice (from `--voices-dir`, as `serve` keeps them).
    #[arg(long, requires = "voices_dir", conflicts_with = "reference_audio")]
    pub voice: Option<String>,
    /// Where `--voice` is stored.
    #[arg(long)]
    pub voices_dir: Option<PathBuf>,
    /// Speak in the voice of this reference clip (WAV, FLAC, MP3, Ogg Vorbis/Opus, M4A; ≤ 60 s).
    #[arg(long, requires = "reference_text")]
    pub reference_audio: Option<PathBuf>,
    /// The reference clip's transcript.
    #[arg(long, requires = "reference_audio")]
    pub reference_text: Option<String>,
    /// Speak `--text` as written: no numbers, dates or amounts written out as words (as the
    /// server's `"normalize": false`).
    #[arg(long)]
    pub no_normalize: bool,
}

#[derive(Debug, Args)]
pub struct TraceArgs {
    /// Checkpoint directory.
    #[arg(long)]
    pub model: PathBuf,
    /// Prompt rows: a safetensors file with an integer tensor `rows` [T, 11], or a JSON array of rows.
    #[arg(long)]
    pub prompt_rows: PathBuf,
    /// Output safetensors file.
    #[arg(long)]
    pub out: PathBuf,
}

#[cfg(test)]
mod size_tests {
    use super::parse_bytes;

    #[test]
    fn sizes_parse_with_decimal_and_binary_units() {
        assert_eq!(parse_bytes("123"), Ok(123));
        assert_eq!(parse_bytes("64G"), Ok(64_000_000_000));
        assert_eq!(parse_bytes("64GiB"), Ok(64 << 30));
        assert_eq!(parse_bytes("1.5 GiB"), Ok(3 << 29));
        assert_eq!(parse_bytes("512mib"), Ok(512 << 20));
        for bad in ["", "GiB", "-1G", "12 parsecs", "0"] {
            assert!(parse_bytes(bad).is_err(), "{bad}");
        }
    }
}
