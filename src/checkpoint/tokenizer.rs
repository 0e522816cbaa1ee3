//! Loads `tokenizer.json` and resolves the special-token ids the prompt needs, refusing any file whose ids disagree with `config.json`.
//!
//! The prompt (spec §7) is built by encoding text segments such as `"<|im_start|>system\n"`, so every
//! structural token must be an *added* token that encodes to exactly one id, and generated codes map
//! to `<|semantic:N|>` ids by plain arithmetic, so that band must be contiguous and match the config.

use std::path::{Path, PathBuf};

use tokenizers::Tokenizer;

pub const ENDOFTEXT: &str = "<|endoftext|>";
pub const IM_START: &str = "<|im_start|>";
pub const IM_END: &str = "<|im_end|>";
pub const PAD: &str = "<|pad|>";
pub const TEXT: &str = "<|text|>";
pub const VOICE: &str = "<|voice|>";
pub const INTERLEAVE: &str = "<|interleave|>";
pub const AUDIO_START: &str = "<|audio_start|>";
pub const AUDIO_END: &str = "<|audio_end|>";
pub const AUDIO_PAD: &str = "<|audio_pad|>";
pub const PHONEME_START: &str = "<|phoneme_start|>";
pub const PHONEME_END: &str = "<|phoneme_end|>";

/// The Fish structural tokens in the order the S2-Pro tokenizer lists them (speakers and semantic codes follow).
pub const STRUCTURAL_TOKENS: [&str; 12] = [
    ENDOFTEXT,
    IM_START,
    IM_END,
    PAD,
    TEXT,
    VOICE,
    INTERLEAVE,
    AUDIO_START,
    AUDIO_END,
    AUDIO_PAD,
    PHONEME_START,
    PHONEME_END,
];

/// Speaker tags `<|speaker:0|>`..`<|speaker:15|>` (spec §7).
pub const SPEAKER_COUNT: usize = 16;

pub fn speaker_token(n: usize) -> String {
    format!("<|speaker:{n}|>")
}

pub fn semantic_token(code: usize) -> String {
    format!("<|semantic:{code}|>")
}

/// Ids resolved from `tokenizer.json`. Tokens the prompt or the validator needs are plain ids; the rest
/// of the Fish family are `Option`s, because Drama 3's exact set is unconfirmed and refusing a real
/// checkpoint over a token nothing uses would be worse than not knowing its id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpecialTokenIds {
    /// One past the largest id in the file (model vocabulary and added tokens): the rows an embedding needs.
    pub vocab_len: u32,
    pub im_start: u32,
    /// `<|im_end|>`, which is also `eos_token_id`.
    pub im_end: u32,
    pub voice: u32,
    pub text: u32,
    pub interleave: u32,
    pub speakers: [u32; SPEAKER_COUNT],
    /// Id of `<|semantic:0|>`; code c is `semantic_start + c`.
    pub semantic_start: u32,
    /// Id of the last semantic code (inclusive).
    pub semantic_end: u32,
    pub endoftext: Option<u32>,
    pub pad: Option<u32>,
    pub audio_start: Option<u32>,
    pub audio_end: Option<u32>,
    pub audio_pad: Option<u32>,
    pub phoneme_start: Option<u32>,
    pub phoneme_end: Option<u32>,
}

impl SpecialTokenIds {
    pub fn eos(&self) -> u32 {
        self.im_end
    }

    pub fn semantic_codes(&self) -> usize {
        (self.semantic_end - self.semantic_start + 1) as usize
    }

    pub fn is_semantic(&self, id: u32) -> bool {
        (self.semantic_start..=self.semantic_end).contains(&id)
    }

    /// Ids that must never come from caller text (spec §7 validation); speaker tags are allowed.
    pub fn forbidden_in_text(&self) -> [u32; 5] {
        [self.im_start, self.im_end, self.voice, self.text, self.interleave]
    }
}

