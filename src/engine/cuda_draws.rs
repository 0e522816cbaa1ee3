//! The decode batch's step with its draws on the GPU ([`DeviceDraws`] for the CUDA backend): the
//! order and the decisions of [`Engine::next_frames`], without a read-back inside the step.
//!
//! restricted head over all rows → every row's main draw with RAS (`GpuSampler`, one launch) →
//! the tower's layers over the batch, each layer's labels read from the sampler's rows on the
//! device, all rows' head draws after each residual layer (one launch each) → every row's input
//! embedding built on the device → the backbone's decode of the rows → one read-back of the
//! sampled rows and any draw faults.
//!
//! The host path reads the logits back ten times a step (the main draws and nine heads) and
//! draws on the CPU while the GPU waits; here the GPU runs the whole step from one queue of
//! launches. The host keeps each stream's frame counter and RAS window and stages every row's
//! sampler state and input codes at the start of a step, so streams may join, leave and change
//! places between steps. While the same streams step in the same rows, the step's launches run
//! as one captured CUDA graph (`graph`).
//!
//! Batch invariance: the sampler's kernels give each row its own block and its own state; the
//! layers run under the decode batch's contract. A row's frame is its row's alone.
//!
//! One difference from the host step: rows whose main token is EOS are decoded too (their
//! streams end; their states are not used again), as the CUDA-graph step decodes its last row.
//! Rows that end their stream's `max_frames` are left out, so a stream never decodes past its
//! context.

mod graph;

use std::cell::RefCell;

pub use super::batch::GraphStats;
use super::batch::{DeviceDraws, StepPhase, Stream};
use super::generate::{Engine, GenerateError, LoadModelError, ResidentModel, model_parts};
use crate::backend::BackendTypes;
use crate::backend::cuda::launch::DecodeLaunches;
use crate::backend::cuda::memory::{DeviceBuffer, MemoryError};
use crate::backend::cuda::sampling::{DeviceState, DrawFailure, GpuSampler};
use crate::backend::cuda::step::{self, RowEmbedding};
use crate::backend::cuda::tensor::GpuMatrix;
use crate::backend::cuda::tower::{DeviceLabels, DeviceRowsInput, DeviceUnseen, GpuTowerKv};
use crate::backend::cuda::{Cuda, linear};
use crate::backend::tower::TowerOps;
use crate::model::backbone::{Backbone, BackboneState};
use crate::model::load::Checkpoint;
use crate::model::sampling::MainCandidates;
use crate::model::tower::Tower;
use graph::StepGraphs;

/// The device-side draws of one engine: a sampler with a row per stream of the largest batch.
pub struct CudaDraws<'w> {
    cuda: &'w Cuda,
    sampler: GpuSampler,
    embedding: RowEmbedding,
    /// Codebooks the tower's first layer adds from each step's input row (all but the main).
    unseen_codebooks: usize,
    /// `[rows, unseen_codebooks]` u32: each row's input codes, staged before the step.
    unseen_codes: DeviceBuffer,
    /// `[rows]` u32: whether each row's input main token is semantic, staged before the step.
    unseen_semantic: DeviceBuffer,
    /// The step captured as a CUDA graph for the streams stepping now (`None`: every step runs
    /// its launches one by one).
    graphs: Option<RefCell<StepGraphs>>,
}

