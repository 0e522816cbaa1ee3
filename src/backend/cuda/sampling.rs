//! `kernels/sampling.cu`: the main token (first draw, RAS draw, window check) and the codebook
//! heads' draws on the GPU, making the CPU sampler's decisions (`model::sampling`, the oracle)
//! with the same Philox draws (`model::rng`).
//!
//! A [`GpuSampler`] owns fixed device buffers for `rows` requests: each row's knobs, seed, frame
//! counter and RAS window ([`DeviceState`]) and its picks ([`DeviceOutputs`]). Two users:
//! - the CUDA-graph step (one row): the state is written once per request
//!   ([`GpuSampler::begin_request`]) and the per-frame calls ([`GpuSampler::sample_main`],
//!   [`GpuSampler::sample_head`], [`GpuSampler::end_frame`]) only launch kernels on fixed
//!   addresses: no host data, no synchronisation, no allocation, so a captured frame replays
//!   frame after frame (the counter and the window advance on the device);
//! - the decode batch (one row per stream of the step): the host keeps each stream's counter and
//!   window and writes every row's state at the start of a step ([`GpuSampler::begin_rows`]);
//!   the draws of all rows run in one launch per draw, and the rows come back in one read.
//!
//! Inputs are what the GPU produces: the restricted head's f32 logits (in its order, band then
//! EOS; candidate order is ascending token id, mapped as `engine::generate` maps it) and a
//! codebook head's bf16 logits (widened exactly; the CPU oracle must be fed the same widened
//! values).

use std::sync::Arc;

use bytemuck::{Pod, Zeroable};
use cudarc::driver::CudaContext;

use super::Cuda;
use super::kernel_constants::SAMPLING_THREADS;
use super::launch::{Dims, Kernel, KernelError, Module, embedded};
use super::memory::{DeviceBuffer, MemoryError, PoolBuf};
use super::tensor::GpuMatrix;
use crate::model::rng::{MAIN_STREAM, RAS_STREAM};
use crate::model::sampling::{MainCandidates, MainPick, RAS_WINDOW, SamplingError, SamplingParams};

/// Threads of one draw's block.
const THREADS: usize = SAMPLING_THREADS;
/// Most logits one draw sorts, and the words of the frame row in [`DeviceOutputs`].
pub use super::kernel_constants::{ROW_CAPACITY, SORT_CAP};

/// Fault kinds (`FAULT_*` in the .cu).
const FAULT_NONE: u32 = 0;
const FAULT_NON_FINITE: u32 = 1;
const FAULT_NO_CANDIDATES: u32 = 2;

pub struct SamplingKernels {
    main_draws: Kernel,
    main_finish: Kernel,
    head: Kernel,
    end_frame: Kernel,
}

impl SamplingKernels {
    pub fn load(ctx: &Arc<CudaContext>) -> Result<SamplingKernels, KernelError> {
        let m = Module::load_overlapping(ctx, "sampling", embedded::SAMPLING)?;
        // The sort keys of a full row: 64 KiB, above the default 48 KiB (every sm_80+ GPU allows it).
        let sorting = |name| m.kernel_with_shared(name, sort_shared_bytes(SORT_CAP) as usize);
        Ok(SamplingKernels {
            main_draws: sorting("sample_main_draws")?,
            main_finish: m.kernel("sample_main_finish")?,
            head: sorting("sample_head")?,
            end_frame: m.kernel("sampler_end_frame")?,
        })
    }
}

/// The sort length of a row of `n` logits: a power of two, at least one rank per thread.
///
/// # Panics
/// If `n` is 0 or above [`SORT_CAP`].
pub fn sort_len(n: usize) -> usize {
    assert!((1..=SORT_CAP).contains(&n), "a draw over {n} logits (1..={SORT_CAP} supported)");
    n.next_power_of_two().max(THREADS)
}

fn sort_shared_bytes(sort_len: usize) -> u32 {
    (sort_len * 8) as u32
}

/// The per-request state the kernels read and advance (`SamplerState` in the .cu, word for word).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Pod, Zeroable)]
pub struct DeviceState {
    /// The seed, low word first.
    pub seed: [u32; 2],
    /// The index of the frame being sampled, low word first; `sampler_end_frame` adds 1.
    pub frame: [u32; 2],
    pub temperature: f32,
    pub top_p: f32,
    /// The first draw's top-k; `u32::MAX` = no cap.
    pub main_top_k: u32,
    /// The heads' top-k, `min(top_k, 30)`.
    pub head_top_k: u32,
    /// Valid window slots: the last `window_len`.
    pub window_len: u32,
    /// Main tokens of the last frames (prompt rows before the first), oldest first.
    pub window: [u32; RAS_WINDOW],
}

