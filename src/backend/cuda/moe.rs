//! `kernels/moe.cu` (+ `kernels/moe_route.cu`: the router and the grouping of pairs by expert):
//! the block-FP8 MoE block (`backbone.md` §5–6) on the GPU, matching the CPU
//! oracle `cpu/backbone/moe.rs`: fp32 router logits → softmax → top-k → renormalise; routed
//! SwiGLU experts with e4m3 weights and `[128, 128]` f32 block scales (activations quantised to
//! e4m3 per 1×128 group in `Fp8Dynamic`, used as they are in `Exact`); the bf16 shared expert
//! scaled by `sigmoid(x · w_sg)`; fp32 sum of the weighted experts and the gated shared expert,
//! one rounding to bf16.
//!
//! Three expert paths with the same math: per-(row, slot) GEMVs for the single-stream decode (few
//! rows); for prefill a device-side grouping of the (row, slot) pairs by expert followed by
//! grouped GEMMs over each expert's rows; and for the decode batch and prompts the same grouping
//! followed by swap-AB tensor-core tiles of up to 8 pairs (`rows`, `kernels/moe_rows.cu`), or of
//! up to 32 from 4 pairs per expert up (`kernels/moe_rows_wide.cu`, the same bits); a decode
//! step's few rows are routed inside the grouping launch (`moe_route_group`, the same code as the
//! separate `moe_route`), one launch a layer fewer. On that path the shared expert runs on the
//! side stream beside the routing and the routed experts (`Cuda::beside`) and joins at the
//! combine, and the combine ends in the next layer's input norm (`moe_rows_add_rms_norm`, one
//! launch for the combine, the residual add and the norm). Routing never leaves the device: no
//! host sync in any path. The experts' weight and scale addresses live in a device table built
//! once per layer (first call, the warm-up) and cached under the router weight's address.

mod combine;
mod grouping;
mod route;
mod rows;

pub use route::route;
use route::{router_logits, routes_in_group};

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, sys};

use super::beside::Beside;
use super::launch::{Arg, Dims, Kernel, KernelError, Module, embedded};
use super::memory::PoolBuf;
use super::tensor::{DType, GpuMatrix, GpuWeight};
use super::{Cuda, linear, norm};
use crate::backend::backbone::{ExpertActivations, MoeShape};
use crate::model::weights::{Fp8Linear, MoeWeights};
use combine::{AddNorm, Output};
use grouping::Grouping;

pub struct MoeKernels {
    router_logits: Kernel,
    router_logits_tiled: Kernel,
    route: Kernel,
    group_pairs: Kernel,
    route_group: Kernel,
    grouped_gate_up: Kernel,
    grouped_down: Kernel,
    gemv_gate_up: Kernel,
    gemv_down: Kernel,
    rows_operand: Kernel,
    rows_gate_up: Kernel,
    rows_down: Kernel,
    /// Long prompts' tile kernels, where the device's shared memory holds their stages.
    rows_wide: Option<rows::WideKernels>,
    swiglu_bf16: Kernel,
    combine: Kernel,
    combine_add_norm: Kernel,
    /// Per layer (keyed by the router weight's address): the experts' device address table.
    tables: Mutex<HashMap<u64, ExpertTable>>,
}

impl MoeKernels {
    pub fn load(ctx: &Arc<CudaContext>) -> Result<MoeKernels, KernelError> {
        let m = Module::load_overlapping(ctx, "moe", embedded::MOE)?;
        let route = Module::load_overlapping(ctx, "moe_route", embedded::MOE_ROUTE)?;
        let r = Module::load_overlapping(ctx, "moe_rows", embedded::MOE_ROWS)?;
        let optin = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
            .map_err(|source| KernelError { module: "moe_rows", kernel: None, source })?;
        let optin = usize::try_from(optin).unwrap_or(0);
        let tile_cap = rows::TILE_SHARED_CAP.min(optin);
        Ok(MoeKernels {
            router_logits: route.kernel("moe_router_logits")?,
            router_logits_tiled: route.kernel("moe_router_logits_tiled")?,
            route: route.kernel("moe_route")?,
            group_pairs: route.kernel("moe_group_pairs")?,
            route_group: route.kernel("moe_route_group")?,
            grouped_gate_up: m.kernel("moe_grouped_gate_up")?,
            grouped_down: m.kernel("moe_grouped_down")?,
            gemv_gate_up: m.kernel("moe_gemv_gate_up")?,
            gemv_down: m.kernel("moe_gemv_down")?,
            rows_operand: r.kernel("moe_rows_operand")?,
            rows_gate_up: r.kernel_with_shared("moe_rows_gate_up", tile_cap)?,
            rows_down: r.kernel_with_shared("moe_rows_down", tile_cap)?,
            rows_wide: rows::WideKernels::load(ctx, optin)?,
            swiglu_bf16: m.kernel("moe_swiglu_bf16")?,
            combine: m.kernel("moe_combine")?,
            combine_add_norm: m.kernel("moe_combine_add_norm")?,
            tables: Mutex::new(HashMap::new()),
        })
    }
}