impl<'w> CudaDraws<'w> {
    /// Draws for batches of up to `rows` streams over a resident model (larger batches are
    /// stepped `rows` streams at a time).
    pub fn for_model(
        cuda: &'w Cuda,
        ckpt: &Checkpoint,
        model: &ResidentModel<Cuda>,
        rows: usize,
    ) -> Result<CudaDraws<'w>, CudaDrawsError> {
        let (backbone, tower, candidates) = model_parts(cuda, ckpt, model)?;
        Ok(CudaDraws::new(cuda, &backbone, &tower, &candidates, rows)?)
    }

    /// Draws over the engine's backbone and tower (read for their shapes only).
    pub fn new(
        cuda: &'w Cuda,
        backbone: &Backbone<'_, Cuda>,
        tower: &Tower<'_, Cuda>,
        candidates: &MainCandidates,
        rows: usize,
    ) -> Result<CudaDraws<'w>, MemoryError> {
        let heads = tower.codebooks() - 1;
        let vocab = tower.shape().codebook_vocab;
        let sampler = GpuSampler::with_rows(cuda, candidates, backbone.restricted_token_ids(), heads, vocab, rows)?;
        let unseen_codebooks = tower.codebooks();
        let unseen_codes = DeviceBuffer::alloc(cuda.budget(), "decode batch input codes", rows * unseen_codebooks * 4)?;
        let unseen_semantic = DeviceBuffer::alloc(cuda.budget(), "decode batch input flags", rows * 4)?;
        let layers = backbone.config().layer_types.len() + tower.weights().layers.len();
        let graphs = StepGraphs::new(cuda, layers, rows)?;
        Ok(CudaDraws {
            cuda,
            sampler,
            embedding: RowEmbedding::for_backbone(backbone.config()),
            unseen_codebooks,
            unseen_codes,
            unseen_semantic,
            graphs: Some(RefCell::new(graphs)),
        })
    }

    /// Every step runs its launches one by one, never a captured graph (`--no-cuda-graph`'s
    /// batch, and the checks' reference for the graph).
    pub fn without_graphs(mut self) -> Self {
        self.graphs = None;
        self
    }

    /// Streams one step takes at most in one pass.
    pub fn rows(&self) -> usize {
        self.sampler.rows()
    }

    /// How many steps were captured and replayed so far.
    pub fn graph_stats(&self) -> GraphStats {
        self.graphs.as_ref().map_or_else(GraphStats::default, |g| g.borrow().stats())
    }

    /// One frame of each stream; an `Err` is the whole pass's.
    fn step(
        &self,
        engine: &Engine<'_, Cuda>,
        streams: &mut [&mut Stream<Cuda>],
        mark: &mut dyn FnMut(StepPhase),
    ) -> Result<Vec<Result<Vec<u32>, GenerateError>>, GenerateError> {
        let _overlap = DecodeLaunches::open();
        let n = streams.len();
        self.stage_inputs(engine, streams);
        // Each stream's row in the decode's output, if its row goes on: all but those that end
        // their stream's max_frames.
        let out_row: Vec<Option<usize>> = (streams.iter())
            .scan(0, |next, s| Some((s.frame + 1 < s.opts.max_frames).then(|| std::mem::replace(next, *next + 1))))
            .collect();
        let every_row_goes_on = out_row.iter().all(Option::is_some);
        let replayed = match &self.graphs {
            Some(graphs) if every_row_goes_on => graphs.borrow_mut().step(self, engine, streams)?,
            _ => false,
        };
        let out = if replayed {
            // The replay wrote each stream's next hidden row in place.
            [StepPhase::MainDraws, StepPhase::Tower, StepPhase::Backbone].into_iter().for_each(&mut *mark);
            None
        } else {
            if let Some(graphs) = &self.graphs {
                graphs.borrow_mut().ran_eagerly(self.cuda, streams);
            }
            self.record(engine, streams, &out_row, mark)?
        };

        // The step's one read-back: every row and any draw fault.
        let outputs = self.sampler.read_rows(self.cuda, n);
        let row_len = self.sampler.row_len();
        let results = (streams.iter_mut().zip(outputs).zip(out_row))
            .map(|((s, outputs), out_row)| {
                let frame = outputs.frame(row_len).map_err(|DrawFailure { error, .. }| GenerateError::from(error))?;
                s.window.push(frame.main.token);
                s.frame += 1;
                s.ended = s.frame >= s.opts.max_frames;
                if let Some(row) = out_row {
                    if let Some(out) = &out {
                        s.hidden = Some(self.cuda.act_rows(out, row, 1));
                    }
                    s.input_row.clone_from(&frame.row);
                }
                Ok(frame.row)
            })
            .collect();
        Ok(results)
    }

    /// The step's host inputs, staged in stream order before its launches: every row's sampler
    /// state (counter, knobs, window) and the codes of its input row the tower's first layer adds.
    fn stage_inputs(&self, engine: &Engine<'_, Cuda>, streams: &[&mut Stream<Cuda>]) {
        let cuda = self.cuda;
        let states: Vec<DeviceState> = (streams.iter())
            .map(|s| DeviceState::new(&s.opts.params, s.opts.seed, &s.window.tokens(), s.frame as u64))
            .collect();
        self.sampler.begin_rows(cuda, &states);
        let codes: Vec<u32> = streams.iter().flat_map(|s| s.input_row[1..].iter().copied()).collect();
        assert_eq!(codes.len(), streams.len() * self.unseen_codebooks, "input rows of the tower's codebooks");
        let semantic: Vec<u32> = streams.iter().map(|s| u32::from(engine.tower.is_semantic(s.input_row[0]))).collect();
        cuda.stage_to_device(self.unseen_codes.ptr(), &codes);
        cuda.stage_to_device(self.unseen_semantic.ptr(), &semantic);
    }

    /// The step's launches after its staged inputs: restricted head and main draws, the tower and
    /// its head draws, the embedding of every sampled row, the backbone's decode of the rows that
    /// go on (`out_row`). Returns the decode's output (`None` when no row goes on). Capturable
    /// (`graph`): no host data but the staged tables, no sync.
    fn record(
        &self,
        engine: &Engine<'_, Cuda>,
        streams: &mut [&mut Stream<Cuda>],
        out_row: &[Option<usize>],
        mark: &mut dyn FnMut(StepPhase),
    ) -> Result<Option<GpuMatrix>, GenerateError> {
        let (cuda, sampler) = (self.cuda, &self.sampler);
        let n = streams.len();
        let hidden: Vec<GpuMatrix> = streams.iter().map(|s| s.hidden.clone().expect("checked ready")).collect();
        let hidden = cuda.stack_rows(&hidden);

        // The main draws of every row, from each stream's counter, knobs and window.
        let backbone = &engine.backbone;
        let ids = backbone.restricted_token_ids();
        let logits = cuda.with_restricted_head(ids, |head| head.logits_rows(cuda, backbone.lm_head(), &hidden));
        sampler.sample_main_rows(cuda, &logits, n);
        drop(logits);
        mark(StepPhase::MainDraws);

        self.tower(engine, streams, &hidden);
        mark(StepPhase::Tower);

        // Rows into the backbone: all but those that end their stream's max_frames.
        let stride = sampler.output_stride_words();
        let recipe = cuda.scratch(n * self.embedding.recipe_words() * 4);
        step::embed_recipe_rows(cuda, &self.embedding, sampler.row_ptr(), stride, n, recipe.ptr());
        let (embed_tokens, codebook_embeddings) = backbone.embedding_tables();
        let x = linear::embed_from_recipe(
            cuda,
            embed_tokens,
            codebook_embeddings,
            recipe.ptr(),
            cuda.matrix(n, hidden.cols),
        );
        drop(recipe);
        let decoded = out_row.iter().flatten().count();
        let out = if decoded == 0 {
            None
        } else {
            let x = if decoded == n {
                x
            } else {
                let rows: Vec<GpuMatrix> =
                    (0..n).filter(|&j| out_row[j].is_some()).map(|j| cuda.act_rows(&x, j, 1)).collect();
                cuda.stack_rows(&rows)
            };
            let mut states: Vec<&mut BackboneState<Cuda>> = (streams.iter_mut().zip(out_row))
                .filter(|(_, row)| row.is_some())
                .map(|(s, _)| &mut s.backbone)
                .collect();
            Some(backbone.decode_rows_embedded(&mut states, x)?)
        };
        mark(StepPhase::Backbone);
        Ok(out)
    }

    /// The tower's layers over every row: labels from the sampler's rows, the head draws of all
    /// rows after each residual layer.
    fn tower(&self, engine: &Engine<'_, Cuda>, streams: &mut [&mut Stream<Cuda>], hidden: &GpuMatrix) {
        let (cuda, sampler, tower) = (self.cuda, &self.sampler, &engine.tower);
        let (shape, weights) = (tower.shape(), tower.weights());
        let n = streams.len();
        // Layer 0 adds the codes of each input row that the backbone did not embed (staged).
        let codes = DeviceUnseen {
            codes: self.unseen_codes.ptr(),
            semantic: self.unseen_semantic.ptr(),
            codebooks: self.unseen_codebooks,
            first: tower.backbone_codebooks() + 1,
        };
        let unseen = cuda.tower_unseen_device(&weights.codebook_embeddings, shape, codes, n);
        let starts: Vec<usize> = streams.iter().map(|s| s.tower.len()).collect();
        let stride = sampler.output_stride_words();
        let code = |i: usize| sampler.row_ptr() + (4 * (1 + i)) as u64; // c_i of row 0
        let shared = tower.shared_layers();
        let mut h: Option<GpuMatrix> = None;
        for (index, layer) in weights.layers.iter().enumerate() {
            // Shared layers embed c0; residual layer r = index − shared embeds c_r.
            let labels =
                DeviceLabels { codes: code(index.saturating_sub(shared)), mask: sampler.semantic_ptr(), stride };
            let mut kvs: Vec<&mut GpuTowerKv> = streams.iter_mut().map(|s| &mut s.tower.caches_mut()[index]).collect();
            let input = DeviceRowsInput {
                hidden: h.as_ref().unwrap_or(hidden),
                labels,
                unseen: (index == 0).then_some(&unseen),
                starts: &starts,
            };
            let out = cuda.tower_layer_rows_device(shape, layer, &mut kvs, input);
            if let Some(r) = index.checked_sub(shared) {
                // Head r reads residual layer r's output and draws c_{r+1} of every row.
                let logits = cuda.tower_head_rows(&weights.heads[r], &out);
                sampler.sample_head_rows(cuda, r, &logits, n);
            }
            h = Some(out);
        }
        for s in streams.iter_mut() {
            s.tower.advance();
        }
    }
}

