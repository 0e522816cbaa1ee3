//! Dense building blocks of the CPU backbone (`backbone.md` §2–5): `x · Wᵀ` with f64 accumulation,
//! the scalar activations, and NaN-poisoned output buffers so an unwritten element never passes.

pub use crate::backend::cpu::scalar::{dot, sigmoid, silu};
use crate::backend::cpu::{CpuWeight, Matrix};

/// A `[rows, cols]` matrix filled with NaN: every op writes each element, and a missed one shows.
pub fn poisoned(rows: usize, cols: usize) -> Matrix {
    Matrix::from_vec(rows, cols, vec![f32::NAN; rows * cols])
}

/// `x · Wᵀ` for a linear weight `[out, in]`: row `r` of the result is `W x_r`.
pub fn linear(x: &Matrix, w: &CpuWeight) -> Matrix {
    let (out, inp) = (w.shape[0], w.shape[1..].iter().product::<usize>());
    assert_eq!(x.cols, inp, "linear: input width {} vs weight {:?}", x.cols, w.shape);
    let mut y = poisoned(x.rows, out);
    for r in 0..x.rows {
        let xr = x.row(r);
        for (o, slot) in y.row_mut(r).iter_mut().enumerate() {
            *slot = dot(xr, w.row(o)) as f32;
        }
    }
    y
}

/// `W x` for one row, in f64 (kept unrounded when the next step is also ours).
pub fn linear_row64(x: &[f32], w: &CpuWeight) -> Vec<f64> {
    (0..w.shape[0]).map(|o| dot(x, w.row(o))).collect()
}

/// `softplus` with β = 1 and PyTorch's threshold 20 (linear above it).
pub fn softplus(x: f64) -> f64 {
    if x > 20.0 { x } else { x.exp().ln_1p() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linear_is_x_times_w_transposed() {
        let x = Matrix::from_vec(2, 3, vec![1.0, 2.0, 3.0, -1.0, 0.5, 0.0]);
        let w = CpuWeight { shape: vec![2, 3], data: vec![1.0, 0.0, 1.0, 0.0, 2.0, -1.0] };
        let y = linear(&x, &w);
        assert_eq!(y.data, vec![4.0, 1.0, -1.0, 1.0]);
    }

    #[test]
    fn scalar_activations() {
        assert_eq!(sigmoid(0.0), 0.5);
        assert!((silu(1.0) - 0.731_058_578_630_004_9).abs() < 1e-15);
        assert_eq!(softplus(25.0), 25.0);
        assert!((softplus(0.0) - std::f64::consts::LN_2).abs() < 1e-15);
        assert!((softplus(-30.0) - (-30f64).exp()).abs() < 1e-25);
    }
}
