//! The one [`Encoder`] behind every format: codec PCM → time stretch (`speed`) → resampler
//! (`sample_rate`) → the format's [`Writer`], each stage carrying its state across pushes.

use std::borrow::Cow;

use super::resample::Resampler;
use super::tempo::Tempo;
use super::{AudioError, CODEC_SAMPLE_RATE, Encoder, ResponseFormat};

/// The format-specific end of the chain: mono f32 at the output rate in, bytes out.
pub(super) trait Writer: Send {
    /// Appends to `out` the bytes that `pcm` completes.
    fn write(&mut self, pcm: &[f32], out: &mut Vec<u8>) -> Result<(), AudioError>;

    /// Appends the flushed tail and any trailer (or, when holding everything, the whole body).
    fn finish(self: Box<Self>, out: &mut Vec<u8>) -> Result<(), AudioError>;
}

pub(super) struct Chain {
    format: ResponseFormat,
    sample_rate: u32,
    /// `None` at speed 1.0, so that speed 1.0 is an exact pass-through.
    tempo: Option<Tempo>,
    /// `None` when the output rate is the codec's.
    resampler: Option<Resampler>,
    writer: Box<dyn Writer>,
}

impl Chain {
    pub(super) fn new(
        format: ResponseFormat,
        sample_rate: u32,
        speed: f32,
        writer: Box<dyn Writer>,
    ) -> Result<Self, AudioError> {
        // Stretch before resampling, at the codec's fixed rate: the stretched signal is then
        // the same for every output format and rate.
        let tempo = (speed != 1.0).then(|| Tempo::new(CODEC_SAMPLE_RATE, speed));
        let resampler = match sample_rate {
            CODEC_SAMPLE_RATE => None,
            rate => Some(Resampler::new(CODEC_SAMPLE_RATE, rate, format)?),
        };
        Ok(Self { format, sample_rate, tempo, resampler, writer })
    }
}

impl Encoder for Chain {
    fn content_type(&self) -> &'static str {
        self.format.content_type()
    }

    fn sample_rate(&self) -> u32 {
        self.sample_rate
    }

    fn push(&mut self, pcm: &[f32]) -> Result<Vec<u8>, AudioError> {
        let stretched = match &mut self.tempo {
            Some(t) => Cow::Owned(t.push(pcm)),
            None => Cow::Borrowed(pcm),
        };
        let resampled = match &mut self.resampler {
            Some(r) => Cow::Owned(r.push(&stretched)),
            None => stretched,
        };
        let mut out = Vec::new();
        self.writer.write(&resampled, &mut out)?;
        Ok(out)
    }

    fn finish(self: Box<Self>) -> Result<Vec<u8>, AudioError> {
        let Chain { tempo, resampler, mut writer, .. } = *self;
        let tail = tempo.map(Tempo::finish).unwrap_or_default();
        let tail = match resampler {
            Some(mut r) => {
                let mut t = r.push(&tail);
                t.extend(r.finish());
                t
            }
            None => tail,
        };
        let mut out = Vec::new();
        writer.write(&tail, &mut out)?;
        writer.finish(&mut out)?;
        Ok(out)
    }
}
