//! `kernels/linear.cu`, `kernels/linear_gemm.cu` (the prefill GEMM) and cuBLASLt: dense bf16
//! projections `y = x · Wᵀ` (fp32 accumulation, one rounding to bf16), the input-embedding gather
//! and the restricted `lm_head`.
//!
//! Projections pick a path by row count: up to [`DECODE_MAX_ROWS`] rows (decode) a bandwidth-bound
//! tensor-core kernel (`linear_mma_*`) that reads each weight byte once; more rows (prefill) a
//! tiled tensor-core GEMM (`linear_gemm_*`). Both fix each output's reduction order by `k` alone,
//! so a row's bits never depend on the other rows of its call: [`linear_segments`] projects many
//! prompts' rows in one GEMM launch and each prompt gets the bits it gets alone. cuBLASLt (whose
//! algorithm changes with the row count) is left for widths the tensor-core kernels cannot read
//! (`k % 8 != 0`), and a simple tiled kernel for when the library is not loaded either. The decode
//! batch ([`linear_rows`]) takes the decode kernel at every row count, so the single-stream decode
//! (`linear`, ≤ 8 rows) gets the same bits as the batch.

use std::sync::Arc;

use cudarc::cublaslt::result::CublasError;
use cudarc::driver::{CudaContext, sys};

use super::Cuda;
use super::launch::{Arg, Dims, Kernel, KernelError, Module, embedded};
use super::memory::{DeviceBuffer, PoolBuf};
use super::tensor::{DType, GpuMatrix, GpuWeight};
use crate::backend::backbone::EmbedRow;

pub use super::cublaslt::Blas;

mod prefill_gemm;

/// Rows up to which [`linear`] uses the tensor-core decode kernel; above, the prefill GEMM.
pub const DECODE_MAX_ROWS: usize = 8;

/// Output features per `linear_mma_*` block (the MMA's 16 A rows).
const MMA_BLOCK_FEATURES: usize = 16;
/// Input rows per block of `linear_mma_r8` and `linear_mma_r64` (1 and 8 n8 tiles).
const MMA_R8_ROWS: usize = 8;
const MMA_R64_ROWS: usize = 64;
/// Output tile of `linear_tiled` (`TILE_M`, `TILE_N` in the .cu).
const TILE: usize = 64;
const THREADS: u32 = 256;
/// Ids per `restricted_logits` block (one warp each).
const HEAD_WARPS: usize = 8;
/// The hidden row `restricted_logits` stages in shared memory: within the default 48 KiB.
const HEAD_SMEM_CAP: usize = 48 << 10;

pub struct LinearKernels {
    /// `linear_mma_r8` (≤ 8 rows, staged in shared memory) and `linear_mma_r64` (≤ 64 per
    /// block): the same arithmetic.
    mma_r8: Kernel,
    mma_r64: Kernel,
    /// `linear_mma_r8_swiglu`: `linear_mma_r8` of `bf16(SiLU(gate) · up)`, made while staging.
    mma_r8_swiglu: Kernel,
    /// `linear_mma_r8_many`, `linear_mma_r64_many`: up to [`MMA_MANY`] weights over one input in
    /// one launch, each output with the bits of its own `linear_mma_*` launch.
    mma_r8_many: Kernel,
    mma_r64_many: Kernel,
    /// The prefill GEMM's kernels (`kernels/linear_gemm.cu`).
    gemm: prefill_gemm::GemmKernels,
    tiled: Kernel,
    embed_gather: Kernel,
    restricted_logits: Kernel,
    /// Dynamic shared memory granted to `linear_mma_r8*`: a shape whose stage needs more
    /// ([`staged_smem_bytes`]) takes `linear_mma_r64*`, which gives the same bits.
    staged_cap: usize,
}

// The weight pieces a `linear_mma_r8*` block holds at once (`kernel_constants`).
use super::kernel_constants::{PIECE_STAGES, PIECE_STRIDE};

/// `mma_x_stride` in the .cu: 16-byte vectors per staged input row of width `k` — whole k32
/// steps, padded to ≡ 4 (mod 8) vectors.
fn x_stride(k: usize) -> usize {
    (k.div_ceil(32) * 4).div_ceil(8) * 8 + 4
}