impl MoeKernels {
    /// Whether long prompts' experts take the wide tiles (`kernels/moe_rows_wide.cu`): their
    /// stages fit the device's shared memory (compute capability 8.0 and 9.0).
    pub fn has_wide_tiles(&self) -> bool {
        self.rows_wide.is_some()
    }
}

/// `kernels/moe.cu`'s activation kinds (`ACT_*`).
const ACT_E4M3: i32 = 0;
const ACT_BF16: i32 = 1;
const ACT_F32: i32 = 2;
/// Addresses per expert in the table: gate w, gate scale, up w, up scale, down w, down scale.
const TABLE_STRIDE: usize = 6;
/// The K group of the activation quantiser and the weight block (both sides of the grid).
const GROUP: usize = 128;
/// Rows of one grouped-GEMM tile (`TM` in the kernel).
const TILE_ROWS: usize = 32;
/// Output columns of one grouped-GEMM tile (`TN`).
const TILE_COLS: usize = 128;
/// Up to this many rows the per-pair GEMV path runs; above it the grouped path.
pub const DECODE_MAX_ROWS: usize = 4;
/// Rows per pass of the grouped path: bounds the per-pair scratch (`rows·top_k·hidden` f32).
const CHUNK_ROWS: usize = 1024;
const GROUP_THREADS: u32 = 1024;
/// Output columns per block of the GEMV kernels (2 per warp for gate/up, 4 per warp for down).
const GEMV_GATE_UP_COLS: usize = 16;
const GEMV_DOWN_COLS: usize = 32;

/// The device table of one layer's expert addresses, with what it was built from (a layer whose
/// weights were replaced at the same router address gets a fresh table).
struct ExpertTable {
    buf: PoolBuf,
    fingerprint: [u64; 3],
}

fn fingerprint(w: &MoeWeights<GpuWeight>) -> [u64; 3] {
    let first = w.experts.first().map_or(0, |e| e.gate_proj.weight.ptr);
    let last = w.experts.last().map_or(0, |e| e.down_proj.scale_inv.ptr);
    [w.experts.len() as u64, first, last]
}

/// Which expert path to take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MoePath {
    /// Per-pair GEMVs up to [`DECODE_MAX_ROWS`] rows, grouped GEMMs above.
    Auto,
    /// One GEMV per (row, slot) pair, any number of rows.
    PerPair,
    /// Pairs grouped by expert, tiled GEMMs.
    Grouped,
    /// The decode batch's and prompts' (`BackboneOps::moe_rows`): pairs grouped by expert, swap-AB
    /// tensor-core tiles of up to 8 pairs, or 32 for calls with 4+ pairs per expert (the
    /// expert's output features are the MMA's rows; a pair's bits the same on either), and GEMV
    /// projections for the shared expert, at any row count. Each output's sum over K runs in an
    /// order fixed by K alone, whichever pairs share its tile (the atomics only order the pairs,
    /// never a sum), and the combine sums a row's slots in slot order: each row's result is its
    /// own, bit for bit. The grid scales with the tiles, so one row spreads its experts' bytes
    /// over every SM and a batch reads each expert once per 8 of its pairs.
    Rows,
}

/// The router's decision for each row, on the device.
pub struct Routing {
    /// `[rows, top_k]` i32 expert ids, most probable first.
    pub ids: PoolBuf,
    /// `[rows, top_k]` f32 renormalised probabilities.
    pub weights: PoolBuf,
    /// `[rows]` f32 `sigmoid(x · w_sg)`.
    pub shared_gate: PoolBuf,
}

/// Rows quantised to e4m3 in 1×128 groups.
pub struct Fp8Rows {
    /// `[rows, cols]` e4m3 codes.
    pub codes: PoolBuf,
    /// `[rows, cols / 128]` f32 scales.
    pub scales: PoolBuf,
}

