//! The engines the worker can load, each as a [`Loader`]: checkpoint → resident weights → engine,
//! then [`ModelHost::serve`]. Both run the same generation code (`engine::generate`) over their
//! backend; the CUDA loader also opens the GPU on the worker thread and admits the model against
//! the memory budget before uploading anything.

use std::path::PathBuf;

use super::codec::{AudioCodec, CodecThread};
use super::{Encoded, Loader, MemoryUse, ModelHost, Opened, Prefilled, StreamId, SynthError, Synthesizer};
use crate::backend::Backend;
use crate::backend::cpu::Cpu;
use std::cell::RefCell;

use crate::engine::batch::GraphStats;
use crate::engine::generate::{
    Engine, GenerateError, GenerateOptions, Generation, LoadModelError, ResidentModel, Stepped,
};
use crate::engine::prefix::{PrefixCache, PrefixCacheStats, SharedPrefix};
use crate::model::codec::CodecError;
use crate::model::codec::encode::CodecEncoder;
#[cfg(feature = "cuda")]
use crate::model::file_order::ReadStats;
use crate::model::frame::Rows;
use crate::model::load::{Checkpoint, UPLOAD_REPORT_BYTES};
use crate::model::memory::device_budget;
use crate::model::sampling::SamplingParams;
use crate::model::vocabulary::Vocabulary;

/// Rows budgeted for a prompt on top of `max_frames` when sizing the CPU engine's memory report.
const PROMPT_ROWS_ALLOWANCE: usize = 4096;

/// How the CUDA engine is opened (`serve --gpu-memory-budget`, `--context-length`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuOptions {
    pub ordinal: usize,
    /// Hard cap on device memory; `None`: free memory at start minus a reserve.
    pub memory_budget: Option<u64>,
    /// Positions (prompt rows + frames) each request's caches hold.
    pub context: usize,
    /// Each frame as one captured CUDA graph (`false`: the host-driven loop, `--no-cuda-graph`).
    pub graph: bool,
    /// How the weights are read at start (`--weights-io`; `model::file_order`).
    pub weights_io: crate::checkpoint::sequential::ReadMode,
    /// Threads reading them (`--weights-readers`, resolved: at least 1).
    pub weights_readers: usize,
}

/// How the decode batch is sized (`serve --max-batch`, `--prefill-chunk`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchLimits {
    /// Streams stepped together; `None`: the engine's default (the CPU's, or what the GPU budget holds).
    pub max_batch: Option<usize>,
    /// Prompt rows per prefill call.
    pub prefill_chunk: usize,
    /// Bytes for saved voices' prompt prefixes (`engine::prefix`; `serve --voice-cache-mib`);
    /// 0 keeps none. On the GPU they are reserved at start-up, a term of the memory plan.
    pub voice_cache_bytes: usize,
    /// The codec on a thread (and GPU stream) of its own, overlapping the steps
    /// (`scheduler::codec`); `false` decodes inside each step (`serve --no-codec-thread`).
    pub codec_thread: bool,
}

/// The voice cache's size unless `--voice-cache-mib` says otherwise: at full size a voice with a
/// 10 s reference keeps 77 MiB (the GDN states are 63 MiB of it), so 2 GiB holds 26 (measured,
/// `docs/perf/2026-12-04-voice-prefix.md`).
pub const DEFAULT_VOICE_CACHE_BYTES: usize = 2 << 30;

/// The load's progress while weights upload: what the log and systemd's `STATUS=` show.
pub(super) fn upload_stage(done: u64, total: u64) -> String {
    let gib = |b: u64| b as f64 / f64::from(1u32 << 30);
    format!("uploading weights: {:.1} of {:.1} GiB", gib(done), gib(total))
}

/// One line once the weights are resident: how many bytes, how long, how fast (a warm start reads
/// the page cache, a cold one the disk; `docs/operations.md`, "Startup").
pub(super) fn log_upload(ckpt: &Checkpoint, took: std::time::Duration) {
    let gib = ckpt.shard_tensor_bytes() as f64 / f64::from(1u32 << 30);
    let secs = took.as_secs_f64();
    tracing::info!(gib, secs, gib_per_s = gib / secs.max(1e-9), "engine: weights resident (checked finite, uploaded)");
}

