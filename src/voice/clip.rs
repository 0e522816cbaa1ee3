//! A reference clip's bytes → the codec encoder's input: decoded by maintained crates (symphonia
//! for WAV, FLAC, MP3, Ogg Vorbis and M4A/AAC; ogg + opus-rs for Ogg Opus), never by hand; mixed
//! down to mono; resampled to 44.1 kHz as the reference encode hook does (`super::resample`).
//!
//! Limits are checked as early as they can be: the byte count before anything is parsed; the
//! sample rate (within the range, and with a resampling filter of bounded size) and channel
//! count from the stream's header; the duration while decoding (a long file stops decoding at
//! the limit instead of filling memory). Every refusal says what was wrong, for a 400 that
//! names the field.
//!
//! The server runs this in a child process (`super::isolated`): the decoders allocate sizes a
//! file declares, and only a process limit contains that.

use std::io::Cursor;
use std::ops::RangeInclusive;

use symphonia::core::audio::SampleBuffer;
use symphonia::core::codecs::{CODEC_TYPE_NULL, DecoderOptions};
use symphonia::core::errors::Error as SymphoniaError;
use symphonia::core::formats::FormatOptions;
use symphonia::core::io::MediaSourceStream;
use symphonia::core::meta::MetadataOptions;
use symphonia::core::probe::Hint;

use super::mono;
use super::resample::{affordable, filter_shape, resample};
use crate::model::codec::encode::MAX_REFERENCE_SECONDS;

/// The codec encoder's rate.
pub const ENCODER_RATE: u32 = 44_100;
/// Opus always decodes at 48 kHz.
const OPUS_RATE: u32 = 48_000;
/// The longest Opus frame: 120 ms at 48 kHz, per channel.
const OPUS_MAX_FRAME: usize = 5_760;

/// What a reference clip may be.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ClipLimits {
    /// Bytes of the encoded file.
    pub max_bytes: usize,
    /// Seconds of audio (the reference's own limit is 60 s).
    pub max_seconds: f64,
    /// Seconds of audio below which a clip says too little to clone a voice from.
    pub min_seconds: f64,
    /// Source sample rates accepted.
    pub rates: RangeInclusive<u32>,
    /// Channels accepted.
    pub max_channels: usize,
}

impl Default for ClipLimits {
    fn default() -> Self {
        ClipLimits {
            max_bytes: 32 << 20,
            max_seconds: MAX_REFERENCE_SECONDS,
            min_seconds: 0.5,
            rates: 8_000..=192_000,
            max_channels: 8,
        }
    }
}

/// A decoded reference clip.
#[derive(Clone, Debug, PartialEq)]
pub struct Clip {
    /// Mono samples at [`ENCODER_RATE`].
    pub samples: Vec<f32>,
    /// The file's own rate and channel count.
    pub source_rate: u32,
    pub source_channels: usize,
}

impl Clip {
    pub fn seconds(&self) -> f64 {
        self.samples.len() as f64 / f64::from(ENCODER_RATE)
    }
}

/// Why a clip was refused (serialised: the child decoder of `super::isolated` sends it back).
#[derive(Debug, thiserror::Error, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum ClipError {
    #[error("the audio is {bytes} bytes, more than the {max} allowed")]
    TooLarge { bytes: usize, max: usize },
    #[error("the audio could not be decoded as WAV, FLAC, MP3, Ogg Vorbis/Opus or M4A/AAC: {0}")]
    Undecodable(String),
    #[error("the audio's sample rate {rate} Hz is outside {min}–{max} Hz")]
    Rate { rate: u32, min: u32, max: u32 },
    #[error(
        "the audio's sample rate {rate} Hz has no short ratio to the codec's 44 100 Hz (resampling \
         it would take {phases} filters of {taps} taps); use a common rate such as 16 000, 22 050, \
         24 000, 44 100 or 48 000 Hz"
    )]
    RateRatio { rate: u32, phases: usize, taps: usize },
    #[error("the audio has {channels} channels, more than the {max} allowed")]
    Channels { channels: usize, max: usize },
    #[error("the audio is longer than the {max} s allowed")]
    TooLong { max: f64 },
    #[error("the audio lasts {seconds:.2} s, less than the {min} s a voice needs")]
    TooShort { seconds: f64, min: f64 },
    #[error("the audio holds a sample that is not a finite number")]
    NonFinite,
}

