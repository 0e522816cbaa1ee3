//! End-to-end checks of the synthetic `tokenizer.json`: it loads, round-trips text, keeps special tokens atomic, matches Python `tokenizers`, and every mismatch with `config.json` is refused by name.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use limelight::checkpoint::tokenizer::{
    SpecialTokenIds, TokenizerExpectations, load_tokenizer, semantic_token, speaker_token,
};
use limelight::synth::tokenizer::{TokenizerSpec, build_tokenizer_json};
use serde_json::{Value, json};
use tokenizers::Tokenizer;

const TINY: TokenizerSpec = TokenizerSpec { n_merges: 700, semantic_codes: 256, seed: 42 };
const FULL: TokenizerSpec = TokenizerSpec { n_merges: 30_000, semantic_codes: 4096, seed: 42 };

/// Bypasses the test harness's output capture so notes show up without `--nocapture`.
fn expect_of(ids: &SpecialTokenIds) -> TokenizerExpectations {
    TokenizerExpectations {
        semantic_start: ids.semantic_start,
        semantic_end: ids.semantic_end,
        semantic_codes: ids.semantic_codes(),
        eos: ids.im_end,
    }
}

/// Writes `json` as `tokenizer.json` in a fresh directory, so error messages name that file.
fn write(dir: &tempfile::TempDir, json: &str) -> PathBuf {
    let path = dir.path().join("tokenizer.json");
    std::fs::write(&path, json).unwrap();
    path
}

fn tiny() -> (tempfile::TempDir, PathBuf, SpecialTokenIds) {
    let (json, ids) = build_tokenizer_json(&TINY);
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, &json);
    (dir, path, ids)
}

/// Builds the tiny tokenizer, lets `edit` change its JSON, and returns the loader's error message.
fn refusal(
    edit: impl FnOnce(&mut Value, &SpecialTokenIds),
    expect: impl FnOnce(&SpecialTokenIds) -> TokenizerExpectations,
) -> String {
    let (json, ids) = build_tokenizer_json(&TINY);
    let mut doc: Value = serde_json::from_str(&json).unwrap();
    edit(&mut doc, &ids);
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, &doc.to_string());
    match load_tokenizer(&path, &expect(&ids)) {
        Ok(_) => panic!("edited tokenizer was accepted"),
        Err(e) => e.to_string(),
    }
}

fn added_tokens(doc: &mut Value) -> &mut Vec<Value> {
    doc["added_tokens"].as_array_mut().unwrap()
}

/// Numbers added tokens in file order from `base`, as the library does, so written ids stay truthful.
fn renumber(list: &mut [Value], base: u32) {
    for (i, t) in list.iter_mut().enumerate() {
        t["id"] = json!(base + i as u32);
    }
}

fn ids(tok: &Tokenizer, text: &str) -> Vec<u32> {
    tok.encode(text, true).unwrap().get_ids().to_vec()
}

#[test]
fn loads_and_round_trips_text() {
    // Full size too: its vocabulary is mostly synthetic merges, which must round-trip like learned ones.
    for spec in [TINY, FULL] {
        let (json, built) = build_tokenizer_json(&spec);
        let dir = tempfile::tempdir().unwrap();
        let (tok, got) = load_tokenizer(&write(&dir, &json), &expect_of(&built)).unwrap();
        assert_eq!(got, built);
        round_trips(&tok, &built);
    }
}

fn round_trips(tok: &Tokenizer, built: &SpecialTokenIds) {
    let texts = [
        "Hello, world! It's 7:30 and we'll go.",
        "今天天气很好，我们一起去公园散步吧。语音合成。",
        "0123456789 3.14159 10,000",
        "one\ntwo\n\n\r\nthree  \t tabs\t",
        "Emoji 👋🏽 🇫🇷 🤖 and ZWJ 👩‍👩‍👧",
        "日本語 한국어 Ελληνικά русский",
        "  surrounding spaces  ",
    ];
    for text in texts {
        let enc = ids(tok, text);
        assert!(!enc.is_empty());
        assert!(enc.iter().all(|&id| id < built.endoftext.unwrap()), "plain text produced a special id: {text:?}");
        assert_eq!(tok.decode(&enc, false).unwrap(), text, "round trip of {text:?}");
    }
    // The NFC normalizer folds a decomposed accent, so decode gives the composed form.
    assert_eq!(tok.decode(&ids(tok, "Cafe\u{301}"), false).unwrap(), "Caf\u{e9}");
    assert_eq!(ids(tok, "Cafe\u{301}"), ids(tok, "Caf\u{e9}"));
}

