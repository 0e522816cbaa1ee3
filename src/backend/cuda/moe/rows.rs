//! The decode batch's and the prompts' routed experts ([`MoePath::Rows`](super::MoePath::Rows))
//! on tensor cores, `kernels/moe_rows.cu`: the pairs grouped by expert into tiles of up to 8,
//! swap-AB `mma.sync` tiles (an expert's 16 output features against a tile's pairs) over operands
//! that reach the MMA as f16 without rounding, and a grid that scales with the tiles, so one row
//! spreads its experts' bytes over every SM and a batch reads each expert once per 8 of its pairs.
//! The kernel file's header gives the arithmetic, the fixed reduction order (each row's result
//! is its own, bit for bit) and the floor.
//!
//! From [`WIDE_MIN_PAIRS_PER_EXPERT`] pairs per expert up (long prompts), the wide tiles of
//! `kernels/moe_rows_wide.cu` take the call: up to 32 pairs against 128 features a block, weights
//! and operand rows staged through shared memory, so an expert's weights leave L2 once per 32 of
//! its pairs; the same sums in the same order, so the same bits.
//!
//! Activations, in either [`ExpertActivations`](crate::backend::backbone::ExpertActivations)
//! mode: `Fp8Dynamic` rows are the dynamic quantiser's e4m3 codes (as the other paths); `Exact`
//! rows are f16 per 1×128 group scaled by a power of two (a bf16 input exactly, the f32 SwiGLU
//! output as hi + lo f16, 22 bits), so the CPU oracle's arithmetic is kept up to f32 summation.

use std::sync::Arc;

use cudarc::driver::CudaContext;

use super::{ACT_BF16, ACT_E4M3, ACT_F32, CHUNK_ROWS, GROUP, Grouping, Job};
use crate::backend::cuda::Cuda;
use crate::backend::cuda::kernel_constants::{
    ROWS_PAIRS, ROWS_WIDE_DOWN_STAGES, ROWS_WIDE_FEATURES, ROWS_WIDE_GATE_UP_STAGES, ROWS_WIDE_PAIRS,
};
use crate::backend::cuda::launch::{Arg, Dims, Kernel, KernelError, Module, embedded};
use crate::backend::cuda::memory::PoolBuf;

/// Pairs of one expert per tile: one n8 MMA column set.
const TILE_PAIRS: usize = ROWS_PAIRS;
/// Output features per block: gate/up 1 feature warp × 8 K slices, down 8 feature warps.
const GATE_UP_FEATURES: usize = 16;
const DOWN_FEATURES: usize = 128;
const THREADS: u32 = 256;
/// Groups of one operand row per block of `moe_rows_operand` (one warp each).
const OPERAND_GROUPS_PER_BLOCK: usize = 8;

/// `kernels/moe_rows.cu`'s operand formats (`FMT_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Format {
    /// e4m3 codes of the dynamic quantiser.
    E4m3 = 0,
    /// One f16 per element, power-of-two group scales.
    F16 = 1,
    /// Two f16 per element (hi rows, then lo rows), power-of-two group scales.
    F16x2 = 2,
}

impl Format {
    /// Bytes of codes per element.
    fn bytes(self) -> usize {
        match self {
            Format::E4m3 => 1,
            Format::F16 => 2,
            Format::F16x2 => 4,
        }
    }
}

/// Up to `max_rows` rows of `cols` elements as an MMA operand: codes and one f32 scale per 1×128
/// group (`[rows, cols / 128]`).
pub(super) struct Operand {
    pub codes: PoolBuf,
    pub scales: PoolBuf,
    fmt: Format,
    cols: usize,
}

impl Operand {
    pub fn new(cuda: &Cuda, max_rows: usize, cols: usize, fmt: Format) -> Operand {
        assert!(cols.is_multiple_of(GROUP), "operand rows must be whole 128-groups (width {cols})");
        Operand {
            codes: cuda.scratch(max_rows * cols * fmt.bytes()),
            scales: cuda.scratch(max_rows * (cols / GROUP) * 4),
            fmt,
            cols,
        }
    }

    /// Rows `0..rows` from `rows` rows of `in_kind` (`ACT_BF16` or `ACT_F32`) at `x`.
    pub fn fill(&self, cuda: &Cuda, x: u64, in_kind: i32, rows: usize) {
        assert!(in_kind == ACT_BF16 || in_kind == ACT_F32, "operand input kind {in_kind}");
        assert!(rows * self.cols * self.fmt.bytes() <= self.codes.bytes(), "{rows} rows exceed the operand");
        if rows == 0 {
            return;
        }
        let groups = self.cols / GROUP;
        let args = [
            x.into(),
            in_kind.into(),
            rows.into(),
            self.cols.into(),
            (self.fmt as i32).into(),
            self.codes.ptr().into(),
            self.scales.ptr().into(),
        ];
        let dims = Dims::grid((groups.div_ceil(OPERAND_GROUPS_PER_BLOCK) as u32, rows as u32, 1), THREADS);
        cuda.kernels.moe.rows_operand.launch(cuda.stream(), dims, &args);
    }