/// [`log_upload`] for the file-order upload: also how the files were read, and a warning where
/// the file system refused direct I/O (a cold start then goes through the page cache).
#[cfg(feature = "cuda")]
pub(super) fn log_file_order_upload(ckpt: &Checkpoint, took: std::time::Duration, read: &ReadStats) {
    let gib = |b: u64| b as f64 / f64::from(1u32 << 30);
    let secs = took.as_secs_f64();
    tracing::info!(
        gib = gib(ckpt.shard_tensor_bytes()),
        secs,
        gib_per_s = gib(ckpt.shard_tensor_bytes()) / secs.max(1e-9),
        read_gib = gib(read.bytes),
        read_secs = read.took.as_secs_f64(),
        read_gib_per_s = read.gib_per_s(),
        from_page_cache_gib = gib(read.cached),
        direct_io_gib = gib(read.direct),
        buffered_gib = gib(read.buffered),
        "engine: weights resident (read in file order, checked finite, uploaded)"
    );
    if read.direct_refused_files > 0 {
        tracing::warn!(
            files = read.direct_refused_files,
            "engine: the file system refused direct I/O for the weights; they were read through the page cache"
        );
    }
}

/// The CPU reference engine: checkpoint → resident weights → engine, then serve.
pub fn cpu_loader(model_dir: PathBuf, max_frames: usize, limits: BatchLimits) -> Loader {
    Box::new(move |host: &mut dyn ModelHost| {
        host.progress(&format!("opening checkpoint {}", model_dir.display()));
        let ckpt = Checkpoint::open(&model_dir)?;
        host.progress("loading weights");
        let started = std::time::Instant::now();
        let model = ResidentModel::load_reporting(&ckpt, &Cpu, UPLOAD_REPORT_BYTES, &mut |done, total| {
            host.progress(&upload_stage(done, total))
        })?;
        log_upload(&ckpt, started.elapsed());
        host.progress("building the engine");
        let max_batch = limits.max_batch.unwrap_or(crate::config::CPU_MAX_BATCH);
        let budget = device_budget(&ckpt, max_frames + PROMPT_ROWS_ALLOWANCE);
        let memory = MemoryUse {
            in_use: budget.model_weights + budget.codec_weights,
            budget: budget.total(max_batch),
            allocations_after_warm_up: 0,
        };
        let batch = BatchOptions { max_batch, prefill_chunk: limits.prefill_chunk, context: None };
        let encoder = CodecEncoder::load(&ckpt, &Cpu).map_err(LoadModelError::from)?;
        let prefixes = PrefixCache::new(&Cpu, limits.voice_cache_bytes);
        let codec = CodecThread::new(&model.codec, &Cpu, max_batch);
        let engine = EngineModel::new(&Cpu, &ckpt, &model, batch, Box::new(move || memory))?
            .with_encoder(Box::new(move |samples: &[f32]| encoder.encode(&Cpu, samples)))
            .with_prefix_cache(&prefixes);
        let engine = if limits.codec_thread { engine.with_codec_thread(&codec) } else { engine };
        tracing::info!(max_batch, prefill_chunk = limits.prefill_chunk, "engine: decode batch");
        host.serve(&engine);
        Ok(())
    })
}

