//! `kernels/attention.cu` against the CPU backend's gated attention: prefill at lengths crossing
//! the 64-row and 32-key tiles, prefill continuing a cache, decode after prefill (outputs and the
//! cache contents), decode deep into a long cache (large RoPE positions, many splits), GPU prefill
//! n + decode m against GPU prefill n + m, decode making no driver allocation after warm-up, and
//! several prompts prefilled in one call bit for bit as each alone (outputs and caches).
//! Tiny dims (hidden 256, heads 8/1, head_dim 32, rotary 8) and the real ones (2048, 16/2, 256, 64).

use half::bf16;
use limelight::backend::BackendTypes;
use limelight::backend::backbone::{AttentionShape, BackboneOps};
use limelight::backend::cpu::backbone::KvCache;
use limelight::backend::cpu::{CpuWeight, Matrix};
use limelight::backend::cuda::attention::{self, GpuKvCache};
use limelight::backend::cuda::tensor::GpuWeight;
use limelight::checkpoint::{Dtype, TensorView};
use limelight::model::weights::{AttentionWeights, TensorSpec};

use crate::harness::Ctx;

const BOUND: f64 = 1e-2;
/// Rows of the shared random input: the longest prefill.
const ROWS: usize = 200;

struct Case {
    name: &'static str,
    hidden: usize,
    shape: AttentionShape,
    /// Cache length of the long-context decode check.
    long: usize,
}

pub fn run(ctx: &mut Ctx) {
    ctx.cuda.pool().set_poison(true);
    let shape = |heads, kv_heads, head_dim, rotary_dim| AttentionShape {
        heads,
        kv_heads,
        head_dim,
        rotary_dim,
        rope_theta: 1e7,
        norm_eps: 1e-6,
    };
    let cases = [
        Case { name: "tiny", hidden: 256, shape: shape(8, 1, 32, 8), long: 5000 },
        Case { name: "real", hidden: 2048, shape: shape(16, 2, 256, 64), long: 16000 },
    ];
    for case in &cases {
        check_case(ctx, case);
    }
}

fn check_case(ctx: &mut Ctx, case: &Case) {
    let (name, s) = (case.name, &case.shape);
    let (cpu_w, gpu_w) = weights(ctx, case.hidden, s);
    let x = ctx.random_bf16(ROWS, case.hidden, 1.0);
    // Causal: the oracle's first T rows of a 200-row prefill are its T-row prefill.
    let mut cpu_cache = ctx.cpu.new_kv_cache(s);
    let want = ctx.cpu.attention_prefill(s, &cpu_w, &x, &mut cpu_cache);

    for t in [1, 63, 64, 65, 130, 200] {
        let mut cache = attention::new_cache(ctx.cuda, s, 256);
        let got = attention::prefill(ctx.cuda, s, &gpu_w, &ctx.cuda.upload_matrix(&rows(&x, 0, t)), &mut cache);
        let got = ctx.cuda.to_host(&got);
        ctx.rel_l2(format!("attention prefill [{name} T={t}]"), &got.data, &rows(&want, 0, t).data, BOUND);
        if t == ROWS {
            compare_cache(ctx, &format!("{name} T={t}"), &cache, &cpu_cache, t);
        }
    }

    // Chunked prefill: the second call starts mid-tile, its keys continue the cache.
    let mut cache = attention::new_cache(ctx.cuda, s, 256);
    attention::prefill(ctx.cuda, s, &gpu_w, &ctx.cuda.upload_matrix(&rows(&x, 0, 65)), &mut cache);
    let got = attention::prefill(ctx.cuda, s, &gpu_w, &ctx.cuda.upload_matrix(&rows(&x, 65, ROWS)), &mut cache);
    let got = ctx.cuda.to_host(&got);
    ctx.rel_l2(
        format!("attention prefill continuing a cache [{name} 65+135]"),
        &got.data,
        &rows(&want, 65, ROWS).data,
        BOUND,
    );

    check_decode(ctx, case, &gpu_w, &x, &want, &cpu_cache);
    check_many(ctx, case, &gpu_w);
    check_long_decode(ctx, case, &cpu_w, &gpu_w);
    check_capacity_panics(ctx, case, &gpu_w, &x);
}

