//! The decode batch: many requests' frames produced by one step (`model.md` §8.1 over B rows).
//!
//! A [`Stream`] is one request's model state — backbone KV caches and GDN states, tower caches,
//! the RAS window, the frame counter, the row the next frame starts from — and nothing else, so
//! the engine can advance any set of streams together. [`Engine::next_frames`] takes one frame
//! of each:
//!
//! restricted head → main draw with RAS (per row, on the host) → the tower's 13 layers over the
//! batch, a head draw per row after each residual layer → the backbone's decode of every row that
//! goes on. A backend may bring its own step with the draws on the device ([`DeviceDraws`], on
//! the GPU `engine::cuda_draws`), making the same decisions with no read-back inside the step.
//!
//! Batch invariance: every operation here runs under the decode batch's contract
//! (`BackboneOps::gdn_decode_rows`): each row's result depends only on that row's inputs and
//! state, never on which other rows share the call or how many there are. The draws are keyed by
//! (seed, frame, stream) alone. So a request's frames are bit for bit the same alone, beside any
//! others, joining at any step.
//!
//! Prompts are run in chunks ([`Engine::prefill`]) so a long prompt can be interleaved with the
//! batch's steps; the chunks depend on the prompt alone (never on the load), so the prompt's
//! state does too.

use std::sync::atomic::{AtomicU64, Ordering};

use super::generate::{Engine, GenerateError, GenerateOptions};
use super::prefix::SharedPrefix;
use rayon::prelude::*;

use crate::backend::Backend;
use crate::model::backbone::BackboneState;
use crate::model::frame::Rows;
use crate::model::sampling::{MainPick, RasWindow, SamplingError, sample_head, sample_main};
use crate::model::tower::TowerState;

/// How many decode steps a [`DeviceDraws`] captured as a CUDA graph, and how many it replayed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct GraphStats {
    pub captures: u64,
    pub replays: u64,
}

/// Numbers the engine's streams ([`Stream::id`]).
static NEXT_STREAM: AtomicU64 = AtomicU64::new(0);

/// One request's model state between frames.
pub struct Stream<B: Backend> {
    /// This stream's number, never reused ([`Stream::id`]).
    id: u64,
    pub(crate) opts: GenerateOptions,
    pub(super) backbone: BackboneState<B>,
    pub(super) tower: TowerState<B>,
    prompt: Rows,
    /// The prompt's rows other prompts share: chunks restart at their end, where the state may
    /// be kept (`engine::prefix`).
    prefix: SharedPrefix,
    /// Prompt rows already run through the backbone (and, but for the last, the tower), or
    /// restored from a kept prefix.
    prefilled: usize,
    /// The backbone's final-norm row for `input_row`; `None` until the prompt is done.
    pub(super) hidden: Option<B::Act>,
    pub(super) input_row: Vec<u32>,
    pub(super) window: RasWindow,
    /// Frames produced so far (the next frame's index, which keys its draws).
    pub(super) frame: usize,
    /// `max_frames` frames were produced.
    pub(super) ended: bool,
    /// Prompt rows restored from a kept prefix when the stream was opened.
    restored: usize,
}

/// A backend's own decode step over the batch, making [`Engine::next_frames`]'s decisions with
/// its draws on the device (e.g. `cuda_draws`: no read-back between the draws and the layers
/// that embed them). Its contract is the host step's: the same frames for the same streams, each
/// row's depending on that row alone. One difference is allowed: it may run the backbone on a
/// row that ends its stream (EOS or the last of `max_frames`), so a caller that asks an EOS
/// stream on gets frames that follow the EOS row, as the CUDA-graph step does.
pub trait DeviceDraws<B: Backend> {
    /// Steps captured as a CUDA graph and replays of them so far (`None`: a step this backend
    /// never captures).
    fn graph_stats(&self) -> Option<GraphStats> {
        None
    }

    /// One frame of each stream (all ready, none ended), as [`Engine::next_frames_observed`].
    fn next_frames(
        &self,
        engine: &Engine<'_, B>,
        streams: &mut [&mut Stream<B>],
        mark: &mut dyn FnMut(StepPhase),
    ) -> Vec<Result<Vec<u32>, GenerateError>>;
}

impl<B: Backend> Stream<B> {
    /// This stream's number among all the engine's streams, never reused: a backend's captured
    /// step replays for one list of streams (`cuda_draws`).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Rows of the prompt.
    pub fn prompt_rows(&self) -> usize {
        self.prompt.len()
    }

    /// Prompt rows run (or restored) so far.
    pub fn prefilled_rows(&self) -> usize {
        self.prefilled
    }