/// A loaded engine on backend `B` as the worker's [`Synthesizer`]: its streams live in slots.
pub struct EngineModel<'w, B: Backend> {
    engine: Engine<'w, B>,
    vocabulary: Vocabulary,
    samples_per_frame: usize,
    /// Codes per frame (the width of a prompt row, less its token).
    codebooks: usize,
    /// Positions a request's caches hold, where they are fixed (the GPU's); `None`: unbounded.
    context: Option<usize>,
    max_batch: usize,
    /// Prompt rows run per prefill call (`--prefill-chunk`).
    prefill_chunk: usize,
    slots: RefCell<Vec<Option<Generation<'w, B>>>>,
    memory: Box<dyn Fn() -> MemoryUse + 'w>,
    health: Option<Box<dyn Fn() -> Result<(), String> + 'w>>,
    /// The codec encoder (voice cloning): a clip → codes `[frames, codebooks]`.
    encoder: Option<ReferenceEncoder<'w>>,
    /// The codec on its own thread: streams hand their frame groups out as codes.
    codec_thread: Option<&'w dyn AudioCodec>,
}

/// How an engine encodes a reference clip (on its own backend: the CPU's, or the GPU in f32).
pub type ReferenceEncoder<'w> = Box<dyn Fn(&[f32]) -> Result<Vec<u32>, CodecError> + 'w>;

impl<'w, B: Backend> EngineModel<'w, B> {
    pub fn new(
        backend: &'w B,
        ckpt: &'w Checkpoint,
        model: &'w ResidentModel<B>,
        batch: BatchOptions,
        memory: Box<dyn Fn() -> MemoryUse + 'w>,
    ) -> Result<Self, crate::engine::generate::LoadModelError> {
        assert!(batch.max_batch > 0 && batch.prefill_chunk > 0, "a batch of no streams or a prefill of no rows");
        Ok(EngineModel {
            engine: Engine::new(backend, ckpt, model)?,
            vocabulary: Vocabulary::of(ckpt),
            samples_per_frame: ckpt.codec_dims.samples_per_frame(),
            codebooks: ckpt.dims.codebooks,
            context: batch.context,
            max_batch: batch.max_batch,
            prefill_chunk: batch.prefill_chunk,
            slots: RefCell::new((0..batch.max_batch).map(|_| None).collect()),
            memory,
            health: None,
            encoder: None,
            codec_thread: None,
        })
    }

    /// Runs the codec on a thread of its own (`scheduler::codec`): each stream's frame groups
    /// leave its step as codes, and the worker runs `codec` beside the steps.
    pub fn with_codec_thread(mut self, codec: &'w dyn AudioCodec) -> Self {
        self.codec_thread = Some(codec);
        self
    }

    /// Decodes inside each step again (before any stream is open).
    pub fn without_codec_thread(mut self) -> Self {
        assert!(self.slots.get_mut().iter().all(Option::is_none), "without_codec_thread with streams open");
        self.codec_thread = None;
        self
    }

    /// Produces frames with a backend's device-side step (see [`Engine::set_device_frames`]); it
    /// serves one request at a time, so the engine's batch becomes one.
    pub fn with_device_frames(mut self, device: &'w dyn crate::engine::generate::DeviceFrames) -> Self {
        self.engine.set_device_frames(device);
        self.max_batch = 1;
        self.slots.get_mut().truncate(1);
        self
    }

    /// Runs the decode batch's steps with a backend's device-side draws (see
    /// [`Engine::set_device_draws`]).
    pub fn with_device_draws(mut self, draws: &'w dyn crate::engine::batch::DeviceDraws<B>) -> Self {
        self.engine.set_device_draws(draws);
        self
    }

    /// Asks `check` whether the engine still works after a failed job (see
    /// [`Synthesizer::health`]).
    pub fn with_health_check(mut self, check: Box<dyn Fn() -> Result<(), String> + 'w>) -> Self {
        self.health = Some(check);
        self
    }

    /// Keeps voices' prompt prefixes in `cache` (`engine::prefix`); give a device-side step the
    /// same cache.
    pub fn with_prefix_cache(mut self, cache: &'w PrefixCache<'w, B>) -> Self {
        self.engine.set_prefix_cache(cache);
        self
    }

    /// Encodes reference clips with `encoder` (see [`Synthesizer::encode_reference`]).
    pub fn with_encoder(mut self, encoder: ReferenceEncoder<'w>) -> Self {
        self.encoder = Some(encoder);
        self
    }

