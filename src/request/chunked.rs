//! A long request's chunks (issue 15): the text cut by `request::split`, each chunk's prompt the
//! voice's references, then the first chunk and the previous chunk (their text and the frames
//! they produced) as history turns, then the chunk's own text — as S2 (mlx-audio 0.6.2
//! `fish_drama3`) generates long text, with its sizes: about 300 bytes and at most 3 speakers a
//! chunk.
//!
//! A chunk's text is its piece of the input with every white-space run that holds a line break
//! made one space (S2: a caller's line break could end the model's turn early) and the edges
//! trimmed, tagged with the speaker it starts in. Text that fits one chunk is left exactly as it
//! is, so a short request's prompt is S1's.

use std::collections::BTreeMap;

use super::prompt::{Prompt, PromptBuilder, PromptError, Reference, Turn};
use super::split::{SplitLimits, split};
use super::text::{CallerText, Field, is_white_space, markup_len, speaker_tag_at};
use crate::engine::generate::StallGuard;
use crate::model::frame::Rows;
use crate::scheduler::{ChunkPrompt, MoreChunks};

/// S2's chunk size: bytes of UTF-8 text a chunk aims for.
pub const CHUNK_BYTES: usize = 300;
/// S2's cap on the speakers one chunk holds.
pub const CHUNK_SPEAKERS: usize = 3;
/// Bytes the first chunk of long text aims for (then 100, 200, `CHUNK_BYTES`: each chunk at
/// most the text before it): about a short request's text, so a chapter's first audio comes as
/// soon as a sentence's. S2 has no such rule; it changes nothing for text that fits one chunk.
pub const FIRST_CHUNK_BYTES: usize = 100;
/// How long text is cut (`split`'s rules).
pub const CHUNK_LIMITS: SplitLimits =
    SplitLimits { target_bytes: CHUNK_BYTES, first_target_bytes: FIRST_CHUNK_BYTES, max_speakers: CHUNK_SPEAKERS };

/// The runaway guard of a long request's chunks: a chunk ends (`length`) after
/// `GUARD_BASE_FRAMES + GUARD_FRAMES_PER_CHAR × its spoken characters` frames, if the request's
/// `max_frames` does not end it first. Speech runs about 14 characters a second, 1.5 frames a
/// character; the bound allows over three times that plus 2 s, so only a chunk that does not
/// stop (a loop, a babble, a long silence) reaches it.
pub const GUARD_FRAMES_PER_CHAR: usize = 5;
/// See [`GUARD_FRAMES_PER_CHAR`]: 2 s of frames.
pub const GUARD_BASE_FRAMES: usize = 43;

/// The stall guard of a long request's chunks (`engine::stall`): a chunk is cut once its last
/// 64 frames (3 s) draw on at most 4 semantic codes — silence, or one sound held. Speech changes
/// its semantic code with nearly every frame; the model's own pauses are shorter.
pub const STALL_GUARD: StallGuard = StallGuard { window: 64, max_codes: 4 };

/// The stall guard for a request of `chunks` chunks: long text only (text that fits one chunk
/// is generated as the reference generates it, bounded by `max_frames` alone).
pub fn stall_guard(chunks: usize) -> Option<StallGuard> {
    (chunks > 1).then_some(STALL_GUARD)
}

/// The guard's frame bound for a chunk of `text`: its characters that are spoken (outside tags
/// and directions, not white space) counted.
pub fn frame_bound(text: &str) -> usize {
    let (mut spoken, mut i) = (0, 0);
    while i < text.len() {
        if let Some(len) = markup_len(&text[i..]) {
            i += len;
            continue;
        }
        let c = text[i..].chars().next().expect("i < len");
        spoken += usize::from(!is_white_space(c));
        i += c.len_utf8();
    }
    GUARD_BASE_FRAMES + GUARD_FRAMES_PER_CHAR * spoken
}

/// One chunk's text and the speakers it holds (ascending).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkText {
    pub text: CallerText,
    pub speakers: Vec<u32>,
}

