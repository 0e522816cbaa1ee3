//! The CPU codec encoder (`codec.md` §5.3) against golden encodes from sglang-omni 0.1.9's own Fish
//! modded-DAC module, and the reference-clip resampler against torchaudio
//! (tools/reference/codec_encode.py).
//!
//! Stage outputs are held to the float64 reference by relative L2. Codes must equal the float64
//! reference's, except at near-ties: where the reference's best and second-best codewords are
//! within [`NEAR_TIE`] of each other, two correct implementations may pick either, and every
//! later code of that frame follows from the pick. Those are counted and printed.

mod common;

use std::path::Path;

use limelight::backend::cpu::Cpu;
use limelight::checkpoint::Dtype;
use limelight::checkpoint::safetensors::SafetensorsFile;
use limelight::model::codec::CodecError;
use limelight::model::codec::encode::CodecEncoder;
use limelight::model::load::Checkpoint;
use limelight::voice::{mono, resample::resample};

/// CPU (f32 storage, f64 sums) against the float64 reference, relative L2 per stage.
const STAGE_BOUND: f64 = 1e-4;
/// A gap in the reference's `-dist` (`2 − 2·cos` units) below which a code is a near-tie. The
/// pre_module output agrees to ~1e-6 relative; cosines of 8-wide projections move by about as much.
const NEAR_TIE: f32 = 1e-4;
/// Our resampler against torchaudio's (f64 taps against its f32 ones), relative L2.
const RESAMPLE_BOUND: f64 = 1e-5;

fn fixture() -> SafetensorsFile {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/codec_encode/encode.safetensors");
    SafetensorsFile::open(&path).unwrap()
}

fn f32s(f: &SafetensorsFile, name: &str) -> (Vec<usize>, Vec<f32>) {
    let v = f.view(name).unwrap_or_else(|| panic!("fixture lacks `{name}`"));
    (v.shape.to_vec(), v.to_f32_vec().expect("float tensor"))
}

/// `[books, frames]` int32 as our `[frames, books]`.
fn codes(f: &SafetensorsFile, name: &str) -> (usize, Vec<u32>) {
    let v = f.view(name).unwrap_or_else(|| panic!("fixture lacks `{name}`"));
    assert_eq!(v.dtype, Dtype::I32);
    let data: Vec<u32> =
        v.bytes.chunks_exact(4).map(|c| u32::try_from(i32::from_le_bytes(c.try_into().unwrap())).unwrap()).collect();
    let (books, n) = (v.shape[0], v.shape[1]);
    (books, (0..n).flat_map(|t| (0..books).map(move |b| (t, b))).map(|(t, b)| data[b * n + t]).collect())
}

/// The clip: 16-bit samples over 32768.
fn clip(f: &SafetensorsFile) -> Vec<f32> {
    let v = f.view("audio_pcm16").expect("fixture lacks `audio_pcm16`");
    assert_eq!(v.dtype, Dtype::I16);
    v.bytes.chunks_exact(2).map(|c| f32::from(i16::from_le_bytes([c[0], c[1]])) / 32768.0).collect()
}

