//! PCM from the codec → bytes a client or a file wants. The codec produces mono f32 at
//! 44.1 kHz in (-1, 1).

pub mod wav;

/// The codec's output rate (`codec.md` §1).
pub const CODEC_SAMPLE_RATE: u32 = 44_100;

/// f32 in [-1, 1] → signed 16-bit, clamped and rounded to nearest (ties away from zero), the
/// conversion every format encoder shares so equal PCM always gives equal bytes.
pub fn f32_to_i16(x: f32) -> i16 {
    (x.clamp(-1.0, 1.0) * 32767.0).round() as i16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversion_clamps_and_rounds() {
        assert_eq!(f32_to_i16(0.0), 0);
        assert_eq!(f32_to_i16(1.0), 32767);
        assert_eq!(f32_to_i16(-1.0), -32767);
        assert_eq!(f32_to_i16(2.0), 32767);
        assert_eq!(f32_to_i16(-7.0), -32767);
        assert_eq!(f32_to_i16(0.5 / 32767.0), 1);
        assert_eq!(f32_to_i16(f32::NAN), 0);
    }
}
