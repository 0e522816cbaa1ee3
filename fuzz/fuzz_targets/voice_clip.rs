//! The reference-clip decoder (voice uploads and inline references: WAV, FLAC, MP3, Ogg
//! Vorbis/Opus, M4A/AAC) on any bytes: an error, never a panic, and any clip it accepts is
//! finite mono audio within the limits.
#![no_main]

use libfuzzer_sys::fuzz_target;
use limelight::voice::clip::{ClipLimits, decode};

fuzz_target!(|data: &[u8]| {
    // `decode` contains the decoders' panics (third-party code: symphonia's ADTS reader panics on
    // some inputs) and refuses such a file; libfuzzer-sys's panic hook would still abort on them.
    // Its catch around this closure still aborts on any panic that escapes `decode`, so only the
    // contained ones go unreported.
    static QUIET: std::sync::Once = std::sync::Once::new();
    QUIET.call_once(|| std::panic::set_hook(Box::new(|_| {})));
    // The first byte picks the hint a client may send with the upload.
    let Some((&pick, bytes)) = data.split_first() else { return };
    let hints = [None, Some("audio/wav"), Some("flac"), Some("audio/mpeg"), Some("ogg"), Some("m4a")];
    let hint = hints[usize::from(pick) % hints.len()];
    // Short clips keep each run fast; the bounds are the server's.
    let limits = ClipLimits { min_seconds: 0.0, ..ClipLimits::default() };
    if let Ok(clip) = decode(bytes, hint, &limits) {
        assert!(clip.samples.iter().all(|s| s.is_finite()));
        assert!(clip.seconds() <= limits.max_seconds + 1.0);
    }
});
