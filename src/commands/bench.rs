//! `limelight bench backbone`: opens a checkpoint on the GPU (admitted against the memory
//! budget), then times a prefill and a run of decode rows through the backbone, and compares
//! decode with its floor (bytes a decode row must read / measured copy bandwidth).
//! Prints a summary and optionally writes every number as JSON for `docs/perf/`.

use std::time::Instant;

use anyhow::Context;
use serde::Serialize;

use crate::backend::backbone::ExpertActivations;
use crate::backend::cuda::admission::{MemoryPlan, admit, gib};
use crate::backend::cuda::{Cuda, CudaOptions};
use crate::cli::BenchBackboneArgs;
use crate::model::backbone::{Backbone, BackboneConfig};
use crate::model::config::{Dims, LayerType};
use crate::model::frame::Rows;
use crate::model::load::Checkpoint;
use crate::synth::rng::Rng;

/// Everything one run measured.
#[derive(Debug, Serialize)]
pub struct BackboneBench {
    pub gpu: String,
    pub model: String,
    pub budget_bytes: u64,
    pub plan_bytes: u64,
    pub plan: String,
    pub checkpoint_open_s: f64,
    pub upload_s: f64,
    pub weight_bytes: u64,
    pub upload_gb_per_s: f64,
    pub prompt_rows: usize,
    pub prefill_ms: f64,
    pub prefill_rows_per_s: f64,
    pub decode_rows: usize,
    /// Decode rows queued back to back (no host synchronisation between them).
    pub decode_ms_per_row_queued: f64,
    /// Each row followed by reading its restricted logits back (what sampling on the host costs).
    pub decode_ms_per_row_synced: f64,
    pub decode_bytes_per_row: u64,
    pub copy_bandwidth_gb_per_s: f64,
    pub decode_floor_ms: f64,
    pub decode_ratio_to_floor: f64,
    pub used_bytes_after: u64,
    pub peak_bytes: u64,
    pub pool_driver_allocations: u64,
    pub pool_allocations_after_seal: u64,
}

pub fn bench_backbone(args: &BenchBackboneArgs) -> anyhow::Result<BackboneBench> {
    let t = Instant::now();
    let ckpt = Checkpoint::open(&args.model).context("checkpoint refused")?;
    let checkpoint_open_s = t.elapsed().as_secs_f64();

    let options =
        CudaOptions { memory_budget: args.gpu_memory_budget, context: args.context_length, ..CudaOptions::default() };
    let cuda = Cuda::open(&options)?;
    let plan = MemoryPlan::for_model(&ckpt.dims, args.context_length, args.prompt_rows.max(64));
    let source = if args.gpu_memory_budget.is_some() { "--gpu-memory-budget" } else { "free memory minus the reserve" };
    admit(&plan, cuda.budget().cap() - cuda.budget().used(), source)?;

    let t = Instant::now();
    let weights = ckpt.upload_model_weights(&cuda).context("uploading the weights")?;
    cuda.synchronize();
    let upload_s = t.elapsed().as_secs_f64();
    let weight_bytes = cuda.weight_bytes() as u64;

    let mut config = BackboneConfig::from_model_config(&ckpt.config);
    config.moe.activations = ExpertActivations::Fp8Dynamic;
    let backbone = Backbone::new(&cuda, config, &weights.backbone, &weights.tower.codebook_embeddings)?;
    let prompt = bench_rows(&ckpt.dims, args.prompt_rows, 1);
    let decode_rows = bench_rows(&ckpt.dims, args.decode_rows, 2);

    // The same sequence twice: the first run (two decode rows) fills the activation pool with
    // everything the second needs at the same moments; then the pool is sealed and timed.
    run_once(&cuda, &backbone, &prompt, &decode_rows, 2)?;
    cuda.synchronize();
    cuda.pool().seal();
    let timing = run_once(&cuda, &backbone, &prompt, &decode_rows, decode_rows.len())?;

    let copy_bandwidth_gb_per_s = cuda.measure_copy_bandwidth(1 << 30)?;
    let position = args.prompt_rows + args.decode_rows / 2;
    let decode_bytes_per_row = decode_bytes_per_row(&ckpt.dims, position);
    let decode_floor_ms = decode_bytes_per_row as f64 / (copy_bandwidth_gb_per_s * 1e9) * 1e3;
    let stats = cuda.pool().stats();
    Ok(BackboneBench {
        gpu: cuda.info().name.clone(),
        model: args.model.display().to_string(),
        budget_bytes: cuda.budget().cap(),
        plan_bytes: plan.total(),
        plan: plan.to_string(),
        checkpoint_open_s,
        upload_s,
        weight_bytes,
        upload_gb_per_s: weight_bytes as f64 / upload_s / 1e9,
        prompt_rows: args.prompt_rows,
        prefill_ms: timing.prefill_ms,
        prefill_rows_per_s: args.prompt_rows as f64 / (timing.prefill_ms / 1e3),
        decode_rows: args.decode_rows,
        decode_ms_per_row_queued: timing.decode_ms_per_row_queued,
        decode_ms_per_row_synced: timing.decode_ms_per_row_synced,
        decode_bytes_per_row,
        copy_bandwidth_gb_per_s,
        decode_floor_ms,
        decode_ratio_to_floor: timing.decode_ms_per_row_queued / decode_floor_ms,
        used_bytes_after: cuda.budget().used(),
        peak_bytes: cuda.budget().peak(),
        pool_driver_allocations: stats.driver_allocations,
        pool_allocations_after_seal: stats.after_seal,
    })
}

