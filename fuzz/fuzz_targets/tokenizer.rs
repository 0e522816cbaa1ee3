//! `tokenizer.json` loading and the special-token checks on any bytes: an error naming the file,
//! never a panic. The expectations are the tiny checkpoint's (the seed is its tokenizer).
#![no_main]

mod tiny;

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use limelight::checkpoint::tokenizer::tokenizer_from_bytes;

fuzz_target!(|data: &[u8]| {
    // `tokenizer_from_bytes` contains the tokenizers library's panics on malformed files and
    // refuses them; libfuzzer-sys's hook would still abort on those. A panic escaping it still
    // aborts the run (libfuzzer-sys catches around this closure).
    static QUIET: std::sync::Once = std::sync::Once::new();
    QUIET.call_once(|| std::panic::set_hook(Box::new(|_| {})));
    let expect = tiny::tokenizer_expectations();
    if let Err(e) = tokenizer_from_bytes(data, Path::new("tokenizer.json"), &expect) {
        assert!(e.to_string().contains("tokenizer.json"), "{e}");
    }
});
