//! `kernels/moe.cu`, `moe_route.cu`, `moe_rows.cu` and `moe_rows_wide.cu` against the CPU
//! backend: the activation quantiser (bytes and scales exact); the router (top-k ids exact where
//! the k-th and (k+1)-th probabilities are clear of a near-tie, weights and shared gate to fp32
//! precision; each row's routing in a 1000-row call, tiled logits, bit for bit the row's alone);
//! the whole MoE block in both activation modes at tiny and real dims; the per-pair and grouped
//! expert paths against each other; the tensor-core path (`MoePath::Rows`) against the CPU and
//! its row invariance: each row of a call bit for bit the row alone, also when routing skew puts
//! more than 8 pairs (one tile) on an expert, and from 4 pairs per expert up, where a call takes
//! the 32-pair wide tiles and the row alone the 8-pair ones (skew putting 80 pairs, three wide
//! tiles, on an expert); and a decode call that allocates nothing after warm-up.

use half::bf16;
use limelight::backend::BackendTypes;
use limelight::backend::backbone::{BackboneOps, ExpertActivations, MoeShape};
use limelight::backend::cpu::backbone::{quantise, route};
use limelight::backend::cpu::{CpuWeight, Matrix};
use limelight::backend::cuda::moe::{self, MoePath};
use limelight::backend::cuda::norm;
use limelight::backend::cuda::tensor::{GpuMatrix, GpuWeight};
use limelight::checkpoint::fp8::f32_to_e4m3;
use limelight::checkpoint::{Dtype, TensorView};
use limelight::model::weights::{Accept, Fp8Expert, Fp8Linear, Init, MoeWeights, SwiGlu, TensorSpec};

use crate::harness::Ctx;

/// Model sizes of one MoE block.
#[derive(Clone, Copy)]
struct Dims {
    hidden: usize,
    experts: usize,
    top_k: usize,
    intermediate: usize,
    shared: usize,
}

const TINY: Dims = Dims { hidden: 256, experts: 8, top_k: 2, intermediate: 384, shared: 128 };
const REAL: Dims = Dims { hidden: 2048, experts: 256, top_k: 8, intermediate: 512, shared: 512 };

impl Dims {
    fn shape(&self, activations: ExpertActivations) -> MoeShape {
        MoeShape {
            experts: self.experts,
            top_k: self.top_k,
            intermediate: self.intermediate,
            shared_intermediate: self.shared,
            block: [128, 128],
            activations,
        }
    }

    fn label(&self, rows: usize) -> String {
        format!("{rows}x{}, {}e top{}, I {}", self.hidden, self.experts, self.top_k, self.intermediate)
    }
}

/// The same random MoE weights on both backends.
struct Layer {
    cpu: MoeWeights<CpuWeight>,
    gpu: MoeWeights<GpuWeight>,
}

