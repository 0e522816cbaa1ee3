//! The quantizer's upsample stages on the CPU (`codec.md` §1.4): a transposed conv with
//! kernel = stride = 2 (no temporal context), then a ConvNeXt block whose causal depthwise conv
//! carries its last inputs between calls. The encoder's downsample stages share the ConvNeXt.

use super::ConvHistory;
use super::conv::{advance, window};
use super::math::{dot, gelu, linear, poisoned};
use crate::backend::codec::{ConvNext, UpsampleStage};
use crate::backend::cpu::{CpuWeight, Matrix};

/// LayerNorm eps of the ConvNeXt block.
const LAYER_NORM_EPS: f64 = 1e-6;

/// Output `2i + j` = `b + W[j] · x[i]`.
fn transposed_conv_k2(weight: &CpuWeight, bias: &CpuWeight, x: &Matrix) -> Matrix {
    let (k, out, inp) = (weight.shape[0], weight.shape[1], weight.shape[2]);
    assert_eq!((k, inp), (2, x.cols), "upsample conv weight shape");
    let mut y = poisoned(2 * x.rows, out);
    for i in 0..x.rows {
        for j in 0..2 {
            for (o, v) in y.row_mut(2 * i + j).iter_mut().enumerate() {
                let taps = &weight.data[(j * out + o) * inp..(j * out + o + 1) * inp];
                *v = (f64::from(bias.data[o]) + dot(taps, x.row(i))) as f32;
            }
        }
    }
    y
}

/// Depthwise causal conv: `y[t][c] = b[c] + Σ_tap W[tap][c] · win[t + tap][c]`.
fn depthwise(weight: &CpuWeight, bias: &CpuWeight, win: &Matrix) -> Matrix {
    let (k, c) = (weight.shape[0], weight.shape[1]);
    let n = win.rows - (k - 1);
    let mut y = poisoned(n, c);
    for t in 0..n {
        for (ch, v) in y.row_mut(t).iter_mut().enumerate() {
            let mut acc = f64::from(bias.data[ch]);
            for tap in 0..k {
                acc += f64::from(weight.data[tap * c + ch]) * f64::from(win.row(t + tap)[ch]);
            }
            *v = acc as f32;
        }
    }
    y
}

/// LayerNorm over each row (biased variance).
fn layer_norm(weight: &CpuWeight, bias: &CpuWeight, x: &Matrix) -> Matrix {
    let mut y = poisoned(x.rows, x.cols);
    let n = x.cols as f64;
    for t in 0..x.rows {
        let row = x.row(t);
        let mean = row.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
        let var = row.iter().map(|&v| (f64::from(v) - mean).powi(2)).sum::<f64>() / n;
        let r = 1.0 / (var + LAYER_NORM_EPS).sqrt();
        for (((o, &v), &g), &b) in y.row_mut(t).iter_mut().zip(row).zip(&weight.data).zip(&bias.data) {
            *o = ((f64::from(v) - mean) * r * f64::from(g) + f64::from(b)) as f32;
        }
    }
    y
}

pub fn upsample_stage(w: &UpsampleStage<CpuWeight>, x: &Matrix, dw_history: &mut ConvHistory) -> Matrix {
    let up = transposed_conv_k2(&w.conv_weight, &w.conv_bias, x);
    convnext(&w.convnext, &up, dw_history)
}

/// A ConvNeXt block over new rows `x`, its depthwise conv continuing `dw_history`.
pub fn convnext(w: &ConvNext<CpuWeight>, x: &Matrix, dw_history: &mut ConvHistory) -> Matrix {
    assert_eq!(dw_history.rows.rows, w.dw_weight.shape[0] - 1, "depthwise conv history rows");
    let win = window(dw_history, x, None);
    advance(dw_history, &win);
    let normed = layer_norm(&w.norm_weight, &w.norm_bias, &depthwise(&w.dw_weight, &w.dw_bias, &win));
    let mut hidden = linear(&normed, &w.pw1_weight, Some(&w.pw1_bias));
    for v in hidden.data.iter_mut() {
        *v = gelu(*v);
    }
    let mut y = linear(&hidden, &w.pw2_weight, Some(&w.pw2_bias));
    for t in 0..y.rows {
        for ((v, &g), &r) in y.row_mut(t).iter_mut().zip(&w.gamma.data).zip(x.row(t)) {
            *v = r + g * *v;
        }
    }
    y
}