impl DeviceDraws<Cuda> for CudaDraws<'_> {
    fn graph_stats(&self) -> Option<GraphStats> {
        self.graphs.as_ref().map(|g| g.borrow().stats())
    }

    fn next_frames(
        &self,
        engine: &Engine<'_, Cuda>,
        streams: &mut [&mut Stream<Cuda>],
        mark: &mut dyn FnMut(StepPhase),
    ) -> Vec<Result<Vec<u32>, GenerateError>> {
        // Each pass's rows are their own rows' alone, so a batch larger than the sampler's
        // rows is stepped in passes with the same frames.
        let mut results = Vec::with_capacity(streams.len());
        for pass in streams.chunks_mut(self.rows()) {
            match self.step(engine, pass, mark) {
                Ok(rows) => results.extend(rows),
                Err(e) => {
                    let message = e.to_string();
                    results.extend(pass.iter().map(|_| Err(GenerateError::Batch(message.clone()))));
                }
            }
        }
        results
    }
}

/// Why the device-side draws could not be built.
#[derive(Debug, thiserror::Error)]
pub enum CudaDrawsError {
    #[error("GPU memory for the decode batch's draws: {0}")]
    Memory(#[from] MemoryError),
    #[error(transparent)]
    Model(#[from] LoadModelError),
}