    /// The lo rows of an `F16x2` operand filled with `rows` rows (0 for the other formats).
    fn lo(&self, rows: usize) -> u64 {
        if self.fmt == Format::F16x2 { self.codes.ptr() + (rows * self.cols * 2) as u64 } else { 0 }
    }
}

/// The most dynamic shared memory a tile kernel may take (the kernels are loaded allowing it):
/// at full size a gate/up tile's input rows take 32.5 KiB and a down tile's h rows 16.1 KiB.
pub(super) const TILE_SHARED_CAP: usize = 160 << 10;

/// Bytes of dynamic shared memory the tile kernels take for a tile's operand rows of `cols`
/// elements (`tile_operand_bytes` in the kernel file).
pub(super) fn tile_operand_bytes(fmt: Format, cols: usize) -> usize {
    TILE_PAIRS * cols * fmt.bytes() + TILE_PAIRS * (cols / GROUP) * 4
}

/// From this many pairs per expert on average (a 128-row prompt at 256 experts, top-8) a call
/// takes the wide tiles, where an expert's pairs mostly fill several 8-pair tiles. Below it the
/// 8-pair tiles, with 8 K slices a gate/up block, spread a few pairs' weight bytes over more
/// blocks. Both give every pair the same bits, so the choice is free to follow the load.
const WIDE_MIN_PAIRS_PER_EXPERT: usize = 4;

/// Long prompts' tile kernels (`kernels/moe_rows_wide.cu`): tiles of up to `ROWS_WIDE_PAIRS`
/// pairs against `ROWS_WIDE_FEATURES` output features a block, the weights and operand rows
/// staged through shared memory K group by K group.
pub(super) struct WideKernels {
    gate_up: Kernel,
    down: Kernel,
}

impl WideKernels {
    /// The kernels, or `None` where a block's stages exceed the device's `optin` bytes of shared
    /// memory (the 8-pair tiles then take every call).
    pub fn load(ctx: &Arc<CudaContext>, optin: usize) -> Result<Option<WideKernels>, KernelError> {
        let (gate_up_bytes, down_bytes) = (wide_gate_up_bytes(Format::F16), wide_down_bytes(Format::F16x2));
        // Static shared memory beside the stages: the tile's source rows.
        if gate_up_bytes.max(down_bytes) + ROWS_WIDE_PAIRS * 4 > optin {
            return Ok(None);
        }
        let m = Module::load_overlapping(ctx, "moe_rows_wide", embedded::MOE_ROWS_WIDE)?;
        Ok(Some(WideKernels {
            gate_up: m.kernel_with_shared("moe_rows_wide_gate_up", gate_up_bytes)?,
            down: m.kernel_with_shared("moe_rows_wide_down", down_bytes)?,
        }))
    }
}

/// Bytes of one K group's stage of a wide tile (`WideStage::BYTES` in the kernel file): the
/// block's feature rows of `matrices` weight matrices (128 e4m3 codes each), the tile's operand
/// rows, their scales and the matrices' weight scales (16 bytes), in whole 128-byte lines.
fn wide_stage_bytes(matrices: usize, fmt: Format) -> usize {
    (matrices * ROWS_WIDE_FEATURES * GROUP + ROWS_WIDE_PAIRS * GROUP * fmt.bytes() + ROWS_WIDE_PAIRS * 4 + 16)
        .next_multiple_of(128)
}

fn wide_gate_up_bytes(fmt: Format) -> usize {
    ROWS_WIDE_GATE_UP_STAGES * wide_stage_bytes(2, fmt)
}

fn wide_down_bytes(fmt: Format) -> usize {
    ROWS_WIDE_DOWN_STAGES * wide_stage_bytes(1, fmt)
}

/// Batches of at most this many rows have each tile block convert its own operand rows in shared
/// memory; larger ones convert them once, in global memory, with `moe_rows_operand`. In-tile
/// conversion saves two launches a layer, which is what a decode step of a few streams waits on,
/// but every one of a tile's blocks (I/16 for gate/up, hidden/128 for down) converts the same
/// rows again. At a 200-row prompt that costs more than the launches save: the prompt took about
/// 5 ms longer on the H100 once 1155d45 had removed the operand kernel (ab-step, run 19). The
/// two ways share `operand_group`'s arithmetic, so they give the same bits and a row's result
/// does not depend on which one its pass took.
const TILE_OPERAND_MAX_ROWS: usize = 8;