impl DeviceState {
    /// A request's state at frame `frame`, its RAS window holding the last [`RAS_WINDOW`] of
    /// `window_tokens` (the prompt rows' tokens, as `RasWindow::from_prompt` takes them).
    pub fn new(params: &SamplingParams, seed: u64, window_tokens: &[u32], frame: u64) -> DeviceState {
        let head_top_k = params.head_filter().top_k;
        let kept = &window_tokens[window_tokens.len().saturating_sub(RAS_WINDOW)..];
        let mut window = [0u32; RAS_WINDOW];
        window[RAS_WINDOW - kept.len()..].copy_from_slice(kept);
        DeviceState {
            seed: split(seed),
            frame: split(frame),
            temperature: params.temperature,
            top_p: params.top_p,
            main_top_k: params.top_k.unwrap_or(u32::MAX),
            head_top_k: u32::try_from(head_top_k).expect("the head top-k is at most 30"),
            window_len: kept.len() as u32,
            window,
        }
    }

    pub fn frame(&self) -> u64 {
        join(self.frame)
    }

    /// The window's tokens, oldest first.
    pub fn window(&self) -> &[u32] {
        &self.window[RAS_WINDOW - (self.window_len as usize).min(RAS_WINDOW)..]
    }
}

fn split(v: u64) -> [u32; 2] {
    [v as u32, (v >> 32) as u32]
}

fn join(words: [u32; 2]) -> u64 {
    u64::from(words[0]) | (u64::from(words[1]) << 32)
}

/// Why one draw failed on the device (`DrawFault` in the .cu).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct DrawFault {
    pub kind: u32,
    /// The first logit whose score is NaN or +inf.
    pub index: u32,
    /// That score's f32 bits.
    pub score_bits: u32,
}

impl DrawFault {
    /// The CPU sampler's error for the same logits, or `None` when the draw succeeded.
    pub fn error(&self) -> Option<SamplingError> {
        match self.kind {
            FAULT_NONE => None,
            FAULT_NON_FINITE => {
                Some(SamplingError::NonFinite { index: self.index as usize, score: f32::from_bits(self.score_bits) })
            }
            FAULT_NO_CANDIDATES => Some(SamplingError::NoCandidates),
            kind => panic!("sampler fault kind {kind} is not one the kernels write"),
        }
    }
}

/// What the kernels write (`SamplerOut` in the .cu, word for word).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct DeviceOutputs {
    /// The frame row `[main, c0, c1..c_heads]` (what the next step embeds); unused words are 0.
    pub row: [u32; ROW_CAPACITY],
    /// 1 when the main token is semantic (the tower's label mask).
    pub semantic: u32,
    /// The first draw's token, the RAS draw's token, and whether the RAS draw was used.
    pub first: u32,
    pub ras: u32,
    pub ras_used: u32,
    /// Candidate index of the first and the RAS draw.
    pub pick: [u32; 2],
    /// The current frame's faults of the first and the RAS draw.
    pub draw_fault: [DrawFault; 2],
    /// The first fault since the request began (sticky): its draw stream, fault and frame.
    pub fault_stream: u32,
    pub fault: DrawFault,
    pub fault_frame: [u32; 2],
}

/// A draw that failed on the device: the stream (`MAIN_STREAM`, `RAS_STREAM`, `2 + r`), the
/// frame, and the CPU sampler's error for the same logits.
#[derive(Clone, Copy, Debug, PartialEq, thiserror::Error)]
#[error("draw stream {stream} of frame {frame}: {error}")]
pub struct DrawFailure {
    pub stream: u32,
    pub frame: u64,
    pub error: SamplingError,
}

/// One frame's picks, read back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SampledFrame {
    pub main: MainPick,
    pub semantic: bool,
    /// `[main, c0, c1..c_heads]`.
    pub row: Vec<u32>,
}

