//! Counter-based randomness for sampling (`model.md` §8.2 step 7): Philox4x32-10 keyed by
//! (request seed, frame index, draw stream, candidate index), so any draw can be recomputed in
//! isolation, in any order, on the CPU or on a GPU, bit for bit.
//!
//! The layout is S1's Triton sampler's (`sampling_selection.py` `exponential_noise`) with its
//! batch-row word fixed to 0: S1 keys by batch row and a global step, which makes a request's
//! draws depend on its batch neighbours; we key by the request's own seed and frame index.
//!
//! ```text
//! key     = [seed_lo, seed_hi ^ frame_hi]
//! counter = [candidate, 0, stream, frame_lo]
//! bits    = philox4x32_10(counter, key)[0]
//! u       = ((bits >> 9) + 0.5) * 2^-23          in (0, 1), exact in f32
//! E       = -ln(u)                                an Exp(1) variate
//! ```

/// Philox multipliers and Weyl key increments (Salmon et al. 2011, Random123).
const M0: u32 = 0xD251_1F53;
const M1: u32 = 0xCD9E_8D57;
const W0: u32 = 0x9E37_79B9;
const W1: u32 = 0xBB67_AE85;

/// Mantissa bits of a uniform: 23, so `(k + 0.5) · 2^-23` is exact in f32 and never 0 or 1.
const UNIFORM_BITS: u32 = 23;

/// Draw stream of the main token's first draw (request temperature, top-k, top-p).
pub const MAIN_STREAM: u32 = 0;
/// Draw stream of the main token's RAS draw (fixed T 1.0, top-k 30, top-p 0.95).
pub const RAS_STREAM: u32 = 1;
/// Draw stream of codebook head 0 (it samples c1); head r uses `FIRST_HEAD_STREAM + r`.
pub const FIRST_HEAD_STREAM: u32 = 2;

/// Philox4x32 with 10 rounds: the Random123 bijection of a 128-bit counter under a 64-bit key.
pub fn philox4x32_10(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let [mut c0, mut c1, mut c2, mut c3] = counter;
    let [mut k0, mut k1] = key;
    for round in 0..10 {
        if round > 0 {
            k0 = k0.wrapping_add(W0);
            k1 = k1.wrapping_add(W1);
        }
        let p0 = u64::from(M0) * u64::from(c0);
        let p1 = u64::from(M1) * u64::from(c2);
        (c0, c1, c2, c3) = (((p1 >> 32) as u32) ^ c1 ^ k0, p1 as u32, ((p0 >> 32) as u32) ^ c3 ^ k1, p0 as u32);
    }
    [c0, c1, c2, c3]
}

/// One draw's random stream: every candidate of the draw gets its own uniform from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DrawKey {
    /// The request's seed.
    pub seed: u64,
    /// Index of the frame being sampled, counted from 0 at the first generated frame.
    pub frame: u64,
    /// `MAIN_STREAM`, `RAS_STREAM`, or `FIRST_HEAD_STREAM + r` for codebook head r.
    pub stream: u32,
}

impl DrawKey {
    pub fn new(seed: u64, frame: u64, stream: u32) -> DrawKey {
        DrawKey { seed, frame, stream }
    }

    /// Key of head `r` (0-based, sampling code `c_{r+1}`).
    pub fn head(seed: u64, frame: u64, r: usize) -> DrawKey {
        DrawKey::new(seed, frame, FIRST_HEAD_STREAM + u32::try_from(r).expect("head index fits u32"))
    }

    /// The 32 random bits of `candidate` (its index in the logits row).
    pub fn bits(&self, candidate: u32) -> u32 {
        let key = [self.seed as u32, ((self.seed >> 32) as u32) ^ ((self.frame >> 32) as u32)];
        philox4x32_10([candidate, 0, self.stream, self.frame as u32], key)[0]
    }

    /// The uniform of `candidate`, in (0, 1).
    pub fn uniform(&self, candidate: u32) -> f32 {
        ((self.bits(candidate) >> (32 - UNIFORM_BITS)) as f32 + 0.5) * (1.0 / (1u32 << UNIFORM_BITS) as f32)
    }

    /// The Exp(1) variate of `candidate`: `-ln(u)`, in f64 (finite and > 0 since u is in (0, 1)).
    pub fn exponential(&self, candidate: u32) -> f64 {
        -f64::from(self.uniform(candidate)).ln()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_range_is_open() {
        // The extreme bit patterns map strictly inside (0, 1).
        let lo = (0.5f32) * (1.0 / (1u32 << 23) as f32);
        let hi = (((1u32 << 23) - 1) as f32 + 0.5) * (1.0 / (1u32 << 23) as f32);
        assert!(lo > 0.0 && hi < 1.0);
        let k = DrawKey::new(1, 2, 3);
        for c in 0..1000 {
            let u = k.uniform(c);
            assert!(u > 0.0 && u < 1.0);
            assert!(k.exponential(c).is_finite() && k.exponential(c) > 0.0);
        }
    }
}