pub fn run(ctx: &mut Ctx) {
    ctx.cuda.pool().set_poison(true);
    quantiser(ctx);

    let tiny = layer(ctx, TINY);
    routing(ctx, TINY, &tiny);
    for activations in [ExpertActivations::Exact, ExpertActivations::Fp8Dynamic] {
        for rows in [1, 2, 7, 64, 130, 200] {
            block(ctx, TINY, &tiny, activations, rows);
        }
        for rows in [2, 7, 64, 130] {
            paths_agree(ctx, TINY, &tiny, activations, rows);
        }
        // 512 rows over 8 experts: 128 pairs, 16 tiles, per expert (a prefill chunk's shape).
        for rows in [1, 3, 8, 64, 130, 512] {
            rows_block(ctx, TINY, &tiny, activations, rows);
        }
        // From 16 rows (4 pairs per expert) the wide tiles; 512 rows: 4 of them per expert.
        for rows in [1, 2, 9, 64, 130, 512] {
            rows_invariant(ctx, TINY, &tiny, activations, rows);
        }
    }
    decode_allocates_nothing(ctx, TINY, &tiny);
    pool_parks_branch_buffers(ctx);
    for rows in [1, 9, 130] {
        shared_beside_in_series(ctx, TINY, &tiny, rows);
        ends_in_norm(ctx, TINY, &tiny, rows);
    }

    // The wide tiles' stages take 161 KiB of shared memory a block: every card these checks run
    // on (compute capability 9.0) has 227.
    let wide = ctx.cuda.kernels.moe.has_wide_tiles();
    let cc = ctx.cuda.info().compute_capability;
    ctx.check(
        format!("moe wide tiles loaded (compute capability {}.{})", cc.0, cc.1),
        "loaded",
        "yes at 8.0 and 9.0".into(),
        wide.to_string(),
        wide || !matches!(cc, (8, 0) | (9, 0)),
    );

    let real = layer(ctx, REAL);
    routing(ctx, REAL, &real);
    for rows in [1, 7, 130] {
        block(ctx, REAL, &real, ExpertActivations::Fp8Dynamic, rows);
    }
    for rows in [2, 65] {
        block(ctx, REAL, &real, ExpertActivations::Exact, rows);
    }
    paths_agree(ctx, REAL, &real, ExpertActivations::Fp8Dynamic, 7);
    paths_agree(ctx, REAL, &real, ExpertActivations::Exact, 3);
    for rows in [1, 3, 8, 64, 130] {
        rows_block(ctx, REAL, &real, ExpertActivations::Fp8Dynamic, rows);
    }
    for rows in [1, 64, 200] {
        rows_block(ctx, REAL, &real, ExpertActivations::Exact, rows);
    }
    // 9 and 64 rows on the 8-pair tiles; 200 (6.25 pairs per expert) on the wide ones.
    for rows in [1, 8] {
        shared_beside_in_series(ctx, REAL, &real, rows);
        ends_in_norm(ctx, REAL, &real, rows);
    }
    for activations in [ExpertActivations::Exact, ExpertActivations::Fp8Dynamic] {
        for rows in [9, 64, 200] {
            rows_invariant(ctx, REAL, &real, activations, rows);
        }
        rows_skewed(ctx, REAL, &real, activations, 24);
        rows_skewed(ctx, REAL, &real, activations, 160);
    }

    for (d, mut w) in [(TINY, tiny), (REAL, real)] {
        tie_router(ctx, d, &mut w);
        tied_routing(ctx, d, &w);
    }
}

/// The layer's router replaced by one whose rows come in identical threes (3i, 3i + 1, 3i + 2),
/// so every input's logits tie bit for bit within each three.
fn tie_router(ctx: &mut Ctx, d: Dims, w: &mut Layer) {
    let h = d.hidden;
    let scale = 3.0 / (h as f32).sqrt();
    let mut bytes = Vec::with_capacity(d.experts * h * 2);
    let mut three = Vec::new();
    for e in 0..d.experts {
        if e % 3 == 0 {
            three = (0..h).flat_map(|_| bf16::from_f32(ctx.rng.uniform(-scale, scale)).to_le_bytes()).collect();
        }
        bytes.extend_from_slice(&three);
    }
    let (c, g) = upload_both(ctx, &TensorSpec::linear("mlp.gate.weight", d.experts, h), Dtype::BF16, &bytes);
    w.cpu.router = c;
    w.gpu.router = g;
}

