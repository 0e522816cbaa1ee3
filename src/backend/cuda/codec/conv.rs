//! The codec's convolutions on the GPU (`codec.md` §1.4–1.5): the quantizer upsample stages
//! (k = s = 2 transposed conv, ConvNeXt), causal convs with optional Snake, the decoder blocks'
//! Snake + causal transposed conv, residual units, tanh. Each stateful call builds its input
//! window — the carried history rows (after Snake), then the new rows — keeps the window's last
//! rows as the next history, and runs the GEMM over the window: an output's inputs are the same
//! values however the stream was cut. Several streams go in one call: their windows are stacked
//! and one GEMM runs over all of them (the decode batch's ready groups, `CodecOps::*_rows`).

use half::f16;

use super::super::Cuda;
use super::super::launch::Dims;
use super::super::tensor::{Elem, GpuMatrix, GpuWeight};
use super::GpuConvHistory;
use super::gemm::{Epilogue, Gemm, Residual, Taps, check_f16, gemm};
use crate::backend::codec::{CausalConv, DecoderUpsample, ResidualUnitParams, UpsampleStage};

const THREADS: u32 = 256;

/// Several streams' windows stacked in one matrix: stream `s`'s segment starts at row
/// `starts[s]` and holds its history rows, then its new rows (after Snake). A conv over the whole
/// matrix gives stream `s`'s outputs at rows `starts[s]..starts[s] + rows[s]`: every output reads
/// only its own segment, so it is the output the stream's own window gives (the rows between
/// segments are computed and dropped).
struct Windows {
    win: GpuMatrix,
    starts: Vec<usize>,
}

/// The windows of the streams whose new rows `x` stacks (`rows[s]` each), each continuing its
/// `history`, which then holds its window's last rows.
fn windows(
    cuda: &Cuda,
    histories: &mut [&mut GpuConvHistory],
    x: &GpuMatrix,
    rows: &[usize],
    alpha: Option<&GpuWeight>,
) -> Windows {
    assert_eq!(histories.len(), rows.len(), "one history per stream");
    assert_eq!(rows.iter().sum::<usize>(), x.rows, "the streams' rows make up x");
    assert_eq!(x.elem, Elem::F16, "codec activations are f16");
    let c = x.cols;
    if let Some(a) = alpha {
        check_f16(a, c, "Snake α");
    }
    let h = histories.first().map_or(0, |hist| hist.rows.rows);
    let win = cuda.matrix_f16(rows.iter().map(|n| h + n).sum(), c);
    let (mut starts, mut at, mut from) = (Vec::with_capacity(rows.len()), 0, 0);
    for (history, &n) in histories.iter_mut().zip(rows) {
        assert_eq!((history.rows.rows, history.rows.cols), (h, c), "conv history shape");
        let new_rows = if n > 0 { x.row_ptr(from) } else { 0 };
        if h + n > 0 {
            fill_window(cuda, win.row_ptr(at), history, new_rows, n, c, alpha);
        }
        starts.push(at);
        (at, from) = (at + h + n, from + n);
    }
    Windows { win, starts }
}

/// Writes `[history; snake?(x)]` (`n` new rows at `x`) at `dst`, then keeps the window's last
/// rows as the history.
fn fill_window(
    cuda: &Cuda,
    dst: u64,
    history: &mut GpuConvHistory,
    x: u64,
    n: usize,
    c: usize,
    alpha: Option<&GpuWeight>,
) {
    let h = history.rows.rows;
    if n == 0 {
        cuda.copy_device_to_device(dst, history.rows.ptr(), h * c * 2);
        return;
    }
    let args = [
        history.rows.ptr().into(),
        x.into(),
        alpha.map_or(0, |a| a.ptr).into(),
        dst.into(),
        h.into(),
        n.into(),
        c.into(),
    ];
    let len = (h + n) * c;
    cuda.kernels.codec.window.launch(cuda.stream(), Dims::linear(len.div_ceil(THREADS as usize), THREADS), &args);
    if h > 0 {
        cuda.copy_device_to_device(history.rows.ptr(), dst + (n * c * 2) as u64, h * c * 2);
    }
}

