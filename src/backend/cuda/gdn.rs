//! `kernels/gdn.cu` and `kernels/gdn_chunk_intra.cu`, `gdn_chunk_scan.cu` (the chunked prefill):
//! the Gated DeltaNet mixer (`backbone.md` §3) on the GPU, with its per-request state. Same
//! contract as the CPU oracle (`cpu::backbone::gdn`): projections, causal conv with the carried
//! conv state, SiLU, L2-normalised q/k, gates β and g, the delta rule (64-token chunks for
//! prefill, the token recurrence for decode), gated RMSNorm and `out_proj`.
//!
//! Numerics: the projections (q|k|v, z, a, b) come out of `linear::linear` in bf16; conv output,
//! normalised q/k, gates, core output and the recurrent state are fp32; the gated norm rounds once
//! to bf16 before `out_proj`. The conv state is kept in f32 (its values, pre-conv projection
//! outputs, are bf16-exact), so both states read back in the CPU `GdnState` layouts unchanged.

use std::sync::Arc;

use cudarc::driver::CudaContext;

use super::Cuda;
use super::kernel_constants::{
    GDN_BV, GDN_CHUNK, GDN_MAX_DK, GDN_SCAN_BV, GDN_SQUARE_FLOATS, GDN_THREADS, GDN_TILE_STRIDE,
};
use super::launch::{Dims, Kernel, KernelError, Module, embedded};
use super::linear::{linear, linear_many, linear_rows, linear_rows_many, linear_segments};
use super::memory::PoolBuf;
use super::tensor::{DType, GpuMatrix, GpuWeight};
use crate::backend::backbone::GdnShape;
use crate::model::weights::GdnWeights;

/// Threads of every kernel here.
const THREADS: u32 = GDN_THREADS as u32;
/// Tokens per chunk of the prefill core, as in the reference.
const CHUNK: usize = GDN_CHUNK;
/// Value columns per CTA of the recurrent core.
const VALUE_TILE: usize = GDN_BV;
/// Value columns per CTA of the chunk scan.
const SCAN_VALUE_TILE: usize = GDN_SCAN_BV;
/// Largest key dim the cores hold.
const MAX_KEY_DIM: usize = GDN_MAX_DK;
/// Value heads normalised per block of `gdn_gated_norm` (one per warp).
const NORM_PAIRS_PER_BLOCK: usize = THREADS as usize / 32;

pub struct GdnKernels {
    zero_f32: Kernel,
    conv_prepare: Kernel,
    conv_state_update: Kernel,
    chunk_intra: Kernel,
    chunk_scan: Kernel,
    recurrent_core: Kernel,
    gated_norm: Kernel,
}

impl GdnKernels {
    pub fn load(ctx: &Arc<CudaContext>) -> Result<GdnKernels, KernelError> {
        let m = Module::load_overlapping(ctx, "gdn", embedded::GDN)?;
        let intra = Module::load_overlapping(ctx, "gdn_chunk_intra", embedded::GDN_CHUNK_INTRA)?;
        let scan = Module::load_overlapping(ctx, "gdn_chunk_scan", embedded::GDN_CHUNK_SCAN)?;
        // 86.75 and 96 KiB: within the opt-in limit of every target (99 KiB on sm_89/sm_120),
        // two CTAs an SM on sm_90 (the unit test below holds both).
        let chunk_intra = intra.kernel_with_shared("gdn_chunk_intra", intra_shared_bytes() as usize)?;
        let chunk_scan = scan.kernel_with_shared("gdn_chunk_scan", scan_shared_bytes() as usize)?;
        Ok(GdnKernels {
            zero_f32: m.kernel("gdn_zero_f32")?,
            conv_prepare: m.kernel("gdn_conv_prepare")?,
            conv_state_update: m.kernel("gdn_conv_state_update")?,
            chunk_intra,
            chunk_scan,
            recurrent_core: m.kernel("gdn_recurrent_core")?,
            gated_norm: m.kernel("gdn_gated_norm")?,
        })
    }
}