/// Exact ties at the top-k boundary (`tie_router`): top-k mostly ends inside a three (top-2: two
/// of the best three, unless that is the last, partial one; top-8: two whole threes and two of
/// the third), where the lower indices must win, as in the CPU `route`. Every routing site:
/// `moe_route`'s ids in order against the CPU's, on the rows whose distinct logits near the
/// boundary are clear of near-ties at fp32; and the Rows path (`moe_route_group`) against the
/// CPU `moe` (a tie broken the other way picks another expert, far outside the bound) at 1, 9
/// and 64 rows, the 9 rows each bit for bit the row alone.
fn tied_routing(ctx: &mut Ctx, d: Dims, w: &Layer) {
    let s = d.shape(ExpertActivations::Fp8Dynamic);
    let (rows, k) = (64, d.top_k);
    let x = ctx.random_bf16(rows, d.hidden, 1.0);
    let r = moe::route(ctx.cuda, &s, &w.gpu, &ctx.cuda.upload_matrix(&x));
    let ids: Vec<i32> = ctx.cuda.copy_to_host(r.ids.ptr(), rows * k);
    let (mut got, mut want, mut clear) = (vec![], vec![], 0);
    for t in 0..rows {
        let logits: Vec<f64> = (0..d.experts).map(|e| dot(x.row(t), w.cpu.router.row(e))).collect();
        // The threes' logits, largest first: those that decide the top-k (and the next one)
        // must differ by more than fp32 resolves.
        let mut threes: Vec<f64> = logits.iter().step_by(3).copied().collect();
        threes.sort_by(|a, b| b.total_cmp(a));
        let deciding = &threes[..(k / 3 + 2).min(threes.len())];
        if deciding.windows(2).any(|p| p[0] - p[1] <= 1e-4 * p[0].abs().max(1.0)) {
            continue;
        }
        clear += 1;
        got.extend_from_slice(&ids[t * k..(t + 1) * k]);
        want.extend(route(&s, &logits).iter().map(|&(e, _)| e as i32));
    }
    let label = format!("{} ({clear} of {rows} rows clear of near-ties)", d.label(rows));
    ctx.check(
        format!("moe_route tied router: rows clear of near-ties [{}]", d.label(rows)),
        "rows",
        format!(">= {}", rows / 2),
        clear.to_string(),
        clear >= rows / 2,
    );
    ctx.exact(format!("moe_route tied router: top-k ids in order [{label}]"), &got, &want);
    for rows in [1, 9, 64] {
        let label = format!("tied router, {}", d.label(rows));
        let x = ctx.random_bf16(rows, d.hidden, 1.0);
        let want = ctx.cpu.moe(&s, &w.cpu, &x);
        let together = rows_path(ctx, &s, w, &x);
        ctx.rel_l2(format!("moe Fp8Dynamic rows [{label}]"), &together, &want.data, 1e-2);
        if rows == 9 {
            let alone = rows_alone(ctx, &s, w, &x);
            ctx.exact(format!("moe Fp8Dynamic rows, each row alone [{label}]"), &bits(&together), &bits(&alone));
        }
    }
}

/// The dynamic quantiser (`moe_rows_operand`, e4m3) vs the CPU `quantise` on identical bf16 rows
/// whose groups span twelve orders of magnitude (and one all-zero group, which takes the 1e-10
/// floor).
fn quantiser(ctx: &mut Ctx) {
    for (rows, cols) in [(1, 2048), (7, 256), (130, 2048)] {
        let mut x = ctx.random(rows, cols, 1.0);
        for (n, group) in x.data.chunks_mut(128).enumerate() {
            let scale = if n == 1 { 0.0 } else { 10f32.powf(ctx.rng.uniform(-6.0, 6.0)) };
            group.iter_mut().for_each(|v| *v *= scale);
        }
        let x = limelight::backend::cuda::tensor::round_to_bf16(&x);
        let q = moe::quantise_rows(ctx.cuda, &ctx.cuda.upload_matrix(&x));
        let got_codes: Vec<u8> = ctx.cuda.copy_to_host(q.codes.ptr(), rows * cols);
        let got_scales: Vec<f32> = ctx.cuda.copy_to_host(q.scales.ptr(), rows * cols / 128);
        let (mut want_codes, mut want_scales) = (Vec::new(), Vec::new());
        for r in 0..rows {
            let b = quantise(x.row(r), 128);
            want_codes.extend(b.values.iter().map(|&v| f32_to_e4m3(v)));
            want_scales.extend(b.scales.iter().map(|&s| (s as f32).to_bits()));
        }
        // −0 and +0 are the same value (0x80 and 0x00 decode alike); compare the rest bit for bit.
        let zero = |c: u8| if c == 0x80 { 0 } else { c };
        let got_codes: Vec<u8> = got_codes.into_iter().map(zero).collect();
        let want_codes: Vec<u8> = want_codes.into_iter().map(zero).collect();
        let got_scales: Vec<u32> = got_scales.iter().map(|s| s.to_bits()).collect();
        ctx.exact(format!("moe_rows_operand e4m3 codes [{rows},{cols}]"), &got_codes, &want_codes);
        ctx.exact(format!("moe_rows_operand e4m3 scales [{rows},{cols}]"), &got_scales, &want_scales);
    }
}