/// Several prompts' chunks in one `prefill_many` (each continuing its own primed cache, lengths
/// on both sides of the 64-row tiles and of DECODE_MAX_ROWS): every output row and every cache
/// bit for bit as `prefill` gives each prompt alone.
fn check_many(ctx: &mut Ctx, case: &Case, gpu_w: &AttentionWeights<GpuWeight>) {
    const LENS: [usize; 6] = [65, 1, 130, 64, 7, 9];
    let (cuda, s) = (ctx.cuda, &case.shape);
    let primers: Vec<Matrix> = LENS.iter().map(|&n| ctx.random_bf16(n % 13 + 3, case.hidden, 1.0)).collect();
    let chunks: Vec<Matrix> = LENS.iter().map(|&n| ctx.random_bf16(n, case.hidden, 1.0)).collect();
    let primed = || -> Vec<GpuKvCache> {
        primers
            .iter()
            .map(|x| {
                let mut cache = attention::new_cache(cuda, s, 256);
                attention::prefill(cuda, s, gpu_w, &cuda.upload_matrix(x), &mut cache);
                cache
            })
            .collect()
    };
    let mut alone = primed();
    let alone_out: Vec<f32> = (alone.iter_mut().zip(&chunks))
        .flat_map(|(cache, x)| cuda.to_host(&attention::prefill(cuda, s, gpu_w, &cuda.upload_matrix(x), cache)).data)
        .collect();
    let mut together = primed();
    let all: Vec<f32> = chunks.iter().flat_map(|x| x.data.clone()).collect();
    let x = cuda.upload_matrix(&Matrix::from_vec(LENS.iter().sum(), case.hidden, all));
    let mut refs: Vec<&mut GpuKvCache> = together.iter_mut().collect();
    let y = cuda.to_host(&attention::prefill_many(cuda, s, gpu_w, &x, &LENS, &mut refs));
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
    let label = format!("attention prefill of {} prompts together vs each alone [{}]", LENS.len(), case.name);
    ctx.exact(format!("{label} output, bits"), &bits(&y.data), &bits(&alone_out));
    let caches = |c: &[GpuKvCache]| -> Vec<u32> {
        c.iter()
            .flat_map(|cache| bits(&cache.keys_to_host(cuda)).into_iter().chain(bits(&cache.values_to_host(cuda))))
            .collect()
    };
    ctx.exact(format!("{label} caches, bits"), &caches(&together), &caches(&alone));
    let lens: Vec<usize> = together.iter().map(|c| c.len).collect();
    let want: Vec<usize> = alone.iter().map(|c| c.len).collect();
    ctx.check(format!("{label} cache lengths"), "lengths", format!("{want:?}"), format!("{lens:?}"), lens == want);
}

