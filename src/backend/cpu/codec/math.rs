//! Row kernels shared by the CPU codec stages (`codec.md` §1): f64-accumulated dot products and
//! linear maps, and the element-wise activations, each computed the same way for every row so
//! that results never depend on how a stream was chunked.

use crate::backend::cpu::{CpuWeight, Matrix};

/// A matrix of `rows × cols` NaNs: scratch that every element is written into before it is
/// read, so a stale or missing write shows up as NaN in the output.
pub fn poisoned(rows: usize, cols: usize) -> Matrix {
    Matrix::from_vec(rows, cols, vec![f32::NAN; rows * cols])
}

/// `Σ a[i]·b[i]` with exact f32 products and f64 sums, in a fixed order (four interleaved
/// partial sums, then the tail) that depends only on the length.
pub fn dot(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len(), "dot lengths");
    let mut acc = [0.0f64; 4];
    let (ca, cb) = (a.chunks_exact(4), b.chunks_exact(4));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for j in 0..4 {
            acc[j] += f64::from(x[j]) * f64::from(y[j]);
        }
    }
    let tail: f64 = ra.iter().zip(rb).map(|(x, y)| f64::from(*x) * f64::from(*y)).sum();
    (acc[0] + acc[1]) + (acc[2] + acc[3]) + tail
}

/// `x · Wᵀ (+ b)` for `W` `[out, in]`: each output rounded once to f32 from an f64 sum.
pub fn linear(x: &Matrix, w: &CpuWeight, bias: Option<&CpuWeight>) -> Matrix {
    let (out, inp) = (w.shape[0], w.shape[1]);
    assert_eq!(x.cols, inp, "linear input width");
    let mut y = poisoned(x.rows, out);
    for t in 0..x.rows {
        let row = x.row(t);
        for (o, v) in y.row_mut(t).iter_mut().enumerate() {
            let b = bias.map_or(0.0, |b| f64::from(b.data[o]));
            *v = (b + dot(w.row(o), row)) as f32;
        }
    }
    y
}

/// Snake (`dac.nn.layers.snake`): `x + (α + 1e-9)⁻¹ · sin²(α·x)`, each step in f32 as the
/// reference computes it.
pub fn snake(x: &[f32], alpha: &[f32], out: &mut [f32]) {
    for ((o, &v), &a) in out.iter_mut().zip(x).zip(alpha) {
        let s = (a * v).sin();
        *o = v + (1.0 / (a + 1e-9)) * (s * s);
    }
}

/// SiLU `x · σ(x)`.
pub fn silu(x: f32) -> f32 {
    let x = f64::from(x);
    (x / (1.0 + (-x).exp())) as f32
}

/// GELU with the exact erf (`nn.GELU()` default).
pub fn gelu(x: f32) -> f32 {
    let x = f64::from(x);
    (0.5 * x * (1.0 + libm::erf(x * std::f64::consts::FRAC_1_SQRT_2))) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_matches_a_plain_f64_sum() {
        let a: Vec<f32> = (0..11).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..11).map(|i| (i as f32 * 1.3).cos()).collect();
        let plain: f64 = a.iter().zip(&b).map(|(x, y)| f64::from(*x) * f64::from(*y)).sum();
        assert!((dot(&a, &b) - plain).abs() < 1e-12);
    }

    #[test]
    fn activations_at_known_points() {
        assert_eq!(gelu(0.0), 0.0);
        assert!((gelu(1.0) - 0.841_344_7).abs() < 1e-7);
        assert!((silu(1.0) - 0.731_058_6).abs() < 1e-7);
        let mut out = [0.0f32; 2];
        snake(&[0.0, 1.0], &[1.0, 2.0], &mut out);
        assert_eq!(out[0], 0.0);
        assert!((out[1] - (1.0 + 0.5 * 2.0f32.sin().powi(2))).abs() < 1e-6);
    }
}
