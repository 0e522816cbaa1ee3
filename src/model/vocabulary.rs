//! What building a prompt needs from the checkpoint: its tokenizer, and where the codec's codes
//! sit in the vocabulary. The worker publishes it once the model is loaded; the request layer
//! builds each request's rows with it (`request::prompt::PromptBuilder`) before queueing, so
//! nothing below the request layer knows the prompt's format.

use std::collections::HashSet;
use std::sync::Arc;

use tokenizers::Tokenizer;

use crate::checkpoint::tokenizer::SpecialTokenIds;
use crate::model::load::Checkpoint;

/// A loaded model's vocabulary. Clones share the tokenizer.
#[derive(Clone)]
pub struct Vocabulary {
    pub tokenizer: Arc<Tokenizer>,
    /// The id of code 0 of the semantic band (an audio row's token is `semantic_start + c0`).
    pub semantic_start: u32,
    /// `audio_decoder_config.num_codebooks`: codes per audio row.
    pub codebooks: usize,
    /// The code range of every codebook: the semantic band's size
    /// (`audio_decoder_config.vocab_size`, which the loader checks against it).
    pub codebook_size: usize,
    /// The tokenizer's special tokens other than speaker tags: caller text may hold none.
    pub control_tokens: Arc<ControlTokens>,
}

/// A tokenizer's special tokens other than its speaker tags (`<|speaker:N|>`, which the request
/// layer checks for form), as text. Each would become one control token of a prompt if caller
/// text held it. Found by looking up each `<|…|>` of a text in a set (the real tokenizer has
/// thousands, the semantic codes among them) and, for the few of another shape, by search.
#[derive(Debug, Default)]
pub struct ControlTokens {
    bracketed: HashSet<String>,
    other: Vec<String>,
}

impl ControlTokens {
    pub fn of(tokenizer: &Tokenizer) -> ControlTokens {
        let mut tokens = ControlTokens::default();
        for token in tokenizer.get_added_tokens_decoder().values().filter(|t| t.special) {
            let content = token.content.as_str();
            let bracketed =
                content.len() >= 4 && content.starts_with("<|") && content[2..].find("|>") == Some(content.len() - 4);
            if bracketed && content.starts_with("<|speaker:") {
                continue;
            }
            if bracketed {
                tokens.bracketed.insert(content.to_owned());
            } else if !content.is_empty() {
                tokens.other.push(content.to_owned());
            }
        }
        tokens.other.sort();
        tokens
    }

    /// The first control token in `text` (in text order for `<|…|>` tokens), if any.
    pub fn find(&self, text: &str) -> Option<String> {
        for (at, _) in text.match_indices("<|") {
            if let Some(end) = text[at + 2..].find("|>") {
                let candidate = &text[at..at + end + 4];
                if self.bracketed.contains(candidate) {
                    return Some(candidate.to_owned());
                }
            }
        }
        self.other.iter().find(|t| text.contains(t.as_str())).cloned()
    }
}

impl Vocabulary {
    pub fn new(tokenizer: Arc<Tokenizer>, special: &SpecialTokenIds, codebooks: usize) -> Vocabulary {
        Vocabulary {
            control_tokens: Arc::new(ControlTokens::of(&tokenizer)),
            tokenizer,
            semantic_start: special.semantic_start,
            codebooks,
            codebook_size: special.semantic_codes(),
        }
    }

    pub fn of(ckpt: &Checkpoint) -> Vocabulary {
        Vocabulary::new(Arc::clone(&ckpt.tokenizer), &ckpt.special_tokens, ckpt.dims.codebooks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_tokens_are_the_special_tokens_but_speaker_tags() {
        let dir = tempfile::tempdir().unwrap();
        crate::synth::SynthPlan::new(&crate::synth::SynthOptions {
            preset: crate::synth::presets::Preset::Tiny,
            seed: 0,
            vq_backbone_codebooks: 1,
        })
        .write(dir.path())
        .unwrap();
        let vocabulary = Vocabulary::of(&Checkpoint::open(dir.path()).unwrap());
        let control = &vocabulary.control_tokens;
        for token in ["<|endoftext|>", "<|audio_start|>", "<|im_start|>", "<|semantic:7|>"] {
            assert_eq!(control.find(&format!("x {token} y")).as_deref(), Some(token));
        }
        // The first in text order.
        assert_eq!(control.find("<|pad|> then <|endoftext|>").as_deref(), Some("<|pad|>"));
        for clean in ["<|speaker:3|> hi", "a <|endoftext b", "<| endoftext |>", "plain | text > here", "<||>"] {
            assert_eq!(control.find(clean), None, "{clean}");
        }
    }
}
