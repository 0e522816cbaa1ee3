//! Caller-text rules of the prompt (`model.md` §7 "Validation"): empty text, structural tokens and
//! malformed speaker tags are refused, and text is tagged `<|speaker:0|> ` unless a tag leads it.
//!
//! Written from S1 `prompt.py` (`validate_caller_text`, `with_speaker_tag`); where model.md and
//! that code differ, the code wins.

use std::fmt;

/// Tokens only the prompt builder writes, in the order S1 checks them (the first found is named).
/// `<|semantic:` is a prefix: any semantic token, well-formed or not, is refused.
pub const STRUCTURAL_MARKERS: [&str; 6] =
    ["<|im_start|>", "<|im_end|>", "<|voice|>", "<|text|>", "<|interleave|>", "<|semantic:"];

/// The tokenizer has `<|speaker:0|>` through `<|speaker:15|>`.
pub const MAX_SPEAKER_ID: u32 = 15;

/// Where in the request a piece of text came from; names the field in errors (HTTP 400 `param`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Field {
    /// The text to speak (`input`).
    Input,
    /// The transcript or codes of reference `i` (0-based, as S1 names it: `references.i`).
    Reference(usize),
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Field::Input => f.write_str("input"),
            Field::Reference(i) => write!(f, "references.{i}"),
        }
    }
}

/// Why caller text was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TextError {
    #[error("{field}: text must not be empty")]
    Empty { field: Field },
    #[error("{field}: {token} is written by the prompt builder and must not appear in caller text")]
    StructuralToken { field: Field, token: &'static str },
    #[error(
        "{field}: speaker tags must be written <|speaker:N|> with N in 0..{MAX_SPEAKER_ID} and no leading zero; got {found:?}"
    )]
    BadSpeakerTag { field: Field, found: String },
    /// A special token of the checkpoint's tokenizer other than a speaker tag (it would become
    /// one control token of the prompt, not text).
    #[error("{field}: {token} is a special token of the tokenizer and must not appear in caller text")]
    SpecialToken { field: Field, token: String },
}

impl TextError {
    /// The field the text came from.
    pub fn field(&self) -> Field {
        match self {
            TextError::Empty { field }
            | TextError::StructuralToken { field, .. }
            | TextError::BadSpeakerTag { field, .. }
            | TextError::SpecialToken { field, .. } => *field,
        }
    }
}

/// The Unicode `White_Space` property, which is what S1 strips (`str.strip()` with no argument
/// would also strip U+001C..U+001F). Rust's `char::is_whitespace` is defined as that property.
pub fn is_white_space(c: char) -> bool {
    c.is_whitespace()
}

/// Refuses text that is empty after white space, holds a structural token, or holds a
/// `<|speaker` that is not a well-formed tag for speaker 0..15.
pub fn validate_caller_text(text: &str, field: Field) -> Result<(), TextError> {
    if text.trim_matches(is_white_space).is_empty() {
        return Err(TextError::Empty { field });
    }
    if let Some(token) = STRUCTURAL_MARKERS.into_iter().find(|t| text.contains(t)) {
        return Err(TextError::StructuralToken { field, token });
    }
    for (at, _) in text.match_indices("<|speaker") {
        if speaker_tag_at(&text[at..]).is_none() {
            return Err(TextError::BadSpeakerTag { field, found: fragment(&text[at..]) });
        }
    }
    Ok(())
}

/// Caller text that passed [`validate_caller_text`]: the request layer checks `input` once,
/// and the prompt builder takes it as it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallerText(String);

