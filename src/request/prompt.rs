//! The `reference-bracket-v1` prompt (`model.md` §7): text segments and voice references become
//! frame rows `[T, 1 + codebooks]`, exactly as S1 `prompt.py` `build_prompt_rows` builds them.
//!
//! Every string segment is tokenized on its own: tokenizing the joined string would change the
//! ids at the seams. The layout is
//!
//! ```text
//! "<|im_start|>system\n"  instruction
//! per reference i (1-based): "\n\n[Reference i]\nText: " TAG transcript "\nSpeech: "  audio rows
//! per history turn (a long request's earlier chunks, S2 `build_frames`):
//!   "<|im_start|>user\n"  tagged turn text  "<|im_end|>\n"  "<|im_start|>assistant\n<|voice|>"  its frames  "<|im_end|>\n"
//! "<|im_end|>\n"  "<|im_start|>user\n"  tagged text  "<|im_end|>\n"  "<|im_start|>assistant\n<|voice|>"
//! ```
//! (The history turns follow the system message's `"<|im_end|>\n"`.)

use super::text::{CallerText, Field, TextError, reference_transcript, validate_caller_text, with_speaker_tag};
use crate::engine::prefix::SharedPrefix;
use crate::model::frame::Rows;
use crate::model::load::Checkpoint;
use crate::model::vocabulary::Vocabulary;

/// The instruction of a prompt without references (the model's default voice).
pub const TTS_INSTRUCTION: &str = "convert the provided text to speech";
/// The instruction of a prompt with references.
pub const REFERENCE_INSTRUCTION: &str = "convert the provided text to speech reference to the following:";
const SYSTEM_START: &str = "<|im_start|>system\n";
const USER_START: &str = "<|im_start|>user\n";
const MESSAGE_END: &str = "<|im_end|>\n";
/// Generation begins after the `<|voice|>` token this segment ends with.
const GENERATION_START: &str = "<|im_start|>assistant\n<|voice|>";

/// A voice reference: its transcript and its codec codes `codes[codebook][frame]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reference {
    pub transcript: String,
    pub codes: Vec<Vec<u32>>,
}

impl Reference {
    /// A reference from codes row-major `[frames, codebooks]` (as the codec encoder gives them).
    pub fn from_frames(transcript: String, codes: &[u32], codebooks: usize) -> Reference {
        let books = codebooks.max(1);
        let codes = (0..books).map(|b| codes.iter().skip(b).step_by(books).copied().collect()).collect();
        Reference { transcript, codes }
    }
}

/// A built prompt: its rows, and how many of them are the system message when it holds voice
/// references (the instruction and every reference), which every prompt in the same voice shares:
/// the prefix the engine may keep (`engine::prefix`). The row after it (`<|im_start|>`) is the
/// same in every prompt too. Without references it is 0: the default voice's prompt runs whole.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Prompt {
    pub rows: Rows,
    pub voice_rows: usize,
}

impl Prompt {
    /// The prompt's voice rows as the engine's shared prefix, kept across requests if `keep`.
    pub fn voice_prefix(&self, keep: bool) -> SharedPrefix {
        SharedPrefix { rows: self.voice_rows, keep: keep && self.voice_rows > 0 }
    }
}

/// Why a prompt could not be built. Every variant but `Tokenizer` is the caller's fault (HTTP 400)
/// and names the field it is about.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PromptError {
    #[error(transparent)]
    Text(#[from] TextError),
    #[error(
        "{field}: audio codes must be [{expected_codebooks}, frames] with at least one frame; got {codebooks} codebooks of {frames:?} frames"
    )]
    CodesShape { field: Field, expected_codebooks: usize, codebooks: usize, frames: Vec<usize> },
    #[error("{field}: audio codes must be in [0, {codebook_size}); got {code} in codebook {codebook}, frame {frame}")]
    CodeOutOfRange { field: Field, codebook: usize, frame: usize, code: u32, codebook_size: usize },
    #[error("tokenizer failed on a prompt segment: {message}")]
    Tokenizer { message: String },
}