/// The MoE block for any number of rows (the path picked by row count).
pub fn moe(cuda: &Cuda, s: &MoeShape, w: &MoeWeights<GpuWeight>, x: &GpuMatrix) -> GpuMatrix {
    moe_with(cuda, s, w, x, MoePath::Auto)
}

/// The MoE block with a chosen expert path (both give the same result; checks compare them).
pub fn moe_with(cuda: &Cuda, s: &MoeShape, w: &MoeWeights<GpuWeight>, x: &GpuMatrix, path: MoePath) -> GpuMatrix {
    let out = cuda.matrix(x.rows, x.cols);
    moe_into(cuda, s, w, x, path, Output::Block(&out));
    out
}

/// The decode batch's MoE ([`MoePath::Rows`]) of the normed rows `x`, then
/// `norm::add_rms_norm(residual, ·, gain, eps)`: returns the normed rows. Where a row fits one
/// norm block the combine, the residual add and the norm are one launch (`moe_combine_add_norm`,
/// the same bits as the two).
pub fn moe_rows_add_rms_norm(
    cuda: &Cuda,
    s: &MoeShape,
    w: &MoeWeights<GpuWeight>,
    x: &GpuMatrix,
    residual: &mut GpuMatrix,
    gain: &GpuWeight,
    eps: f64,
) -> GpuMatrix {
    if !norm::fits_registers(x.cols) {
        let delta = moe_with(cuda, s, w, x, MoePath::Rows);
        return norm::add_rms_norm(cuda, residual, &delta, gain, eps);
    }
    norm::check_gain(residual, gain);
    assert_eq!((residual.rows, residual.cols), (x.rows, x.cols), "residual add of different shapes");
    let normed = cuda.matrix(x.rows, x.cols);
    let add_norm = AddNorm { residual, gain: gain.ptr, eps: eps as f32, normed: &normed };
    moe_into(cuda, s, w, x, MoePath::Rows, Output::AddNorm(add_norm));
    normed
}

fn moe_into(cuda: &Cuda, s: &MoeShape, w: &MoeWeights<GpuWeight>, x: &GpuMatrix, path: MoePath, out: Output<'_>) {
    check_shapes(s, w, x);
    if x.rows == 0 {
        return;
    }
    let table = expert_table(cuda, s, w);
    // Decode: the shared expert beside the routing and the routed experts (it joins at the
    // combine), off the step's critical path.
    let shared = match path {
        MoePath::Rows => cuda.beside(|side| shared_expert(side, w, x, true)),
        _ => Beside::done(shared_expert(cuda, w, x, false)),
    };
    // The decode batch's few rows route inside the grouping launch (`Job::group`).
    let (routing, pending) = if path == MoePath::Rows && routes_in_group(x.rows, s.experts) {
        let (routing, logits) = router_logits(cuda, s, w, x);
        (routing, Some(logits))
    } else {
        (route(cuda, s, w, x), None)
    };
    let quantised = (s.activations == ExpertActivations::Fp8Dynamic).then(|| quantise_rows(cuda, x));
    let input = match &quantised {
        Some(q) => Input { ptr: q.codes.ptr(), scales: q.scales.ptr(), kind: ACT_E4M3, elem: 1 },
        None => Input { ptr: x.ptr(), scales: 0, kind: ACT_BF16, elem: 2 },
    };
    let job = Job {
        cuda,
        s,
        table,
        routing: &routing,
        pending_logits: pending.as_ref().map(PoolBuf::ptr),
        shared: &shared,
        input,
        out,
        rows: x.rows,
        hidden: x.cols,
    };
    match path {
        MoePath::Auto if x.rows <= DECODE_MAX_ROWS => job.per_pair(),
        MoePath::PerPair => job.per_pair(),
        MoePath::Auto | MoePath::Grouped => job.grouped(),
        MoePath::Rows => job.rows(),
    }
}

/// Dynamic e4m3 quantisation of each row in 1×128 groups (`s = max(amax, 1e-10)/448`, RNE).
pub fn quantise_rows(cuda: &Cuda, x: &GpuMatrix) -> Fp8Rows {
    let q = rows::Operand::new(cuda, x.rows, x.cols, rows::Format::E4m3);
    q.fill(cuda, x.ptr(), ACT_BF16, x.rows);
    Fp8Rows { codes: q.codes, scales: q.scales }
}

