//! Fixtures of `tests/http_contract.rs`: the tiny checkpoint, schedulers on the CPU engine (plain,
//! or wrapped to hold, fail or never end on the test's word), and request/response helpers.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderValue, Request, Response, StatusCode, header};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

use crate::common;
use limelight::engine::generate::{GenerateError, GenerateOptions, PREFILL_CHUNK, Stepped};
use limelight::engine::prefix::SharedPrefix;
use limelight::http::{AppState, HttpConfig, router};
use limelight::model::frame::Rows;
use limelight::model::vocabulary::Vocabulary;
use limelight::request::validate::SpeechPolicy;
use limelight::scheduler::{
    AudioCodec, BatchLimits, DEFAULT_VOICE_CACHE_BYTES, Encoded, Loader, MemoryUse, ModelHost, Opened, Prefilled,
    RATE_WINDOW, ReaderPolicy, Scheduler, StreamId, SynthError, Synthesizer, WorkerConfig, cpu_loader,
};

pub const MODEL: &str = "drama-3";
pub const MAX_FRAMES: usize = 6;
pub const MAX_BODY: usize = 2048;
pub const KEY: &str = "sk-test-key";

/// The tiny checkpoint, written once per test process.
pub fn checkpoint() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("http_contract_tiny");
        common::tiny_plan().write(&dir).unwrap();
        dir
    })
}

pub fn worker_config(max_queue: usize) -> WorkerConfig {
    WorkerConfig {
        model_dir: checkpoint().to_owned(),
        max_queue,
        default_max_frames: MAX_FRAMES,
        served_model_name: MODEL.into(),
        model_aliases: vec!["tts-1".into(), "tts-1-hd".into(), "gpt-4o-mini-tts".into()],
        reader: ReaderPolicy { stall_timeout: Duration::from_secs(10), min_read_rate: 0.5, rate_window: RATE_WINDOW },
    }
}

pub fn app(scheduler: Scheduler, api_key: Option<&str>) -> Router {
    app_with_keys(scheduler, api_key.into_iter().collect())
}

/// The router with any number of accepted API keys (rotation keeps old and new valid).
pub fn app_with_keys(scheduler: Scheduler, api_keys: Vec<&str>) -> Router {
    app_with(scheduler, api_keys, 200)
}

/// The router with `max_input_chars` (long text: several chunks).
pub fn app_with_input_limit(scheduler: Scheduler, max_input_chars: usize) -> Router {
    app_with(scheduler, Vec::new(), max_input_chars)
}

fn app_with(scheduler: Scheduler, api_keys: Vec<&str>, max_input_chars: usize) -> Router {
    let policy = SpeechPolicy {
        served_model: MODEL.into(),
        aliases: worker_config(0).model_aliases,
        max_input_chars,
        max_frames: MAX_FRAMES,
    };
    let config = HttpConfig {
        policy,
        api_keys: api_keys.into_iter().map(str::to_owned).collect(),
        max_body_bytes: MAX_BODY,
        voice_aliases: Default::default(),
        max_voice_upload_bytes: limelight::http::DEFAULT_MAX_VOICE_UPLOAD_BYTES,
        body_timeout: std::time::Duration::from_secs(30),
        clip_decoder: limelight::voice::isolated::ClipDecoder::new(env!("CARGO_BIN_EXE_limelight"), 2048),
        clip_decoders: 2,
    };
    router(AppState::new(scheduler, config))
}

/// The CPU engine's decode batch in these tests.
fn limits() -> BatchLimits {
    BatchLimits {
        max_batch: Some(4),
        prefill_chunk: PREFILL_CHUNK,
        voice_cache_bytes: DEFAULT_VOICE_CACHE_BYTES,
        codec_thread: true,
    }
}

/// One scheduler on the plain CPU engine, shared by the tests that need nothing special.
pub async fn shared_scheduler() -> Scheduler {
    static SCHEDULER: OnceLock<Scheduler> = OnceLock::new();
    let scheduler = SCHEDULER.get_or_init(|| plain_scheduler(worker_config(8))).clone();
    scheduler.loaded().await.expect("the tiny model loads");
    scheduler
}

pub async fn shared() -> Router {
    app(shared_scheduler().await, None)
}

pub fn plain_scheduler(config: WorkerConfig) -> Scheduler {
    let loader = cpu_loader(config.model_dir.clone(), config.default_max_frames, limits());
    Scheduler::start_with(config, loader)
}

/// What the wrapped engine does differently.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Mode {
    /// Each job waits for `Control::open` before its prompt runs.
    Gated,
    /// Fails at its first step, before any audio.
    FailAtOnce,
    /// Sends the first audio chunk, then fails.
    FailAfterFirstAudio,
    /// Never ends by itself: generation restarts until the client is gone, which sets the flag.
    Endless,
    /// Speaks, but has no codec encoder (as a GPU engine whose encoder did not fit).
    NoEncoder,
    /// A job with seed [`OOM_SEED`] finds no device memory for its stream: `open` unwinds with
    /// the CUDA backend's typed payload (an injected fault).
    OutOfMemoryOnSeed,
}

