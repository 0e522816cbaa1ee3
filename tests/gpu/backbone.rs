//! The backbone end to end on the tiny checkpoint, GPU against CPU (both with the serving
//! engines' dynamic FP8 expert activations): every layer teacher-forced (the CPU's input to the
//! layer, rounded to bf16, through the GPU's layer), then the prompt → decode sequence through
//! `model::backbone` on each backend: final-norm hidden rows, restricted-logit KL and top-1
//! agreement, and the decode path's allocations after warm-up.

use limelight::backend::BackendTypes;
use limelight::backend::backbone::{BackboneOps, ExpertActivations};
use limelight::backend::cpu::{Cpu, CpuWeight, Matrix};
use limelight::backend::cuda::Cuda;
use limelight::backend::cuda::tensor::{GpuWeight, round_to_bf16};
use limelight::model::backbone::{Backbone, BackboneConfig, Stage};
use limelight::model::frame::Rows;
use limelight::model::load::Checkpoint;
use limelight::model::weights::{BackboneLayer, Mixer, ModelWeights};
use limelight::synth::presets::Preset;
use limelight::synth::{SynthOptions, SynthPlan};

use crate::harness::Ctx;

const PROMPT_ROWS: usize = 70;
const DECODE_ROWS: usize = 8;
/// One layer in bf16 against the f32 CPU layer.
const LAYER_BOUND: f64 = 1e-2;
/// `verification.md`: teacher-forced end to end.
const KL_BOUND: f64 = 1e-3;
const TOP1_BOUND: f64 = 0.99;

pub fn run(ctx: &mut Ctx) {
    let dir = tempfile::tempdir().expect("temporary directory");
    let plan =
        SynthPlan::new(&SynthOptions { preset: Preset::Tiny, seed: ctx.rng.next_u64(), vq_backbone_codebooks: 1 });
    plan.write(dir.path()).expect("write the tiny checkpoint");
    let ckpt = Checkpoint::open(dir.path()).expect("open the tiny checkpoint");
    let cpu_weights = ckpt.upload_model_weights(&Cpu).expect("CPU upload");
    let gpu_weights = ckpt.upload_model_weights(ctx.cuda).expect("GPU upload");
    let mut config = BackboneConfig::from_model_config(&ckpt.config);
    config.moe.activations = ExpertActivations::Fp8Dynamic;
    let rows = random_rows(ctx, &config, PROMPT_ROWS + DECODE_ROWS);

    per_layer(ctx, &config, &cpu_weights, &gpu_weights, &rows);
    sequence(ctx, &config, &cpu_weights, &gpu_weights, &rows);
}

/// Prompt-like rows: text tokens, then semantic rows with random codes.
fn random_rows(ctx: &mut Ctx, c: &BackboneConfig, n: usize) -> Rows {
    let mut flat = Vec::new();
    for t in 0..n {
        let semantic = t >= 12;
        let codes: Vec<u32> = (0..c.codebooks)
            .map(|_| if semantic { (ctx.rng.next_u64() % c.codebook_vocab as u64) as u32 } else { 0 })
            .collect();
        let token = if semantic { c.semantic_start + codes[0] } else { (ctx.rng.next_u64() % 200) as u32 };
        flat.push(token);
        flat.extend(codes);
    }
    Rows::from_flat(c.codebooks, flat)
}

/// Each layer teacher-forced: the CPU's input to layer `l`, rounded to bf16, through the GPU's
/// layer `l` with fresh state; compared with the CPU's output of that layer.
fn per_layer(
    ctx: &mut Ctx,
    c: &BackboneConfig,
    cpu_w: &ModelWeights<CpuWeight>,
    gpu_w: &ModelWeights<GpuWeight>,
    rows: &Rows,
) {
    let prompt = Rows::from_flat(c.codebooks, rows.as_flat()[..PROMPT_ROWS * rows.width()].to_vec());
    let cpu_bb =
        Backbone::new(&Cpu, c.clone(), &cpu_w.backbone, &cpu_w.tower.codebook_embeddings).expect("CPU backbone");
    let mut stages: Vec<(Stage, Matrix)> = Vec::new();
    let mut state = cpu_bb.new_state();
    cpu_bb.prefill_observed(&mut state, &prompt, &mut |s, x| stages.push((s, x.clone()))).expect("CPU prefill");
    let input_of = |l: usize| -> &Matrix {
        let want = if l == 0 { Stage::Embedding } else { Stage::Layer(l - 1) };
        &stages.iter().find(|(s, _)| *s == want).expect("observed stage").1
    };
    // The embedding itself.
    let gpu_bb =
        Backbone::new(ctx.cuda, c.clone(), &gpu_w.backbone, &gpu_w.tower.codebook_embeddings).expect("GPU backbone");
    let emb = ctx.cuda.to_host(&gpu_bb.embed(&prompt).expect("GPU embed"));
    let want_emb = input_of(0).clone();
    ctx.rel_l2(format!("backbone embedding [{PROMPT_ROWS} rows]"), &emb.data, &want_emb.data, LAYER_BOUND);
    for (l, layer) in gpu_w.backbone.layers.iter().enumerate() {
        let x = round_to_bf16(input_of(l));
        let want = &stages.iter().find(|(s, _)| *s == Stage::Layer(l)).expect("layer output").1;
        let got = gpu_layer(ctx.cuda, c, layer, &x);
        ctx.rel_l2(
            format!("backbone layer {l} teacher-forced [{PROMPT_ROWS} rows]"),
            &got.data,
            &want.data,
            LAYER_BOUND,
        );
    }
}

