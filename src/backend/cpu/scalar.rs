//! Scalar arithmetic the CPU backbone and tower share: an f64-accumulated dot product and the
//! gate functions, in one place so both parts round identically.

/// `Σ a·b` accumulated in f64 in index order (the references accumulate fp32 GEMMs; f64 keeps
/// our own rounding far below the tolerance).
pub fn dot(a: &[f32], b: &[f32]) -> f64 {
    debug_assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum()
}

pub fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

pub fn silu(x: f64) -> f64 {
    x * sigmoid(x)
}