/// Dynamic shared memory of `gdn_chunk_intra` (the layout above the kernel): K and Q (then V) as
/// bf16 hi + lo, A (then T hi + lo), then γ, β and e^γ.
fn intra_shared_bytes() -> u32 {
    let bytes = 4 * CHUNK * GDN_TILE_STRIDE * 2 + GDN_SQUARE_FLOATS * 4 + 3 * CHUNK * 4;
    u32::try_from(bytes).expect("shared memory size")
}

/// Dynamic shared memory of `gdn_chunk_scan` (the layout above the kernel), every tile bf16 hi +
/// lo: two 64 × Dk tile buffers, C, Sᵀ, V_newᵀ and its decayed copy.
fn scan_shared_bytes() -> u32 {
    let halves =
        2 * (2 * CHUNK * MAX_KEY_DIM + CHUNK * CHUNK + SCAN_VALUE_TILE * MAX_KEY_DIM + 2 * SCAN_VALUE_TILE * CHUNK);
    u32::try_from(halves * 2).expect("shared memory size")
}

/// Per-request state of one GDN layer on the GPU (layouts of the CPU `GdnState`).
pub struct GpuGdnState {
    /// f32 `[kernel − 1, qkv_dim]`: the last pre-conv q|k|v inputs, oldest first.
    conv: PoolBuf,
    /// f32 `[value_heads, key_dim, value_dim]`, `S[k][v]` per value head.
    recurrent: PoolBuf,
    conv_len: usize,
    recurrent_len: usize,
}

impl GpuGdnState {
    /// The conv state as the CPU `GdnState::conv` data (row-major `[kernel − 1, qkv_dim]`).
    pub fn conv_to_host(&self, cuda: &Cuda) -> Vec<f32> {
        cuda.copy_to_host(self.conv.ptr(), self.conv_len)
    }

    /// The recurrent state as the CPU `GdnState::recurrent` (`[value_heads, key_dim, value_dim]`).
    pub fn recurrent_to_host(&self, cuda: &Cuda) -> Vec<f32> {
        cuda.copy_to_host(self.recurrent.ptr(), self.recurrent_len)
    }

    /// `(address, bytes)` of the conv state, then of the recurrent state.
    pub fn buffers(&self) -> [(u64, usize); 2] {
        [(self.conv.ptr(), self.conv_len * 4), (self.recurrent.ptr(), self.recurrent_len * 4)]
    }

    /// Zeroes both states (the start of a request), keeping their addresses.
    pub fn clear(&mut self, cuda: &Cuda) {
        zero(cuda, &self.conv, self.conv_len);
        zero(cuda, &self.recurrent, self.recurrent_len);
    }

    fn check(&self, shape: &GdnShape) {
        assert_eq!(self.conv_len, (shape.conv_kernel - 1) * shape.qkv_dim(), "GDN conv state of another shape");
        assert_eq!(
            self.recurrent_len,
            shape.value_heads * shape.key_dim * shape.value_dim,
            "GDN recurrent state of another shape"
        );
    }
}

/// A zeroed state (the start of a request).
pub fn new_state(cuda: &Cuda, shape: &GdnShape) -> GpuGdnState {
    check_shape(shape);
    let conv_len = (shape.conv_kernel - 1) * shape.qkv_dim();
    let recurrent_len = shape.value_heads * shape.key_dim * shape.value_dim;
    let state = GpuGdnState {
        conv: cuda.scratch(conv_len * 4),
        recurrent: cuda.scratch(recurrent_len * 4),
        conv_len,
        recurrent_len,
    };
    zero(cuda, &state.conv, conv_len);
    zero(cuda, &state.recurrent, recurrent_len);
    state
}

/// The mixer over `x` `[rows, hidden]` with the chunked algorithm, continuing `state`.
pub fn prefill(
    cuda: &Cuda,
    shape: &GdnShape,
    w: &GdnWeights<GpuWeight>,
    x: &GpuMatrix,
    state: &mut GpuGdnState,
) -> GpuMatrix {
    mixer(cuda, shape, w, x, state, Core::Chunked)
}

