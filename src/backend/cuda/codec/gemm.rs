//! The codec's one GEMM (`kernels/codec.cu`, `codec_gemm_*`): linears, causal convs and causal
//! transposed convs as an implicit GEMM over f16 rows, f32 accumulation in a fixed order, with a
//! fused epilogue (bias, GELU / Snake / SiLU gate, LayerScale'd residual).
//!
//! Exactness: the kernel is chosen by the weight's input width alone ([`uses_tensor_cores`]), so
//! every call with one weight takes the same one; within it, every output is reduced in an order
//! fixed by K (mma.sync k32 steps, or one fmaf chain), whichever tile the call picks
//! ([`Tile::for_call`]): a row's result never depends on how many rows came with it.

use super::super::Cuda;
use super::super::launch::{Dims, Kernel, KernelError, Module};
use super::super::tensor::{DType, Elem, GpuMatrix, GpuWeight};

/// How each tap of output row `m` reads the input rows, and where its weights sit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Taps {
    /// `y = x · Wᵀ`, W `[n, in]`. Also the k = s = 2 upsample conv: its W `[2, out, in]` is
    /// `[2·out, in]`, and output `[rows, 2·out]` is `[2·rows, out]`.
    Linear,
    /// A causal conv over its window (history rows, then new rows), W `[out, kernel, in]`.
    Conv { kernel: usize, dilation: usize },
    /// A causal transposed conv over its window (one history row, then new rows), W
    /// `[2·stride, out, in]`; output `[rows, stride·out]` is `[rows·stride, out]`.
    Transposed { stride: usize, out: usize },
}

/// The kernel's addressing: tap `t` of output row `m` reads input row `m + a_base + t·a_tap`
/// against weights at `n·b_row + t·b_tap`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TapArgs {
    pub taps: usize,
    pub a_base: i32,
    pub a_tap: i32,
    pub b_row: usize,
    pub b_tap: usize,
}

impl Taps {
    /// The addressing of this layout for `cin` input channels.
    pub fn args(self, cin: usize) -> TapArgs {
        match self {
            Taps::Linear => TapArgs { taps: 1, a_base: 0, a_tap: 0, b_row: cin, b_tap: 0 },
            Taps::Conv { kernel, dilation } => TapArgs {
                taps: kernel,
                a_base: 0,
                a_tap: i32::try_from(dilation).expect("dilation"),
                b_row: kernel * cin,
                b_tap: cin,
            },
            // Output i·s + j = W[j]·win[i + 1] + W[j + s]·win[i] (`codec.md` §1.5).
            Taps::Transposed { stride, out } => {
                TapArgs { taps: 2, a_base: 1, a_tap: -1, b_row: cin, b_tap: stride * out * cin }
            }
        }
    }

    /// Input rows a call of `rows` outputs reads (its window: history + new rows).
    pub fn input_rows(self, rows: usize) -> usize {
        match self {
            Taps::Linear => rows,
            Taps::Conv { kernel, dilation } => rows + (kernel - 1) * dilation,
            Taps::Transposed { .. } => rows + 1,
        }
    }

    /// Weight elements for `n` outputs per row and `cin` input channels.
    pub fn weight_len(self, n: usize, cin: usize) -> usize {
        let a = self.args(cin);
        match self {
            Taps::Transposed { stride, .. } => 2 * stride * (n / stride) * cin,
            _ => n * a.taps * cin,
        }
    }
}

/// What happens to `acc + bias` before the residual.
pub enum Epilogue<'a> {
    None,
    /// Exact-erf GELU.
    Gelu,
    /// Snake of the f16-rounded value with α per output channel: the next k = 1 conv's input.
    Snake(&'a GpuWeight),
    /// `silu(f16(v)) · gate[m, n]` (SwiGLU, `v` the w1 projection, `gate` the w3 one).
    SiluGate(&'a GpuMatrix),
}

/// `y = x + γ ⊙ v` (γ = 1 when absent), `x` of the output's shape.
pub struct Residual<'a> {
    pub x: &'a GpuMatrix,
    pub gamma: Option<&'a GpuWeight>,
}

/// One GEMM call: `rows` outputs of width `n` from `input` `[*, cin]`.
pub struct Gemm<'a> {
    pub input: &'a GpuMatrix,
    pub rows: usize,
    pub taps: Taps,
    pub weight: &'a GpuWeight,
    pub n: usize,
    /// `[len]`, added as `bias[n % len]` (a transposed conv's bias is per output channel).
    pub bias: Option<&'a GpuWeight>,
    pub epilogue: Epilogue<'a>,
    pub residual: Option<Residual<'a>>,
}