/// What `config.json` says the tokenizer must contain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenizerExpectations {
    /// `semantic_start_token_id`
    pub semantic_start: u32,
    /// `semantic_end_token_id` (inclusive)
    pub semantic_end: u32,
    /// `audio_decoder_config.vocab_size`
    pub semantic_codes: usize,
    /// `eos_token_id`
    pub eos: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("{}: cannot load tokenizer: {message}", path.display())]
    Load { path: PathBuf, message: String },
    #[error("{}: special token `{token}` is missing{hint}", path.display())]
    Missing { path: PathBuf, token: String, hint: String },
    #[error(
        "{}: added token `{token}` is written with id {declared} but the tokenizers library assigns it {actual} (it numbers added tokens in file order after the vocabulary)",
        path.display()
    )]
    DeclaredIdIgnored { path: PathBuf, token: String, declared: u32, actual: u32 },
    #[error("{}: `{token}` (id {id}) is not an added token: encoding it gives ids {ids:?}, not one id", path.display())]
    NotAtomic { path: PathBuf, token: String, id: u32, ids: Vec<u32> },
    #[error("{}: `{token}` has id {actual} but {source_desc} is {expected}", path.display())]
    IdMismatch { path: PathBuf, token: String, actual: u32, expected: u32, source_desc: String },
    #[error(
        "{}: semantic band is not contiguous: `{token}` has id {actual}, expected {expected} (`<|semantic:0|>` + {code})",
        path.display()
    )]
    NonContiguous { path: PathBuf, token: String, actual: u32, expected: u32, code: usize },
    #[error(
        "{}: has `{token}` (id {id}) but config.json `audio_decoder_config.vocab_size` is {codes}: the semantic band is larger than the codebook",
        path.display()
    )]
    BandTooLarge { path: PathBuf, token: String, id: u32, codes: usize },
    #[error(
        "{}: `{token}` (id {id}) lies inside the semantic band {start}..={end}; structural tokens must not alias codes",
        path.display()
    )]
    StructuralInBand { path: PathBuf, token: String, id: u32, start: u32, end: u32 },
    #[error(
        "{}: the post-processor adds tokens: encoding \"hello\" gives {with:?} with special tokens but {without:?} without; the prompt needs none added",
        path.display()
    )]
    PostProcessorAdds { path: PathBuf, with: Vec<u32>, without: Vec<u32> },
    #[error(
        "config.json: `semantic_start_token_id` {start}..=`semantic_end_token_id` {end} spans {span} ids but `audio_decoder_config.vocab_size` is {codes}"
    )]
    BandSize { start: u32, end: u32, span: i64, codes: usize },
    #[error("config.json: `eos_token_id` {eos} lies inside the semantic band {start}..={end}")]
    EosInBand { eos: u32, start: u32, end: u32 },
}

/// Refuses an eos id inside the semantic band: sampling restricted to the band could then never stop,
/// and a generated code could end the stream.
pub fn check_eos_outside_band(semantic_start: u32, semantic_end: u32, eos: u32) -> Result<(), TokenizerError> {
    if (semantic_start..=semantic_end).contains(&eos) {
        return Err(TokenizerError::EosInBand { eos, start: semantic_start, end: semantic_end });
    }
    Ok(())
}

/// The config-only checks: the band size matches the codebook and eos lies outside it.
pub fn check_expectations(expect: &TokenizerExpectations) -> Result<(), TokenizerError> {
    let span = i64::from(expect.semantic_end) - i64::from(expect.semantic_start) + 1;
    if span != expect.semantic_codes as i64 {
        return Err(TokenizerError::BandSize {
            start: expect.semantic_start,
            end: expect.semantic_end,
            span,
            codes: expect.semantic_codes,
        });
    }
    check_eos_outside_band(expect.semantic_start, expect.semantic_end, expect.eos)
}

/// Loads `path` and resolves every special token, refusing any disagreement with `expect`.
pub fn load_tokenizer(
    path: &Path,
    expect: &TokenizerExpectations,
) -> Result<(Tokenizer, SpecialTokenIds), TokenizerError> {
    check_expectations(expect)?;
    let bytes =
        std::fs::read(path).map_err(|e| TokenizerError::Load { path: path.to_owned(), message: e.to_string() })?;
    tokenizer_from_bytes(&bytes, path, expect)
}

/// [`load_tokenizer`] on a file's bytes (`path` only labels errors). Public for the fuzz target
/// (`fuzz/fuzz_targets/tokenizer.rs`).
pub fn tokenizer_from_bytes(
    bytes: &[u8],
    path: &Path,
    expect: &TokenizerExpectations,
) -> Result<(Tokenizer, SpecialTokenIds), TokenizerError> {
    check_expectations(expect)?;
    let load_err = |message: String| TokenizerError::Load { path: path.to_owned(), message };
    // tokenizers 0.23 panics on some malformed sections instead of returning its error (a
    // `decoder` whose JSON is broken: found by fuzzing, `fuzz/seeds/tokenizer/broken-decoder`).
    // A malformed file is refused by name like any other.
    let tok = match std::panic::catch_unwind(|| Tokenizer::from_bytes(bytes)) {
        Ok(parsed) => parsed.map_err(|e| load_err(e.to_string()))?,
        Err(_) => return Err(load_err(String::from("malformed JSON (the tokenizers library gave up on it)"))),
    };
    check_declared_ids(&tok, path, bytes)?;
    let ids = resolve_special_tokens(&tok, path, expect)?;
    Ok((tok, ids))
}

