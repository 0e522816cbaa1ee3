//! Random tensor contents for the checkpoint writer, following each tensor's [`Init`] hint and
//! stored dtype. Large tensors are filled in parallel, chunk by chunk, each chunk from its own
//! keyed stream, so the result is the same on any number of threads.

use std::sync::OnceLock;

use half::{bf16, f16};

use super::rng::Rng;
use crate::checkpoint::Dtype;
use crate::checkpoint::fp8::{E4M3_MAX, e4m3_to_f32, f32_to_e4m3};
use crate::model::weights::{Init, TensorSpec};

/// Elements per independently seeded chunk.
const CHUNK: usize = 1 << 20;

/// The stored bytes of one tensor.
pub fn tensor_bytes(spec: &TensorSpec, seed: u64) -> Vec<u8> {
    tensor_bytes_scaled(spec, seed, 1.0)
}

/// [`tensor_bytes`] with a residual branch's values (see `TensorSpec::residual_branch`) scaled
/// by `residual_scale` (the same random stream, so 1.0 gives the same bytes).
pub fn tensor_bytes_scaled(spec: &TensorSpec, seed: u64, residual_scale: f32) -> Vec<u8> {
    let gain = if spec.residual_branch { residual_scale } else { 1.0 };
    let numel = spec.numel();
    let size = spec.stored.size();
    let mut out = vec![0u8; numel * size];
    match spec.init {
        Init::RopeTable => rope_table(spec, &mut out),
        Init::CausalMask => causal_mask(spec, &mut out),
        _ => {
            let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(16);
            let chunks: Vec<(usize, &mut [u8])> = out.chunks_mut(CHUNK * size).enumerate().collect();
            let per_thread = chunks.len().div_ceil(threads).max(1);
            let mut groups: Vec<Vec<(usize, &mut [u8])>> = Vec::new();
            for (i, c) in chunks.into_iter().enumerate() {
                if i % per_thread == 0 {
                    groups.push(Vec::new());
                }
                groups.last_mut().expect("pushed above").push(c);
            }
            std::thread::scope(|s| {
                for group in groups {
                    s.spawn(move || {
                        for (index, chunk) in group {
                            let mut rng = Rng::for_tensor(seed, &spec.name, index as u64);
                            fill_chunk(spec, &mut rng, chunk, gain);
                        }
                    });
                }
            });
        }
    }
    out
}

fn fill_chunk(spec: &TensorSpec, rng: &mut Rng, out: &mut [u8], gain: f32) {
    if spec.init == Init::Fp8Codes {
        let table = fp8_code_table();
        for b in out.iter_mut() {
            *b = table[(rng.next_u64() >> 48) as usize];
        }
        return;
    }
    let mut sample = sampler(spec.init);
    let mut value = |rng: &mut Rng| sample(rng) * gain;
    match spec.stored {
        Dtype::F32 => out.chunks_exact_mut(4).for_each(|c| c.copy_from_slice(&value(rng).to_le_bytes())),
        Dtype::BF16 => {
            out.chunks_exact_mut(2).for_each(|c| c.copy_from_slice(&bf16::from_f32(value(rng)).to_le_bytes()))
        }
        Dtype::F16 => out.chunks_exact_mut(2).for_each(|c| c.copy_from_slice(&f16::from_f32(value(rng)).to_le_bytes())),
        other => panic!("tensor `{}`: the writer cannot fill dtype {other}", spec.name),
    }
}

/// A value generator for float tensors.
fn sampler(init: Init) -> impl FnMut(&mut Rng) -> f32 {
    // Uniform on [-a, a] has standard deviation a/√3.
    let sym = |std: f32| std * 3f32.sqrt();
    move |rng: &mut Rng| match init {
        Init::Linear { fan_in } => {
            let a = sym(1.0 / (fan_in as f32).sqrt());
            rng.uniform(-a, a)
        }
        Init::Normalish { std } => rng.uniform(-sym(std), sym(std)),
        Init::ZeroCenteredGain => rng.uniform(-0.25, 0.25),
        Init::Uniform { lo, hi } => rng.uniform(lo, hi),
        Init::ALog => rng.uniform(1.0, 16.0).ln(),
        Init::DtBias => {
            // Inverse softplus of a log-uniform time step: dt + ln(1 - e^-dt).
            let dt = (rng.uniform(1e-3f32.ln(), 1e-1f32.ln())).exp();
            dt + (-(-dt).exp_m1()).ln()
        }
        Init::Fp8Scale { fan_in } => {
            // Codes from `fp8_code_table` have standard deviation E4M3_MAX/√6 (triangular).
            let code_std = E4M3_MAX / 6f32.sqrt();
            rng.uniform(0.5, 1.5) / ((fan_in as f32).sqrt() * code_std)
        }
        Init::Fp8Codes | Init::RopeTable | Init::CausalMask => unreachable!("handled by tensor_bytes"),
    }
}