struct Timing {
    prefill_ms: f64,
    decode_ms_per_row_queued: f64,
    decode_ms_per_row_synced: f64,
}

/// Prefills two requests with the prompt (the first timed), then decodes `decode` rows on each:
/// the first queued back to back, the second reading its restricted logits back after each row.
fn run_once(
    cuda: &Cuda,
    backbone: &Backbone<'_, Cuda>,
    prompt: &Rows,
    rows: &Rows,
    decode: usize,
) -> anyhow::Result<Timing> {
    let (mut queued, mut synced) = (backbone.new_state(), backbone.new_state());
    cuda.synchronize();
    let t = Instant::now();
    let hidden = backbone.prefill(&mut queued, prompt)?;
    backbone.restricted_logits(&hidden, hidden.rows - 1);
    let prefill_ms = t.elapsed().as_secs_f64() * 1e3;
    let hidden = backbone.prefill(&mut synced, prompt)?;
    backbone.restricted_logits(&hidden, hidden.rows - 1);

    let t = Instant::now();
    for r in 0..decode {
        backbone.decode(&mut queued, rows.row(r))?;
    }
    cuda.synchronize();
    let decode_ms_per_row_queued = t.elapsed().as_secs_f64() * 1e3 / decode.max(1) as f64;

    let t = Instant::now();
    for r in 0..decode {
        let h = backbone.decode(&mut synced, rows.row(r))?;
        backbone.restricted_logits(&h, 0);
    }
    let decode_ms_per_row_synced = t.elapsed().as_secs_f64() * 1e3 / decode.max(1) as f64;
    Ok(Timing { prefill_ms, decode_ms_per_row_queued, decode_ms_per_row_synced })
}

/// Deterministic rows shaped like a real prompt: text tokens, then semantic rows with codes.
fn bench_rows(d: &Dims, n: usize, seed: u64) -> Rows {
    let mut rng = Rng::new(seed);
    let width = 1 + d.codebooks;
    let mut flat = Vec::with_capacity(n * width);
    for t in 0..n {
        let semantic = t >= n / 4;
        let code = |rng: &mut Rng| (rng.next_u64() % d.codebook_vocab as u64) as u32;
        let c0 = code(&mut rng);
        let token = if semantic { d.semantic_start + c0 } else { (rng.next_u64() % 1000) as u32 };
        flat.push(token);
        flat.push(if semantic { c0 } else { 0 });
        for _ in 1..d.codebooks {
            flat.push(if semantic { code(&mut rng) } else { 0 });
        }
    }
    Rows::from_flat(d.codebooks, flat)
}

/// A bench's prompt: `text` built as a request's prompt is; with `rows`, the text repeated
/// until the prompt has at least that many rows, then cut to exactly `rows` (a bench times
/// shapes, so where the cut falls does not matter).
pub fn bench_prompt(ckpt: &Checkpoint, text: &str, rows: Option<usize>) -> anyhow::Result<Rows> {
    let builder = crate::request::prompt::PromptBuilder::for_checkpoint(ckpt);
    let prompt = builder.build(text, &[])?;
    let Some(rows) = rows else { return Ok(prompt) };
    anyhow::ensure!(rows > 0, "--prompt-rows 0");
    let mut long = prompt;
    let mut repeats = 1;
    while long.len() < rows {
        repeats *= 2;
        long = builder.build(&vec![text; repeats].join(" "), &[])?;
    }
    Ok(long.slice(0..rows))
}