/// `moe_router_logits` + `moe_route` vs the CPU `route` on f64 logits of the same inputs.
fn routing(ctx: &mut Ctx, d: Dims, w: &Layer) {
    let s = d.shape(ExpertActivations::Fp8Dynamic);
    for rows in [1, 200] {
        let x = ctx.random_bf16(rows, d.hidden, 1.0);
        let r = moe::route(ctx.cuda, &s, &w.gpu, &ctx.cuda.upload_matrix(&x));
        let k = d.top_k;
        let ids: Vec<i32> = ctx.cuda.copy_to_host(r.ids.ptr(), rows * k);
        let weights: Vec<f32> = ctx.cuda.copy_to_host(r.weights.ptr(), rows * k);
        let gates: Vec<f32> = ctx.cuda.copy_to_host(r.shared_gate.ptr(), rows);

        let (mut got_ids, mut want_ids, mut got_w, mut want_w, mut want_gates) =
            (vec![], vec![], vec![], vec![], vec![]);
        let mut clear = 0;
        for t in 0..rows {
            let xr = x.row(t);
            let logits: Vec<f64> = (0..d.experts).map(|e| dot(xr, w.cpu.router.row(e))).collect();
            want_gates.push(sigmoid(dot(xr, w.cpu.shared_expert_gate.row(0))) as f32);
            // Only rows whose k-th and (k+1)-th probabilities differ by > 1e-4 (relative) have
            // one right answer at fp32 logit precision.
            let mut p: Vec<f64> = logits.iter().map(|l| l.exp()).collect();
            p.sort_by(|a, b| b.total_cmp(a));
            if k < d.experts && (p[k - 1] - p[k]) <= 1e-4 * p[k - 1] {
                continue;
            }
            clear += 1;
            let mut want = route(&s, &logits);
            want.sort_by_key(|&(e, _)| e);
            let mut got: Vec<(i32, f32)> = (0..k).map(|j| (ids[t * k + j], weights[t * k + j])).collect();
            got.sort_by_key(|&(e, _)| e);
            got_ids.extend(got.iter().map(|g| g.0));
            want_ids.extend(want.iter().map(|w| w.0 as i32));
            got_w.extend(got.iter().map(|g| g.1));
            want_w.extend(want.iter().map(|w| w.1 as f32));
        }
        let label = format!("{} ({clear} rows clear of ties)", d.label(rows));
        ctx.check(
            format!("moe_route rows clear of ties [{}]", d.label(rows)),
            "rows",
            format!(">= {}", rows * 9 / 10),
            clear.to_string(),
            clear >= rows * 9 / 10,
        );
        ctx.exact(format!("moe_route top-k ids [{label}]"), &got_ids, &want_ids);
        ctx.rel_l2(format!("moe_route weights [{label}]"), &got_w, &want_w, 1e-4);
        ctx.rel_l2(format!("moe_route shared gate [{}]", d.label(rows)), &gates, &want_gates, 1e-4);
    }
    routing_invariant(ctx, d, w, 1000);
}