    /// Prompt rows restored from a kept prefix rather than run (0: none).
    pub fn restored_rows(&self) -> usize {
        self.restored
    }

    /// Whether the prompt is done, so the stream can take frames.
    pub fn ready(&self) -> bool {
        self.hidden.is_some()
    }

    /// Frames produced so far.
    pub fn frames(&self) -> usize {
        self.frame
    }
}

impl<'w, B: Backend> Engine<'w, B> {
    /// A new stream for prompt `rows`; nothing runs until [`Engine::prefill`].
    pub fn stream(&self, rows: &Rows, opts: &GenerateOptions) -> Result<Stream<B>, GenerateError> {
        self.prompt_stream(rows, SharedPrefix::NONE, opts)
    }

    /// A new stream for prompt `rows` whose first rows other prompts share: it starts from the
    /// kept state of that prefix if the engine has it (`engine::prefix`); otherwise its chunks
    /// restart at the prefix's end, where the state is kept. Nothing runs until
    /// [`Engine::prefill`].
    pub fn prompt_stream(
        &self,
        rows: &Rows,
        prefix: SharedPrefix,
        opts: &GenerateOptions,
    ) -> Result<Stream<B>, GenerateError> {
        if rows.is_empty() {
            return Err(GenerateError::EmptyPrompt);
        }
        let mut backbone = self.backbone.new_state();
        let mut tower = self.tower.new_state();
        let restored = self.prefix_cache().map_or(0, |cache| cache.restore(rows, prefix, &mut backbone, &mut tower));
        Ok(Stream {
            id: NEXT_STREAM.fetch_add(1, Ordering::Relaxed),
            opts: opts.clone(),
            backbone,
            tower,
            prompt: rows.clone(),
            prefix,
            prefilled: restored,
            hidden: None,
            input_row: rows.row(rows.len() - 1).to_vec(),
            window: RasWindow::from_prompt(rows),
            frame: 0,
            ended: false,
            restored,
        })
    }

    /// Runs the next `chunk` rows (at most) of the stream's prompt; returns whether the prompt
    /// is done ([`Engine::prefill_streams`] of one stream).
    ///
    /// # Panics
    /// If `chunk` is 0.
    pub fn prefill(&self, stream: &mut Stream<B>, chunk: usize) -> Result<bool, GenerateError> {
        Ok(self.prefill_streams(&mut [stream], chunk)?[0])
    }

    /// Runs the next `chunk` rows (at most) of each stream's prompt, all streams' rows through
    /// the backbone together (`Backbone::prefill_rows`: each stream's rows are what they are
    /// alone); returns, per stream, whether its prompt is done. Each chunk's rows then go
    /// through the tower, all streams together (`Tower::prefill_many`: each stream's cache is
    /// what it is alone), which writes the rows before the chunk's last, labelled by their
    /// successors (the last prompt row is written by the first frame). A stream's chunks depend
    /// on its prompt and `chunk` alone, never on the load, so its state does too. Chunks stop at
    /// the end of the prompt's shared prefix, where its state is kept if asked
    /// (`engine::prefix`).
    ///
    /// # Panics
    /// If `chunk` is 0.
    pub fn prefill_streams(&self, streams: &mut [&mut Stream<B>], chunk: usize) -> Result<Vec<bool>, GenerateError> {
        assert!(chunk > 0, "prefill chunks of no rows");
        let spans: Vec<(usize, usize)> =
            streams.iter().map(|s| (s.prefilled, s.prefix.chunk_end(s.prefilled, s.prompt.len(), chunk))).collect();
        let running: Vec<usize> = (0..streams.len()).filter(|&i| spans[i].0 < spans[i].1).collect();
        if !running.is_empty() {
            let chunks: Vec<Rows> = running.iter().map(|&i| streams[i].prompt.slice(spans[i].0..spans[i].1)).collect();
            let mut states = pick_mut(streams, &running);
            let mut backbones: Vec<&mut BackboneState<B>> = states.iter_mut().map(|s| &mut s.backbone).collect();
            let hidden = self.backbone.prefill_rows(&mut backbones, &chunks)?;
            // Each stream's rows of the backbone output; rows start..end−1 are labelled by their
            // successors (the last prompt row waits for the first frame, so the final chunk
            // writes one row fewer), all streams' rows through the tower together.
            let mut own: Vec<B::Act> = Vec::with_capacity(chunks.len());
            let mut labels: Vec<Rows> = Vec::with_capacity(chunks.len());
            let mut offset = 0;
            for (s, rows) in states.iter().zip(&chunks) {
                let (start, end, total) = (s.prefilled, s.prefilled + rows.len(), s.prompt.len());
                own.push(self.backend.act_rows(&hidden, offset, rows.len()));
                labels.push(s.prompt.slice(start..(end + 1).min(total)));
                offset += rows.len();
            }
            let mut towers: Vec<&mut TowerState<B>> = states.iter_mut().map(|s| &mut s.tower).collect();
            let own_refs: Vec<&B::Act> = own.iter().collect();
            self.tower.prefill_many(&mut towers, &own_refs, &labels)?;
            for ((s, rows), hidden) in states.into_iter().zip(&chunks).zip(&own) {
                s.prefilled += rows.len();
                if s.prefilled == s.prefix.rows
                    && let Some(cache) = self.prefix_cache()
                {
                    cache.keep(&s.prompt, s.prefix, &s.backbone, &s.tower);
                }
                if s.prefilled == s.prompt.len() {
                    s.hidden = Some(self.backend.act_rows(hidden, rows.len() - 1, 1));
                }
            }
        }
        Ok(streams.iter().map(|s| s.prefilled == s.prompt.len()).collect())
    }

