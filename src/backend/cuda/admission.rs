//! Admission of a model against the device budget, before anything is uploaded: the weights as
//! the arena will place them (simulated with the same packing rule), the KV caches for the
//! configured context, the GDN states, the activation pool for the largest prefill, and the
//! cuBLASLt workspace. A model that does not fit is refused with every number.

use std::fmt;

use super::kernel_constants::{GDN_CHUNK, GDN_MAX_DK};
use super::memory::{ALIGN, WeightArena};
use super::resident_dtype;
use crate::model::codec::encode::MAX_REFERENCE_SECONDS;
use crate::model::config::{Dims, LayerType};
use crate::model::load::Checkpoint;
use crate::model::memory::{device_budget, encoder_weight_bytes, recurrent_state_bytes};
use crate::model::weights::{SpecRecorder, model_weights};

/// What the engine will hold on the device, in bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryPlan {
    /// Weight arena chunks (backbone and tower, resident dtypes, packed as the arena packs them).
    pub weights: u64,
    /// Full-attention KV caches (bf16 K and V) for `context` positions.
    pub kv_cache: u64,
    /// The tower's per-layer KV caches (bf16 K and V) for `context` positions.
    pub tower_kv_cache: u64,
    /// GDN conv windows and fp32 recurrent states.
    pub recurrent_state: u64,
    /// Activation pool for a prefill of `prefill_rows` rows (size classes round up to powers of two).
    pub activations: u64,
    /// The pool buffers a captured decode step holds for itself, out of the pool's reach while
    /// it lives (a step of every slot; 0 for the backbone alone).
    pub step_graph: u64,
    /// The codec: its FP16 decode-path weights and its streaming scratch (0 for the backbone alone).
    pub codec: u64,
    /// The codec encoder (voice cloning): its f32 weights in whole arena chunks and the scratch
    /// of the longest reference clip (0 for the backbone alone).
    pub encoder: u64,
    /// cuBLASLt workspace and small fixed tables.
    pub workspace: u64,
    /// The arena of saved voices' prompt state (`--voice-cache-mib`; 0 unless asked for).
    pub voice_cache: u64,
    pub context: usize,
    pub prefill_rows: usize,
    /// Streams whose states (KV caches, GDN states) are counted: the decode batch's slots.
    pub streams: usize,
}

impl MemoryPlan {
    pub fn total(&self) -> u64 {
        self.weights
            + self.kv_cache
            + self.tower_kv_cache
            + self.recurrent_state
            + self.activations
            + self.step_graph
            + self.codec
            + self.encoder
            + self.workspace
            + self.voice_cache
    }

    /// The plan with `bytes` reserved for saved voices' prompt state.
    pub fn with_voice_cache(self, bytes: u64) -> MemoryPlan {
        MemoryPlan { voice_cache: bytes, ..self }
    }

    /// Backbone and tower for one request at a time with `context` positions and prompts of up
    /// to `prefill_rows` rows.
    pub fn for_model(dims: &Dims, context: usize, prefill_rows: usize) -> MemoryPlan {
        MemoryPlan::for_streams(dims, context, prefill_rows, 1)
    }

    /// [`MemoryPlan::for_model`] with `streams` requests' states and a decode batch of as many rows.
    pub fn for_streams(dims: &Dims, context: usize, prefill_rows: usize, streams: usize) -> MemoryPlan {
        let n = streams as u64;
        MemoryPlan {
            weights: arena_bytes(dims),
            kv_cache: n * kv_cache_bytes(dims, context),
            tower_kv_cache: n * tower_kv_cache_bytes(dims, context),
            recurrent_state: n * recurrent_state_bytes(dims) as u64,
            activations: activation_bytes(dims, prefill_rows.max(streams)) + n * PREFILL_STREAM_SCRATCH_BYTES,
            step_graph: 0,
            codec: 0,
            encoder: 0,
            workspace: WORKSPACE_BYTES,
            voice_cache: 0,
            context,
            prefill_rows,
            streams,
        }
    }

    /// [`MemoryPlan::for_model`] plus the codec: the whole engine `serve` runs.
    pub fn for_engine(ckpt: &Checkpoint, context: usize, prefill_rows: usize) -> MemoryPlan {
        MemoryPlan::for_engine_streams(ckpt, context, prefill_rows, 1)
    }