#[test]
fn special_tokens_are_single_ids_inside_text() {
    let (_dir, path, s) = tiny();
    let (tok, _) = load_tokenizer(&path, &expect_of(&s)).unwrap();
    let enc = ids(&tok, "<|im_start|>user\n<|speaker:3|> hi<|im_end|>\n<|im_start|>assistant\n<|voice|>");
    assert_eq!(enc[0], s.im_start);
    assert_eq!(enc.iter().filter(|&&id| id == s.im_start).count(), 2);
    assert!(enc.contains(&s.speakers[3]) && enc.contains(&s.im_end));
    assert_eq!(*enc.last().unwrap(), s.voice);
    for n in 0..16 {
        assert_eq!(ids(&tok, &speaker_token(n)), [s.speakers[n]]);
    }
    for code in [0usize, 1, 255] {
        assert_eq!(ids(&tok, &semantic_token(code)), [s.semantic_start + code as u32]);
    }
    // Not a token: `<|speaker:16|>` and a leading-zero tag must fall apart into ordinary text.
    for fake in ["<|speaker:16|>", "<|speaker:01|>", "<|semantic:256|>"] {
        assert!(ids(&tok, fake).len() > 1, "{fake} should not be atomic");
    }
}

#[test]
fn same_seed_gives_identical_bytes() {
    let a = build_tokenizer_json(&TINY);
    let b = build_tokenizer_json(&TINY);
    assert_eq!(a.0.as_bytes(), b.0.as_bytes());
    assert_eq!(a.1, b.1);
    let other = build_tokenizer_json(&TokenizerSpec { seed: 43, ..TINY });
    assert_ne!(a.0, other.0, "the seed should change tie-breaks");
    assert_eq!(a.1, other.1, "special-token ids depend only on sizes");
}

#[test]
fn full_size_tokenizer_loads_with_every_token() {
    let (json, full) = build_tokenizer_json(&FULL);
    let tok = Tokenizer::from_bytes(json.as_bytes()).unwrap();
    assert_eq!(full.vocab_len, 256 + 30_000 + 28 + 4096);
    assert_eq!(tok.get_vocab_size(true), full.vocab_len as usize);
}

#[test]
fn missing_speaker_tag_is_refused() {
    let msg = refusal(
        |d, s| {
            let list = added_tokens(d);
            list.retain(|t| t["content"] != "<|speaker:7|>");
            renumber(list, s.endoftext.unwrap());
        },
        expect_of,
    );
    assert!(msg.contains("tokenizer.json") && msg.contains("`<|speaker:7|>` is missing"), "{msg}");
}

#[test]
fn non_contiguous_semantic_band_is_refused() {
    // Move `<|semantic:5|>` to the end of the file, renumbering consistently, so the band has a hole at 5.
    let msg = refusal(
        |d, s| {
            let list = added_tokens(d);
            let at = list.iter().position(|t| t["content"] == "<|semantic:5|>").unwrap();
            let moved = list.remove(at);
            list.push(moved);
            renumber(list, s.endoftext.unwrap());
        },
        expect_of,
    );
    assert!(msg.contains("not contiguous") && msg.contains("`<|semantic:5|>`"), "{msg}");
    assert!(msg.contains(&format!("expected {}", TINY.n_merges + 256 + 28 + 5)), "{msg}");
}

#[test]
fn written_ids_the_library_would_ignore_are_refused() {
    // tokenizers renumbers added tokens in file order, so a written hole would silently shift ids.
    let msg = refusal(
        |d, s| {
            let t = added_tokens(d).iter_mut().find(|t| t["content"] == "<|semantic:5|>").unwrap();
            t["id"] = json!(s.vocab_len);
        },
        expect_of,
    );
    assert!(msg.contains("`<|semantic:5|>` is written with id") && msg.contains("file order"), "{msg}");
}

#[test]
fn eos_mismatch_is_refused() {
    let msg = refusal(|_, _| {}, |s| TokenizerExpectations { eos: s.voice, ..expect_of(s) });
    let want = format!("`<|im_end|>` has id {} but config.json `eos_token_id` is {}", 256 + 700 + 2, 256 + 700 + 5);
    assert!(msg.contains("tokenizer.json: ") && msg.ends_with(&want), "{msg}");
}

#[test]
fn semantic_start_mismatch_is_refused() {
    let msg = refusal(
        |_, _| {},
        |s| TokenizerExpectations {
            semantic_start: s.semantic_start + 1,
            semantic_end: s.semantic_end + 1,
            ..expect_of(s)
        },
    );
    assert!(msg.contains("`<|semantic:0|>` has id") && msg.contains("`semantic_start_token_id`"), "{msg}");
}