/// [`prefill`] of several requests' prompt chunks at once (`BackboneOps::gdn_prefill_many`):
/// `lens[i]` consecutive rows of `x` continue `states[i]`. The wide projections (qkv, z,
/// out_proj) give each request's rows what [`linear`] gives them alone, in one GEMM launch for
/// all (`linear_segments`); the narrow ones (b, a) run once over all rows under the rows
/// contract; the conv, the gates, the chunked core and the gated norm once over every request,
/// each request's rows and state in their own blocks (the core's grid.z). A request's rows are
/// therefore the same whichever requests share the call (but not those of [`prefill`], whose b
/// and a projections take the prefill GEMM).
pub fn prefill_many(
    cuda: &Cuda,
    shape: &GdnShape,
    w: &GdnWeights<GpuWeight>,
    x: &GpuMatrix,
    lens: &[usize],
    states: &mut [&mut GpuGdnState],
) -> GpuMatrix {
    check_shape(shape);
    check_weights(shape, w);
    assert_eq!(lens.len(), states.len(), "GDN prefill: one state per request");
    assert!(lens.iter().all(|&n| n > 0), "GDN prefill of a request with no rows");
    assert_eq!(lens.iter().sum::<usize>(), x.rows, "GDN prefill: the requests' rows cover x");
    for state in states.iter() {
        state.check(shape);
    }
    let p = Projected {
        qkv: linear_segments(cuda, x, lens, &w.in_proj_qkv),
        z: linear_segments(cuda, x, lens, &w.in_proj_z),
        b: linear_rows(cuda, x, &w.in_proj_b),
        a: linear_rows(cuda, x, &w.in_proj_a),
    };
    let o = cuda.scratch(x.rows * shape.value_heads * shape.value_dim * 4);
    run_core(cuda, shape, w, &p, Sequences::Many(states, lens), o.ptr(), Core::Chunked);
    let gated = gated_norm(cuda, shape, w, &p, &o);
    linear_segments(cuda, &gated, lens, &w.out_proj)
}

/// The mixer with the token recurrence, rows one after another. Queues kernels only: no host
/// synchronisation, and every buffer comes from the pool (no driver allocation after warm-up).
pub fn decode(
    cuda: &Cuda,
    shape: &GdnShape,
    w: &GdnWeights<GpuWeight>,
    x: &GpuMatrix,
    state: &mut GpuGdnState,
) -> GpuMatrix {
    mixer(cuda, shape, w, x, state, Core::Recurrent)
}

#[derive(Clone, Copy)]
enum Core {
    Chunked,
    Recurrent,
}

fn mixer(
    cuda: &Cuda,
    shape: &GdnShape,
    w: &GdnWeights<GpuWeight>,
    x: &GpuMatrix,
    state: &mut GpuGdnState,
    core: Core,
) -> GpuMatrix {
    check_shape(shape);
    check_weights(shape, w);
    state.check(shape);
    assert!(x.rows > 0, "GDN mixer over zero rows");
    let p = Projected::new(linear_many, cuda, w, x);
    let o = cuda.scratch(x.rows * shape.value_heads * shape.value_dim * 4);
    run_core(cuda, shape, w, &p, Sequences::One(state), o.ptr(), core);
    finish(cuda, shape, w, &p, &o, linear)
}

/// [`decode`] of one row per request (`BackboneOps::gdn_decode_rows`): one launch of each kernel
/// over every row, the conv and recurrence of row r over its own state (address tables), each
/// row exactly as [`decode`] computes it alone.
pub fn decode_rows(
    cuda: &Cuda,
    shape: &GdnShape,
    w: &GdnWeights<GpuWeight>,
    x: &GpuMatrix,
    states: &mut [&mut GpuGdnState],
) -> GpuMatrix {
    check_shape(shape);
    check_weights(shape, w);
    assert_eq!(x.rows, states.len(), "GDN decode rows: one state per row");
    assert!(!states.is_empty(), "GDN decode of no rows");
    for state in states.iter() {
        state.check(shape);
    }
    let p = Projected::new(linear_rows_many, cuda, w, x);
    let o = cuda.scratch(x.rows * shape.value_heads * shape.value_dim * 4);
    run_core(cuda, shape, w, &p, Sequences::Rows(states), o.ptr(), Core::Recurrent);
    finish(cuda, shape, w, &p, &o, linear_rows)
}

