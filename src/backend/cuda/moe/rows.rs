//! The decode batch's routed experts ([`MoePath::Rows`](super::MoePath::Rows)) on tensor cores,
//! `kernels/moe_rows.cu`: the pairs grouped by expert into tiles of up to 8, swap-AB
//! `mma.sync` tiles (an expert's 16 output features against a tile's pairs) over operands that
//! reach the MMA as f16 without rounding, and a grid that scales with the tiles, so one row
//! spreads its experts' bytes over every SM and a batch reads each expert once per 8 of its pairs.
//! The kernel file's header gives the arithmetic, the fixed reduction order (each row's result
//! is its own, bit for bit) and the floor.
//!
//! Activations, in either [`ExpertActivations`](crate::backend::backbone::ExpertActivations)
//! mode: `Fp8Dynamic` rows are the dynamic quantiser's e4m3 codes (as the other paths); `Exact`
//! rows are f16 per 1×128 group scaled by a power of two (a bf16 input exactly, the f32 SwiGLU
//! output as hi + lo f16, 22 bits), so the CPU oracle's arithmetic is kept up to f32 summation.

use super::{ACT_BF16, ACT_E4M3, ACT_F32, CHUNK_ROWS, GROUP, Grouping, Job};
use crate::backend::cuda::Cuda;
use crate::backend::cuda::kernel_constants::ROWS_PAIRS;
use crate::backend::cuda::launch::{Arg, Dims};
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
    /// The decode batch, in passes of at most `CHUNK_ROWS` rows: its pairs grouped by expert into
    /// tiles of up to 8; gate/up tiles → h [pairs, I] f32 by sorted position; down tiles → y
    /// [pairs, hidden] f32; combine. The operands (`Exact`: f16 of the bf16 input rows, and h as
    /// hi + lo f16; `Fp8Dynamic`: the quantised input codes, made once for every path, and h
    /// requantised to e4m3) are made by the tile blocks in shared memory when the batch has at most
    /// `TILE_OPERAND_MAX_ROWS` rows, and by `moe_rows_operand` in global memory otherwise.
    pub(super) fn rows(&self) {
        let (cuda, k, e, h, i) = (self.cuda, self.s.top_k, self.s.experts, self.hidden, self.s.intermediate);
        let kernels = &cuda.kernels.moe;
        let fp8 = self.input.kind == ACT_E4M3;
        let max_rows = self.rows.min(CHUNK_ROWS);
        let max_pairs = max_rows * k;
        let global_operands = max_rows > TILE_OPERAND_MAX_ROWS;
        let grouping = Grouping::new(cuda, e, max_pairs, TILE_PAIRS);
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
            let (act, act_scales, fmt, raw, shared_bytes) = if fp8 {
                let codes = input.ptr + (r0 * h) as u64;
                (codes, input.scales + (r0 * (h / GROUP) * 4) as u64, Format::E4m3, 0, 0)
            } else {
                let raw = input.ptr + (r0 * h * input.elem) as u64;
                match &input_operand {
                    Some(operand) => {
                        operand.fill(cuda, raw, input.kind, rows);
                        (operand.codes.ptr(), operand.scales.ptr(), Format::F16, 0, 0)
                    }
                    None => (0, 0, Format::F16, raw, tile_operand_bytes(Format::F16, h)),
                }
            };
            let max_tiles = self.group(&grouping, r0, rows);
            let (sorted, tiles, offsets) = (grouping.sorted.ptr(), grouping.tiles.ptr(), grouping.offsets.ptr());

            let args: [Arg; 13] = [
                act.into(),
                act_scales.into(),
                (fmt as i32).into(),
                raw.into(),
                input.kind.into(),
                sorted.into(),
                tiles.into(),
                offsets.into(),
                self.table.into(),
                k.into(),
                h.into(),
                i.into(),
                hbuf.ptr().into(),
            ];
            let dims = Dims::grid((max_tiles as u32, (i / GATE_UP_FEATURES) as u32, 1), THREADS)
                .with_shared(shared_bytes as u32);
            kernels.rows_gate_up.launch(cuda.stream(), dims, &args);

            let (act, act_lo, act_scales, h_rows, shared_bytes) = match &h_operand {
                Some(operand) => {
                    operand.fill(cuda, hbuf.ptr(), ACT_F32, pairs);
                    (operand.codes.ptr(), operand.lo(pairs), operand.scales.ptr(), 0, 0)
                }
                None => (0, 0, 0, hbuf.ptr(), tile_operand_bytes(h_fmt, i)),
            };
            let args: [Arg; 12] = [
                act.into(),
                act_lo.into(),
                act_scales.into(),
                h_rows.into(),
                (h_fmt as i32).into(),
                sorted.into(),
                tiles.into(),
                offsets.into(),
                self.table.into(),
                i.into(),
                h.into(),
                y.ptr().into(),
            ];
            let dims =
                Dims::grid((max_tiles as u32, (h / DOWN_FEATURES) as u32, 1), THREADS).with_shared(shared_bytes as u32);
            kernels.rows_down.launch(cuda.stream(), dims, &args);
            self.combine(r0, rows, y.ptr());
        }
    }
}