    /// Runs serving's largest shapes once before the first request, in two rounds (one with a
    /// single slot), closing every stream after each:
    /// 1. every slot open, one stream with a prompt of a whole prefill chunk, all prefilled
    ///    together, then all stepped together until each has decoded the codec's largest group
    ///    (unless it stops first);
    /// 2. every slot but one stepping (on the GPU their step is a captured graph from its second
    ///    step on, which holds its own buffers) while the last one's whole-chunk prompt is
    ///    prefilled beside them, then all stepped to the end.
    ///
    /// On the GPU the activation pool then holds buffers for the largest step and for a prefill
    /// beside a held graph, and any smaller step reuses them (`Pool::take`): serving makes no
    /// driver allocation.
    pub fn warm_up(&self) -> Result<WarmUp, SynthError> {
        let frames = crate::engine::generate::frames_to_largest_group();
        let opts = |seed| GenerateOptions { params: SamplingParams::default(), seed, max_frames: frames, stall: None };
        // Rows of one text token: what the rows say does not matter, only their shapes.
        let room = self.context.map_or(usize::MAX, |c| c.saturating_sub(frames + 1)).max(1);
        let prompt = |len: usize| {
            let mut rows = Rows::new(self.codebooks);
            (0..len.min(room)).for_each(|_| rows.push_text(WARM_UP_TOKEN));
            rows
        };
        let (long, short) = (prompt(self.prefill_chunk), prompt(WARM_UP_SHORT_PROMPT));
        let mut ids = Vec::with_capacity(self.max_batch);
        let mut warm = WarmUp { streams: 0, frames: 0 };
        let round = |late: bool, ids: &mut Vec<StreamId>, warm: &mut WarmUp| -> Result<(), SynthError> {
            let opened = |rows: &Rows, ids: &mut Vec<StreamId>| -> Result<StreamId, SynthError> {
                let id = self.open(rows, SharedPrefix::NONE, &opts(ids.len() as u64))?.id;
                ids.push(id);
                Ok(id)
            };
            for i in 0..self.max_batch - usize::from(late) {
                opened(if i == 0 && !late { &long } else { &short }, ids)?;
            }
            self.prefill_all(ids)?;
            let mut live = ids.clone();
            if late {
                // Two steps (the second captured on the GPU), then the long prompt beside them.
                for _ in 0..2 {
                    live = self.step_live(&live, &mut warm.frames)?;
                }
                let joining = opened(&long, ids)?;
                self.prefill_all(&[joining])?;
                live.push(joining);
            }
            while !live.is_empty() {
                live = self.step_live(&live, &mut warm.frames)?;
            }
            warm.streams += ids.len();
            Ok(())
        };
        let mut result = Ok(());
        // One slot has no other stream to step beside the long prompt: the first round covers it.
        let rounds = if self.max_batch > 1 { [false, true].as_slice() } else { [false].as_slice() };
        for &late in rounds {
            result = round(late, &mut ids, &mut warm);
            for id in ids.drain(..) {
                self.close(id);
            }
            if result.is_err() {
                break;
            }
        }
        result.map(|()| warm)
    }

    /// Runs the prompts of `ids` to their ends, all prefilled together chunk by chunk.
    fn prefill_all(&self, ids: &[StreamId]) -> Result<(), SynthError> {
        let mut prefilling = ids.to_vec();
        while !prefilling.is_empty() {
            let done = self.prefill_together(&prefilling)?;
            prefilling = prefilling.into_iter().zip(done).filter(|(_, p)| !p.done).map(|(id, _)| id).collect();
        }
        Ok(())
    }

    /// One step of `live`, counting its frames into `frames`; returns the streams that go on.
    fn step_live(&self, live: &[StreamId], frames: &mut usize) -> Result<Vec<StreamId>, SynthError> {
        let results = self.step(live);
        *frames += live.len();
        let mut going = Vec::with_capacity(live.len());
        for (&id, result) in live.iter().zip(results) {
            if result?.finished.is_none() {
                going.push(id);
            }
        }
        Ok(going)
    }

