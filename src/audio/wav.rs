//! WAV (RIFF, 16-bit PCM, mono) with a hand-written 44-byte header: the server's streamed and
//! whole `wav` responses (`api.md`) and the file `limelight say` writes.
//!
//! A streamed WAV cannot know its length when the header goes out, so it carries `0xFFFFFFFF`
//! as both the RIFF and the `data` size: the "unknown length" convention that ffmpeg,
//! libsndfile and sox read as "to the end of the stream" (zeros would make them read nothing).
//! A whole WAV (`stream: false`) holds its samples until the end and has exact sizes.

use std::io;
use std::path::Path;

use super::chain::Writer;
use super::pcm::extend_s16le;
use super::{AudioError, ResponseFormat};

/// Bytes before the samples.
pub const HEADER_LEN: usize = 44;

/// The size fields of a stream whose length is unknown.
const UNKNOWN_SIZE: u32 = 0xFFFF_FFFF;

/// The header of a mono 16-bit PCM WAV at `sample_rate` whose samples take `data_len` bytes,
/// or, for `None`, a streamed one of unknown length.
pub fn header(sample_rate: u32, data_len: Option<u32>) -> [u8; HEADER_LEN] {
    let (riff_len, data_len) = match data_len {
        // The RIFF size counts everything after its own field: 36 header bytes, then the data.
        Some(n) => (n.saturating_add(36), n),
        None => (UNKNOWN_SIZE, UNKNOWN_SIZE),
    };
    let mut h = [0u8; HEADER_LEN];
    h[0..4].copy_from_slice(b"RIFF");
    h[4..8].copy_from_slice(&riff_len.to_le_bytes());
    h[8..12].copy_from_slice(b"WAVE");
    h[12..16].copy_from_slice(b"fmt ");
    h[16..20].copy_from_slice(&16u32.to_le_bytes()); // fmt chunk size
    h[20..22].copy_from_slice(&1u16.to_le_bytes()); // WAVE_FORMAT_PCM
    h[22..24].copy_from_slice(&1u16.to_le_bytes()); // channels
    h[24..28].copy_from_slice(&sample_rate.to_le_bytes());
    h[28..32].copy_from_slice(&(sample_rate * 2).to_le_bytes()); // bytes per second
    h[32..34].copy_from_slice(&2u16.to_le_bytes()); // bytes per frame
    h[34..36].copy_from_slice(&16u16.to_le_bytes()); // bits per sample
    h[36..40].copy_from_slice(b"data");
    h[40..44].copy_from_slice(&data_len.to_le_bytes());
    h
}

/// Writes `pcm` as a 16-bit mono WAV at `sample_rate`.
pub fn write_wav(path: &Path, pcm: &[f32], sample_rate: u32) -> io::Result<()> {
    let mut bytes = Vec::with_capacity(HEADER_LEN + 2 * pcm.len());
    bytes.extend_from_slice(&header(sample_rate, Some(0)));
    extend_s16le(pcm, &mut bytes);
    let data_len = exact_data_len(bytes.len() - HEADER_LEN).ok_or_else(|| io::Error::other("over 4 GiB"))?;
    bytes[..HEADER_LEN].copy_from_slice(&header(sample_rate, Some(data_len)));
    std::fs::write(path, bytes)
}

/// The `data` size field for `n` bytes of samples, if a RIFF size field can hold it.
fn exact_data_len(n: usize) -> Option<u32> {
    u32::try_from(n).ok().filter(|&n| n <= u32::MAX - 36)
}

/// The `wav` response writer.
pub(super) struct WavWriter {
    sample_rate: u32,
    streaming: bool,
    /// Streaming: whether the header is out. Whole: always false.
    header_sent: bool,
    /// Whole: the samples so far, behind room for the header.
    body: Vec<u8>,
}