/// Bytes one decode row must move at least: every dense weight of every layer once, the top-k
/// experts' FP8 weights and scales, the restricted head rows, the KV cache up to `position`,
/// and each GDN state read and written.
pub fn decode_bytes_per_row(d: &Dims, position: usize) -> u64 {
    let h = d.hidden;
    let bf16 = |rows: usize, cols: usize| (rows * cols * 2) as u64;
    let gdn = bf16(d.gdn_qkv_dim(), h)
        + bf16(d.gdn_value_total(), h)
        + 2 * bf16(d.gdn_value_heads, h)
        + bf16(h, d.gdn_value_total())
        + bf16(d.gdn_qkv_dim(), d.gdn_conv_kernel)
        + 2 * 4 * (d.gdn_value_heads * d.gdn_key_dim * d.gdn_value_dim) as u64;
    let kv_per_position = (2 * d.kv_heads * d.head_dim * 2) as u64;
    let attention = bf16(2 * d.heads * d.head_dim, h)
        + 2 * bf16(d.kv_heads * d.head_dim, h)
        + bf16(h, d.heads * d.head_dim)
        + kv_per_position * position as u64;
    let [br, bc] = d.fp8_block;
    let fp8 = |rows: usize, cols: usize| (rows * cols + rows.div_ceil(br) * cols.div_ceil(bc) * 4) as u64;
    let i = d.expert_intermediate;
    let moe = bf16(d.experts, h)
        + 3 * bf16(d.shared_expert_intermediate, h)
        + bf16(1, h)
        + d.experts_per_token as u64 * (2 * fp8(i, h) + fp8(h, i));
    let layers: u64 = d
        .layer_types
        .iter()
        .map(|t| match t {
            LayerType::LinearAttention => gdn,
            LayerType::FullAttention => attention,
        } + moe)
        .sum();
    let head = bf16(d.codebook_vocab + 1, h);
    layers + head
}

impl BackboneBench {
    pub fn summary(&self) -> String {
        format!(
            "GPU {gpu}\n\
             budget {budget}, plan {plan_total} ({plan})\n\
             checkpoint opened in {open:.2} s; weights {weights} uploaded in {up:.1} s ({upgb:.1} GB/s)\n\
             prefill {rows} rows: {pf:.1} ms ({rps:.0} rows/s)\n\
             decode {drows} rows: {dq:.3} ms/row queued, {ds:.3} ms/row with logits read back\n\
             decode floor: {bytes} bytes/row at {bw:.0} GB/s = {floor:.3} ms/row; measured/floor = {ratio:.1}\n\
             device memory: {used} in use, peak {peak}; pool: {allocs} driver allocations, {late} after warm-up",
            gpu = self.gpu,
            budget = gib(self.budget_bytes),
            plan_total = gib(self.plan_bytes),
            plan = self.plan,
            open = self.checkpoint_open_s,
            weights = gib(self.weight_bytes),
            up = self.upload_s,
            upgb = self.upload_gb_per_s,
            rows = self.prompt_rows,
            pf = self.prefill_ms,
            rps = self.prefill_rows_per_s,
            drows = self.decode_rows,
            dq = self.decode_ms_per_row_queued,
            ds = self.decode_ms_per_row_synced,
            bytes = self.decode_bytes_per_row,
            bw = self.copy_bandwidth_gb_per_s,
            floor = self.decode_floor_ms,
            ratio = self.decode_ratio_to_floor,
            used = gib(self.used_bytes_after),
            peak = gib(self.peak_bytes),
            allocs = self.pool_driver_allocations,
            late = self.pool_allocations_after_seal,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::presets::Preset;
    use crate::synth::{SynthOptions, SynthPlan};

    #[test]
    fn a_bench_prompt_has_the_rows_asked_for() {
        let dir = tempfile::tempdir().unwrap();
        SynthPlan::new(&SynthOptions { preset: Preset::Tiny, seed: 1, vq_backbone_codebooks: 1 })
            .write(dir.path())
            .unwrap();
        let ckpt = Checkpoint::open(dir.path()).unwrap();
        let own = bench_prompt(&ckpt, "Hello there.", None).unwrap();
        for rows in [1, own.len(), 200, 1000] {
            let prompt = bench_prompt(&ckpt, "Hello there.", Some(rows)).unwrap();
            assert_eq!(prompt.len(), rows);
            assert_eq!(prompt.row(0), own.row(0), "it starts as the text's own prompt");
        }
    }

    #[test]
    fn full_model_decode_floor_counts_dense_weights_and_top_k_experts() {
        let plan = SynthPlan::new(&SynthOptions { preset: Preset::Full, seed: 0, vq_backbone_codebooks: 1 });
        let d = plan.config.dims();
        let bytes = decode_bytes_per_row(&d, 0);
        // ~2.0 GB of GDN projections, ~0.5 GB attention, 40 × (8 experts × 3 MiB + dense MoE parts).
        let gb = bytes as f64 / 1e9;
        assert!((3.5..4.5).contains(&gb), "{gb} GB per decode row");
        // The KV cache adds 2 × 2 × 256 × 2 bytes per position per attention layer.
        assert_eq!(decode_bytes_per_row(&d, 100) - bytes, 10 * 100 * 2048);
        let rows = bench_rows(&d, 200, 1);
        assert_eq!(rows.len(), 200);
        assert!(rows.token(199) >= d.semantic_start);
    }
}