/// The tensor-core kernel needs each input row and each tap's weights as whole 16-byte vectors:
/// `cin` a multiple of 8, true of every layer of the published codec. Other widths (the tiny
/// test codec's narrowest blocks) take the CUDA-core kernel. A function of the weight alone.
pub fn uses_tensor_cores(cin: usize) -> bool {
    cin.is_multiple_of(8)
}

/// Rows per tile of the tensor-core kernel. Both tiles compute each output identically.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tile {
    /// 32 rows: calls of few rows (a streamed frame group), whose cost is reading the weight.
    M32,
    /// 128 rows: many rows (the decode batch's stacked windows), whose cost is the MMAs.
    M128,
}

impl Tile {
    fn rows(self) -> usize {
        match self {
            Tile::M32 => 32,
            Tile::M128 => 128,
        }
    }

    /// 128-row tiles once they still give every one of the GPU's `sms` two blocks; before that,
    /// 32-row tiles, which spread the call over four times as many.
    pub fn for_call(rows: usize, n: usize, sms: usize) -> Tile {
        if rows.div_ceil(Tile::M128.rows()) * n.div_ceil(TILE_N) >= 2 * sms { Tile::M128 } else { Tile::M32 }
    }
}

/// The GEMM's entry points, per epilogue (none, GELU, Snake, SiLU gate).
pub struct GemmKernels {
    m32: [Kernel; 4],
    m128: [Kernel; 4],
    scalar: [Kernel; 4],
}

impl GemmKernels {
    pub fn load(m: &Module) -> Result<GemmKernels, KernelError> {
        let four = |names: [&'static str; 4]| -> Result<[Kernel; 4], KernelError> {
            let [a, b, c, d] = names.map(|name| m.kernel(name));
            Ok([a?, b?, c?, d?])
        };
        Ok(GemmKernels {
            m32: four(["codec_gemm_m32", "codec_gemm_m32_gelu", "codec_gemm_m32_snake", "codec_gemm_m32_gate"])?,
            m128: four(["codec_gemm_m128", "codec_gemm_m128_gelu", "codec_gemm_m128_snake", "codec_gemm_m128_gate"])?,
            scalar: four([
                "codec_gemm_scalar",
                "codec_gemm_scalar_gelu",
                "codec_gemm_scalar_snake",
                "codec_gemm_scalar_gate",
            ])?,
        })
    }
}

/// Threads per block and rows per tile of the CUDA-core kernel; columns per tile of both.
const SCALAR_THREADS: u32 = 256;
const SCALAR_TILE_M: usize = 64;
const MMA_THREADS: u32 = 128;
const TILE_N: usize = 64;

/// Runs the GEMM into a new f16 matrix `[rows, n]`, the tile picked by [`Tile::for_call`].
pub fn gemm(cuda: &Cuda, g: &Gemm<'_>) -> GpuMatrix {
    let sms = usize::try_from(cuda.info().multiprocessors).expect("multiprocessor count");
    gemm_tiled(cuda, g, Tile::for_call(g.rows, g.n, sms))
}