impl DeviceOutputs {
    /// The first failed draw since the request began.
    pub fn failure(&self) -> Option<DrawFailure> {
        self.fault.error().map(|error| DrawFailure { stream: self.fault_stream, frame: join(self.fault_frame), error })
    }

    /// This frame's error of the first draw (`MAIN_STREAM`) or the RAS draw (`RAS_STREAM`).
    pub fn main_draw_error(&self, stream: u32) -> Option<SamplingError> {
        assert!(stream == MAIN_STREAM || stream == RAS_STREAM, "stream {stream} is not a main-token draw");
        self.draw_fault[stream as usize].error()
    }

    /// The frame's picks, with rows of `row_len` words (2 + heads); an error if any draw failed.
    pub fn frame(&self, row_len: usize) -> Result<SampledFrame, DrawFailure> {
        if let Some(failure) = self.failure() {
            return Err(failure);
        }
        let main = MainPick { token: self.row[0], first: self.first, ras: self.ras, ras_used: self.ras_used != 0 };
        Ok(SampledFrame { main, semantic: self.semantic != 0, row: self.row[..row_len].to_vec() })
    }
}

/// For each candidate (ascending token id), its row in the restricted logits (`restricted_ids`
/// order), as `engine::generate` maps them.
///
/// # Panics
/// If a candidate is missing from `restricted_ids`.
pub fn candidate_rows(candidates: &[u32], restricted_ids: &[u32]) -> Vec<u32> {
    candidates
        .iter()
        .map(|id| {
            let row = restricted_ids.iter().position(|h| h == id);
            let row = row.unwrap_or_else(|| panic!("token {id} is not in the restricted head"));
            u32::try_from(row).expect("restricted head rows fit u32")
        })
        .collect()
}

/// The sampler's device buffers: one request's state and outputs per row, for `rows` requests
/// at once (one for the CUDA-graph step, the batch's capacity for the decode batch).
pub struct GpuSampler {
    /// Token id of each candidate.
    ids: DeviceBuffer,
    /// Restricted-logit row of each candidate.
    logit_index: DeviceBuffer,
    /// `[rows]` [`DeviceState`].
    states: DeviceBuffer,
    /// `[rows]` [`DeviceOutputs`].
    outputs: DeviceBuffer,
    rows: usize,
    candidates: usize,
    semantic_start: u32,
    semantic_end: u32,
    heads: usize,
    head_vocab: usize,
}

impl GpuSampler {
    /// A sampler of one row: [`GpuSampler::with_rows`] of 1.
    pub fn new(
        cuda: &Cuda,
        candidates: &MainCandidates,
        restricted_ids: &[u32],
        heads: usize,
        head_vocab: usize,
    ) -> Result<GpuSampler, MemoryError> {
        GpuSampler::with_rows(cuda, candidates, restricted_ids, heads, head_vocab, 1)
    }

    /// Uploads the candidate tables (waits: a start-up step) and neutral states for `rows`
    /// requests; call [`GpuSampler::begin_request`] or [`GpuSampler::begin_rows`] before
    /// sampling. `restricted_ids` is the restricted head's token order; `heads` codebook heads
    /// of `head_vocab` logits each.
    ///
    /// # Panics
    /// If a candidate is missing from `restricted_ids`, the candidates have no semantic token,
    /// a row is longer than [`SORT_CAP`], the frame row exceeds [`ROW_CAPACITY`], or `rows` is 0.
    pub fn with_rows(
        cuda: &Cuda,
        candidates: &MainCandidates,
        restricted_ids: &[u32],
        heads: usize,
        head_vocab: usize,
        rows: usize,
    ) -> Result<GpuSampler, MemoryError> {
        assert!(rows > 0, "a sampler of no rows");
        let n = candidates.len();
        // Both rows must fit one block's sort (sort_len panics otherwise).
        sort_len(n);
        sort_len(head_vocab);
        assert!(2 + heads <= ROW_CAPACITY, "{heads} heads do not fit the {ROW_CAPACITY}-word frame row");
        let band: Vec<u32> = candidates.ids().iter().copied().filter(|&t| candidates.is_semantic(t)).collect();
        let (semantic_start, semantic_end) = match (band.first(), band.last()) {
            (Some(&start), Some(&end)) => (start, end),
            _ => panic!("the main-token candidates have no semantic token"),
        };
        let candidate_rows = candidate_rows(candidates.ids(), restricted_ids);
        let budget = cuda.budget();
        let sampler = GpuSampler {
            ids: DeviceBuffer::alloc(budget, "sampler candidate ids", n * 4)?,
            logit_index: DeviceBuffer::alloc(budget, "sampler candidate rows", n * 4)?,
            states: DeviceBuffer::alloc(budget, "sampler states", rows * size_of::<DeviceState>())?,
            outputs: DeviceBuffer::alloc(budget, "sampler outputs", rows * size_of::<DeviceOutputs>())?,
            rows,
            candidates: n,
            semantic_start,
            semantic_end,
            heads,
            head_vocab,
        };
        cuda.copy_to_device(sampler.ids.ptr(), candidates.ids());
        cuda.copy_to_device(sampler.logit_index.ptr(), &candidate_rows);
        let neutral = DeviceState::new(&SamplingParams::default(), 0, &[], 0);
        sampler.begin_rows(cuda, &vec![neutral; rows]);
        Ok(sampler)
    }

