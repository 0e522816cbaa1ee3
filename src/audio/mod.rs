//! PCM from the codec → the bytes of an OpenAI `response_format`, incrementally (`api.md`,
//! `POST /v1/audio/speech`).
//!
//! The codec produces mono f32 at 44.1 kHz in (-1, 1), in chunks as it is generated. [`encoder`]
//! builds an [`Encoder`] for one response: each [`Encoder::push`] returns the bytes that are
//! ready now, and [`Encoder::finish`] flushes the tail and any trailer. Between the codec and
//! the format sit an optional pitch-preserving time stretch (`speed`) and a resampler
//! (`sample_rate`); every stage carries its state across pushes, so equal PCM in equal chunks
//! always gives equal bytes, and for `pcm`, `wav` and `flac` the chunking does not matter at all.

#[cfg(feature = "aac")]
mod aac;
mod chain;
mod flac;
mod mp3;
mod opus;
mod pcm;
mod resample;
mod tempo;
pub mod wav;

use std::fmt;
use std::ops::RangeInclusive;
use std::str::FromStr;

/// The codec's output rate (`codec.md` §1).
pub const CODEC_SAMPLE_RATE: u32 = 44_100;

/// Allowed `speed` (`api.md`, as OpenAI).
pub const SPEED_RANGE: RangeInclusive<f32> = 0.25..=4.0;

/// Allowed `sample_rate` extension (`api.md`); some formats narrow it further.
pub const SAMPLE_RATE_RANGE: RangeInclusive<u32> = 8_000..=48_000;

/// The rates MPEG audio (MP3, AAC) defines up to 48 kHz.
const MPEG_RATES: &[u32] = &[8_000, 11_025, 12_000, 16_000, 22_050, 24_000, 32_000, 44_100, 48_000];

/// The rates an Opus encoder accepts.
const OPUS_RATES: &[u32] = &[8_000, 12_000, 16_000, 24_000, 48_000];

/// f32 in [-1, 1] → signed 16-bit, clamped and rounded to nearest (ties away from zero), the
/// conversion every format encoder shares so equal PCM always gives equal bytes.
pub fn f32_to_i16(x: f32) -> i16 {
    (x.clamp(-1.0, 1.0) * 32767.0).round() as i16
}

/// OpenAI's `response_format` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ResponseFormat {
    Mp3,
    Opus,
    Aac,
    Flac,
    Wav,
    Pcm,
}

impl ResponseFormat {
    pub const ALL: [ResponseFormat; 6] = [Self::Mp3, Self::Opus, Self::Aac, Self::Flac, Self::Wav, Self::Pcm];

    /// The name on the wire.
    pub fn name(self) -> &'static str {
        match self {
            Self::Mp3 => "mp3",
            Self::Opus => "opus",
            Self::Aac => "aac",
            Self::Flac => "flac",
            Self::Wav => "wav",
            Self::Pcm => "pcm",
        }
    }

    /// The `Content-Type` of a response in this format (`api.md`: Ogg Opus is `audio/ogg`).
    pub fn content_type(self) -> &'static str {
        match self {
            Self::Mp3 => "audio/mpeg",
            Self::Opus => "audio/ogg",
            Self::Aac => "audio/aac",
            Self::Flac => "audio/flac",
            Self::Wav => "audio/wav",
            Self::Pcm => "audio/pcm",
        }
    }

    /// Whether this build can encode the format (`aac` needs the cargo feature `aac`).
    pub fn is_available(self) -> bool {
        self != Self::Aac || cfg!(feature = "aac")
    }

    /// The output rate when the request names none: 24 kHz for `pcm`, which OpenAI clients
    /// assume; 48 kHz for Opus, its native rate; otherwise the codec's own 44.1 kHz, which
    /// needs no resampling.
    pub fn default_sample_rate(self) -> u32 {
        match self {
            Self::Pcm => 24_000,
            Self::Opus => 48_000,
            _ => CODEC_SAMPLE_RATE,
        }
    }

    /// The rates the format can carry, where narrower than [`SAMPLE_RATE_RANGE`].
    pub fn allowed_sample_rates(self) -> Option<&'static [u32]> {
        match self {
            Self::Mp3 | Self::Aac => Some(MPEG_RATES),
            Self::Opus => Some(OPUS_RATES),
            Self::Flac | Self::Wav | Self::Pcm => None,
        }
    }

    /// The output rate for a request's `sample_rate`, or why it cannot be served.
    pub fn sample_rate(self, requested: Option<u32>) -> Result<u32, AudioError> {
        let Some(rate) = requested else { return Ok(self.default_sample_rate()) };
        if !SAMPLE_RATE_RANGE.contains(&rate) {
            return Err(AudioError::SampleRateOutOfRange { rate });
        }
        match self.allowed_sample_rates() {
            Some(allowed) if !allowed.contains(&rate) => {
                Err(AudioError::SampleRateUnsupported { format: self, rate, allowed })
            }
            _ => Ok(rate),
        }
    }
}

