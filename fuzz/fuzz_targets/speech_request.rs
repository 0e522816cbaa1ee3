//! A speech request body, as the handler takes it: the JSON parsed, every rule validated, the text
//! split into chunks and each chunk's prompt built with the tiny checkpoint's tokenizer. Any bytes
//! give a request or an OpenAI error naming the field, never a panic.
#![no_main]

mod tiny;

use libfuzzer_sys::fuzz_target;
use limelight::api::speech::SpeechRequest;
use limelight::http::error::parse_json;
use limelight::request::chunked::{CHUNK_LIMITS, chunk_texts};
use limelight::request::validate::{SpeechPolicy, validate};

fuzz_target!(|data: &[u8]| {
    let request: SpeechRequest = match parse_json(data) {
        Ok(request) => request,
        Err(e) => {
            let body = serde_json::to_vec(&e.body()).expect("an error body serialises");
            assert!(!body.is_empty());
            return;
        }
    };
    let policy = SpeechPolicy {
        served_model: String::from("drama-3"),
        aliases: vec![String::from("tts-1")],
        max_input_chars: 4096,
        max_frames: 2048,
    };
    let sent = request.input.as_deref().map_or(0, |t| t.chars().count())
        + request.instructions.as_deref().map_or(0, |t| t.chars().count());
    let Ok(valid) = validate(request, &policy) else { return };
    // Normalisation reads numbers, dates and symbols out as words, so the text grows, but by a
    // bounded factor: a request cannot turn into an unbounded prompt.
    let spoken = valid.text.as_str().chars().count();
    assert!(spoken <= 32 * sent + 64, "{sent} characters sent became {spoken}");
    let builder = tiny::prompt_builder();
    if builder.check_text(&valid.text).is_err() {
        return;
    }
    let chunks = chunk_texts(&valid.text, CHUNK_LIMITS);
    assert!(!chunks.is_empty());
    for chunk in &chunks {
        let _ = builder.build_checked(&chunk.text, &[]);
    }
});
