//! The scheduler on the tiny checkpoint: events in order with all the audio, a bounded queue,
//! a dropped stream freeing the engine, a failing or panicking job failing alone, drain, and
//! readiness through loading.

mod common;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use std::cell::{Cell, RefCell};
use std::collections::HashMap;

use limelight::audio::CODEC_SAMPLE_RATE;
use limelight::engine::generate::{FinishReason, GenerateError, GenerateOptions, PREFILL_CHUNK, Stepped};
use limelight::engine::prefix::SharedPrefix;
use limelight::model::frame::Rows;
use limelight::model::sampling::SamplingParams;
use limelight::model::vocabulary::Vocabulary;
use limelight::scheduler::{
    AudioCodec, BatchLimits, Encoded, Job, JobEvent, JobStream, Loader, MemoryUse, ModelHost, Opened, Prefilled,
    RATE_WINDOW, REPLY_CAPACITY, ReaderPolicy, Readiness, Scheduler, StreamId, SubmitError, SynthError, Synthesizer,
    WorkerConfig, cpu_loader,
};

const TEXT: &str = "Hello there, how are you today?";
/// Every test finishes well inside this; a hang fails instead of blocking the suite.
const LIMIT: Duration = Duration::from_secs(60);

fn config(dir: PathBuf, max_queue: usize) -> WorkerConfig {
    WorkerConfig {
        model_dir: dir,
        max_queue,
        default_max_frames: 2048,
        served_model_name: String::from("drama-3"),
        model_aliases: vec![String::from("tts-1")],
        reader: ReaderPolicy { stall_timeout: Duration::from_secs(30), min_read_rate: 0.5, rate_window: RATE_WINDOW },
    }
}

fn job(text: &str, max_frames: usize) -> Job {
    Job {
        request_id: String::from("req-test"),
        rows: common::tiny_rows(text),
        prefix: SharedPrefix::NONE,
        // Seed 3 gives no EOS on this checkpoint, so every job runs to `max_frames`.
        options: GenerateOptions { params: SamplingParams::default(), seed: 3, max_frames, stall: None },
        span: tracing::Span::none(),
        more: None,
    }
}

/// Reads a job to its end: (events without audio, audio samples, audio chunks).
async fn collect(stream: &mut JobStream) -> (Vec<JobEvent>, usize, usize) {
    let (mut events, mut samples, mut chunks) = (Vec::new(), 0, 0);
    while let Some(event) = stream.next().await {
        match event {
            JobEvent::Audio(pcm) => {
                samples += pcm.len();
                chunks += 1;
            }
            other => events.push(other),
        }
    }
    (events, samples, chunks)
}

async fn ready(scheduler: &Scheduler) {
    scheduler.loaded().await.expect("the tiny checkpoint loads");
    assert_eq!(scheduler.readiness(), Readiness::Ready);
}

/// Opening a stream with this seed panics inside the engine (`Faulty`).
const PANIC_SEED: u64 = 777;

/// The CPU engine behind a wrapper that fails on cue and records how each generation ended.
/// Seed 777 panics when its stream opens; seed 666 fails the job's first step; seed 13 fails it and breaks the engine (its health
/// check fails from then on, as a GPU context does after a fault).
struct Faulty<'m> {
    inner: &'m dyn Synthesizer,
    ends: Arc<Mutex<Vec<(FinishReason, usize)>>>,
    broken: Cell<bool>,
    /// Open streams' seeds, and how each finished (if it did).
    open: RefCell<HashMap<StreamId, (u64, Option<FinishReason>)>>,
}