#[test]
fn encode_matches_sglang_omni_codec_stage_by_stage_and_code_for_code() {
    let f = fixture();
    let dir = common::tiny_checkpoint();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let encoder = CodecEncoder::load(&ckpt, &Cpu).unwrap();
    let audio = clip(&f);
    let (ours, trace) = encoder.encode_traced(&Cpu, &audio).unwrap();

    for (stage, m) in
        [("encoder", &trace.encoder), ("downsample", &trace.downsample), ("pre_module", &trace.pre_module)]
    {
        let (shape, golden) = f32s(&f, &format!("f64.{stage}"));
        assert_eq!((m.rows, m.cols), (shape[0], shape[1]), "{stage} shape");
        let err = common::rel_l2(&m.data, &golden);
        eprintln!("{stage:>12}: relative L2 {err:.3e} against float64 (bound {STAGE_BOUND:.0e})");
        assert!(err <= STAGE_BOUND, "{stage}: relative L2 {err:.3e} > {STAGE_BOUND:.0e}");
    }

    let (books, golden) = codes(&f, "f64.codes");
    let (_, margins) = f32s(&f, "f64.margin"); // [books, frames]
    let frames = golden.len() / books;
    assert_eq!(books, encoder.codes_per_frame());
    assert_eq!(frames, CodecEncoder::<Cpu>::frames_for(audio.len()));
    assert_eq!(ours.len(), golden.len());
    let (mut near_ties, mut excused) = (0, 0);
    for t in 0..frames {
        for b in 0..books {
            if margins[b * frames + t] < NEAR_TIE {
                near_ties += 1;
                if ours[t * books + b] != golden[t * books + b] {
                    // A near-tie picked the other way: this frame's later codes follow from it.
                    excused += books - b;
                    break;
                }
            }
            assert_eq!(
                ours[t * books + b],
                golden[t * books + b],
                "frame {t}, codebook {b}: ours {} against the reference's {} (margin {:.3e})",
                ours[t * books + b],
                golden[t * books + b],
                margins[b * frames + t]
            );
        }
    }
    eprintln!(
        "codes: {frames} frames × {books}: {near_ties} near-ties (margin < {NEAR_TIE:.0e}), {excused} codes excused"
    );
    assert!(excused * 100 <= frames * books, "{excused} of {} codes differ at near-ties", frames * books);
}

#[test]
fn the_float32_reference_agrees_with_the_float64_one_on_codes() {
    // A check on the fixture itself: if the reference's own f32 and f64 runs disagree widely,
    // the margins above are not telling near-ties apart.
    let f = fixture();
    let (_, f32_codes) = codes(&f, "f32.codes");
    let (_, f64_codes) = codes(&f, "f64.codes");
    let differ = f32_codes.iter().zip(&f64_codes).filter(|(a, b)| a != b).count();
    assert!(differ * 100 <= f64_codes.len(), "{differ} of {} codes differ between f32 and f64", f64_codes.len());
}

#[test]
fn resample_matches_torchaudio() {
    let f = fixture();
    for rate in [16_000u32, 24_000, 48_000] {
        let (shape, input) = f32s(&f, &format!("resample.{rate}.in"));
        let channels: Vec<Vec<f32>> = input.chunks_exact(shape[1]).map(<[f32]>::to_vec).collect();
        let (_, golden) = f32s(&f, &format!("resample.{rate}.out"));
        let ours = resample(&mono(&channels), rate, 44_100);
        let err = common::rel_l2(&ours, &golden);
        eprintln!("resample {rate} → 44100 ({} channels): relative L2 {err:.3e}", shape[0]);
        assert!(err <= RESAMPLE_BOUND, "resample from {rate}: relative L2 {err:.3e} > {RESAMPLE_BOUND:.0e}");
    }
}

#[test]
fn an_empty_or_non_finite_clip_is_refused() {
    let dir = common::tiny_checkpoint();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let encoder = CodecEncoder::load(&ckpt, &Cpu).unwrap();
    assert!(matches!(encoder.encode(&Cpu, &[]), Err(CodecError::EmptyAudio)));
    let mut clip = vec![0.1f32; 3000];
    clip[1234] = f32::NAN;
    assert!(matches!(encoder.encode(&Cpu, &clip), Err(CodecError::NonFiniteSample { at: 1234 })));
}

#[test]
fn a_short_clip_pads_to_whole_frames() {
    let dir = common::tiny_checkpoint();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let encoder = CodecEncoder::load(&ckpt, &Cpu).unwrap();
    let clip: Vec<f32> = (0..2049).map(|i| (i as f32 * 0.01).sin() * 0.5).collect();
    let codes = encoder.encode(&Cpu, &clip).unwrap();
    assert_eq!(codes.len(), 2 * encoder.codes_per_frame());
    // The padding is zeros: a clip that already ends in them encodes the same.
    let mut padded = clip.clone();
    padded.resize(4096, 0.0);
    assert_eq!(encoder.encode(&Cpu, &padded).unwrap(), codes);
}