/// Each stream's output rows of a conv over [`Windows`] (`starts[s]`, `rows[s]`), stacked. One
/// stream's output is already exactly its rows and is returned as it is.
fn gather(cuda: &Cuda, y: GpuMatrix, starts: &[usize], rows: &[usize]) -> GpuMatrix {
    if starts == [0] && y.rows == rows[0] {
        return y;
    }
    let out = cuda.matrix_f16(rows.iter().sum(), y.cols);
    let mut at = 0;
    for (&start, &n) in starts.iter().zip(rows).filter(|(_, n)| **n > 0) {
        cuda.copy_device_to_device(out.row_ptr(at), y.row_ptr(start), n * y.cols * 2);
        at += n;
    }
    out
}

/// A causal conv over `win` (history + new rows), with an epilogue and an optional residual.
fn conv_over(
    cuda: &Cuda,
    conv: &CausalConv<GpuWeight>,
    win: &GpuMatrix,
    epilogue: Epilogue<'_>,
    residual: Option<Residual<'_>>,
) -> GpuMatrix {
    let rows = win.rows - conv.history();
    let taps = Taps::Conv { kernel: conv.kernel, dilation: conv.dilation };
    let n = conv.bias.numel();
    gemm(cuda, &Gemm { input: win, rows, taps, weight: &conv.weight, n, bias: Some(&conv.bias), epilogue, residual })
}

/// Optional Snake, then a causal conv; each stream (`rows[s]` of `x`) continues its `history`.
pub fn causal_conv(
    cuda: &Cuda,
    conv: &CausalConv<GpuWeight>,
    snake: Option<&GpuWeight>,
    x: &GpuMatrix,
    rows: &[usize],
    histories: &mut [&mut GpuConvHistory],
) -> GpuMatrix {
    assert!(histories.iter().all(|h| h.rows.rows == conv.history()), "conv history rows");
    let w = windows(cuda, histories, x, rows, snake);
    gather(cuda, conv_over(cuda, conv, &w.win, Epilogue::None, None), &w.starts, rows)
}

/// Snake, then the causal transposed conv; each stream's history is its previous input row
/// (after Snake). Each stream's rows × stride come out, stacked.
pub fn decoder_upsample(
    cuda: &Cuda,
    w: &DecoderUpsample<GpuWeight>,
    x: &GpuMatrix,
    rows: &[usize],
    histories: &mut [&mut GpuConvHistory],
) -> GpuMatrix {
    assert!(histories.iter().all(|h| h.rows.rows == 1), "transposed conv history rows");
    let (stride, out) = (w.conv.stride, w.conv.bias.numel());
    let win = windows(cuda, histories, x, rows, Some(&w.snake));
    let taps = Taps::Transposed { stride, out };
    let g = Gemm {
        input: &win.win,
        rows: win.win.rows - 1,
        taps,
        weight: &w.conv.weight,
        n: stride * out,
        bias: Some(&w.conv.bias),
        epilogue: Epilogue::None,
        residual: None,
    };
    reshape(gather(cuda, gemm(cuda, &g), &win.starts, rows), x.rows * stride, out)
}

/// `x + conv2(snake2(conv1(snake1(x))))`: conv1's epilogue applies snake2, so its output is
/// conv2's (history-less, k = 1) window; conv2's epilogue adds `x`.
pub fn residual_unit(
    cuda: &Cuda,
    w: &ResidualUnitParams<GpuWeight>,
    x: &GpuMatrix,
    rows: &[usize],
    histories: &mut [&mut GpuConvHistory],
) -> GpuMatrix {
    assert!(histories.iter().all(|h| h.rows.rows == w.conv1.history()), "residual unit history rows");
    assert_eq!(w.conv2.history(), 0, "a residual unit's second conv is k = 1");
    let win = windows(cuda, histories, x, rows, Some(&w.snake1));
    let snaked = conv_over(cuda, &w.conv1, &win.win, Epilogue::Snake(&w.snake2), None);
    let snaked = gather(cuda, snaked, &win.starts, rows);
    conv_over(cuda, &w.conv2, &snaked, Epilogue::None, Some(Residual { x, gamma: None }))
}