/// Dynamic shared memory of a `linear_mma_r8*` block: `rows` whole input rows, then its weight
/// pieces.
fn staged_smem_bytes(rows: usize, k: usize) -> usize {
    (rows * x_stride(k) + PIECE_STAGES * 16 * PIECE_STRIDE) * 16
}

/// Static shared memory of `linear_mma_r8*` (the slices' partials), beside the stage.
const STAGED_STATIC_BYTES: usize = 4096;

impl LinearKernels {
    /// `hopper`: the GPU is compute capability 9.0, whose kernels include sm_90a's wgmma.
    pub fn load(ctx: &Arc<CudaContext>, hopper: bool) -> Result<LinearKernels, KernelError> {
        let m = Module::load_overlapping(ctx, "linear", embedded::LINEAR)?;
        let optin = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
            .map_err(|source| KernelError { module: "linear", kernel: None, source })?;
        let staged_cap = usize::try_from(optin).unwrap_or(0).saturating_sub(STAGED_STATIC_BYTES);
        let staged = |name| m.kernel_with_shared(name, staged_cap);
        Ok(LinearKernels {
            mma_r8: staged("linear_mma_r8")?,
            mma_r8_swiglu: staged("linear_mma_r8_swiglu")?,
            mma_r64: m.kernel("linear_mma_r64")?,
            mma_r8_many: staged("linear_mma_r8_many")?,
            mma_r64_many: m.kernel("linear_mma_r64_many")?,
            gemm: prefill_gemm::GemmKernels::load(ctx, hopper)?,
            tiled: m.kernel("linear_tiled")?,
            embed_gather: m.kernel("embed_gather")?,
            restricted_logits: m.kernel("restricted_logits")?,
            staged_cap,
        })
    }
}

impl LinearKernels {
    /// The dynamic shared memory of `linear_mma_r8*` for `rows` inputs of width `k`, or `None`
    /// where it does not run them (more than 8 rows, or a stage above what the GPU grants).
    fn staged_bytes(&self, rows: usize, k: usize) -> Option<usize> {
        let bytes = staged_smem_bytes(rows, k);
        (rows <= MMA_R8_ROWS && bytes <= self.staged_cap).then_some(bytes)
    }
}

/// Blocks of a `linear_mma_r8*` launch over `tiles` tiles of 16 features: one per SM (one
/// block's stage fills most of an SM's shared memory), each walking its share of the tiles
/// with its weight pieces in flight; fewer when there are fewer tiles.
fn staged_grid(cuda: &Cuda, tiles: usize) -> u32 {
    let sms = usize::try_from(cuda.info().multiprocessors).unwrap_or(1).max(1);
    u32::try_from(tiles.min(sms)).expect("grid")
}

/// How a projection is computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    /// `linear_mma_*`: tensor cores, weight streamed once per 64 rows, per-output order fixed by
    /// `k` (any row count; needs `k % 8 == 0`).
    Mma,
    /// The prefill GEMM: `linear_gemm_wg_*` on compute capability 9.0, else `GemmMmaSync`'s kernels.
    /// Tensor cores, tiled in shared memory, per-output order fixed by `k` (any row count; needs
    /// `k % 8 == 0`). Not the bits of `Mma`, and the two GEMMs' bits differ from each other.
    Gemm,
    /// `linear_gemm_r32`, `_r64`, `_r128` (mma.sync): `Gemm` on every GPU but compute capability
    /// 9.0; there only through [`linear_via`], so that the checks still cover them.
    GemmMmaSync,
    /// cuBLASLt (bf16 in/out, fp32 compute).
    Blas,
    /// `linear_tiled`: the fallback without cuBLASLt (any shape).
    Tiled,
}

/// Whether `linear_mma_*` and `linear_gemm_*` can run inputs of width `k` (16-byte vectors of 8
/// bf16).
fn mma_fits(k: usize) -> bool {
    k.is_multiple_of(8)
}