impl fmt::Display for ResponseFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ResponseFormat {
    type Err = AudioError;

    fn from_str(s: &str) -> Result<Self, AudioError> {
        Self::ALL.into_iter().find(|f| f.name() == s).ok_or_else(|| AudioError::UnknownFormat(s.to_owned()))
    }
}

/// How to encode one response.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EncodeOptions {
    /// Output rate; `None` is the format's default ([`ResponseFormat::default_sample_rate`]).
    pub sample_rate: Option<u32>,
    /// Playback speed in [`SPEED_RANGE`]; the pitch is kept. 1.0 passes samples through untouched.
    pub speed: f32,
    /// Whether bytes go out as they are made. `false` lets a format hold everything until
    /// [`Encoder::finish`] and write exact sizes into its header (`wav`, `flac`, `mp3`), or
    /// fill its Ogg pages regardless of the pushes (`opus`).
    pub streaming: bool,
}

impl Default for EncodeOptions {
    fn default() -> Self {
        Self { sample_rate: None, speed: 1.0, streaming: true }
    }
}

/// One response's encoder: codec PCM in, format bytes out.
pub trait Encoder: Send {
    /// The response's `Content-Type`.
    fn content_type(&self) -> &'static str;

    /// The rate of the encoded audio (for `pcm`, the only place a client can learn it).
    fn sample_rate(&self) -> u32;

    /// Takes the next codec samples (mono f32, 44.1 kHz) and returns the bytes ready now,
    /// possibly none.
    fn push(&mut self, pcm: &[f32]) -> Result<Vec<u8>, AudioError>;

    /// Ends the stream: returns the last bytes (flushed audio and any trailer; the whole body
    /// when not streaming).
    fn finish(self: Box<Self>) -> Result<Vec<u8>, AudioError>;
}

/// Readies the resampling filter of the default `pcm` response (the most common request), so
/// that the first request after start does not build it before its first audio (~2 ms).
pub fn prepare_default_resampler() {
    resample::prepare(CODEC_SAMPLE_RATE, ResponseFormat::Pcm.default_sample_rate());
}

/// Builds the encoder for one response, after checking `format` and `opts` against what this
/// build can serve. The first three error kinds are the client's (400, see [`AudioError::param`]).
pub fn encoder(format: ResponseFormat, opts: EncodeOptions) -> Result<Box<dyn Encoder>, AudioError> {
    if !format.is_available() {
        return Err(AudioError::FormatUnavailable(format));
    }
    if !SPEED_RANGE.contains(&opts.speed) {
        return Err(AudioError::SpeedOutOfRange(opts.speed));
    }
    let rate = format.sample_rate(opts.sample_rate)?;
    let writer: Box<dyn chain::Writer> = match format {
        ResponseFormat::Pcm => Box::new(pcm::PcmWriter),
        ResponseFormat::Wav => Box::new(wav::WavWriter::new(rate, opts.streaming)),
        ResponseFormat::Flac => Box::new(flac::FlacWriter::new(rate, opts.streaming)?),
        ResponseFormat::Mp3 => Box::new(mp3::Mp3Writer::new(rate, opts.streaming)?),
        ResponseFormat::Opus => Box::new(opus::OggOpusWriter::new(rate, opts.streaming)?),
        #[cfg(feature = "aac")]
        ResponseFormat::Aac => Box::new(aac::AacWriter::new(rate)?),
        #[cfg(not(feature = "aac"))]
        ResponseFormat::Aac => unreachable!("is_available() refused aac above"),
    };
    Ok(Box::new(chain::Chain::new(format, rate, opts.speed, writer)?))
}