/// Prefill 130, decode 3 single rows and one call of 2 rows; outputs and cache vs the oracle,
/// and the decoded rows vs one GPU prefill of all 135.
fn check_decode(
    ctx: &mut Ctx,
    case: &Case,
    gpu_w: &AttentionWeights<GpuWeight>,
    x: &Matrix,
    want: &Matrix,
    cpu_cache: &KvCache,
) {
    let (name, s, n) = (case.name, &case.shape, 130);
    let mut cache = attention::new_cache(ctx.cuda, s, 256);
    attention::prefill(ctx.cuda, s, gpu_w, &ctx.cuda.upload_matrix(&rows(x, 0, n)), &mut cache);
    let mut decoded = Vec::new();
    for r in n..n + 3 {
        let y = attention::decode(ctx.cuda, s, gpu_w, &ctx.cuda.upload_matrix(&rows(x, r, r + 1)), &mut cache);
        let got = ctx.cuda.to_host(&y);
        ctx.rel_l2(format!("attention decode [{name} pos {r}]"), &got.data, want.row(r), BOUND);
        decoded.extend(got.data);
    }
    let y = attention::decode(ctx.cuda, s, gpu_w, &ctx.cuda.upload_matrix(&rows(x, n + 3, n + 5)), &mut cache);
    let got = ctx.cuda.to_host(&y);
    ctx.rel_l2(
        format!("attention decode of 2 rows [{name} pos {}..{}]", n + 3, n + 5),
        &got.data,
        &rows(want, n + 3, n + 5).data,
        BOUND,
    );
    decoded.extend(got.data);
    compare_cache(ctx, &format!("{name} prefill {n} + decode 5"), &cache, cpu_cache, n + 5);

    let mut whole = attention::new_cache(ctx.cuda, s, 256);
    let y = attention::prefill(ctx.cuda, s, gpu_w, &ctx.cuda.upload_matrix(&rows(x, 0, n + 5)), &mut whole);
    let all = ctx.cuda.to_host(&y);
    ctx.rel_l2(
        format!("attention GPU prefill {n} + decode 5 vs prefill {} [{name}]", n + 5),
        &decoded,
        &rows(&all, n, n + 5).data,
        BOUND,
    );

    // Warm-up steps fill the pool's size classes; later steps must reuse them.
    let step = |cache: &mut GpuKvCache, r: usize| {
        let xr = ctx.cuda.upload_matrix(&rows(x, r, r + 1));
        drop(attention::decode(ctx.cuda, s, gpu_w, &xr, cache));
    };
    step(&mut cache, n + 5);
    step(&mut cache, n + 6);
    ctx.cuda.synchronize();
    let before = ctx.cuda.pool().stats().driver_allocations;
    step(&mut cache, n + 7);
    step(&mut cache, n + 8);
    ctx.cuda.synchronize();
    let after = ctx.cuda.pool().stats().driver_allocations;
    ctx.exact(format!("attention decode driver allocations after warm-up [{name}]"), &[after - before], &[0]);
}

/// Decode 2 rows after a cache of `case.long` random positions (the same bf16 values on both
/// sides): RoPE at large positions and the split/merge over many CTAs. Then every split count is
/// back at 0: each launch's last split reset its own.
fn check_long_decode(
    ctx: &mut Ctx,
    case: &Case,
    cpu_w: &AttentionWeights<CpuWeight>,
    gpu_w: &AttentionWeights<GpuWeight>,
) {
    let (name, s, len) = (case.name, &case.shape, case.long);
    let width = s.kv_heads * s.head_dim;
    // Keys of scale 3 make the softmax over 16k positions far from uniform.
    let keys = ctx.random_bf16(len, width, 3.0).data;
    let values = ctx.random_bf16(len, width, 1.0).data;
    let mut cpu_cache = KvCache { len, keys: keys.clone(), values: values.clone() };
    let mut cache = attention::new_cache(ctx.cuda, s, 16384);
    cache.load_from_host(ctx.cuda, &keys, &values);
    let x = ctx.random_bf16(2, case.hidden, 1.0);
    for r in 0..2 {
        let xr = rows(&x, r, r + 1);
        let want = ctx.cpu.attention_decode(s, cpu_w, &xr, &mut cpu_cache);
        let got = ctx.cuda.to_host(&attention::decode(ctx.cuda, s, gpu_w, &ctx.cuda.upload_matrix(&xr), &mut cache));
        ctx.rel_l2(format!("attention decode [{name} pos {}, capacity 16384]", len + r), &got.data, &want.data, BOUND);
    }
    let tail = |v: &[f32]| v[len * width..].to_vec();
    let (gk, gv) = (cache.keys_to_host(ctx.cuda), cache.values_to_host(ctx.cuda));
    ctx.rel_l2(
        format!("attention decode appended keys [{name} pos {len}..]"),
        &tail(&gk),
        &tail(&cpu_cache.keys),
        BOUND,
    );
    ctx.rel_l2(
        format!("attention decode appended values [{name} pos {len}..]"),
        &tail(&gv),
        &tail(&cpu_cache.values),
        BOUND,
    );
    let left = attention::merge_counts_left(ctx.cuda);
    ctx.exact(format!("attention decode split counts left non-zero [{name}]"), &[left], &[0]);
}