/// The path [`linear`] takes for `rows` inputs of width `k`.
pub fn path_for(cuda: &Cuda, rows: usize, k: usize) -> Path {
    if rows <= DECODE_MAX_ROWS && mma_fits(k) {
        Path::Mma
    } else if mma_fits(k) {
        Path::Gemm
    } else if cuda.blas.is_some() {
        Path::Blas
    } else {
        Path::Tiled
    }
}

/// `y = x · Wᵀ` for a bf16 weight `[n, k]`; `x` is `[rows, k]`.
pub fn linear(cuda: &Cuda, x: &GpuMatrix, w: &GpuWeight) -> GpuMatrix {
    assert_eq!(w.dtype, DType::Bf16, "dense projection weight must be bf16");
    let (n, k) = w.matrix_dims();
    assert_eq!(x.cols, k, "projection input width");
    let y = cuda.matrix(x.rows, n);
    project_by_rows(cuda, x.ptr(), x.rows, w, y.ptr());
    y
}

/// [`project`] on the path [`path_for`] picks for `rows`; if cuBLASLt refuses the problem, the
/// tiled kernel instead.
fn project_by_rows(cuda: &Cuda, x: u64, rows: usize, w: &GpuWeight, y: u64) {
    let (n, k) = w.matrix_dims();
    if let Err(e) = project(cuda, x, rows, w, y, path_for(cuda, rows, k)) {
        tracing::warn!("cuBLASLt matmul [{rows}, {k}]·[{n}, {k}]ᵀ failed ({e}); using the tiled kernel");
        project(cuda, x, rows, w, y, Path::Tiled).expect("the tiled kernel has no failure path");
    }
}

/// [`linear`] under the decode batch's contract (`BackboneOps::gdn_decode_rows`): the tensor-core
/// kernel at any row count (each output's K order fixed by `k` alone, so a row's bits are those
/// it gets alone, and those [`linear`] gives it up to [`DECODE_MAX_ROWS`] rows), or where it
/// cannot run the tiled kernel (whose per-output order does not depend on the row count
/// either); never cuBLASLt, whose algorithm changes with the row count.
pub fn linear_rows(cuda: &Cuda, x: &GpuMatrix, w: &GpuWeight) -> GpuMatrix {
    let path = if mma_fits(w.matrix_dims().1) { Path::Mma } else { Path::Tiled };
    linear_via(cuda, x, w, path).expect("the tensor-core and tiled paths have no failure path")
}

/// `bf16(SiLU(gate) ⊙ up) · Wᵀ` in one launch where the projection of that product would take
/// the staged decode kernel (≤ 8 rows, `k % 8 == 0`, the stage within its grant): the bits of
/// `moe::swiglu` followed by [`linear`] or [`linear_rows`], with one launch fewer. `None`
/// elsewhere; the caller then runs the two steps.
pub fn swiglu_project(cuda: &Cuda, gate: &GpuMatrix, up: &GpuMatrix, w: &GpuWeight) -> Option<GpuMatrix> {
    assert_eq!((gate.rows, gate.cols), (up.rows, up.cols), "SwiGLU of different shapes");
    assert_eq!(w.dtype, DType::Bf16, "dense projection weight must be bf16");
    let (n, k) = w.matrix_dims();
    assert_eq!(gate.cols, k, "projection input width");
    let kernels = &cuda.kernels.linear;
    let shared = kernels.staged_bytes(gate.rows, k).filter(|_| mma_fits(k) && gate.rows > 0 && n > 0)?;
    let y = cuda.matrix(gate.rows, n);
    let args = [gate.ptr().into(), up.ptr().into(), w.ptr.into(), y.ptr().into(), gate.rows.into(), n.into(), k.into()];
    let grid = (staged_grid(cuda, n.div_ceil(MMA_BLOCK_FEATURES)), 1, 1);
    kernels.mma_r8_swiglu.launch(cuda.stream(), Dims::grid(grid, THREADS).with_shared(shared as u32), &args);
    Some(y)
}

/// Weights one `linear_mma_*_many` launch takes.
pub use super::kernel_constants::MMA_MANY;