#[derive(serde::Deserialize)]
struct DeclaredFile {
    #[serde(default)]
    added_tokens: Vec<DeclaredToken>,
}

#[derive(serde::Deserialize)]
struct DeclaredToken {
    id: u32,
    content: String,
}

/// tokenizers 0.23 (Rust and Python alike) ignores the `id` written for an added token that is not in
/// the model vocabulary: it numbers those in file order from the vocabulary size, with no error. A file
/// with holes or out-of-order ids would therefore encode to ids other than the ones written in it (and
/// perhaps in `config.json`), so a disagreement is refused here rather than silently renumbered.
fn check_declared_ids(tok: &Tokenizer, path: &Path, bytes: &[u8]) -> Result<(), TokenizerError> {
    let file: DeclaredFile = serde_json::from_slice(bytes)
        .map_err(|e| TokenizerError::Load { path: path.to_owned(), message: format!("`added_tokens`: {e}") })?;
    for t in file.added_tokens {
        if let Some(actual) = tok.token_to_id(&t.content)
            && actual != t.id
        {
            return Err(TokenizerError::DeclaredIdIgnored {
                path: path.to_owned(),
                token: t.content,
                declared: t.id,
                actual,
            });
        }
    }
    Ok(())
}

/// The checks of [`load_tokenizer`] on an already-loaded tokenizer, except the written-id check, which
/// needs the file's bytes; `path` only labels errors.
pub fn resolve_special_tokens(
    tok: &Tokenizer,
    path: &Path,
    expect: &TokenizerExpectations,
) -> Result<SpecialTokenIds, TokenizerError> {
    let p = || path.to_owned();
    let lookup = |token: &str, hint: &str| {
        tok.token_to_id(token).ok_or_else(|| TokenizerError::Missing {
            path: p(),
            token: token.into(),
            hint: hint.into(),
        })
    };
    // Structural tokens are found by encoding prompt text, so each must come out as its own single id.
    let atomic = |token: &str| -> Result<u32, TokenizerError> {
        let id = lookup(token, "")?;
        let ids = encode_ids(tok, path, token, false)?;
        if ids != [id] {
            return Err(TokenizerError::NotAtomic { path: p(), token: token.into(), id, ids });
        }
        Ok(id)
    };

    let im_start = atomic(IM_START)?;
    let im_end = atomic(IM_END)?;
    let voice = atomic(VOICE)?;
    let text = atomic(TEXT)?;
    let interleave = atomic(INTERLEAVE)?;
    let mut speakers = [0u32; SPEAKER_COUNT];
    for (n, slot) in speakers.iter_mut().enumerate() {
        *slot = atomic(&speaker_token(n))?;
    }
    if im_end != expect.eos {
        return Err(TokenizerError::IdMismatch {
            path: p(),
            token: IM_END.into(),
            actual: im_end,
            expected: expect.eos,
            source_desc: "config.json `eos_token_id`".into(),
        });
    }

    // Semantic band: generated code c becomes id start + c, so the ids must be exactly the config's range.
    let codes = expect.semantic_codes;
    let band_hint = format!(
        "; config.json `audio_decoder_config.vocab_size` is {codes}, so `<|semantic:0|>`..`<|semantic:{}|>` must exist",
        codes.saturating_sub(1)
    );
    let start = lookup(&semantic_token(0), &band_hint)?;
    if start != expect.semantic_start {
        return Err(TokenizerError::IdMismatch {
            path: p(),
            token: semantic_token(0),
            actual: start,
            expected: expect.semantic_start,
            source_desc: "config.json `semantic_start_token_id`".into(),
        });
    }
    for code in 1..codes {
        let token = semantic_token(code);
        let actual = lookup(&token, &band_hint)?;
        let expected = start + code as u32;
        if actual != expected {
            return Err(TokenizerError::NonContiguous { path: p(), token, actual, expected, code });
        }
    }
    let extra = semantic_token(codes);
    if let Some(id) = tok.token_to_id(&extra) {
        return Err(TokenizerError::BandTooLarge { path: p(), token: extra, id, codes });
    }
    let end = start + codes as u32 - 1;
    // Distinct tokens sharing an id inside the band would make a code decode as a structural token.
    let mut structural: Vec<(String, u32)> =
        [(IM_START, im_start), (IM_END, im_end), (VOICE, voice), (TEXT, text), (INTERLEAVE, interleave)]
            .iter()
            .map(|&(t, id)| (t.to_owned(), id))
            .collect();
    structural.extend(speakers.iter().enumerate().map(|(n, &id)| (speaker_token(n), id)));
    if let Some((token, id)) = structural.into_iter().find(|(_, id)| (start..=end).contains(id)) {
        return Err(TokenizerError::StructuralInBand { path: p(), token, id, start, end });
    }

    // The reference encodes each segment with default settings and expects only the segment's tokens.
    let with = encode_ids(tok, path, "hello", true)?;
    let without = encode_ids(tok, path, "hello", false)?;
    if with != without {
        return Err(TokenizerError::PostProcessorAdds { path: p(), with, without });
    }

    let vocab_len = tok.get_vocab(true).values().copied().max().map_or(0, |m| m + 1);
    Ok(SpecialTokenIds {
        vocab_len,
        im_start,
        im_end,
        voice,
        text,
        interleave,
        speakers,
        semantic_start: start,
        semantic_end: end,
        endoftext: tok.token_to_id(ENDOFTEXT),
        pad: tok.token_to_id(PAD),
        audio_start: tok.token_to_id(AUDIO_START),
        audio_end: tok.token_to_id(AUDIO_END),
        audio_pad: tok.token_to_id(AUDIO_PAD),
        phoneme_start: tok.token_to_id(PHONEME_START),
        phoneme_end: tok.token_to_id(PHONEME_END),
    })
}

