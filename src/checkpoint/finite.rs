//! Finding a non-finite value in a tensor's stored bytes (issue 16, finding 8): a checkpoint
//! with a NaN or an infinity in any weight loaded, reported ready, and then failed every
//! request. The loader refuses it instead, naming the file and the tensor.
//!
//! The scan reads each float element's exponent bits only (all ones is NaN or ±∞; for
//! FP8 E4M3, which has no infinities, only S.1111.111 is NaN). It runs over fixed pieces in
//! parallel, so the 40 GB checkpoint costs one extra pass at memory bandwidth, and the piece
//! it reports is the first in file order whatever the threads do.

use rayon::prelude::*;

use super::Dtype;

/// Bytes each parallel piece scans (a multiple of every element size).
const PIECE: usize = 4 << 20;

/// The exponent mask of a little-endian float element of `dtype`, widened to u64 (its all-ones
/// pattern marks NaN and ±∞); `None` for dtypes whose every bit pattern is a finite number.
fn non_finite_mask(dtype: Dtype) -> Option<u64> {
    match dtype {
        Dtype::F64 => Some(0x7FF0_0000_0000_0000),
        Dtype::F32 => Some(0x7F80_0000),
        Dtype::BF16 => Some(0x7F80),
        Dtype::F16 => Some(0x7C00),
        // E4M3 "fn": no infinities, NaN is exponent and mantissa all ones.
        Dtype::F8E4M3 => Some(0x7F),
        Dtype::F8E5M2 => Some(0x7C),
        Dtype::Bool | Dtype::U8 | Dtype::I8 | Dtype::I16 | Dtype::I32 | Dtype::I64 => None,
    }
}

/// Whether `piece` (whole elements of `size` bytes) holds an element whose bits under `mask`
/// are all ones. Branch-free over the piece, so it vectorises.
fn piece_has(piece: &[u8], size: usize, mask: u64) -> bool {
    fn any<const N: usize>(piece: &[u8], mask: u64, read: fn([u8; N]) -> u64) -> bool {
        piece.chunks_exact(N).fold(false, |seen, c| seen | (read(c.try_into().expect("N bytes")) & mask == mask))
    }
    match size {
        1 | 2 => any_lane(piece, size, mask),
        4 => any::<4>(piece, mask, |b| u64::from(u32::from_le_bytes(b))),
        8 => any::<8>(piece, mask, u64::from_le_bytes),
        _ => unreachable!("float elements are 1, 2, 4 or 8 bytes"),
    }
}

/// [`piece_has`] for 1- and 2-byte elements, eight or four lanes to a u64 word: an element
/// per lane would leave the FP8 experts (most of the checkpoint) scanning at a third of the
/// speed of the reads that feed it. A lane's masked bits equal the mask exactly when
/// `(word & masks) ^ masks` has that lane zero, and the classic zero-lane test
/// `(t - ones) & !t & highs` is non-zero exactly when some lane of `t` is zero (a borrow
/// only starts at a zero lane, so it can add false lanes only beside a true one).
fn any_lane(piece: &[u8], size: usize, mask: u64) -> bool {
    let lanes = 8 / size;
    let spread = |lane: u64| (0..lanes).fold(0u64, |word, i| word | lane << (8 * size * i));
    let (masks, ones, highs) = (spread(mask), spread(1), spread(1 << (8 * size - 1)));
    let words = piece.chunks_exact(8);
    let tail = words.remainder();
    let seen = words.fold(0u64, |seen, w| {
        let t = (u64::from_le_bytes(w.try_into().expect("8 bytes")) & masks) ^ masks;
        seen | (t.wrapping_sub(ones) & !t & highs)
    });
    let mut last = [0u8; 8];
    last[..tail.len()].copy_from_slice(tail);
    // The zero padding never matches: every mask has a bit set.
    let t = (u64::from_le_bytes(last) & masks) ^ masks;
    seen != 0 || t.wrapping_sub(ones) & !t & highs != 0
}

/// Whether `bytes` (whole elements stored as `dtype`) holds a NaN or an infinity, scanned on
/// this thread alone (the file-order load calls it from each of its reading threads).
pub fn has_non_finite(dtype: Dtype, bytes: &[u8]) -> bool {
    non_finite_mask(dtype).is_some_and(|mask| piece_has(bytes, dtype.size(), mask))
}

