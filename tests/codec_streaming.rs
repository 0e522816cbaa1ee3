//! Streaming decode equals whole decode bit for bit (`codec.md` §2, `verification.md`): the
//! concatenated outputs of a `StreamingDecoder` fed the frames in any grouping — one at a time,
//! first frame alone then threes, irregular groups, across the 128-frame attention window — are
//! the exact bytes of `CodecModel::decode` of all frames. Scratch is NaN-poisoned by the CPU
//! backend, so a read of stale data would surface as a NaN here.

mod common;

use limelight::backend::cpu::Cpu;
use limelight::model::codec::{CodecError, CodecModel, StreamingDecoder};
use limelight::model::load::Checkpoint;

fn model() -> (tempfile::TempDir, CodecModel<Cpu>) {
    let dir = common::tiny_checkpoint();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let model = CodecModel::load(&ckpt, &Cpu).unwrap();
    (dir, model)
}

/// Deterministic pseudo-random codes (a few above the codebooks, which decode clamps).
fn codes(model: &CodecModel<Cpu>, frames: usize, seed: u64) -> Vec<u32> {
    let d = &model.dims;
    let mut state = seed;
    let mut next = move || {
        state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        (state >> 33) as u32
    };
    let mut out = Vec::new();
    for _ in 0..frames {
        out.push(next() % (d.semantic_codebook_size as u32 + 8));
        out.extend((0..d.residual_codebooks).map(|_| next() % (d.residual_codebook_size as u32 + 4)));
    }
    out
}

/// Group sizes covering `frames`, cycling through `pattern` (the last group may be cut short).
fn groups(frames: usize, pattern: &[usize]) -> Vec<usize> {
    let mut out = Vec::new();
    let mut left = frames;
    for &g in pattern.iter().cycle() {
        if left == 0 {
            break;
        }
        out.push(g.min(left));
        left -= g.min(left);
    }
    out
}

fn stream(model: &CodecModel<Cpu>, codes: &[u32], sizes: &[usize]) -> Vec<f32> {
    let width = model.codes_per_frame();
    let mut dec = StreamingDecoder::new(model, &Cpu);
    let mut out = Vec::new();
    let mut at = 0;
    for &n in sizes {
        let pcm = dec.push(&codes[at * width..(at + n) * width]).unwrap();
        assert_eq!(pcm.len(), 2048 * n, "samples per pushed group");
        out.extend(pcm);
        at += n;
        assert_eq!(dec.frames(), at);
    }
    out
}

fn assert_bit_identical(name: &str, streamed: &[f32], whole: &[f32]) {
    assert_eq!(streamed.len(), whole.len(), "{name}: length");
    assert!(whole.iter().all(|v| v.is_finite()), "{name}: whole decode has non-finite samples");
    let first = streamed.iter().zip(whole).position(|(a, b)| a.to_bits() != b.to_bits());
    assert_eq!(first, None, "{name}: first differing sample (frame {:?})", first.map(|i| i / 2048));
}

#[test]
fn every_chunking_of_48_frames_equals_the_whole_decode() {
    let (_dir, model) = model();
    let frames = 48;
    let codes = codes(&model, frames, 11);
    let whole = model.decode(&Cpu, &codes).unwrap();
    let mut first_then_threes = vec![1];
    first_then_threes.extend(groups(frames - 1, &[3]));
    let mut first_then_rest = vec![1, frames - 1];
    let cases: [(&str, Vec<usize>); 5] = [
        ("one at a time", groups(frames, &[1])),
        ("1 + 3 + 3 + ...", first_then_threes),
        ("irregular 1,2,7,3,5,11,4", groups(frames, &[1, 2, 7, 3, 5, 11, 4])),
        ("first alone, then the rest", std::mem::take(&mut first_then_rest)),
        ("all but the last, then the last", vec![frames - 1, 1]),
    ];
    for (name, sizes) in cases {
        assert_eq!(sizes.iter().sum::<usize>(), frames);
        assert_bit_identical(name, &stream(&model, &codes, &sizes), &whole);
    }
}

/// Frames past 127 see only their window; the carried keys must slide with it.
#[test]
fn chunked_decode_across_the_attention_window_equals_the_whole_decode() {
    let (_dir, model) = model();
    let frames = 140;
    let codes = codes(&model, frames, 23);
    let whole = model.decode(&Cpu, &codes).unwrap();
    let mut sizes = vec![1];
    sizes.extend(groups(frames - 1, &[2, 7, 3, 1, 13, 5, 64, 9]));
    assert_bit_identical("irregular over 140 frames", &stream(&model, &codes, &sizes), &whole);
}

