//! The Codebook-MTP tower on the GPU against the CPU backend.
//! - One tower layer with random weights at the tiny checkpoint's dims and the real ones: a
//!   prefill crossing the attention tiles, decode rows one at a time, and a call that rewrites
//!   the last cached position (as S1 overwrites its placeholder row), then the caches.
//! - Several requests' rows through one layer at once (`tower_layer_many`: lengths on both sides
//!   of the split decode's 4 rows and of the 64-row tile): outputs and caches bit for bit as
//!   each request alone.
//! - The unseen-codes sum and a codebook head.
//! - The whole tower on the tiny checkpoint through `model::tower`: teacher-forced prefill over
//!   prompt rows and generated frames, every layer's output and every head's logits, and the
//!   heads' top-1 codes.
//!
//! Each layer is fed the same bf16-rounded inputs on both sides, so its bound is the kernel bound
//! (rel L2 ≤ 1e-2; measured about 4.7e-3, run of 2026-12-02). Through `model::tower` the layers
//! chain their own outputs, and each adds its own rounding: the random tiny tower has no discrete
//! routing and neither damps nor amplifies much, so the deviations add up (measured: about 4.5e-3
//! more per layer over a prompt). Chained layer l is therefore bound by (l + 1) × 1e-2, the heads
//! by the last layer's bound plus one more. The heads' top-1 codes are judged row by row: where
//! the GPU's pick is not the CPU's best code, the CPU's logit gap between the two must be within
//! `NEAR_TIE_SIGMAS` times that row's RMS logit error (a near-tie that rounding may legitimately
//! swap; a swap needs the two entries' errors to differ by the gap, which at 6σ is a ~1e-5
//! event for independent errors). A share-of-rows rule failed a 9-row frame on one such swap
//! (H100), and a gap bound of head_bound × logit RMS failed one of 351 chained prompt rows (H200,
//! both 2026-12-02): the swap's gap is set by the row's actual error, not the layer bound.

use half::bf16;
use limelight::backend::BackendTypes;
use limelight::backend::cpu::{Cpu, CpuWeight, Matrix};
use limelight::backend::cuda::tensor::GpuWeight;
use limelight::backend::cuda::tower::GpuTowerKv;
use limelight::backend::tower::{TowerLayerInput, TowerManyInput, TowerOps, TowerShape, UnseenCodes};
use limelight::checkpoint::{Dtype, TensorView};
use limelight::model::frame::Rows;
use limelight::model::load::Checkpoint;
use limelight::model::tower::{Tower, TowerTrace};
use limelight::model::weights::{TensorSpec, TowerLayer};

use crate::harness::{Ctx, rel_l2};

const BOUND: f64 = 1e-2;
/// Prompt rows of the layer checks: crosses the 64-row prefill tile.
const PROMPT: usize = 70;
/// Decode rows after it, one call each.
const DECODE: usize = 3;

pub fn run(ctx: &mut Ctx) {
    let (_dir, ckpt) = ctx.tiny_checkpoint();
    let tiny = TowerShape::from_config(&ckpt.config);
    let real = TowerShape {
        dim: 2048,
        heads: 16,
        kv_heads: 2,
        head_dim: 256,
        rotary_dim: 64,
        rope_base: 1e7,
        norm_eps: 1e-6,
        intermediate: 6144,
        codebook_vocab: 4096,
    };
    for (name, shape) in [("tiny", &tiny), ("real", &real)] {
        layer_checks(ctx, name, shape);
        many_equals_alone(ctx, name, shape);
        unseen_and_head(ctx, name, shape);
    }
    whole_tower(ctx, &ckpt);
}

/// Rows `a..b` of `m`.
fn rows(m: &Matrix, a: usize, b: usize) -> Matrix {
    Matrix::from_vec(b - a, m.cols, m.data[a * m.cols..b * m.cols].to_vec())
}

fn random_codes(ctx: &mut Ctx, n: usize, below: usize) -> Vec<u32> {
    (0..n).map(|_| (ctx.rng.next_u64() % below as u64) as u32).collect()
}

fn random_mask(ctx: &mut Ctx, n: usize) -> Vec<bool> {
    (0..n).map(|_| ctx.rng.next_u64() % 10 < 7).collect()
}

