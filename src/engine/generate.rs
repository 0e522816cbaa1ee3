//! The generation loop (`model.md` §8.1): prompt rows → backbone prefill → tower prefill → one
//! frame per step (main token with RAS, 13 tower layers with 9 head draws, the frame fed back to
//! the backbone) until EOS or `max_frames` → PCM from the streaming codec, delivered as it is
//! produced. The caller can stop it between frames.

use std::ops::ControlFlow;

use super::sampling::{MainCandidates, RasWindow, SamplingError, SamplingParams, sample_head, sample_main};
use crate::backend::Backend;
use crate::backend::tower::TowerError;
use crate::model::backbone::{Backbone, BackboneConfig, BackboneError, BackboneState};
use crate::model::codec::{CodecError, CodecModel, StreamingDecoder};
use crate::model::frame::Rows;
use crate::model::load::Checkpoint;
use crate::model::tower::{Tower, TowerState};
use crate::model::weights::{ModelWeights, WeightError};

/// Per-request generation options.
#[derive(Clone, Debug, PartialEq)]
pub struct GenerateOptions {
    pub params: SamplingParams,
    pub seed: u64,
    /// Frames to generate at most; reaching it ends with [`FinishReason::Length`].
    pub max_frames: usize,
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
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Cancelled => "cancelled",
        }
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
    /// Runs the prompt and returns the request's frames.
    fn start<'a>(&'a self, rows: &Rows, opts: &GenerateOptions) -> Result<Box<dyn FrameSource + 'a>, GenerateError>;
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

/// Frames decoded per codec call: the first frame alone for the earliest audio, then groups
/// that double up to `MAX_GROUP` (fewer calls, same samples: streaming is exact).
pub fn codec_group(groups_emitted: usize) -> usize {
    const MAX_GROUP: usize = 8;
    (1usize << groups_emitted.min(3)).min(MAX_GROUP)
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
        std::thread::scope(|scope| {
            let codec_host = std::thread::Builder::new()
                .name(String::from("limelight-codec-load"))
                .spawn_scoped(scope, || crate::model::codec::host_params(ckpt))
                .expect("spawning the codec loading thread");
            let weights = ckpt.upload_model_weights(backend)?;
            let host = codec_host.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))?;
            Ok(ResidentModel { weights, codec: CodecModel::from_host(ckpt, backend, host) })
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
    logit_index: Vec<usize>,
    pub eos: u32,
    /// The backend's device-side frames, when it has them; else the host loop runs.
    device: Option<Box<dyn DeviceFrames + 'w>>,
}

impl<'w, B: Backend> Engine<'w, B> {
    pub fn new(backend: &'w B, ckpt: &Checkpoint, model: &'w ResidentModel<B>) -> Result<Self, LoadModelError> {
        let w = &model.weights;
        let backbone = Backbone::new(
            backend,
            BackboneConfig::from_model_config(&ckpt.config),
            &w.backbone,
            &w.tower.codebook_embeddings,
        )?;
        let tower = Tower::new(backend, &w.tower, &ckpt.config)?;
        let candidates = MainCandidates::from_special_tokens(&ckpt.special_tokens);
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
        })
    }

    /// Produces frames with `device` instead of the host loop (same decisions, fewer round trips).
    pub fn with_device_frames(mut self, device: Box<dyn DeviceFrames + 'w>) -> Self {
        self.set_device_frames(device);
        self
    }

    /// [`Self::with_device_frames`] in place.
    pub fn set_device_frames(&mut self, device: Box<dyn DeviceFrames + 'w>) {
        self.device = Some(device);
    }

    /// Whether frames come from a device-side step.
    pub fn has_device_frames(&self) -> bool {
        self.device.is_some()
    }

    /// Runs the prompt and returns the request's frames, from the device-side step if the engine
    /// has one, else from the host loop (what `generate` consumes; benches time it directly).
    pub fn frames<'a>(
        &'a self,
        rows: &Rows,
        opts: &'a GenerateOptions,
    ) -> Result<Box<dyn FrameSource + 'a>, GenerateError> {
        if rows.is_empty() {
            return Err(GenerateError::EmptyPrompt);
        }
        match &self.device {
            Some(device) => device.start(rows, opts),
            None => Ok(Box::new(HostFrames::start(self, rows, opts)?)),
        }
    }

    /// Generates speech for prompt `rows`; `sink` receives PCM as the codec produces it and may
    /// stop the generation between frames.
    pub fn generate(
        &self,
        rows: &Rows,
        opts: &GenerateOptions,
        sink: &mut dyn AudioSink,
    ) -> Result<Finished, GenerateError> {
        let mut frames = self.frames(rows, opts)?;
        let mut produced = Rows::new(rows.codebooks());
        let mut audio = AudioOut::new(self.codec, self.backend);
        let mut reason = FinishReason::Length;
        for frame in 0..opts.max_frames {
            let row = frames.next_frame(frame + 1 == opts.max_frames)?;
            if row[0] == self.eos {
                reason = FinishReason::Stop;
                break;
            }
            produced.push_row(&row);
            if audio.push(&row[1..], sink)?.is_break() {
                reason = FinishReason::Cancelled;
                break;
            }
            if sink.keep_going().is_break() {
                // Frames already produced keep their audio, so `frames` always counts delivered audio.
                let _ = audio.flush(sink)?;
                reason = FinishReason::Cancelled;
                break;
            }
        }
        if reason != FinishReason::Cancelled {
            let _ = audio.flush(sink)?;
        }
        Ok(Finished { reason, frames: produced.len(), rows: produced })
    }
}