impl Synthesizer for Faulty<'_> {
    fn sample_rate(&self) -> u32 {
        self.inner.sample_rate()
    }
    fn samples_per_frame(&self) -> usize {
        self.inner.samples_per_frame()
    }
    fn memory(&self) -> MemoryUse {
        self.inner.memory()
    }
    fn health(&self) -> Result<(), String> {
        if self.broken.get() { Err(String::from("injected fault")) } else { Ok(()) }
    }
    fn vocabulary(&self) -> Vocabulary {
        self.inner.vocabulary()
    }
    fn max_batch(&self) -> usize {
        self.inner.max_batch()
    }
    fn open(&self, rows: &Rows, prefix: SharedPrefix, options: &GenerateOptions) -> Result<Opened, SynthError> {
        assert!(options.seed != PANIC_SEED, "injected panic");
        let opened = self.inner.open(rows, prefix, options)?;
        self.open.borrow_mut().insert(opened.id, (options.seed, None));
        Ok(opened)
    }
    fn continue_stream(
        &self,
        id: StreamId,
        rows: &Rows,
        prefix: SharedPrefix,
        options: &GenerateOptions,
        hold: bool,
    ) -> Result<Opened, SynthError> {
        self.inner.continue_stream(id, rows, prefix, options, hold)
    }
    fn settle_chunk(&self, id: StreamId, keep: bool) -> Result<Stepped, SynthError> {
        self.inner.settle_chunk(id, keep)
    }
    fn produced(&self, id: StreamId) -> Rows {
        self.inner.produced(id)
    }
    fn prefill_chunk(&self) -> usize {
        self.inner.prefill_chunk()
    }
    fn prefill(&self, ids: &[StreamId]) -> Vec<Result<Prefilled, SynthError>> {
        self.inner.prefill(ids)
    }
    fn step(&self, ids: &[StreamId]) -> Vec<Result<Stepped, SynthError>> {
        let seed = |id: &StreamId| self.open.borrow()[id].0;
        let healthy: Vec<StreamId> = ids.iter().copied().filter(|id| ![666, 13].contains(&seed(id))).collect();
        let mut stepped = self.inner.step(&healthy).into_iter();
        let results: Vec<Result<Stepped, SynthError>> = (ids.iter())
            .map(|id| match seed(id) {
                666 => Err(GenerateError::EmptyPrompt.into()),
                13 => {
                    // Long enough for the test to queue a job behind this one (submitting takes µs).
                    std::thread::sleep(Duration::from_millis(200));
                    self.broken.set(true);
                    Err(GenerateError::EmptyPrompt.into())
                }
                _ => stepped.next().expect("one result per healthy stream"),
            })
            .collect();
        for (id, result) in ids.iter().zip(&results) {
            if let Ok(Stepped { finished: Some(reason), .. }) = result {
                self.open.borrow_mut().get_mut(id).expect("open").1 = Some(*reason);
            }
        }
        results
    }
    fn encode_reference(&self, samples: &[f32]) -> Result<Encoded, SynthError> {
        self.inner.encode_reference(samples)
    }
    fn encodes_references(&self) -> bool {
        self.inner.encodes_references()
    }
    fn cancel(&self, id: StreamId) -> Result<Stepped, SynthError> {
        self.inner.cancel(id)
    }
    fn audio_codec(&self) -> Option<&dyn AudioCodec> {
        self.inner.audio_codec()
    }
    fn close(&self, id: StreamId) -> usize {
        let frames = self.inner.close(id);
        if let Some((seed, finished)) = self.open.borrow_mut().remove(&id)
            && ![666, 13].contains(&seed)
        {
            self.ends.lock().unwrap().push((finished.unwrap_or(FinishReason::Cancelled), frames));
        }
        frames
    }
}

/// Hands the model the real loader produces to the worker wrapped in [`Faulty`].
struct Wrap<'h> {
    host: &'h mut dyn ModelHost,
    ends: Arc<Mutex<Vec<(FinishReason, usize)>>>,
}

impl ModelHost for Wrap<'_> {
    fn progress(&self, stage: &str) {
        self.host.progress(stage);
    }
    fn serve(&mut self, model: &dyn Synthesizer) {
        let faulty =
            Faulty { inner: model, ends: self.ends.clone(), broken: Cell::new(false), open: RefCell::default() };
        self.host.serve(&faulty);
    }
}