/// Why audio could not be encoded.
#[derive(Debug, thiserror::Error)]
pub enum AudioError {
    #[error("`response_format` `{0}` is not one of mp3, opus, aac, flac, wav, pcm")]
    UnknownFormat(String),
    #[error("`response_format` `{0}` is not available: this server was built without the cargo feature `{0}`")]
    FormatUnavailable(ResponseFormat),
    #[error("`speed` {0} is outside 0.25–4.0")]
    SpeedOutOfRange(f32),
    #[error("`sample_rate` {rate} is outside 8000–48000")]
    SampleRateOutOfRange { rate: u32 },
    #[error("`sample_rate` {rate} is not possible for `{format}`; use one of {allowed:?}")]
    SampleRateUnsupported { format: ResponseFormat, rate: u32, allowed: &'static [u32] },
    /// An encoder library failed: a server fault, not the client's.
    #[error("the {format} encoder failed: {detail}")]
    Codec { format: ResponseFormat, detail: String },
}

impl AudioError {
    /// The request field at fault, for the OpenAI error body's `param`; `None` for a server fault.
    pub fn param(&self) -> Option<&'static str> {
        match self {
            Self::UnknownFormat(_) | Self::FormatUnavailable(_) => Some("response_format"),
            Self::SpeedOutOfRange(_) => Some("speed"),
            Self::SampleRateOutOfRange { .. } | Self::SampleRateUnsupported { .. } => Some("sample_rate"),
            Self::Codec { .. } => None,
        }
    }

    pub(crate) fn codec(format: ResponseFormat, detail: impl fmt::Display) -> Self {
        Self::Codec { format, detail: detail.to_string() }
    }
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

    #[test]
    fn names_and_content_types_round_trip() {
        for f in ResponseFormat::ALL {
            assert_eq!(f.name().parse::<ResponseFormat>().unwrap(), f);
            assert!(f.content_type().starts_with("audio/"));
        }
        assert_eq!(ResponseFormat::Opus.content_type(), "audio/ogg");
        assert_eq!(ResponseFormat::Mp3.content_type(), "audio/mpeg");
        let err = "ogg".parse::<ResponseFormat>().unwrap_err();
        assert_eq!(err.param(), Some("response_format"));
    }

    #[test]
    fn sample_rates_are_validated_per_format() {
        use ResponseFormat::*;
        assert_eq!(Pcm.sample_rate(None).unwrap(), 24_000);
        assert_eq!(Wav.sample_rate(None).unwrap(), 44_100);
        assert_eq!(Flac.sample_rate(None).unwrap(), 44_100);
        assert_eq!(Mp3.sample_rate(None).unwrap(), 44_100);
        assert_eq!(Opus.sample_rate(None).unwrap(), 48_000);
        assert_eq!(Pcm.sample_rate(Some(31_234)).unwrap(), 31_234);
        assert_eq!(Mp3.sample_rate(Some(22_050)).unwrap(), 22_050);
        assert!(matches!(Pcm.sample_rate(Some(7_999)), Err(AudioError::SampleRateOutOfRange { rate: 7_999 })));
        assert!(matches!(Wav.sample_rate(Some(96_000)), Err(AudioError::SampleRateOutOfRange { .. })));
        assert!(matches!(Mp3.sample_rate(Some(31_234)), Err(AudioError::SampleRateUnsupported { .. })));
        let err = Opus.sample_rate(Some(44_100)).unwrap_err();
        assert_eq!(err.param(), Some("sample_rate"));
        assert!(err.to_string().contains("`opus`"), "{err}");
    }

    #[test]
    fn factory_refuses_bad_options_naming_the_field() {
        let err = |format, opts| encoder(format, opts).err().expect("refused");
        let speed = err(ResponseFormat::Wav, EncodeOptions { speed: 4.5, ..Default::default() });
        assert_eq!(speed.param(), Some("speed"));
        let nan = err(ResponseFormat::Wav, EncodeOptions { speed: f32::NAN, ..Default::default() });
        assert_eq!(nan.param(), Some("speed"));
        let rate = err(ResponseFormat::Opus, EncodeOptions { sample_rate: Some(44_100), ..Default::default() });
        assert_eq!(rate.param(), Some("sample_rate"));
    }

    #[cfg(not(feature = "aac"))]
    #[test]
    fn aac_without_the_feature_is_a_client_error_naming_the_format() {
        let err = encoder(ResponseFormat::Aac, EncodeOptions::default()).err().expect("refused");
        assert!(matches!(err, AudioError::FormatUnavailable(ResponseFormat::Aac)));
        assert_eq!(err.param(), Some("response_format"));
        assert!(err.to_string().contains("`aac`"), "{err}");
    }
}