/// [`linear`] of each weight over one input: at up to [`DECODE_MAX_ROWS`] rows (decode) in one
/// launch where the tensor-core kernel runs them all, else one by one (the prompt's GEMM, or
/// cuBLASLt for widths the kernel cannot read): each output bit for bit what [`linear`] gives it.
pub fn linear_many(cuda: &Cuda, x: &GpuMatrix, ws: &[&GpuWeight]) -> Vec<GpuMatrix> {
    if x.rows <= DECODE_MAX_ROWS && fusable(x, ws) {
        linear_rows_many(cuda, x, ws)
    } else {
        ws.iter().map(|w| linear(cuda, x, w)).collect()
    }
}

/// Whether one `linear_mma_*_many` launch can project `x` by all of `ws`: at most [`MMA_MANY`]
/// bf16 weights of `x`'s width, a width the tensor-core kernel reads (`k % 8 == 0`).
fn fusable(x: &GpuMatrix, ws: &[&GpuWeight]) -> bool {
    let k = x.cols;
    ws.len() <= MMA_MANY
        && mma_fits(k)
        && ws.iter().all(|w| w.dtype == DType::Bf16 && w.matrix_dims().1 == k && w.matrix_dims().0 > 0)
}

/// [`linear_rows`] of each weight over one input, in one launch where the tensor-core kernel
/// runs them all (bf16, the input's width, `k % 8 == 0`, at most [`MMA_MANY`]): each output bit
/// for bit what `linear_rows` gives it. Fewer launches per decode step: at one row the small
/// projections cost their launch, not their bytes.
pub fn linear_rows_many(cuda: &Cuda, x: &GpuMatrix, ws: &[&GpuWeight]) -> Vec<GpuMatrix> {
    let k = x.cols;
    if !fusable(x, ws) || x.rows == 0 {
        return ws.iter().map(|w| linear_rows(cuda, x, w)).collect();
    }
    let ys: Vec<GpuMatrix> = ws.iter().map(|w| cuda.matrix(x.rows, w.matrix_dims().0)).collect();
    let kernels = &cuda.kernels.linear;
    let tiles: usize = ws.iter().map(|w| w.matrix_dims().0.div_ceil(MMA_BLOCK_FEATURES)).sum();
    let (kernel, blocks, per_block, shared) = match kernels.staged_bytes(x.rows, k) {
        Some(bytes) => (&kernels.mma_r8_many, staged_grid(cuda, tiles), MMA_R8_ROWS, bytes),
        None => (&kernels.mma_r64_many, u32::try_from(tiles).expect("grid"), MMA_R64_ROWS, 0),
    };
    let mut args: Vec<Arg> = vec![x.ptr().into(), x.rows.into(), k.into(), ws.len().into()];
    for i in 0..MMA_MANY {
        let (w, y, n) = match (ws.get(i), ys.get(i)) {
            (Some(w), Some(y)) => (w.ptr, y.ptr(), w.matrix_dims().0),
            _ => (0, 0, 0),
        };
        args.extend([Arg::from(w), Arg::from(y), Arg::from(n)]);
    }
    let grid = (blocks, u32::try_from(x.rows.div_ceil(per_block)).expect("grid"), 1);
    kernel.launch(cuda.stream(), Dims::grid(grid, THREADS).with_shared(shared as u32), &args);
    ys
}

/// [`linear`] on a given path (checks compare the paths). Only `Blas` can fail (the library
/// refused the problem); `linear` then falls back to `Tiled`.
///
/// # Panics
/// If `path` cannot serve the shape: `Mma` and `Gemm` need `k % 8 == 0`; `Blas` needs cuBLASLt
/// loaded.
pub fn linear_via(cuda: &Cuda, x: &GpuMatrix, w: &GpuWeight, path: Path) -> Result<GpuMatrix, CublasError> {
    assert_eq!(w.dtype, DType::Bf16, "dense projection weight must be bf16");
    let (n, k) = w.matrix_dims();
    assert_eq!(x.cols, k, "projection input width");
    let y = cuda.matrix(x.rows, n);
    project(cuda, x.ptr(), x.rows, w, y.ptr(), path)?;
    Ok(y)
}

