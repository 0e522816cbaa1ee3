//! Splitting long caller text into chunks sized for the model (issue 15): Drama 3 is trained on
//! short segments, so a chapter or a script is generated chunk by chunk.
//!
//! Rules:
//! - Never inside an **atom**: a `<|…|>` token (speaker tags included), a bracketed direction
//!   `[…]`, or a paired word tag `<name>…</name>` with everything between (an unpaired `<name>` is
//!   an atom of its own).
//! - Chunks end at the strongest boundary the window offers, preferring, in order: before a
//!   speaker turn, after a paragraph break, after a sentence end, after a clause mark, after any
//!   white space. A boundary after punctuation takes the white space that follows with it, so a
//!   chunk never starts with white space the previous one ended on.
//! - A chunk holds at most `max_speakers` speakers: a turn that would add one more starts a new
//!   chunk.
//! - Chunks concatenate back to the input exactly (byte ranges of it).
//! - Text that needs more than one chunk starts small: its first chunk aims for
//!   `first_target_bytes`, and each later one for no more than all the text before it, up to
//!   `target_bytes` (100, 100, 200, 300, 300… bytes). A long text's first audio then waits on no
//!   more text than a short request's, and a later chunk, whose audio is held until it ends, is
//!   no longer than the audio already sent before it: a stream at 2× real time makes it before
//!   that audio has played.
//! - Text with no boundary for `2 × target` bytes (a run with no space or punctuation) is cut
//!   between characters outside any atom; an atom longer than that stays whole.

use std::ops::Range;

use super::text::{MAX_SPEAKER_ID, markup_len, speaker_tag_at};

/// How to cut.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SplitLimits {
    /// Bytes a chunk aims for; chunks end at the best boundary between half this and this.
    pub target_bytes: usize,
    /// Bytes the first chunk of text longer than one chunk aims for (each later one aims for at
    /// most the bytes before it, up to `target_bytes`). Text that fits one chunk stays one chunk.
    pub first_target_bytes: usize,
    /// Speakers one chunk may hold.
    pub max_speakers: usize,
}

/// One chunk of the input.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chunk {
    /// Its bytes of the input.
    pub range: Range<usize>,
    /// The speaker speaking where it starts (0 before any tag): a chunk that starts inside a
    /// turn is tagged with it.
    pub speaker: u32,
    /// The speakers it holds, ascending.
    pub speakers: Vec<u32>,
}

/// How good a place to cut is (higher is better).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Strength {
    /// Between two characters with nothing else going for it.
    Char,
    Space,
    Clause,
    Sentence,
    Paragraph,
    Turn,
}

/// A place the text may be cut.
#[derive(Clone, Copy, Debug)]
struct Boundary {
    at: usize,
    strength: Strength,
}

/// Splits `text` into chunks (see the module's rules). Empty text gives no chunks.
///
/// # Panics
/// If `limits.target_bytes`, `limits.first_target_bytes` or `limits.max_speakers` is 0.
pub fn split(text: &str, limits: SplitLimits) -> Vec<Chunk> {
    let SplitLimits { target_bytes, first_target_bytes, max_speakers } = limits;
    assert!(target_bytes > 0 && first_target_bytes > 0 && max_speakers > 0, "chunks of nothing");
    let (boundaries, turns) = scan(text);
    let mut chunks = Vec::new();
    let mut start = 0;
    // Text that fits one chunk is one chunk. Longer text starts with a short chunk, and each
    // later one aims for no more than all the text before it.
    let long = next_end(text, 0, &boundaries, &turns, target_bytes, max_speakers) < text.len();
    while start < text.len() {
        let target = match start {
            0 if long => first_target_bytes.min(target_bytes),
            0 => target_bytes,
            _ => start.min(target_bytes),
        };
        let end = next_end(text, start, &boundaries, &turns, target, max_speakers);
        chunks.push(chunk(start..end, &turns));
        start = end;
    }
    chunks
}

