//! `limelight inspect`: validates a checkpoint directory and prints what it holds and what the
//! model will need on the device.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::checkpoint::Dtype;
use crate::model::config::LayerType;
use crate::model::load::Checkpoint;
use crate::model::memory::device_budget;
use crate::model::weights::CODEC_IGNORED_BUFFERS;

/// The human summary `inspect` prints.
pub fn summary(ckpt: &Checkpoint, context_length: usize) -> String {
    let (c, d, s, k) = (&ckpt.config, &ckpt.dims, &ckpt.special_tokens, &ckpt.codec_dims);
    let full = d.layer_types.iter().filter(|t| **t == LayerType::FullAttention).count();
    let mut o = String::new();
    let _ = writeln!(o, "checkpoint {} is valid", ckpt.dir.display());
    let _ = writeln!(
        o,
        "  model_type {}, template {}, text_config {}",
        c.model_type, c.speech_template_version, c.text_config.model_type
    );
    let _ = writeln!(
        o,
        "backbone: {} layers ({} gated deltanet, {} gated attention), hidden {}, vocab {}",
        d.layers,
        d.layers - full,
        full,
        d.hidden,
        d.vocab
    );
    let _ = writeln!(
        o,
        "  attention: {} heads, {} kv heads, head_dim {}, rotary {} dims, theta {}",
        d.heads, d.kv_heads, d.head_dim, d.rotary_dim, c.text_config.rope_parameters.rope_theta
    );
    let _ = writeln!(
        o,
        "  gated deltanet: {} key heads x {}, {} value heads x {}, conv kernel {}",
        d.gdn_key_heads, d.gdn_key_dim, d.gdn_value_heads, d.gdn_value_dim, d.gdn_conv_kernel
    );
    let _ = writeln!(
        o,
        "  moe: {} experts, top-{}, intermediate {}, shared expert {}, block-FP8 {}x{}",
        d.experts,
        d.experts_per_token,
        d.expert_intermediate,
        d.shared_expert_intermediate,
        d.fp8_block[0],
        d.fp8_block[1]
    );
    let _ = writeln!(
        o,
        "tower: {} layers ({} shared + {} residual), {} codebooks x {} codes, intermediate {}, {:?} with {} backbone codebooks",
        d.tower_layers(),
        d.tower_shared_layers,
        d.tower_residual_layers(),
        d.codebooks,
        d.codebook_vocab,
        d.tower_intermediate,
        c.audio_decoder_config.vq_feature_placement,
        d.vq_backbone_codebooks
    );
    let _ = writeln!(
        o,
        "codec: latent {}, codebooks {} + {}x{} of dim {}, decoder width {}, encoder width {}, transformers {}/{}/{} layers, {} samples per frame",
        k.latent,
        k.semantic_codebook_size,
        k.residual_codebooks,
        k.residual_codebook_size,
        k.codebook_dim,
        k.decoder_dim,
        k.encoder_dim,
        k.encoder_transformer_layers,
        k.pre_module_layers,
        k.post_module_layers,
        k.samples_per_frame()
    );
    let _ = writeln!(
        o,
        "tokenizer: {} ids; <|im_start|>={} <|im_end|>={} (eos) <|voice|>={} semantic {}..={} speakers {}..={}",
        s.vocab_len, s.im_start, s.im_end, s.voice, s.semantic_start, s.semantic_end, s.speakers[0], s.speakers[15]
    );
    let mut by_dtype: BTreeMap<Dtype, (usize, usize)> = BTreeMap::new();
    for (_, view) in ckpt.shards.names().filter_map(|n| ckpt.shards.get(n)) {
        let e = by_dtype.entry(view.dtype).or_default();
        e.0 += 1;
        e.1 += view.bytes.len();
    }
    let shards = ckpt.shards.shard_paths().count();
    let _ = writeln!(o, "shards: {} tensors in {} files", ckpt.shards.names().count(), shards);
    for (dtype, (n, bytes)) in &by_dtype {
        let _ = writeln!(o, "  {dtype:>8}: {n:>6} tensors, {}", human(*bytes));
    }
    let codec_params = ckpt.codec.tensors().filter(|(n, _)| !CODEC_IGNORED_BUFFERS.contains(n)).count();
    let _ = writeln!(
        o,
        "codec.pth: {} parameters, {} ignored buffers present",
        codec_params,
        ckpt.codec.tensors().count() - codec_params
    );
    let b = device_budget(ckpt, context_length);
    let _ = writeln!(o, "device memory (context {context_length} rows):");
    let _ = writeln!(o, "  model weights      {}", human(b.model_weights));
    let _ = writeln!(o, "  codec decode fp16  {}", human(b.codec_weights));
    let _ = writeln!(o, "  kv cache/request   {}", human(b.kv_cache_per_request));
    let _ = writeln!(o, "  gdn state/request  {}", human(b.recurrent_state_per_request));
    let _ = writeln!(o, "  total, 1 request   {}", human(b.total(1)));
    o
}