/// [`linear`] of each run of `lens` rows of `x` on its own (the path its own row count picks),
/// into one `[Σ lens, n]` output: each run's rows are bit for bit what [`linear`] gives them
/// alone, whichever runs share the call. Several prompts' projections in one GEMM launch.
///
/// # Panics
/// If `lens` does not add up to `x`'s rows.
pub fn linear_segments(cuda: &Cuda, x: &GpuMatrix, lens: &[usize], w: &GpuWeight) -> GpuMatrix {
    assert_eq!(w.dtype, DType::Bf16, "dense projection weight must be bf16");
    let (n, k) = w.matrix_dims();
    assert_eq!(x.cols, k, "projection input width");
    assert_eq!(lens.iter().sum::<usize>(), x.rows, "segments cover the rows");
    let y = cuda.matrix(x.rows, n);
    let out_at = |start: usize| y.ptr() + (start * n * 2) as u64;
    if mma_fits(k) {
        // Runs above DECODE_MAX_ROWS take the GEMM alone, whose rows are their own: one launch
        // over all of x gives each its bits. Shorter runs take the decode kernel alone, so theirs
        // are written over with one launch each (the GEMM's work on them is wasted, and small).
        if lens.iter().any(|&rows| path_for(cuda, rows, k) == Path::Gemm) {
            project(cuda, x.ptr(), x.rows, w, y.ptr(), Path::Gemm).expect("the GEMM has no failure path");
        }
        let mut start = 0;
        for &rows in lens {
            if rows > 0 && path_for(cuda, rows, k) == Path::Mma {
                project(cuda, x.row_ptr(start), rows, w, out_at(start), Path::Mma).expect("no failure path");
            }
            start += rows;
        }
        return y;
    }
    // cuBLASLt or the tiled kernel, one run at a time. With rows of whole 256-byte units every
    // run starts where a fresh matrix would, so it is projected in place; otherwise through a
    // fresh copy, which the library sees the same way.
    let in_place = (k * 2).is_multiple_of(256) && (n * 2).is_multiple_of(256);
    let mut start = 0;
    for &rows in lens.iter().filter(|&&rows| rows > 0) {
        if in_place {
            project_by_rows(cuda, x.row_ptr(start), rows, w, out_at(start));
        } else {
            let own = linear(cuda, &crate::backend::BackendTypes::act_rows(cuda, x, start, rows), w);
            cuda.copy_device_to_device(out_at(start), own.ptr(), rows * n * 2);
        }
        start += rows;
    }
    y
}

/// `y = x · Wᵀ` for `rows` rows at `x` into `y` (`[rows, n]`) on `path`.
fn project(cuda: &Cuda, x: u64, rows: usize, w: &GpuWeight, y: u64, path: Path) -> Result<(), CublasError> {
    let (n, k) = w.matrix_dims();
    if rows == 0 || n == 0 {
        return Ok(());
    }
    match path {
        Path::Mma => {
            assert!(mma_fits(k), "the tensor-core projection needs k % 8 == 0, not k = {k}");
            let kernels = &cuda.kernels.linear;
            let tiles = n.div_ceil(MMA_BLOCK_FEATURES);
            let (kernel, blocks, per_block, shared) = match kernels.staged_bytes(rows, k) {
                Some(bytes) => (&kernels.mma_r8, staged_grid(cuda, tiles), MMA_R8_ROWS, bytes),
                None => (&kernels.mma_r64, u32::try_from(tiles).expect("grid"), MMA_R64_ROWS, 0),
            };
            let grid = (blocks, rows.div_ceil(per_block) as u32, 1);
            let args = [x.into(), w.ptr.into(), y.into(), rows.into(), n.into(), k.into()];
            kernel.launch(cuda.stream(), Dims::grid(grid, THREADS).with_shared(shared as u32), &args);
        }
        Path::Gemm | Path::GemmMmaSync => {
            assert!(mma_fits(k), "the tensor-core GEMM needs k % 8 == 0, not k = {k}");
            cuda.kernels.linear.gemm.launch(cuda, x, rows, w.ptr, y, n, k, path == Path::Gemm);
        }
        Path::Blas => {
            let blas = cuda.blas.as_ref().expect("cuBLASLt path forced but libcublasLt is not loaded");
            // SAFETY: x is a live [rows, k] activation, w a live [n, k] arena weight, y a live
            // [rows, n] output; all 256-byte aligned, and the pool/arena keep them allocated
            // until the stream has run the matmul.
            unsafe { blas.matmul(x, w.ptr, y, rows, n, k) }?;
        }
        Path::Tiled => {
            let grid = (n.div_ceil(TILE) as u32, rows.div_ceil(TILE) as u32, 1);
            let args = [x.into(), w.ptr.into(), y.into(), rows.into(), n.into(), k.into()];
            cuda.kernels.linear.tiled.launch(cuda.stream(), Dims::grid(grid, THREADS), &args);
        }
    }
    Ok(())
}