    /// [`MemoryPlan::for_engine`] for a decode batch of `streams` slots.
    pub fn for_engine_streams(ckpt: &Checkpoint, context: usize, prefill_rows: usize, streams: usize) -> MemoryPlan {
        let codec_weights = device_budget(ckpt, context).codec_weights as u64;
        let encoder_weights = (encoder_weight_bytes(ckpt) as u64).next_multiple_of(WeightArena::CHUNK as u64);
        MemoryPlan {
            step_graph: activation_bytes(&ckpt.dims, streams),
            codec: codec_weights + CODEC_SCRATCH_BYTES + streams as u64 * CODEC_STREAM_BYTES,
            encoder: encoder_weights + encoder_scratch_bytes(MAX_REFERENCE_SECONDS),
            ..MemoryPlan::for_streams(&ckpt.dims, context, prefill_rows, streams)
        }
    }

    /// The most slots (up to `cap`) whose plan fits `budget` bytes; 0 if not even one does.
    pub fn max_streams(ckpt: &Checkpoint, context: usize, prefill_rows: usize, budget: u64, cap: usize) -> usize {
        MemoryPlan::max_streams_with(ckpt, context, prefill_rows, 0, budget, cap)
    }

    /// [`MemoryPlan::max_streams`] for plans with `voice_cache` bytes reserved.
    pub fn max_streams_with(
        ckpt: &Checkpoint,
        context: usize,
        prefill_rows: usize,
        voice_cache: u64,
        budget: u64,
        cap: usize,
    ) -> usize {
        let fits = |n| {
            let plan = MemoryPlan::for_engine_streams(ckpt, context, prefill_rows, n).with_voice_cache(voice_cache);
            plan.total() <= budget
        };
        let (mut lo, mut hi) = (0, cap);
        // The plan grows with n: the largest n that fits, by bisection.
        while lo < hi {
            let mid = (lo + hi).div_ceil(2);
            if fits(mid) { lo = mid } else { hi = mid - 1 }
        }
        lo
    }
}

/// The most slots a plan sized to the budget makes (`serve` without `--max-batch`, `inspect`).
pub const MAX_STREAMS_CAP: usize = 256;

/// Each stream's codec state (conv histories, attention windows, pending frames): an allowance
/// (the full-size codec's streaming state is a few MiB), counted per slot.
const CODEC_STREAM_BYTES: u64 = 16 << 20;

/// The codec's streaming state and the activations of its largest frame group (a generous
/// round figure: at full size a group of 8 frames peaks near 40 MiB of FP16 activations).
const CODEC_SCRATCH_BYTES: u64 = 256 << 20;

/// The GPU encoder's activations per second of reference audio: measured 60 MiB/s for a 10 s
/// clip and 76 MiB/s for 60 s on an empty pool (`docs/perf/2026-12-04-codec-encoder.md`). Planned
/// at 100: in a serving pool, already holding the decode batch's buffers in other size classes,
/// a 60 s warm-up took about 0.8 GiB more than 80 MiB/s allowed (voices run 2).
const ENCODER_SCRATCH_PER_SECOND: u64 = 100 << 20;

/// The activations the GPU encoder needs for a clip of `seconds`.
pub fn encoder_scratch_bytes(seconds: f64) -> u64 {
    (seconds.ceil() as u64) * ENCODER_SCRATCH_PER_SECOND
}

/// Activations per slot beyond [`activation_bytes`]: prompts prefilled together keep per-prompt
/// buffers (GDN chunk states, attention and tower segments) for the whole call. Measured: the
/// warm-up of 116 slots at full size left the pool 4.8 GB above a plan without this term
/// (`docs/perf/2026-12-04-codec-encoder.md`, voices run 3); 48 MiB a slot covers it.
const PREFILL_STREAM_SCRATCH_BYTES: u64 = 48 << 20;

/// cuBLASLt's workspace (32 MiB on sm_90+) plus expert pointer tables and head ids.
const WORKSPACE_BYTES: u64 = 48 << 20;

/// Bytes of arena chunks the weights will occupy, simulating `WeightArena::place` over the
/// name table in upload order.
pub fn arena_bytes(dims: &Dims) -> u64 {
    let mut recorder = SpecRecorder { specs: Vec::new() };
    model_weights(dims, &mut recorder).expect("the spec recorder accepts every tensor");
    let (mut chunks, mut room) = (0u64, 0usize);
    for spec in &recorder.specs {
        let numel: usize = spec.shape.iter().product();
        let bytes = (numel * resident_dtype(spec.accept).size()).max(1).next_multiple_of(ALIGN);
        if bytes > room {
            let chunk = bytes.max(WeightArena::CHUNK);
            chunks += chunk as u64;
            room = chunk;
        }
        room -= bytes;
    }
    chunks
}

fn full_attention_layers(d: &Dims) -> usize {
    d.layer_types.iter().filter(|t| **t == LayerType::FullAttention).count()
}

