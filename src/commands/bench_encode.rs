//! `limelight bench encode`: the codec encoder on the GPU (f32, voice cloning) over a synthetic
//! reference clip: seconds of audio encoded per second, and the device memory one encode takes.
//! Also checks that the GPU's codes equal the CPU encoder's on a short clip (near-ties aside:
//! reported, not hidden).

use std::time::Instant;

use anyhow::Context;
use serde::Serialize;

use crate::backend::cpu::Cpu;
use crate::backend::cuda::codec_encode::CudaF32;
use crate::backend::cuda::{Cuda, CudaOptions};
use crate::cli::BenchEncodeArgs;
use crate::model::codec::encode::CodecEncoder;
use crate::model::load::Checkpoint;

/// Everything one run measured.
#[derive(Debug, Serialize)]
pub struct EncodeBench {
    pub gpu: String,
    pub model: String,
    pub clip_seconds: f64,
    pub frames: usize,
    pub load_s: f64,
    /// The best of the timed encodes (after one warm-up encode of the same clip).
    pub encode_ms: f64,
    pub encode_ms_each: Vec<f64>,
    pub audio_seconds_per_second: f64,
    /// Device memory the encode took above what the weights hold (the pool's peak growth).
    pub scratch_bytes: u64,
    /// The weight arena's size (whole 1 GiB chunks), not the encoder's parameter bytes.
    pub weight_arena_bytes: u64,
    /// Codes of the CPU check clip that differ from the CPU encoder's.
    pub check_clip_seconds: f64,
    pub check_codes: usize,
    pub check_codes_differing: usize,
}

/// A speech-like test clip: a gliding tone with harmonics, an envelope and a little noise.
pub fn test_clip(seconds: f64, seed: u64) -> Vec<f32> {
    let mut rng = crate::synth::rng::Rng::new(seed);
    let n = (seconds * 44_100.0) as usize;
    (0..n)
        .map(|i| {
            let t = i as f64 / 44_100.0;
            let f0 = 150.0 + 30.0 * (2.0 * std::f64::consts::PI * 0.6 * t).sin();
            let tone: f64 =
                (1..=4).map(|k| (0.3 / k as f64) * (2.0 * std::f64::consts::PI * f0 * k as f64 * t).sin()).sum();
            let envelope = 0.6 + 0.4 * (2.0 * std::f64::consts::PI * 2.1 * t).sin();
            (tone * envelope) as f32 + rng.uniform(-0.02, 0.02)
        })
        .collect()
}

pub fn bench_encode(args: &BenchEncodeArgs) -> anyhow::Result<EncodeBench> {
    let ckpt = Checkpoint::open(&args.model).context("checkpoint refused")?;
    let cuda = Cuda::open(&CudaOptions { memory_budget: args.gpu_memory_budget, ..CudaOptions::default() })?;
    let gpu = CudaF32::new(&cuda);
    let t = Instant::now();
    let encoder = CodecEncoder::load(&ckpt, &gpu).context("loading the codec encoder")?;
    cuda.synchronize();
    let load_s = t.elapsed().as_secs_f64();
    let weight_arena_bytes = cuda.weight_bytes() as u64;

    let clip = test_clip(args.seconds, 7);
    let before = cuda.budget().used();
    let frames = encoder.encode(&gpu, &clip)?.len() / encoder.codes_per_frame();
    let scratch_bytes = cuda.budget().peak().saturating_sub(before);
    let mut each = Vec::with_capacity(args.repeats);
    for _ in 0..args.repeats {
        let t = Instant::now();
        encoder.encode(&gpu, &clip)?;
        each.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let encode_ms = each.iter().copied().fold(f64::INFINITY, f64::min);

    let check = test_clip(args.check_seconds, 11);
    let cpu = CodecEncoder::load(&ckpt, &Cpu)?;
    let want = cpu.encode(&Cpu, &check)?;
    let got = encoder.encode(&gpu, &check)?;
    let differing = got.iter().zip(&want).filter(|(a, b)| a != b).count() + got.len().abs_diff(want.len());
    Ok(EncodeBench {
        gpu: cuda.info().name.clone(),
        model: args.model.display().to_string(),
        clip_seconds: args.seconds,
        frames,
        load_s,
        encode_ms,
        encode_ms_each: each,
        audio_seconds_per_second: args.seconds / (encode_ms / 1e3),
        scratch_bytes,
        weight_arena_bytes,
        check_clip_seconds: args.check_seconds,
        check_codes: want.len(),
        check_codes_differing: differing,
    })
}

impl EncodeBench {
    pub fn summary(&self) -> String {
        format!(
            "GPU {gpu}; codec encoder (f32) loaded in {load:.2} s into a {wb:.0} MiB weight arena\n\
             clip {secs:.1} s ({frames} frames): {ms:.1} ms per encode (best of {n}) = {rate:.0} s of audio per second\n\
             device memory for one encode: {scratch:.1} MiB above the weights\n\
             check clip {cs:.1} s: {diff} of {codes} codes differ from the CPU encoder",
            gpu = self.gpu,
            load = self.load_s,
            wb = self.weight_arena_bytes as f64 / (1 << 20) as f64,
            secs = self.clip_seconds,
            frames = self.frames,
            ms = self.encode_ms,
            n = self.encode_ms_each.len(),
            rate = self.audio_seconds_per_second,
            scratch = self.scratch_bytes as f64 / (1 << 20) as f64,
            cs = self.check_clip_seconds,
            diff = self.check_codes_differing,
            codes = self.check_codes,
        )
    }
}