/// The decode batch's memory plan on the GPU, as `serve --device cuda` makes it: what one stream
/// costs and what each further stream adds (its KV caches, GDN states and codec state), and with
/// a `budget` how many streams fit (the default `--max-batch`).
#[cfg(feature = "cuda")]
pub fn batch_plan(ckpt: &Checkpoint, context_length: usize, prefill_chunk: usize, budget: Option<u64>) -> String {
    use crate::backend::cuda::admission::{MAX_STREAMS_CAP, MemoryPlan, gib};
    let mut o = String::new();
    let rows = prefill_chunk.min(context_length);
    // As serve plans by default: `--voice-cache-mib` at its default.
    let voice_cache = crate::scheduler::DEFAULT_VOICE_CACHE_BYTES as u64;
    let plan = |n| MemoryPlan::for_engine_streams(ckpt, context_length, rows, n).with_voice_cache(voice_cache);
    let (one, two) = (plan(1), plan(2));
    let _ = writeln!(o, "decode batch on the GPU (context {context_length}, {rows}-row prefill chunks):");
    let _ = writeln!(o, "  1 stream           {} = {one}", gib(one.total()));
    let _ = writeln!(
        o,
        "  each further stream adds {} (KV cache {}, tower KV cache {}, GDN state {}, codec state {})",
        gib(two.total() - one.total()),
        gib(two.kv_cache - one.kv_cache),
        gib(two.tower_kv_cache - one.tower_kv_cache),
        gib(two.recurrent_state - one.recurrent_state),
        gib(two.codec - one.codec)
    );
    match budget {
        Some(budget) => {
            let n = MemoryPlan::max_streams_with(ckpt, context_length, rows, voice_cache, budget, MAX_STREAMS_CAP);
            if n == 0 {
                let _ = writeln!(o, "  a budget of {} holds no stream", gib(budget));
            } else {
                let p = plan(n);
                let _ = writeln!(o, "  a budget of {} holds {n} streams: {} = {p}", gib(budget), gib(p.total()));
            }
        }
        None => {
            let _ = writeln!(o, "  (--gpu-memory-budget BYTES shows how many streams a budget holds)");
        }
    }
    o
}

/// Bytes in binary units with two decimals.
pub fn human(bytes: usize) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 { format!("{bytes} B") } else { format!("{v:.2} {}", UNITS[u]) }
}

#[cfg(all(test, feature = "cuda"))]
mod tests {
    use super::*;
    use crate::backend::cuda::admission::MemoryPlan;
    use crate::synth::presets::Preset;
    use crate::synth::{SynthOptions, SynthPlan};

    #[test]
    fn the_batch_plan_counts_the_streams_a_budget_holds() {
        let dir = tempfile::tempdir().unwrap();
        SynthPlan::new(&SynthOptions { preset: Preset::Tiny, seed: 3, vq_backbone_codebooks: 1 })
            .write(dir.path())
            .unwrap();
        let ckpt = Checkpoint::open(dir.path()).unwrap();
        // A budget of exactly three streams' plan (and the default voice cache) holds three, one
        // byte less holds two.
        let voice_cache = crate::scheduler::DEFAULT_VOICE_CACHE_BYTES as u64;
        let three = MemoryPlan::for_engine_streams(&ckpt, 512, 64, 3).total() + voice_cache;
        let text = batch_plan(&ckpt, 512, 64, Some(three));
        assert!(text.contains("holds 3 streams"), "{text}");
        assert!(batch_plan(&ckpt, 512, 64, Some(three - 1)).contains("holds 2 streams"));
        assert!(batch_plan(&ckpt, 512, 64, Some(1 << 20)).contains("holds no stream"));
        // Each further stream: 3 streams cost one stream plus twice the increment.
        let one = MemoryPlan::for_engine_streams(&ckpt, 512, 64, 1).total() + voice_cache;
        let two = MemoryPlan::for_engine_streams(&ckpt, 512, 64, 2).total() + voice_cache;
        assert_eq!(three - one, 2 * (two - one));
        assert!(batch_plan(&ckpt, 512, 64, None).contains("each further stream adds"));
    }
}
