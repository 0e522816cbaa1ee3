//! Prompt rows (`model.md` §7) against the golden of sglang-omni 0.1.9's own `prompt.py` (mlx-audio
//! 0.6.2's `build_frames` agreed on every case when it was made), and every refusal by name.
//! Regenerate: `cargo build --bin limelight && .cache/reference/venv/bin/python (tools/reference/setup.sh) tools/reference/prompt.py`.

mod common;

use std::path::{Path, PathBuf};

use limelight::checkpoint::tokenizer::{SpecialTokenIds, TokenizerExpectations, load_tokenizer};
use limelight::model::load::Checkpoint;
use limelight::model::vocabulary::Vocabulary;
use limelight::request::{Field, PromptBuilder, PromptError, Reference, TextError};
use serde_json::Value;
use tokenizers::Tokenizer;

const CODEBOOKS: usize = 10;
const CODEBOOK_SIZE: usize = 256;

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/prompt")
}

fn golden() -> Value {
    serde_json::from_str(&std::fs::read_to_string(fixture_dir().join("golden.json")).unwrap()).unwrap()
}

fn fixture_tokenizer(golden: &Value) -> (Tokenizer, SpecialTokenIds) {
    let start = golden["special_tokens"]["semantic_start"].as_u64().unwrap() as u32;
    let expect = TokenizerExpectations {
        semantic_start: start,
        semantic_end: start + CODEBOOK_SIZE as u32 - 1,
        semantic_codes: CODEBOOK_SIZE,
        eos: golden["special_tokens"]["eos"].as_u64().unwrap() as u32,
    };
    load_tokenizer(&fixture_dir().join("tokenizer.json"), &expect).unwrap()
}

fn references(case: &Value) -> Vec<Reference> {
    let codes = |c: &Value| -> Vec<Vec<u32>> {
        c.as_array()
            .unwrap()
            .iter()
            .map(|r| r.as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect())
            .collect()
    };
    case["references"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| Reference { transcript: r["transcript"].as_str().unwrap().to_owned(), codes: codes(&r["codes"]) })
        .collect()
}