/// Maps 16 random bits to an e4m3 code so that decoded values follow a triangular distribution
/// on [-448, 448]: what block quantisation of bell-shaped weights with amax at 448 looks like.
fn fp8_code_table() -> &'static [u8; 65536] {
    static TABLE: OnceLock<Box<[u8; 65536]>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut t = Box::new([0u8; 65536]);
        for (i, slot) in t.iter_mut().enumerate() {
            let u = (i as f32 + 0.5) / 65536.0;
            // Inverse CDF of the triangular distribution on [-1, 1].
            let x = if u < 0.5 { (2.0 * u).sqrt() - 1.0 } else { 1.0 - (2.0 * (1.0 - u)).sqrt() };
            let code = f32_to_e4m3(x * E4M3_MAX);
            debug_assert!(!e4m3_to_f32(code).is_nan());
            *slot = code;
        }
        t
    })
}

/// `freqs_cis` as the codec saved it: cos/sin of `pos · 10000^(-2i/64)` in bf16.
fn rope_table(spec: &TensorSpec, out: &mut [u8]) {
    let (positions, pairs) = (spec.shape[0], spec.shape[1]);
    let mut i = 0;
    for pos in 0..positions {
        for k in 0..pairs {
            let theta = 10000f32.powf(-2.0 * k as f32 / (2 * pairs) as f32);
            let angle = pos as f32 * theta;
            for v in [angle.cos(), angle.sin()] {
                out[i..i + 2].copy_from_slice(&bf16::from_f32(v).to_le_bytes());
                i += 2;
            }
        }
    }
}

/// A lower-triangular boolean mask (`torch.tril(torch.ones(n, n, dtype=bool))`).
fn causal_mask(spec: &TensorSpec, out: &mut [u8]) {
    let n = spec.shape[0];
    for r in 0..n {
        for c in 0..=r {
            out[r * n + c] = 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::weights::Accept;

    fn spec(init: Init, stored: Dtype, n: usize) -> TensorSpec {
        TensorSpec::new("t", &[n], Accept::SmallFloat, stored, init)
    }

    fn values(s: &TensorSpec) -> Vec<f32> {
        let bytes = tensor_bytes(s, 3);
        crate::checkpoint::TensorView { dtype: s.stored, shape: &s.shape, bytes: &bytes }.to_f32_vec().unwrap()
    }

    #[test]
    fn linear_has_the_intended_spread() {
        let v = values(&spec(Init::Linear { fan_in: 256 }, Dtype::BF16, 1 << 16));
        let std = (v.iter().map(|x| x * x).sum::<f32>() / v.len() as f32).sqrt();
        assert!((std - 1.0 / 16.0).abs() < 0.002, "std {std}");
    }

    #[test]
    fn fp8_codes_are_finite_and_span_the_range() {
        let s = TensorSpec::new("w", &[1 << 16], Accept::Fp8E4M3, Dtype::F8E4M3, Init::Fp8Codes);
        let v = values(&s);
        assert!(v.iter().all(|x| x.is_finite()));
        let amax = v.iter().fold(0f32, |m, x| m.max(x.abs()));
        assert!(amax > 400.0, "amax {amax}");
    }

    #[test]
    fn same_seed_same_bytes_across_chunks() {
        let s = spec(Init::Normalish { std: 1.0 }, Dtype::F32, CHUNK * 2 + 17);
        assert_eq!(tensor_bytes(&s, 9), tensor_bytes(&s, 9));
        assert_ne!(tensor_bytes(&s, 9), tensor_bytes(&s, 10));
    }

    #[test]
    fn residual_scale_shrinks_only_residual_branches_exactly() {
        let plain = TensorSpec::new("s", &[4096], Accept::Scale, Dtype::F32, Init::Fp8Scale { fan_in: 64 });
        let branch = plain.clone().residual_branch();
        let f32s = |b: Vec<u8>| -> Vec<f32> { bytemuck::cast_slice(&b).to_vec() };
        let full = f32s(tensor_bytes(&branch, 5));
        let scaled = f32s(tensor_bytes_scaled(&branch, 5, 0.125));
        // A power-of-two factor is exact in f32: the same draws, each times 1/8.
        assert!(full.iter().zip(&scaled).all(|(a, b)| a * 0.125 == *b));
        assert_eq!(tensor_bytes_scaled(&plain, 5, 0.125), tensor_bytes(&plain, 5));
        assert_eq!(tensor_bytes_scaled(&branch, 5, 1.0), tensor_bytes(&branch, 5));
    }

    #[test]
    fn dt_bias_is_inverse_softplus_of_small_steps() {
        let v = values(&spec(Init::DtBias, Dtype::F32, 1000));
        for b in v {
            let dt = (1.0 + b.exp()).ln();
            assert!((0.0009..0.11).contains(&dt), "softplus(dt_bias) = {dt}");
        }
    }
}