/// Input embedding: row `r` = `bf16(scale_r · (E[token_r] + Σ CB[codebook_rows_r]))`, summed in
/// f32 (`BackboneOps::embed`). The per-call recipe is staged to the device without waiting.
///
/// # Panics
/// If a token or codebook row is out of its table, or the tables are not bf16 of equal width.
pub fn embed(cuda: &Cuda, embed_tokens: &GpuWeight, codebook_embeddings: &GpuWeight, rows: &[EmbedRow]) -> GpuMatrix {
    assert_eq!(embed_tokens.dtype, DType::Bf16, "embed_tokens must be bf16");
    assert_eq!(codebook_embeddings.dtype, DType::Bf16, "codebook_embeddings must be bf16");
    let (vocab, hidden) = embed_tokens.matrix_dims();
    let (cb_rows, cb_hidden) = codebook_embeddings.matrix_dims();
    assert_eq!(hidden, cb_hidden, "embedding tables of different widths");
    let y = cuda.matrix(rows.len(), hidden);
    if rows.is_empty() {
        return y;
    }
    let recipe = pack_recipe(rows, vocab, cb_rows);
    let staged = cuda.scratch(recipe.len() * 4);
    cuda.stage_to_device(staged.ptr(), &recipe);
    embed_from_recipe(cuda, embed_tokens, codebook_embeddings, staged.ptr(), y)
}

/// [`embed`] of `y.rows` rows from a recipe already on the device at `recipe` (e.g. written by
/// `step::embed_recipe`; its indices must be in range). Capturable.
pub fn embed_from_recipe(
    cuda: &Cuda,
    embed_tokens: &GpuWeight,
    codebook_embeddings: &GpuWeight,
    recipe: u64,
    y: GpuMatrix,
) -> GpuMatrix {
    let hidden = y.cols;
    let args = [embed_tokens.ptr.into(), codebook_embeddings.ptr.into(), recipe.into(), y.ptr().into(), hidden.into()];
    cuda.kernels.linear.embed_gather.launch(cuda.stream(), Dims::linear(y.rows, THREADS), &args);
    y
}

/// The `embed_gather` recipe: 4 header words per row `{token, first, count, scale bits}`, then
/// every row's codebook indices (`first` indexes this array).
fn pack_recipe(rows: &[EmbedRow], vocab: usize, cb_rows: usize) -> Vec<u32> {
    let word = |v: usize| u32::try_from(v).expect("embedding recipe index exceeds u32");
    let total_cb: usize = rows.iter().map(|r| r.codebook_rows.len()).sum();
    let mut recipe = vec![0u32; 4 * rows.len()];
    recipe.reserve(total_cb);
    for (r, row) in rows.iter().enumerate() {
        assert!(row.token < vocab, "embed: token {} of a {vocab}-row table", row.token);
        let first = recipe.len();
        for &cb in &row.codebook_rows {
            assert!(cb < cb_rows, "embed: codebook row {cb} of a {cb_rows}-row table");
            recipe.push(word(cb));
        }
        let head = [word(row.token), word(first), word(row.codebook_rows.len()), (row.scale as f32).to_bits()];
        recipe[4 * r..4 * r + 4].copy_from_slice(&head);
    }
    recipe
}