/// Decodes `bytes` (its media type or file extension as `hint`, if known) into a clip.
pub fn decode(bytes: &[u8], hint: Option<&str>, limits: &ClipLimits) -> Result<Clip, ClipError> {
    if bytes.len() > limits.max_bytes {
        return Err(ClipError::TooLarge { bytes: bytes.len(), max: limits.max_bytes });
    }
    // symphonia allocates FLAC comments and pictures at their declared lengths, unchecked:
    // refuse lying ones first.
    super::flac_metadata::check(bytes).map_err(ClipError::Undecodable)?;
    // The decoders are third-party code fed a client's bytes: one that panics on a malformed
    // file (symphonia's ADTS reader did, found by fuzzing: `fuzz/seeds/voice_clip/adts-step-zero`)
    // must refuse that upload, not take down the request's task.
    let decoded = std::panic::catch_unwind(|| {
        if is_ogg_opus(bytes) { decode_opus(bytes, limits) } else { decode_symphonia(bytes, hint, limits) }
    });
    let (channels, rate) = decoded.map_err(|_| ClipError::Undecodable(String::from("the file is malformed")))??;
    let samples = resample(&mono(&channels), rate, ENCODER_RATE);
    if samples.iter().any(|v| !v.is_finite()) {
        return Err(ClipError::NonFinite);
    }
    let clip = Clip { samples, source_rate: rate, source_channels: channels.len() };
    if clip.seconds() < limits.min_seconds {
        return Err(ClipError::TooShort { seconds: clip.seconds(), min: limits.min_seconds });
    }
    Ok(clip)
}

fn check_format(rate: u32, channels: usize, limits: &ClipLimits) -> Result<(), ClipError> {
    if !limits.rates.contains(&rate) {
        return Err(ClipError::Rate { rate, min: *limits.rates.start(), max: *limits.rates.end() });
    }
    if !affordable(rate, ENCODER_RATE) {
        let (phases, taps) = filter_shape(rate, ENCODER_RATE);
        return Err(ClipError::RateRatio { rate, phases, taps });
    }
    if channels == 0 || channels > limits.max_channels {
        return Err(ClipError::Channels { channels, max: limits.max_channels });
    }
    Ok(())
}

/// Frames (samples per channel) a clip at `rate` may hold.
fn max_frames(rate: u32, limits: &ClipLimits) -> usize {
    (limits.max_seconds * f64::from(rate)).ceil() as usize
}

fn undecodable(e: impl std::fmt::Display) -> ClipError {
    ClipError::Undecodable(e.to_string())
}