/// Each row's routing (ids, weights, shared gate) from a `rows`-row call (the tiled router
/// logits) is bit for bit the row's routing alone (one warp per logit).
fn routing_invariant(ctx: &mut Ctx, d: Dims, w: &Layer, rows: usize) {
    let s = d.shape(ExpertActivations::Fp8Dynamic);
    let x = ctx.random_bf16(rows, d.hidden, 1.0);
    let host = |ctx: &mut Ctx, x: &Matrix| {
        let r = moe::route(ctx.cuda, &s, &w.gpu, &ctx.cuda.upload_matrix(x));
        let ids: Vec<i32> = ctx.cuda.copy_to_host(r.ids.ptr(), x.rows * d.top_k);
        let mut bits: Vec<u32> = ctx.cuda.copy_to_host(r.weights.ptr(), x.rows * d.top_k);
        bits.extend(ctx.cuda.copy_to_host::<u32>(r.shared_gate.ptr(), x.rows));
        (ids, bits)
    };
    let (ids, bits) = host(ctx, &x);
    let (mut ids_alone, mut weights_alone, mut gates_alone) = (vec![], vec![], vec![]);
    for r in 0..rows {
        let (i, b) = host(ctx, &Matrix::from_vec(1, x.cols, x.row(r).to_vec()));
        ids_alone.extend(i);
        weights_alone.extend_from_slice(&b[..d.top_k]);
        gates_alone.push(b[d.top_k]);
    }
    weights_alone.extend(gates_alone);
    ctx.exact(format!("moe_route ids, each row alone [{}]", d.label(rows)), &ids, &ids_alone);
    ctx.exact(
        format!("moe_route weights and shared gate, each row alone, bits [{}]", d.label(rows)),
        &bits,
        &weights_alone,
    );
}

/// The whole block (path chosen by row count) vs the CPU `moe` with the same activation mode.
fn block(ctx: &mut Ctx, d: Dims, w: &Layer, activations: ExpertActivations, rows: usize) {
    let s = d.shape(activations);
    let x = ctx.random_bf16(rows, d.hidden, 1.0);
    let want = ctx.cpu.moe(&s, &w.cpu, &x);
    let got = ctx.cuda.to_host(&moe::moe(ctx.cuda, &s, &w.gpu, &ctx.cuda.upload_matrix(&x)));
    let path = if rows <= moe::DECODE_MAX_ROWS { "per-pair" } else { "grouped" };
    ctx.rel_l2(format!("moe {activations:?} {path} [{}]", d.label(rows)), &got.data, &want.data, 1e-2);
}

/// The per-pair (decode) and grouped (prefill) expert paths on the same rows. They differ only
/// in fp32 summation order (and so, rarely, in an e4m3 code of the requantised h).
fn paths_agree(ctx: &mut Ctx, d: Dims, w: &Layer, activations: ExpertActivations, rows: usize) {
    let s = d.shape(activations);
    let x = ctx.cuda.upload_matrix(&ctx.random_bf16(rows, d.hidden, 1.0));
    let per_pair = ctx.cuda.to_host(&moe::moe_with(ctx.cuda, &s, &w.gpu, &x, MoePath::PerPair));
    let grouped = ctx.cuda.to_host(&moe::moe_with(ctx.cuda, &s, &w.gpu, &x, MoePath::Grouped));
    ctx.rel_l2(
        format!("moe per-pair vs grouped {activations:?} [{}]", d.label(rows)),
        &per_pair.data,
        &grouped.data,
        1e-3,
    );
}

/// The decode batch's path (`MoePath::Rows`: swap-AB MMA tiles) vs the CPU `moe`. Bound 1e-2 as
/// for the other paths: the expert arithmetic is exact up to f32 summation (and, in `Fp8Dynamic`,
/// a requantised h code that a different rounding of h moves by one step), so the error is the
/// bf16 rounding of the shared expert's projections and of the output.
fn rows_block(ctx: &mut Ctx, d: Dims, w: &Layer, activations: ExpertActivations, rows: usize) {
    let s = d.shape(activations);
    let x = ctx.random_bf16(rows, d.hidden, 1.0);
    let want = ctx.cpu.moe(&s, &w.cpu, &x);
    let got = rows_path(ctx, &s, w, &x);
    ctx.rel_l2(format!("moe {activations:?} rows [{}]", d.label(rows)), &got, &want.data, 1e-2);
}