/// The CPU engine with `max_batch` slots (the codec on its own thread, as served).
fn loader(dir: PathBuf, max_batch: usize) -> Loader {
    loader_with(dir, max_batch, true)
}

/// The CPU engine with `max_batch` slots, its codec on its own thread or inside the step.
fn loader_with(dir: PathBuf, max_batch: usize, codec_thread: bool) -> Loader {
    let limits = BatchLimits {
        max_batch: Some(max_batch),
        prefill_chunk: PREFILL_CHUNK,
        voice_cache_bytes: 1 << 30,
        codec_thread,
    };
    cpu_loader(dir, 2048, limits)
}

fn faulty_loader(dir: PathBuf, max_batch: usize, ends: Arc<Mutex<Vec<(FinishReason, usize)>>>) -> Loader {
    Box::new(move |host: &mut dyn ModelHost| loader(dir, max_batch)(&mut Wrap { host, ends }))
}

#[tokio::test]
async fn events_arrive_in_order_with_all_the_audio() {
    let dir = common::tiny_checkpoint();
    let scheduler = Scheduler::start(config(dir.path().to_owned(), 4));
    tokio::time::timeout(LIMIT, async {
        ready(&scheduler).await;
        let info = scheduler.model_info().expect("known once ready");
        assert_eq!((info.id.as_str(), info.sample_rate, info.samples_per_frame), ("drama-3", 44_100, 2048));
        let mut stream = scheduler.submit(job(TEXT, 12)).unwrap();
        let first = stream.next().await;
        let Some(JobEvent::Started { prompt_rows }) = first else { panic!("first event {first:?}") };
        assert!(prompt_rows > 10, "the prompt has its fixed segments: {prompt_rows} rows");
        let (events, samples, chunks) = collect(&mut stream).await;
        assert_eq!(events, [JobEvent::Finished { reason: FinishReason::Length, frames: 12, prompt_rows }]);
        assert_eq!(samples, 12 * 2048, "audio length = frames × 2048");
        assert_eq!(chunks, 4, "the first frame alone, then groups of 2, 4 and the rest");
        // The worker sends `Finished` before it releases the slot: wait for it briefly.
        while (scheduler.active(), scheduler.queue_depth()) != (0, 0) {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("bounded");
}

#[tokio::test]
async fn a_full_queue_refuses_and_a_dropped_stream_frees_the_engine() {
    let dir = common::tiny_checkpoint();
    let ends = Arc::new(Mutex::new(Vec::new()));
    let scheduler =
        Scheduler::start_with(config(dir.path().to_owned(), 1), faulty_loader(dir.path().into(), 1, ends.clone()));
    tokio::time::timeout(LIMIT, async {
        ready(&scheduler).await;
        // A runs and, unread, soon blocks the worker on its full reply channel.
        let mut a = scheduler.submit(job(TEXT, 2048)).unwrap();
        assert!(matches!(a.next().await, Some(JobEvent::Started { .. })));
        assert_eq!(scheduler.active(), 1);
        let mut b = scheduler.submit(job(TEXT, 6)).unwrap();
        assert_eq!(scheduler.queue_depth(), 1);
        let refused = scheduler.submit(job(TEXT, 6)).unwrap_err();
        let SubmitError::QueueFull { retry_after_secs, max_queue: 1 } = refused else { panic!("{refused:?}") };
        assert!((1..=60).contains(&retry_after_secs));
        // The client of A goes away: A stops at its next chunk and B starts at once.
        assert!(matches!(a.next().await, Some(JobEvent::Audio(_))));
        drop(a);
        let dropped = Instant::now();
        assert!(matches!(b.next().await, Some(JobEvent::Started { .. })));
        assert!(dropped.elapsed() < Duration::from_secs(5), "B waited {:?}", dropped.elapsed());
        let (events, samples, _) = collect(&mut b).await;
        assert!(matches!(events[..], [JobEvent::Finished { reason: FinishReason::Length, frames: 6, .. }]));
        assert_eq!(samples, 6 * 2048);
        let ends = ends.lock().unwrap().clone();
        let (reason, frames) = ends[0];
        assert_eq!(reason, FinishReason::Cancelled, "A was cancelled, not run to 2048 frames");
        assert!(frames < 2048 / 4, "A stopped early: {frames} frames");
        assert_eq!(ends[1], (FinishReason::Length, 6));
    })
    .await
    .expect("bounded");
}

#[tokio::test]
async fn a_failing_or_panicking_job_fails_alone() {
    let dir = common::tiny_checkpoint();
    let ends = Arc::new(Mutex::new(Vec::new()));
    let scheduler = Scheduler::start_with(config(dir.path().to_owned(), 4), faulty_loader(dir.path().into(), 4, ends));
    tokio::time::timeout(LIMIT, async {
        ready(&scheduler).await;
        let panic = Job { options: GenerateOptions { seed: PANIC_SEED, ..job(TEXT, 6).options }, ..job(TEXT, 6) };
        let mut panicking = scheduler.submit(panic).unwrap();
        let mut erring = scheduler.submit(Job { options: GenerateOptions { seed: 666, ..job(TEXT, 6).options }, ..job(TEXT, 6) }).unwrap();
        let mut fine = scheduler.submit(job(TEXT, 6)).unwrap();
        let (events, samples, _) = collect(&mut panicking).await;
        assert_eq!(samples, 0);
        assert!(matches!(&events[..], [JobEvent::Failed { message }] if message.contains("injected panic")), "{events:?}");
        let (events, samples, _) = collect(&mut erring).await;
        assert_eq!(samples, 0);
        assert!(
            matches!(&events[..], [JobEvent::Started { .. }, JobEvent::Failed { message }] if message.contains("no rows")),
            "{events:?}"
        );
        let (events, samples, _) = collect(&mut fine).await;
        assert!(matches!(events[..], [JobEvent::Started { .. }, JobEvent::Finished { frames: 6, .. }]), "{events:?}");
        assert_eq!(samples, 6 * 2048);
        assert_eq!(scheduler.readiness(), Readiness::Ready, "the worker lives on");
    })
    .await
    .expect("bounded");
}

/// A failure that leaves the engine unhealthy (a GPU fault) stops the worker: readiness turns
/// failed with the reason, queued jobs fail with it, new jobs are refused, and `engine_lost`
/// tells `serve` to exit so the supervisor restarts it.
#[tokio::test]
async fn a_job_that_breaks_the_engine_fails_the_queue_and_reports_the_engine_lost() {
    let dir = common::tiny_checkpoint();
    let ends = Arc::new(Mutex::new(Vec::new()));
    // One slot, so the job behind the breaking one waits in the queue.
    let scheduler = Scheduler::start_with(config(dir.path().to_owned(), 4), faulty_loader(dir.path().into(), 1, ends));
    tokio::time::timeout(LIMIT, async {
        ready(&scheduler).await;
        let mut fine = scheduler.submit(job(TEXT, 2)).unwrap();
        let (events, _, _) = collect(&mut fine).await;
        assert!(matches!(events[..], [JobEvent::Started { .. }, JobEvent::Finished { .. }]), "{events:?}");
        let breaking = Job { options: GenerateOptions { seed: 13, ..job(TEXT, 2).options }, ..job(TEXT, 2) };
        let mut breaking = scheduler.submit(breaking).unwrap();
        let mut queued = scheduler.submit(job(TEXT, 2)).unwrap();
        let (events, _, _) = collect(&mut breaking).await;
        assert!(matches!(&events[..], [JobEvent::Started { .. }, JobEvent::Failed { .. }]), "{events:?}");
        let why = scheduler.engine_lost().await;
        assert!(why.contains("unusable") && why.contains("injected fault"), "{why}");
        let (events, samples, _) = collect(&mut queued).await;
        assert_eq!(samples, 0);
        assert!(
            matches!(&events[..], [JobEvent::Failed { message }] if message.contains("injected fault")),
            "{events:?}"
        );
        assert!(matches!(scheduler.readiness(), Readiness::Failed(m) if m.contains("injected fault")));
        assert!(scheduler.submit(job(TEXT, 2)).is_err(), "a lost engine takes no new jobs");
    })
    .await
    .expect("bounded");
}

#[tokio::test]
async fn drain_refuses_new_jobs_and_lets_admitted_ones_finish() {
    let dir = common::tiny_checkpoint();
    let scheduler = Scheduler::start(config(dir.path().to_owned(), 4));
    tokio::time::timeout(LIMIT, async {
        ready(&scheduler).await;
        // 120 frames are more chunks than the reply channel holds: unread, A keeps the worker busy.
        let mut a = scheduler.submit(job(TEXT, 120)).unwrap();
        let mut b = scheduler.submit(job(TEXT, 3)).unwrap();
        scheduler.begin_drain();
        assert_eq!(scheduler.readiness(), Readiness::Draining);
        assert_eq!(scheduler.submit(job(TEXT, 3)).unwrap_err(), SubmitError::Draining);
        assert!(
            tokio::time::timeout(Duration::from_millis(300), scheduler.drained()).await.is_err(),
            "not drained while A and B are in flight"
        );
        let (events, samples, _) = collect(&mut a).await;
        assert!(matches!(events[..], [JobEvent::Started { .. }, JobEvent::Finished { frames: 120, .. }]), "{events:?}");
        assert_eq!(samples, 120 * 2048);
        let (events, _, _) = collect(&mut b).await;
        assert!(matches!(events[..], [JobEvent::Started { .. }, JobEvent::Finished { frames: 3, .. }]), "{events:?}");
        scheduler.drained().await;
        assert_eq!(scheduler.readiness(), Readiness::Draining);
    })
    .await
    .expect("bounded");
}

#[tokio::test]
async fn cancel_all_ends_running_and_queued_jobs_as_cancelled() {
    let dir = common::tiny_checkpoint();
    // One slot: A runs, B waits in the queue.
    let scheduler = Scheduler::start_with(config(dir.path().to_owned(), 4), loader(dir.path().into(), 1));
    tokio::time::timeout(LIMIT, async {
        ready(&scheduler).await;
        let mut a = scheduler.submit(job(TEXT, 2048)).unwrap();
        let mut b = scheduler.submit(job(TEXT, 2048)).unwrap();
        assert!(matches!(a.next().await, Some(JobEvent::Started { .. })));
        scheduler.cancel_all();
        let (events, samples, _) = collect(&mut a).await;
        let [JobEvent::Finished { reason: FinishReason::Cancelled, frames, .. }] = events[..] else {
            panic!("{events:?}")
        };
        assert_eq!(samples, frames * 2048, "every produced frame's audio was sent");
        assert!(frames < 2048);
        let (events, samples, _) = collect(&mut b).await;
        assert_eq!(events, [JobEvent::Finished { reason: FinishReason::Cancelled, frames: 0, prompt_rows: 0 }]);
        assert_eq!(samples, 0);
        scheduler.drained().await;
    })
    .await
    .expect("bounded");
}

#[tokio::test]
async fn readiness_goes_from_loading_to_ready_or_failed() {
    let dir = common::tiny_checkpoint();
    let (gate_tx, gate_rx) = std::sync::mpsc::channel::<()>();
    let model_dir = dir.path().to_owned();
    let gated: Loader = Box::new(move |host: &mut dyn ModelHost| {
        host.progress("waiting for the test");
        gate_rx.recv().expect("the test opens the gate");
        loader(model_dir, 8)(host)
    });
    let scheduler = Scheduler::start_with(config(dir.path().to_owned(), 4), gated);
    tokio::time::timeout(LIMIT, async {
        assert_eq!(scheduler.readiness(), Readiness::Loading);
        assert_eq!(scheduler.submit(job(TEXT, 3)).unwrap_err(), SubmitError::Loading);
        assert!(scheduler.model_info().is_none());
        gate_tx.send(()).unwrap();
        ready(&scheduler).await;
        assert_eq!(scheduler.loading_stage(), "ready");
        assert!(scheduler.model_info().is_some());

        let missing = dir.path().join("missing");
        let broken = Scheduler::start(config(missing, 4));
        let message = broken.loaded().await.unwrap_err();
        assert!(message.contains("missing"), "the failure names the directory: {message}");
        assert_eq!(broken.readiness(), Readiness::Failed(message));
        assert_eq!(broken.submit(job(TEXT, 3)).unwrap_err(), SubmitError::Loading);
    })
    .await
    .expect("bounded");
}

/// Every job's audio through the worker's batch is what it is alone: the same jobs on one slot,
/// one after another, on four slots all at once, and on four slots with the codec inside the
/// step rather than on its own thread give the same PCM, bit for bit.
#[tokio::test]
async fn batched_jobs_get_the_audio_they_get_alone() {
    let dir = common::tiny_checkpoint();
    let jobs = || {
        [(3, 10), (5, 7), (8, 12), (21, 5), (34, 9)].map(|(seed, frames)| Job {
            options: GenerateOptions { seed, ..job(TEXT, frames).options },
            ..job(TEXT, frames)
        })
    };
    let audio_of = |scheduler: Scheduler| async move {
        ready(&scheduler).await;
        let mut streams: Vec<JobStream> = jobs().into_iter().map(|j| scheduler.submit(j).unwrap()).collect();
        let mut out = Vec::new();
        for stream in &mut streams {
            let mut pcm: Vec<u32> = Vec::new();
            while let Some(event) = stream.next().await {
                if let JobEvent::Audio(chunk) = event {
                    pcm.extend(chunk.iter().map(|x| x.to_bits()));
                }
            }
            out.push(pcm);
        }
        out
    };
    tokio::time::timeout(LIMIT, async {
        let alone =
            audio_of(Scheduler::start_with(config(dir.path().to_owned(), 8), loader(dir.path().into(), 1))).await;
        let together =
            audio_of(Scheduler::start_with(config(dir.path().to_owned(), 8), loader(dir.path().into(), 4))).await;
        // The codec inside each step instead of on its own thread: the same bits.
        let in_step =
            audio_of(Scheduler::start_with(config(dir.path().to_owned(), 8), loader_with(dir.path().into(), 4, false)))
                .await;
        for (i, ((a, t), s)) in alone.iter().zip(&together).zip(&in_step).enumerate() {
            assert!(!a.is_empty(), "job {i} produced audio");
            assert!(a == t, "job {i}: {} samples alone, {} in the batch, or different bits", a.len(), t.len());
            assert!(
                a == s,
                "job {i}: {} samples alone, {} with the codec in the step, or different bits",
                a.len(),
                s.len()
            );
        }
    })
    .await
    .expect("bounded");
}

/// A client that stops reading pauses only its own stream: another stream in the batch runs to
/// its end meanwhile, and after the stall timeout the stalled job is given up and its slot freed.
#[tokio::test]
async fn a_stalled_client_never_stalls_the_batch() {
    let dir = common::tiny_checkpoint();
    let base = config(dir.path().to_owned(), 4);
    let stalling =
        WorkerConfig { reader: ReaderPolicy { stall_timeout: Duration::from_secs(1), ..base.reader }, ..base };
    let scheduler = Scheduler::start_with(stalling, loader(dir.path().into(), 2));
    tokio::time::timeout(LIMIT, async {
        ready(&scheduler).await;
        let mut stalled = scheduler.submit(job(TEXT, 2048)).unwrap();
        assert!(matches!(stalled.next().await, Some(JobEvent::Started { .. })));
        // The stalled client reads nothing more; a second client reads its whole stream.
        let mut reader = scheduler.submit(job(TEXT, 40)).unwrap();
        let (events, samples, _) = collect(&mut reader).await;
        assert!(matches!(events[..], [JobEvent::Started { .. }, JobEvent::Finished { frames: 40, .. }]), "{events:?}");
        assert_eq!(samples, 40 * 2048);
        // Given up after the stall timeout: its slot is free and its stream ends without `Finished`.
        let given_up = Instant::now();
        while scheduler.active() != 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(given_up.elapsed() < Duration::from_secs(10), "given up after {:?}", given_up.elapsed());
        let (events, samples, _) = collect(&mut stalled).await;
        assert!(events.is_empty(), "no end event for a client that stopped reading: {events:?}");
        assert!(samples > 0 && samples < 2048 * 2048, "only the buffered audio: {samples} samples");
    })
    .await
    .expect("bounded");
}

/// Reads `stream` to its end at `speed` × real time (each event's audio is waited out over
/// `speed` before the next is taken) while `scheduler` holds any job, then at once: (events
/// without audio, audio samples).
async fn read_at(stream: &mut JobStream, speed: f64, scheduler: &Scheduler) -> (Vec<JobEvent>, usize) {
    let (mut events, mut samples) = (Vec::new(), 0);
    while let Some(event) = stream.next().await {
        match event {
            JobEvent::Audio(pcm) => {
                samples += pcm.len();
                let audio = Duration::from_secs_f64(pcm.len() as f64 / f64::from(CODEC_SAMPLE_RATE) / speed);
                let until = Instant::now() + audio;
                while Instant::now() < until && scheduler.active() != 0 {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
            other => events.push(other),
        }
    }
    (events, samples)
}

/// A client that reads, but slower than `min_read_rate` × real time, is given up once a rate
/// window shows it (issue 16, finding 2), and its slot is freed; a client reading faster than
/// real time in the same batch, also held back by its own pace, keeps its stream to the end.
#[tokio::test]
async fn a_crawling_reader_is_given_up_and_a_live_one_is_not() {
    let dir = common::tiny_checkpoint();
    let base = config(dir.path().to_owned(), 4);
    let reader = ReaderPolicy {
        stall_timeout: Duration::from_secs(30),
        min_read_rate: 0.5,
        rate_window: Duration::from_secs(1),
    };
    let scheduler = Scheduler::start_with(WorkerConfig { reader, ..base }, loader(dir.path().into(), 2));
    tokio::time::timeout(LIMIT, async {
        ready(&scheduler).await;
        // Greedy sampling: on the tiny checkpoint this text's most likely main token is never
        // EOS, so the crawler's job is far longer than every buffer on its way.
        let mut long = job("The first sentence is spoken here.", 2048);
        long.options.params = SamplingParams { top_k: Some(1), ..SamplingParams::default() };
        let mut crawling = scheduler.submit(long).unwrap();
        let mut live = scheduler.submit(job(TEXT, 120)).unwrap();
        let started = Instant::now();
        let ((crawl_events, crawl_samples), (live_events, live_samples)) =
            tokio::join!(read_at(&mut crawling, 0.2, &scheduler), read_at(&mut live, 2.0, &scheduler));
        // The crawler (0.2×) ends without `Finished`: found in its first rate window once its
        // buffers are full, while most of its frames are still to come.
        assert!(
            crawl_events.iter().all(|e| !matches!(e, JobEvent::Finished { .. })),
            "the crawling reader was given up: {crawl_events:?}"
        );
        // What it took: its reply channel's events, and the few it read itself before the verdict
        // (its dropped outbox never reaches it).
        let event = 8 * 2048;
        assert!(crawl_samples <= (REPLY_CAPACITY + 16) * event, "only its buffered audio: {crawl_samples} samples");
        assert!(started.elapsed() < Duration::from_secs(40), "given up after {:?}", started.elapsed());
        // The live reader (2×) gets every frame and its end.
        assert!(
            matches!(live_events[..], [JobEvent::Started { .. }, JobEvent::Finished { frames: 120, .. }]),
            "{live_events:?}"
        );
        assert_eq!(live_samples, 120 * 2048);
    })
    .await
    .expect("bounded");
}