/// Transposed conv k = s = 2, then ConvNeXt (depthwise conv over each stream's `dw_history` +
/// its new rows, LayerNorm, Linear, GELU, Linear, γ, residual). Each stream's rows double.
pub fn upsample_stage(
    cuda: &Cuda,
    w: &UpsampleStage<GpuWeight>,
    x: &GpuMatrix,
    rows: &[usize],
    dw_histories: &mut [&mut GpuConvHistory],
) -> GpuMatrix {
    let (k, c) = (w.convnext.dw_weight.shape[0], w.conv_bias.numel());
    assert!(dw_histories.iter().all(|h| h.rows.rows == k - 1), "depthwise conv history rows");
    let linear = |input: &GpuMatrix, weight: &GpuWeight, bias: &GpuWeight, epilogue, residual| {
        let n = bias.numel();
        let g = Gemm { input, rows: input.rows, taps: Taps::Linear, weight, n, bias: Some(bias), epilogue, residual };
        gemm(cuda, &g)
    };
    // [2, out, in] as [2·out, in]: the output [rows, 2·out] is [2·rows, out], each stream's
    // rows still together and in order.
    let up = Gemm {
        input: x,
        rows: x.rows,
        taps: Taps::Linear,
        weight: &w.conv_weight,
        n: 2 * c,
        bias: Some(&w.conv_bias),
        epilogue: Epilogue::None,
        residual: None,
    };
    let up = reshape(gemm(cuda, &up), 2 * x.rows, c);
    let doubled: Vec<usize> = rows.iter().map(|n| 2 * n).collect();
    let win = windows(cuda, dw_histories, &up, &doubled, None);
    let normed = gather(cuda, convnext_dw_norm(cuda, w, &win.win), &win.starts, &doubled);
    let hidden = linear(&normed, &w.convnext.pw1_weight, &w.convnext.pw1_bias, Epilogue::Gelu, None);
    linear(
        &hidden,
        &w.convnext.pw2_weight,
        &w.convnext.pw2_bias,
        Epilogue::None,
        Some(Residual { x: &up, gamma: Some(&w.convnext.gamma) }),
    )
}

/// The depthwise causal conv over `win` and the LayerNorm of its output, per row.
fn convnext_dw_norm(cuda: &Cuda, w: &UpsampleStage<GpuWeight>, win: &GpuMatrix) -> GpuMatrix {
    let (k, c) = (w.convnext.dw_weight.shape[0], win.cols);
    check_f16(&w.convnext.dw_weight, k * c, "depthwise conv weight");
    for (t, what) in [(&w.convnext.dw_bias, "depthwise conv bias"), (&w.convnext.norm_weight, "LayerNorm weight")] {
        check_f16(t, c, what);
    }
    check_f16(&w.convnext.norm_bias, c, "LayerNorm bias");
    let rows = win.rows - (k - 1);
    let y = cuda.matrix_f16(rows, c);
    if rows > 0 {
        let args = [
            win.ptr().into(),
            w.convnext.dw_weight.ptr.into(),
            w.convnext.dw_bias.ptr.into(),
            w.convnext.norm_weight.ptr.into(),
            w.convnext.norm_bias.ptr.into(),
            y.ptr().into(),
            c.into(),
            k.into(),
        ];
        let dims = Dims::linear(rows, THREADS).with_shared((c * 4) as u32);
        cuda.kernels.codec.convnext_dw_norm.launch(cuda.stream(), dims, &args);
    }
    y
}

/// `tanh` of a one-channel activation, rounded to f16, as host samples (waits for the stream).
pub fn tanh_pcm(cuda: &Cuda, x: &GpuMatrix) -> Vec<f32> {
    assert_eq!((x.cols, x.elem), (1, Elem::F16), "PCM is one f16 channel");
    let n = x.len();
    if n == 0 {
        return Vec::new();
    }
    let y = cuda.matrix_f16(x.rows, 1);
    let args = [x.ptr().into(), y.ptr().into(), n.into()];
    cuda.kernels.codec.tanh.launch(cuda.stream(), Dims::linear(n.div_ceil(THREADS as usize), THREADS), &args);
    cuda.copy_to_host::<f16>(y.ptr(), n).iter().map(|v| v.to_f32()).collect()
}

/// The same buffer seen as `[rows, cols]` (row-major, same element count).
fn reshape(mut m: GpuMatrix, rows: usize, cols: usize) -> GpuMatrix {
    assert_eq!(m.len(), rows * cols, "reshape keeps the element count");
    (m.rows, m.cols) = (rows, cols);
    m
}
