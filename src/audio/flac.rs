//! `flac`: lossless 16-bit mono FLAC, encoded frame by frame with the pure-Rust `flacenc`.
//!
//! Frames hold a fixed [`BLOCK`] samples (the last one fewer), so the bytes do not depend on how
//! the input was chunked. A streamed FLAC sends `fLaC` and a STREAMINFO block with the fields
//! it cannot know yet (frame sizes, total samples, MD5) set to zero, which the format defines as
//! "unknown"; a whole FLAC (`stream: false`) holds its frames and writes them all in.

use flacenc::bitsink::ByteSink;
use flacenc::component::{BitRepr, StreamInfo};
use flacenc::config;
use flacenc::error::{Verified, Verify};
use flacenc::source::{Context, Fill, FrameBuf};

use super::chain::Writer;
use super::{AudioError, ResponseFormat, f32_to_i16};

/// Samples per frame: the reference encoder's default (about 93 ms at 44.1 kHz).
const BLOCK: usize = 4096;

/// The last metadata block (flag 0x80) of type STREAMINFO (0), 34 bytes long.
const STREAMINFO_BLOCK_HEADER: [u8; 4] = [0x80, 0x00, 0x00, 34];

pub(super) struct FlacWriter {
    config: Verified<config::Encoder>,
    info: StreamInfo,
    streaming: bool,
    header_sent: bool,
    /// Samples waiting for a whole frame.
    pending: Vec<i32>,
    framebuf: FrameBuf,
    /// MD5, sample and frame counts of what was encoded.
    context: Context,
    /// Whole: encoded frames so far, and their smallest and largest sizes.
    frames: Vec<u8>,
    frame_sizes: Option<(usize, usize)>,
}

impl FlacWriter {
    pub(super) fn new(sample_rate: u32, streaming: bool) -> Result<Self, AudioError> {
        let err = |e: &dyn std::fmt::Display| AudioError::codec(ResponseFormat::Flac, e);
        let config = config::Encoder::default().into_verified().map_err(|(_, e)| err(&e))?;
        let mut info = StreamInfo::new(sample_rate as usize, 1, 16).map_err(|e| err(&e))?;
        info.set_block_sizes(BLOCK, BLOCK).map_err(|e| err(&e))?;
        info.set_frame_sizes(0, 0).map_err(|e| err(&e))?;
        Ok(Self {
            config,
            info,
            streaming,
            header_sent: false,
            pending: Vec::with_capacity(BLOCK),
            framebuf: FrameBuf::with_size(1, BLOCK).map_err(|e| err(&e))?,
            context: Context::new(16, 1),
            frames: Vec::new(),
            frame_sizes: None,
        })
    }

    fn header(&self) -> Result<Vec<u8>, AudioError> {
        let mut h = b"fLaC".to_vec();
        h.extend_from_slice(&STREAMINFO_BLOCK_HEADER);
        h.extend_from_slice(&to_bytes(&self.info)?);
        Ok(h)
    }

    /// Encodes `self.pending` (a whole block, or the last, shorter one) as the next frame.
    fn encode_pending(&mut self, out: &mut Vec<u8>) -> Result<(), AudioError> {
        let err = |e: &dyn std::fmt::Display| AudioError::codec(ResponseFormat::Flac, e);
        self.framebuf.fill_interleaved(&self.pending).map_err(|e| err(&e))?;
        self.context.fill_interleaved(&self.pending).map_err(|e| err(&e))?;
        let number = self.context.current_frame_number().expect("a frame was just counted");
        let frame =
            flacenc::encode_fixed_size_frame(&self.config, &self.framebuf, number, &self.info).map_err(|e| err(&e))?;
        let bytes = to_bytes(&frame)?;
        self.pending.clear();
        if self.streaming {
            out.extend_from_slice(&bytes);
        } else {
            let (lo, hi) = self.frame_sizes.unwrap_or((usize::MAX, 0));
            self.frame_sizes = Some((lo.min(bytes.len()), hi.max(bytes.len())));
            self.frames.extend_from_slice(&bytes);
        }
        Ok(())
    }
}

/// A FLAC component's bit stream, byte-aligned (STREAMINFO and frames always are).
fn to_bytes(component: &impl BitRepr) -> Result<Vec<u8>, AudioError> {
    let mut sink = ByteSink::new();
    component.write(&mut sink).map_err(|e| AudioError::codec(ResponseFormat::Flac, e))?;
    Ok(sink.into_inner())
}

impl Writer for FlacWriter {
    fn write(&mut self, pcm: &[f32], out: &mut Vec<u8>) -> Result<(), AudioError> {
        if self.streaming && !self.header_sent {
            out.extend_from_slice(&self.header()?);
            self.header_sent = true;
        }
        for &x in pcm {
            self.pending.push(f32_to_i16(x).into());
            if self.pending.len() == BLOCK {
                self.encode_pending(out)?;
            }
        }
        Ok(())
    }

    fn finish(mut self: Box<Self>, out: &mut Vec<u8>) -> Result<(), AudioError> {
        if self.streaming && !self.header_sent {
            out.extend_from_slice(&self.header()?);
        }
        if !self.pending.is_empty() {
            self.encode_pending(out)?;
        }
        if self.streaming {
            return Ok(());
        }
        let (lo, hi) = self.frame_sizes.unwrap_or((0, 0));
        self.info.set_frame_sizes(lo, hi).map_err(|e| AudioError::codec(ResponseFormat::Flac, e))?;
        self.info.set_total_samples(self.context.total_samples());
        self.info.set_md5_digest(&self.context.md5_digest());
        out.extend_from_slice(&self.header()?);
        out.append(&mut self.frames);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(streaming: bool, pcm: &[f32]) -> Vec<u8> {
        let mut w = Box::new(FlacWriter::new(44_100, streaming).unwrap());
        let mut out = Vec::new();
        w.write(pcm, &mut out).unwrap();
        w.finish(&mut out).unwrap();
        out
    }

    /// STREAMINFO's 36-bit total-samples field, after `fLaC` and the block header.
    fn total_samples(flac: &[u8]) -> u64 {
        let b = &flac[8 + 13..8 + 18];
        (u64::from(b[0] & 0x0f) << 32) | u64::from(u32::from_be_bytes([b[1], b[2], b[3], b[4]]))
    }

    #[test]
    fn streaminfo_is_unknown_when_streamed_and_exact_when_whole() {
        let pcm: Vec<f32> = (0..10_000).map(|i| (i as f32 * 0.03).sin() * 0.4).collect();
        let streamed = encode(true, &pcm);
        let whole = encode(false, &pcm);
        for flac in [&streamed, &whole] {
            assert_eq!(flac[..8], *b"fLaC\x80\x00\x00\x22");
            assert_eq!(flac[8..12], [0x10, 0x00, 0x10, 0x00], "block sizes 4096");
        }
        assert_eq!(streamed[12..18], [0; 6], "frame sizes unknown");
        assert_eq!(total_samples(&streamed), 0);
        assert_eq!(streamed[26..42], [0; 16], "MD5 unknown");
        assert_eq!(total_samples(&whole), 10_000);
        assert_ne!(whole[12..18], [0; 6]);
        assert_ne!(whole[26..42], [0; 16]);
        // Same frames, only the header differs.
        assert_eq!(streamed[42..], whole[42..]);
    }

    #[test]
    fn empty_input_is_a_valid_header() {
        assert_eq!(encode(true, &[]).len(), 42);
        assert_eq!(encode(false, &[]).len(), 42);
    }
}