/// One decoder layer on the GPU through the seam, as `model::backbone` composes it.
fn gpu_layer(cuda: &Cuda, c: &BackboneConfig, layer: &BackboneLayer<GpuWeight>, x: &Matrix) -> Matrix {
    let mut gx = cuda.upload_matrix(x);
    let h = cuda.rms_norm(&gx, &layer.input_norm, c.norm_eps);
    let mixed = match &layer.mixer {
        Mixer::GatedDeltaNet(w) => {
            let mut s = cuda.new_gdn_state(&c.gdn);
            cuda.gdn_prefill(&c.gdn, w, &h, &mut s)
        }
        Mixer::Attention(w) => {
            let mut cache = cuda.new_kv_cache(&c.attention);
            cuda.attention_prefill(&c.attention, w, &h, &mut cache)
        }
    };
    let h = cuda.add_rms_norm(&mut gx, &mixed, &layer.post_attention_norm, c.norm_eps);
    let moe = cuda.moe(&c.moe, &layer.moe, &h);
    cuda.add_in_place(&mut gx, &moe);
    cuda.to_host(&gx)
}

/// The prompt, then decode rows, through each backend's `Backbone`.
fn sequence(
    ctx: &mut Ctx,
    c: &BackboneConfig,
    cpu_w: &ModelWeights<CpuWeight>,
    gpu_w: &ModelWeights<GpuWeight>,
    rows: &Rows,
) {
    let cpu_bb =
        Backbone::new(&Cpu, c.clone(), &cpu_w.backbone, &cpu_w.tower.codebook_embeddings).expect("CPU backbone");
    let gpu_bb =
        Backbone::new(ctx.cuda, c.clone(), &gpu_w.backbone, &gpu_w.tower.codebook_embeddings).expect("GPU backbone");
    let prompt = Rows::from_flat(c.codebooks, rows.as_flat()[..PROMPT_ROWS * rows.width()].to_vec());
    let (mut cs, mut gs) = (cpu_bb.new_state(), gpu_bb.new_state());
    let want = cpu_bb.prefill(&mut cs, &prompt).expect("CPU prefill");
    let got = gpu_bb.prefill(&mut gs, &prompt).expect("GPU prefill");
    ctx.rel_l2(
        format!("backbone prefill final-norm hidden [{PROMPT_ROWS} rows]"),
        &ctx.cuda.to_host(&got).data,
        &want.data,
        2e-2,
    );

    let mut kl_worst = 0f64;
    let mut agree = 0usize;
    let mut compared = 0usize;
    let mut hidden_worst = 0f64;
    let mut compare =
        |ctx: &mut Ctx, cpu_h: &Matrix, gpu_h: &limelight::backend::cuda::tensor::GpuMatrix, row: usize| {
            let want = cpu_bb.restricted_logits(cpu_h, row);
            let got = gpu_bb.restricted_logits(gpu_h, row);
            kl_worst = kl_worst.max(kl(&want, &got));
            agree += usize::from(argmax(&want) == argmax(&got));
            compared += 1;
            let g = ctx.cuda.to_host(gpu_h);
            hidden_worst = hidden_worst.max(crate::harness::rel_l2(g.row(row), cpu_h.row(row)));
        };
    compare(ctx, &want, &got, PROMPT_ROWS - 1);
    // The first decode row warms the pool for one-row shapes; the rest must allocate nothing.
    let mut before = 0;
    for t in PROMPT_ROWS..PROMPT_ROWS + DECODE_ROWS {
        let want = cpu_bb.decode(&mut cs, rows.row(t)).expect("CPU decode");
        let got = gpu_bb.decode(&mut gs, rows.row(t)).expect("GPU decode");
        compare(ctx, &want, &got, 0);
        if t == PROMPT_ROWS {
            before = ctx.cuda.pool().stats().driver_allocations;
        }
    }
    let decode_allocations = ctx.cuda.pool().stats().driver_allocations - before;
    ctx.check(
        format!("backbone decode rows 2..{DECODE_ROWS}: driver allocations"),
        "count",
        "0".into(),
        decode_allocations.to_string(),
        decode_allocations == 0,
    );
    ctx.check(
        format!("backbone prompt→decode restricted logits ({compared} rows)"),
        "max KL",
        format!("{KL_BOUND:.0e}"),
        format!("{kl_worst:.2e}"),
        kl_worst <= KL_BOUND,
    );
    let rate = agree as f64 / compared as f64;
    ctx.check(
        format!("backbone prompt→decode main token top-1 ({compared} rows)"),
        "agreement",
        format!("≥ {TOP1_BOUND}"),
        format!("{agree}/{compared}"),
        rate >= TOP1_BOUND,
    );
    ctx.check(
        format!("backbone prompt→decode final-norm hidden ({compared} rows)"),
        "worst rel L2",
        "2e-2".into(),
        format!("{hidden_worst:.2e}"),
        hidden_worst <= 2e-2,
    );
}

/// KL(p ‖ q) of the softmaxes of two logit vectors, in f64.
fn kl(p_logits: &[f32], q_logits: &[f32]) -> f64 {
    let softmax = |l: &[f32]| {
        let m = l.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b as f64));
        let e: Vec<f64> = l.iter().map(|&v| (v as f64 - m).exp()).collect();
        let s: f64 = e.iter().sum();
        e.into_iter().map(|v| v / s).collect::<Vec<_>>()
    };
    let (p, q) = (softmax(p_logits), softmax(q_logits));
    if q.iter().any(|v| !v.is_finite()) {
        return f64::INFINITY;
    }
    p.iter().zip(&q).filter(|(a, _)| **a > 0.0).map(|(a, b)| a * (a / b.max(1e-300)).ln()).sum()
}

fn argmax(v: &[f32]) -> usize {
    v.iter().enumerate().fold((0, f32::NEG_INFINITY), |(bi, bv), (i, &x)| if x > bv { (i, x) } else { (bi, bv) }).0
}