/// [`gemm`] with the tensor-core kernel's tile given (the GPU checks run both at one shape);
/// the CUDA-core kernel has one tile.
pub fn gemm_tiled(cuda: &Cuda, g: &Gemm<'_>, tile: Tile) -> GpuMatrix {
    let cin = g.input.cols;
    let a = g.taps.args(cin);
    assert_eq!(g.input.elem, Elem::F16, "codec GEMM input must be f16");
    assert!(g.input.rows >= g.taps.input_rows(g.rows), "codec GEMM input has too few rows for its taps");
    check_f16(g.weight, g.taps.weight_len(g.n, cin), "GEMM weight");
    if let Taps::Transposed { stride, out } = g.taps {
        assert_eq!(g.n, stride * out, "transposed conv outputs per row");
    }
    let bias_len = g.bias.map_or(1, |b| {
        check_f16(b, b.numel(), "GEMM bias");
        assert!(b.numel() > 0 && g.n.is_multiple_of(b.numel()), "bias length divides the output width");
        b.numel()
    });
    let aux = match g.epilogue {
        Epilogue::None | Epilogue::Gelu => 0,
        Epilogue::Snake(alpha) => {
            check_f16(alpha, g.n, "Snake α");
            alpha.ptr
        }
        Epilogue::SiluGate(gate) => {
            assert_eq!((gate.rows, gate.cols, gate.elem), (g.rows, g.n, Elem::F16), "SwiGLU gate shape");
            gate.ptr()
        }
    };
    let (res, gamma) = g.residual.as_ref().map_or((0, 0), |r| {
        assert_eq!((r.x.rows, r.x.cols, r.x.elem), (g.rows, g.n, Elem::F16), "residual shape");
        let gamma = r.gamma.map_or(0, |w| {
            check_f16(w, g.n, "LayerScale γ");
            w.ptr
        });
        (r.x.ptr(), gamma)
    });
    let y = cuda.matrix_f16(g.rows, g.n);
    if g.rows == 0 || g.n == 0 {
        return y;
    }
    let epilogue = match g.epilogue {
        Epilogue::None => 0,
        Epilogue::Gelu => 1,
        Epilogue::Snake(_) => 2,
        Epilogue::SiluGate(_) => 3,
    };
    let kernels = &cuda.kernels.codec.gemm;
    let (kernel, tile_m, threads) = if uses_tensor_cores(cin) {
        // 16-byte cp.async of rows `cin` apart, from buffers the pool and arena align to 256.
        assert!(
            g.input.ptr().is_multiple_of(16) && g.weight.ptr.is_multiple_of(16),
            "codec GEMM operands are 16-byte aligned"
        );
        let kernels = if tile == Tile::M128 { &kernels.m128 } else { &kernels.m32 };
        (&kernels[epilogue], tile.rows(), MMA_THREADS)
    } else {
        (&kernels.scalar[epilogue], SCALAR_TILE_M, SCALAR_THREADS)
    };
    let grid = (
        u32::try_from(g.rows.div_ceil(tile_m)).expect("GEMM row tiles"),
        u32::try_from(g.n.div_ceil(TILE_N)).expect("GEMM column tiles"),
        1,
    );
    let args = [
        g.input.ptr().into(),
        g.weight.ptr.into(),
        y.ptr().into(),
        g.rows.into(),
        g.n.into(),
        cin.into(),
        a.taps.into(),
        a.a_base.into(),
        a.a_tap.into(),
        a.b_row.into(),
        a.b_tap.into(),
        g.bias.map_or(0, |b| b.ptr).into(),
        bias_len.into(),
        aux.into(),
        res.into(),
        gamma.into(),
    ];
    kernel.launch(cuda.stream(), Dims::grid(grid, threads), &args);
    y
}