    /// Rows it can sample at once.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Starts a request at frame 0 in row 0: knobs, seed, the RAS window from the last prompt
    /// tokens, and cleared outputs. Queued without a sync (small pageable copies; not capturable).
    pub fn begin_request(&self, cuda: &Cuda, params: &SamplingParams, seed: u64, window_tokens: &[u32]) {
        self.begin_request_at(cuda, params, seed, window_tokens, 0);
    }

    /// [`GpuSampler::begin_request`] resuming at frame `frame` (the draws' Philox key).
    ///
    /// # Panics
    /// If `params` are out of range (requests are validated before they get here).
    pub fn begin_request_at(&self, cuda: &Cuda, params: &SamplingParams, seed: u64, window_tokens: &[u32], frame: u64) {
        params.validate().unwrap_or_else(|e| panic!("sampling parameters reached the GPU sampler unvalidated: {e}"));
        self.begin_rows(cuda, &[DeviceState::new(params, seed, window_tokens, frame)]);
    }

    /// Writes rows `0..states.len()`'s states and clears their outputs (the decode batch's
    /// per-step start: the host keeps each stream's frame counter and window). Queued without a
    /// sync; not capturable.
    ///
    /// # Panics
    /// If there are more states than rows.
    pub fn begin_rows(&self, cuda: &Cuda, states: &[DeviceState]) {
        assert!(states.len() <= self.rows, "{} sampler rows of {}", states.len(), self.rows);
        if states.is_empty() {
            return;
        }
        cuda.stage_to_device(self.states.ptr(), states);
        cuda.stage_to_device(self.outputs.ptr(), &vec![DeviceOutputs::default(); states.len()]);
    }

    /// The frame's main token from the restricted logits (`[candidates]` f32 in the restricted
    /// head's order, e.g. `RestrictedHead::logits`) of row 0. Once per frame.
    pub fn sample_main(&self, cuda: &Cuda, logits: &PoolBuf) {
        self.sample_main_rows(cuda, logits, 1);
    }

    /// [`GpuSampler::sample_main`] of rows `0..n`: row b's logits are row b of `logits`
    /// (`[n, candidates]` f32, e.g. `RestrictedHead::logits_rows`): both draws, the window check
    /// and push, and `row[0..2]` and `semantic` of each row's outputs.
    ///
    /// # Panics
    /// If `n` is 0 or above the sampler's rows, or `logits` is short.
    pub fn sample_main_rows(&self, cuda: &Cuda, logits: &PoolBuf, n: usize) {
        self.check_rows(n);
        assert!(
            logits.bytes() >= n * self.candidates * 4,
            "restricted logits: {} bytes for {n} rows of {} candidates",
            logits.bytes(),
            self.candidates
        );
        let n_pad = sort_len(self.candidates);
        let k = &cuda.kernels.sampling;
        let dims = Dims::grid((2, n as u32, 1), THREADS as u32).with_shared(sort_shared_bytes(n_pad));
        let args = [
            logits.ptr().into(),
            self.logit_index.ptr().into(),
            self.candidates.into(),
            n_pad.into(),
            self.candidates.into(),
            self.states.ptr().into(),
            self.outputs.ptr().into(),
        ];
        k.main_draws.launch(cuda.stream(), dims, &args);
        let args = [
            self.ids.ptr().into(),
            self.semantic_start.into(),
            self.semantic_end.into(),
            self.states.ptr().into(),
            self.outputs.ptr().into(),
        ];
        k.main_finish.launch(cuda.stream(), Dims::linear(n, 32), &args);
    }