    /// One frame `[main, c0..c9]` of each stream (the EOS frame included: the caller ends the
    /// stream on it). A stream that fails (e.g. a sampler fault on its row) gets its error and
    /// the others go on; an error of the shared computation fails every stream of the step.
    ///
    /// # Panics
    /// If a stream's prompt is not done or the stream has ended.
    pub fn next_frames(&self, streams: &mut [&mut Stream<B>]) -> Vec<Result<Vec<u32>, GenerateError>> {
        self.next_frames_observed(streams, &mut |_| {})
    }

    /// [`Engine::next_frames`], calling `mark` as each [`StepPhase`] ends (a bench times them).
    pub fn next_frames_observed(
        &self,
        streams: &mut [&mut Stream<B>],
        mark: &mut dyn FnMut(StepPhase),
    ) -> Vec<Result<Vec<u32>, GenerateError>> {
        for s in streams.iter() {
            assert!(s.ready() && !s.ended, "next_frames on a stream that is not ready or has ended");
        }
        if streams.is_empty() {
            return Vec::new();
        }
        if let Some(draws) = self.device_draws() {
            return draws.next_frames(self, streams, mark);
        }
        let mut results: Vec<Option<Result<Vec<u32>, GenerateError>>> = (0..streams.len()).map(|_| None).collect();
        let hidden: Vec<B::Act> = streams.iter().map(|s| s.hidden.clone().expect("checked ready")).collect();
        let hidden = self.backend.stack_rows(&hidden);
        // The main draw of every row (rows in parallel: each draw is its own row's); a fault leaves
        // that stream out of the rest of the step.
        let heads = self.backbone.restricted_logits_rows(&hidden);
        let draws: Vec<(RasWindow, GenerateOptions, u64)> =
            streams.iter().map(|s| (s.window.clone(), s.opts.clone(), s.frame as u64)).collect();
        let (index, candidates) = (&self.logit_index, &self.candidates);
        let picks: Vec<Result<MainPick, SamplingError>> = (heads.into_par_iter().zip(draws.par_iter()))
            .map(|(head, (window, o, frame))| {
                let logits: Vec<f32> = index.iter().map(|&j| head[j]).collect();
                sample_main(&logits, candidates, window, &o.params, o.seed, *frame)
            })
            .collect();
        let mut mains = Vec::with_capacity(streams.len());
        let mut live: Vec<usize> = Vec::with_capacity(streams.len());
        for (i, (s, pick)) in streams.iter_mut().zip(picks).enumerate() {
            match pick {
                Ok(pick) => {
                    s.window.push(pick.token);
                    mains.push(pick.token);
                    live.push(i);
                }
                Err(e) => results[i] = Some(Err(e.into())),
            }
        }
        mark(StepPhase::MainDraws);
        let hidden = if live.len() == streams.len() {
            hidden
        } else {
            let rows: Vec<B::Act> = live.iter().map(|&i| self.backend.act_rows(&hidden, i, 1)).collect();
            self.backend.stack_rows(&rows)
        };
        if let Err(e) = self.tower_and_backbone(streams, &live, &mains, &hidden, &mut results, mark) {
            let message = e.to_string();
            for &i in &live {
                results[i] = Some(Err(GenerateError::Batch(message.clone())));
            }
        }
        results.into_iter().map(|r| r.expect("every stream got a result")).collect()
    }