/// Whose references each chunk's prompt carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ChunkVoices {
    /// One voice for the whole text (the request's `voice`, or its inline references): every
    /// chunk carries all of them, as a one-chunk prompt does, whatever its speaker tags.
    All(Vec<Reference>),
    /// Dialogue (`voices`): references per speaker id. A chunk carries those of the speakers it
    /// holds, in speaker order, each transcript tagged with its speaker; a speaker without an
    /// entry has none (the model's own voice for it).
    BySpeaker(BTreeMap<u32, Vec<Reference>>),
}

impl ChunkVoices {
    /// The references of a chunk holding `speakers`.
    pub fn for_speakers(&self, speakers: &[u32]) -> Vec<Reference> {
        match self {
            ChunkVoices::All(references) => references.clone(),
            ChunkVoices::BySpeaker(by_speaker) => (speakers.iter())
                .flat_map(|s| by_speaker.get(s).into_iter().flatten().map(move |r| (s, r)))
                .map(|(&s, r)| Reference { transcript: tagged_as(&r.transcript, s), codes: r.codes.clone() })
                .collect(),
        }
    }
}

/// `transcript` spoken by `speaker`: a leading speaker tag (after white space) is replaced.
fn tagged_as(transcript: &str, speaker: u32) -> String {
    let body = transcript.trim_start_matches(is_white_space);
    let rest = speaker_tag_at(body).map_or(body, |(len, _)| &body[len..]);
    format!("<|speaker:{speaker}|> {}", rest.trim_start_matches(is_white_space))
}

/// The chunks' texts for `text` (one: `text` itself, when it fits one chunk).
pub fn chunk_texts(text: &CallerText, limits: SplitLimits) -> Vec<ChunkText> {
    let chunks = split(text.as_str(), limits);
    if chunks.len() <= 1 {
        let speakers = chunks.into_iter().next().map_or_else(|| vec![0], |c| c.speakers);
        return vec![ChunkText { text: text.clone(), speakers }];
    }
    let mut everyone: Vec<u32> = chunks.iter().flat_map(|c| c.speakers.iter().copied()).collect();
    everyone.sort_unstable();
    everyone.dedup();
    let texts: Vec<ChunkText> = chunks
        .into_iter()
        .filter_map(|chunk| {
            let body = flatten_lines(&text.as_str()[chunk.range]);
            // A piece with nothing but tags and white space has nothing to say.
            if without_speaker_tags(&body).trim_matches(is_white_space).is_empty() {
                return None;
            }
            let tagged =
                if speaker_tag_at(&body).is_some() { body } else { format!("<|speaker:{}|> {body}", chunk.speaker) };
            let text =
                CallerText::check(tagged, Field::Input).expect("a piece of checked text, tagged, is checked text");
            Some(ChunkText { text, speakers: chunk.speakers })
        })
        .collect();
    if texts.is_empty() {
        // Nothing but tags: the text as it is, one chunk (it has to be spoken somehow).
        return vec![ChunkText { text: text.clone(), speakers: everyone }];
    }
    texts
}

/// Every white-space run holding a line break becomes one space; the edges are trimmed.
fn flatten_lines(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut run = String::new();
    for c in text.trim_matches(is_white_space).chars() {
        if is_white_space(c) {
            run.push(c);
            continue;
        }
        if !run.is_empty() {
            out.push_str(if run.contains(['\n', '\r', '\u{b}', '\u{c}', '\u{85}', '\u{2028}', '\u{2029}']) {
                " "
            } else {
                &run
            });
            run.clear();
        }
        out.push(c);
    }
    out
}

fn without_speaker_tags(text: &str) -> String {
    let (mut out, mut rest) = (String::new(), text);
    while let Some(at) = rest.find("<|speaker:") {
        out.push_str(&rest[..at]);
        let len = speaker_tag_at(&rest[at..]).map_or("<|speaker:".len(), |(len, _)| len);
        rest = &rest[at + len..];
    }
    out.push_str(rest);
    out
}