fn check_shapes(s: &MoeShape, w: &MoeWeights<GpuWeight>, x: &GpuMatrix) {
    let h = x.cols;
    assert_eq!(s.block, [GROUP, GROUP], "the GPU MoE supports [128, 128] weight blocks only");
    assert!(h.is_multiple_of(GROUP) && s.intermediate.is_multiple_of(GROUP), "MoE dims must be multiples of 128");
    assert!(s.top_k >= 1 && s.top_k <= s.experts.min(32), "top_k {} of {} experts", s.top_k, s.experts);
    assert_eq!(w.experts.len(), s.experts, "expert count");
    assert_eq!((w.router.dtype, w.router.matrix_dims()), (DType::Bf16, (s.experts, h)), "router weight");
    assert_eq!(
        (w.shared_expert_gate.dtype, w.shared_expert_gate.matrix_dims()),
        (DType::Bf16, (1, h)),
        "shared expert gate"
    );
    // Dynamic shared memory of the GEMV kernels holds one activation row and its scales.
    let widest = h.max(s.intermediate);
    assert!((widest + widest / GROUP) * 4 <= 48 << 10, "MoE width {widest} too wide for the GEMV kernels");
    // The decode batch's tiles hold their operand rows in shared memory.
    assert!(
        rows::tile_operand_bytes(rows::Format::F16, h)
            .max(rows::tile_operand_bytes(rows::Format::F16x2, s.intermediate))
            <= rows::TILE_SHARED_CAP,
        "MoE widths {h} and {} too wide for the decode batch's tiles",
        s.intermediate
    );
}

fn check_fp8(l: &Fp8Linear<GpuWeight>, out: usize, inp: usize, what: &str) {
    assert_eq!((l.weight.dtype, l.weight.matrix_dims()), (DType::Fp8E4m3, (out, inp)), "{what} weight");
    let grid = (out.div_ceil(GROUP), inp.div_ceil(GROUP));
    assert_eq!((l.scale_inv.dtype, l.scale_inv.matrix_dims()), (DType::F32, grid), "{what} scale grid");
}

/// The layer's expert table on the device, built on first use (copies once, synchronously).
fn expert_table(cuda: &Cuda, s: &MoeShape, w: &MoeWeights<GpuWeight>) -> u64 {
    let mut tables = cuda.kernels.moe.tables.lock().expect("moe table lock");
    let print = fingerprint(w);
    if let Some(t) = tables.get(&w.router.ptr)
        && t.fingerprint == print
    {
        return t.buf.ptr();
    }
    let (h, i) = (w.router.shape[1], s.intermediate);
    let mut host = Vec::with_capacity(w.experts.len() * TABLE_STRIDE);
    for (n, e) in w.experts.iter().enumerate() {
        check_fp8(&e.gate_proj, i, h, &format!("expert {n} gate_proj"));
        check_fp8(&e.up_proj, i, h, &format!("expert {n} up_proj"));
        check_fp8(&e.down_proj, h, i, &format!("expert {n} down_proj"));
        host.extend([
            e.gate_proj.weight.ptr,
            e.gate_proj.scale_inv.ptr,
            e.up_proj.weight.ptr,
            e.up_proj.scale_inv.ptr,
            e.down_proj.weight.ptr,
            e.down_proj.scale_inv.ptr,
        ]);
    }
    let buf = cuda.scratch(host.len() * 8);
    cuda.copy_to_device(buf.ptr(), &host);
    let ptr = buf.ptr();
    tables.insert(w.router.ptr, ExpertTable { buf, fingerprint: print });
    ptr
}

type Project = fn(&Cuda, &GpuMatrix, &GpuWeight) -> GpuMatrix;
type ProjectMany = fn(&Cuda, &GpuMatrix, &[&GpuWeight]) -> Vec<GpuMatrix>;

/// `down(SiLU(gate x) ⊙ up x)` of the shared expert, bf16 at each projection output (unscaled).
/// `rows`: projections under the decode batch's contract (`linear::linear_rows`).
fn shared_expert(cuda: &Cuda, w: &MoeWeights<GpuWeight>, x: &GpuMatrix, rows: bool) -> GpuMatrix {
    let se = &w.shared_expert;
    let (project, project_many): (Project, ProjectMany) =
        if rows { (linear::linear_rows, linear::linear_rows_many) } else { (linear::linear, linear::linear_many) };
    let [gate, up]: [GpuMatrix; 2] = project_many(cuda, x, &[&se.gate_proj, &se.up_proj])
        .try_into()
        .unwrap_or_else(|_| unreachable!("one output per weight"));
    linear::swiglu_project(cuda, &gate, &up, &se.down_proj)
        .unwrap_or_else(|| project(cuda, &swiglu(cuda, &gate, &up), &se.down_proj))
}

