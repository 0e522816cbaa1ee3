//! Generation (`model.md` §8.1): prompt rows → backbone prefill → tower prefill → one frame per
//! step (main token with RAS, 13 tower layers with 9 head draws, the frame fed back to the
//! backbone) until EOS or `max_frames` → PCM from the streaming codec, delivered as it is
//! produced. A [`Generation`] is one request's; [`Engine::step`] advances many together (the
//! decode batch, `engine::batch`), and [`Engine::generate`] runs one to its end. The caller can
//! stop a generation between frames.

use std::ops::ControlFlow;

use super::audio::AudioOut;
pub use super::audio::{MAX_CODEC_GROUP, codec_group, frames_to_largest_group};
use super::batch::{DeviceDraws, Stream};
use super::generation::Source;
pub use super::generation::{Generation, Stepped};
use super::prefix::{PrefixCache, SharedPrefix};
pub use super::stall::StallGuard;
use crate::backend::tower::TowerError;
use crate::backend::{Backend, FileOrderUpload};
use crate::model::backbone::{Backbone, BackboneConfig, BackboneError};
use crate::model::codec::encode::EncoderParams;
use crate::model::codec::{CodecError, CodecModel, HostTensor};
use crate::model::file_order::{FileOrderOptions, ReadStats};
use crate::model::frame::Rows;
use crate::model::load::Checkpoint;
use crate::model::sampling::{MainCandidates, SamplingError, SamplingParams};
use crate::model::tower::Tower;
use crate::model::weights::{ModelWeights, WeightError};

/// Per-request generation options.
#[derive(Clone, Debug, PartialEq)]
pub struct GenerateOptions {
    pub params: SamplingParams,
    pub seed: u64,
    /// Frames to generate at most; reaching it ends with [`FinishReason::Length`].
    pub max_frames: usize,
    /// Ends the generation ([`FinishReason::Stalled`]) once its audio stands still (a long
    /// request's chunks; `None` elsewhere).
    pub stall: Option<StallGuard>,
}

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// The model produced EOS.
    Stop,
    /// `max_frames` was reached; the audio of every produced frame is kept.
    Length,
    /// The caller stopped it between frames.
    Cancelled,
    /// The stall guard ([`GenerateOptions::stall`]) cut it: its audio stood still. The audio of
    /// every produced frame is kept. Clients see `length` (it was cut at a bound).
    Stalled,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Cancelled => "cancelled",
            FinishReason::Stalled => "length",
        }
    }

    /// Whether it was cut at a bound (`max_frames` or the stall guard) rather than ending on
    /// its own or by the caller.
    pub fn is_cut(self) -> bool {
        matches!(self, FinishReason::Length | FinishReason::Stalled)
    }
}

/// What a finished generation produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finished {
    pub reason: FinishReason,
    /// Audio frames produced (the EOS frame is not one).
    pub frames: usize,
    /// Every produced frame `[main, c0..c9]`, in order.
    pub rows: Rows,
}