/// Where the chunk starting at `start` and aiming for `target` bytes ends. Boundaries and turns
/// are ascending: only the ones from `start` on are looked at, so splitting a chapter costs time
/// in proportion to its length (looking from the text's start for each chunk made a 80 000-byte
/// script take 0.4 s before its first audio).
fn next_end(
    text: &str,
    start: usize,
    boundaries: &[Boundary],
    turns: &[(usize, u32)],
    target: usize,
    max_speakers: usize,
) -> usize {
    let (low, high) = (start + target / 2, start + target);
    // The first turn that would bring one speaker too many must start the next chunk. Turns past
    // `high` cannot end this chunk sooner than `high` does.
    let mut speakers = vec![speaker_at(start, turns)];
    let later_turns = &turns[turns.partition_point(|&(at, _)| at <= start)..];
    let speaker_cap = (later_turns.iter()).take_while(|&&(at, _)| at <= high).find_map(|&(at, speaker)| {
        if !speakers.contains(&speaker) {
            speakers.push(speaker);
        }
        (speakers.len() > max_speakers).then_some(at)
    });
    if text.len() <= high && speaker_cap.is_none() {
        return text.len();
    }
    let cap = speaker_cap.map_or(high, |c| c.min(high));
    let later = &boundaries[boundaries.partition_point(|b| b.at <= start)..];
    let up_to_cap = &later[..later.partition_point(|b| b.at <= cap)];
    let real = |b: &&Boundary| b.strength > Strength::Char;
    // The strongest real boundary in [low, cap], the last of equals (the fullest chunk); else the
    // last real one before it (a short chunk rather than a cut word).
    let window = up_to_cap.iter().filter(real).filter(|b| b.at >= low.min(cap));
    if let Some(best) = window.max_by_key(|b| (b.strength, b.at)) {
        return best.at;
    }
    if let Some(b) = up_to_cap.iter().rfind(real) {
        return b.at;
    }
    // No real boundary before the cap (a long atom or a run with no space or mark): the first
    // real one after it, or a cut between characters at twice the target, whichever is first.
    let hard = start + 2 * target;
    (later.iter()).find(|b| b.strength > Strength::Char || b.at >= hard).map_or(text.len(), |b| b.at)
}

fn chunk(range: Range<usize>, turns: &[(usize, u32)]) -> Chunk {
    Chunk { speakers: speakers_in(range.clone(), turns), speaker: speaker_at(range.start, turns), range }
}

/// The speaker speaking at byte `at`: the last turn starting at or before it (0 before any).
fn speaker_at(at: usize, turns: &[(usize, u32)]) -> u32 {
    turns[..turns.partition_point(|&(t, _)| t <= at)].last().map_or(0, |&(_, s)| s)
}