impl Job<'_> {
    /// The decode batch and prompts, in passes of at most `CHUNK_ROWS` rows: their pairs grouped
    /// by expert into tiles (of up to 8 pairs, or `ROWS_WIDE_PAIRS` on the wide path); gate/up
    /// tiles → h [pairs, I] f32 by sorted position; down tiles → y [pairs, hidden] f32; combine.
    /// The operands (`Exact`: f16 of the bf16 input rows, and h as hi + lo f16; `Fp8Dynamic`: the
    /// quantised input codes, made once for every path, and h requantised to e4m3) are made by
    /// the tile blocks in shared memory when the batch has at most `TILE_OPERAND_MAX_ROWS` rows,
    /// and by `moe_rows_operand` in global memory otherwise.
    pub(super) fn rows(&self) {
        let (cuda, k, e, h, i) = (self.cuda, self.s.top_k, self.s.experts, self.hidden, self.s.intermediate);
        let fp8 = self.input.kind == ACT_E4M3;
        let max_rows = self.rows.min(CHUNK_ROWS);
        let max_pairs = max_rows * k;
        let global_operands = max_rows > TILE_OPERAND_MAX_ROWS;
        let wide = cuda.kernels.moe.rows_wide.as_ref().filter(|_| {
            global_operands
                && max_pairs >= WIDE_MIN_PAIRS_PER_EXPERT * e
                && i.is_multiple_of(ROWS_WIDE_FEATURES)
                && h.is_multiple_of(ROWS_WIDE_FEATURES)
        });
        let tile_pairs = if wide.is_some() { ROWS_WIDE_PAIRS } else { TILE_PAIRS };
        let grouping = Grouping::new(cuda, e, max_pairs, tile_pairs);
        let hbuf = cuda.scratch(max_pairs * i * 4);
        let h_fmt = if fp8 { Format::E4m3 } else { Format::F16x2 };
        let input_operand = (global_operands && !fp8).then(|| Operand::new(cuda, max_rows, h, Format::F16));
        let h_operand = global_operands.then(|| Operand::new(cuda, max_pairs, i, h_fmt));
        let y = cuda.scratch(max_pairs * h * 4);
        for r0 in (0..self.rows).step_by(CHUNK_ROWS) {
            let rows = CHUNK_ROWS.min(self.rows - r0);
            let pairs = rows * k;
            let input = self.input;
            // Fp8Dynamic: the quantised codes in global memory. Exact: the bf16 rows, converted
            // once by the operand kernel, or by each tile block.
            let gate_up_operand = if fp8 {
                let codes = input.ptr + (r0 * h) as u64;
                TileOperand::global(codes, 0, input.scales + (r0 * (h / GROUP) * 4) as u64, Format::E4m3)
            } else {
                let raw = input.ptr + (r0 * h * input.elem) as u64;
                match &input_operand {
                    Some(operand) => {
                        operand.fill(cuda, raw, input.kind, rows);
                        TileOperand::global(operand.codes.ptr(), 0, operand.scales.ptr(), Format::F16)
                    }
                    None => TileOperand::in_tile(raw, Format::F16, h),
                }
            };
            let max_tiles = self.group(&grouping, r0, rows);
            let tiles = TileList { grouping: &grouping, max_tiles };
            match wide {
                Some(wide) => self.wide_gate_up(wide, &tiles, &gate_up_operand, hbuf.ptr()),
                None => self.narrow_gate_up(&tiles, &gate_up_operand, hbuf.ptr()),
            }
            let down_operand = match &h_operand {
                Some(operand) => {
                    operand.fill(cuda, hbuf.ptr(), ACT_F32, pairs);
                    TileOperand::global(operand.codes.ptr(), operand.lo(pairs), operand.scales.ptr(), h_fmt)
                }
                None => TileOperand::in_tile(hbuf.ptr(), h_fmt, i),
            };
            match wide {
                Some(wide) => self.wide_down(wide, &tiles, &down_operand, y.ptr()),
                None => self.narrow_down(&tiles, &down_operand, y.ptr()),
            }
            self.combine(r0, rows, y.ptr());
        }
    }

    /// `moe_rows_gate_up`: h [pairs, I] f32 by sorted position.
    fn narrow_gate_up(&self, tiles: &TileList, x: &TileOperand, h_out: u64) {
        let (cuda, k, h, i) = (self.cuda, self.s.top_k, self.hidden, self.s.intermediate);
        let g = tiles.grouping;
        let args: [Arg; 13] = [
            x.codes.into(),
            x.scales.into(),
            (x.fmt as i32).into(),
            x.raw.into(),
            self.input.kind.into(),
            g.sorted.ptr().into(),
            g.tiles.ptr().into(),
            g.offsets.ptr().into(),
            self.table.into(),
            k.into(),
            h.into(),
            i.into(),
            h_out.into(),
        ];
        let dims = Dims::grid((tiles.max_tiles as u32, (i / GATE_UP_FEATURES) as u32, 1), THREADS)
            .with_shared(x.shared_bytes as u32);
        cuda.kernels.moe.rows_gate_up.launch(cuda.stream(), dims, &args);
    }

    /// `moe_rows_down`: y [pairs, hidden] f32 at each pair's row.
    fn narrow_down(&self, tiles: &TileList, x: &TileOperand, y: u64) {
        let (cuda, h, i) = (self.cuda, self.hidden, self.s.intermediate);
        let g = tiles.grouping;
        let args: [Arg; 12] = [
            x.codes.into(),
            x.lo.into(),
            x.scales.into(),
            x.raw.into(),
            (x.fmt as i32).into(),
            g.sorted.ptr().into(),
            g.tiles.ptr().into(),
            g.offsets.ptr().into(),
            self.table.into(),
            i.into(),
            h.into(),
            y.into(),
        ];
        let dims = Dims::grid((tiles.max_tiles as u32, (h / DOWN_FEATURES) as u32, 1), THREADS)
            .with_shared(x.shared_bytes as u32);
        cuda.kernels.moe.rows_down.launch(cuda.stream(), dims, &args);
    }

    /// `moe_rows_wide_gate_up`: as `narrow_gate_up` (the same bits), from a global operand.
    fn wide_gate_up(&self, wide: &WideKernels, tiles: &TileList, x: &TileOperand, h_out: u64) {
        let (cuda, k, h, i) = (self.cuda, self.s.top_k, self.hidden, self.s.intermediate);
        assert_eq!(x.raw, 0, "the wide tiles read a global operand");
        let g = tiles.grouping;
        let args: [Arg; 11] = [
            x.codes.into(),
            x.scales.into(),
            (x.fmt as i32).into(),
            g.sorted.ptr().into(),
            g.tiles.ptr().into(),
            g.offsets.ptr().into(),
            self.table.into(),
            k.into(),
            h.into(),
            i.into(),
            h_out.into(),
        ];
        let dims = Dims::grid((tiles.max_tiles as u32, (i / ROWS_WIDE_FEATURES) as u32, 1), THREADS)
            .with_shared(wide_gate_up_bytes(x.fmt) as u32);
        wide.gate_up.launch(cuda.stream(), dims, &args);
    }

    /// `moe_rows_wide_down`: as `narrow_down` (the same bits), from a global operand.
    fn wide_down(&self, wide: &WideKernels, tiles: &TileList, x: &TileOperand, y: u64) {
        let (cuda, h, i) = (self.cuda, self.hidden, self.s.intermediate);
        assert_eq!(x.raw, 0, "the wide tiles read a global operand");
        let g = tiles.grouping;
        let args: [Arg; 11] = [
            x.codes.into(),
            x.lo.into(),
            x.scales.into(),
            (x.fmt as i32).into(),
            g.sorted.ptr().into(),
            g.tiles.ptr().into(),
            g.offsets.ptr().into(),
            self.table.into(),
            i.into(),
            h.into(),
            y.into(),
        ];
        let dims = Dims::grid((tiles.max_tiles as u32, (h / ROWS_WIDE_FEATURES) as u32, 1), THREADS)
            .with_shared(wide_down_bytes(x.fmt) as u32);
        wide.down.launch(cuda.stream(), dims, &args);
    }
}

/// A pass's grouping and the bound on its tile count (the tile kernels' grid).
struct TileList<'a> {
    grouping: &'a Grouping,
    max_tiles: usize,
}

/// A tile kernel's activation rows: a global operand (codes, lo halves, scales, as
/// `moe_rows_operand` writes them), or the raw rows (`raw`) that each tile block converts into
/// `shared_bytes` of shared memory.
struct TileOperand {
    codes: u64,
    lo: u64,
    scales: u64,
    raw: u64,
    fmt: Format,
    shared_bytes: usize,
}

impl TileOperand {
    fn global(codes: u64, lo: u64, scales: u64, fmt: Format) -> TileOperand {
        TileOperand { codes, lo, scales, raw: 0, fmt, shared_bytes: 0 }
    }

    fn in_tile(raw: u64, fmt: Format, cols: usize) -> TileOperand {
        TileOperand { codes: 0, lo: 0, scales: 0, raw, fmt, shared_bytes: tile_operand_bytes(fmt, cols) }
    }
}