    /// Code `c_{r+1}` from head `r`'s logits, row `row` of `logits` (`[_, head_vocab]` bf16, what
    /// the head projection writes), into `row[2 + r]` of row 0's outputs.
    pub fn sample_head(&self, cuda: &Cuda, r: usize, logits: &GpuMatrix, row: usize) {
        self.launch_head(cuda, r, logits, row, 1);
    }

    /// [`GpuSampler::sample_head`] of rows `0..n`: row b's draw from row b of `logits`
    /// (`[n, head_vocab]` bf16).
    pub fn sample_head_rows(&self, cuda: &Cuda, r: usize, logits: &GpuMatrix, n: usize) {
        assert_eq!(logits.rows, n, "head logits rows");
        self.launch_head(cuda, r, logits, 0, n);
    }

    fn launch_head(&self, cuda: &Cuda, r: usize, logits: &GpuMatrix, first_row: usize, n: usize) {
        self.check_rows(n);
        assert!(r < self.heads, "head {r} of {}", self.heads);
        assert_eq!(logits.cols, self.head_vocab, "head logits width");
        assert!(first_row + n <= logits.rows, "head logits rows {first_row}..{} of {}", first_row + n, logits.rows);
        let n_pad = sort_len(self.head_vocab);
        let dims = Dims::linear(n, THREADS as u32).with_shared(sort_shared_bytes(n_pad));
        let args = [
            logits.row_ptr(first_row).into(),
            self.head_vocab.into(),
            n_pad.into(),
            r.into(),
            self.states.ptr().into(),
            self.outputs.ptr().into(),
        ];
        cuda.kernels.sampling.head.launch(cuda.stream(), dims, &args);
    }

    fn check_rows(&self, n: usize) {
        assert!((1..=self.rows).contains(&n), "{n} sampler rows of {}", self.rows);
    }

    /// Advances row 0's frame counter: the next draws use the next frame's Philox key.
    pub fn end_frame(&self, cuda: &Cuda) {
        cuda.kernels.sampling.end_frame.launch(cuda.stream(), Dims::linear(1, 32), &[self.states.ptr().into()]);
    }

    /// Device address of row 0's frame row `[main, c0, c1..c_heads]` (u32 words); row b's is
    /// [`GpuSampler::output_stride_words`] · b words on.
    pub fn row_ptr(&self) -> u64 {
        self.outputs.ptr()
    }

    /// Device address of row 0's "main is semantic" flag (u32, 0 or 1).
    pub fn semantic_ptr(&self) -> u64 {
        self.outputs.ptr() + (ROW_CAPACITY * 4) as u64
    }

    /// `u32` words from one row's outputs to the next.
    pub fn output_stride_words(&self) -> usize {
        size_of::<DeviceOutputs>() / 4
    }

    /// Words of a frame row: main, c0 and one code per head.
    pub fn row_len(&self) -> usize {
        2 + self.heads
    }

    /// Row 0's outputs, after all queued work (waits).
    pub fn read_outputs(&self, cuda: &Cuda) -> DeviceOutputs {
        self.read_rows(cuda, 1)[0]
    }

    /// Rows `0..n`'s outputs, after all queued work (waits: the decode batch's one read-back).
    pub fn read_rows(&self, cuda: &Cuda, n: usize) -> Vec<DeviceOutputs> {
        self.check_rows(n);
        cuda.copy_to_host::<DeviceOutputs>(self.outputs.ptr(), n)
    }

    /// Row 0's state (frame counter, window), after all queued work (waits).
    pub fn read_state(&self, cuda: &Cuda) -> DeviceState {
        cuda.copy_to_host::<DeviceState>(self.states.ptr(), 1)[0]
    }