    /// The tower over the `live` streams (each with its main token; `hidden` their backbone rows,
    /// stacked), then the backbone decode of every row that goes on. Per-row faults go into
    /// `results`; an `Err` is the whole batch's.
    fn tower_and_backbone(
        &self,
        streams: &mut [&mut Stream<B>],
        live: &[usize],
        mains: &[u32],
        hidden: &B::Act,
        results: &mut [Option<Result<Vec<u32>, GenerateError>>],
        mark: &mut dyn FnMut(StepPhase),
    ) -> Result<(), GenerateError> {
        if live.is_empty() {
            return Ok(());
        }
        let mut head_errors: Vec<Option<SamplingError>> = vec![None; live.len()];
        let codes = {
            let inputs: Vec<Vec<u32>> = live.iter().map(|&i| streams[i].input_row.clone()).collect();
            let inputs: Vec<&[u32]> = inputs.iter().map(Vec::as_slice).collect();
            let opts: Vec<(GenerateOptions, u64)> =
                live.iter().map(|&i| (streams[i].opts.clone(), streams[i].frame as u64)).collect();
            let mut states = pick_mut(streams, live);
            let mut towers: Vec<&mut TowerState<B>> = states.iter_mut().map(|s| &mut s.tower).collect();
            self.tower.frame_rows(&mut towers, hidden, &inputs, mains, &mut |r, logits| {
                let vocab = logits.len() / opts.len();
                let drawn: Vec<Result<u32, SamplingError>> = (logits.par_chunks(vocab).zip(opts.par_iter()))
                    .map(|(row, (o, frame))| sample_head(row, r, &o.params, o.seed, *frame))
                    .collect();
                (drawn.into_iter().zip(head_errors.iter_mut()))
                    .map(|(code, error)| {
                        code.unwrap_or_else(|e| {
                            error.get_or_insert(e);
                            0
                        })
                    })
                    .collect()
            })?
        };
        mark(StepPhase::Tower);
        // Rows that go on into the backbone: not EOS, not the last frame, no fault.
        let mut decode: Vec<usize> = Vec::with_capacity(live.len());
        let mut rows: Vec<Vec<u32>> = Vec::with_capacity(live.len());
        for (j, (&i, codes)) in live.iter().zip(codes).enumerate() {
            if let Some(e) = head_errors[j].take() {
                results[i] = Some(Err(e.into()));
                continue;
            }
            let s = &mut streams[i];
            let mut row = Vec::with_capacity(1 + codes.len());
            row.push(mains[j]);
            row.extend_from_slice(&codes);
            s.frame += 1;
            s.ended = s.frame >= s.opts.max_frames;
            // After EOS the generation ends; a bench that asks on gets frames from the same row.
            if !s.ended && mains[j] != self.eos {
                decode.push(i);
                rows.push(row.clone());
            }
            results[i] = Some(Ok(row));
        }
        if decode.is_empty() {
            return Ok(());
        }
        let row_refs: Vec<&[u32]> = rows.iter().map(Vec::as_slice).collect();
        let mut states = pick_mut(streams, &decode);
        let mut backbones: Vec<&mut BackboneState<B>> = states.iter_mut().map(|s| &mut s.backbone).collect();
        let out = self.backbone.decode_rows(&mut backbones, &row_refs)?;
        for (j, s) in states.into_iter().enumerate() {
            s.hidden = Some(self.backend.act_rows(&out, j, 1));
            s.input_row.clone_from(&rows[j]);
        }
        mark(StepPhase::Backbone);
        Ok(())
    }
}

/// The parts of one decode step, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepPhase {
    /// Every row's restricted logits and main draw.
    MainDraws,
    /// The tower's layers over the batch, with the head draws.
    Tower,
    /// The backbone's decode of the rows that go on.
    Backbone,
}

/// Mutable references to `streams[i]` for each index of `picked` (ascending, distinct).
fn pick_mut<'s, 'a, B: Backend>(streams: &'s mut [&'a mut Stream<B>], picked: &[usize]) -> Vec<&'s mut Stream<B>> {
    debug_assert!(picked.windows(2).all(|w| w[0] < w[1]), "indices ascending and distinct");
    let mut out = Vec::with_capacity(picked.len());
    let mut rest: &mut [&'a mut Stream<B>] = streams;
    let mut offset = 0;
    for &i in picked {
        let (_, tail) = std::mem::take(&mut rest).split_at_mut(i - offset);
        let (first, tail) = tail.split_first_mut().expect("index in range");
        out.push(&mut **first);
        rest = tail;
        offset = i + 1;
    }
    out
}