impl PromptError {
    /// The request field at fault, or `None` for an internal (tokenizer) failure.
    pub fn field(&self) -> Option<Field> {
        match self {
            PromptError::Text(e) => Some(e.field()),
            PromptError::CodesShape { field, .. } | PromptError::CodeOutOfRange { field, .. } => Some(*field),
            PromptError::Tokenizer { .. } => None,
        }
    }
}

/// Builds prompt rows with a loaded model's [`Vocabulary`]. Holds no state beyond it, so one
/// builder serves any number of requests; clones share the tokenizer, so the request layer
/// builds each request's rows before it is queued.
#[derive(Clone)]
pub struct PromptBuilder {
    vocabulary: Vocabulary,
}

impl std::fmt::Debug for PromptBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PromptBuilder").field("codebooks", &self.vocabulary.codebooks).finish_non_exhaustive()
    }
}

/// One piece of the prompt before it becomes rows.
enum Segment<'a> {
    Text(String),
    /// A reference's codes `[codebook][frame]`.
    Audio(&'a [Vec<u32>]),
    /// Generated frames `[main, c0..c9]` (their codes become audio rows).
    Frames(&'a Rows),
}

/// An earlier chunk of a long request, carried into a later chunk's prompt: its text (as its
/// prompt had it) and the frames it produced.
#[derive(Clone, Copy, Debug)]
pub struct Turn<'a> {
    pub text: &'a str,
    pub frames: &'a Rows,
}

impl PromptBuilder {
    pub fn new(vocabulary: Vocabulary) -> PromptBuilder {
        PromptBuilder { vocabulary }
    }

    pub fn for_checkpoint(ckpt: &Checkpoint) -> PromptBuilder {
        PromptBuilder::new(Vocabulary::of(ckpt))
    }

    /// The prompt rows for `text` spoken in the voice of `references` (none: the default voice).
    /// References are checked in order, transcript before codes, then the text (S1's order, so the
    /// first problem reported is the one S1 reports).
    pub fn build(&self, text: &str, references: &[Reference]) -> Result<Rows, PromptError> {
        self.check_references(references)?;
        let text = CallerText::check(text.to_owned(), Field::Input)?;
        Ok(self.rows(&text, references, &[])?.rows)
    }

    /// [`PromptBuilder::build`] for text the request layer already checked.
    pub fn build_checked(&self, text: &CallerText, references: &[Reference]) -> Result<Rows, PromptError> {
        Ok(self.build_prompt(text, references)?.rows)
    }

    /// [`PromptBuilder::build_checked`], also saying where the voice's rows end.
    pub fn build_prompt(&self, text: &CallerText, references: &[Reference]) -> Result<Prompt, PromptError> {
        self.build_with_history(text, references, &[])
    }

    /// [`PromptBuilder::build_prompt`] with earlier chunks of the same request as history
    /// turns between the system message and the text (as S2 builds a long text's chunks).
    pub fn build_with_history(
        &self,
        text: &CallerText,
        references: &[Reference],
        history: &[Turn],
    ) -> Result<Prompt, PromptError> {
        self.check_references(references)?;
        self.rows(text, references, history)
    }

    fn check_references(&self, references: &[Reference]) -> Result<(), PromptError> {
        for (i, reference) in references.iter().enumerate() {
            let field = Field::Reference(i);
            validate_caller_text(&reference.transcript, field)?;
            self.refuse_control_tokens(&reference.transcript, field)?;
            self.validate_codes(&reference.codes, field)?;
        }
        Ok(())
    }

    /// Checks a whole caller text for the tokenizer's control tokens, before it is cut into
    /// chunks (a later chunk's prompt is built only when the chunk before it ends).
    pub fn check_text(&self, text: &CallerText) -> Result<(), PromptError> {
        Ok(self.refuse_control_tokens(text.as_str(), Field::Input)?)
    }

    /// Refuses text that holds a special token of the tokenizer other than a speaker tag: it
    /// would become a control token of the prompt, not text.
    fn refuse_control_tokens(&self, text: &str, field: Field) -> Result<(), TextError> {
        match self.vocabulary.control_tokens.find(text) {
            Some(token) => Err(TextError::SpecialToken { field, token }),
            None => Ok(()),
        }
    }