/// The host-driven frame loop (`model.md` §8.1), for any backend: restricted head → main draw
/// with RAS on the host → the tower's 13 layers with a host draw per head → the row into the
/// backbone.
struct HostFrames<'e, 'w, B: Backend> {
    engine: &'e Engine<'w, B>,
    opts: &'e GenerateOptions,
    backbone_state: BackboneState<B>,
    tower_state: TowerState<B>,
    /// The backbone's final-norm row for `input_row`.
    hidden: B::Act,
    input_row: Vec<u32>,
    window: RasWindow,
    frame: usize,
}

impl<'e, 'w, B: Backend> HostFrames<'e, 'w, B> {
    fn start(engine: &'e Engine<'w, B>, rows: &Rows, opts: &'e GenerateOptions) -> Result<Self, GenerateError> {
        let mut backbone_state = engine.backbone.new_state();
        let mut tower_state = engine.tower.new_state();
        let prompt_hidden = engine.backbone.prefill(&mut backbone_state, rows)?;
        engine.tower.prefill(&mut tower_state, &prompt_hidden, rows)?;
        Ok(HostFrames {
            engine,
            opts,
            backbone_state,
            tower_state,
            hidden: engine.backend.tower_act_rows(&prompt_hidden, rows.len() - 1, 1),
            input_row: rows.row(rows.len() - 1).to_vec(),
            window: RasWindow::from_prompt(rows),
            frame: 0,
        })
    }
}

impl<B: Backend> FrameSource for HostFrames<'_, '_, B> {
    fn next_frame(&mut self, last: bool) -> Result<Vec<u32>, GenerateError> {
        let (e, opts, frame) = (self.engine, self.opts, self.frame as u64);
        let head = e.backbone.restricted_logits(&self.hidden, 0);
        let logits: Vec<f32> = e.logit_index.iter().map(|&i| head[i]).collect();
        let pick = sample_main(&logits, &e.candidates, &self.window, &opts.params, opts.seed, frame)?;
        self.window.push(pick.token);
        // The reference runs every tower layer for the EOS frame too; its codes are discarded.
        let mut head_error = None;
        let codes = e.tower.frame(&mut self.tower_state, &self.hidden, &self.input_row, pick.token, &mut |r, l| {
            sample_head(l, r, &opts.params, opts.seed, frame).unwrap_or_else(|err| {
                head_error.get_or_insert(err);
                0
            })
        })?;
        if let Some(err) = head_error {
            return Err(err.into());
        }
        let mut row = Vec::with_capacity(1 + codes.len());
        row.push(pick.token);
        row.extend_from_slice(&codes);
        if !last && pick.token != e.eos {
            self.hidden = e.backbone.decode(&mut self.backbone_state, &row)?;
            self.input_row.clone_from(&row);
        }
        self.frame += 1;
        Ok(row)
    }
}

/// Groups frames for the streaming codec and hands its PCM on.
struct AudioOut<'m, B: Backend> {
    decoder: StreamingDecoder<'m, B>,
    pending: Vec<u32>,
    pending_frames: usize,
    groups: usize,
}

impl<'m, B: Backend> AudioOut<'m, B> {
    fn new(codec: &'m CodecModel<B>, backend: &'m B) -> Self {
        AudioOut { decoder: StreamingDecoder::new(codec, backend), pending: Vec::new(), pending_frames: 0, groups: 0 }
    }

    fn push(&mut self, codes: &[u32], sink: &mut dyn AudioSink) -> Result<ControlFlow<()>, CodecError> {
        self.pending.extend_from_slice(codes);
        self.pending_frames += 1;
        if self.pending_frames < codec_group(self.groups) {
            return Ok(ControlFlow::Continue(()));
        }
        self.flush(sink)
    }

    fn flush(&mut self, sink: &mut dyn AudioSink) -> Result<ControlFlow<()>, CodecError> {
        if self.pending_frames == 0 {
            return Ok(ControlFlow::Continue(()));
        }
        let pcm = self.decoder.push(&self.pending)?;
        self.pending.clear();
        self.pending_frames = 0;
        self.groups += 1;
        Ok(sink.audio(&pcm))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_frame_alone_then_doubling_groups() {
        let sizes: Vec<usize> = (0..6).map(codec_group).collect();
        assert_eq!(sizes, vec![1, 2, 4, 8, 8, 8]);
    }
}
