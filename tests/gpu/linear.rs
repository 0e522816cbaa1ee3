//! `kernels/linear.cu` and cuBLASLt against the host: dense projections on every path (tensor-core
//! decode kernel, tensor-core prefill GEMM, cuBLASLt, tiled fallback) at the real model's shapes
//! and odd ones, the row invariance of both tensor-core kernels and of `linear_segments`, the
//! input-embedding gather and the restricted `lm_head`, all on identical bf16 inputs.

use half::bf16;
use limelight::backend::BackendTypes;
use limelight::backend::backbone::{BackboneOps, EmbedRow};
use limelight::backend::cpu::{CpuWeight, Matrix};
use limelight::backend::cuda::linear::{self, DECODE_MAX_ROWS, Path, RestrictedHead};
use limelight::backend::cuda::tensor::GpuWeight;
use limelight::checkpoint::{Dtype, TensorView};
use limelight::model::weights::TensorSpec;

use crate::harness::Ctx;

/// Weight shapes `[n, k]`: the real model's dense projections (GDN qkv / z / b, attention q / k /
/// o, shared expert up / down, the tower's heads), then odd ones: n not a multiple of 16, k not a
/// multiple of 32 (the decode kernel's zero-padded last step), a single k32 step, and a wide k
/// (8192: eight weight pieces per tile in `linear_mma_r8` at one row; at 8 rows its stage is
/// over the grant and `linear_mma_r64` runs it). `linear_mma_r8` walks several tiles per block
/// where n / 16 exceeds the SMs (8192 and 4096 features).
const SHAPES: &[(usize, usize)] = &[
    (8192, 2048),
    (4096, 2048),
    (32, 2048),
    (2048, 4096),
    (512, 2048),
    (2048, 512),
    (1, 2048),
    (100, 72),
    (33, 2048),
    (70, 1000),
    (24, 8),
    (48, 8192),
];
/// Row counts: single rows, the r8 kernel's edge (8, 9), the r64 kernels' (64, 65) and several of
/// their blocks (130), prefill (200), the GEMM's 128-row blocks (520: four and a part).
const ROWS: &[usize] = &[1, 2, 3, 8, 9, 64, 65, 130, 200, 520];
/// bf16 output rounding is at most 2^-9 ≈ 2e-3 relative per output (≈1e-3 RMS); f32 accumulation
/// in a different order from the f64 reference adds ~1e-6 at k ≤ 4096.
const LINEAR_BOUND: f64 = 1e-2;
/// Row counts of the row-invariance check (each row of an M-row call against the row alone).
const INVARIANCE_ROWS: &[usize] = &[1, 2, 7, 8, 9, 33, 64, 65, 130];
/// Row counts of the prefill GEMM's row-invariance check. mma.sync: 32-row blocks (where their
/// grid fits one block an SM: one row, a part, several), 64-row blocks (300 rows of the
/// 4096-feature shape) and 128-row blocks (from 512 rows); each row alone takes 32-row blocks.
/// wgmma: 64 × 64 tiles (up to 130 rows), 64 × 128 (300 rows of the 4096-feature shape) and
/// 128 × 128 (600 rows); each row alone takes 64 × 64.
const GEMM_INVARIANCE_ROWS: &[usize] = &[1, 9, 64, 65, 130, 300, 600];
/// Prompt lengths of `linear_segments`' check: runs on both sides of DECODE_MAX_ROWS.
const SEGMENTS: &[usize] = &[3, 85, 9, 1, 200, 8, 64];

pub fn run(ctx: &mut Ctx) {
    ctx.cuda.pool().set_poison(true);
    if ctx.cuda.blas.is_none() {
        ctx.check("cublaslt", "loaded", "yes".into(), "not loaded".into(), false);
    }
    for &(n, k) in SHAPES {
        projections(ctx, n, k);
    }
    // k not a multiple of 8: no tensor-core path; cuBLASLt and the tiled kernel must still be right.
    projections(ctx, 40, 100);
    for (n, k) in [(2048, 4096), (4096, 2048), (100, 72), (48, 8192), (40, 4136)] {
        row_invariance(ctx, n, k);
        gemm_row_invariance(ctx, n, k);
        segments(ctx, n, k);
    }
    // The decode step's fused launches: the GDN's four input projections, q/k/v, gate/up.
    many(ctx, &[8192, 4096, 32, 32], 2048);
    many(ctx, &[100, 48, 16], 72);
    routing(ctx);
    for hidden in [2048, 100] {
        embed(ctx, hidden);
    }
    for (vocab, hidden) in [(12_000, 2048), (300, 100)] {
        restricted(ctx, vocab, hidden);
    }
}