/// K and V, bf16, `[context, kv_heads, head_dim]` per full-attention layer.
pub fn kv_cache_bytes(d: &Dims, context: usize) -> u64 {
    (full_attention_layers(d) * 2 * context * d.kv_heads * d.head_dim * 2) as u64
}

/// K and V, bf16, `[context, kv_heads, head_dim]` per tower layer (the config requires the tower's
/// heads to match the backbone's).
pub fn tower_kv_cache_bytes(d: &Dims, context: usize) -> u64 {
    (d.tower_layers() * 2 * context * d.kv_heads * d.head_dim * 2) as u64
}

/// Activations live at once during a prefill of `rows` rows, doubled for the pool's
/// power-of-two size classes: the residual and normed rows, the widest mixer intermediates
/// (q|gate projection, qkv + z + conv output, the f32 core output and, for GDN, the chunked
/// core's scratch: q and k, W and C as bf16 hi + lo in rows of `GDN_MAX_DK` (gdn_chunk.cuh's
/// header), U and the decays), and the MoE's per-slot rows and expert intermediates in f32.
pub fn activation_bytes(d: &Dims, rows: usize) -> u64 {
    let h = d.hidden;
    let attention = d.heads * d.head_dim * 2 + 2 * d.kv_heads * d.head_dim + d.heads * d.head_dim;
    let gdn = 2 * d.gdn_qkv_dim() + 2 * d.gdn_value_total() + 2 * d.gdn_value_heads;
    let mixer_bf16 = attention.max(gdn);
    // In f32 units: hi + lo is two bf16, one f32's bytes.
    let gdn_chunks =
        2 * d.gdn_key_heads * GDN_MAX_DK + d.gdn_value_heads * (GDN_MAX_DK + GDN_CHUNK + 2) + d.gdn_value_total();
    let mixer_f32 = (d.gdn_value_total() + gdn_chunks).max(d.heads * d.head_dim);
    let k = d.experts_per_token;
    let moe_f32 = k * (h + 2 * d.expert_intermediate) + d.experts + 2 * d.shared_expert_intermediate;
    let moe_fp8 = h + d.expert_intermediate * k;
    let per_row = 2 * (4 * h + mixer_bf16) + 4 * (mixer_f32 + moe_f32) + moe_fp8;
    (2 * rows * per_row) as u64 + (64 << 20)
}

/// The model does not fit in the budget.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the model does not fit in the GPU memory budget: it needs {plan} = {} in total, the budget is {} ({})",
    gib(plan.total()), gib(*budget), budget_source)]
pub struct NotAdmitted {
    pub plan: Box<MemoryPlan>,
    pub budget: u64,
    pub budget_source: String,
}

/// Refuses a plan larger than `budget` (bytes still free under the cap).
pub fn admit(plan: &MemoryPlan, budget: u64, budget_source: &str) -> Result<(), NotAdmitted> {
    if plan.total() <= budget {
        Ok(())
    } else {
        Err(NotAdmitted { plan: Box::new(plan.clone()), budget, budget_source: budget_source.to_owned() })
    }
}

pub fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
}

