//! The whole per-frame step on the GPU, captured once as a CUDA graph and replayed for every
//! frame of every request (`model.md` §8.1, the same order as the decode batch in `batch`):
//!
//! restricted head → main draw with RAS (`GpuSampler`) → the tower's layers, labels read from the
//! sampler's frame row on the device, a head draw after each residual layer → the row's input
//! embedding built on the device → the backbone's decode of that row → the row handed on as the
//! next frame's input, the position counter advanced.
//!
//! Nothing in a frame waits for the host: positions come from a counter in device memory (the
//! KV caches follow it while the step is recorded), labels and the next embedding come from the
//! sampler's row. The host reads one 34-word record per frame (the row and any draw fault).
//!
//! A graph replays fixed addresses, so this engine keeps one backbone state, one tower state and
//! one sampler for its whole life and restarts them per request. The backbone also runs the row
//! of the last frame (EOS, or the last of `max_frames`): wasted work for one frame, at a position
//! the context check below keeps inside the caches.

use std::cell::{RefCell, RefMut};

use super::generate::{DeviceFrames, FrameSource, GenerateError, GenerateOptions};
use super::prefix::{PrefixCache, SharedPrefix};
use crate::backend::cuda::attention::DevicePosition;
use crate::backend::cuda::graph::CapturedGraph;
use crate::backend::cuda::launch::DecodeLaunches;
use crate::backend::cuda::memory::{DeviceBuffer, MemoryError};
use crate::backend::cuda::sampling::{DrawFailure, GpuSampler};
use crate::backend::cuda::step::{self, RowEmbedding};
use crate::backend::cuda::tensor::GpuMatrix;
use crate::backend::cuda::tower::{DeviceLabels, DeviceLayerInput, DeviceUnseen};
use crate::backend::cuda::{Cuda, linear};
use crate::backend::tower::TowerOps;
use crate::engine::generate::{LoadModelError, PREFILL_CHUNK, ResidentModel, model_parts};
use crate::model::backbone::{Backbone, BackboneState, LayerState};
use crate::model::frame::Rows;
use crate::model::load::Checkpoint;
use crate::model::sampling::{MainCandidates, SamplingError};
use crate::model::tower::{Tower, TowerState};

/// Word offsets in the step's small device buffer (`u32` words).
mod words {
    /// The input row of the next frame `[main, c0..]` (16 words, as the sampler's row).
    pub const INPUT_ROW: usize = 0;
    /// Whether the input row is semantic.
    pub const INPUT_SEMANTIC: usize = 16;
    /// The tower position of the next frame (`i32`); the backbone decodes at it + 1.
    pub const POSITION: usize = 17;
    /// The next row's `embed_gather` recipe.
    pub const RECIPE: usize = 18;
    /// The buffer's size: room for a recipe of up to 14 codebooks.
    pub const TOTAL: usize = 36;
}