/// A bf16 matrix uploaded to both backends exactly as a checkpoint tensor would be.
fn upload_bf16(ctx: &Ctx, name: &str, m: &Matrix) -> (CpuWeight, GpuWeight) {
    let bytes: Vec<u8> = m.data.iter().flat_map(|&v| bf16::from_f32(v).to_le_bytes()).collect();
    let shape = [m.rows, m.cols];
    let spec = TensorSpec::linear(name, m.rows, m.cols);
    let cpu = ctx.cpu.upload(&spec, TensorView { dtype: Dtype::BF16, shape: &shape, bytes: &bytes });
    let gpu = ctx.cuda.upload(&spec, TensorView { dtype: Dtype::BF16, shape: &shape, bytes: &bytes });
    (cpu, gpu)
}

/// `x · wᵀ` with one f64 dot per output, spread over the host's cores.
fn reference(x: &Matrix, w: &Matrix) -> Vec<f32> {
    let n = w.rows;
    let mut out = vec![0f32; x.rows * n];
    let threads = std::thread::available_parallelism().map_or(4, |t| t.get());
    let chunk = out.len().div_ceil(threads).max(1);
    std::thread::scope(|s| {
        for (c, slice) in out.chunks_mut(chunk).enumerate() {
            s.spawn(move || {
                for (i, slot) in slice.iter_mut().enumerate() {
                    let idx = c * chunk + i;
                    let (xr, wr) = (x.row(idx / n), w.row(idx % n));
                    *slot = xr.iter().zip(wr).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>() as f32;
                }
            });
        }
    });
    out
}

fn projections(ctx: &mut Ctx, n: usize, k: usize) {
    let w = ctx.random_bf16(n, k, 0.05);
    let (_, gw) = upload_bf16(ctx, "linear check weight", &w);
    let mma_ok = k.is_multiple_of(8);
    for &rows in ROWS {
        let x = ctx.random_bf16(rows, k, 1.0);
        let want = reference(&x, &w);
        let gx = ctx.cuda.upload_matrix(&x);
        let mut paths = vec![Path::Tiled];
        if mma_ok {
            paths.extend([Path::Mma, Path::Gemm, Path::GemmMmaSync]);
        }
        if ctx.cuda.blas.is_some() {
            paths.push(Path::Blas);
        }
        for path in paths {
            let name = format!("{path:?}").to_lowercase();
            let stage = format!("linear {name} [{rows}, {k}]·[{n}, {k}]ᵀ");
            match linear::linear_via(ctx.cuda, &gx, &gw, path) {
                Ok(y) => {
                    let got = ctx.cuda.to_host(&y);
                    ctx.rel_l2(stage, &got.data, &want, LINEAR_BOUND);
                }
                Err(e) => ctx.check(stage, "cuBLASLt status", "success".into(), e.to_string(), false),
            }
        }
    }
}

/// The decode kernel's rows are their own: each row of an M-row `linear_rows` call (both the r8
/// and the r64 kernels, one block of rows or several) has the bits of that row computed alone,
/// which is also what `linear` gives a single-stream decode row (`routing`: the same path).
fn row_invariance(ctx: &mut Ctx, n: usize, k: usize) {
    let w = ctx.random_bf16(n, k, 0.05);
    let (_, gw) = upload_bf16(ctx, "linear invariance weight", &w);
    let most = INVARIANCE_ROWS.iter().copied().max().unwrap_or(1);
    let x = ctx.random_bf16(most, k, 1.0);
    let alone: Vec<Vec<u32>> = (0..most)
        .map(|r| {
            let row = ctx.cuda.upload_matrix(&Matrix::from_vec(1, k, x.row(r).to_vec()));
            bits(&ctx.cuda.to_host(&linear::linear_rows(ctx.cuda, &row, &gw)))
        })
        .collect();
    for &m in INVARIANCE_ROWS {
        let xm = Matrix::from_vec(m, k, x.data[..m * k].to_vec());
        let got = bits(&ctx.cuda.to_host(&linear::linear_rows(ctx.cuda, &ctx.cuda.upload_matrix(&xm), &gw)));
        let want: Vec<u32> = alone[..m].concat();
        ctx.exact(format!("linear_rows [{m}, {k}]·[{n}, {k}]ᵀ rows vs alone (bits)"), &got, &want);
    }
}