impl CallerText {
    /// Checks `text` as `field`.
    pub fn check(text: String, field: Field) -> Result<CallerText, TextError> {
        validate_caller_text(&text, field)?;
        Ok(CallerText(text))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// `[direction] ` before the text; after a leading speaker tag, so the tag still leads the
    /// text and keeps choosing the speaker. A [`Direction`] holds no `[`, `]` or `<|`, so the
    /// result is still valid caller text.
    pub fn with_direction(&self, direction: &Direction) -> CallerText {
        let (input, d) = (self.0.as_str(), direction.0.as_str());
        let body = input.trim_start_matches(is_white_space);
        let text = match speaker_tag_at(body) {
            Some((len, _)) => {
                let rest = body[len..].trim_start_matches(is_white_space);
                format!("{} [{d}] {rest}", &body[..len])
            }
            None => format!("[{d}] {input}"),
        };
        debug_assert!(validate_caller_text(&text, Field::Input).is_ok(), "a direction keeps text valid");
        CallerText(text)
    }
}

/// A delivery direction (the request's `instructions`), trimmed and non-empty: one bracketed
/// direction, so it may not close the bracket early or carry tags or structural tokens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Direction(String);

impl Direction {
    /// `None` for blank instructions; `Err` with the reason for ones that cannot be a direction.
    pub fn check(instructions: &str) -> Result<Option<Direction>, &'static str> {
        let d = instructions.trim_matches(is_white_space);
        if d.is_empty() {
            return Ok(None);
        }
        if d.contains(['[', ']']) {
            return Err("must not contain `[` or `]`: they become one bracketed direction");
        }
        if d.contains("<|") {
            return Err("must not contain `<|` tokens (tags belong in `input`)");
        }
        Ok(Some(Direction(d.to_owned())))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The length of the markup at the start of `s`, if it starts with some: a `<|…|>` token, a
/// closed `[…]` direction, or a `<name>` / `</name>` word tag. Text rewriting (`split`,
/// `normalize`) never looks inside it.
pub fn markup_len(s: &str) -> Option<usize> {
    if s.starts_with("<|") {
        return s.find("|>").map(|end| end + 2);
    }
    if s.starts_with('[') {
        return s.find(']').map(|end| end + 1);
    }
    let rest = s.strip_prefix("</").or_else(|| s.strip_prefix('<'))?;
    let name = rest.bytes().take_while(|b| b.is_ascii_alphanumeric() || *b == b'_' || *b == b'-').count();
    (name > 0 && rest.as_bytes().get(name) == Some(&b'>')).then(|| s.len() - rest.len() + name + 1)
}

/// A well-formed speaker tag at the start of `s`: its length in bytes and its speaker id.
/// Well-formed means `<|speaker:` + ASCII digits spelling 0..15 without a leading zero + `|>`.
pub fn speaker_tag_at(s: &str) -> Option<(usize, u32)> {
    let rest = s.strip_prefix("<|speaker:")?;
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    let number = &rest[..digits];
    rest[digits..].strip_prefix("|>")?;
    // The spellings the tokenizer has: "0".."15", so "00" or "07" are refused.
    if digits == 0 || (digits > 1 && number.starts_with('0')) {
        return None;
    }
    let id: u32 = number.parse().ok().filter(|&n| n <= MAX_SPEAKER_ID)?;
    Some(("<|speaker:".len() + digits + "|>".len(), id))
}

/// Text that starts (after white space) with a speaker tag, unchanged; otherwise tagged with
/// `default_speaker` followed by one space (S1 `with_speaker_tag`).
pub fn with_speaker_tag(text: &str, default_speaker: u32) -> String {
    if speaker_tag_at(text.trim_start_matches(is_white_space)).is_some() {
        text.to_owned()
    } else {
        format!("<|speaker:{default_speaker}|> {text}")
    }
}

/// A reference transcript as it follows `"Text: "`: tagged as above, then a tag behind leading
/// white space moves in front of it (S1 `build_prompt_rows`), so the tag directly follows `Text: `.
pub fn reference_transcript(transcript: &str) -> String {
    let tagged = with_speaker_tag(transcript, 0);
    let body = tagged.trim_start_matches(is_white_space);
    let leading = &tagged[..tagged.len() - body.len()];
    let (tag_len, _) = speaker_tag_at(body).expect("with_speaker_tag leaves a leading tag");
    format!("{}{leading}{}", &body[..tag_len], &body[tag_len..])
}

/// The offending piece of text for an error message: from `<|speaker` up to its `|>` (or at
/// most 32 characters), so a long input is not echoed whole.
fn fragment(s: &str) -> String {
    let end = s.find("|>").map(|i| i + 2).unwrap_or(s.len());
    s[..end].chars().take(32).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// S1 spells the set out explicitly; check Rust's property table agrees on every scalar value.
    #[test]
    fn white_space_matches_s1_list() {
        let mut s1: Vec<u32> = (0x9..0xE).chain([0x20, 0x85, 0xA0, 0x1680]).chain(0x2000..0x200B).collect();
        s1.extend([0x2028, 0x2029, 0x202F, 0x205F, 0x3000]);
        for c in (0..=0x10FFFFu32).filter_map(char::from_u32) {
            assert_eq!(is_white_space(c), s1.contains(&(c as u32)), "U+{:04X}", c as u32);
        }
    }

    #[test]
    fn speaker_tags() {
        assert_eq!(speaker_tag_at("<|speaker:0|>x"), Some((13, 0)));
        assert_eq!(speaker_tag_at("<|speaker:15|>"), Some((14, 15)));
        for bad in
            ["<|speaker:16|>", "<|speaker:01|>", "<|speaker:00|>", "<|speaker:|>", "<|speaker:1", "<|speaker:a|>"]
        {
            assert_eq!(speaker_tag_at(bad), None, "{bad}");
        }
        // An unbounded digit run must not overflow into a panic.
        assert_eq!(speaker_tag_at("<|speaker:99999999999999999999999|>"), None);
    }

    #[test]
    fn tagging_rules() {
        assert_eq!(with_speaker_tag("hi", 0), "<|speaker:0|> hi");
        assert_eq!(with_speaker_tag("  <|speaker:3|>hi", 0), "  <|speaker:3|>hi");
        assert_eq!(reference_transcript("  <|speaker:3|>hi"), "<|speaker:3|>  hi");
        assert_eq!(reference_transcript("  hi"), "<|speaker:0|>   hi");
        assert_eq!(reference_transcript("a <|speaker:1|> b"), "<|speaker:0|> a <|speaker:1|> b");
    }

    #[test]
    fn refusals_name_what_was_found() {
        let e = validate_caller_text("a <|voice|> b <|im_start|>", Field::Reference(2)).unwrap_err();
        assert_eq!(e, TextError::StructuralToken { field: Field::Reference(2), token: "<|im_start|>" });
        assert!(e.to_string().starts_with("references.2: <|im_start|>"), "{e}");
        let e = validate_caller_text("ok <|speaker:007|> no", Field::Input).unwrap_err();
        assert_eq!(e, TextError::BadSpeakerTag { field: Field::Input, found: "<|speaker:007|>".into() });
        assert_eq!(validate_caller_text(" \u{3000}\n", Field::Input), Err(TextError::Empty { field: Field::Input }));
        // U+001C is not White_Space, so S1 does not treat it as empty.
        assert_eq!(validate_caller_text("\u{1C}", Field::Input), Ok(()));
    }
}