/// Several requests' rows through one layer in one `tower_layer_many` call, each continuing its
/// own primed cache: every output row and every cache bit for bit as `tower_layer` alone.
fn many_equals_alone(ctx: &mut Ctx, name: &str, s: &TowerShape) {
    const LENS: [usize; 6] = [65, 3, 84, 1, 9, 4];
    let (_, gpu_w) = layer_weights(ctx, s);
    let cuda = ctx.cuda;
    let total: usize = LENS.iter().sum();
    let primers: Vec<usize> = LENS.iter().map(|&n| n % 7 + 2).collect();
    let hidden = ctx.random_bf16(total, s.dim, 1.0);
    let unseen = ctx.random_bf16(total, s.dim, 0.5);
    let codes = random_codes(ctx, total, s.codebook_vocab);
    let mask = random_mask(ctx, total);
    let primer_rows: Vec<Matrix> = primers.iter().map(|&p| ctx.random_bf16(p, s.dim, 1.0)).collect();
    let primer_codes: Vec<Vec<u32>> = primers.iter().map(|&p| random_codes(ctx, p, s.codebook_vocab)).collect();
    let primed = || {
        (0..LENS.len())
            .map(|i| {
                let mut kv = cuda.tower_kv(s);
                let h = cuda.upload_matrix(&primer_rows[i]);
                let mask = vec![true; primers[i]];
                let input = TowerLayerInput {
                    hidden: &h,
                    codes: &primer_codes[i],
                    label_semantic: &mask,
                    unseen: None,
                    start: 0,
                };
                cuda.tower_layer(s, &gpu_w, &mut kv, input).expect("GPU tower layer");
                kv
            })
            .collect::<Vec<_>>()
    };
    let mut alone = primed();
    let mut want = Vec::new();
    let mut first = 0;
    for (i, kv) in alone.iter_mut().enumerate() {
        let n = LENS[i];
        let (h, u) = (
            cuda.upload_matrix(&rows(&hidden, first, first + n)),
            cuda.upload_matrix(&rows(&unseen, first, first + n)),
        );
        let (c, m) = (&codes[first..first + n], &mask[first..first + n]);
        let input = TowerLayerInput { hidden: &h, codes: c, label_semantic: m, unseen: Some(&u), start: primers[i] };
        want.extend(cuda.to_host(&cuda.tower_layer(s, &gpu_w, kv, input).expect("GPU tower layer")).data);
        first += n;
    }
    let mut together = primed();
    let mut kvs: Vec<_> = together.iter_mut().collect();
    let (gh, gu) = (cuda.upload_matrix(&hidden), cuda.upload_matrix(&unseen));
    let input = TowerManyInput {
        hidden: &gh,
        codes: &codes,
        label_semantic: &mask,
        unseen: Some(&gu),
        starts: &primers,
        lens: &LENS,
    };
    let got = cuda.to_host(&cuda.tower_layer_many(s, &gpu_w, &mut kvs, input).expect("GPU tower layers")).data;
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
    let label = format!("tower layer of {} requests together vs each alone [{name}]", LENS.len());
    ctx.exact(format!("{label} output, bits"), &bits(&got), &bits(&want));
    let caches = |kvs: &[GpuTowerKv]| -> Vec<u32> {
        kvs.iter()
            .flat_map(|kv| bits(&kv.cache.keys_to_host(cuda)).into_iter().chain(bits(&kv.cache.values_to_host(cuda))))
            .collect()
    };
    ctx.exact(format!("{label} caches, bits"), &caches(&together), &caches(&alone));
}

