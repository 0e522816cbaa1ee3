//! `pcm`: raw signed 16-bit little-endian mono samples, no header (OpenAI's `pcm`, `api.md`).

use super::chain::Writer;
use super::{AudioError, f32_to_i16};

/// Appends `pcm` as s16le, the sample encoding `pcm` and `wav` share.
pub(super) fn extend_s16le(pcm: &[f32], out: &mut Vec<u8>) {
    out.reserve(2 * pcm.len());
    for &x in pcm {
        out.extend_from_slice(&f32_to_i16(x).to_le_bytes());
    }
}

/// Stateless: every sample is ready as soon as it arrives.
pub(super) struct PcmWriter;

impl Writer for PcmWriter {
    fn write(&mut self, pcm: &[f32], out: &mut Vec<u8>) -> Result<(), AudioError> {
        extend_s16le(pcm, out);
        Ok(())
    }

    fn finish(self: Box<Self>, _out: &mut Vec<u8>) -> Result<(), AudioError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_are_s16le() {
        let mut out = Vec::new();
        PcmWriter.write(&[0.0, 1.0, -1.0, 0.5], &mut out).unwrap();
        assert_eq!(out, [0x00, 0x00, 0xff, 0x7f, 0x01, 0x80, 0x00, 0x40]);
    }
}