/// A long request's chunks after the first: each prompt built when the chunk before it ends.
#[derive(Debug)]
pub struct ChunkedText {
    builder: PromptBuilder,
    voices: ChunkVoices,
    keep_voice: bool,
    texts: Vec<ChunkText>,
    /// The request's `max_frames` (each chunk's own bound is also its guard's).
    max_frames: usize,
    /// The chunk whose frames the next call brings.
    ended: usize,
    /// The first chunk's frames (history for every later chunk).
    first: Option<Rows>,
    /// The latest chunk after the first: its index and frames.
    latest: Option<(usize, Rows)>,
}

impl ChunkedText {
    /// The first chunk's prompt and its frame bound, and the rest as [`MoreChunks`] (`None` for
    /// one chunk, whose bound is `max_frames`: the guard is for long text).
    pub fn start(
        builder: PromptBuilder,
        voices: ChunkVoices,
        keep_voice: bool,
        texts: Vec<ChunkText>,
        max_frames: usize,
    ) -> Result<(Prompt, usize, Option<ChunkedText>), PromptError> {
        let first = builder.build_prompt(&texts[0].text, &voices.for_speakers(&texts[0].speakers))?;
        let first_frames =
            if texts.len() > 1 { max_frames.min(frame_bound(texts[0].text.as_str())) } else { max_frames };
        let more = (texts.len() > 1).then(|| ChunkedText {
            builder,
            voices,
            keep_voice,
            texts,
            max_frames,
            ended: 0,
            first: None,
            latest: None,
        });
        Ok((first, first_frames, more))
    }

    /// The prompt of chunk `index` (≥ 1) with its history.
    fn prompt(&self, index: usize) -> Result<Prompt, PromptError> {
        let first = self.first.as_ref().map(|frames| Turn { text: self.texts[0].text.as_str(), frames });
        let latest = self.latest.as_ref().map(|(i, frames)| Turn { text: self.texts[*i].text.as_str(), frames });
        let history: Vec<Turn> = first.into_iter().chain(latest).collect();
        let chunk = &self.texts[index];
        self.builder.build_with_history(&chunk.text, &self.voices.for_speakers(&chunk.speakers), &history)
    }
}