/// One layer with random weights: prefill, decode rows, a rewrite of the last position, caches.
fn layer_checks(ctx: &mut Ctx, name: &str, s: &TowerShape) {
    let (cpu_w, gpu_w) = layer_weights(ctx, s);
    let total = PROMPT + DECODE + 1;
    let hidden = ctx.random_bf16(total, s.dim, 1.0);
    // Codes past the table check the clamp; the unseen vector is layer 0's extra input.
    let codes = random_codes(ctx, total, s.codebook_vocab + 3);
    let mask = random_mask(ctx, total);
    let unseen = ctx.random_bf16(total, s.dim, 0.5);
    let mut cpu_kv = ctx.cpu.tower_kv(s);
    let mut gpu_kv = ctx.cuda.tower_kv(s);
    // (first row, rows, start): the prompt, decode rows, then the last decode row's position
    // again with a new row (a rewrite), as S1 replaces its placeholder label.
    let mut calls = vec![(0, PROMPT, 0)];
    calls.extend((0..DECODE).map(|i| (PROMPT + i, 1, PROMPT + i)));
    calls.push((PROMPT + DECODE, 1, PROMPT + DECODE - 1));
    for (first, n, start) in calls {
        let h = rows(&hidden, first, first + n);
        let u = rows(&unseen, first, first + n);
        let (c, m) = (&codes[first..first + n], &mask[first..first + n]);
        let input = TowerLayerInput { hidden: &h, codes: c, label_semantic: m, unseen: Some(&u), start };
        let want = ctx.cpu.tower_layer(s, &cpu_w, &mut cpu_kv, input).expect("CPU tower layer");
        let (gh, gu) = (ctx.cuda.upload_matrix(&h), ctx.cuda.upload_matrix(&u));
        let input = TowerLayerInput { hidden: &gh, codes: c, label_semantic: m, unseen: Some(&gu), start };
        let got = ctx.cuda.tower_layer(s, &gpu_w, &mut gpu_kv, input).expect("GPU tower layer");
        let got = ctx.cuda.to_host(&got);
        ctx.rel_l2(format!("tower layer [{name}, {n} rows at position {start}]"), &got.data, &want.data, BOUND);
    }
    let len = ctx.cuda.tower_kv_len(&gpu_kv);
    ctx.check(
        format!("tower cache length after the rewrite [{name}]"),
        "len",
        cpu_kv.len().to_string(),
        len.to_string(),
        len == cpu_kv.len(),
    );
    ctx.rel_l2(format!("tower cache keys [{name}]"), &gpu_kv.cache.keys_to_host(ctx.cuda), &cpu_kv.k, BOUND);
    ctx.rel_l2(format!("tower cache values [{name}]"), &gpu_kv.cache.values_to_host(ctx.cuda), &cpu_kv.v, BOUND);
}

fn unseen_and_head(ctx: &mut Ctx, name: &str, s: &TowerShape) {
    let (codebooks, first, n) = (10, 2, 33);
    let (cpu_table, gpu_table) = matrix(ctx, "codebook_embeddings", codebooks * s.codebook_vocab, s.dim, 0.5);
    let codes = random_codes(ctx, n * codebooks, s.codebook_vocab + 3);
    let row_semantic = random_mask(ctx, n);
    let u = UnseenCodes { codes: &codes, codebooks, first, row_semantic: &row_semantic };
    let want = ctx.cpu.tower_unseen(&cpu_table, s, &u);
    let got = ctx.cuda.to_host(&ctx.cuda.tower_unseen(&gpu_table, s, &u));
    ctx.rel_l2(format!("tower unseen codes [{name}, {n} rows]"), &got.data, &want.data, BOUND);

    let (cpu_head, gpu_head) = matrix(ctx, "head", s.codebook_vocab, s.dim, (3.0 / s.dim as f32).sqrt());
    for rows in [1, 9] {
        let x = ctx.random_bf16(rows, s.dim, 1.0);
        let want = ctx.cpu.tower_head(&cpu_head, &x);
        let got = ctx.cuda.to_host(&ctx.cuda.tower_head(&gpu_head, &ctx.cuda.upload_matrix(&x)));
        ctx.rel_l2(format!("tower head [{name}, {rows} rows]"), &got.data, &want.data, BOUND);
    }
}