/// The speakers speaking anywhere in `range` (the one speaking at its start included).
fn speakers_in(range: Range<usize>, turns: &[(usize, u32)]) -> Vec<u32> {
    let inside = &turns[turns.partition_point(|&(at, _)| at <= range.start)..];
    let inside = &inside[..inside.partition_point(|&(at, _)| at < range.end)];
    let mut out: Vec<u32> =
        std::iter::once(speaker_at(range.start, turns)).chain(inside.iter().map(|&(_, s)| s)).collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// Every boundary of `text` (ascending, none inside an atom) and every speaker turn (the tag's
/// offset and speaker).
fn scan(text: &str) -> (Vec<Boundary>, Vec<(usize, u32)>) {
    let (mut boundaries, mut turns) = (Vec::new(), Vec::new());
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < text.len() {
        let rest = &text[i..];
        if let Some((len, speaker)) = speaker_tag_at(rest) {
            debug_assert!(speaker <= MAX_SPEAKER_ID);
            if i > 0 {
                boundaries.push(Boundary { at: i, strength: Strength::Turn });
            }
            turns.push((i, speaker));
            i += len;
            continue;
        }
        let atom = atom_len(rest);
        if atom > 0 {
            i += atom;
            boundaries.push(Boundary { at: i, strength: Strength::Char });
            continue;
        }
        let c = rest.chars().next().expect("i < len");
        i += c.len_utf8();
        if c.is_whitespace() {
            let run = text[i..].chars().take_while(|c| c.is_whitespace()).map(char::len_utf8).sum::<usize>();
            let newlines = text[i - c.len_utf8()..i + run].matches('\n').count();
            i += run;
            let strength = if newlines >= 2 { Strength::Paragraph } else { Strength::Space };
            boundaries.push(Boundary { at: i, strength });
            continue;
        }
        let mark = punctuation(c);
        if let Some(strength) = mark {
            // Closing quotes and brackets stay with the sentence.
            while let Some(q) = text[i..].chars().next().filter(|q| CLOSERS.contains(q)) {
                i += q.len_utf8();
            }
            let run = text[i..].chars().take_while(|c| c.is_whitespace()).map(char::len_utf8).sum::<usize>();
            // Western marks end something only before white space (or the end); CJK ones always.
            if run > 0 || i == text.len() || !c.is_ascii() {
                let newlines = text[i..i + run].matches('\n').count();
                i += run;
                let strength = if newlines >= 2 { Strength::Paragraph } else { strength };
                boundaries.push(Boundary { at: i, strength });
                continue;
            }
        }
        if bytes.get(i).is_some() {
            boundaries.push(Boundary { at: i, strength: Strength::Char });
        }
    }
    boundaries.retain(|b| b.at < text.len());
    boundaries.dedup_by(|later, earlier| {
        if later.at == earlier.at {
            earlier.strength = earlier.strength.max(later.strength);
            true
        } else {
            false
        }
    });
    (boundaries, turns)
}

/// Characters that close a quotation or a parenthesis after a sentence's mark.
const CLOSERS: [char; 7] = ['"', '\'', '”', '’', ')', '»', '」'];

/// The boundary a punctuation mark makes, if it makes one.
fn punctuation(c: char) -> Option<Strength> {
    match c {
        '.' | '!' | '?' | '…' | '。' | '！' | '？' => Some(Strength::Sentence),
        ',' | ';' | ':' | '—' | '–' | '，' | '；' | '：' | '、' => Some(Strength::Clause),
        _ => None,
    }
}

/// The length of the atom at the start of `s` (0: none): a `<|…|>` token, a closed `[…]`, or a
/// `<name>…</name>` span (or a lone `<name>`).
fn atom_len(s: &str) -> usize {
    // A closing tag on its own is plain text here (a paired one lies inside its span).
    let Some(len) = markup_len(s).filter(|_| !s.starts_with("</")) else { return 0 };
    // An opening word tag takes everything up to its closing tag with it.
    let opening = s[..len].strip_prefix('<').and_then(|t| t.strip_suffix('>')).filter(|n| !n.starts_with(['|', '/']));
    match opening {
        Some(name) => {
            let close = format!("</{name}>");
            s[len..].find(&close).map_or(len, |at| len + at + close.len())
        }
        None => len,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(text: &str, limits: SplitLimits) -> Vec<&str> {
        split(text, limits).into_iter().map(|c| &text[c.range]).collect()
    }

    const SMALL: SplitLimits = SplitLimits { target_bytes: 40, first_target_bytes: 40, max_speakers: 3 };

    #[test]
    fn sentences_before_clauses_before_spaces() {
        let text = "One short sentence here. Then a clause, and more words follow on and on and on and on.";
        assert_eq!(
            texts(text, SMALL),
            ["One short sentence here. ", "Then a clause, ", "and more words follow on and on and on ", "and on."]
        );
    }

    #[test]
    fn atoms_stay_whole() {
        let text = "[whispering, very softly now] <whisper>this part is all one tag span</whisper> after.";
        for piece in texts(text, SplitLimits { target_bytes: 12, first_target_bytes: 12, max_speakers: 3 }) {
            assert_eq!(piece.matches('[').count(), piece.matches(']').count(), "{piece:?}");
            assert_eq!(piece.matches("<whisper>").count(), piece.matches("</whisper>").count(), "{piece:?}");
        }
    }

    #[test]
    fn turns_start_chunks_and_speakers_are_capped() {
        let text = "<|speaker:0|> Hi. <|speaker:1|> Hello. <|speaker:2|> Hey. <|speaker:3|> Yo.";
        let chunks = split(text, SplitLimits { target_bytes: 1000, first_target_bytes: 1000, max_speakers: 2 });
        let speakers: Vec<Vec<u32>> = chunks.iter().map(|c| c.speakers.clone()).collect();
        assert_eq!(speakers, [vec![0, 1], vec![2, 3]]);
        assert!(text[chunks[1].range.clone()].starts_with("<|speaker:2|>"));
        assert_eq!(chunks[1].speaker, 2);
    }

    #[test]
    fn a_chunk_inside_a_turn_knows_its_speaker() {
        let text = "<|speaker:5|> A first sentence of the turn. A second sentence of the same turn.";
        let chunks = split(text, SplitLimits { target_bytes: 48, first_target_bytes: 48, max_speakers: 1 });
        assert_eq!(chunks.len(), 2);
        assert_eq!((chunks[1].speaker, chunks[1].speakers.clone()), (5, vec![5]));
    }

    #[test]
    fn cjk_marks_end_sentences_without_spaces() {
        let text = "今天天气很好。我们去公园散步吧！然后回家吃饭。";
        let pieces = texts(text, SplitLimits { target_bytes: 24, first_target_bytes: 24, max_speakers: 1 });
        assert!(pieces.len() > 1 && pieces.iter().all(|p| p.ends_with(['。', '！'])), "{pieces:?}");
    }

    #[test]
    fn long_text_starts_with_a_short_chunk_and_grows_to_the_target() {
        // Sentences of 20 bytes each: chunk sizes land on whole sentences. Each chunk after the
        // first aims for at most the bytes before it (20, 40, 80, then the 120 target).
        let text = "Here is one phrase. ".repeat(20);
        let limits = SplitLimits { target_bytes: 120, first_target_bytes: 30, max_speakers: 3 };
        let sizes: Vec<usize> = split(&text, limits).iter().map(|c| c.range.len()).collect();
        assert_eq!(sizes, [20, 20, 40, 80, 120, 120], "{sizes:?}");
    }

    #[test]
    fn text_that_fits_one_chunk_ignores_the_first_chunk_size() {
        let text = "Here is one phrase. ".repeat(6);
        let limits = SplitLimits { target_bytes: 120, first_target_bytes: 30, max_speakers: 3 };
        assert_eq!(texts(&text, limits), [text.as_str()]);
        // One speaker too many for one chunk: split, so the first chunk is the short one.
        let text = "<|speaker:0|> Hi there, you. <|speaker:1|> Hello to you. <|speaker:2|> Hey.";
        let limits = SplitLimits { target_bytes: 1000, first_target_bytes: 20, max_speakers: 2 };
        let pieces = texts(text, limits);
        assert_eq!(pieces.concat(), text);
        assert!(pieces[0].len() <= 20 && pieces.len() >= 3, "{pieces:?}");
    }

    #[test]
    fn a_run_without_boundaries_is_cut_between_characters() {
        let text = "a".repeat(100);
        let pieces = texts(&text, SplitLimits { target_bytes: 10, first_target_bytes: 10, max_speakers: 1 });
        assert_eq!(pieces.concat(), text);
        assert!(pieces.iter().all(|p| p.len() <= 20), "{pieces:?}");
    }
}