/// The seed whose job [`Mode::OutOfMemoryOnSeed`] refuses.
pub const OOM_SEED: u64 = 9090;

/// The test's hold on a wrapped engine: a latch it opens, and a flag the engine sets once a
/// job was cancelled.
#[derive(Clone, Default)]
pub struct Control {
    latch: Arc<(Mutex<bool>, Condvar)>,
    cancelled: Arc<AtomicBool>,
    steps: Arc<std::sync::atomic::AtomicUsize>,
}

impl Control {
    pub fn open(&self) {
        *self.latch.0.lock().unwrap() = true;
        self.latch.1.notify_all();
    }

    pub fn wait(&self) {
        let mut open = self.latch.0.lock().unwrap();
        while !*open {
            open = self.latch.1.wait(open).unwrap();
        }
    }

    pub fn saw_cancel(&self) -> bool {
        self.cancelled.load(Ordering::SeqCst)
    }

    /// Streams stepped so far (one per stream per step call).
    pub fn steps(&self) -> usize {
        self.steps.load(Ordering::SeqCst)
    }
}

/// A wrapped stream: the inner stream (replaced when an endless one restarts), what it was
/// opened with, and whether it produced audio yet.
struct WrappedStream {
    inner: StreamId,
    rows: Rows,
    prefix: SharedPrefix,
    options: GenerateOptions,
    audio: bool,
    finished: bool,
}

/// The CPU engine behind a wrapper that misbehaves as `mode` says.
pub struct Wrapped<'m> {
    model: &'m dyn Synthesizer,
    mode: Mode,
    control: Control,
    streams: RefCell<HashMap<StreamId, WrappedStream>>,
    next_id: Cell<StreamId>,
}

impl Synthesizer for Wrapped<'_> {
    fn sample_rate(&self) -> u32 {
        self.model.sample_rate()
    }
    fn samples_per_frame(&self) -> usize {
        self.model.samples_per_frame()
    }
    fn memory(&self) -> MemoryUse {
        self.model.memory()
    }
    fn vocabulary(&self) -> Vocabulary {
        self.model.vocabulary()
    }
    fn max_batch(&self) -> usize {
        self.model.max_batch()
    }
    fn open(&self, rows: &Rows, prefix: SharedPrefix, options: &GenerateOptions) -> Result<Opened, SynthError> {
        if self.mode == Mode::OutOfMemoryOnSeed && options.seed == OOM_SEED {
            let what = String::from("scratch of 67108864 bytes: injected");
            std::panic::panic_any(limelight::backend::OutOfDeviceMemory { what });
        }
        let inner = self.model.open(rows, prefix, options)?;
        let id = self.next_id.replace(self.next_id.get() + 1);
        let stream = WrappedStream {
            inner: inner.id,
            rows: rows.clone(),
            prefix,
            options: options.clone(),
            audio: false,
            finished: false,
        };
        self.streams.borrow_mut().insert(id, stream);
        Ok(Opened { id, ..inner })
    }
    fn continue_stream(
        &self,
        id: StreamId,
        rows: &Rows,
        prefix: SharedPrefix,
        options: &GenerateOptions,
        hold: bool,
    ) -> Result<Opened, SynthError> {
        let inner = self.streams.borrow()[&id].inner;
        self.model.continue_stream(inner, rows, prefix, options, hold).map(|o| Opened { id, ..o })
    }
    fn settle_chunk(&self, id: StreamId, keep: bool) -> Result<Stepped, SynthError> {
        self.model.settle_chunk(self.streams.borrow()[&id].inner, keep)
    }
    fn produced(&self, id: StreamId) -> Rows {
        self.model.produced(self.streams.borrow()[&id].inner)
    }
    fn prefill_chunk(&self) -> usize {
        self.model.prefill_chunk()
    }
    fn prefill(&self, ids: &[StreamId]) -> Vec<Result<Prefilled, SynthError>> {
        if self.mode == Mode::Gated {
            self.control.wait();
        }
        let inner: Vec<StreamId> = ids.iter().map(|id| self.streams.borrow()[id].inner).collect();
        self.model.prefill(&inner)
    }
    fn step(&self, ids: &[StreamId]) -> Vec<Result<Stepped, SynthError>> {
        self.control.steps.fetch_add(ids.len(), Ordering::SeqCst);
        let failure = || SynthError::Generate(GenerateError::EmptyPrompt);
        let mut streams = self.streams.borrow_mut();
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            let s = streams.get_mut(id).expect("open");
            if self.mode == Mode::FailAtOnce || (self.mode == Mode::FailAfterFirstAudio && s.audio) {
                out.push(Err(failure()));
                continue;
            }
            let mut stepped = match self.model.step(&[s.inner]).pop().expect("one result") {
                Ok(stepped) => stepped,
                Err(e) => {
                    out.push(Err(e));
                    continue;
                }
            };
            s.audio |= !stepped.pcm.is_empty() || !stepped.codes.is_empty();
            if self.mode == Mode::Endless && stepped.finished.is_some() {
                // Start over in a fresh stream: only the client leaving ends it.
                self.model.close(s.inner);
                s.inner = self.model.open(&s.rows, s.prefix, &s.options).expect("reopens").id;
                while !self.model.prefill(&[s.inner]).remove(0).expect("prefills").done {}
                stepped.finished = None;
            }
            s.finished = stepped.finished.is_some();
            out.push(Ok(stepped));
        }
        out
    }
    fn encode_reference(&self, samples: &[f32]) -> Result<Encoded, SynthError> {
        self.model.encode_reference(samples)
    }
    fn encodes_references(&self) -> bool {
        self.mode != Mode::NoEncoder && self.model.encodes_references()
    }
    fn cancel(&self, id: StreamId) -> Result<Stepped, SynthError> {
        self.model.cancel(self.streams.borrow()[&id].inner)
    }
    fn audio_codec(&self) -> Option<&dyn AudioCodec> {
        self.model.audio_codec()
    }
    fn close(&self, id: StreamId) -> usize {
        let s = self.streams.borrow_mut().remove(&id).expect("open");
        if !s.finished {
            self.control.cancelled.store(true, Ordering::SeqCst);
        }
        self.model.close(s.inner)
    }
}