fn encode_ids(tok: &Tokenizer, path: &Path, text: &str, special: bool) -> Result<Vec<u32>, TokenizerError> {
    tok.encode(text, special)
        .map(|e| e.get_ids().to_vec())
        .map_err(|e| TokenizerError::Load { path: path.to_owned(), message: format!("encoding {text:?} failed: {e}") })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::tokenizer::{TokenizerSpec, build_tokenizer_json};

    fn tiny() -> (Tokenizer, SpecialTokenIds) {
        let (json, ids) = build_tokenizer_json(&TokenizerSpec { n_merges: 300, semantic_codes: 32, seed: 1 });
        (Tokenizer::from_bytes(json.as_bytes()).unwrap(), ids)
    }

    fn expect_of(ids: &SpecialTokenIds) -> TokenizerExpectations {
        TokenizerExpectations {
            semantic_start: ids.semantic_start,
            semantic_end: ids.semantic_end,
            semantic_codes: ids.semantic_codes(),
            eos: ids.im_end,
        }
    }

    #[test]
    fn resolves_what_the_builder_reports() {
        let (tok, built) = tiny();
        let got = resolve_special_tokens(&tok, Path::new("tokenizer.json"), &expect_of(&built)).unwrap();
        assert_eq!(got, built);
        assert_eq!(got.vocab_len as usize, tok.get_vocab_size(true));
    }

    #[test]
    fn eos_inside_band_is_refused() {
        assert!(check_eos_outside_band(10, 20, 9).is_ok());
        assert!(check_eos_outside_band(10, 20, 21).is_ok());
        let msg = check_eos_outside_band(10, 20, 20).unwrap_err().to_string();
        assert_eq!(msg, "config.json: `eos_token_id` 20 lies inside the semantic band 10..=20");
    }

    #[test]
    fn band_size_disagreeing_with_codebook_is_refused() {
        let e = TokenizerExpectations { semantic_start: 100, semantic_end: 199, semantic_codes: 128, eos: 5 };
        let msg = check_expectations(&e).unwrap_err().to_string();
        assert!(msg.contains("spans 100 ids") && msg.contains("`audio_decoder_config.vocab_size` is 128"), "{msg}");
    }

    #[test]
    fn eos_mismatch_names_the_token_and_both_ids() {
        let (tok, built) = tiny();
        let expect = TokenizerExpectations { eos: built.im_start, ..expect_of(&built) };
        let msg = resolve_special_tokens(&tok, Path::new("tokenizer.json"), &expect).unwrap_err().to_string();
        let want = format!(
            "tokenizer.json: `<|im_end|>` has id {} but config.json `eos_token_id` is {}",
            built.im_end, built.im_start
        );
        assert_eq!(msg, want);
    }
}
