//! The tiny random checkpoint, written once per fuzzing process: its tokenizer and config are
//! what the targets that need a vocabulary use.

use std::sync::OnceLock;

use limelight::checkpoint::tokenizer::TokenizerExpectations;
use limelight::model::load::Checkpoint;
use limelight::request::prompt::PromptBuilder;
use limelight::synth::presets::Preset;
use limelight::synth::{SynthOptions, SynthPlan};

struct Tiny {
    builder: PromptBuilder,
    expect: TokenizerExpectations,
}

fn tiny() -> &'static Tiny {
    static TINY: OnceLock<Tiny> = OnceLock::new();
    TINY.get_or_init(|| {
        let dir = tempfile::tempdir().expect("a temporary folder");
        let plan = SynthPlan::new(&SynthOptions { preset: Preset::Tiny, seed: 7, vq_backbone_codebooks: 1 });
        plan.write(dir.path()).expect("the tiny checkpoint is written");
        let ckpt = Checkpoint::open(dir.path()).expect("the tiny checkpoint opens");
        let config = &ckpt.config;
        let expect = TokenizerExpectations {
            semantic_start: config.semantic_start_token_id,
            semantic_end: config.semantic_end_token_id,
            semantic_codes: config.audio_decoder_config.vocab_size,
            eos: config.eos_token_id,
        };
        Tiny { builder: PromptBuilder::for_checkpoint(&ckpt), expect }
    })
}

#[allow(dead_code)]
pub fn prompt_builder() -> PromptBuilder {
    tiny().builder.clone()
}

#[allow(dead_code)]
pub fn tokenizer_expectations() -> TokenizerExpectations {
    tiny().expect
}