/// The whole tower through `model::tower` on the tiny checkpoint: prompt prefill, then frames.
fn whole_tower(ctx: &mut Ctx, ckpt: &Checkpoint) {
    let (cpu, cuda) = (Cpu, ctx.cuda);
    let cpu_w = ckpt.upload_model_weights(&cpu).expect("CPU upload");
    let gpu_w = ckpt.upload_model_weights(cuda).expect("GPU upload");
    let cpu_tower = Tower::new(&cpu, &cpu_w.tower, &ckpt.config).expect("CPU tower");
    let gpu_tower = Tower::new(cuda, &gpu_w.tower, &ckpt.config).expect("GPU tower");
    let s = cpu_tower.shape().clone();
    let frames = 3;
    let all = prompt_rows(ctx, ckpt, 40 + frames + 1);
    let prompt = Rows::from_flat(all.codebooks(), all.as_flat()[..40 * all.width()].to_vec());
    let hidden = ctx.random_bf16(all.len(), s.dim, 1.0);
    let (mut cpu_state, mut gpu_state) = (cpu_tower.new_state(), gpu_tower.new_state());
    let want = cpu_tower.prefill_traced(&mut cpu_state, &rows(&hidden, 0, 40), &prompt).expect("CPU prefill");
    let gh = cuda.upload_matrix(&rows(&hidden, 0, 40));
    let got = gpu_tower.prefill_traced(&mut gpu_state, &gh, &prompt).expect("GPU prefill");
    compare_traces(ctx, "prompt prefill, 39 rows", &got, &want);
    // Frames: the row at position p is the input, row p + 1 the teacher-forced next frame.
    for p in 39..39 + frames {
        let h = rows(&hidden, p, p + 1);
        let (input, next) = (all.row(p), all.row(p + 1));
        let want = cpu_tower.frame_traced(&mut cpu_state, &h, input, next).expect("CPU frame");
        let got = gpu_tower.frame_traced(&mut gpu_state, &cuda.upload_matrix(&h), input, next).expect("GPU frame");
        compare_traces(ctx, &format!("frame at position {p}"), &got, &want);
    }
}

/// Largest CPU logit gap, in row RMS errors, a swapped top-1 code may have (module comment).
const NEAR_TIE_SIGMAS: f64 = 6.0;

fn compare_traces(ctx: &mut Ctx, what: &str, got: &TowerTrace, want: &TowerTrace) {
    // Chained layer l: every layer up to it may add its own kernel bound (module comment).
    let chain_bound = |l: usize| (l + 1) as f64 * BOUND;
    for (l, (g, w)) in got.layers.iter().zip(&want.layers).enumerate() {
        ctx.rel_l2(format!("tower chained layer {l} [{what}]"), g, w, chain_bound(l));
    }
    let head_bound = chain_bound(got.layers.len());
    let (mut exact, mut swaps, mut total, mut worst, mut worst_swap) = (0, 0, 0, 0f64, 0f64);
    for (g, w) in got.heads.iter().zip(&want.heads) {
        worst = worst.max(rel_l2(g, w));
        let vocab = g.len() / got.rows;
        for (gr, wr) in g.chunks_exact(vocab).zip(w.chunks_exact(vocab)) {
            let (pick, best) = (argmax(gr), argmax(wr));
            total += 1;
            if pick == best {
                exact += 1;
                continue;
            }
            // A swap: the CPU's gap between its best and the GPU's pick, in units of this row's
            // RMS logit error (the error itself is bounded by the rel L2 row above).
            let sigma = (gr.iter().zip(wr).map(|(&a, &b)| f64::from(a - b).powi(2)).sum::<f64>() / vocab as f64).sqrt();
            worst_swap = worst_swap.max(f64::from(wr[best] - wr[pick]) / sigma.max(f64::MIN_POSITIVE));
            swaps += 1;
        }
    }
    ctx.check(
        format!("tower chained heads, worst of {} [{what}]", got.heads.len()),
        "rel L2",
        format!("{head_bound:.1e}"),
        format!("{worst:.2e}"),
        worst <= head_bound && got.heads.len() == want.heads.len(),
    );
    ctx.check(
        format!("tower chained heads top-1 code [{what}]: {exact} of {total} rows the CPU's best, {swaps} swapped"),
        "worst swap gap / row RMS error",
        format!("{NEAR_TIE_SIGMAS}"),
        format!("{worst_swap:.2}"),
        total > 0 && worst_swap <= NEAR_TIE_SIGMAS,
    );
}

fn argmax(v: &[f32]) -> usize {
    v.iter().enumerate().fold(0, |best, (i, &x)| if x > v[best] { i } else { best })
}