/// `bf16(SiLU(gate) ⊙ up)` elementwise (also the tower's SwiGLU).
pub(super) fn swiglu(cuda: &Cuda, gate: &GpuMatrix, up: &GpuMatrix) -> GpuMatrix {
    assert_eq!((gate.rows, gate.cols), (up.rows, up.cols), "SwiGLU of different shapes");
    let h = cuda.matrix(gate.rows, gate.cols);
    let n = h.len();
    let args = [gate.ptr().into(), up.ptr().into(), h.ptr().into(), n.into()];
    cuda.kernels.moe.swiglu_bf16.launch(cuda.stream(), Dims::linear(n.div_ceil(256), 256), &args);
    h
}

/// The routed experts' input rows as a kernel reads them.
#[derive(Clone, Copy)]
struct Input {
    ptr: u64,
    /// Per-row group scales (e4m3 input), else 0.
    scales: u64,
    kind: i32,
    /// Bytes per element.
    elem: usize,
}

/// Everything one MoE call's expert path needs.
struct Job<'a> {
    cuda: &'a Cuda,
    s: &'a MoeShape,
    table: u64,
    routing: &'a Routing,
    /// Router logits not yet routed: `group` routes them in its launch (`moe_route_group`).
    pending_logits: Option<u64>,
    /// The shared expert's output (joined by the first combine).
    shared: &'a Beside<'a, GpuMatrix>,
    input: Input,
    out: Output<'a>,
    rows: usize,
    hidden: usize,
}