/// The four input projections of a GDN mixer over `x`'s rows.
struct Projected {
    qkv: GpuMatrix,
    z: GpuMatrix,
    b: GpuMatrix,
    a: GpuMatrix,
}

impl Projected {
    fn new(
        project: fn(&Cuda, &GpuMatrix, &[&GpuWeight]) -> Vec<GpuMatrix>,
        cuda: &Cuda,
        w: &GdnWeights<GpuWeight>,
        x: &GpuMatrix,
    ) -> Projected {
        // The four projections of one input: one launch at decode (`linear_many`).
        let [qkv, z, b, a]: [GpuMatrix; 4] =
            project(cuda, x, &[&w.in_proj_qkv, &w.in_proj_z, &w.in_proj_b, &w.in_proj_a])
                .try_into()
                .unwrap_or_else(|_| unreachable!("one output per weight"));
        Projected { qkv, z, b, a }
    }
}

/// Whose state each projected row continues.
enum Sequences<'a, 's> {
    /// Every row, in order, continues this one state.
    One(&'a mut GpuGdnState),
    /// Row r is one decode row continuing `states[r]` (the decode batch).
    Rows(&'a mut [&'s mut GpuGdnState]),
    /// `lens[i]` consecutive rows continue `states[i]` (several prompts).
    Many(&'a mut [&'s mut GpuGdnState], &'a [usize]),
}