#[test]
fn empty_and_partial_pushes() {
    let (_dir, model) = model();
    let codes = codes(&model, 2, 5);
    let mut dec = StreamingDecoder::new(&model, &Cpu);
    assert!(dec.push(&[]).unwrap().is_empty());
    assert_eq!(dec.frames(), 0);
    let err = dec.push(&codes[..15]).unwrap_err();
    assert!(matches!(err, CodecError::Codes { len: 15, width: 10 }), "{err}");
    assert_eq!(dec.frames(), 0, "a refused push leaves the stream where it was");
    let mut streamed = dec.push(&codes[..10]).unwrap();
    streamed.extend(dec.push(&[]).unwrap());
    streamed.extend(dec.push(&codes[10..]).unwrap());
    assert_bit_identical("with empty pushes between", &streamed, &model.decode(&Cpu, &codes).unwrap());
    assert!(matches!(dec.push_traced(&[]), Err(CodecError::Empty)));
}

/// Several streams decoded together (`StreamingDecoder::push_many`, as the decode batch decodes
/// its ready groups): each stream joins at its own call, sits some calls out and takes groups
/// of its own sizes, and its samples equal its whole decode bit for bit. A stream given
/// malformed codes fails alone and stays where it was.
#[test]
fn streams_decoded_together_equal_their_whole_decodes() {
    let (_dir, model) = model();
    let width = model.codes_per_frame();
    let lens = [20usize, 33, 7, 48];
    let all: Vec<Vec<u32>> = lens.iter().enumerate().map(|(i, &f)| codes(&model, f, 100 + i as u64)).collect();
    let wholes: Vec<Vec<f32>> = all.iter().map(|c| model.decode(&Cpu, c).unwrap()).collect();
    // The last decoder is fed a malformed group once, then nothing.
    let mut decoders: Vec<StreamingDecoder<Cpu>> =
        (0..=lens.len()).map(|_| StreamingDecoder::new(&model, &Cpu)).collect();
    let (mut at, mut pcm) = (vec![0usize; lens.len()], vec![Vec::new(); lens.len()]);
    let (mut call, mut together) = (0, 0);
    while at.iter().zip(&lens).any(|(a, l)| a < l) {
        let mut chunks: Vec<(usize, Vec<u32>)> = Vec::new();
        for s in 0..lens.len() {
            if call < s || (call + s) % 5 == 0 || at[s] == lens[s] {
                continue;
            }
            let n = (1 + (call + 2 * s) % 8).min(lens[s] - at[s]);
            chunks.push((s, all[s][at[s] * width..(at[s] + n) * width].to_vec()));
            at[s] += n;
        }
        if call == 2 {
            chunks.push((lens.len(), all[0][..15].to_vec()));
        }
        together = together.max(chunks.len());
        let mut picked: Vec<&mut StreamingDecoder<Cpu>> = (decoders.iter_mut().enumerate())
            .filter(|(i, _)| chunks.iter().any(|(s, _)| s == i))
            .map(|(_, d)| d)
            .collect();
        let code_refs: Vec<&[u32]> = chunks.iter().map(|(_, c)| c.as_slice()).collect();
        let results = StreamingDecoder::push_many(&mut picked, &code_refs);
        for ((s, c), result) in chunks.iter().zip(results) {
            if *s == lens.len() {
                assert!(matches!(result, Err(CodecError::Codes { len: 15, width: 10 })), "{result:?}");
                continue;
            }
            let samples = result.unwrap();
            assert_eq!(samples.len(), 2048 * c.len() / width, "stream {s}: samples of its group");
            pcm[*s].extend(samples);
        }
        call += 1;
    }
    assert!(together >= 4, "at most {together} streams shared a call");
    assert_eq!(decoders[lens.len()].frames(), 0, "the malformed stream did not advance");
    for (s, (got, whole)) in pcm.iter().zip(&wholes).enumerate() {
        assert_eq!(decoders[s].frames(), lens[s]);
        assert_bit_identical(&format!("stream {s} decoded with others"), got, whole);
    }
}

/// The codec thread's warm-up (run on the GPU at start) decodes every group size once, for
/// as many streams as a round takes; on the CPU it must simply work.
#[test]
fn the_codec_thread_warms_up_every_group_size() {
    use limelight::engine::audio::group_sizes;
    use limelight::scheduler::CodecThread;
    assert_eq!(group_sizes(), [1, 2, 4, 8]);
    let (_dir, model) = model();
    CodecThread::new(&model, &Cpu, 3).warm_up().expect("the warm-up decodes");
}
