//! Every `response_format` (`api.md`), encoded by `audio::encoder` from 1.5 s of synthetic
//! codec PCM pushed in irregular chunks, then decoded by an independent decoder (ffmpeg):
//! codec, sample rate, channels and duration are what the request asked for, and the lossless
//! formats give back the very samples. Needs `ffmpeg` and `ffprobe` (Debian package `ffmpeg`);
//! without them each test prints a SKIPPED line and passes, unless `LIMELIGHT_REQUIRE_TOOLS=1`.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use limelight::audio::{CODEC_SAMPLE_RATE, EncodeOptions, ResponseFormat, encoder, f32_to_i16};

/// 1.5 s at the codec rate.
const LEN: usize = 66_150;

/// Push sizes: mostly the codec's 2048·n, plus odd ones so no stage can rely on alignment.
const CHUNKS: &[usize] = &[2048, 4096, 2048, 6144, 777, 2048, 1, 3000, 8192];

/// The same push sizes in another order, for chunking comparisons.
const OTHER_CHUNKS: &[usize] = &[1, 8192, 5000, 2048, 13, 4096];

/// Speech-band tones under a slow swell, peaking near 0.8: an analytic signal, so it can be
/// evaluated at any rate.
fn signal_at(t: f64) -> f64 {
    use std::f64::consts::TAU;
    let swell = 0.6 + 0.4 * (TAU * 1.3 * t).sin();
    swell * (0.5 * (TAU * 220.0 * t).sin() + 0.2 * (TAU * 1_000.0 * t).sin() + 0.1 * (TAU * 3_300.0 * t).sin())
}

fn signal(rate: u32, n: usize) -> Vec<f32> {
    (0..n).map(|i| signal_at(i as f64 / f64::from(rate)) as f32).collect()
}

fn encode(format: ResponseFormat, opts: EncodeOptions, pcm: &[f32], chunks: &[usize]) -> Vec<u8> {
    let mut enc = encoder(format, opts).unwrap();
    assert_eq!(enc.content_type(), format.content_type());
    let mut out = Vec::new();
    let mut rest = pcm;
    for &c in chunks.iter().cycle() {
        if rest.is_empty() {
            break;
        }
        let c = c.min(rest.len());
        out.extend(enc.push(&rest[..c]).unwrap());
        rest = &rest[c..];
    }
    out.extend(enc.finish().unwrap());
    out
}

/// Whether ffmpeg and ffprobe are on PATH; a visible skip (or a failure, when tools are
/// required) otherwise.
fn tools(test: &str) -> bool {
    let found = |tool: &str| Command::new(tool).arg("-version").output().is_ok_and(|o| o.status.success());
    if found("ffmpeg") && found("ffprobe") {
        return true;
    }
    assert!(
        std::env::var("LIMELIGHT_REQUIRE_TOOLS").as_deref() != Ok("1"),
        "{test}: ffmpeg/ffprobe not found and LIMELIGHT_REQUIRE_TOOLS=1 (apt-get install ffmpeg)"
    );
    // Written to stderr directly: libtest captures `eprintln!` of passing tests, and this
    // line must be seen.
    let _ = writeln!(std::io::stderr(), "SKIPPED {test}: ffmpeg/ffprobe not found (apt-get install ffmpeg)");
    false
}

fn extension(format: ResponseFormat) -> &'static str {
    match format {
        ResponseFormat::Opus => "ogg",
        f => f.name(),
    }
}

fn write(dir: &Path, name: &str, format: ResponseFormat, bytes: &[u8]) -> PathBuf {
    let path = dir.join(format!("{name}.{}", extension(format)));
    std::fs::write(&path, bytes).unwrap();
    path
}

/// What ffprobe says about the one audio stream.
#[derive(Debug, PartialEq)]
struct Stream {
    codec: String,
    sample_rate: u32,
    channels: u32,
}