    /// The next prompt chunk of each of `ids` (distinct open slots), in one call.
    fn prefill_together(&self, ids: &[StreamId]) -> Result<Vec<Prefilled>, SynthError> {
        let mut slots = self.slots.borrow_mut();
        let mut by_slot: Vec<Option<&mut Generation<'_, B>>> = slots.iter_mut().map(Option::as_mut).collect();
        let mut generations: Vec<&mut Generation<'_, B>> = (ids.iter())
            .map(|&id| by_slot.get_mut(id).and_then(Option::take).unwrap_or_else(|| panic!("stream {id} is not open")))
            .collect();
        let before: Vec<usize> = generations.iter().map(|g| g.prefilled_rows()).collect();
        let done = self.engine.prefill_generations(&mut generations, self.prefill_chunk)?;
        Ok((generations.iter().zip(before).zip(done))
            .map(|((g, before), done)| Prefilled { rows: g.prefilled_rows() - before, done })
            .collect())
    }

    /// `options` for a prompt of `rows` in this engine's context: as the reference, frames stop
    /// where the context ends ("length"), and a prompt that leaves no room for one frame is
    /// refused.
    fn fitted(&self, rows: &Rows, options: &GenerateOptions) -> Result<GenerateOptions, SynthError> {
        let mut options = options.clone();
        if let Some(context) = self.context {
            if rows.len() >= context {
                return Err(GenerateError::ContextFull { prompt_rows: rows.len(), context }.into());
            }
            options.max_frames = options.max_frames.min(context - rows.len());
        }
        Ok(options)
    }

    /// Prompt rows a stream just opened with `prefix` restored: all of the prefix if the cache
    /// counted a hit since it stood at `hits_before`.
    fn restored(&self, hits_before: u64, prefix: SharedPrefix) -> usize {
        if self.prefix_cache().is_some_and(|c| c.hits > hits_before) { prefix.rows } else { 0 }
    }

    fn with_slot<R>(&self, id: StreamId, f: impl FnOnce(&mut Generation<'w, B>) -> R) -> R {
        let mut slots = self.slots.borrow_mut();
        f(slots.get_mut(id).and_then(Option::as_mut).unwrap_or_else(|| panic!("stream {id} is not open")))
    }
}

/// The text token of the warm-up's prompts (any id the vocabulary has).
const WARM_UP_TOKEN: u32 = 0;
/// Prompt rows of every warm-up stream but the first (which fills a prefill chunk).
const WARM_UP_SHORT_PROMPT: usize = 8;

/// What [`EngineModel::warm_up`] ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WarmUp {
    pub streams: usize,
    /// Frames stepped over all streams.
    pub frames: usize,
}

/// How many streams an engine steps together, and how its prompts are cut.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchOptions {
    pub max_batch: usize,
    /// Prompt rows per prefill call.
    pub prefill_chunk: usize,
    /// Positions a request's caches hold, where fixed (the GPU's).
    pub context: Option<usize>,
}