#[test]
fn band_size_mismatches_are_refused() {
    // Config wants one more code than the tokenizer has.
    let msg = refusal(
        |_, _| {},
        |s| TokenizerExpectations { semantic_end: s.semantic_end + 1, semantic_codes: 257, ..expect_of(s) },
    );
    assert!(msg.contains("`<|semantic:256|>` is missing") && msg.contains("vocab_size` is 257"), "{msg}");
    // Config wants one fewer: the tokenizer's extra code is refused by name.
    let msg = refusal(
        |_, _| {},
        |s| TokenizerExpectations { semantic_end: s.semantic_end - 1, semantic_codes: 255, ..expect_of(s) },
    );
    assert!(msg.contains("has `<|semantic:255|>`") && msg.contains("vocab_size` is 255"), "{msg}");
    // Config disagrees with itself.
    let msg = refusal(|_, _| {}, |s| TokenizerExpectations { semantic_codes: 4096, ..expect_of(s) });
    assert!(msg.starts_with("config.json: ") && msg.contains("spans 256 ids") && msg.contains("is 4096"), "{msg}");
}

#[test]
fn eos_inside_semantic_band_is_refused() {
    let msg = refusal(|_, _| {}, |s| TokenizerExpectations { eos: s.semantic_start + 3, ..expect_of(s) });
    assert!(msg.contains("`eos_token_id`") && msg.contains("inside the semantic band"), "{msg}");
}

#[test]
fn post_processor_adding_bos_is_refused() {
    let msg = refusal(
        |d, s| {
            let bos = s.endoftext.unwrap();
            d["post_processor"] = json!({
                "type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [bos], "tokens": ["<|endoftext|>"]}},
            });
        },
        expect_of,
    );
    assert!(msg.contains("tokenizer.json") && msg.contains("post-processor adds tokens"), "{msg}");
}

#[test]
fn structural_token_that_is_not_added_is_refused() {
    // `<|voice|>` only in the BPE vocabulary (no merges reach it): encoding prompt text would split it.
    // The added tokens are renumbered after it, as the library would, so only atomicity is wrong.
    let msg = refusal(
        |d, s| {
            let base = s.endoftext.unwrap();
            d["model"]["vocab"]["<|voice|>"] = json!(base);
            let list = added_tokens(d);
            list.retain(|t| t["content"] != "<|voice|>");
            renumber(list, base + 1);
        },
        expect_of,
    );
    assert!(msg.contains("`<|voice|>`") && msg.contains("not an added token"), "{msg}");
}

#[test]
fn unreadable_file_names_the_path() {
    let (json, ids) = build_tokenizer_json(&TINY);
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, &json[..json.len() / 2]);
    let msg = load_tokenizer(&path, &expect_of(&ids)).unwrap_err().to_string();
    assert!(msg.contains(&path.display().to_string()) && msg.contains("cannot load"), "{msg}");
    let missing = dir.path().join("absent.json");
    let msg = load_tokenizer(&missing, &expect_of(&ids)).unwrap_err().to_string();
    assert!(msg.contains("absent.json"), "{msg}");
}

/// Runs `tools/fixtures/check_tokenizer.py` (Python `tokenizers`, Oniguruma regex) and compares every id.
fn python_cross_check(spec: &TokenizerSpec) {
    if !common::python_with(&["tokenizers"]) {
        return;
    }
    let (json, s) = build_tokenizer_json(spec);
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, &json);
    let (tok, _) = load_tokenizer(&path, &expect_of(&s)).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/fixtures/check_tokenizer.py");
    let out = Command::new("python3").arg(&script).arg(&path).output().unwrap();
    assert!(out.status.success(), "check_tokenizer.py failed: {}", String::from_utf8_lossy(&out.stderr));
    let rows: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert!(rows.len() >= 20);
    for row in rows {
        let text = row["text"].as_str().unwrap();
        let py: Vec<u32> = serde_json::from_value(row["ids"].clone()).unwrap();
        assert_eq!(ids(&tok, text), py, "Rust and Python ids differ for {text:?}");
        assert_eq!(tok.decode(&py, false).unwrap(), row["decoded"].as_str().unwrap(), "decode of {text:?}");
    }
}

#[test]
fn python_agrees_on_tiny() {
    python_cross_check(&TINY);
}

#[test]
fn python_agrees_on_full_size() {
    python_cross_check(&FULL);
}

/// Found by `fuzz/fuzz_targets/tokenizer.rs`: a `decoder` whose JSON is broken made tokenizers
/// 0.23 panic (it unwraps its own parse error) instead of returning an error. The file is
/// refused by name, as any other malformed tokenizer.json.
#[test]
fn a_broken_decoder_section_is_refused_naming_the_file() {
    let (json, ids) = build_tokenizer_json(&TINY);
    let decoder = json.find("\"decoder\":{\"type\":").expect("the tiny tokenizer has a decoder");
    let at = decoder + "\"decoder\":{\"type\":".len();
    let broken = format!("{}x{}", &json[..at], &json[at + 1..]);
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, &broken);
    let message = match load_tokenizer(&path, &expect_of(&ids)) {
        Ok(_) => panic!("a broken decoder was accepted"),
        Err(e) => e.to_string(),
    };
    assert!(message.contains("tokenizer.json") && message.contains("cannot load tokenizer"), "{message}");
}
