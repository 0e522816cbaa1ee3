//! The post_module's rotary table (`codec.md` §1.3): `θ_i = 1 / 10000^(2i/64)` and
//! `angle = pos · θ_i` in f32, `(cos, sin)` in f32 then ROUNDED TO BF16 — the reference's
//! `precompute_freqs_cis(327680, 64, 10000)` buffer. Positions are absolute frame indices from
//! the start of the decode; the rounding makes attention depend on them, not only on offsets.

/// `rope_base` of `modded_dac_vq.yaml`.
pub const ROPE_BASE: f64 = 10_000.0;
/// Positions the reference precomputes; a longer decode indexes past its table.
pub const ROPE_POSITIONS: usize = 327_680;

/// `1 / base^(2i/d)` for `i < d/2`, as f32 (`2i/d` is exact; the power is rounded once).
pub fn inverse_frequencies(head_dim: usize) -> Vec<f32> {
    (0..head_dim / 2)
        .map(|i| {
            let exponent = (2 * i) as f32 / head_dim as f32;
            let power = ROPE_BASE.powf(f64::from(exponent)) as f32;
            1.0 / power
        })
        .collect()
}

/// `(cos, sin)` pairs `[n, head_dim/2, 2]` for positions `start..start + n`, each value
/// bf16-representable.
pub fn rope_rows(inv_freq: &[f32], start: usize, n: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(n * inv_freq.len() * 2);
    for pos in start..start + n {
        for &f in inv_freq {
            let angle = f64::from(pos as f32 * f);
            for v in [angle.cos(), angle.sin()] {
                out.push(half::bf16::from_f32(v as f32).to_f32());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn position_zero_is_identity_and_values_are_bf16() {
        let inv = inverse_frequencies(64);
        assert_eq!(inv[0], 1.0);
        let rows = rope_rows(&inv, 0, 3);
        assert!(rows[..64].chunks_exact(2).all(|cs| cs == [1.0, 0.0]));
        assert!(rows.iter().all(|&v| half::bf16::from_f32(v).to_f32() == v));
        // pos 1, θ₀ = 1: cos 1 = 0.5403… → bf16 0.5390625.
        assert_eq!(rows[64], 0.539_062_5);
    }
}
