//! Long text split into chunks (`request::split`), checked as properties over generated scripts:
//! pieces of prose, punctuation, white space, bracketed directions, paired word tags and speaker
//! turns, whose atoms the generator records.
//! - the chunks concatenate back to the input, none empty;
//! - no chunk boundary falls inside an atom (a tag, a direction, a tagged span);
//! - no chunk holds more speakers than allowed, and each knows the speaker it starts in;
//! - a chunk is at most twice the target, unless an atom makes it longer.

use limelight::request::split::{SplitLimits, split};
use proptest::prelude::*;

/// One generated piece of a script: its text, and whether it is an atom.
fn piece() -> impl Strategy<Value = (String, bool)> {
    prop_oneof![
        4 => "[a-zA-Z]{1,12}".prop_map(|w| (w, false)),
        3 => Just((String::from(" "), false)),
        1 => prop_oneof![Just(". "), Just("! "), Just("? "), Just(", "), Just("; "), Just("\n\n"), Just("\n"), Just("。"), Just("…\" ")]
            .prop_map(|p| (p.to_owned(), false)),
        1 => "[a-z ,]{1,30}".prop_map(|d| (format!("[{d}]"), true)),
        1 => "[a-z .]{0,40}".prop_map(|w| (format!("<whisper>{w}</whisper>"), true)),
        1 => (0u32..16).prop_map(|s| (format!("<|speaker:{s}|>"), true)),
        1 => "[a-z]{0,4}".prop_map(|w| (format!("<|{w}|>"), true)),
    ]
}

/// A script, and the byte spans of its atoms.
fn script() -> impl Strategy<Value = (String, Vec<(usize, usize)>)> {
    proptest::collection::vec(piece(), 1..120).prop_map(|pieces| {
        let (mut text, mut atoms) = (String::new(), Vec::new());
        for (p, atom) in pieces {
            if atom {
                atoms.push((text.len(), text.len() + p.len()));
            }
            text.push_str(&p);
        }
        (text, atoms)
    })
}

/// The speaker speaking at byte `at`: the last speaker tag at or before it (0 before any).
fn speaker_at(text: &str, at: usize) -> u32 {
    let mut speaker = 0;
    for (i, _) in text.match_indices("<|speaker:") {
        if i > at {
            break;
        }
        let digits: String = text[i + 10..].chars().take_while(char::is_ascii_digit).collect();
        speaker = digits.parse().expect("generated tags are well formed");
    }
    speaker
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn chunks_rebuild_the_input_and_respect_atoms_and_speakers(
        (text, atoms) in script(),
        target in 8usize..200,
        first in 4usize..200,
        max_speakers in 1usize..4,
    ) {
        let chunks = split(&text, SplitLimits { target_bytes: target, first_target_bytes: first, max_speakers });
        // Text that fits one chunk stays one chunk, whatever the first chunk's size.
        let whole = split(&text, SplitLimits { target_bytes: target, first_target_bytes: target, max_speakers });
        if whole.len() == 1 {
            prop_assert_eq!(chunks.len(), 1);
        }
        let mut at = 0;
        for c in &chunks {
            prop_assert_eq!(c.range.start, at, "chunks are contiguous");
            prop_assert!(!c.range.is_empty(), "no empty chunk");
            at = c.range.end;
        }
        prop_assert_eq!(at, text.len(), "chunks cover the input");
        let rebuilt: String = chunks.iter().map(|c| &text[c.range.clone()]).collect();
        prop_assert_eq!(&rebuilt, &text);

        let longest_atom = atoms.iter().map(|(s, e)| e - s).max().unwrap_or(0);
        for c in &chunks {
            let end = c.range.end;
            prop_assert!(
                !atoms.iter().any(|&(s, e)| s < end && end < e),
                "a boundary at {} splits an atom: {:?}", end, &text[c.range.clone()]
            );
            prop_assert!(c.speakers.len() <= max_speakers, "{:?} holds {:?}", &text[c.range.clone()], c.speakers);
            prop_assert_eq!(c.speaker, speaker_at(&text, c.range.start));
            prop_assert!(c.speakers.contains(&c.speaker));
            prop_assert!(
                c.range.len() <= 2 * target + longest_atom,
                "{} bytes for a target of {}: {:?}", c.range.len(), target, &text[c.range.clone()]
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Normalisation (`request::normalize`) never panics, leaves every tag and direction as it
    /// was and in order, and keeps checked text checked.
    #[test]
    fn normalizing_keeps_tags_and_checked_text(
        (text, atoms) in script(),
        numbers in proptest::collection::vec("[-$€£]?[0-9]{1,6}([.,:][0-9]{1,3})?(%| ?km|st| ?°C| ?pm)?", 0..8),
    ) {
        use limelight::request::normalize::normalize;
        use limelight::request::text::{CallerText, Field};
        let mut mixed = text.clone();
        for n in &numbers {
            mixed.push(' ');
            mixed.push_str(n);
        }
        let out = normalize(&mixed);
        let mut at = 0;
        for &(start, end) in &atoms {
            let atom = &text[start..end];
            let found = out[at..].find(atom);
            prop_assert!(found.is_some(), "{:?} lost from {:?}", atom, out);
            at += found.unwrap() + atom.len();
        }
        if CallerText::check(mixed.clone(), Field::Input).is_ok() {
            prop_assert!(CallerText::check(out.clone(), Field::Input).is_ok(), "{:?} → {:?}", mixed, out);
        }
    }
}