/// Why the graph step could not be built.
#[derive(Debug, thiserror::Error)]
pub enum CudaFramesError {
    #[error("GPU memory for the frame step: {0}")]
    Memory(#[from] MemoryError),
    #[error("capturing the frame step as a CUDA graph: {0}")]
    Capture(#[from] cudarc::driver::DriverError),
    #[error("the frame step's warm-up: {0}")]
    Generate(#[from] GenerateError),
    #[error(transparent)]
    Model(#[from] LoadModelError),
}

/// The device-side frame step of one engine.
pub struct CudaFrames<'w> {
    cuda: &'w Cuda,
    backbone: Backbone<'w, Cuda>,
    tower: Tower<'w, Cuda>,
    embedding: RowEmbedding,
    /// Prompt rows per prefill call: the decode batch's chunks, so that a request's prompt
    /// leaves the state it leaves on the batch, and graph and batch agree bit for bit.
    prefill_chunk: usize,
    state: RefCell<StepState>,
    /// Kept prompt prefixes (voices): the decode batch's cache, shared.
    prefixes: Option<&'w PrefixCache<'w, Cuda>>,
}

/// Everything the captured graph addresses, kept for the engine's life.
struct StepState {
    backbone: BackboneState<Cuda>,
    tower: TowerState<Cuda>,
    sampler: GpuSampler,
    /// `[1, hidden]`: the backbone's final-norm row of the input row.
    hidden: GpuMatrix,
    words: DeviceBuffer,
    /// `None` only while the step is being built.
    graph: Option<CapturedGraph>,
}

impl<'w> CudaFrames<'w> {
    /// The step over a resident model, its parts built as `Engine::new` builds them.
    pub fn for_model(
        cuda: &'w Cuda,
        ckpt: &Checkpoint,
        model: &'w ResidentModel<Cuda>,
    ) -> Result<CudaFrames<'w>, CudaFramesError> {
        let (backbone, tower, candidates) = model_parts(cuda, ckpt, model)?;
        CudaFrames::new(cuda, backbone, tower, &candidates)
    }

    /// Builds the step over the engine's backbone and tower: runs it once eagerly (which builds
    /// every lazily made table and warms the pool), then captures it.
    pub fn new(
        cuda: &'w Cuda,
        backbone: Backbone<'w, Cuda>,
        tower: Tower<'w, Cuda>,
        candidates: &MainCandidates,
    ) -> Result<CudaFrames<'w>, CudaFramesError> {
        let c = backbone.config();
        let embedding = RowEmbedding::for_backbone(c);
        assert!(
            embedding.recipe_words() <= words::TOTAL - words::RECIPE,
            "{} backbone codebooks do not fit the step's recipe",
            embedding.backbone_codebooks
        );
        let heads = tower.codebooks() - 1;
        let sampler =
            GpuSampler::new(cuda, candidates, backbone.restricted_token_ids(), heads, tower.shape().codebook_vocab)?;
        let words = DeviceBuffer::alloc(cuda.budget(), "frame step words", words::TOTAL * 4)?;
        cuda.copy_to_device(words.ptr(), &[0u32; words::TOTAL]);
        let hidden = cuda.matrix(1, c.hidden);
        cuda.copy_to_device(hidden.ptr(), &vec![half::bf16::ZERO; c.hidden]);
        let state =
            StepState { backbone: backbone.new_state(), tower: tower.new_state(), sampler, hidden, words, graph: None };
        let frames = CudaFrames {
            cuda,
            backbone,
            tower,
            embedding,
            prefill_chunk: PREFILL_CHUNK,
            state: RefCell::new(state),
            prefixes: None,
        };
        {
            let mut st = frames.state.borrow_mut();
            frames.follow_device_position(&mut st, true);
            frames.record(&mut st)?;
            cuda.synchronize();
            let graph = CapturedGraph::capture(cuda, || {
                frames.record(&mut st).expect("the step recorded eagerly just before");
            });
            frames.follow_device_position(&mut st, false);
            st.graph = Some(graph?);
        }
        Ok(frames)
    }

    fn word(st: &StepState, index: usize) -> u64 {
        st.words.ptr() + (index * 4) as u64
    }

    /// Points every KV cache at the device position counter (`on`) or back at its host length.
    fn follow_device_position(&self, st: &mut StepState, on: bool) {
        let counter = Self::word(st, words::POSITION);
        // The tower writes the frame at the counter; the backbone then decodes the new row after it.
        let tower = on.then_some(DevicePosition { counter, offset: 0 });
        let backbone = on.then_some(DevicePosition { counter, offset: 1 });
        for layer in &mut st.backbone.layers {
            if let LayerState::Attention(cache) = layer {
                cache.follow_device_position(backbone);
            }
        }
        for kv in st.tower.caches_mut() {
            kv.cache.follow_device_position(tower);
        }
    }

    /// Queues one frame step: kernels on the state's fixed addresses only (capturable).
    fn record(&self, st: &mut StepState) -> Result<(), GenerateError> {
        let _overlap = DecodeLaunches::open();
        let cuda = self.cuda;
        let tower_w = self.tower.weights();
        let shape = self.tower.shape();
        let row = st.sampler.row_ptr();
        let semantic = st.sampler.semantic_ptr();
        let code = |i: usize| row + (4 * (1 + i)) as u64; // c_i of the frame row

        let ids = self.backbone.restricted_token_ids();
        let lm_head = self.backbone.lm_head();
        let logits = cuda.with_restricted_head(ids, |head| head.logits(cuda, lm_head, &st.hidden, 0));
        st.sampler.sample_main(cuda, &logits);
        drop(logits);

        // The tower (`Tower::frame`): layer 0 adds the unseen codes of the input row; the shared
        // layers embed c0, residual layer r embeds c_r; all masked by "main is semantic".
        let unseen_codes = DeviceUnseen {
            codes: Self::word(st, words::INPUT_ROW + 1),
            semantic: Self::word(st, words::INPUT_SEMANTIC),
            codebooks: self.tower.codebooks(),
            first: self.tower.backbone_codebooks() + 1,
        };
        let unseen = cuda.tower_unseen_device(&tower_w.codebook_embeddings, shape, unseen_codes, 1);
        let start = st.tower.len();
        let shared = self.tower.shared_layers();
        let layers = tower_w.layers.iter().zip(st.tower.caches_mut());
        let mut h: Option<GpuMatrix> = None;
        for (index, (layer, kv)) in layers.enumerate() {
            // Shared layers embed c0; residual layer r = index − shared embeds c_r.
            let labels = DeviceLabels { codes: code(index.saturating_sub(shared)), mask: semantic, stride: 1 };
            let input = match &h {
                None => DeviceLayerInput { hidden: &st.hidden, labels, unseen: Some(&unseen), start },
                Some(prev) => DeviceLayerInput { hidden: prev, labels, unseen: None, start },
            };
            let out = cuda.tower_layer_device(shape, layer, kv, input);
            if let Some(r) = index.checked_sub(shared) {
                // Head r reads residual layer r's output and picks c_{r+1}.
                let head_logits = cuda.tower_head(&tower_w.heads[r], &out);
                st.sampler.sample_head(cuda, r, &head_logits, 0);
            }
            h = Some(out);
        }
        drop((h, unseen));

        // The row into the backbone, then hand it on.
        let recipe = Self::word(st, words::RECIPE);
        step::embed_recipe(cuda, &self.embedding, row, recipe);
        let (embed_tokens, codebook_embeddings) = self.backbone.embedding_tables();
        let x =
            linear::embed_from_recipe(cuda, embed_tokens, codebook_embeddings, recipe, cuda.matrix(1, st.hidden.cols));
        let out = self.backbone.decode_embedded(&mut st.backbone, x)?;
        cuda.copy_device_to_device(st.hidden.ptr(), out.ptr(), st.hidden.cols * 2);
        drop(out);
        let width = st.sampler.row_len();
        step::advance(
            cuda,
            row,
            semantic,
            Self::word(st, words::INPUT_ROW),
            Self::word(st, words::INPUT_SEMANTIC),
            Self::word(st, words::POSITION),
            width,
        );
        st.sampler.end_frame(cuda);
        Ok(())
    }

    /// The prompt chunk of the decode batch this step serves beside (`--prefill-chunk`; the
    /// default is the engine's [`PREFILL_CHUNK`]).
    pub fn with_prefill_chunk(mut self, rows: usize) -> Self {
        assert!(rows > 0, "prefill chunks of no rows");
        self.prefill_chunk = rows;
        self
    }

    /// Keeps and restores prompt prefixes in `cache` (the decode batch's, so both paths share
    /// what they kept).
    pub fn with_prefix_cache(mut self, cache: &'w PrefixCache<'w, Cuda>) -> Self {
        self.prefixes = Some(cache);
        self
    }

    /// Restarts the state and runs the prompt: a kept prefix restored, then backbone and tower
    /// prefill on the host-driven path, in the decode batch's chunks and calls
    /// (`Backbone::prefill_rows` of one request, as `Engine::prefill_streams` runs it, chunks
    /// restarting at the prefix's end, where the state is kept), then the step's inputs (the last
    /// prompt row, its hidden row and position, the sampler's request state).
    fn begin(
        &self,
        st: &mut StepState,
        rows: &Rows,
        prefix: SharedPrefix,
        opts: &GenerateOptions,
    ) -> Result<(), GenerateError> {
        let cuda = self.cuda;
        let context = cuda.context();
        if rows.len() + opts.max_frames > context {
            let (prompt_rows, max_frames) = (rows.len(), opts.max_frames);
            return Err(GenerateError::FramesPastContext { prompt_rows, max_frames, context });
        }
        self.backbone.restart_state(&mut st.backbone, &mut |layer| match layer {
            LayerState::Gdn(s) => s.clear(cuda),
            LayerState::Attention(cache) => cache.len = 0,
        })?;
        st.tower.restart(&mut |kv| kv.cache.len = 0);
        let total = rows.len();
        let mut start = self.prefixes.map_or(0, |cache| cache.restore(rows, prefix, &mut st.backbone, &mut st.tower));
        while start < total {
            let end = prefix.chunk_end(start, total, self.prefill_chunk);
            let hidden = self.backbone.prefill_rows(&mut [&mut st.backbone], &[rows.slice(start..end)])?;
            // As the batch: rows start..end−1 labelled by their successors; the last prompt row
            // is written by the first frame.
            self.tower.prefill(&mut st.tower, &hidden, &rows.slice(start..(end + 1).min(total)))?;
            if end == prefix.rows
                && let Some(cache) = self.prefixes
            {
                cache.keep(rows, prefix, &st.backbone, &st.tower);
            }
            if end == total {
                cuda.copy_device_to_device(st.hidden.ptr(), hidden.row_ptr(end - start - 1), st.hidden.cols * 2);
            }
            start = end;
        }
        let last = total - 1;
        let mut input = [0u32; words::RECIPE];
        input[..rows.width()].copy_from_slice(rows.row(last));
        input[words::INPUT_SEMANTIC] = u32::from(self.tower.is_semantic(rows.token(last)));
        input[words::POSITION] = u32::try_from(st.tower.len()).expect("positions fit i32");
        cuda.stage_to_device(st.words.ptr(), &input);
        let tokens: Vec<u32> = (0..rows.len()).map(|t| rows.token(t)).collect();
        st.sampler.begin_request(cuda, &opts.params, opts.seed, &tokens);
        Ok(())
    }
}

impl DeviceFrames for CudaFrames<'_> {
    fn start(
        &self,
        rows: &Rows,
        prefix: SharedPrefix,
        opts: &GenerateOptions,
    ) -> Result<Box<dyn FrameSource + '_>, GenerateError> {
        let mut st = self.state.borrow_mut();
        self.begin(&mut st, rows, prefix, opts)?;
        Ok(Box::new(GraphFrames { frames: self, st }))
    }
}

/// One request's frames from graph replays.
struct GraphFrames<'a, 'w> {
    frames: &'a CudaFrames<'w>,
    st: RefMut<'a, StepState>,
}

impl FrameSource for GraphFrames<'_, '_> {
    fn next_frame(&mut self, _last: bool) -> Result<Vec<u32>, GenerateError> {
        let cuda = self.frames.cuda;
        let graph = self.st.graph.as_ref().expect("the step was captured when the engine was built");
        graph.replay().unwrap_or_else(|e| panic!("replaying the frame step: {e}"));
        let sampled = self.st.sampler.read_frame(cuda);
        let frame = sampled.map_err(|DrawFailure { error, .. }| -> SamplingError { error })?;
        Ok(frame.row)
    }
}