/// Rows past the capacity are refused before any launch.
fn check_capacity_panics(ctx: &mut Ctx, case: &Case, gpu_w: &AttentionWeights<GpuWeight>, x: &Matrix) {
    let s = &case.shape;
    let mut cache = attention::new_cache(ctx.cuda, s, 64);
    let xg = ctx.cuda.upload_matrix(&rows(x, 0, 65));
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        attention::prefill(ctx.cuda, s, gpu_w, &xg, &mut cache);
    }));
    ctx.check(
        format!("attention prefill past capacity panics [{} 65 rows, capacity 64]", case.name),
        "panicked",
        "yes".into(),
        if outcome.is_err() { "yes" } else { "no" }.into(),
        outcome.is_err() && cache.len == 0,
    );
}

fn compare_cache(ctx: &mut Ctx, what: &str, cache: &GpuKvCache, cpu: &KvCache, len: usize) {
    let n = len * cpu.keys.len() / cpu.len;
    ctx.check(
        format!("attention cache length [{what}]"),
        "len",
        len.to_string(),
        cache.len.to_string(),
        cache.len == len,
    );
    ctx.rel_l2(format!("attention cache keys [{what}]"), &cache.keys_to_host(ctx.cuda), &cpu.keys[..n], BOUND);
    ctx.rel_l2(format!("attention cache values [{what}]"), &cache.values_to_host(ctx.cuda), &cpu.values[..n], BOUND);
}

/// Rows `a..b` of `m`.
fn rows(m: &Matrix, a: usize, b: usize) -> Matrix {
    Matrix::from_vec(b - a, m.cols, m.data[a * m.cols..b * m.cols].to_vec())
}

/// Random attention weights, uploaded identically to both backends: bf16 matrices scaled so the
/// projections keep unit variance, zero-centred norm gains in [-0.5, 0.5] as f32.
fn weights(
    ctx: &mut Ctx,
    hidden: usize,
    s: &AttentionShape,
) -> (AttentionWeights<CpuWeight>, AttentionWeights<GpuWeight>) {
    let (h, hkv, hd) = (s.heads, s.kv_heads, s.head_dim);
    let mut matrix = |name: &str, out: usize, inp: usize| {
        let m = ctx.random_bf16(out, inp, (3.0 / inp as f32).sqrt());
        let bytes: Vec<u8> = m.data.iter().flat_map(|&v| bf16::from_f32(v).to_le_bytes()).collect();
        let spec = TensorSpec::linear(name, out, inp);
        let dims = [out, inp];
        let view = || TensorView { dtype: Dtype::BF16, shape: &dims, bytes: &bytes };
        (ctx.cpu.upload(&spec, view()), ctx.cuda.upload(&spec, view()))
    };
    let q_proj = matrix("q_proj", 2 * h * hd, hidden);
    let k_proj = matrix("k_proj", hkv * hd, hidden);
    let v_proj = matrix("v_proj", hkv * hd, hidden);
    let o_proj = matrix("o_proj", hidden, h * hd);
    let mut gain = || {
        let g = ctx.random(1, hd, 0.5).data;
        (ctx.cpu.upload_f32(&[hd], g.clone()), ctx.cuda.upload_f32(&[hd], g))
    };
    let q_norm = gain();
    let k_norm = gain();
    (
        AttentionWeights {
            q_proj: q_proj.0,
            k_proj: k_proj.0,
            v_proj: v_proj.0,
            o_proj: o_proj.0,
            q_norm: q_norm.0,
            k_norm: k_norm.0,
        },
        AttentionWeights {
            q_proj: q_proj.1,
            k_proj: k_proj.1,
            v_proj: v_proj.1,
            o_proj: o_proj.1,
            q_norm: q_norm.1,
            k_norm: k_norm.1,
        },
    )
}