impl Job<'_> {
    /// Decode: gate/up GEMV per pair → h [pairs, I] f32; down GEMV per pair (requantising h
    /// in-block) → y [pairs, hidden] f32; combine.
    fn per_pair(&self) {
        let (cuda, k, h, i) = (self.cuda, self.s.top_k, self.hidden, self.s.intermediate);
        let kernels = &cuda.kernels.moe;
        let pairs = self.rows * k;
        assert!(pairs <= u16::MAX as usize, "{pairs} (row, slot) pairs exceed the per-pair grid");
        let hbuf = cuda.scratch(pairs * i * 4);
        let y = cuda.scratch(pairs * h * 4);
        let ids = self.routing.ids.ptr();
        let input = self.input;
        let args = [
            input.ptr.into(),
            input.scales.into(),
            input.kind.into(),
            ids.into(),
            self.table.into(),
            k.into(),
            self.s.experts.into(),
            h.into(),
            i.into(),
            hbuf.ptr().into(),
        ];
        let dims = Dims::grid((i.div_ceil(GEMV_GATE_UP_COLS) as u32, pairs as u32, 1), 256)
            .with_shared(((h + h / GROUP) * 4) as u32);
        kernels.gemv_gate_up.launch(cuda.stream(), dims, &args);
        let args = [
            hbuf.ptr().into(),
            i32::from(input.kind == ACT_E4M3).into(),
            ids.into(),
            self.table.into(),
            self.s.experts.into(),
            i.into(),
            h.into(),
            y.ptr().into(),
        ];
        let dims = Dims::grid((h.div_ceil(GEMV_DOWN_COLS) as u32, pairs as u32, 1), 256)
            .with_shared(((i + i / GROUP) * 4) as u32);
        kernels.gemv_down.launch(cuda.stream(), dims, &args);
        self.combine(0, self.rows, y.ptr());
    }

    /// Prefill, in passes of at most `CHUNK_ROWS` rows: group the pass's pairs by expert, gate/up
    /// tiles (SiLU ⊙ up and the requantisation fused) → h by sorted position; down tiles → y
    /// [pairs, hidden] f32; combine.
    fn grouped(&self) {
        let (cuda, k, e, h, i) = (self.cuda, self.s.top_k, self.s.experts, self.hidden, self.s.intermediate);
        let kernels = &cuda.kernels.moe;
        let fp8 = self.input.kind == ACT_E4M3;
        let max_pairs = self.rows.min(CHUNK_ROWS) * k;
        let grouping = Grouping::new(cuda, e, max_pairs, TILE_ROWS);
        // h rows by sorted position: e4m3 codes + scales, or f32.
        let (hbuf, hscale) = if fp8 {
            (cuda.scratch(max_pairs * i), Some(cuda.scratch(max_pairs * (i / GROUP) * 4)))
        } else {
            (cuda.scratch(max_pairs * i * 4), None)
        };
        let hscale_ptr = hscale.as_ref().map_or(0, PoolBuf::ptr);
        let y = cuda.scratch(max_pairs * h * 4);
        for r0 in (0..self.rows).step_by(CHUNK_ROWS) {
            let rows = CHUNK_ROWS.min(self.rows - r0);
            let max_tiles = self.group(&grouping, r0, rows);

            let input = self.input;
            let act = input.ptr + (r0 * h * input.elem) as u64;
            let act_scales = if fp8 { input.scales + (r0 * (h / GROUP) * 4) as u64 } else { 0 };
            let grouped = (grouping.sorted.ptr(), grouping.tiles.ptr(), grouping.offsets.ptr());
            let (hq, hf) = if fp8 { (hbuf.ptr(), 0) } else { (0, hbuf.ptr()) };
            let args: [Arg; 14] = [
                act.into(),
                act_scales.into(),
                input.kind.into(),
                grouped.0.into(),
                grouped.1.into(),
                grouped.2.into(),
                self.table.into(),
                k.into(),
                h.into(),
                i.into(),
                i32::from(fp8).into(),
                hq.into(),
                hscale_ptr.into(),
                hf.into(),
            ];
            let dims = Dims::grid((max_tiles as u32, i.div_ceil(TILE_COLS) as u32, 1), 256);
            kernels.grouped_gate_up.launch(cuda.stream(), dims, &args);

            let kind = if fp8 { ACT_E4M3 } else { ACT_F32 };
            let args = [
                hbuf.ptr().into(),
                hscale_ptr.into(),
                kind.into(),
                grouped.0.into(),
                grouped.1.into(),
                grouped.2.into(),
                self.table.into(),
                i.into(),
                h.into(),
                y.ptr().into(),
            ];
            let dims = Dims::grid((max_tiles as u32, h.div_ceil(TILE_COLS) as u32, 1), 256);
            kernels.grouped_down.launch(cuda.stream(), dims, &args);
            self.combine(r0, rows, y.ptr());
        }
    }

    /// Sorts the pairs of rows `r0..r0 + rows` by expert into `g` (`moe_group_pairs`); returns the
    /// bound on their tile count (the grid of the tile kernels).
    fn group(&self, g: &Grouping, r0: usize, rows: usize) -> usize {
        let (cuda, k, e) = (self.cuda, self.s.top_k, self.s.experts);
        let pairs = rows * k;
        let max_tiles = g.max_tiles(e, pairs);
        let ids = self.routing.ids.ptr() + (r0 * k * 4) as u64;
        if let Some(logits) = self.pending_logits {
            assert!(r0 == 0 && rows == self.rows, "rows route in the grouping launch only in one pass");
            let args = [
                logits.into(),
                rows.into(),
                e.into(),
                k.into(),
                ids.into(),
                self.routing.weights.ptr().into(),
                self.routing.shared_gate.ptr().into(),
                g.tile_rows.into(),
                g.offsets.ptr().into(),
                g.sorted.ptr().into(),
                g.tiles.ptr().into(),
                max_tiles.into(),
            ];
            let threads = route_group_threads(rows);
            let smem = (e * 4 * (threads as usize / 32)).max(2 * e * 4);
            let dims = Dims::linear(1, threads).with_shared(smem as u32);
            cuda.kernels.moe.route_group.launch(cuda.stream(), dims, &args);
            return max_tiles;
        }
        let args = [
            ids.into(),
            pairs.into(),
            e.into(),
            g.tile_rows.into(),
            g.offsets.ptr().into(),
            g.sorted.ptr().into(),
            g.tiles.ptr().into(),
            max_tiles.into(),
        ];
        let dims = Dims::linear(1, GROUP_THREADS).with_shared((2 * e * 4) as u32);
        cuda.kernels.moe.group_pairs.launch(cuda.stream(), dims, &args);
        max_tiles
    }
}

/// Threads of `moe_route_group` for `rows` rows: a warp a row, between 8 and 32 warps (the
/// grouping needs no more; run 33 found the one-row launch as long at 8 warps as at 32: its cost
/// is the routing's serial picks).
fn route_group_threads(rows: usize) -> u32 {
    32 * rows.clamp(8, GROUP_THREADS as usize / 32) as u32
}