/// Conv (with the carried window), gates, and the chunked or recurrent core for every projected
/// row; the core's f32 output goes to `o` (`[rows, Hv·Dv]`).
fn run_core(
    cuda: &Cuda,
    shape: &GdnShape,
    w: &GdnWeights<GpuWeight>,
    p: &Projected,
    sequences: Sequences<'_, '_>,
    o: u64,
    core: Core,
) {
    let (hv, dv, rows) = (shape.value_heads, shape.value_dim, p.qkv.rows);
    let channels = shape.qkv_dim();
    // One sequence: its own state, its rows in order. The decode batch: each row its own state,
    // from two staged address tables (conv windows, then recurrent states).
    // Several prompts also stage which sequence each row is in and where each one starts.
    let address_table = |states: &[&mut GpuGdnState]| {
        let mut words: Vec<u64> = states.iter().map(|st| st.conv.ptr()).collect();
        words.extend(states.iter().map(|st| st.recurrent.ptr()));
        cuda.stage_table(&words, 0..0)
    };
    // `longest`: the most rows of one sequence.
    let (conv, recurrent, tables, spans, sequences, longest) = match sequences {
        Sequences::One(state) => (state.conv.ptr(), state.recurrent.ptr(), None, None, 1, rows),
        Sequences::Rows(states) => {
            let table = address_table(states);
            (states[0].conv.ptr(), states[0].recurrent.ptr(), Some(table), None, states.len(), 1)
        }
        Sequences::Many(states, lens) => {
            let table = address_table(states);
            let words = sequence_words(lens);
            let spans = cuda.scratch(words.len() * 4);
            cuda.stage_to_device(spans.ptr(), &words);
            let longest = lens.iter().copied().max().unwrap_or(0);
            (states[0].conv.ptr(), states[0].recurrent.ptr(), Some(table), Some(spans), states.len(), longest)
        }
    };
    let conv_table = tables.as_ref().map_or(0, |t| t.ptr());
    let recurrent_table = tables.as_ref().map_or(0, |t| t.ptr() + 8 * sequences as u64);
    // Row → sequence ([rows] u32), then each sequence's first row ([sequences + 1]).
    let row_seq = spans.as_ref().map_or(0, |t| t.ptr());
    let seq_starts = spans.as_ref().map_or(0, |t| t.ptr() + 4 * rows as u64);
    let prep = cuda.scratch(rows * channels * 4);
    let gates = cuda.scratch(2 * rows * hv * 4);
    // Whole heads per block, about one channel per thread: a decode row spreads over
    // channels / block_channels SMs (32 at full size) instead of one.
    let block_channels = shape.key_dim * (THREADS as usize / shape.key_dim).max(1);
    let args = [
        p.qkv.ptr().into(),
        conv.into(),
        w.conv1d.ptr.into(),
        p.b.ptr().into(),
        p.a.ptr().into(),
        w.a_log.ptr.into(),
        w.dt_bias.ptr.into(),
        prep.ptr().into(),
        gates.ptr().into(),
        rows.into(),
        channels.into(),
        shape.conv_kernel.into(),
        shape.key_heads.into(),
        shape.key_dim.into(),
        hv.into(),
        ((1.0 / (shape.key_dim as f64).sqrt()) as f32).into(),
        conv_table.into(),
        row_seq.into(),
        seq_starts.into(),
        block_channels.into(),
    ];
    let blocks = u32::try_from(channels.div_ceil(block_channels)).expect("channel blocks");
    let rows_grid = u32::try_from(rows).expect("rows fit the grid");
    cuda.kernels.gdn.conv_prepare.launch(cuda.stream(), Dims::grid((rows_grid, blocks, 1), THREADS), &args);
    // The window advances by each sequence's rows: all of them for one, one per row in the
    // decode batch, each prompt's own (from seq_starts) for several. Where every sequence has one
    // row, gdn_conv_prepare advanced it (its `advances_window`: no row table, and address tables
    // or one row).
    let advanced = spans.is_none() && (tables.is_some() || rows == 1);
    if !advanced {
        let seq_rows = if tables.is_some() { 1 } else { rows };
        let args = [
            conv.into(),
            p.qkv.ptr().into(),
            seq_rows.into(),
            channels.into(),
            (shape.conv_kernel - 1).into(),
            conv_table.into(),
            seq_starts.into(),
        ];
        let blocks = channels.div_ceil(THREADS as usize) as u32;
        let dims = Dims::grid((blocks, sequences as u32, 1), THREADS);
        cuda.kernels.gdn.conv_state_update.launch(cuda.stream(), dims, &args);
    }

    match core {
        Core::Chunked => {
            assert!(tables.is_none() || spans.is_some(), "the chunked core runs whole sequences");
            chunked_core(
                cuda,
                shape,
                &prep,
                &gates,
                recurrent,
                o,
                rows,
                longest,
                sequences,
                recurrent_table,
                seq_starts,
            );
        }
        Core::Recurrent => {
            let args = [
                prep.ptr().into(),
                gates.ptr().into(),
                recurrent.into(),
                o.into(),
                rows.into(),
                shape.key_heads.into(),
                hv.into(),
                shape.key_dim.into(),
                dv.into(),
                recurrent_table.into(),
            ];
            let grid = (u32::try_from(hv).expect("value heads"), dv.div_ceil(VALUE_TILE) as u32, sequences as u32);
            cuda.kernels.gdn.recurrent_core.launch(cuda.stream(), Dims::grid(grid, THREADS), &args);
        }
    }
}