/// Each row of an M-row call on the Rows path is bit for bit the same row alone.
fn rows_invariant(ctx: &mut Ctx, d: Dims, w: &Layer, activations: ExpertActivations, rows: usize) {
    let s = d.shape(activations);
    let x = ctx.random_bf16(rows, d.hidden, 1.0);
    let together = rows_path(ctx, &s, w, &x);
    let alone = rows_alone(ctx, &s, w, &x);
    ctx.exact(format!("moe {activations:?} rows, each row alone [{}]", d.label(rows)), &bits(&together), &bits(&alone));
}

/// Routing skew: every other row the same row, so each of its top_k experts holds rows / 2
/// pairs next to the random rows' pairs (24 rows: 12 pairs, two 8-pair tiles; 160 rows: 80
/// pairs, three wide tiles). Against the CPU, and each row bit for bit the row alone.
fn rows_skewed(ctx: &mut Ctx, d: Dims, w: &Layer, activations: ExpertActivations, rows: usize) {
    let s = d.shape(activations);
    let mut x = ctx.random_bf16(rows, d.hidden, 1.0);
    let same = x.row(0).to_vec();
    for r in (0..rows).step_by(2) {
        x.row_mut(r).copy_from_slice(&same);
    }
    let want = ctx.cpu.moe(&s, &w.cpu, &x);
    let together = rows_path(ctx, &s, w, &x);
    let label = format!("{}, {} copies of one row", d.label(rows), rows / 2);
    ctx.rel_l2(format!("moe {activations:?} rows skewed [{label}]"), &together, &want.data, 1e-2);
    let alone = rows_alone(ctx, &s, w, &x);
    ctx.exact(format!("moe {activations:?} rows skewed, each row alone [{label}]"), &bits(&together), &bits(&alone));
}

/// The block on the Rows path over all rows of `x`, on the host.
fn rows_path(ctx: &mut Ctx, s: &MoeShape, w: &Layer, x: &Matrix) -> Vec<f32> {
    let y = moe::moe_with(ctx.cuda, s, &w.gpu, &ctx.cuda.upload_matrix(x), MoePath::Rows);
    ctx.cuda.to_host(&y).data
}