fn probe(path: &Path) -> Stream {
    let out = Command::new("ffprobe")
        .args(["-v", "error", "-show_entries", "stream=codec_name,sample_rate,channels"])
        .args(["-of", "default=noprint_wrappers=1"])
        .arg(path)
        .output()
        .unwrap();
    assert!(out.status.success(), "ffprobe {}: {}", path.display(), String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let field = |key: &str| {
        text.lines().find_map(|l| l.strip_prefix(key)?.strip_prefix('=')).unwrap_or_else(|| panic!("{key} in {text}"))
    };
    Stream {
        codec: field("codec_name").to_owned(),
        sample_rate: field("sample_rate").parse().unwrap(),
        channels: field("channels").parse().unwrap(),
    }
}

/// Decodes to s16le at the stream's own rate and channel count; raw `pcm` needs its rate.
fn decode(path: &Path, raw_rate: Option<u32>) -> Vec<i16> {
    let mut cmd = Command::new("ffmpeg");
    cmd.args(["-v", "error", "-nostdin"]);
    if let Some(rate) = raw_rate {
        cmd.args(["-f", "s16le", "-ar", &rate.to_string(), "-ac", "1"]);
    }
    let out = cmd.arg("-i").arg(path).args(["-f", "s16le", "-acodec", "pcm_s16le", "-"]).output().unwrap();
    assert!(out.status.success(), "ffmpeg {}: {}", path.display(), String::from_utf8_lossy(&out.stderr));
    out.stdout.chunks_exact(2).map(|b| i16::from_le_bytes([b[0], b[1]])).collect()
}

/// What a decoder should give back for one request.
struct Expect {
    codec: &'static str,
    /// The rate decoders output (Opus always decodes at 48 kHz).
    decoded_rate: u32,
    /// Decoded samples beyond the exact duration that the format cannot avoid.
    extra: std::ops::RangeInclusive<usize>,
    /// Priming samples in front of the audio that the decoder cannot know to drop.
    lag: usize,
}

fn expect(format: ResponseFormat, opts: EncodeOptions) -> Expect {
    let rate = format.sample_rate(opts.sample_rate).unwrap();
    let (codec, decoded_rate, extra, lag) = match format {
        ResponseFormat::Pcm | ResponseFormat::Wav => ("pcm_s16le", rate, 0..=0, 0),
        ResponseFormat::Flac => ("flac", rate, 0..=0, 0),
        // OpusHead's pre-skip and the last page's granule position trim exactly.
        ResponseFormat::Opus => ("opus", 48_000, 0..=0, 0),
        // A whole MP3's Info tag lets ffmpeg trim LAME's delay and padding exactly. A stream has
        // no tag, so it decodes whole 1152-sample frames: LAME's 576-sample delay and the
        // decoder's 529 in front, then padding up to the frame boundary.
        ResponseFormat::Mp3 if !opts.streaming => ("mp3", rate, 0..=0, 0),
        ResponseFormat::Mp3 => ("mp3", rate, 576 + 529..=576 + 529 + 1151, 576 + 529),
        // ADTS cannot trim: FDK's 2048 samples of priming in front, then whole 1024-sample
        // frames through the flush's silence.
        ResponseFormat::Aac => ("aac", rate, 2048..=2048 + 2 * 1024, 2048),
    };
    Expect { codec, decoded_rate, extra, lag }
}

/// Encodes `pcm` (at the codec rate) as asked, decodes it with ffmpeg, checks the stream and
/// its length, and returns the decoded samples.
fn round_trip(dir: &Path, format: ResponseFormat, opts: EncodeOptions, pcm: &[f32]) -> Vec<i16> {
    let bytes = encode(format, opts, pcm, CHUNKS);
    let name = format!("{format}-{}-{}", opts.speed, opts.streaming);
    let path = write(dir, &name, format, &bytes);
    let want = expect(format, opts);
    let raw_rate = (format == ResponseFormat::Pcm).then(|| format.sample_rate(opts.sample_rate).unwrap());
    if raw_rate.is_none() {
        let got = probe(&path);
        let want_stream = Stream { codec: want.codec.into(), sample_rate: want.decoded_rate, channels: 1 };
        assert_eq!(got, want_stream, "{name}");
    }
    let decoded = decode(&path, raw_rate);
    // The stretch gives round(n / speed) samples at the codec rate, the resampler
    // ceil(m · rate / 44 100) of those.
    let stretched = (pcm.len() as f64 / f64::from(opts.speed)).round() as u64;
    let exact = (stretched * u64::from(want.decoded_rate)).div_ceil(u64::from(CODEC_SAMPLE_RATE)) as usize;
    let extra = decoded.len() as i64 - exact as i64;
    assert!(
        extra >= 0 && want.extra.contains(&(extra as usize)),
        "{name}: decoded {} samples, exact duration is {exact}, allowed extra {:?}",
        decoded.len(),
        want.extra
    );
    decoded
}

fn formats() -> Vec<ResponseFormat> {
    ResponseFormat::ALL.into_iter().filter(|f| f.is_available()).collect()
}

#[test]
fn every_format_decodes_to_the_right_codec_rate_channels_and_duration() {
    if !tools("every_format_decodes_to_the_right_codec_rate_channels_and_duration") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let pcm = signal(CODEC_SAMPLE_RATE, LEN);
    for format in formats() {
        for streaming in [true, false] {
            round_trip(dir.path(), format, EncodeOptions { streaming, ..Default::default() }, &pcm);
        }
    }
}

#[test]
fn speed_scales_the_duration() {
    if !tools("speed_scales_the_duration") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let pcm = signal(CODEC_SAMPLE_RATE, LEN);
    for (format, speed) in [
        (ResponseFormat::Wav, 0.25),
        (ResponseFormat::Wav, 4.0),
        (ResponseFormat::Pcm, 1.5),
        (ResponseFormat::Flac, 0.8),
        (ResponseFormat::Opus, 2.0),
        (ResponseFormat::Mp3, 0.5),
    ] {
        round_trip(dir.path(), format, EncodeOptions { speed, ..Default::default() }, &pcm);
    }
}

/// `pcm` at the codec rate, `wav` and `flac` (streamed or whole) decode to exactly the
/// quantised input.
#[test]
fn lossless_formats_give_back_the_input_samples() {
    if !tools("lossless_formats_give_back_the_input_samples") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let pcm = signal(CODEC_SAMPLE_RATE, LEN);
    let want: Vec<i16> = pcm.iter().map(|&x| f32_to_i16(x)).collect();
    for format in [ResponseFormat::Pcm, ResponseFormat::Wav, ResponseFormat::Flac] {
        for streaming in [true, false] {
            let opts = EncodeOptions { sample_rate: Some(CODEC_SAMPLE_RATE), streaming, ..Default::default() };
            assert!(round_trip(dir.path(), format, opts, &pcm) == want, "{format} streaming={streaming}");
        }
    }
}

/// Default `pcm` is resampled to 24 kHz: it must be the same signal at 24 kHz, in phase.
#[test]
fn resampled_pcm_is_the_signal_at_the_new_rate() {
    if !tools("resampled_pcm_is_the_signal_at_the_new_rate") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let pcm = signal(CODEC_SAMPLE_RATE, LEN);
    for rate in [24_000, 16_000] {
        let opts = EncodeOptions { sample_rate: Some(rate), ..Default::default() };
        let decoded = round_trip(dir.path(), ResponseFormat::Pcm, opts, &pcm);
        let want = signal(rate, decoded.len());
        // Away from the edges, where the filter sees the silence around the clip.
        let edge = rate as usize / 50;
        let err = decoded[edge..decoded.len() - edge]
            .iter()
            .zip(&want[edge..])
            .map(|(&d, &w)| (f32::from(d) / 32767.0 - w).abs())
            .fold(0.0f32, f32::max);
        // Filter gain error (~0.1 %) plus quantisation.
        assert!(err < 2e-3, "{rate} Hz: max error {err}");
    }
}

/// The lossy formats decode to the input signal: lined up where the format can say so (Opus,
/// a whole MP3), behind exactly the known priming where it cannot, and close in waveform.
#[test]
fn lossy_formats_sound_like_the_input() {
    if !tools("lossy_formats_sound_like_the_input") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let pcm = signal(CODEC_SAMPLE_RATE, LEN);
    let lossy = [ResponseFormat::Mp3, ResponseFormat::Opus, ResponseFormat::Aac];
    for format in lossy.into_iter().filter(|f| f.is_available()) {
        for streaming in [true, false] {
            let opts = EncodeOptions { streaming, ..Default::default() };
            let decoded = round_trip(dir.path(), format, opts, &pcm);
            let want = expect(format, opts);
            let reference = signal(want.decoded_rate, decoded.len());
            let mid = want.decoded_rate as usize / 10..decoded.len() - 3 * want.decoded_rate as usize / 10;
            let snr = |lag: usize| {
                let (mut signal, mut noise) = (0.0f64, 0.0f64);
                for i in mid.clone() {
                    let w = f64::from(reference[i]);
                    signal += w * w;
                    noise += (f64::from(decoded[i + lag]) / 32767.0 - w).powi(2);
                }
                10.0 * (signal / noise).log10()
            };
            let (lag, best) = (0..=4096).map(|l| (l, snr(l))).max_by(|a, b| a.1.total_cmp(&b.1)).unwrap();
            // Measured: 26 dB for mp3, 33 dB for opus, 30 dB for aac.
            assert!(lag == want.lag && best > 20.0, "{format} streaming={streaming}: lag {lag}, SNR {best:.1} dB");
        }
    }
}

/// `pcm`, `wav`, `flac` and `mp3` bytes do not depend on the chunking. A streamed `opus` ends an
/// Ogg page with each push, so its bytes do (its packets do not), but equal chunking gives
/// equal bytes; a whole `opus` fills its pages regardless of the pushes.
#[test]
fn chunking_changes_no_bytes_where_the_format_allows() {
    let pcm = signal(CODEC_SAMPLE_RATE, LEN);
    for format in formats() {
        for opts in [
            EncodeOptions::default(),
            EncodeOptions { streaming: false, ..Default::default() },
            EncodeOptions { speed: 1.3, sample_rate: Some(24_000), ..Default::default() },
        ] {
            let a = encode(format, opts, &pcm, CHUNKS);
            assert!(a == encode(format, opts, &pcm, CHUNKS), "{format} {opts:?}: same chunking, other bytes");
            let b = encode(format, opts, &pcm, OTHER_CHUNKS);
            if format == ResponseFormat::Opus && opts.streaming {
                assert!(a != b, "streamed opus pages are expected to end with each push");
            } else {
                assert!(a == b, "{format} {opts:?}: chunking changed the bytes");
            }
        }
    }
}

/// A whole `wav` has exact RIFF and data sizes, a streamed one 0xFFFFFFFF in both.
#[test]
fn wav_sizes_are_exact_when_whole_and_unknown_when_streamed() {
    let pcm = signal(CODEC_SAMPLE_RATE, 1000);
    let u32_at = |b: &[u8], at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
    let whole = encode(ResponseFormat::Wav, EncodeOptions { streaming: false, ..Default::default() }, &pcm, CHUNKS);
    assert_eq!((u32_at(&whole, 4), u32_at(&whole, 40)), (36 + 2000, 2000));
    assert_eq!(whole.len(), 44 + 2000);
    let streamed = encode(ResponseFormat::Wav, EncodeOptions::default(), &pcm, CHUNKS);
    assert_eq!((u32_at(&streamed, 4), u32_at(&streamed, 40)), (u32::MAX, u32::MAX));
    assert_eq!(streamed[44..], whole[44..]);
}

/// Speed 1.0 is a pass-through: the same bytes as a request without `speed`, exactly the
/// quantised input for `pcm` at the codec rate.
#[test]
fn speed_one_is_bit_exact() {
    let pcm = signal(CODEC_SAMPLE_RATE, LEN);
    let opts = EncodeOptions { sample_rate: Some(CODEC_SAMPLE_RATE), speed: 1.0, ..Default::default() };
    let bytes = encode(ResponseFormat::Pcm, opts, &pcm, CHUNKS);
    let want: Vec<u8> = pcm.iter().flat_map(|&x| f32_to_i16(x).to_le_bytes()).collect();
    assert!(bytes == want);
}