/// The chunked delta rule over `rows` prepared rows of `sequences` sequences (`seq_starts` = 0:
/// one, continuing the state at `recurrent`; else each from its own state in the table at
/// `recurrent_table`): the state-free work of every chunk at once (`gdn_chunk_intra`), then each
/// sequence's chunks in order (`gdn_chunk_scan`), through pool scratch (the layouts in gdn.cu).
#[allow(clippy::too_many_arguments)]
fn chunked_core(
    cuda: &Cuda,
    shape: &GdnShape,
    prep: &PoolBuf,
    gates: &PoolBuf,
    recurrent: u64,
    o: u64,
    rows: usize,
    longest: usize,
    sequences: usize,
    recurrent_table: u64,
    seq_starts: u64,
) {
    let (hk, hv, dk, dv) = (shape.key_heads, shape.value_heads, shape.key_dim, shape.value_dim);
    // The layouts in kernels/gdn_chunk.cuh: q, k, W and C as bf16 hi + lo.
    let qk = cuda.scratch(rows * hk * 4 * MAX_KEY_DIM * 2);
    let w = cuda.scratch(rows * hv * 2 * MAX_KEY_DIM * 2);
    let u = cuda.scratch(rows * hv * dv * 4);
    let c = cuda.scratch(rows * hv * 2 * CHUNK * 2);
    let decay = cuda.scratch(rows * hv * 2 * 4);
    let heads = u32::try_from(hv).expect("value heads");
    let seqs = u32::try_from(sequences).expect("sequences");
    let dims = |&a: &(u32, u32, u32), shared: u32| Dims::grid(a, THREADS).with_shared(shared);
    let args = [
        prep.ptr().into(),
        gates.ptr().into(),
        qk.ptr().into(),
        w.ptr().into(),
        u.ptr().into(),
        c.ptr().into(),
        decay.ptr().into(),
        rows.into(),
        shape.key_heads.into(),
        hv.into(),
        dk.into(),
        dv.into(),
        seq_starts.into(),
    ];
    let grid = (heads, u32::try_from(longest.div_ceil(CHUNK)).expect("chunks"), seqs);
    cuda.kernels.gdn.chunk_intra.launch(cuda.stream(), dims(&grid, intra_shared_bytes()), &args);
    let args = [
        qk.ptr().into(),
        w.ptr().into(),
        u.ptr().into(),
        c.ptr().into(),
        decay.ptr().into(),
        recurrent.into(),
        o.into(),
        rows.into(),
        shape.key_heads.into(),
        hv.into(),
        dk.into(),
        dv.into(),
        recurrent_table.into(),
        seq_starts.into(),
    ];
    let grid = (heads, u32::try_from(dv.div_ceil(SCAN_VALUE_TILE)).expect("value tiles"), seqs);
    cuda.kernels.gdn.chunk_scan.launch(cuda.stream(), dims(&grid, scan_shared_bytes()), &args);
}

/// What the kernels read of several sequences of `lens` rows: each row's sequence (`[Σ lens]`),
/// then each sequence's first row and, last, the total (`[lens + 1]`).
fn sequence_words(lens: &[usize]) -> Vec<u32> {
    let word = |v: usize| u32::try_from(v).expect("GDN prefill rows fit u32");
    let mut words: Vec<u32> = Vec::with_capacity(lens.iter().sum::<usize>() + lens.len() + 1);
    for (i, &n) in lens.iter().enumerate() {
        words.extend(std::iter::repeat_n(word(i), n));
    }
    let mut start = 0;
    words.push(0);
    for &n in lens {
        start += n;
        words.push(word(start));
    }
    words
}

/// The gated RMSNorm of the core's output with `z`, then `out_proj`, over every row.
fn finish(
    cuda: &Cuda,
    shape: &GdnShape,
    w: &GdnWeights<GpuWeight>,
    p: &Projected,
    o: &PoolBuf,
    project: fn(&Cuda, &GpuMatrix, &GpuWeight) -> GpuMatrix,
) -> GpuMatrix {
    project(cuda, &gated_norm(cuda, shape, w, p, o), &w.out_proj)
}

/// The gated RMSNorm of the core's output with `z` (each (row, head) pair on its own).
fn gated_norm(cuda: &Cuda, shape: &GdnShape, w: &GdnWeights<GpuWeight>, p: &Projected, o: &PoolBuf) -> GpuMatrix {
    let (hv, dv, rows) = (shape.value_heads, shape.value_dim, p.z.rows);
    let gated = cuda.matrix(rows, hv * dv);
    let pairs = rows * hv;
    let args = [
        o.ptr().into(),
        p.z.ptr().into(),
        w.norm.ptr.into(),
        gated.ptr().into(),
        pairs.into(),
        dv.into(),
        (shape.norm_eps as f32).into(),
    ];
    let blocks = pairs.div_ceil(NORM_PAIRS_PER_BLOCK);
    cuda.kernels.gdn.gated_norm.launch(cuda.stream(), Dims::linear(blocks, THREADS), &args);
    gated
}