/// Prompt-like rows of the checkpoint's layout: text rows, then audio rows with random codes.
fn prompt_rows(ctx: &mut Ctx, ckpt: &Checkpoint, n: usize) -> Rows {
    let a = &ckpt.config.audio_decoder_config;
    let start = ckpt.config.semantic_start_token_id;
    let mut rows = Rows::new(a.num_codebooks);
    for t in 0..n {
        if t < 12 {
            rows.push_text((ctx.rng.next_u64() % 200) as u32);
        } else {
            let codes = random_codes(ctx, a.num_codebooks, a.vocab_size);
            rows.push_audio(start, &codes);
        }
    }
    rows
}

/// A random bf16 matrix uploaded identically to both backends.
fn matrix(ctx: &mut Ctx, name: &str, out: usize, inp: usize, scale: f32) -> (CpuWeight, GpuWeight) {
    let m = ctx.random_bf16(out, inp, scale);
    let bytes: Vec<u8> = m.data.iter().flat_map(|&v| bf16::from_f32(v).to_le_bytes()).collect();
    let spec = TensorSpec::linear(name, out, inp);
    let dims = [out, inp];
    let view = || TensorView { dtype: Dtype::BF16, shape: &dims, bytes: &bytes };
    (ctx.cpu.upload(&spec, view()), ctx.cuda.upload(&spec, view()))
}

/// A random zero-centred gain in [-0.5, 0.5], f32 on both backends.
fn gain(ctx: &mut Ctx, n: usize) -> (CpuWeight, GpuWeight) {
    let g = ctx.random(1, n, 0.5).data;
    (ctx.cpu.upload_f32(&[n], g.clone()), ctx.cuda.upload_f32(&[n], g))
}

/// Random tower-layer weights (projections scaled to keep unit variance).
fn layer_weights(ctx: &mut Ctx, s: &TowerShape) -> (TowerLayer<CpuWeight>, TowerLayer<GpuWeight>) {
    let (dim, inter) = (s.dim, s.intermediate);
    let scaled = |inp: usize| (3.0 / inp as f32).sqrt();
    let code_embedding = matrix(ctx, "code_embedding", s.codebook_vocab, dim, 0.5);
    let enorm = gain(ctx, dim);
    let hnorm = gain(ctx, dim);
    let eh_proj = matrix(ctx, "eh_proj", dim, 2 * dim, scaled(2 * dim));
    let wqkv = matrix(ctx, "wqkv", s.qkv_rows(), dim, scaled(dim));
    let wo = matrix(ctx, "wo", dim, s.heads * s.head_dim, scaled(s.heads * s.head_dim));
    let q_norm = gain(ctx, s.head_dim);
    let k_norm = gain(ctx, s.head_dim);
    let attention_norm = gain(ctx, dim);
    let ffn_norm = gain(ctx, dim);
    let w1 = matrix(ctx, "w1", inter, dim, scaled(dim));
    let w3 = matrix(ctx, "w3", inter, dim, scaled(dim));
    let w2 = matrix(ctx, "w2", dim, inter, scaled(inter));
    let final_norm = gain(ctx, dim);
    let cpu = TowerLayer {
        code_embedding: code_embedding.0,
        enorm: enorm.0,
        hnorm: hnorm.0,
        eh_proj: eh_proj.0,
        wqkv: wqkv.0,
        wo: wo.0,
        q_norm: q_norm.0,
        k_norm: k_norm.0,
        attention_norm: attention_norm.0,
        ffn_norm: ffn_norm.0,
        w1: w1.0,
        w3: w3.0,
        w2: w2.0,
        final_norm: final_norm.0,
    };
    let gpu = TowerLayer {
        code_embedding: code_embedding.1,
        enorm: enorm.1,
        hnorm: hnorm.1,
        eh_proj: eh_proj.1,
        wqkv: wqkv.1,
        wo: wo.1,
        q_norm: q_norm.1,
        k_norm: k_norm.1,
        attention_norm: attention_norm.1,
        ffn_norm: ffn_norm.1,
        w1: w1.1,
        w3: w3.1,
        w2: w2.1,
        final_norm: final_norm.1,
    };
    (cpu, gpu)
}