    /// The rows of checked text, checked references and history turns.
    fn rows(&self, text: &CallerText, references: &[Reference], history: &[Turn]) -> Result<Prompt, PromptError> {
        // History turns are earlier pieces of the same, already checked, text.
        self.refuse_control_tokens(text.as_str(), Field::Input)?;
        let instruction = if references.is_empty() { TTS_INSTRUCTION } else { REFERENCE_INSTRUCTION };
        let mut segments = vec![Segment::Text(SYSTEM_START.into()), Segment::Text(instruction.into())];
        for (i, reference) in references.iter().enumerate() {
            let transcript = reference_transcript(&reference.transcript);
            segments.push(Segment::Text(format!("\n\n[Reference {}]\nText: {transcript}\nSpeech: ", i + 1)));
            segments.push(Segment::Audio(&reference.codes));
        }
        segments.push(Segment::Text(MESSAGE_END.into()));
        let system_segments = segments.len();
        for turn in history {
            segments.push(Segment::Text(USER_START.into()));
            segments.push(Segment::Text(with_speaker_tag(turn.text, 0)));
            segments.push(Segment::Text(MESSAGE_END.into()));
            segments.push(Segment::Text(GENERATION_START.into()));
            segments.push(Segment::Frames(turn.frames));
            segments.push(Segment::Text(MESSAGE_END.into()));
        }
        for s in [USER_START.to_owned(), with_speaker_tag(text.as_str(), 0)] {
            segments.push(Segment::Text(s));
        }
        segments.push(Segment::Text(MESSAGE_END.into()));
        segments.push(Segment::Text(GENERATION_START.into()));

        let mut rows = Rows::new(self.vocabulary.codebooks);
        let mut voice_rows = 0;
        for (index, segment) in segments.iter().enumerate() {
            if index == system_segments && !references.is_empty() {
                voice_rows = rows.len();
            }
            match segment {
                Segment::Text(s) => {
                    for id in self.encode(s)? {
                        rows.push_text(id);
                    }
                }
                Segment::Audio(codes) => {
                    let mut frame = vec![0u32; self.vocabulary.codebooks];
                    for t in 0..codes[0].len() {
                        for (c, slot) in frame.iter_mut().enumerate() {
                            *slot = codes[c][t];
                        }
                        rows.push_audio(self.vocabulary.semantic_start, &frame);
                    }
                }
                Segment::Frames(frames) => {
                    for t in 0..frames.len() {
                        rows.push_audio(self.vocabulary.semantic_start, &frames.row(t)[1..]);
                    }
                }
            }
        }
        Ok(Prompt { rows, voice_rows })
    }

    /// Token ids of one segment. `add_special_tokens` is true, as Python's `encode` defaults to:
    /// the reference assumes the post-processor adds nothing, and so do we by doing what it does.
    fn encode(&self, segment: &str) -> Result<Vec<u32>, PromptError> {
        let encoding = self
            .vocabulary
            .tokenizer
            .encode(segment, true)
            .map_err(|e| PromptError::Tokenizer { message: e.to_string() })?;
        Ok(encoding.get_ids().to_vec())
    }

    fn validate_codes(&self, codes: &[Vec<u32>], field: Field) -> Result<(), PromptError> {
        let frames: Vec<usize> = codes.iter().map(Vec::len).collect();
        let ragged = frames.iter().any(|&f| Some(&f) != frames.first());
        if codes.len() != self.vocabulary.codebooks || frames.first().is_none_or(|&f| f == 0) || ragged {
            return Err(PromptError::CodesShape {
                field,
                expected_codebooks: self.vocabulary.codebooks,
                codebooks: codes.len(),
                frames,
            });
        }
        for (codebook, row) in codes.iter().enumerate() {
            if let Some((frame, &code)) =
                row.iter().enumerate().find(|&(_, &c)| c as usize >= self.vocabulary.codebook_size)
            {
                return Err(PromptError::CodeOutOfRange {
                    field,
                    codebook,
                    frame,
                    code,
                    codebook_size: self.vocabulary.codebook_size,
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn from_frames_transposes_row_major_codes() {
        let r = Reference::from_frames("t".into(), &[1, 2, 3, 4, 5, 6], 2);
        assert_eq!(r.codes, vec![vec![1, 3, 5], vec![2, 4, 6]]);
    }
}
