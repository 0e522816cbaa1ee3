//! The DAC decoder's convolutions on the CPU (`codec.md` §1.5, §2): causal convs, Snake +
//! causal transposed conv, residual units. Each call builds its input window — the carried
//! history rows, then the new rows — and computes every output from that window by one fixed
//! loop, so outputs never depend on where a stream was cut.

use super::ConvHistory;
use super::math::{dot, poisoned, snake};
use crate::backend::codec::{CausalConv, CausalConvTranspose, DecoderUpsample, ResidualUnitParams};
use crate::backend::cpu::{CpuWeight, Matrix};

/// History rows, then the new rows of `x` (through Snake when `alpha` is given), in NaN-poisoned
/// scratch.
pub fn window(history: &ConvHistory, x: &Matrix, alpha: Option<&CpuWeight>) -> Matrix {
    let (h, c) = (history.rows.rows, x.cols);
    assert_eq!(history.rows.cols, c, "conv history width");
    let mut win = poisoned(h + x.rows, c);
    win.data[..h * c].copy_from_slice(&history.rows.data);
    for t in 0..x.rows {
        match alpha {
            Some(a) => snake(x.row(t), &a.data, win.row_mut(h + t)),
            None => win.row_mut(h + t).copy_from_slice(x.row(t)),
        }
    }
    win
}

/// Keeps the window's last rows as the next call's history.
pub fn advance(history: &mut ConvHistory, win: &Matrix) {
    let start = (win.rows - history.rows.rows) * win.cols;
    history.rows.data.copy_from_slice(&win.data[start..]);
}

/// `y[t] = b + Σ_tap W[:, tap, :] · win[t + tap·d]` for the window's last `rows − (k−1)·d` rows.
pub fn conv_window(conv: &CausalConv<CpuWeight>, win: &Matrix) -> Matrix {
    let (out, k, inp) = (conv.weight.shape[0], conv.weight.shape[1], conv.weight.shape[2]);
    assert_eq!((k, inp), (conv.kernel, win.cols), "causal conv weight shape");
    let n = win.rows - conv.history();
    let w = &conv.weight.data;
    let mut y = poisoned(n, out);
    for t in 0..n {
        for (o, v) in y.row_mut(t).iter_mut().enumerate() {
            let mut acc = f64::from(conv.bias.data[o]);
            for tap in 0..k {
                let taps = &w[(o * k + tap) * inp..(o * k + tap + 1) * inp];
                acc += dot(taps, win.row(t + tap * conv.dilation));
            }
            *v = acc as f32;
        }
    }
    y
}

/// Optional Snake, then a causal conv continuing `history`.
pub fn causal_conv(
    conv: &CausalConv<CpuWeight>,
    alpha: Option<&CpuWeight>,
    x: &Matrix,
    history: &mut ConvHistory,
) -> Matrix {
    assert_eq!(history.rows.rows, conv.history(), "conv history rows");
    let win = window(history, x, alpha);
    advance(history, &win);
    conv_window(conv, &win)
}

/// Output `i·s + j` = `b + W[j]·win[i+1] + W[j+s]·win[i]`, `win` = [previous row; new rows].
pub fn transposed_conv_window(conv: &CausalConvTranspose<CpuWeight>, win: &Matrix) -> Matrix {
    let s = conv.stride;
    let (k, out, inp) = (conv.weight.shape[0], conv.weight.shape[1], conv.weight.shape[2]);
    assert_eq!((k, inp), (2 * s, win.cols), "transposed conv weight shape");
    let w = |tap: usize, o: usize| &conv.weight.data[(tap * out + o) * inp..(tap * out + o + 1) * inp];
    let n = win.rows - 1;
    let mut y = poisoned(n * s, out);
    for i in 0..n {
        for j in 0..s {
            for (o, v) in y.row_mut(i * s + j).iter_mut().enumerate() {
                let acc = f64::from(conv.bias.data[o]) + dot(w(j, o), win.row(i + 1)) + dot(w(j + s, o), win.row(i));
                *v = acc as f32;
            }
        }
    }
    y
}

/// Snake, then the causal transposed conv; `history` is the previous input row (after Snake).
pub fn decoder_upsample(w: &DecoderUpsample<CpuWeight>, x: &Matrix, history: &mut ConvHistory) -> Matrix {
    assert_eq!(history.rows.rows, 1, "transposed conv history rows");
    let win = window(history, x, Some(&w.snake));
    advance(history, &win);
    transposed_conv_window(&w.conv, &win)
}

/// `x + conv2(snake2(conv1(snake1(x))))`.
pub fn residual_unit(w: &ResidualUnitParams<CpuWeight>, x: &Matrix, history: &mut ConvHistory) -> Matrix {
    let h = causal_conv(&w.conv1, Some(&w.snake1), x, history);
    let mut empty = ConvHistory { rows: Matrix::zeros(0, h.cols) };
    let mut y = causal_conv(&w.conv2, Some(&w.snake2), &h, &mut empty);
    for (v, &r) in y.data.iter_mut().zip(&x.data) {
        *v += r;
    }
    y
}