/// `linear_rows_many` (several weights over one input, one launch) gives each output the bits of
/// its own `linear_rows` launch, at every row count (r8 and r64 kernels, one block of rows or
/// several); and `linear_many` those of `linear`.
fn many(ctx: &mut Ctx, ns: &[usize], k: usize) {
    let weights: Vec<GpuWeight> = ns
        .iter()
        .map(|&n| {
            let w = ctx.random_bf16(n, k, 0.05);
            upload_bf16(ctx, "linear many weight", &w).1
        })
        .collect();
    let refs: Vec<&GpuWeight> = weights.iter().collect();
    for &m in INVARIANCE_ROWS {
        let x = ctx.cuda.upload_matrix(&ctx.random_bf16(m, k, 1.0));
        let fused: Vec<Vec<u32>> =
            linear::linear_rows_many(ctx.cuda, &x, &refs).iter().map(|y| bits(&ctx.cuda.to_host(y))).collect();
        let alone: Vec<Vec<u32>> =
            refs.iter().map(|w| bits(&ctx.cuda.to_host(&linear::linear_rows(ctx.cuda, &x, w)))).collect();
        ctx.exact(
            format!("linear_rows_many [{m}, {k}]·{ns:?} vs one launch each (bits)"),
            &fused.concat(),
            &alone.concat(),
        );
        let fused: Vec<Vec<u32>> =
            linear::linear_many(ctx.cuda, &x, &refs).iter().map(|y| bits(&ctx.cuda.to_host(y))).collect();
        let alone: Vec<Vec<u32>> =
            refs.iter().map(|w| bits(&ctx.cuda.to_host(&linear::linear(ctx.cuda, &x, w)))).collect();
        ctx.exact(format!("linear_many [{m}, {k}]·{ns:?} vs linear each (bits)"), &fused.concat(), &alone.concat());
    }
}

/// The prefill GEMM's rows are their own: each row of an M-row call (every block shape the path
/// takes: 32-, 64- and 128-row blocks of the mma.sync GEMM; 64-row blocks of the wgmma GEMM) has
/// the bits of that row computed alone on the same path. Both GEMM paths on a Hopper GPU, where
/// `Gemm` is the wgmma kernel and `GemmMmaSync` the kernels of every other GPU.
fn gemm_row_invariance(ctx: &mut Ctx, n: usize, k: usize) {
    let w = ctx.random_bf16(n, k, 0.05);
    let (_, gw) = upload_bf16(ctx, "gemm invariance weight", &w);
    let most = GEMM_INVARIANCE_ROWS.iter().copied().max().unwrap_or(1);
    let x = ctx.random_bf16(most, k, 1.0);
    for path in [Path::Gemm, Path::GemmMmaSync] {
        let gemm = |ctx: &Ctx, x: &Matrix| {
            let y = linear::linear_via(ctx.cuda, &ctx.cuda.upload_matrix(x), &gw, path).expect("no failure path");
            bits(&ctx.cuda.to_host(&y))
        };
        let alone: Vec<Vec<u32>> = (0..most).map(|r| gemm(ctx, &Matrix::from_vec(1, k, x.row(r).to_vec()))).collect();
        for &m in GEMM_INVARIANCE_ROWS {
            let want: Vec<u32> = alone[..m].concat();
            let got = gemm(ctx, &Matrix::from_vec(m, k, x.data[..m * k].to_vec()));
            let name = format!("{path:?}").to_lowercase();
            ctx.exact(format!("linear {name} [{m}, {k}]·[{n}, {k}]ᵀ rows vs alone (bits)"), &got, &want);
        }
    }
}