pub struct WrappingHost<'h> {
    host: &'h mut dyn ModelHost,
    mode: Mode,
    control: Control,
}

impl ModelHost for WrappingHost<'_> {
    fn progress(&self, stage: &str) {
        self.host.progress(stage);
    }
    fn serve(&mut self, model: &dyn Synthesizer) {
        let wrapped = Wrapped {
            model,
            mode: self.mode,
            control: self.control.clone(),
            streams: RefCell::default(),
            next_id: Cell::new(0),
        };
        self.host.serve(&wrapped);
    }
}

/// A scheduler whose engine behaves as `mode` says; `load_gate`, if given, holds loading.
pub fn wrapped(mode: Mode, max_queue: usize, control: Control, load_gate: Option<Control>) -> Scheduler {
    let inner = cpu_loader(checkpoint().to_owned(), MAX_FRAMES, limits());
    let loader: Loader = Box::new(move |host: &mut dyn ModelHost| {
        if let Some(load_gate) = load_gate {
            load_gate.wait();
        }
        inner(&mut WrappingHost { host, mode, control })
    });
    Scheduler::start_with(worker_config(max_queue), loader)
}

pub fn speech(body: Value) -> Request<Body> {
    Request::post("/v1/audio/speech")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .unwrap()
}

pub fn get(path: &str) -> Request<Body> {
    Request::get(path).body(Body::empty()).unwrap()
}

/// A small valid request; `extra` fields are merged in.
pub fn body(extra: Value) -> Value {
    let mut b = json!({"model": MODEL, "input": "Hello there.", "voice": "alloy", "seed": 11, "max_frames": 3});
    b.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    b
}

pub async fn send(app: &Router, req: Request<Body>) -> Response<Body> {
    tokio::time::timeout(Duration::from_secs(60), app.clone().oneshot(req)).await.expect("answered in time").unwrap()
}

pub async fn bytes_of(resp: Response<Body>) -> Vec<u8> {
    resp.into_body().collect().await.unwrap().to_bytes().to_vec()
}

/// An error response: status and the `error` object, after checking OpenAI's shape.
pub async fn error_of(resp: Response<Body>) -> (StatusCode, Value) {
    let status = resp.status();
    assert_eq!(resp.headers()[header::CONTENT_TYPE], "application/json");
    assert!(resp.headers().contains_key("x-request-id"));
    let v: Value = serde_json::from_slice(&bytes_of(resp).await).unwrap();
    let e = v["error"].clone();
    for key in ["message", "type", "param", "code"] {
        assert!(e.get(key).is_some(), "`{key}` missing from {v}");
    }
    (status, e)
}

pub async fn refused(app: &Router, req: Request<Body>) -> (StatusCode, Value) {
    error_of(send(app, req).await).await
}

pub async fn send_owned(app: Router, req: Request<Body>) -> Response<Body> {
    send(&app, req).await
}

pub async fn wait_until(mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < Duration::from_secs(20), "condition not reached in time");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

pub fn finish_reason(value: Option<&HeaderValue>) -> String {
    let reason = value.expect("X-Finish-Reason").to_str().unwrap().to_owned();
    assert!(reason == "stop" || reason == "length", "{reason}");
    reason
}

/// The `data:` payloads of an SSE body.
pub fn sse_events(text: &str) -> Vec<Value> {
    text.split("\n\n")
        .filter(|block| !block.trim().is_empty())
        .map(|block| {
            let data = block.strip_prefix("data: ").unwrap_or_else(|| panic!("not a data event: {block:?}"));
            serde_json::from_str(data).unwrap()
        })
        .collect()
}