/// The `lm_head` restricted to the main-token candidates (semantic band, then EOS): the ids
/// live on the device, uploaded once.
pub struct RestrictedHead {
    ids: DeviceBuffer,
    count: usize,
    /// Largest id, checked against the head's rows at each call.
    max_id: u32,
}

impl RestrictedHead {
    /// Uploads `ids` (waits for the copy: a start-up step).
    ///
    /// # Panics
    /// If `ids` is empty or the device budget cannot hold it.
    pub fn new(cuda: &Cuda, ids: &[u32]) -> RestrictedHead {
        assert!(!ids.is_empty(), "restricted head without ids");
        let buffer = DeviceBuffer::alloc(cuda.budget(), "restricted head ids", ids.len() * 4)
            .unwrap_or_else(|e| panic!("restricted head ids: {e}"));
        cuda.copy_to_device(buffer.ptr(), ids);
        let max_id = ids.iter().copied().max().expect("ids is not empty");
        RestrictedHead { ids: buffer, count: ids.len(), max_id }
    }

    /// Number of candidate ids (length of the logits).
    pub fn len(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// f32 logits `[len]` of row `row` of `hidden`, in id order, left on the device (no sync).
    pub fn logits(&self, cuda: &Cuda, lm_head: &GpuWeight, hidden: &GpuMatrix, row: usize) -> PoolBuf {
        self.logits_of(cuda, lm_head, hidden, row, 1)
    }

    /// f32 logits `[rows, len]` of every row of `hidden`, left on the device (no sync), each row
    /// computed exactly as [`RestrictedHead::logits`] computes it alone.
    pub fn logits_rows(&self, cuda: &Cuda, lm_head: &GpuWeight, hidden: &GpuMatrix) -> PoolBuf {
        self.logits_of(cuda, lm_head, hidden, 0, hidden.rows)
    }

    /// f32 logits `[rows, len]` of every row of `hidden` (one launch, one read-back), each row
    /// computed exactly as [`RestrictedHead::logits`] computes it alone.
    pub fn logits_rows_to_host(&self, cuda: &Cuda, lm_head: &GpuWeight, hidden: &GpuMatrix) -> Vec<f32> {
        if hidden.rows == 0 {
            return Vec::new();
        }
        let logits = self.logits_of(cuda, lm_head, hidden, 0, hidden.rows);
        cuda.copy_to_host(logits.ptr(), hidden.rows * self.count)
    }

    /// Logits of `rows` rows of `hidden` from row `row` on.
    fn logits_of(&self, cuda: &Cuda, lm_head: &GpuWeight, hidden: &GpuMatrix, row: usize, rows: usize) -> PoolBuf {
        assert_eq!(lm_head.dtype, DType::Bf16, "lm_head must be bf16");
        let (vocab, k) = lm_head.matrix_dims();
        assert_eq!(hidden.cols, k, "lm_head input width");
        assert!((self.max_id as usize) < vocab, "restricted id {} of a {vocab}-row lm_head", self.max_id);
        assert!(k * 2 <= HEAD_SMEM_CAP, "lm_head width {k} above the staged hidden row's {HEAD_SMEM_CAP} bytes");
        assert!(row + rows <= hidden.rows, "restricted logits of rows {row}..{} of {}", row + rows, hidden.rows);
        let out = cuda.scratch(rows * self.count * 4);
        let grid = (self.count.div_ceil(HEAD_WARPS) as u32, rows as u32, 1);
        let dims = Dims::grid(grid, THREADS).with_shared((k * 2).next_multiple_of(16) as u32);
        let args = [
            lm_head.ptr.into(),
            self.ids.ptr().into(),
            hidden.row_ptr(row).into(),
            out.ptr().into(),
            self.count.into(),
            k.into(),
        ];
        cuda.kernels.linear.restricted_logits.launch(cuda.stream(), dims, &args);
        out
    }

    /// [`RestrictedHead::logits`] copied to the host (waits for the stream).
    pub fn logits_to_host(&self, cuda: &Cuda, lm_head: &GpuWeight, hidden: &GpuMatrix, row: usize) -> Vec<f32> {
        let logits = self.logits(cuda, lm_head, hidden, row);
        cuda.copy_to_host(logits.ptr(), self.count)
    }
}
