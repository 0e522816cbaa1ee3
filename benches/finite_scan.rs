//! The non-finite scan's throughput on one thread (`checkpoint::finite::has_non_finite`, what
//! each file-order reading thread runs over every piece it reads): `cargo bench --bench
//! finite_scan`. Under `cargo test` (no `--bench` argument) it scans a small buffer once, so the
//! test command only checks that it runs.

use std::time::Instant;

use limelight::checkpoint::Dtype;
use limelight::checkpoint::finite::has_non_finite;

fn main() {
    let timed = std::env::args().any(|a| a == "--bench");
    let bytes_len = if timed { 1 << 30 } else { 1 << 16 };
    // Finite in every dtype: bytes below 0x40 never fill an exponent.
    let bytes: Vec<u8> = (0..bytes_len).map(|i: usize| (i.wrapping_mul(2_654_435_761) >> 7) as u8 & 0x3F).collect();
    for dtype in [Dtype::F8E4M3, Dtype::BF16, Dtype::F32] {
        let mut best = f64::MAX;
        for _ in 0..if timed { 3 } else { 1 } {
            let t = Instant::now();
            assert!(!has_non_finite(dtype, std::hint::black_box(&bytes)));
            best = best.min(t.elapsed().as_secs_f64());
        }
        if timed {
            println!(
                "{dtype:?}: {:.2} GB/s over {} MiB (best of 3)",
                bytes.len() as f64 / best / 1e9,
                bytes.len() >> 20
            );
        }
    }
}