impl WavWriter {
    pub(super) fn new(sample_rate: u32, streaming: bool) -> Self {
        let body = if streaming { Vec::new() } else { vec![0; HEADER_LEN] };
        Self { sample_rate, streaming, header_sent: false, body }
    }
}

impl Writer for WavWriter {
    fn write(&mut self, pcm: &[f32], out: &mut Vec<u8>) -> Result<(), AudioError> {
        if !self.streaming {
            extend_s16le(pcm, &mut self.body);
            return Ok(());
        }
        if !self.header_sent {
            out.extend_from_slice(&header(self.sample_rate, None));
            self.header_sent = true;
        }
        extend_s16le(pcm, out);
        Ok(())
    }

    fn finish(mut self: Box<Self>, out: &mut Vec<u8>) -> Result<(), AudioError> {
        if self.streaming {
            // An empty stream still gets its header, so the body is a valid (silent) WAV.
            if !self.header_sent {
                out.extend_from_slice(&header(self.sample_rate, None));
            }
            return Ok(());
        }
        let data_len = exact_data_len(self.body.len() - HEADER_LEN)
            .ok_or_else(|| AudioError::codec(ResponseFormat::Wav, "a whole WAV cannot exceed 4 GiB"))?;
        self.body[..HEADER_LEN].copy_from_slice(&header(self.sample_rate, Some(data_len)));
        out.append(&mut self.body);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audio::f32_to_i16;

    #[test]
    fn header_bytes_exact_and_streamed() {
        let exact = header(24_000, Some(48_000));
        let want: [u8; 44] = [
            b'R', b'I', b'F', b'F', 0xa4, 0xbb, 0x00, 0x00, b'W', b'A', b'V', b'E', b'f', b'm', b't', b' ', //
            0x10, 0x00, 0x00, 0x00, 0x01, 0x00, 0x01, 0x00, 0xc0, 0x5d, 0x00, 0x00, 0x80, 0xbb, 0x00, 0x00, //
            0x02, 0x00, 0x10, 0x00, b'd', b'a', b't', b'a', 0x80, 0xbb, 0x00, 0x00,
        ];
        assert_eq!(exact, want);
        let streamed = header(24_000, None);
        assert_eq!(streamed[4..8], [0xff; 4]);
        assert_eq!(streamed[40..44], [0xff; 4]);
        assert_eq!(streamed[8..40], want[8..40]);
    }

    #[test]
    fn streamed_writer_sends_header_first_and_whole_writer_holds_everything() {
        let pcm = [0.25f32; 10];
        let mut streamed = Box::new(WavWriter::new(44_100, true));
        let mut out = Vec::new();
        streamed.write(&pcm, &mut out).unwrap();
        assert_eq!(out.len(), HEADER_LEN + 20);
        assert_eq!(out[..HEADER_LEN], header(44_100, None));
        streamed.finish(&mut out).unwrap();
        assert_eq!(out.len(), HEADER_LEN + 20);

        let mut whole = Box::new(WavWriter::new(44_100, false));
        let mut out = Vec::new();
        whole.write(&pcm, &mut out).unwrap();
        assert!(out.is_empty());
        whole.finish(&mut out).unwrap();
        assert_eq!(out[..HEADER_LEN], header(44_100, Some(20)));
        assert_eq!(out.len(), HEADER_LEN + 20);
    }

    #[test]
    fn round_trips_through_hound() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.wav");
        let pcm: Vec<f32> = (0..2048).map(|i| (i as f32 * 0.01).sin() * 0.5).collect();
        write_wav(&path, &pcm, 44_100).unwrap();
        let mut r = hound::WavReader::open(&path).unwrap();
        assert_eq!(r.spec().sample_rate, 44_100);
        assert_eq!(r.spec().channels, 1);
        let back: Vec<i16> = r.samples::<i16>().map(Result::unwrap).collect();
        assert_eq!(back, pcm.iter().map(|&x| f32_to_i16(x)).collect::<Vec<_>>());
    }
}
