//! The backbone's three normalisations (`backbone.md` §3.3, §3.5, §4): the zero-centred RMSNorm
//! `x·rsqrt(mean(x²)+eps)·(1+w)`, the GDN output's gated RMSNorm with a plain gain
//! `x·rsqrt(mean(x²)+eps)·w·SiLU(z)`, and the L2 norm of GDN q/k with eps inside the sqrt.

use super::linear::{poisoned, silu};
use crate::backend::cpu::{CpuWeight, Matrix};

/// `1/sqrt(mean(x²) + eps)` in f64.
fn inv_rms(x: impl Iterator<Item = f64> + Clone, n: usize, eps: f64) -> f64 {
    let mean_sq = x.map(|v| v * v).sum::<f64>() / n as f64;
    1.0 / (mean_sq + eps).sqrt()
}

/// Zero-centred RMSNorm of one vector into `out` (`1 + w`: the stored gain is centred on 0).
pub fn rms_norm_into(x: &[f32], w: &[f32], eps: f64, out: &mut [f32]) {
    assert_eq!(x.len(), w.len(), "rms_norm: width {} vs gain {}", x.len(), w.len());
    let r = inv_rms(x.iter().map(|&v| v as f64), x.len(), eps);
    for ((o, &v), &g) in out.iter_mut().zip(x).zip(w) {
        *o = (v as f64 * r * (1.0 + g as f64)) as f32;
    }
}

/// Zero-centred RMSNorm of every row.
pub fn rms_norm(x: &Matrix, w: &CpuWeight, eps: f64) -> Matrix {
    let mut y = poisoned(x.rows, x.cols);
    for r in 0..x.rows {
        rms_norm_into(x.row(r), &w.data, eps, y.row_mut(r));
    }
    y
}

/// Gated RMSNorm of one GDN value head (norm before gate, plain gain `w`).
pub fn gated_rms_norm_into(o: &[f64], z: &[f32], w: &[f32], eps: f64, out: &mut [f32]) {
    let r = inv_rms(o.iter().copied(), o.len(), eps);
    for (((dst, &v), &zi), &g) in out.iter_mut().zip(o).zip(z).zip(w) {
        *dst = (v * r * g as f64 * silu(zi as f64)) as f32;
    }
}

/// `x / sqrt(Σx² + eps)` in place: the eps is added to the sum of squares, not to the norm.
pub fn l2_normalise(x: &mut [f64], eps: f64) {
    let inv = 1.0 / (x.iter().map(|v| v * v).sum::<f64>() + eps).sqrt();
    x.iter_mut().for_each(|v| *v *= inv);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_centred_gain_is_one_plus_w() {
        // mean(x²) = (9 + 16)/2 = 12.5; with eps 0 the normalised vector is x/√12.5.
        let mut out = [0.0f32; 2];
        rms_norm_into(&[3.0, -4.0], &[0.0, 0.5], 0.0, &mut out);
        let s = 12.5f64.sqrt();
        assert!((out[0] as f64 - 3.0 / s).abs() < 1e-7);
        assert!((out[1] as f64 - (-4.0 / s * 1.5)).abs() < 1e-7);
    }

    #[test]
    fn gated_norm_uses_plain_gain_and_silu_gate() {
        let mut out = [0.0f32; 2];
        gated_rms_norm_into(&[1.0, -1.0], &[0.0, 2.0], &[2.0, 3.0], 0.0, &mut out);
        // rms = 1; out = x · w · silu(z): silu(0) = 0, silu(2) = 2·σ(2).
        assert_eq!(out[0], 0.0);
        let want = -3.0 * 2.0 / (1.0 + (-2.0f64).exp());
        assert!((out[1] as f64 - want).abs() < 1e-6);
    }

    #[test]
    fn l2_eps_inside_the_sqrt() {
        let mut x = [3.0, 4.0];
        l2_normalise(&mut x, 11.0);
        assert_eq!(x, [0.5, 4.0 / 6.0]);
    }
}