    /// The last frame's picks of row 0, after all queued work (waits).
    pub fn read_frame(&self, cuda: &Cuda) -> Result<SampledFrame, DrawFailure> {
        self.read_outputs(cuda).frame(self.row_len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::sampling::HEAD_TOP_K_CAP;

    #[test]
    fn layouts_match_the_kernel_structs() {
        // static_assert in kernels/sampling.cu: 25 and 34 words.
        assert_eq!(size_of::<DeviceState>(), 25 * 4);
        assert_eq!(size_of::<DeviceOutputs>(), 34 * 4);
        assert_eq!(size_of::<DrawFault>(), 3 * 4);
    }

    #[test]
    fn state_keeps_the_last_sixteen_tokens_oldest_first() {
        let params = SamplingParams { temperature: 0.7, top_p: 0.8, top_k: Some(50) };
        let tokens: Vec<u32> = (100..120).collect();
        let s = DeviceState::new(&params, 0x1234_5678_9abc_def0, &tokens, (7u64 << 32) | 3);
        assert_eq!(s.window(), &tokens[4..]);
        assert_eq!(s.window_len, 16);
        assert_eq!(s.seed, [0x9abc_def0, 0x1234_5678]);
        assert_eq!(s.frame, [3, 7]);
        assert_eq!(s.frame(), (7u64 << 32) | 3);
        assert_eq!((s.temperature, s.top_p, s.main_top_k, s.head_top_k), (0.7, 0.8, 50, 30));

        let short = DeviceState::new(&params, 1, &[5, 6, 7], 0);
        assert_eq!(short.window(), &[5, 6, 7]);
        assert_eq!(&short.window[..13], &[0; 13]);
        assert!(DeviceState::new(&params, 1, &[], 0).window().is_empty());
    }

    #[test]
    fn state_top_k_follows_the_filters() {
        let none = DeviceState::new(&SamplingParams { top_k: None, ..SamplingParams::default() }, 0, &[], 0);
        assert_eq!((none.main_top_k, none.head_top_k), (u32::MAX, 30));
        let five = DeviceState::new(&SamplingParams { top_k: Some(5), ..SamplingParams::default() }, 0, &[], 0);
        assert_eq!((five.main_top_k, five.head_top_k), (5, 5));
        let p = SamplingParams { top_k: Some(i32::MAX as u32), ..SamplingParams::default() };
        assert_eq!(DeviceState::new(&p, 0, &[], 0).head_top_k as usize, HEAD_TOP_K_CAP);
    }

    #[test]
    fn sort_lengths() {
        assert_eq!(sort_len(1), 1024);
        assert_eq!(sort_len(4096), 4096);
        assert_eq!(sort_len(4097), 8192);
        assert_eq!(sort_len(SORT_CAP), SORT_CAP);
        assert!(std::panic::catch_unwind(|| sort_len(SORT_CAP + 1)).is_err());
        assert!(std::panic::catch_unwind(|| sort_len(0)).is_err());
    }

    #[test]
    fn candidates_map_to_restricted_rows() {
        // EOS below the band: candidates ascend [eos, band..]; the head holds [band.., eos].
        let candidates = MainCandidates::new(100, 4, 7);
        let head: Vec<u32> = (100..104).chain([7]).collect();
        assert_eq!(candidate_rows(candidates.ids(), &head), vec![4, 0, 1, 2, 3]);
        assert!(std::panic::catch_unwind(|| candidate_rows(&[5], &head)).is_err());
    }

    #[test]
    fn outputs_decode_picks_and_faults() {
        let mut out = DeviceOutputs { first: 9, ras: 11, ras_used: 1, semantic: 1, ..DeviceOutputs::default() };
        out.row[..4].copy_from_slice(&[11, 3, 40, 41]);
        let frame = out.frame(4).expect("no fault");
        assert_eq!(frame.main, MainPick { token: 11, first: 9, ras: 11, ras_used: true });
        assert_eq!(frame.row, vec![11, 3, 40, 41]);
        assert!(frame.semantic);

        out.fault = DrawFault { kind: FAULT_NON_FINITE, index: 17, score_bits: f32::INFINITY.to_bits() };
        out.fault_stream = 4;
        out.fault_frame = [2, 1];
        let failure = out.frame(4).expect_err("a fault");
        assert_eq!(failure.stream, 4);
        assert_eq!(failure.frame, (1u64 << 32) | 2);
        assert_eq!(failure.error, SamplingError::NonFinite { index: 17, score: f32::INFINITY });

        out.draw_fault[1] = DrawFault { kind: FAULT_NO_CANDIDATES, ..DrawFault::default() };
        assert_eq!(out.main_draw_error(RAS_STREAM), Some(SamplingError::NoCandidates));
        assert_eq!(out.main_draw_error(MAIN_STREAM), None);
    }
}