impl MoreChunks for ChunkedText {
    fn next(&mut self, previous: &Rows) -> Option<Result<ChunkPrompt, String>> {
        // A chunk that produced no frame (it ended at once) adds no history turn.
        if !previous.is_empty() {
            if self.ended == 0 {
                self.first = Some(previous.clone());
            } else {
                self.latest = Some((self.ended, previous.clone()));
            }
        }
        self.ended += 1;
        if self.ended >= self.texts.len() {
            return None;
        }
        let bound = frame_bound(self.texts[self.ended].text.as_str());
        let (max_frames, guarded) = (self.max_frames.min(bound), bound < self.max_frames);
        Some(
            self.prompt(self.ended)
                .map(|p| ChunkPrompt { prefix: p.voice_prefix(self.keep_voice), rows: p.rows, max_frames, guarded })
                .map_err(|e| format!("chunk {}: {e}", self.ended)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(text: &str, target: usize) -> Vec<String> {
        let text = CallerText::check(text.to_owned(), Field::Input).unwrap();
        chunk_texts(
            &text,
            SplitLimits { target_bytes: target, first_target_bytes: target, max_speakers: CHUNK_SPEAKERS },
        )
        .into_iter()
        .map(|t| t.text.as_str().to_owned())
        .collect()
    }

    #[test]
    fn short_text_is_left_as_it_is() {
        assert_eq!(texts("  Hello\n\nthere.  ", 300), ["  Hello\n\nthere.  "]);
    }

    #[test]
    fn chunks_are_tagged_flattened_and_trimmed() {
        // The second chunk aims for at most the 24 bytes before it: it ends at a space.
        let got = texts("First line\nsecond line. <|speaker:1|> Reply here, which is long enough.", 40);
        assert_eq!(
            got,
            [
                "<|speaker:0|> First line second line.",
                "<|speaker:1|> Reply",
                "<|speaker:1|> here, which is long enough."
            ],
            "{got:?}"
        );
    }

    /// The server's own limits: a long text's first chunk holds about 100 bytes, and no later
    /// chunk holds more text than all the chunks before it (so a held chunk is never longer
    /// than the audio already sent), up to 300 bytes.
    #[test]
    fn long_text_under_the_server_limits_starts_short_and_grows() {
        let sentence = "The river ran quiet under the old stone bridge that evening. ";
        let text = CallerText::check(sentence.repeat(40), Field::Input).unwrap();
        let spoken: Vec<usize> = chunk_texts(&text, CHUNK_LIMITS)
            .iter()
            .map(|c| c.text.as_str().trim_start_matches("<|speaker:0|> ").len())
            .collect();
        assert!((50..=FIRST_CHUNK_BYTES).contains(&spoken[0]), "{spoken:?}");
        let mut before = 0;
        for (i, &len) in spoken.iter().enumerate() {
            assert!(len <= CHUNK_BYTES, "{spoken:?}");
            if i > 0 {
                // Each piece ends after a sentence's space, which the chunk text trims.
                assert!(len <= before, "chunk {i}: {spoken:?}");
            }
            before += len + 1;
        }
        assert!(spoken.iter().filter(|&&len| len > 200).count() >= spoken.len() - 4, "grows to the target: {spoken:?}");
    }

    #[test]
    fn dialogue_chunks_carry_their_speakers_voices() {
        let reference = |t: &str| Reference { transcript: t.into(), codes: vec![vec![1]] };
        let voices = ChunkVoices::BySpeaker(BTreeMap::from([
            (0, vec![reference("Alice speaks.")]),
            (2, vec![reference("  <|speaker:0|> Bob speaks.")]),
        ]));
        let got: Vec<String> = voices.for_speakers(&[1, 2]).into_iter().map(|r| r.transcript).collect();
        assert_eq!(got, ["<|speaker:2|> Bob speaks."]);
        let got: Vec<String> = voices.for_speakers(&[0, 2]).into_iter().map(|r| r.transcript).collect();
        assert_eq!(got, ["<|speaker:0|> Alice speaks.", "<|speaker:2|> Bob speaks."]);
        let all = ChunkVoices::All(vec![reference("Narrator.")]);
        assert_eq!(all.for_speakers(&[5])[0].transcript, "Narrator.", "one voice: as a one-chunk prompt has it");
        let text = CallerText::check("<|speaker:1|> Hi. <|speaker:2|> Yo.".into(), Field::Input).unwrap();
        let chunks = chunk_texts(&text, SplitLimits { target_bytes: 300, first_target_bytes: 300, max_speakers: 3 });
        assert_eq!(chunks[0].speakers, [1, 2]);
    }

    #[test]
    fn the_guard_counts_spoken_characters() {
        assert_eq!(
            frame_bound("<|speaker:1|> Hi [sighs] there."),
            GUARD_BASE_FRAMES + 5 * GUARD_FRAMES_PER_CHAR + 3 * GUARD_FRAMES_PER_CHAR
        );
        assert_eq!(frame_bound("<whisper>ab</whisper>"), GUARD_BASE_FRAMES + 2 * GUARD_FRAMES_PER_CHAR);
    }

    #[test]
    fn pieces_with_nothing_to_say_are_dropped() {
        assert_eq!(without_speaker_tags("<|speaker:3|> a <|speaker:12|>b"), " a b");
        let got = texts("Some words here to fill a chunk. <|speaker:1|><|speaker:2|> Hi.", 34);
        assert!(got.iter().all(|t| !without_speaker_tags(t).trim().is_empty()), "{got:?}");
        // Only tags, longer than a chunk: still one chunk, never none.
        let tags = "<|speaker:1|> ".repeat(30);
        assert_eq!(texts(&tags, 40), vec![tags]);
    }
}