fn golden_rows(case: &Value) -> Vec<u32> {
    case["rows"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r.as_array().unwrap())
        .map(|v| v.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn rows_match_the_reference_for_every_case() {
    let g = golden();
    let (tokenizer, special) = fixture_tokenizer(&g);
    let builder = PromptBuilder::new(Vocabulary::new(std::sync::Arc::new(tokenizer), &special, CODEBOOKS));
    let cases = g["built"].as_array().unwrap();
    assert!(cases.len() >= 10, "the golden holds {} cases", cases.len());
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let Some(rows) = built_unless_control_tokens(&builder, case) else { continue };
        assert_eq!(rows.width(), 1 + CODEBOOKS);
        assert_eq!(rows.as_flat(), golden_rows(case).as_slice(), "case {name}: rows differ from sglang-omni's");
        // Every prompt ends where generation starts.
        assert_eq!(rows.token(rows.len() - 1), special.voice, "case {name}");
    }
}

/// The `kind` tags written by tools/reference/prompt.py, as our error values.
fn expected_error(kind: &str) -> (String, Field) {
    let (what, field) = kind.split_once('@').unwrap_or((kind, "input"));
    let field = match field.strip_prefix("references.") {
        Some(i) => Field::Reference(i.parse().unwrap()),
        None => Field::Input,
    };
    (what.to_owned(), field)
}

fn kind_of(e: &PromptError) -> String {
    match e {
        PromptError::Text(TextError::Empty { .. }) => "empty".into(),
        PromptError::Text(TextError::StructuralToken { token, .. }) => format!("structural:{token}"),
        PromptError::Text(TextError::BadSpeakerTag { .. }) => "speaker".into(),
        PromptError::Text(TextError::SpecialToken { token, .. }) => format!("special:{token}"),
        PromptError::CodeOutOfRange { .. } => "code_range".into(),
        PromptError::CodesShape { .. } => "codes_shape".into(),
        PromptError::Tokenizer { .. } => "tokenizer".into(),
    }
}

#[test]
fn refusals_match_the_reference_and_name_the_problem() {
    let g = golden();
    let (tokenizer, special) = fixture_tokenizer(&g);
    let builder = PromptBuilder::new(Vocabulary::new(std::sync::Arc::new(tokenizer), &special, CODEBOOKS));
    for case in g["refused"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let err = builder.build(case["text"].as_str().unwrap(), &references(case)).unwrap_err();
        let (kind, field) = expected_error(case["kind"].as_str().unwrap());
        assert_eq!(kind_of(&err), kind, "case {name}: {err}");
        assert_eq!(err.field(), Some(field), "case {name}");
        let message = err.to_string();
        assert!(message.starts_with(&format!("{field}: ")), "case {name}: {message}");
        // S1's message for the same input starts with the same field name.
        assert!(case["s1_message"].as_str().unwrap().starts_with(&format!("{field}: ")), "case {name}");
        if let Some(token) = kind.strip_prefix("structural:") {
            assert!(message.contains(token), "case {name}: {message}");
        }
    }
}

#[test]
fn speaker_refusal_quotes_the_bad_tag() {
    let g = golden();
    let (tokenizer, special) = fixture_tokenizer(&g);
    let builder = PromptBuilder::new(Vocabulary::new(std::sync::Arc::new(tokenizer), &special, CODEBOOKS));
    let err = builder.build("fine so far <|speaker:16|> then more", &[]).unwrap_err();
    assert_eq!(
        err,
        PromptError::Text(TextError::BadSpeakerTag { field: Field::Input, found: "<|speaker:16|>".into() })
    );
    assert!(err.to_string().contains("<|speaker:16|>"), "{err}");
    let codes = vec![vec![1u32, 2]; CODEBOOKS];
    let mut bad = codes.clone();
    bad[3][1] = 999;
    let refs = [Reference { transcript: "ok".into(), codes }, Reference { transcript: "ok".into(), codes: bad }];
    let err = builder.build("fine", &refs).unwrap_err();
    assert_eq!(
        err,
        PromptError::CodeOutOfRange {
            field: Field::Reference(1),
            codebook: 3,
            frame: 1,
            code: 999,
            codebook_size: CODEBOOK_SIZE
        }
    );
    let mut ragged = vec![vec![1u32, 2]; CODEBOOKS];
    ragged[9].pop();
    let err = builder.build("fine", &[Reference { transcript: "ok".into(), codes: ragged }]).unwrap_err();
    assert!(matches!(err, PromptError::CodesShape { field: Field::Reference(0), .. }), "{err}");
}

/// The builder made from an opened checkpoint is the same builder: the fixture's tokenizer is the
/// tiny checkpoint's (seed 7), so its rows are the golden's.
#[test]
fn builder_from_a_checkpoint_matches_the_golden() {
    let dir = common::tiny_checkpoint();
    assert_eq!(
        std::fs::read(dir.path().join("tokenizer.json")).unwrap(),
        std::fs::read(fixture_dir().join("tokenizer.json")).unwrap(),
        "the synthesizer's tiny tokenizer changed: regenerate tests/fixtures/prompt (see versions.json)"
    );
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let builder = PromptBuilder::for_checkpoint(&ckpt);
    let g = golden();
    for case in g["built"].as_array().unwrap() {
        let Some(rows) = built_unless_control_tokens(&builder, case) else { continue };
        assert_eq!(rows.as_flat(), golden_rows(case).as_slice(), "case {}", case["name"]);
    }
}

/// The golden case's rows, or `None` for the one case whose text holds special tokens other than
/// speaker tags (`other_special_tokens_are_content`): S1 builds it, each token one control
/// token of the prompt; limelight refuses it on purpose (issue 16, finding 4), naming the first.
fn built_unless_control_tokens(builder: &PromptBuilder, case: &Value) -> Option<limelight::model::frame::Rows> {
    let (name, text) = (case["name"].as_str().unwrap(), case["text"].as_str().unwrap());
    match builder.build(text, &references(case)) {
        Ok(rows) => Some(rows),
        Err(PromptError::Text(TextError::SpecialToken { field: Field::Input, token })) => {
            assert_eq!((name, token.as_str()), ("other_special_tokens_are_content", "<|endoftext|>"));
            None
        }
        Err(e) => panic!("case {name}: {e}"),
    }
}
