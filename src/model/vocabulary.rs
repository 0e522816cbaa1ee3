//! What building a prompt needs from the checkpoint: its tokenizer, and where the codec's codes
//! sit in the vocabulary. The worker publishes it once the model is loaded; the request layer
//! builds each request's rows with it (`request::prompt::PromptBuilder`) before queueing, so
//! nothing below the request layer knows the prompt's format.

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
}

impl Vocabulary {
    pub fn new(tokenizer: Arc<Tokenizer>, special: &SpecialTokenIds, codebooks: usize) -> Vocabulary {
        Vocabulary {
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