/// Asserts an f16 codec weight of `len` elements.
pub fn check_f16(w: &GpuWeight, len: usize, what: &str) {
    assert_eq!(w.dtype, DType::F16, "codec {what} must be resident as f16 (CodecOps::codec_weight)");
    assert_eq!(w.numel(), len, "codec {what} size (shape {:?})", w.shape);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::codec::{CausalConv, CausalConvTranspose, CodecLayerOps, CodecOps, DecoderUpsample};
    use crate::backend::cpu::codec::ConvHistory;
    use crate::backend::cpu::{Cpu, CpuWeight, Matrix};

    fn values(n: usize, seed: f32) -> Vec<f32> {
        (0..n).map(|i| ((i as f32 + 1.0) * 0.731 + seed).sin()).collect()
    }

    /// The kernel's addressing on the host: `Σ_t Σ_c A[m + a_base + t·a_tap, c] · B[n·b_row + t·b_tap + c]`.
    fn emulate(input: &Matrix, weight: &[f32], rows: usize, n: usize, taps: Taps) -> Vec<f64> {
        let (cin, a) = (input.cols, taps.args(input.cols));
        assert_eq!(weight.len(), taps.weight_len(n, cin));
        let mut y = vec![0.0; rows * n];
        for m in 0..rows {
            for o in 0..n {
                for t in 0..a.taps {
                    let row = (m as i64 + i64::from(a.a_base) + t as i64 * i64::from(a.a_tap)) as usize;
                    for c in 0..cin {
                        let b = weight[o * a.b_row + t * a.b_tap + c];
                        y[m * n + o] += f64::from(input.row(row)[c]) * f64::from(b);
                    }
                }
            }
        }
        y
    }

    fn close(got: &[f64], want: &[f32]) {
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(want) {
            assert!((g - f64::from(*w)).abs() < 1e-5, "{g} vs {w}");
        }
    }

    fn weight(shape: &[usize], seed: f32) -> CpuWeight {
        CpuWeight { shape: shape.to_vec(), data: values(shape.iter().product(), seed) }
    }

    #[test]
    fn conv_addressing_matches_the_cpu_causal_conv() {
        let (cin, out, kernel, dilation, rows) = (5, 3, 7, 3, 4);
        let conv = CausalConv { weight: weight(&[out, kernel, cin], 0.3), bias: weight(&[out], 9.0), kernel, dilation };
        let history = Matrix::from_vec(conv.history(), cin, values(conv.history() * cin, 1.1));
        let x = Matrix::from_vec(rows, cin, values(rows * cin, 2.2));
        let want = Cpu.codec_causal_conv(&conv, None, &x, &mut ConvHistory { rows: history.clone() });
        let mut win = history.data;
        win.extend(&x.data);
        let win = Matrix::from_vec(conv.history() + rows, cin, win);
        let taps = Taps::Conv { kernel, dilation };
        assert_eq!(taps.input_rows(rows), win.rows);
        let mut got = emulate(&win, &conv.weight.data, rows, out, taps);
        for (i, v) in got.iter_mut().enumerate() {
            *v += f64::from(conv.bias.data[i % out]);
        }
        close(&got, &want.data);
    }

    #[test]
    fn transposed_addressing_matches_the_cpu_decoder_upsample() {
        let (cin, out, stride, rows) = (4, 3, 4, 3);
        // Snake with α = 0 is the identity (sin²(0) = 0), so the window is history + x.
        let up = DecoderUpsample {
            snake: CpuWeight { shape: vec![cin], data: vec![0.0; cin] },
            conv: CausalConvTranspose {
                weight: weight(&[2 * stride, out, cin], 0.7),
                bias: weight(&[out], 4.0),
                stride,
            },
        };
        let history = Matrix::from_vec(1, cin, values(cin, 3.3));
        let x = Matrix::from_vec(rows, cin, values(rows * cin, 5.5));
        let want = Cpu.codec_decoder_upsample(&up, &x, &mut ConvHistory { rows: history.clone() });
        assert_eq!((want.rows, want.cols), (rows * stride, out));
        let mut win = history.data;
        win.extend(&x.data);
        let win = Matrix::from_vec(rows + 1, cin, win);
        let taps = Taps::Transposed { stride, out };
        assert_eq!(taps.input_rows(rows), win.rows);
        let mut got = emulate(&win, &up.conv.weight.data, rows, stride * out, taps);
        for (i, v) in got.iter_mut().enumerate() {
            *v += f64::from(up.conv.bias.data[i % out]);
        }
        // [rows, stride·out] row-major is [rows·stride, out].
        close(&got, &want.data);
    }

    #[test]
    fn the_upsample_conv_is_a_linear_over_its_tap_major_weight() {
        // [2, out, in] read as [2·out, in]: output column j·out + o is W[j][o] · x.
        let (cin, out, rows) = (3, 2, 2);
        let w = values(2 * out * cin, 0.9);
        let x = Matrix::from_vec(rows, cin, values(rows * cin, 1.7));
        let got = emulate(&x, &w, rows, 2 * out, Taps::Linear);
        for i in 0..rows {
            for j in 0..2 {
                for o in 0..out {
                    let taps = &w[(j * out + o) * cin..(j * out + o + 1) * cin];
                    let want: f64 = taps.iter().zip(x.row(i)).map(|(a, b)| f64::from(*a) * f64::from(*b)).sum();
                    assert!((got[i * 2 * out + j * out + o] - want).abs() < 1e-12);
                }
            }
        }
    }

    #[test]
    fn the_kernel_is_a_function_of_the_input_width() {
        // Every width of the published codec (`codec.md` §1.3–1.5) runs on tensor cores.
        for cin in [1024, 3072, 4096, 1536, 768, 384, 192, 96] {
            assert!(uses_tensor_cores(cin), "{cin}");
        }
        // The tiny codec's 24 and 48 too; its 6 and 12 on CUDA cores.
        assert!(uses_tensor_cores(24) && uses_tensor_cores(48));
        assert!(!uses_tensor_cores(6) && !uses_tensor_cores(12));
    }

    #[test]
    fn large_tiles_only_when_they_fill_the_gpu_twice() {
        // 132 SMs: 264 blocks of 128 × 64.
        assert_eq!(Tile::for_call(1, 3072, 132), Tile::M32);
        assert_eq!(Tile::for_call(310, 768, 132), Tile::M32);
        assert_eq!(Tile::for_call(16_438, 96, 132), Tile::M32);
        assert_eq!(Tile::for_call(16_384 + 1, 192, 132), Tile::M128);
        assert_eq!(Tile::for_call(128 * 132, 128, 132), Tile::M128);
        assert_eq!(Tile::for_call(128 * 132 - 128, 128, 132), Tile::M32);
    }
}
