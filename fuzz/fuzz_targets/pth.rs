//! The `codec.pth` reader (zip records, the restricted pickle VM, tensor views) on any bytes: an
//! error, never a panic, and every tensor it accepts reads inside its storage. Nothing in the
//! archive can run: the VM knows only the globals a state dict needs.
#![no_main]

use libfuzzer_sys::fuzz_target;
use limelight::checkpoint::pickle::unpickle;
use limelight::checkpoint::pth::resolve_tensors;

fuzz_target!(|data: &[u8]| {
    // The VM alone, on the whole input as a pickle stream.
    let _ = unpickle(data);
    // The archive: the same bytes as a zip file.
    if let Ok(tensors) = resolve_tensors(data) {
        for (name, t) in &tensors {
            assert!(!name.is_empty() || tensors.len() == 1, "{t:?}");
            let _ = t.numel();
            let _ = t.is_contiguous();
        }
    }
});