impl fmt::Display for MemoryPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "weights {} + KV cache {} ({} streams × {} positions) + tower KV cache {} + GDN state {} + \
             activations {} ({}-row prefill) + step graph {} + codec {} + encoder {} + workspace {} + voice cache {}",
            gib(self.weights),
            gib(self.kv_cache),
            self.streams,
            self.context,
            gib(self.tower_kv_cache),
            gib(self.recurrent_state),
            gib(self.activations),
            self.prefill_rows,
            gib(self.step_graph),
            gib(self.codec),
            gib(self.encoder),
            gib(self.workspace),
            gib(self.voice_cache)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::presets::Preset;

    fn full() -> Dims {
        let plan = crate::synth::SynthPlan::new(&crate::synth::SynthOptions {
            preset: Preset::Full,
            seed: 0,
            vq_backbone_codebooks: 1,
        });
        plan.config.dims()
    }

    #[test]
    fn full_model_plan_matches_its_arithmetic() {
        let d = full();
        let plan = MemoryPlan::for_model(&d, 16384, 4096);
        // 10 attention layers × K,V × 16384 × 2 kv heads × 256 × bf16 = 320 MiB; 13 tower layers: 416 MiB.
        assert_eq!(plan.kv_cache, 320 << 20);
        assert_eq!(plan.tower_kv_cache, 416 << 20);
        // 30 GDN layers × (3 × 8192 conv + 32 × 128 × 128 state) × f32.
        assert_eq!(plan.recurrent_state, 30 * (3 * 8192 + 32 * 128 * 128) * 4);
        // Weights: FP8 experts (30 GiB) + bf16 rest; whole 1 GiB chunks.
        assert_eq!(plan.weights % (1 << 30), 0);
        let gib = plan.weights >> 30;
        assert!((36..=40).contains(&gib), "weights {gib} GiB");
        assert!(admit(&plan, 139 << 30, "free").is_ok());
    }

    #[test]
    fn refusal_names_every_number() {
        let d = full();
        let plan = MemoryPlan::for_model(&d, 16384, 4096);
        let err = admit(&plan, 24 << 30, "--gpu-memory-budget").unwrap_err();
        let text = err.to_string();
        for part in [
            "weights",
            "KV cache",
            "16384 positions",
            "tower KV cache",
            "codec",
            "GDN state",
            "4096-row prefill",
            "24.00 GiB",
            "--gpu-memory-budget",
        ] {
            assert!(text.contains(part), "{part} missing from: {text}");
        }
    }

    #[test]
    fn the_engine_plan_adds_the_codec_to_the_model_plan() {
        let dir = tempfile::tempdir().unwrap();
        let options = crate::synth::SynthOptions { preset: Preset::Tiny, seed: 1, vq_backbone_codebooks: 1 };
        crate::synth::SynthPlan::new(&options).write(dir.path()).unwrap();
        let ckpt = Checkpoint::open(dir.path()).unwrap();
        let model = MemoryPlan::for_model(&ckpt.dims, 4096, 256);
        let engine = MemoryPlan::for_engine(&ckpt, 4096, 256);
        let codec_weights = device_budget(&ckpt, 4096).codec_weights as u64;
        assert!(codec_weights > 0);
        // One slot: the codec's weights, its shared scratch and one stream's state.
        assert_eq!(engine.codec, codec_weights + CODEC_SCRATCH_BYTES + CODEC_STREAM_BYTES);
        // The captured decode step's own buffers: a step of every slot.
        assert_eq!(engine.step_graph, activation_bytes(&ckpt.dims, 1));
        assert_eq!(engine.total(), model.total() + engine.step_graph + engine.codec + engine.encoder);
        // The encoder: its f32 weights in whole arena chunks and a 60 s clip's scratch.
        assert_eq!(engine.encoder, WeightArena::CHUNK as u64 + encoder_scratch_bytes(MAX_REFERENCE_SECONDS));
        // Each further slot adds its own codec state on top of its model states.
        let four = MemoryPlan::for_engine_streams(&ckpt, 4096, 256, 4);
        assert_eq!(four.codec, engine.codec + 3 * CODEC_STREAM_BYTES);
        assert_eq!(four.step_graph, activation_bytes(&ckpt.dims, 4));
        assert_eq!(
            four.total(),
            MemoryPlan::for_streams(&ckpt.dims, 4096, 256, 4).total() + four.step_graph + four.codec + four.encoder
        );
        // 13 tower layers (4 shared + 9 residual) hold K and V for every position.
        let d = &ckpt.dims;
        assert_eq!(model.tower_kv_cache, (d.tower_layers() * 2 * 4096 * d.kv_heads * d.head_dim * 2) as u64);
    }

    #[test]
    fn the_voice_cache_is_a_term_of_the_plan_and_costs_slots() {
        let dir = tempfile::tempdir().unwrap();
        let options = crate::synth::SynthOptions { preset: Preset::Tiny, seed: 1, vq_backbone_codebooks: 1 };
        crate::synth::SynthPlan::new(&options).write(dir.path()).unwrap();
        let ckpt = Checkpoint::open(dir.path()).unwrap();
        let plain = MemoryPlan::for_engine_streams(&ckpt, 4096, 256, 4);
        let cached = plain.clone().with_voice_cache(1 << 30);
        assert_eq!(cached.total(), plain.total() + (1 << 30));
        assert!(cached.to_string().contains("voice cache 1.00 GiB"), "{cached}");
        // A budget of exactly the cached plan holds its 4 slots; without the cache it holds more.
        let slots = |cache| MemoryPlan::max_streams_with(&ckpt, 4096, 256, cache, cached.total(), MAX_STREAMS_CAP);
        assert_eq!(slots(1 << 30), 4);
        assert!(slots(0) > 4);
    }

    #[test]
    fn arena_simulation_packs_small_tensors_into_one_chunk() {
        let plan = crate::synth::SynthPlan::new(&crate::synth::SynthOptions {
            preset: Preset::Tiny,
            seed: 0,
            vq_backbone_codebooks: 1,
        });
        assert_eq!(arena_bytes(&plan.config.dims()), WeightArena::CHUNK as u64);
    }
}
