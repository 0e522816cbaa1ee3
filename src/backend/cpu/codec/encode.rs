//! The codec encoder's own stages on the CPU (`codec.md` §5.3): strided causal convs, the
//! quantizer's downsample stages, and the quantizers' nearest-codeword search. Sums are f64,
//! rounded once per output, as in the decoder; the quantizers' element-wise steps follow the
//! reference's f32 order, so a code differs from the reference's only where two codewords are
//! within rounding of each other.

use super::ConvHistory;
use super::conv::window;
use super::math::{dot, linear, poisoned};
use super::upsample::convnext;
use crate::backend::codec_encode::{DownsampleStage, StridedConv, VqEncoder};
use crate::backend::cpu::{CpuWeight, Matrix};

/// Optional Snake, then `y[t] = b + Σ_tap W[:, tap, :] · win[t·s + tap]` over the input behind
/// `k − s` zero rows.
pub fn strided_conv(conv: &StridedConv<CpuWeight>, alpha: Option<&CpuWeight>, x: &Matrix) -> Matrix {
    let (s, k) = (conv.stride, conv.kernel);
    let (out, taps, inp) = (conv.weight.shape[0], conv.weight.shape[1], conv.weight.shape[2]);
    assert_eq!((taps, inp), (k, x.cols), "strided conv weight shape");
    assert!(k >= s && x.rows.is_multiple_of(s), "strided conv: {} rows for stride {s}, kernel {k}", x.rows);
    let padding = ConvHistory { rows: Matrix::zeros(k - s, x.cols) };
    let win = window(&padding, x, alpha);
    let w = &conv.weight.data;
    let mut y = poisoned(x.rows / s, out);
    for t in 0..y.rows {
        for (o, v) in y.row_mut(t).iter_mut().enumerate() {
            let mut acc = f64::from(conv.bias.data[o]);
            for tap in 0..k {
                acc += dot(&w[(o * k + tap) * inp..(o * k + tap + 1) * inp], win.row(t * s + tap));
            }
            *v = acc as f32;
        }
    }
    y
}

/// The strided conv (no Snake), then ConvNeXt from zero history.
pub fn downsample_stage(w: &DownsampleStage<CpuWeight>, x: &Matrix) -> Matrix {
    let down = strided_conv(&w.conv, None, x);
    let mut history = ConvHistory { rows: Matrix::zeros(w.convnext.dw_weight.shape[0] - 1, down.cols) };
    convnext(&w.convnext, &down, &mut history)
}

/// Each row's code per quantizer, the residual carried from one quantizer to the next.
pub fn quantize(quantizers: &[&VqEncoder<CpuWeight>], z: &Matrix) -> Vec<u32> {
    let n = quantizers.len();
    let mut codes = vec![u32::MAX; z.rows * n];
    let mut residual = z.clone();
    for (i, q) in quantizers.iter().enumerate() {
        let e = linear(&residual, &q.in_proj, Some(&q.in_bias));
        let mut straight = poisoned(e.rows, e.cols);
        for t in 0..e.rows {
            let code = nearest(&q.codebook, e.row(t));
            codes[t * n + i] = code as u32;
            // `e + (c − e)`: the straight-through estimate, not exactly `c` in f32.
            for ((s, &ev), &cv) in straight.row_mut(t).iter_mut().zip(e.row(t)).zip(q.codebook.row(code)) {
                *s = ev + (cv - ev);
            }
        }
        let quantized = linear(&straight, &q.out_proj, Some(&q.out_bias));
        for (r, &v) in residual.data.iter_mut().zip(&quantized.data) {
            *r -= v;
        }
    }
    codes
}

/// The codeword of greatest cosine similarity with `e` (the first of equals), in f64.
fn nearest(codebook: &CpuWeight, e: &[f32]) -> usize {
    let (size, dim) = (codebook.shape[0], codebook.shape[1]);
    assert_eq!(dim, e.len(), "codebook width");
    let mut best = (0, f64::NEG_INFINITY);
    for j in 0..size {
        let c = codebook.row(j);
        let norm = dot(c, c).sqrt();
        let similarity = dot(c, e) / norm;
        if similarity > best.1 {
            best = (j, similarity);
        }
    }
    best.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weight(shape: &[usize], data: Vec<f32>) -> CpuWeight {
        CpuWeight { shape: shape.to_vec(), data }
    }

    /// Kernel 4, stride 2 over 4 rows: two outputs, the first reading two zero rows.
    #[test]
    fn strided_conv_pads_k_minus_s_zeros_on_the_left() {
        let conv = StridedConv {
            weight: weight(&[1, 4, 1], vec![1.0, 10.0, 100.0, 1000.0]),
            bias: weight(&[1], vec![0.5]),
            kernel: 4,
            stride: 2,
        };
        let x = Matrix::from_vec(4, 1, vec![1.0, 2.0, 3.0, 4.0]);
        let y = strided_conv(&conv, None, &x);
        assert_eq!(y.data, vec![0.5 + 100.0 + 2000.0, 0.5 + 1.0 + 20.0 + 300.0 + 4000.0]);
    }

    /// The residual after a quantizer is what it left; a row equal to a codeword's direction
    /// picks that codeword whatever its length.
    #[test]
    fn quantize_takes_the_cosine_nearest_codeword_and_carries_the_residual() {
        let identity = |n: usize| weight(&[n, n], (0..n * n).map(|i| f32::from(i % (n + 1) == 0)).collect());
        let zeros = |n: usize| weight(&[n], vec![0.0; n]);
        let book = weight(&[3, 2], vec![1.0, 0.0, 0.0, 1.0, -1.0, 0.0]);
        let q = VqEncoder {
            in_proj: identity(2),
            in_bias: zeros(2),
            codebook: book,
            out_proj: identity(2),
            out_bias: zeros(2),
        };
        let z = Matrix::from_vec(2, 2, vec![0.0, 5.0, -3.0, 0.5]);
        let codes = quantize(&[&q, &q], &z);
        // Row 0: (0, 5) → codeword 1, residual (0, 5) − (0, 1) = (0, 4) → codeword 1 again.
        // Row 1: (−3, 0.5) → codeword 2, residual (−2, 0.5) → codeword 2.
        assert_eq!(codes, vec![1, 1, 2, 2]);
    }
}