impl<B: Backend> Synthesizer for EngineModel<'_, B> {
    fn sample_rate(&self) -> u32 {
        crate::audio::CODEC_SAMPLE_RATE
    }

    fn samples_per_frame(&self) -> usize {
        self.samples_per_frame
    }

    fn memory(&self) -> MemoryUse {
        (self.memory)()
    }

    fn vocabulary(&self) -> Vocabulary {
        self.vocabulary.clone()
    }

    fn health(&self) -> Result<(), String> {
        self.health.as_ref().map_or(Ok(()), |check| check())
    }

    fn max_batch(&self) -> usize {
        self.max_batch
    }

    fn open(&self, rows: &Rows, prefix: SharedPrefix, options: &GenerateOptions) -> Result<Opened, SynthError> {
        let options = self.fitted(rows, options)?;
        let hits = self.prefix_cache().map_or(0, |c| c.hits);
        let mut generation = self.engine.start_prompt(rows, prefix, &options)?;
        if self.codec_thread.is_some() {
            generation.detach_audio();
        }
        let restored_rows = self.restored(hits, prefix);
        let mut slots = self.slots.borrow_mut();
        let id = slots.iter().position(Option::is_none).expect("the worker keeps at most max_batch streams open");
        slots[id] = Some(generation);
        Ok(Opened { id, restored_rows })
    }

    fn continue_stream(
        &self,
        id: StreamId,
        rows: &Rows,
        prefix: SharedPrefix,
        options: &GenerateOptions,
        hold: bool,
    ) -> Result<Opened, SynthError> {
        let options = self.fitted(rows, options)?;
        let hits = self.prefix_cache().map_or(0, |c| c.hits);
        self.with_slot(id, |g| {
            self.engine.continue_prompt(g, rows, prefix, &options)?;
            if hold {
                g.hold_audio();
            }
            Ok::<_, GenerateError>(())
        })?;
        Ok(Opened { id, restored_rows: self.restored(hits, prefix) })
    }

    fn settle_chunk(&self, id: StreamId, keep: bool) -> Result<Stepped, SynthError> {
        Ok(self.with_slot(id, |g| g.settle_audio(keep))?)
    }

    fn produced(&self, id: StreamId) -> Rows {
        self.with_slot(id, |g| g.produced().clone())
    }

    fn prefix_cache(&self) -> Option<PrefixCacheStats> {
        self.engine.prefix_cache().map(PrefixCache::stats)
    }

    fn step_graphs(&self) -> Option<GraphStats> {
        self.engine.device_draws().and_then(|draws| draws.graph_stats())
    }

    fn prefill_chunk(&self) -> usize {
        self.prefill_chunk
    }

    fn prefill(&self, ids: &[StreamId]) -> Vec<Result<Prefilled, SynthError>> {
        let together = self.prefill_together(ids);
        match together {
            Ok(done) => done.into_iter().map(Ok).collect(),
            // The backbone checks every stream's rows and state before it runs any (a failure
            // there changed nothing), so each stream can be retried alone: only a stream that
            // fails alone fails. A fault past the checks is the device's, and fails them all.
            Err(_) if ids.len() > 1 => {
                ids.iter().map(|&id| self.prefill_together(&[id]).map(|mut p| p.remove(0))).collect()
            }
            Err(e) => vec![Err(e)],
        }
    }

    fn step(&self, ids: &[StreamId]) -> Vec<Result<Stepped, SynthError>> {
        let mut slots = self.slots.borrow_mut();
        // Each id's generation, in the order of `ids` (distinct open slots).
        let mut by_slot: Vec<Option<&mut Generation<'_, B>>> = slots.iter_mut().map(Option::as_mut).collect();
        let mut generations: Vec<&mut Generation<'_, B>> = (ids.iter())
            .map(|&id| by_slot.get_mut(id).and_then(Option::take).unwrap_or_else(|| panic!("stream {id} is not open")))
            .collect();
        let results = self.engine.step(&mut generations);
        results.into_iter().map(|r| r.map_err(SynthError::from)).collect()
    }

    fn cancel(&self, id: StreamId) -> Result<Stepped, SynthError> {
        Ok(self.with_slot(id, Generation::cancel)?)
    }

    fn audio_codec(&self) -> Option<&dyn AudioCodec> {
        self.codec_thread
    }

    fn close(&self, id: StreamId) -> usize {
        self.slots.borrow_mut().get_mut(id).and_then(Option::take).map_or(0, |g| g.frames())
    }

    fn encodes_references(&self) -> bool {
        self.encoder.is_some()
    }

    fn encode_reference(&self, samples: &[f32]) -> Result<Encoded, SynthError> {
        let encoder = self
            .encoder
            .as_ref()
            .ok_or_else(|| SynthError::Encode(String::from("this engine has no codec encoder")))?;
        let codes = encoder(samples).map_err(|e| SynthError::Encode(e.to_string()))?;
        Ok(Encoded { codes, codebooks: self.codebooks })
    }
}
