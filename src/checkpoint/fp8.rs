//! FP8 formats on the host: exact decoding, and round-to-nearest-even encoding with the
//! saturating behaviour real block quantisers use (`model.md` §3.4, `backbone.md`).
//!
//! e4m3 ("fn" variant, as `torch.float8_e4m3fn`): 1 sign, 4 exponent (bias 7), 3 mantissa bits,
//! no infinities, `S.1111.111` is NaN, largest finite value 448.

/// Largest finite e4m3 magnitude.
pub const E4M3_MAX: f32 = 448.0;

/// Decodes one e4m3fn byte exactly.
pub fn e4m3_to_f32(bits: u8) -> f32 {
    let sign = if bits & 0x80 != 0 { -1.0f32 } else { 1.0 };
    let exp = (bits >> 3) & 0x0F;
    let man = (bits & 0x07) as f32;
    if exp == 0x0F && bits & 0x07 == 0x07 {
        return f32::NAN;
    }
    if exp == 0 {
        // Subnormal: man/8 * 2^(1-7).
        sign * man * (1.0 / 8.0) * (2.0f32).powi(-6)
    } else {
        sign * (1.0 + man / 8.0) * (2.0f32).powi(exp as i32 - 7)
    }
}

/// Decodes one e5m2 byte exactly (IEEE-like: infinities and NaNs at exponent 31).
pub fn e5m2_to_f32(bits: u8) -> f32 {
    // e5m2 is the top byte of an IEEE half.
    half::f16::from_bits((bits as u16) << 8).to_f32()
}

/// Encodes f32 → e4m3fn, rounding to nearest even and saturating to ±448 (NaN stays NaN).
/// Saturation matches quantisers that clamp to the finite range before the cast.
pub fn f32_to_e4m3(x: f32) -> u8 {
    if x.is_nan() {
        return 0x7F;
    }
    let sign: u8 = if x.is_sign_negative() { 0x80 } else { 0 };
    let a = x.abs().min(E4M3_MAX);
    // Smallest normal is 2^-6; below it the grid is uniform with step 2^-9.
    if a < (2.0f32).powi(-6) {
        let q = round_half_even(a * 512.0); // units of 2^-9, 0..=8
        // q == 8 is the smallest normal (exp 1, man 0), which has the same bit pattern 0x08.
        return sign | q as u8;
    }
    let mut e = a.log2().floor() as i32;
    // Guard against log2 rounding at exact powers of two.
    if (2.0f32).powi(e) > a {
        e -= 1;
    } else if (2.0f32).powi(e + 1) <= a {
        e += 1;
    }
    let scaled = a / (2.0f32).powi(e) * 8.0; // in [8, 16)
    let mut m = round_half_even(scaled) as i32 - 8;
    if m == 8 {
        m = 0;
        e += 1;
    }
    let biased = (e + 7) as u8;
    sign | (biased << 3) | m as u8
}

fn round_half_even(v: f32) -> f32 {
    let r = v.round();
    if (v - v.trunc()).abs() == 0.5 && r % 2.0 != 0.0 { r - v.signum() } else { r }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values() {
        assert_eq!(e4m3_to_f32(0x00), 0.0);
        assert_eq!(e4m3_to_f32(0x38), 1.0);
        assert_eq!(e4m3_to_f32(0x7E), 448.0);
        assert_eq!(e4m3_to_f32(0xFE), -448.0);
        assert_eq!(e4m3_to_f32(0x01), 2.0f32.powi(-9));
        assert_eq!(e4m3_to_f32(0x08), 2.0f32.powi(-6));
        assert!(e4m3_to_f32(0x7F).is_nan());
        assert!(e4m3_to_f32(0xFF).is_nan());
    }

    #[test]
    fn encode_decode_round_trips_every_finite_code() {
        for b in 0u8..=255 {
            let v = e4m3_to_f32(b);
            if v.is_nan() {
                continue;
            }
            let back = f32_to_e4m3(v);
            // -0.0 encodes as 0x80, +0.0 as 0x00: both decode to zero.
            assert_eq!(e4m3_to_f32(back), v, "code {b:#04x}");
        }
    }

    #[test]
    fn rounds_to_nearest_even_and_saturates() {
        // 1.0625 lies halfway between 1.0 (man 0) and 1.125 (man 1): even mantissa wins.
        assert_eq!(f32_to_e4m3(1.0625), 0x38);
        // 1.1875 lies halfway between 1.125 (man 1) and 1.25 (man 2): even wins.
        assert_eq!(f32_to_e4m3(1.1875), 0x3A);
        assert_eq!(f32_to_e4m3(1000.0), 0x7E);
        assert_eq!(f32_to_e4m3(-1000.0), 0xFE);
        assert_eq!(f32_to_e4m3(f32::NAN), 0x7F);
    }

    #[test]
    fn nearest_for_every_midpoint_region() {
        // Exhaustive check against brute force nearest search over finite codes.
        let codes: Vec<(u8, f32)> = (0u8..=0x7E).map(|b| (b, e4m3_to_f32(b))).collect();
        let mut x = 0.0f32;
        while x < 460.0 {
            let enc = e4m3_to_f32(f32_to_e4m3(x));
            let best = codes
                .iter()
                .map(|&(_, v)| v)
                .min_by(|a, b| (a - x).abs().partial_cmp(&(b - x).abs()).unwrap())
                .unwrap();
            assert!((enc - x).abs() <= (best - x).abs(), "x={x} enc={enc} best={best}");
            x += 0.0137;
        }
    }
}