#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    #[error("backbone: {0}")]
    Backbone(#[from] BackboneError),
    #[error("tower: {0}")]
    Tower(#[from] TowerError),
    #[error("sampling: {0}")]
    Sampling(#[from] SamplingError),
    #[error("codec: {0}")]
    Codec(#[from] CodecError),
    #[error("the prompt has no rows")]
    EmptyPrompt,
    #[error("the prompt has {prompt_rows} rows; the engine's context holds {context}, leaving no room for audio")]
    ContextFull { prompt_rows: usize, context: usize },
    #[error("{prompt_rows} prompt rows + {max_frames} frames exceed the engine's context of {context} positions")]
    FramesPastContext { prompt_rows: usize, max_frames: usize, context: usize },
    /// The step's shared computation failed, so every stream in it did (the first error's text).
    #[error("the batch step failed: {0}")]
    Batch(String),
}

/// The frames of one request, one per call, each `[main, c0..c9]` (the EOS frame included: the
/// caller stops on it). The host-driven loop below serves any backend; a backend may bring a
/// device-side step instead ([`DeviceFrames`]) that makes the same decisions.
pub trait FrameSource {
    /// The next frame. `last`: no frame will be asked after this one, so the backbone need not
    /// run its row (a source may run it anyway).
    fn next_frame(&mut self, last: bool) -> Result<Vec<u32>, GenerateError>;
}

/// A backend's own way of producing frames (e.g. the whole per-frame step as one CUDA graph).
pub trait DeviceFrames {
    /// Runs the prompt (its chunks restarting at the end of `prefix`, as the decode batch's do)
    /// and returns the request's frames.
    fn start(
        &self,
        rows: &Rows,
        prefix: SharedPrefix,
        opts: &GenerateOptions,
    ) -> Result<Box<dyn FrameSource + '_>, GenerateError>;
}

/// Where generated audio goes, and whether to go on.
pub trait AudioSink {
    /// PCM (mono f32, 44.1 kHz) as the codec produces it; `Break` stops the generation.
    fn audio(&mut self, pcm: &[f32]) -> ControlFlow<()>;

    /// Asked after every frame, so a cancelled request stops within one frame even while the
    /// codec is still gathering frames into a group.
    fn keep_going(&mut self) -> ControlFlow<()> {
        ControlFlow::Continue(())
    }
}

impl<F: FnMut(&[f32]) -> ControlFlow<()>> AudioSink for F {
    fn audio(&mut self, pcm: &[f32]) -> ControlFlow<()> {
        self(pcm)
    }
}

/// Weights made resident on backend `B`, owned for as long as an [`Engine`] borrows them.
pub struct ResidentModel<B: Backend> {
    pub weights: ModelWeights<B::Weight>,
    pub codec: CodecModel<B>,
}

impl<B: Backend> ResidentModel<B> {
    /// Uploads backbone and tower weights on this thread (the backend's) while another thread
    /// prepares the codec's host image (reading `codec.pth`, folding weight norm), then uploads
    /// that too.
    pub fn load(ckpt: &Checkpoint, backend: &B) -> Result<ResidentModel<B>, LoadModelError> {
        Self::load_reporting(ckpt, backend, u64::MAX, &mut |_, _| {})
    }

    /// [`ResidentModel::load`], reporting the weights' upload as `report(bytes done, bytes in all)`
    /// ([`Checkpoint::upload_model_weights_reporting`]).
    pub fn load_reporting(
        ckpt: &Checkpoint,
        backend: &B,
        every: u64,
        report: &mut dyn FnMut(u64, u64),
    ) -> Result<ResidentModel<B>, LoadModelError> {
        std::thread::scope(|scope| {
            let codec_host = std::thread::Builder::new()
                .name(String::from("limelight-codec-load"))
                .spawn_scoped(scope, || crate::model::codec::host_params(ckpt))
                .expect("spawning the codec loading thread");
            let weights = ckpt.upload_model_weights_reporting(backend, every, report)?;
            let host = codec_host.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))?;
            Ok(ResidentModel { weights, codec: CodecModel::from_host(ckpt, backend, host) })
        })
    }
}

/// The codec encoder's weights prepared on the host while the backbone's stream
/// (`model::codec::encode::host_params`), or why they could not be read: for the loader to
/// upload once it knows the encoder fits (`CodecEncoder::from_host`).
pub type EncoderHost = Result<EncoderParams<HostTensor>, CodecError>;

impl<B: Backend + FileOrderUpload> ResidentModel<B> {
    /// [`ResidentModel::load_reporting`] for a backend that takes weights in file order
    /// (`model::file_order`): the shard files are read once, front to back, while the codec's
    /// host image, and the encoder's, are prepared on two other threads. Returns how the files
    /// were read, and the encoder's host image.
    pub fn load_in_file_order(
        ckpt: &Checkpoint,
        backend: &B,
        options: FileOrderOptions,
        every: u64,
        report: &mut dyn FnMut(u64, u64),
    ) -> Result<(ResidentModel<B>, ReadStats, EncoderHost), LoadModelError> {
        std::thread::scope(|scope| {
            let spawn = |name: &str| std::thread::Builder::new().name(format!("limelight-{name}-load"));
            let codec_host = spawn("codec")
                .spawn_scoped(scope, || crate::model::codec::host_params(ckpt))
                .expect("spawning the codec loading thread");
            let encoder_host = spawn("encoder")
                .spawn_scoped(scope, || crate::model::codec::encode::host_params(ckpt))
                .expect("spawning the encoder loading thread");
            let (weights, stats) = ckpt.upload_model_weights_in_file_order(backend, options, every, report)?;
            let host = codec_host.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))?;
            let encoder = encoder_host.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            Ok((ResidentModel { weights, codec: CodecModel::from_host(ckpt, backend, host) }, stats, encoder))
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LoadModelError {
    #[error(transparent)]
    Weights(#[from] WeightError),
    #[error(transparent)]
    Codec(#[from] CodecError),
    #[error(transparent)]
    Backbone(#[from] BackboneError),
    #[error(transparent)]
    Tower(#[from] TowerError),
}

/// The whole model over weights resident on backend `B`.
pub struct Engine<'w, B: Backend> {
    pub backend: &'w B,
    pub backbone: Backbone<'w, B>,
    pub tower: Tower<'w, B>,
    pub codec: &'w CodecModel<B>,
    pub candidates: MainCandidates,
    /// For candidate `i`, the index of its token in the backbone's restricted logits.
    pub(super) logit_index: Vec<usize>,
    pub eos: u32,
    /// The backend's device-side frames, when it has them; else the decode batch runs.
    device: Option<&'w dyn DeviceFrames>,
    /// The backend's device-side draws for the decode batch, when it has them; else the host draws.
    draws: Option<&'w dyn DeviceDraws<B>>,
    /// Kept prompt prefixes (voices), when the engine keeps them.
    prefixes: Option<&'w PrefixCache<'w, B>>,
}

/// The backbone, the tower and the main-token candidates over resident weights: what every
/// engine (this one, and the GPU's device-side steps) is built from.
pub fn model_parts<'a, B: Backend>(
    backend: &'a B,
    ckpt: &Checkpoint,
    model: &'a ResidentModel<B>,
) -> Result<(Backbone<'a, B>, Tower<'a, B>, MainCandidates), LoadModelError> {
    let w = &model.weights;
    let config = BackboneConfig::from_model_config(&ckpt.config);
    let backbone = Backbone::new(backend, config, &w.backbone, &w.tower.codebook_embeddings)?;
    let tower = Tower::new(backend, &w.tower, &ckpt.config)?;
    Ok((backbone, tower, MainCandidates::from_special_tokens(&ckpt.special_tokens)))
}

impl<'w, B: Backend> Engine<'w, B> {
    pub fn new(backend: &'w B, ckpt: &Checkpoint, model: &'w ResidentModel<B>) -> Result<Self, LoadModelError> {
        let (backbone, tower, candidates) = model_parts(backend, ckpt, model)?;
        let head_ids = backbone.restricted_token_ids();
        let logit_index = candidates
            .ids()
            .iter()
            .map(|id| head_ids.iter().position(|h| h == id).expect("the restricted head covers every candidate"))
            .collect();
        Ok(Engine {
            backend,
            backbone,
            tower,
            codec: &model.codec,
            candidates,
            logit_index,
            eos: ckpt.special_tokens.eos(),
            device: None,
            draws: None,
            prefixes: None,
        })
    }

    /// Produces frames with `device` instead of the decode batch (same decisions, fewer round
    /// trips; one request at a time).
    pub fn with_device_frames(mut self, device: &'w dyn DeviceFrames) -> Self {
        self.set_device_frames(device);
        self
    }

    /// [`Self::with_device_frames`] in place.
    pub fn set_device_frames(&mut self, device: &'w dyn DeviceFrames) {
        self.device = Some(device);
    }

    /// Runs the decode batch's steps with `draws` (the same decisions as the host draws, with no
    /// read-back between a draw and the layer that embeds it).
    pub fn with_device_draws(mut self, draws: &'w dyn DeviceDraws<B>) -> Self {
        self.set_device_draws(draws);
        self
    }

    /// [`Self::with_device_draws`] in place.
    pub fn set_device_draws(&mut self, draws: &'w dyn DeviceDraws<B>) {
        self.draws = Some(draws);
    }

    /// Keeps the state after prompts' shared prefixes in `cache` and starts later prompts with an
    /// equal prefix from it (`engine::prefix`). A device-side step keeps its own (it is given the
    /// same cache when it is built).
    pub fn set_prefix_cache(&mut self, cache: &'w PrefixCache<'w, B>) {
        self.prefixes = Some(cache);
    }

    /// The kept prompt prefixes, if the engine keeps them.
    pub fn prefix_cache(&self) -> Option<&'w PrefixCache<'w, B>> {
        self.prefixes
    }

    /// The decode batch's device-side draws, if set.
    pub fn device_draws(&self) -> Option<&'w dyn DeviceDraws<B>> {
        self.draws
    }

    /// Whether frames come from a device-side step.
    pub fn has_device_frames(&self) -> bool {
        self.device.is_some()
    }

    /// Runs the prompt and returns the request's frames, from the device-side step if the engine
    /// has one, else from the batched step over this one stream (benches time it directly).
    pub fn frames<'a>(
        &'a self,
        rows: &Rows,
        opts: &'a GenerateOptions,
    ) -> Result<Box<dyn FrameSource + 'a>, GenerateError> {
        if rows.is_empty() {
            return Err(GenerateError::EmptyPrompt);
        }
        match &self.device {
            Some(device) => device.start(rows, SharedPrefix::NONE, opts),
            None => {
                let mut stream = self.stream(rows, opts)?;
                while !self.prefill(&mut stream, PREFILL_CHUNK)? {}
                Ok(Box::new(HostFrames { engine: self, stream }))
            }
        }
    }

    /// Starts one request's generation. With a device-side step the prompt runs here (that step
    /// serves one request at a time); otherwise [`Engine::prefill_generation`] runs it in chunks.
    pub fn start(&self, rows: &Rows, opts: &GenerateOptions) -> Result<Generation<'w, B>, GenerateError> {
        self.start_prompt(rows, SharedPrefix::NONE, opts)
    }

    /// [`Engine::start`] for a prompt whose first rows other prompts share (`engine::prefix`): a
    /// kept prefix is restored, or the prompt's chunks restart at its end (and it is kept).
    pub fn start_prompt(
        &self,
        rows: &Rows,
        prefix: SharedPrefix,
        opts: &GenerateOptions,
    ) -> Result<Generation<'w, B>, GenerateError> {
        Ok(Generation {
            source: self.source(rows, prefix, opts)?,
            stall: opts.stall,
            audio: AudioOut::new(self.codec, self.backend),
            produced: Rows::new(rows.codebooks()),
            done: false,
        })
    }

    /// The next chunk of a long request (issue 15): `generation`, whose last chunk has ended,
    /// goes on with a new prompt `rows` (its own model state: nothing of the last chunk's
    /// backbone or tower state carries over), while its audio goes on in the same streaming
    /// decoder, so the chunks' PCM joins as one decode of all their frames. Its frames start
    /// over ([`Generation::produced`]: read the ended chunk's first, for the next prompts'
    /// history).
    ///
    /// # Panics
    /// If the generation has not ended (its chunk's audio must be all flushed).
    pub fn continue_prompt(
        &self,
        generation: &mut Generation<'w, B>,
        rows: &Rows,
        prefix: SharedPrefix,
        opts: &GenerateOptions,
    ) -> Result<(), GenerateError> {
        assert!(generation.done, "continue_prompt on a generation that has not ended");
        assert!(!generation.audio.holding(), "continue_prompt before the held chunk was settled");
        debug_assert!(!generation.audio.due(true), "the ended chunk's audio was flushed");
        generation.source = self.source(rows, prefix, opts)?;
        generation.stall = opts.stall;
        generation.done = false;
        generation.produced = Rows::new(rows.codebooks());
        Ok(())
    }

    /// Where a prompt's frames come from: the device-side step, or a new stream of the batch.
    fn source(
        &self,
        rows: &Rows,
        prefix: SharedPrefix,
        opts: &GenerateOptions,
    ) -> Result<Source<'w, B>, GenerateError> {
        Ok(match &self.device {
            Some(device) => Source::Device(device.start(rows, prefix, opts)?, opts.max_frames),
            None => Source::Batch(Box::new(self.prompt_stream(rows, prefix, opts)?)),
        })
    }

    /// Runs the next prompt chunk of `generation` (at most `chunk` rows); returns whether it can
    /// take frames.
    pub fn prefill_generation(&self, generation: &mut Generation<'_, B>, chunk: usize) -> Result<bool, GenerateError> {
        Ok(self.prefill_generations(&mut [generation], chunk)?[0])
    }

    /// The next prompt chunk of each generation, the chunks of all that are on the decode batch
    /// run together ([`Engine::prefill_streams`]); returns, per generation, whether it can take
    /// frames.
    pub fn prefill_generations(
        &self,
        generations: &mut [&mut Generation<'_, B>],
        chunk: usize,
    ) -> Result<Vec<bool>, GenerateError> {
        let mut streams: Vec<&mut Stream<B>> = (generations.iter_mut())
            .filter_map(|g| match &mut g.source {
                Source::Batch(stream) => Some(&mut **stream),
                Source::Device(..) => None,
            })
            .collect();
        let mut done = self.prefill_streams(&mut streams, chunk)?.into_iter();
        Ok((generations.iter())
            .map(|g| match g.source {
                Source::Device(..) => true,
                Source::Batch(_) => done.next().expect("one result per stream"),
            })
            .collect())
    }

    /// One frame of each generation (all prefilled, none done): the streams step together, the
    /// codec turns each one's frames into PCM. A failure fails its generation alone (its result
    /// is `Err`, and it must be dropped); the others go on.
    ///
    /// # Panics
    /// If a generation is not prefilled or is done.
    pub fn step(&self, generations: &mut [&mut Generation<'_, B>]) -> Vec<Result<Stepped, GenerateError>> {
        let mut rows: Vec<Option<Result<Vec<u32>, GenerateError>>> = (0..generations.len()).map(|_| None).collect();
        let mut batch: Vec<usize> = Vec::with_capacity(generations.len());
        for (i, g) in generations.iter_mut().enumerate() {
            assert!(!g.done, "step on a finished generation");
            match &mut g.source {
                Source::Device(frames, max_frames) => {
                    let last = g.produced.len() + 1 >= *max_frames;
                    rows[i] = Some(frames.next_frame(last));
                }
                Source::Batch(_) => batch.push(i),
            }
        }
        if !batch.is_empty() {
            let mut streams: Vec<&mut Stream<B>> = (generations.iter_mut())
                .filter_map(|g| match &mut g.source {
                    Source::Batch(stream) => Some(&mut **stream),
                    Source::Device(..) => None,
                })
                .collect();
            for (i, row) in batch.iter().zip(self.next_frames(&mut streams)) {
                rows[*i] = Some(row);
            }
        }
        // Each generation takes its frame; those with a codec group due decode it together (or,
        // with their audio detached, hand it out as codes).
        let finished: Vec<Result<Option<FinishReason>, GenerateError>> = (generations.iter_mut().zip(rows))
            .map(|(g, row)| Ok(g.take_frame(row.expect("every generation got a row")?, self.eos)))
            .collect();
        let due: Vec<bool> = (generations.iter().zip(&finished))
            .map(|(g, f)| matches!(f, Ok(end) if g.audio.due(end.is_some())))
            .collect();
        let decoded: Vec<bool> = (generations.iter().zip(&due)).map(|(g, &due)| due && g.audio.attached()).collect();
        let mut outs: Vec<&mut AudioOut<'_, B>> =
            generations.iter_mut().zip(&decoded).filter(|(_, d)| **d).map(|(g, _)| &mut g.audio).collect();
        let mut pcms = AudioOut::decode(&mut outs).into_iter();
        (finished.into_iter().zip(due).zip(decoded).zip(generations.iter_mut()))
            .map(|(((finished, due), decoded), g)| {
                let finished = finished?;
                let mut stepped = Stepped { finished, ..Stepped::default() };
                if decoded {
                    stepped.pcm = pcms.next().expect("one result per decoded generation")?;
                } else if due {
                    stepped.codes = g.audio.take_codes();
                }
                Ok(stepped)
            })
            .collect()
    }

    /// Generates speech for prompt `rows`; `sink` receives PCM as the codec produces it and may
    /// stop the generation between frames. The same step as a batch, over this one request.
    pub fn generate(
        &self,
        rows: &Rows,
        opts: &GenerateOptions,
        sink: &mut dyn AudioSink,
    ) -> Result<Finished, GenerateError> {
        self.generate_prompt(rows, SharedPrefix::NONE, opts, sink)
    }

    /// [`Engine::generate`] for a prompt whose first rows other prompts share (see
    /// [`Engine::start_prompt`]).
    pub fn generate_prompt(
        &self,
        rows: &Rows,
        prefix: SharedPrefix,
        opts: &GenerateOptions,
        sink: &mut dyn AudioSink,
    ) -> Result<Finished, GenerateError> {
        let mut generation = self.start_prompt(rows, prefix, opts)?;
        if opts.max_frames == 0 {
            return Ok(generation.finish(FinishReason::Length));
        }
        while !self.prefill_generation(&mut generation, PREFILL_CHUNK)? {}
        loop {
            let stepped = self.step(&mut [&mut generation]).pop().expect("one result per generation")?;
            if !stepped.pcm.is_empty() && sink.audio(&stepped.pcm).is_break() {
                return Ok(generation.finish(FinishReason::Cancelled));
            }
            if let Some(reason) = stepped.finished {
                return Ok(generation.finish(reason));
            }
            if sink.keep_going().is_break() {
                // Frames already produced keep their audio, so `frames` always counts delivered audio.
                let pcm = generation.cancel()?.pcm;
                if !pcm.is_empty() {
                    let _ = sink.audio(&pcm);
                }
                return Ok(generation.finish(FinishReason::Cancelled));
            }
        }
    }
}

/// Prompt rows per prefill chunk. A multiple of the GDN's 64-row chunk; the chunks of a prompt
/// depend on its length alone, so its state never depends on the load.
pub const PREFILL_CHUNK: usize = 256;

/// One stream's frames from the batched step, one frame per call (the host-driven loop).
struct HostFrames<'e, 'w, B: Backend> {
    engine: &'e Engine<'w, B>,
    stream: Stream<B>,
}

impl<B: Backend> FrameSource for HostFrames<'_, '_, B> {
    fn next_frame(&mut self, _last: bool) -> Result<Vec<u32>, GenerateError> {
        self.engine.next_frames(&mut [&mut self.stream]).pop().expect("one result per stream")
    }
}
