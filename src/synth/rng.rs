//! A small, fast, deterministic random stream for checkpoint synthesis. Every tensor (and every
//! 1 Mi-element chunk of it) gets its own stream keyed by (seed, tensor name, chunk), so the
//! bytes written do not depend on order or thread count.

/// xoshiro256** seeded through SplitMix64.
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    pub fn new(seed: u64) -> Rng {
        let mut x = seed;
        let mut next = || {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        Rng { s: [next(), next(), next(), next()] }
    }

    /// The stream for one chunk of one named tensor.
    pub fn for_tensor(seed: u64, name: &str, chunk: u64) -> Rng {
        Rng::new(seed ^ fnv1a(name.as_bytes()).rotate_left(17) ^ chunk.wrapping_mul(0xD1B5_4A32_D192_ED03))
    }

    pub fn next_u64(&mut self) -> u64 {
        let result = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        result
    }

    /// Uniform in [0, 1) with 24 bits of resolution.
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 * (1.0 / (1u64 << 24) as f32)
    }

    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * self.unit()
    }
}

/// FNV-1a, a stable hash (std's hasher may change between releases).
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xCBF2_9CE4_8422_2325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01B3))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_deterministic_and_distinct() {
        let a: Vec<u64> = (0..4)
            .map({
                let mut r = Rng::for_tensor(7, "x", 0);
                move |_| r.next_u64()
            })
            .collect();
        let mut r = Rng::for_tensor(7, "x", 0);
        assert_eq!(a, (0..4).map(|_| r.next_u64()).collect::<Vec<_>>());
        let mut other = Rng::for_tensor(7, "y", 0);
        assert_ne!(a[0], other.next_u64());
        let mut chunk = Rng::for_tensor(7, "x", 1);
        assert_ne!(a[0], chunk.next_u64());
    }

    #[test]
    fn unit_stays_in_range_with_mean_near_half() {
        let mut r = Rng::new(1);
        let xs: Vec<f32> = (0..100_000).map(|_| r.unit()).collect();
        assert!(xs.iter().all(|&x| (0.0..1.0).contains(&x)));
        let mean = xs.iter().sum::<f32>() / xs.len() as f32;
        assert!((mean - 0.5).abs() < 0.01, "mean {mean}");
    }
}