fn zero(cuda: &Cuda, buf: &PoolBuf, n: usize) {
    if n > 0 {
        let blocks = n.div_ceil(THREADS as usize);
        cuda.kernels.gdn.zero_f32.launch(cuda.stream(), Dims::linear(blocks, THREADS), &[buf.ptr().into(), n.into()]);
    }
}

fn check_shape(shape: &GdnShape) {
    assert!(
        (1..=MAX_KEY_DIM).contains(&shape.key_dim),
        "GDN key dim {} (the GPU cores hold at most {MAX_KEY_DIM})",
        shape.key_dim
    );
    // The chunked core reads q, k and v rows as float4s.
    assert!(shape.key_dim.is_multiple_of(4), "GDN key dim {} (the GPU cores need a multiple of 4)", shape.key_dim);
    assert!(
        shape.value_dim.is_multiple_of(4),
        "GDN value dim {} (the GPU cores need a multiple of 4)",
        shape.value_dim
    );
    assert!(shape.value_dim > 0 && shape.conv_kernel > 0, "GDN shape {shape:?}");
    assert!(
        shape.value_dim <= MAX_KEY_DIM,
        "GDN value dim {} (the chunked prefill holds at most {MAX_KEY_DIM})",
        shape.value_dim
    );
    assert!(
        shape.key_heads > 0 && shape.value_heads.is_multiple_of(shape.key_heads),
        "GDN value heads {} not a multiple of key heads {}",
        shape.value_heads,
        shape.key_heads
    );
}

fn check_weights(shape: &GdnShape, w: &GdnWeights<GpuWeight>) {
    let (hv, channels) = (shape.value_heads, shape.qkv_dim());
    assert_eq!(w.in_proj_qkv.matrix_dims().0, channels, "in_proj_qkv rows");
    assert_eq!(w.in_proj_z.matrix_dims().0, hv * shape.value_dim, "in_proj_z rows");
    assert_eq!(w.in_proj_b.matrix_dims().0, hv, "in_proj_b rows");
    assert_eq!(w.in_proj_a.matrix_dims().0, hv, "in_proj_a rows");
    assert_eq!(w.conv1d.dtype, DType::Bf16, "conv1d must be resident as bf16");
    assert_eq!(w.conv1d.numel(), channels * shape.conv_kernel, "conv1d shape {:?}", w.conv1d.shape);
    for (name, t, n) in [("dt_bias", &w.dt_bias, hv), ("A_log", &w.a_log, hv), ("norm", &w.norm, shape.value_dim)] {
        assert_eq!(t.dtype, DType::F32, "{name} must be resident as f32");
        assert_eq!(t.numel(), n, "{name} length");
    }
}

#[cfg(test)]
mod tests {
    use super::{intra_shared_bytes, scan_shared_bytes, sequence_words};

    /// The most dynamic shared memory a block may opt into on sm_89 and sm_120, the smallest of
    /// the built targets (build.rs).
    const LEAST_OPT_IN: u32 = 99 << 10;

    #[test]
    fn the_chunk_kernels_fit_every_targets_shared_memory() {
        for bytes in [intra_shared_bytes(), scan_shared_bytes()] {
            assert!(bytes <= LEAST_OPT_IN, "{bytes}");
            // Two blocks an SM on sm_90 (228 KiB, 1 KiB of it reserved per block).
            assert!(2 * (bytes + 1024) <= 228 << 10, "{bytes}");
        }
    }

    #[test]
    fn sequence_words_map_rows_to_their_prompt_then_give_each_start() {
        assert_eq!(sequence_words(&[2, 1, 3]), vec![0, 0, 1, 2, 2, 2, 0, 2, 3, 6]);
        assert_eq!(sequence_words(&[1]), vec![0, 0, 1]);
    }
}