/// Several prompts' rows in one `linear_segments` call: each prompt's rows have the bits `linear`
/// gives that prompt alone (the GEMM for runs above DECODE_MAX_ROWS, the decode kernel below).
fn segments(ctx: &mut Ctx, n: usize, k: usize) {
    let w = ctx.random_bf16(n, k, 0.05);
    let (_, gw) = upload_bf16(ctx, "segments weight", &w);
    let total: usize = SEGMENTS.iter().sum();
    let x = ctx.random_bf16(total, k, 1.0);
    let mut want = Vec::new();
    let mut start = 0;
    for &rows in SEGMENTS {
        let own = ctx.cuda.upload_matrix(&Matrix::from_vec(rows, k, x.data[start * k..(start + rows) * k].to_vec()));
        want.extend(bits(&ctx.cuda.to_host(&linear::linear(ctx.cuda, &own, &gw))));
        start += rows;
    }
    let got = linear::linear_segments(ctx.cuda, &ctx.cuda.upload_matrix(&x), SEGMENTS, &gw);
    ctx.exact(
        format!("linear_segments {SEGMENTS:?} · [{n}, {k}]ᵀ vs each alone (bits)"),
        &bits(&ctx.cuda.to_host(&got)),
        &want,
    );
}

fn bits(m: &Matrix) -> Vec<u32> {
    m.data.iter().map(|v| v.to_bits()).collect()
}

/// Decode batches take the tensor-core decode kernel, prefill the tensor-core GEMM.
fn routing(ctx: &mut Ctx) {
    for rows in [1, DECODE_MAX_ROWS, DECODE_MAX_ROWS + 1, 200] {
        let want = if rows <= DECODE_MAX_ROWS { Path::Mma } else { Path::Gemm };
        let got = linear::path_for(ctx.cuda, rows, 2048);
        let pass = got == want;
        ctx.check(format!("linear path [{rows}, 2048]"), "path", format!("{want:?}"), format!("{got:?}"), pass);
    }
}

fn embed(ctx: &mut Ctx, hidden: usize) {
    let (vocab, codebook_vocab, codebooks) = (1000, 50, 10);
    let table = ctx.random_bf16(vocab, hidden, 0.5);
    let cb = ctx.random_bf16(codebooks * codebook_vocab, hidden, 0.5);
    let (cpu_e, gpu_e) = upload_bf16(ctx, "embed_tokens", &table);
    let (cpu_cb, gpu_cb) = upload_bf16(ctx, "codebook_embeddings", &cb);
    // Plain tokens (scale 1) and audio rows mixing k residual codebooks at 1/sqrt(1 + k).
    let rows: Vec<EmbedRow> = (0..37)
        .map(|r| {
            let token = (ctx.rng.next_u64() % vocab as u64) as usize;
            let k = r % 4;
            let codebook_rows =
                (1..=k).map(|c| c * codebook_vocab + (ctx.rng.next_u64() % codebook_vocab as u64) as usize).collect();
            EmbedRow { token, codebook_rows, scale: 1.0 / ((1 + k) as f64).sqrt() }
        })
        .collect();
    let want = ctx.cpu.embed(&cpu_e, &cpu_cb, &rows);
    let got = ctx.cuda.to_host(&linear::embed(ctx.cuda, &gpu_e, &gpu_cb, &rows));
    // Only the final bf16 rounding differs (≈1e-3).
    ctx.rel_l2(format!("embed_gather [{}, {hidden}]", rows.len()), &got.data, &want.data, 4e-3);
}

fn restricted(ctx: &mut Ctx, vocab: usize, hidden: usize) {
    let head = ctx.random_bf16(vocab, hidden, 0.05);
    let (cpu_w, gpu_w) = upload_bf16(ctx, "lm_head", &head);
    // A semantic band, then EOS after it (the model's order).
    let (start, band) = (vocab as u32 / 6, (vocab as u32 / 3).min(4096));
    let eos = vocab as u32 - 7;
    let ids: Vec<u32> = (start..start + band).chain([eos]).collect();
    let hidden_rows = ctx.random_bf16(3, hidden, 2.0);
    let gpu_head = RestrictedHead::new(ctx.cuda, &ids);
    let gx = ctx.cuda.upload_matrix(&hidden_rows);
    for row in [0, 2] {
        let want = ctx.cpu.restricted_logits(&cpu_w, &ids, &hidden_rows, row);
        let got = gpu_head.logits_to_host(ctx.cuda, &gpu_w, &gx, row);
        // f32 against f64 accumulation only.
        ctx.rel_l2(format!("restricted_logits [{} ids of {vocab}, {hidden}] row {row}", ids.len()), &got, &want, 1e-4);
    }
}