/// The index of the first element of `bytes` (stored as `dtype`) that is NaN or infinite.
pub fn first_non_finite(dtype: Dtype, bytes: &[u8]) -> Option<usize> {
    let mask = non_finite_mask(dtype)?;
    let size = dtype.size();
    let piece = bytes.par_chunks(PIECE).position_first(|piece| piece_has(piece, size, mask))?;
    let start = piece * PIECE;
    let end = (start + PIECE).min(bytes.len());
    let within = bytes[start..end].chunks_exact(size).position(|c| {
        let mut wide = [0u8; 8];
        wide[..size].copy_from_slice(c);
        u64::from_le_bytes(wide) & mask == mask
    })?;
    Some(start / size + within)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bf16_bytes(values: &[f32]) -> Vec<u8> {
        values.iter().flat_map(|&v| half::bf16::from_f32(v).to_bits().to_le_bytes()).collect()
    }

    #[test]
    fn finite_tensors_pass_in_every_float_dtype() {
        let values: Vec<f32> = (0..10_000).map(|i| (i as f32 - 5000.0) * 1.7e-3).collect();
        let f32s: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let f16s: Vec<u8> = values.iter().flat_map(|&v| half::f16::from_f32(v).to_bits().to_le_bytes()).collect();
        let f64s: Vec<u8> = values.iter().flat_map(|&v| f64::from(v).to_le_bytes()).collect();
        assert_eq!(first_non_finite(Dtype::F32, &f32s), None);
        assert_eq!(first_non_finite(Dtype::BF16, &bf16_bytes(&values)), None);
        assert_eq!(first_non_finite(Dtype::F16, &f16s), None);
        assert_eq!(first_non_finite(Dtype::F64, &f64s), None);
        // Every finite E4M3 pattern, both signs: only 0x7F and 0xFF are NaN.
        let fp8: Vec<u8> = (0u8..=255).filter(|b| b & 0x7F != 0x7F).collect();
        assert_eq!(first_non_finite(Dtype::F8E4M3, &fp8), None);
        // Integers are never refused.
        assert_eq!(first_non_finite(Dtype::I32, &[0xFF; 64]), None);
    }

    #[test]
    fn the_first_nan_or_infinity_is_found_across_pieces() {
        let n = 3 * PIECE / 2 + 7; // elements: the bf16 bytes span three pieces
        for (at, bad) in [(0, f32::NAN), (n / 2, f32::INFINITY), (n - 1, f32::NEG_INFINITY), (PIECE / 2, f32::NAN)] {
            let mut values = vec![0.5f32; n];
            values[at] = bad;
            // A second one later must not be the one reported.
            if at + 1 < n {
                values[n - 1] = f32::NAN;
            }
            assert_eq!(first_non_finite(Dtype::BF16, &bf16_bytes(&values)), Some(at), "{bad} at {at}");
        }
        assert_eq!(first_non_finite(Dtype::F8E4M3, &[0x10, 0x20, 0xFF, 0x7F]), Some(2));
        assert_eq!(first_non_finite(Dtype::F32, &[0, 0, 0x80, 0x7F]), Some(0));
        assert_eq!(first_non_finite(Dtype::F16, &[0, 0, 0, 0x7C]), Some(1));
    }

    #[test]
    fn the_word_at_a_time_scan_agrees_with_one_element_at_a_time() {
        // Every 1- and 2-byte float dtype, a bad element at every position of buffers whose
        // lengths leave every possible tail, among neighbours one bit short of the mask (the
        // values a borrow between lanes would misread).
        for dtype in [Dtype::F8E4M3, Dtype::F8E5M2, Dtype::BF16, Dtype::F16] {
            let (size, mask) = (dtype.size(), non_finite_mask(dtype).expect("a float"));
            let near = |i: usize| {
                (mask & !(1 << (i % mask.count_ones() as usize + mask.trailing_zeros() as usize))).to_le_bytes()
            };
            for n in 1..=19 {
                let clean: Vec<u8> = (0..n).flat_map(|i| near(i)[..size].to_vec()).collect();
                assert!(!has_non_finite(dtype, &clean), "{dtype:?}, {n} elements, all finite");
                for at in 0..n {
                    let mut bytes = clean.clone();
                    bytes[at * size..(at + 1) * size]
                        .copy_from_slice(&(mask | 1 << (8 * size - 1)).to_le_bytes()[..size]);
                    assert!(has_non_finite(dtype, &bytes), "{dtype:?}, {n} elements, bad at {at}");
                }
            }
        }
    }

    #[test]
    fn the_one_thread_scan_agrees() {
        let mut values = vec![0.25f32; 4099];
        assert!(!has_non_finite(Dtype::BF16, &bf16_bytes(&values)));
        values[4098] = f32::INFINITY;
        assert!(has_non_finite(Dtype::BF16, &bf16_bytes(&values)));
        assert!(has_non_finite(Dtype::F8E4M3, &[0x10, 0xFF]));
        assert!(!has_non_finite(Dtype::U8, &[0xFF; 8]));
    }
}