/// The block on the Rows path over each row of `x` alone, stacked.
fn rows_alone(ctx: &mut Ctx, s: &MoeShape, w: &Layer, x: &Matrix) -> Vec<f32> {
    let mut out = Vec::with_capacity(x.data.len());
    for r in 0..x.rows {
        out.extend(rows_path(ctx, s, w, &Matrix::from_vec(1, x.cols, x.row(r).to_vec())));
    }
    out
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// The Rows path with the shared expert on the side stream (`Cuda::beside`) against the same
/// path in series, bit for bit, over repeated calls queued back to back without a sync between
/// them (a buffer reused while the other stream still reads it would show as a difference).
fn shared_beside_in_series(ctx: &mut Ctx, d: Dims, w: &Layer, rows: usize) {
    const CALLS: usize = 16;
    let s = d.shape(ExpertActivations::Fp8Dynamic);
    let xs: Vec<GpuMatrix> =
        (0..CALLS).map(|_| ctx.cuda.upload_matrix(&ctx.random_bf16(rows, d.hidden, 1.0))).collect();
    let run = |beside: bool| -> Vec<u32> {
        ctx.cuda.set_side_stream(beside);
        let outs: Vec<GpuMatrix> = xs.iter().map(|x| moe::moe_with(ctx.cuda, &s, &w.gpu, x, MoePath::Rows)).collect();
        ctx.cuda.set_side_stream(true);
        outs.iter().flat_map(|y| bits(&ctx.cuda.to_host(y).data)).collect()
    };
    let in_series = run(false);
    let beside = run(true);
    let label = format!("{CALLS} calls of {}", d.label(rows));
    ctx.exact(format!("moe rows, shared expert beside = in series [{label}]"), &beside, &in_series);
}

/// `moe_rows_add_rms_norm` (the combine, the residual add and the norm in one launch) against
/// the Rows path's output added and normed by `norm::add_rms_norm`: the residual and the normed
/// rows bit for bit.
fn ends_in_norm(ctx: &mut Ctx, d: Dims, w: &Layer, rows: usize) {
    let s = d.shape(ExpertActivations::Fp8Dynamic);
    let x = ctx.cuda.upload_matrix(&ctx.random_bf16(rows, d.hidden, 1.0));
    let residual = ctx.random_bf16(rows, d.hidden, 3.0);
    let gain = ctx.cuda.upload_f32(&[d.hidden], ctx.random(1, d.hidden, 0.5).data);
    let eps = 1e-6;
    let mut fused_residual = ctx.cuda.upload_matrix(&residual);
    let fused = moe::moe_rows_add_rms_norm(ctx.cuda, &s, &w.gpu, &x, &mut fused_residual, &gain, eps);
    let mut apart_residual = ctx.cuda.upload_matrix(&residual);
    let delta = moe::moe_with(ctx.cuda, &s, &w.gpu, &x, MoePath::Rows);
    let apart = norm::add_rms_norm(ctx.cuda, &mut apart_residual, &delta, &gain, eps);
    let label = d.label(rows);
    let host = |m: &GpuMatrix| bits(&ctx.cuda.to_host(m).data);
    let (got, want) = ([host(&fused_residual), host(&fused)].concat(), [host(&apart_residual), host(&apart)].concat());
    ctx.exact(format!("moe rows ending in the next norm = moe, then add_rms_norm [{label}]"), &got, &want);
}

/// While a side-stream branch is open the pool hands out no buffer dropped since its fork
/// (either stream may still read it); at the join the buffer is free again.
fn pool_parks_branch_buffers(ctx: &mut Ctx) {
    let cuda = ctx.cuda;
    let before = cuda.scratch(4096);
    let address = before.ptr();
    let branch = cuda.beside(|side| {
        drop(before);
        side.scratch(4096)
    });
    let during = cuda.scratch(4096);
    let in_branch = branch.get().ptr();
    let after = cuda.scratch(4096);
    cuda.synchronize();
    let reused = [in_branch, during.ptr(), after.ptr()].map(|p| p == address);
    ctx.check(
        "pool: a buffer dropped in a side-stream branch",
        "reused",
        "not before the join, then yes".into(),
        format!("in the branch {}, beside it {}, after the join {}", reused[0], reused[1], reused[2]),
        reused == [false, false, true],
    );
}

/// A decode step after warm-up takes every buffer from the pool (and the expert table from the
/// cache): no driver allocation.
fn decode_allocates_nothing(ctx: &mut Ctx, d: Dims, w: &Layer) {
    let s = d.shape(ExpertActivations::Fp8Dynamic);
    let x = ctx.cuda.upload_matrix(&ctx.random_bf16(1, d.hidden, 1.0));
    drop(moe::moe(ctx.cuda, &s, &w.gpu, &x));
    let before = ctx.cuda.pool().stats().driver_allocations;
    drop(moe::moe(ctx.cuda, &s, &w.gpu, &x));
    ctx.cuda.synchronize();
    let after = ctx.cuda.pool().stats().driver_allocations;
    ctx.check(
        format!("moe decode after warm-up [{}]", d.label(1)),
        "driver allocations",
        "0".into(),
        (after - before).to_string(),
        after == before,
    );
}

// ---------------------------------------------------------------------------------------------
// Random weights, uploaded identically to both backends.

fn layer(ctx: &mut Ctx, d: Dims) -> Layer {
    let h = d.hidden;
    // Router and shared gate: logits of standard deviation ~1 for inputs uniform in ±1.
    let logit_scale = 3.0 / (h as f32).sqrt();
    let (router_c, router_g) = bf16_matrix(ctx, "mlp.gate.weight", d.experts, h, logit_scale);
    let (sg_c, sg_g) = bf16_matrix(ctx, "mlp.shared_expert_gate.weight", 1, h, logit_scale);
    // Shared expert weights large enough that its output is comparable to the routed experts'.
    let (gate_c, gate_g) = bf16_matrix(ctx, "mlp.shared_expert.gate_proj.weight", d.shared, h, 0.5);
    let (up_c, up_g) = bf16_matrix(ctx, "mlp.shared_expert.up_proj.weight", d.shared, h, 0.5);
    let (down_c, down_g) = bf16_matrix(ctx, "mlp.shared_expert.down_proj.weight", h, d.shared, 0.5);
    let (mut experts_c, mut experts_g) = (Vec::new(), Vec::new());
    for e in 0..d.experts {
        let p = format!("mlp.experts.{e}");
        let (gc, gg) = fp8_linear(ctx, &format!("{p}.gate_proj"), d.intermediate, h);
        let (uc, ug) = fp8_linear(ctx, &format!("{p}.up_proj"), d.intermediate, h);
        let (dc, dg) = fp8_linear(ctx, &format!("{p}.down_proj"), h, d.intermediate);
        experts_c.push(Fp8Expert { gate_proj: gc, up_proj: uc, down_proj: dc });
        experts_g.push(Fp8Expert { gate_proj: gg, up_proj: ug, down_proj: dg });
    }
    Layer {
        cpu: MoeWeights {
            router: router_c,
            experts: experts_c,
            shared_expert: SwiGlu { gate_proj: gate_c, up_proj: up_c, down_proj: down_c },
            shared_expert_gate: sg_c,
        },
        gpu: MoeWeights {
            router: router_g,
            experts: experts_g,
            shared_expert: SwiGlu { gate_proj: gate_g, up_proj: up_g, down_proj: down_g },
            shared_expert_gate: sg_g,
        },
    }
}

fn upload_both(ctx: &Ctx, spec: &TensorSpec, dtype: Dtype, bytes: &[u8]) -> (CpuWeight, GpuWeight) {
    let view = TensorView { dtype, shape: &spec.shape, bytes };
    (ctx.cpu.upload(spec, view), ctx.cuda.upload(spec, view))
}

/// A bf16 `[out, inp]` matrix uniform in ±scale.
fn bf16_matrix(ctx: &mut Ctx, name: &str, out: usize, inp: usize, scale: f32) -> (CpuWeight, GpuWeight) {
    let bytes: Vec<u8> =
        (0..out * inp).flat_map(|_| bf16::from_f32(ctx.rng.uniform(-scale, scale)).to_le_bytes()).collect();
    upload_both(ctx, &TensorSpec::linear(name, out, inp), Dtype::BF16, &bytes)
}

/// Random finite e4m3 codes (NaN patterns 0x7F / 0xFF moved to ±448) and scales in [1e-3, 4e-3].
fn fp8_linear(ctx: &mut Ctx, name: &str, out: usize, inp: usize) -> (Fp8Linear<CpuWeight>, Fp8Linear<GpuWeight>) {
    let mut codes = vec![0u8; out * inp];
    for chunk in codes.chunks_mut(8) {
        let r = ctx.rng.next_u64().to_le_bytes();
        chunk.copy_from_slice(&r[..chunk.len()]);
    }
    codes.iter_mut().filter(|c| **c & 0x7F == 0x7F).for_each(|c| *c ^= 1);
    let grid = [out.div_ceil(128), inp.div_ceil(128)];
    let scales: Vec<u8> = (0..grid[0] * grid[1]).flat_map(|_| ctx.rng.uniform(1e-3, 4e-3).to_le_bytes()).collect();
    let wspec = TensorSpec::new(format!("{name}.weight"), &[out, inp], Accept::Fp8E4M3, Dtype::F8E4M3, Init::Fp8Codes);
    let sspec = TensorSpec::new(
        format!("{name}.weight_scale_inv"),
        &grid,
        Accept::Scale,
        Dtype::F32,
        Init::Fp8Scale { fan_in: inp },
    );
    let (wc, wg) = upload_both(ctx, &wspec, Dtype::F8E4M3, &codes);
    let (sc, sg) = upload_both(ctx, &sspec, Dtype::F32, &scales);
    (Fp8Linear { weight: wc, scale_inv: sc }, Fp8Linear { weight: wg, scale_inv: sg })
}

fn dot(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum()
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}
