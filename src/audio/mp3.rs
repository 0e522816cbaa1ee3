//! `mp3`: constant-bitrate mono MPEG audio layer III through LAME (`mp3lame-encoder`, LGPL).
//!
//! A streamed MP3 is a plain run of frames. A whole MP3 (`stream: false`) also gets LAME's
//! "Info" tag in its first frame, which carries the frame count and the encoder delay and
//! padding, so decoders such as ffmpeg trim to the exact duration; a stream cannot have it,
//! because the tag is only known at the end and the first frame is long gone.

use mp3lame_encoder::{Bitrate, Builder, FlushGap, Mode, MonoPcm, Quality, VbrMode, max_required_buffer_size};

use super::chain::Writer;
use super::{AudioError, ResponseFormat};

/// Room LAME asks for when flushing its last frames.
const FLUSH_ROOM: usize = 7200;

pub(super) struct Mp3Writer {
    lame: mp3lame_encoder::Encoder,
    streaming: bool,
    /// Whole: the frames so far; the first is LAME's placeholder for the Info tag.
    body: Vec<u8>,
}

impl Mp3Writer {
    pub(super) fn new(sample_rate: u32, streaming: bool) -> Result<Self, AudioError> {
        let err = |e: mp3lame_encoder::BuildError| AudioError::codec(ResponseFormat::Mp3, format!("LAME: {e}"));
        let rate = std::num::NonZeroU32::new(sample_rate);
        let lame = Builder::new()
            .ok_or_else(|| AudioError::codec(ResponseFormat::Mp3, "LAME could not allocate"))?
            .with_num_channels(1)
            .map_err(err)?
            .with_sample_rate(sample_rate)
            .map_err(err)?
            // Without this LAME may pick a lower output rate than the one asked for.
            .with_output_sample_rate(rate)
            .map_err(err)?
            .with_mode(Mode::Mono)
            .map_err(err)?
            // CBR: every frame has the same size, so a client that reads no tag (a stream)
            // still computes the right duration from the bitrate.
            .with_vbr_mode(VbrMode::Off)
            .map_err(err)?
            .with_brate(bitrate(sample_rate))
            .map_err(err)?
            // LAME's `-q 2`, its recommended high-quality setting; cheap next to the model.
            .with_quality(Quality::NearBest)
            .map_err(err)?
            .with_to_write_vbr_tag(!streaming)
            .map_err(err)?
            .build()
            .map_err(err)?;
        Ok(Self { lame, streaming, body: Vec::new() })
    }
}

/// Mono speech needs far less than music: 128 kb/s at MPEG-1 rates, less as the band narrows.
fn bitrate(sample_rate: u32) -> Bitrate {
    match sample_rate {
        32_000.. => Bitrate::Kbps128,
        16_000.. => Bitrate::Kbps64,
        _ => Bitrate::Kbps32,
    }
}

fn lame_err(e: mp3lame_encoder::EncodeError) -> AudioError {
    AudioError::codec(ResponseFormat::Mp3, format!("LAME: {e}"))
}

impl Writer for Mp3Writer {
    fn write(&mut self, pcm: &[f32], out: &mut Vec<u8>) -> Result<(), AudioError> {
        let dest = if self.streaming { out } else { &mut self.body };
        dest.reserve(max_required_buffer_size(pcm.len()));
        self.lame.encode_to_vec(MonoPcm(pcm), dest).map_err(lame_err)?;
        Ok(())
    }

    fn finish(mut self: Box<Self>, out: &mut Vec<u8>) -> Result<(), AudioError> {
        let dest = if self.streaming { &mut *out } else { &mut self.body };
        dest.reserve(FLUSH_ROOM);
        self.lame.flush_to_vec::<FlushGap>(dest).map_err(lame_err)?;
        if !self.streaming {
            let mut tag = Vec::with_capacity(self.lame.lame_tag_size());
            self.lame.lame_tag_encode_to_vec(&mut tag);
            // The tag replaces the placeholder frame of the same size that LAME put first.
            if !tag.is_empty() && tag.len() <= self.body.len() {
                self.body[..tag.len()].copy_from_slice(&tag);
            }
            out.append(&mut self.body);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(streaming: bool, pcm: &[f32], chunk: usize) -> Vec<u8> {
        let mut w = Box::new(Mp3Writer::new(44_100, streaming).unwrap());
        let mut out = Vec::new();
        for c in pcm.chunks(chunk) {
            w.write(c, &mut out).unwrap();
        }
        w.finish(&mut out).unwrap();
        out
    }

    #[test]
    fn whole_mp3_starts_with_an_info_tag_and_streamed_does_not() {
        let pcm: Vec<f32> = (0..20_000).map(|i| (i as f32 * 0.05).sin() * 0.3).collect();
        let whole = encode(false, &pcm, 4096);
        let streamed = encode(true, &pcm, 4096);
        for mp3 in [&whole, &streamed] {
            // MPEG-1 layer III frame sync.
            assert_eq!((mp3[0], mp3[1] & 0xfe), (0xff, 0xfa), "{:02x?}", &mp3[..4]);
        }
        let has_tag = |b: &[u8]| b.windows(4).take(64).any(|w| w == b"Info" || w == b"Xing");
        assert!(has_tag(&whole));
        assert!(!has_tag(&streamed));
    }

    #[test]
    fn chunking_does_not_change_the_bytes() {
        let pcm: Vec<f32> = (0..30_000).map(|i| (i as f32 * 0.02).sin() * 0.3).collect();
        assert_eq!(encode(true, &pcm, 2048), encode(true, &pcm, 777));
    }
}
