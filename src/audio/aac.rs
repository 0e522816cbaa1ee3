//! `aac`: mono AAC-LC in ADTS frames through FDK-AAC (`fdk-aac`), only with the cargo feature
//! `aac`, since FDK's licence is not free software.
//!
//! The `fdk-aac` binding cannot signal end of input to the encoder (FDK flushes on a sample
//! count of -1, which the binding never passes), so [`Writer::finish`] pushes out the last
//! real samples with silence: the encoder's delay plus one frame. ADTS has no field to trim
//! that padding, nor the encoder's priming, so a decoded `aac` runs up to about two frames
//! (~46 ms at 44.1 kHz) longer than its input, as AAC from most encoders does.

use fdk_aac::enc::{AudioObjectType, BitRate, ChannelMode, Encoder, EncoderParams, Transport};

use super::chain::Writer;
use super::{AudioError, ResponseFormat, f32_to_i16};

/// Room for one ADTS frame: FDK's maximum for one channel (6144 bits) plus the header.
const MAX_FRAME: usize = 6144 / 8 + 64;

pub(super) struct AacWriter {
    encoder: Encoder,
    /// The silence `finish` feeds: encoder delay plus one frame.
    flush_len: usize,
    scratch: Vec<u8>,
}

fn fdk_err(e: impl std::fmt::Display) -> AudioError {
    AudioError::codec(ResponseFormat::Aac, format!("FDK-AAC: {e}"))
}

impl AacWriter {
    pub(super) fn new(sample_rate: u32) -> Result<Self, AudioError> {
        let encoder = Encoder::new(EncoderParams {
            // FDK's VBR mode 4 (about 64 kb/s for mono): transparent for speech.
            bit_rate: BitRate::VbrHigh,
            sample_rate,
            transport: Transport::Adts,
            channels: ChannelMode::Mono,
            audio_object_type: AudioObjectType::Mpeg4LowComplexity,
        })
        .map_err(fdk_err)?;
        let info = encoder.info().map_err(fdk_err)?;
        let flush_len = (info.nDelay + info.frameLength) as usize;
        Ok(Self { encoder, flush_len, scratch: vec![0; MAX_FRAME] })
    }

    fn encode(&mut self, samples: &[i16], out: &mut Vec<u8>) -> Result<(), AudioError> {
        let mut rest = samples;
        // FDK takes what fits its input buffer and returns at most one frame per call.
        loop {
            let info = self.encoder.encode(rest, &mut self.scratch).map_err(fdk_err)?;
            out.extend_from_slice(&self.scratch[..info.output_size]);
            rest = &rest[info.input_consumed..];
            if info.output_size == 0 && (rest.is_empty() || info.input_consumed == 0) {
                return Ok(());
            }
        }
    }
}

impl Writer for AacWriter {
    fn write(&mut self, pcm: &[f32], out: &mut Vec<u8>) -> Result<(), AudioError> {
        let samples: Vec<i16> = pcm.iter().map(|&x| f32_to_i16(x)).collect();
        self.encode(&samples, out)
    }

    fn finish(mut self: Box<Self>, out: &mut Vec<u8>) -> Result<(), AudioError> {
        let silence = vec![0i16; self.flush_len];
        self.encode(&silence, out)
    }
}
