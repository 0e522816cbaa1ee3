//! The codec's convolutions on the GPU (`codec.md` §1.4–1.5): the quantizer upsample stages
//! (k = s = 2 transposed conv, ConvNeXt), causal convs with optional Snake, the decoder blocks'
//! Snake + causal transposed conv, residual units, tanh. Each stateful call builds its input
//! window — the carried history rows (after Snake), then the new rows — keeps the window's last
//! rows as the next history, and runs the GEMM over the window: an output's inputs are the same
//! values however the stream was cut.

use half::f16;

use super::super::Cuda;
use super::super::launch::Dims;
use super::super::tensor::{Elem, GpuMatrix, GpuWeight};
use super::GpuConvHistory;
use super::gemm::{Epilogue, Gemm, Residual, Taps, check_f16, gemm};
use crate::backend::codec::{CausalConv, DecoderUpsample, ResidualUnitParams, UpsampleStage};

const THREADS: u32 = 256;

/// `[history; snake?(x)]` in a new f16 matrix; then the window's last rows become the history.
fn window(cuda: &Cuda, history: &mut GpuConvHistory, x: &GpuMatrix, alpha: Option<&GpuWeight>) -> GpuMatrix {
    let (h, c) = (history.rows.rows, x.cols);
    assert_eq!(x.elem, Elem::F16, "codec activations are f16");
    assert_eq!(history.rows.cols, c, "conv history width");
    if let Some(a) = alpha {
        check_f16(a, c, "Snake α");
    }
    let win = cuda.matrix_f16(h + x.rows, c);
    let n = win.len();
    if x.rows == 0 {
        if h > 0 {
            cuda.copy_device_to_device(win.ptr(), history.rows.ptr(), n * 2);
        }
        return win;
    }
    let args = [
        history.rows.ptr().into(),
        x.ptr().into(),
        alpha.map_or(0, |a| a.ptr).into(),
        win.ptr().into(),
        h.into(),
        x.rows.into(),
        c.into(),
    ];
    cuda.kernels.codec.window.launch(cuda.stream(), Dims::linear(n.div_ceil(THREADS as usize), THREADS), &args);
    if h > 0 {
        cuda.copy_device_to_device(history.rows.ptr(), win.row_ptr(x.rows), h * c * 2);
    }
    win
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

/// Optional Snake, then a causal conv continuing `history`.
pub fn causal_conv(
    cuda: &Cuda,
    conv: &CausalConv<GpuWeight>,
    snake: Option<&GpuWeight>,
    x: &GpuMatrix,
    history: &mut GpuConvHistory,
) -> GpuMatrix {
    assert_eq!(history.rows.rows, conv.history(), "conv history rows");
    let win = window(cuda, history, x, snake);
    conv_over(cuda, conv, &win, Epilogue::None, None)
}

/// Snake, then the causal transposed conv; `history` is the previous input row (after Snake).
pub fn decoder_upsample(
    cuda: &Cuda,
    w: &DecoderUpsample<GpuWeight>,
    x: &GpuMatrix,
    history: &mut GpuConvHistory,
) -> GpuMatrix {
    assert_eq!(history.rows.rows, 1, "transposed conv history rows");
    let (stride, out) = (w.conv.stride, w.conv.bias.numel());
    let win = window(cuda, history, x, Some(&w.snake));
    let taps = Taps::Transposed { stride, out };
    let g = Gemm {
        input: &win,
        rows: x.rows,
        taps,
        weight: &w.conv.weight,
        n: stride * out,
        bias: Some(&w.conv.bias),
        epilogue: Epilogue::None,
        residual: None,
    };
    reshape(gemm(cuda, &g), x.rows * stride, out)
}

/// `x + conv2(snake2(conv1(snake1(x))))`: conv1's epilogue applies snake2, so its output is
/// conv2's (history-less, k = 1) window; conv2's epilogue adds `x`.
pub fn residual_unit(
    cuda: &Cuda,
    w: &ResidualUnitParams<GpuWeight>,
    x: &GpuMatrix,
    history: &mut GpuConvHistory,
) -> GpuMatrix {
    assert_eq!(history.rows.rows, w.conv1.history(), "residual unit history rows");
    assert_eq!(w.conv2.history(), 0, "a residual unit's second conv is k = 1");
    let win = window(cuda, history, x, Some(&w.snake1));
    let snaked = conv_over(cuda, &w.conv1, &win, Epilogue::Snake(&w.snake2), None);
    conv_over(cuda, &w.conv2, &snaked, Epilogue::None, Some(Residual { x, gamma: None }))
}

/// Transposed conv k = s = 2, then ConvNeXt (depthwise conv over `dw_history` + new rows,
/// LayerNorm, Linear, GELU, Linear, γ, residual).
pub fn upsample_stage(
    cuda: &Cuda,
    w: &UpsampleStage<GpuWeight>,
    x: &GpuMatrix,
    dw_history: &mut GpuConvHistory,
) -> GpuMatrix {
    let (k, c) = (w.dw_weight.shape[0], w.conv_bias.numel());
    assert_eq!(dw_history.rows.rows, k - 1, "depthwise conv history rows");
    let linear = |input: &GpuMatrix, weight: &GpuWeight, bias: &GpuWeight, epilogue, residual| {
        let n = bias.numel();
        let g = Gemm { input, rows: input.rows, taps: Taps::Linear, weight, n, bias: Some(bias), epilogue, residual };
        gemm(cuda, &g)
    };
    // [2, out, in] as [2·out, in]: the output [rows, 2·out] is [2·rows, out].
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
    let win = window(cuda, dw_history, &up, None);
    let normed = convnext_dw_norm(cuda, w, &win);
    let hidden = linear(&normed, &w.pw1_weight, &w.pw1_bias, Epilogue::Gelu, None);
    linear(&hidden, &w.pw2_weight, &w.pw2_bias, Epilogue::None, Some(Residual { x: &up, gamma: Some(&w.gamma) }))
}

/// The depthwise causal conv over `win` and the LayerNorm of its output, per row.
fn convnext_dw_norm(cuda: &Cuda, w: &UpsampleStage<GpuWeight>, win: &GpuMatrix) -> GpuMatrix {
    let (k, c) = (w.dw_weight.shape[0], win.cols);
    check_f16(&w.dw_weight, k * c, "depthwise conv weight");
    for (t, what) in [(&w.dw_bias, "depthwise conv bias"), (&w.norm_weight, "LayerNorm weight")] {
        check_f16(t, c, what);
    }
    check_f16(&w.norm_bias, c, "LayerNorm bias");
    let rows = win.rows - (k - 1);
    let y = cuda.matrix_f16(rows, c);
    if rows > 0 {
        let args = [
            win.ptr().into(),
            w.dw_weight.ptr.into(),
            w.dw_bias.ptr.into(),
            w.norm_weight.ptr.into(),
            w.norm_bias.ptr.into(),
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