/// The default track through symphonia; returns the channels (one `Vec` each) and the rate.
fn decode_symphonia(bytes: &[u8], hint: Option<&str>, limits: &ClipLimits) -> Result<(Vec<Vec<f32>>, u32), ClipError> {
    let stream = MediaSourceStream::new(Box::new(Cursor::new(bytes.to_vec())), Default::default());
    let mut h = Hint::new();
    if let Some(hint) = hint {
        match hint.rsplit_once('/') {
            Some((_, subtype)) => h.mime_type(hint).with_extension(subtype),
            None => h.with_extension(hint),
        };
    }
    let probed = symphonia::default::get_probe()
        .format(&h, stream, &FormatOptions::default(), &MetadataOptions::default())
        .map_err(undecodable)?;
    let mut format = probed.format;
    let track = format
        .tracks()
        .iter()
        .find(|t| t.codec_params.codec != CODEC_TYPE_NULL)
        .ok_or_else(|| ClipError::Undecodable(String::from("no audio track")))?;
    let (id, params) = (track.id, track.codec_params.clone());
    let rate = params.sample_rate.ok_or_else(|| ClipError::Undecodable(String::from("no sample rate")))?;
    if let Some(ch) = params.channels {
        check_format(rate, ch.count(), limits)?;
    }
    let cap = max_frames(rate, limits);
    if params.n_frames.is_some_and(|n| n as usize > cap) {
        return Err(ClipError::TooLong { max: limits.max_seconds });
    }
    let mut decoder =
        symphonia::default::get_codecs().make(&params, &DecoderOptions::default()).map_err(undecodable)?;
    let mut channels: Vec<Vec<f32>> = Vec::new();
    loop {
        let packet = match format.next_packet() {
            Ok(p) => p,
            Err(SymphoniaError::IoError(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
            Err(e) => return Err(undecodable(e)),
        };
        if packet.track_id() != id {
            continue;
        }
        let decoded = match decoder.decode(&packet) {
            Ok(d) => d,
            // A damaged packet is skipped, as players do; anything else is the file's end.
            Err(SymphoniaError::DecodeError(_)) => continue,
            Err(e) => return Err(undecodable(e)),
        };
        let spec = *decoded.spec();
        let count = spec.channels.count();
        if channels.is_empty() {
            check_format(spec.rate, count, limits)?;
            channels = vec![Vec::new(); count];
        } else if count != channels.len() || spec.rate != rate {
            return Err(ClipError::Undecodable(String::from("the stream changes its channels or rate")));
        }
        let mut buf = SampleBuffer::<f32>::new(decoded.capacity() as u64, spec);
        buf.copy_interleaved_ref(decoded);
        for frame in buf.samples().chunks_exact(count) {
            for (c, &v) in channels.iter_mut().zip(frame) {
                c.push(v);
            }
        }
        if channels[0].len() > cap {
            return Err(ClipError::TooLong { max: limits.max_seconds });
        }
    }
    if channels.is_empty() {
        return Err(ClipError::Undecodable(String::from("no audio in the stream")));
    }
    Ok((channels, rate))
}

/// Whether the bytes start an Ogg stream whose first packet is an `OpusHead`.
fn is_ogg_opus(bytes: &[u8]) -> bool {
    // First page: "OggS", 23 more header bytes, the segment table, then the packet.
    if bytes.len() < 28 || &bytes[..4] != b"OggS" {
        return false;
    }
    let segments = usize::from(bytes[26]);
    bytes.get(27 + segments..27 + segments + 8) == Some(b"OpusHead")
}

/// An Ogg Opus stream through the ogg and opus-rs crates (RFC 7845): the `OpusHead` gives the
/// channels and the samples to skip at the start; audio packets decode at 48 kHz.
fn decode_opus(bytes: &[u8], limits: &ClipLimits) -> Result<(Vec<Vec<f32>>, u32), ClipError> {
    let mut reader = ogg::PacketReader::new(Cursor::new(bytes));
    let head = reader.read_packet_expected().map_err(undecodable)?;
    let data = &head.data;
    if data.len() < 19 || &data[..8] != b"OpusHead" {
        return Err(ClipError::Undecodable(String::from("no OpusHead")));
    }
    let count = usize::from(data[9]);
    let pre_skip = usize::from(u16::from_le_bytes([data[10], data[11]]));
    if data[18] != 0 || count > 2 {
        return Err(ClipError::Undecodable(String::from("multichannel Opus streams are not supported")));
    }
    check_format(OPUS_RATE, count, limits)?;
    let mut decoder = opus_rs::OpusDecoder::new(OPUS_RATE as i32, count).map_err(undecodable)?;
    let cap = max_frames(OPUS_RATE, limits) + pre_skip;
    let mut channels = vec![Vec::new(); count];
    let mut pcm = vec![0.0f32; OPUS_MAX_FRAME * count];
    let mut packets = 0;
    while let Some(packet) = reader.read_packet().map_err(undecodable)? {
        packets += 1;
        if packets == 1 {
            continue; // OpusTags
        }
        let frames = decoder.decode(&packet.data, OPUS_MAX_FRAME, &mut pcm).map_err(undecodable)?;
        for frame in pcm[..frames * count].chunks_exact(count) {
            for (c, &v) in channels.iter_mut().zip(frame) {
                c.push(v);
            }
        }
        if channels[0].len() > cap {
            return Err(ClipError::TooLong { max: limits.max_seconds });
        }
    }
    for c in &mut channels {
        c.drain(..pre_skip.min(c.len()));
    }
    Ok((channels, OPUS_RATE))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audio::{EncodeOptions, ResponseFormat, encoder};

    /// Found by `fuzz/fuzz_targets/voice_clip.rs`: an ADTS-looking stream on which symphonia's
    /// reader panics (`step_by(0)`). It is an ordinary refusal.
    #[test]
    fn a_file_the_decoder_panics_on_is_refused() {
        let bytes = [
            0x79, 0x74, 0xff, 0x00, 0xf1, 0x66, 0x70, 0, 0, 0, 0, 0, 0x49, 0, 0, 0xff, 0xf1, 0x66, 0x74, 0x79, 0x70, 0,
            0, 0, 0, 0, 0xfe, 0xff, 0xdf, 0xff, 0x00, 0x2a,
        ];
        let refused = decode(&bytes, Some("m4a"), &ClipLimits::default());
        assert_eq!(refused, Err(ClipError::Undecodable(String::from("the file is malformed"))));
    }

    /// A 1.5 s tone at 44.1 kHz, as the codec would produce it.
    fn tone(seconds: f64) -> Vec<f32> {
        (0..(seconds * 44_100.0) as usize)
            .map(|i| 0.5 * (i as f32 * 440.0 * std::f32::consts::TAU / 44_100.0).sin())
            .collect()
    }

    fn encoded(format: ResponseFormat, rate: Option<u32>, seconds: f64) -> Vec<u8> {
        let opts = EncodeOptions { sample_rate: rate, speed: 1.0, streaming: false };
        let mut e = encoder(format, opts).unwrap();
        let mut bytes = e.push(&tone(seconds)).unwrap();
        bytes.extend(e.finish().unwrap());
        bytes
    }

    /// Each format our server writes comes back as about the clip it encoded, at 44.1 kHz.
    #[test]
    fn decodes_wav_flac_mp3_and_opus_at_their_rates() {
        let cases = [
            (ResponseFormat::Wav, Some(44_100), "audio/wav"),
            (ResponseFormat::Wav, Some(16_000), "wav"),
            (ResponseFormat::Flac, Some(48_000), "audio/flac"),
            (ResponseFormat::Mp3, Some(24_000), "audio/mpeg"),
            (ResponseFormat::Opus, Some(24_000), "audio/ogg"),
        ];
        for (format, rate, hint) in cases {
            let clip = decode(&encoded(format, rate, 1.5), Some(hint), &ClipLimits::default())
                .unwrap_or_else(|e| panic!("{format:?} at {rate:?}: {e}"));
            assert!((clip.seconds() - 1.5).abs() < 0.1, "{format:?}: {:.3} s", clip.seconds());
            assert_eq!(clip.source_channels, 1);
            let peak = clip.samples.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            assert!((0.4..0.6).contains(&peak), "{format:?}: peak {peak}");
            // Without a hint too: formats are recognised from their bytes.
            assert!(decode(&encoded(format, rate, 1.5), None, &ClipLimits::default()).is_ok(), "{format:?} unhinted");
        }
    }

    /// Ogg Vorbis and M4A/AAC, which we do not write (tools/fixtures/make_reference_clips.py).
    #[test]
    fn decodes_ogg_vorbis_and_m4a_aac() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/clips");
        for (file, rate, channels, amplitude) in
            [("tone-vorbis-22050-stereo.ogg", 22_050, 2, 0.375), ("tone-aac-32000-mono.m4a", 32_000, 1, 0.5)]
        {
            let bytes = std::fs::read(dir.join(file)).unwrap();
            let clip = decode(&bytes, None, &ClipLimits::default()).unwrap_or_else(|e| panic!("{file}: {e}"));
            assert_eq!((clip.source_rate, clip.source_channels), (rate, channels), "{file}");
            assert!((clip.seconds() - 0.8).abs() < 0.1, "{file}: {:.3} s", clip.seconds());
            // The mono mixdown of tones at 0.5 and 0.25 is a tone at 0.375: RMS amplitude/√2 over
            // the middle half (the AAC encoder overshoots at the abrupt onset).
            let mid = &clip.samples[clip.samples.len() / 4..3 * clip.samples.len() / 4];
            let rms = (mid.iter().map(|v| v * v).sum::<f32>() / mid.len() as f32).sqrt();
            let want = amplitude / std::f32::consts::SQRT_2;
            assert!((rms - want).abs() < 0.02, "{file}: RMS {rms}, expected about {want}");
        }
    }

    #[test]
    fn refuses_garbage_large_long_and_short_clips() {
        let limits = ClipLimits::default();
        assert!(matches!(decode(b"not audio at all", None, &limits), Err(ClipError::Undecodable(_))));
        assert!(matches!(decode(&[0u8; 100], Some("audio/wav"), &limits), Err(ClipError::Undecodable(_))));
        let small = ClipLimits { max_bytes: 1000, ..limits.clone() };
        let wav = encoded(ResponseFormat::Wav, None, 1.5);
        assert_eq!(decode(&wav, None, &small), Err(ClipError::TooLarge { bytes: wav.len(), max: 1000 }));
        let short = ClipLimits { max_seconds: 1.0, ..limits.clone() };
        assert_eq!(decode(&wav, None, &short), Err(ClipError::TooLong { max: 1.0 }));
        let opus = encoded(ResponseFormat::Opus, None, 1.5);
        assert_eq!(decode(&opus, None, &short), Err(ClipError::TooLong { max: 1.0 }));
        let tiny = encoded(ResponseFormat::Wav, None, 0.2);
        assert!(matches!(decode(&tiny, None, &limits), Err(ClipError::TooShort { .. })));
        let narrow = ClipLimits { rates: 16_000..=16_000, ..limits };
        assert!(matches!(decode(&wav, None, &narrow), Err(ClipError::Rate { rate: 44_100, .. })));
    }

    /// A rate inside the range whose ratio to 44.1 kHz has no short form is refused from the
    /// header, before any filter is built: a 644-byte WAV at 44 108 Hz made the fuzzer allocate
    /// 974 MB, and 44 099 Hz would have asked for 15.6 GB and aborted the server.
    #[test]
    fn a_rate_with_no_short_ratio_is_refused_before_resampling() {
        for (rate, phases, taps) in [(44_108, 11_025, 11_041), (44_099, 44_100, 44_113)] {
            let spec = hound::WavSpec {
                channels: 1,
                sample_rate: rate,
                bits_per_sample: 16,
                sample_format: hound::SampleFormat::Int,
            };
            let mut bytes = Cursor::new(Vec::new());
            let mut w = hound::WavWriter::new(&mut bytes, spec).unwrap();
            for i in 0..rate {
                w.write_sample(((f64::from(i) * 0.05).sin() * 8000.0) as i16).unwrap();
            }
            w.finalize().unwrap();
            let got = decode(bytes.get_ref(), Some("audio/wav"), &ClipLimits::default());
            assert_eq!(got, Err(ClipError::RateRatio { rate, phases, taps }));
            assert!(got.unwrap_err().to_string().contains("use a common rate"));
        }
        let seed = include_bytes!("../../fuzz/seeds/voice_clip/wav-44108-hz");
        assert!(matches!(
            decode(&seed[1..], None, &ClipLimits::default()),
            Err(ClipError::RateRatio { rate: 44_108, .. })
        ));
    }

    /// A truncated file decodes what it holds or is refused; it never panics.
    #[test]
    fn truncated_files_never_panic() {
        for format in [ResponseFormat::Wav, ResponseFormat::Flac, ResponseFormat::Mp3, ResponseFormat::Opus] {
            let bytes = encoded(format, None, 1.0);
            for cut in [0, 10, 44, 100, bytes.len() / 2, bytes.len() - 1] {
                let _ = decode(&bytes[..cut], None, &ClipLimits { min_seconds: 0.0, ..ClipLimits::default() });
            }
        }
    }
}
