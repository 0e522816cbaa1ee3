//! The safetensors header parser on any bytes: an error, never a panic, and every tensor it
//! accepts lies inside the file.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use limelight::checkpoint::safetensors::parse_header;

fuzz_target!(|data: &[u8]| {
    if let Ok(tensors) = parse_header(Path::new("fuzz.safetensors"), data) {
        for info in tensors.values() {
            assert!(info.bytes.start <= info.bytes.end, "{info:?}");
            assert!(info.bytes.end <= data.len(), "{info:?} past the end of {} bytes", data.len());
        }
    }
});
