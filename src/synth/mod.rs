//! Writes random-weight checkpoints in the exact published `fishaudio/drama-3` layout:
//! `config.json`, `tokenizer.json`, `model.safetensors.index.json` with its shards, and
//! `codec.pth`. Deterministic for a given preset, seed and placement; streams tensor by tensor,
//! so the full-size preset never sits in memory.

pub mod fill;
pub mod presets;
pub mod pth_writer;
pub mod rng;
pub mod shards;
pub mod tokenizer;

use std::io;
use std::path::Path;

use presets::{Preset, PresetDims, TokenIds, model_config};
use tokenizer::{TokenizerSpec, build_tokenizer_json};

use crate::checkpoint::tokenizer::SpecialTokenIds;
use crate::model::config::ModelConfig;
use crate::model::load::{CODEC_FILE, CONFIG_FILE, TOKENIZER_FILE};
use crate::model::weights::{SpecRecorder, TensorSpec, codec_buffer_specs, codec_weights, model_weights};

/// What to synthesize.
#[derive(Clone, Debug)]
pub struct SynthOptions {
    pub preset: Preset,
    pub seed: u64,
    /// Residual codebooks summed into the backbone input; 0 selects `mtp_shared_pre`.
    pub vq_backbone_codebooks: usize,
}

/// The planned checkpoint: config, tokenizer and every tensor spec, before anything is written.
pub struct SynthPlan {
    pub seed: u64,
    pub config: ModelConfig,
    pub tokenizer_json: String,
    pub special_tokens: SpecialTokenIds,
    pub model_specs: Vec<TensorSpec>,
    pub codec_specs: Vec<TensorSpec>,
    /// Target bytes per shard; the split itself is made when writing.
    pub shard_bytes: usize,
    /// Factor on the init of every residual branch's output projection (1: the default). A
    /// small factor makes a better-conditioned random model: each layer perturbs the residual
    /// stream a little, so a rounding upstream (or a flipped near-tie expert choice) moves the
    /// output a little instead of decorrelating it, and end-to-end comparisons of two
    /// backends can use absolute bounds.
    pub residual_scale: f32,
}

impl SynthPlan {
    pub fn new(opts: &SynthOptions) -> SynthPlan {
        let p: PresetDims = opts.preset.dims();
        let (tokenizer_json, special_tokens) = build_tokenizer_json(&TokenizerSpec {
            n_merges: p.bpe_merges,
            semantic_codes: p.codebook_vocab,
            seed: opts.seed,
        });
        let ids = TokenIds {
            semantic_start: special_tokens.semantic_start,
            eos: special_tokens.eos(),
            tokenizer_len: special_tokens.vocab_len as usize,
        };
        let config = model_config(&p, &ids, opts.vq_backbone_codebooks);
        config.validate().expect("presets satisfy every config rule");
        let mut rec = SpecRecorder::default();
        model_weights(&config.dims(), &mut rec).expect("recording never fails");
        let model_specs = rec.specs;
        let mut rec = SpecRecorder::default();
        codec_weights(&p.codec, &mut rec).expect("recording never fails");
        let mut codec_specs = rec.specs;
        codec_specs.extend(codec_buffer_specs(&p.codec));
        // At least four shards even for small presets, so layers straddle shard boundaries.
        let shard_bytes = p.shard_bytes.min(total_bytes(&model_specs) / 4 + 1);
        SynthPlan {
            seed: opts.seed,
            config,
            tokenizer_json,
            special_tokens,
            model_specs,
            codec_specs,
            shard_bytes,
            residual_scale: 1.0,
        }
    }

    /// Which model specs go into which shard.
    /// The plan with residual branches' init scaled by `scale` (see `residual_scale`).
    pub fn with_residual_scale(mut self, scale: f32) -> SynthPlan {
        self.residual_scale = scale;
        self
    }

    pub fn shards(&self) -> Vec<Vec<usize>> {
        shards::plan_shards(&self.model_specs, self.shard_bytes)
    }

    pub fn model_bytes(&self) -> usize {
        total_bytes(&self.model_specs)
    }

    pub fn codec_bytes(&self) -> usize {
        total_bytes(&self.codec_specs)
    }

    /// Writes the whole checkpoint into `dir` (created if needed).
    pub fn write(&self, dir: &Path) -> io::Result<()> {
        let seed = self.seed;
        std::fs::create_dir_all(dir)?;
        std::fs::write(dir.join(CONFIG_FILE), self.config.to_json_pretty() + "\n")?;
        std::fs::write(dir.join(TOKENIZER_FILE), &self.tokenizer_json)?;
        let scale = self.residual_scale;
        shards::write_shards(dir, &self.model_specs, &self.shards(), |s| fill::tensor_bytes_scaled(s, seed, scale))?;
        let codec_tensors = self.codec_specs.iter().map(|s| pth_writer::PthTensorOut {
            name: s.name.clone(),
            dtype: s.stored,
            shape: s.shape.clone(),
            data: fill::tensor_bytes(s, seed),
        });
        // torch draws a random serialization id; ours derives from the seed so output is reproducible.
        let serialization_id = format!("{:040}", u128::from(rng::fnv1a(&seed.to_le_bytes())));
        pth_writer::write_state_dict_with_id(&dir.join(CODEC_FILE), codec_tensors, &serialization_id)
    }
}

fn total_bytes(specs: &[TensorSpec]) -> usize {
    specs.iter().map(TensorSpec::stored_bytes).sum()
}
