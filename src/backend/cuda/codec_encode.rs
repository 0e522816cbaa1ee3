//! `kernels/codec_encode.cu`: the codec encoder on the GPU in f32 (voice cloning, `codec.md` §5.3).
//!
//! [`CudaF32`] is the CUDA backend seen as an f32 backend: the same context, stream, arena and
//! pool as [`Cuda`], with f32 weights (`codec_weight` keeps the host's folded f32 values) and f32
//! activations. It implements the layers the encoder shares with the decoder
//! ([`CodecLayerOps`]) and the encoder's own stages ([`CodecEncodeOps`]), so
//! `model::codec::encode` runs on it unchanged. f32, not the decoder's f16: the reference encodes
//! in f32 (TF32 off), and codes are a nearest-codeword search that low precision flips.
//!
//! Conv histories and attention windows are carried as the trait asks (the window of a call is
//! its history, then its new rows), although the encoder itself starts each from zero.

use std::sync::Arc;

use cudarc::driver::CudaContext;

use super::Cuda;
use super::launch::{Dims, Kernel, KernelError, Module, embedded};
use super::tensor::{DType, Elem, GpuMatrix, GpuWeight};
use crate::backend::BackendTypes;
use crate::backend::codec::{CausalConv, CodecAttentionShape, CodecLayerOps, ResidualUnitParams};
use crate::backend::codec_encode::{CodecEncodeOps, DownsampleStage, StridedConv, VqEncoder};
use crate::backend::cpu::Matrix;
use crate::checkpoint::TensorView;
use crate::model::weights::{TensorSpec, TransformerLayer};

/// Threads per block of the element-wise and row kernels, and of the conv kernel.
const THREADS: u32 = 256;
/// Rows and outputs per block of `enc_conv*` (`conv::BM`, `conv::BN` in the .cu).
const CONV_ROWS: usize = 32;
const CONV_OUTPUTS: usize = 64;
/// Query rows × heads per block of `enc_attention` (`ATT_WARPS`), and its head width.
const ATTENTION_WARPS: usize = 4;
const ATTENTION_HEAD_DIM: usize = 64;
/// Widest codebook entry `enc_quantize` holds (`VQ_MAX_DIM`).
const VQ_MAX_DIM: usize = 32;
/// LayerNorm eps of the ConvNeXt block (`rvq.py`).
const LAYER_NORM_EPS: f32 = 1e-6;

pub struct CodecEncodeKernels {
    snake: Kernel,
    /// By epilogue: none, GELU, residual (optionally γ-scaled), SwiGLU.
    conv: [Kernel; 4],
    rms_norm: Kernel,
    layer_norm: Kernel,
    depthwise: Kernel,
    rope: Kernel,
    split_kv: Kernel,
    attention: Kernel,
    quantize: Kernel,
}

impl CodecEncodeKernels {
    pub fn load(ctx: &Arc<CudaContext>) -> Result<CodecEncodeKernels, KernelError> {
        let m = Module::load(ctx, "codec_encode", embedded::CODEC_ENCODE)?;
        Ok(CodecEncodeKernels {
            snake: m.kernel("enc_snake")?,
            conv: [
                m.kernel("enc_conv")?,
                m.kernel("enc_conv_gelu")?,
                m.kernel("enc_conv_residual")?,
                m.kernel("enc_conv_swiglu")?,
            ],
            rms_norm: m.kernel("enc_rms_norm")?,
            layer_norm: m.kernel("enc_layer_norm")?,
            depthwise: m.kernel("enc_depthwise")?,
            rope: m.kernel("enc_rope")?,
            split_kv: m.kernel("enc_split_kv")?,
            attention: m.kernel("enc_attention")?,
            quantize: m.kernel("enc_quantize")?,
        })
    }
}

/// The CUDA backend computing in f32 (the codec encoder's backend).
pub struct CudaF32<'c> {
    cuda: &'c Cuda,
}

impl<'c> CudaF32<'c> {
    pub fn new(cuda: &'c Cuda) -> CudaF32<'c> {
        CudaF32 { cuda }
    }

    /// A host matrix as an f32 activation.
    pub fn upload(&self, m: &Matrix) -> GpuMatrix {
        let x = self.matrix(m.rows, m.cols);
        self.cuda.copy_to_device(x.ptr(), &m.data);
        x
    }

    fn matrix(&self, rows: usize, cols: usize) -> GpuMatrix {
        self.cuda.matrix_of(rows, cols, Elem::F32)
    }

    fn kernels(&self) -> &CodecEncodeKernels {
        &self.cuda.kernels.codec_encode
    }

    /// `rows` of zeros, then the rows of `x`.
    fn behind_zeros(&self, rows: usize, x: &GpuMatrix) -> GpuMatrix {
        let win = self.matrix(rows + x.rows, x.cols);
        self.cuda.zero(win.ptr(), rows * x.cols * 4);
        self.cuda.copy_device_to_device(win.ptr() + (rows * x.cols * 4) as u64, x.ptr(), x.bytes());
        win
    }

    /// The rows of `a`, then those of `b` (one width).
    fn concat(&self, a: &GpuMatrix, b: &GpuMatrix) -> GpuMatrix {
        assert_eq!(a.cols, b.cols, "concat widths");
        let win = self.matrix(a.rows + b.rows, a.cols);
        self.cuda.copy_device_to_device(win.ptr(), a.ptr(), a.bytes());
        self.cuda.copy_device_to_device(win.ptr() + a.bytes() as u64, b.ptr(), b.bytes());
        win
    }

    fn snake(&self, x: &GpuMatrix, alpha: &GpuWeight) -> GpuMatrix {
        f32_act(x, "Snake input");
        check_f32(alpha, x.cols, "Snake α");
        let y = self.matrix(x.rows, x.cols);
        if !x.is_empty() {
            let args = [x.ptr().into(), alpha.ptr.into(), y.ptr().into(), x.len().into(), x.cols.into()];
            self.kernels().snake.launch(self.cuda.stream(), Dims::linear(x.len().div_ceil(256), THREADS), &args);
        }
        y
    }

    /// `rows` outputs of a conv over `win` (see `enc_conv` in the .cu).
    fn conv(&self, c: &Conv<'_>, win: &GpuMatrix, rows: usize) -> GpuMatrix {
        f32_act(win, "conv window");
        let (n, taps, cin) = (c.weight.shape[0], c.taps, win.cols);
        check_f32(c.weight, n * taps * cin, "conv weight");
        if rows > 0 {
            assert!((rows - 1) * c.stride + (taps - 1) * c.dilation < win.rows, "conv window too short");
        }
        if let Some(b) = c.bias {
            check_f32(b, n, "conv bias");
        }
        let (epilogue, aux, gamma) = match c.epilogue {
            Epilogue::None => (0, 0, 0),
            Epilogue::Gelu => (1, 0, 0),
            Epilogue::Residual { x, gamma } => (2, x.ptr(), gamma.map_or(0, |g| g.ptr)),
            Epilogue::SwiGlu { gate } => (3, gate.ptr(), 0),
        };
        if let Epilogue::Residual { x: aux, .. } | Epilogue::SwiGlu { gate: aux } = c.epilogue {
            assert_eq!((aux.rows, aux.cols, aux.elem), (rows, n, Elem::F32), "epilogue operand shape");
        }
        if let Epilogue::Residual { gamma: Some(g), .. } = c.epilogue {
            check_f32(g, n, "LayerScale γ");
        }
        let y = self.matrix(rows, n);
        if rows > 0 {
            let args = [
                win.ptr().into(),
                c.weight.ptr.into(),
                c.bias.map_or(0, |b| b.ptr).into(),
                aux.into(),
                gamma.into(),
                y.ptr().into(),
                rows.into(),
                n.into(),
                cin.into(),
                taps.into(),
                c.stride.into(),
                c.dilation.into(),
            ];
            let grid = (rows.div_ceil(CONV_ROWS), n.div_ceil(CONV_OUTPUTS));
            let dims =
                Dims::grid((u32::try_from(grid.0).expect("grid"), u32::try_from(grid.1).expect("grid"), 1), THREADS);
            self.kernels().conv[epilogue].launch(self.cuda.stream(), dims, &args);
        }
        y
    }

    /// A linear map `y = x · Wᵀ (+ b)` with an epilogue.
    fn linear(&self, x: &GpuMatrix, weight: &GpuWeight, bias: Option<&GpuWeight>, epilogue: Epilogue<'_>) -> GpuMatrix {
        self.conv(&Conv { weight, bias, taps: 1, stride: 1, dilation: 1, epilogue }, x, x.rows)
    }

    fn layer_norm(&self, x: &GpuMatrix, w: &GpuWeight, b: &GpuWeight) -> GpuMatrix {
        check_f32(w, x.cols, "LayerNorm weight");
        check_f32(b, x.cols, "LayerNorm bias");
        let y = self.matrix(x.rows, x.cols);
        if x.rows > 0 {
            let args =
                [x.ptr().into(), w.ptr.into(), b.ptr.into(), y.ptr().into(), x.cols.into(), LAYER_NORM_EPS.into()];
            self.kernels().layer_norm.launch(self.cuda.stream(), Dims::linear(x.rows, THREADS), &args);
        }
        y
    }

    /// The ConvNeXt block over `x`, its depthwise conv from zero history.
    fn convnext(&self, w: &crate::backend::codec::ConvNext<GpuWeight>, x: &GpuMatrix) -> GpuMatrix {
        let (taps, c) = (w.dw_weight.shape[0], x.cols);
        check_f32(&w.dw_weight, taps * c, "depthwise conv weight");
        check_f32(&w.dw_bias, c, "depthwise conv bias");
        let win = self.behind_zeros(taps - 1, x);
        let dw = self.matrix(x.rows, c);
        if x.rows > 0 {
            let args = [
                win.ptr().into(),
                w.dw_weight.ptr.into(),
                w.dw_bias.ptr.into(),
                dw.ptr().into(),
                x.rows.into(),
                c.into(),
                taps.into(),
            ];
            self.kernels().depthwise.launch(self.cuda.stream(), Dims::linear(dw.len().div_ceil(256), THREADS), &args);
        }
        let normed = self.layer_norm(&dw, &w.norm_weight, &w.norm_bias);
        let hidden = self.linear(&normed, &w.pw1_weight, Some(&w.pw1_bias), Epilogue::Gelu);
        self.linear(&hidden, &w.pw2_weight, Some(&w.pw2_bias), Epilogue::Residual { x, gamma: Some(&w.gamma) })
    }
}

/// One conv call: the weight `[n, taps, cin]`, its taps' spacing and stride, the epilogue.
struct Conv<'a> {
    weight: &'a GpuWeight,
    bias: Option<&'a GpuWeight>,
    taps: usize,
    stride: usize,
    dilation: usize,
    epilogue: Epilogue<'a>,
}

/// What happens to `acc + bias`.
#[derive(Clone, Copy)]
enum Epilogue<'a> {
    None,
    /// Exact-erf GELU.
    Gelu,
    /// `x + v·γ` (γ = 1 when absent).
    Residual {
        x: &'a GpuMatrix,
        gamma: Option<&'a GpuWeight>,
    },
    /// `silu(gate) · v`.
    SwiGlu {
        gate: &'a GpuMatrix,
    },
}

fn check_f32(w: &GpuWeight, len: usize, what: &str) {
    assert_eq!((w.dtype, w.numel()), (DType::F32, len), "{what}: an f32 weight of {len} values");
}

fn f32_act(x: &GpuMatrix, what: &str) {
    assert_eq!(x.elem, Elem::F32, "{what}: an f32 activation");
}

/// The last inputs of a causal conv, f32 `[rows, channels]`.
pub struct F32ConvHistory {
    pub rows: GpuMatrix,
}

/// Post-RoPE keys and values of the last `window − 1` frames, f32, oldest first: rows `0..len`.
pub struct F32KvWindow {
    pub keys: GpuMatrix,
    pub values: GpuMatrix,
    pub len: usize,
}

impl BackendTypes for CudaF32<'_> {
    type Act = GpuMatrix;
    type Weight = GpuWeight;

    fn upload(&self, spec: &TensorSpec, view: TensorView<'_>) -> GpuWeight {
        let data = view.to_f32_vec().unwrap_or_else(|| panic!("tensor `{}` is not a float tensor", spec.name));
        self.cuda.upload_f32(view.shape, data)
    }

    fn upload_f32(&self, shape: &[usize], data: Vec<f32>) -> GpuWeight {
        self.cuda.upload_f32(shape, data)
    }

    fn to_host(&self, a: &GpuMatrix) -> Matrix {
        self.cuda.to_host(a)
    }

    fn act_rows(&self, a: &GpuMatrix, start: usize, count: usize) -> GpuMatrix {
        self.cuda.act_rows(a, start, count)
    }

    fn stack_rows(&self, parts: &[GpuMatrix]) -> GpuMatrix {
        self.cuda.stack_rows(parts)
    }
}

impl CodecLayerOps for CudaF32<'_> {
    type ConvHistory = F32ConvHistory;
    type KvWindow = F32KvWindow;

    fn new_conv_history(&self, rows: usize, channels: usize) -> F32ConvHistory {
        let history = self.matrix(rows, channels);
        self.cuda.zero(history.ptr(), history.bytes());
        F32ConvHistory { rows: history }
    }

    fn new_kv_window(&self, shape: &CodecAttentionShape) -> F32KvWindow {
        let (rows, width) = (shape.window - 1, shape.heads * shape.head_dim);
        F32KvWindow { keys: self.matrix(rows, width), values: self.matrix(rows, width), len: 0 }
    }

    fn codec_transformer_layer(
        &self,
        shape: &CodecAttentionShape,
        w: &TransformerLayer<GpuWeight>,
        rope: &[f32],
        x: &GpuMatrix,
        kv: &mut F32KvWindow,
    ) -> GpuMatrix {
        let width = shape.heads * shape.head_dim;
        assert_eq!(shape.head_dim, ATTENTION_HEAD_DIM, "the attention kernel's head width");
        assert_eq!((x.cols, rope.len()), (width, x.rows * shape.head_dim), "transformer input and rope rows");
        let qkv =
            self.linear(&self.codec_rms_norm(&w.attention_norm, shape.norm_eps, x), &w.wqkv, None, Epilogue::None);
        let stream = self.cuda.stream();
        let table = self.matrix(x.rows, shape.head_dim);
        self.cuda.stage_to_device(table.ptr(), rope);
        let total = kv.len + x.rows;
        let (keys, values) = (self.matrix(total, width), self.matrix(total, width));
        let past_bytes = kv.len * width * 4;
        self.cuda.copy_device_to_device(keys.ptr(), kv.keys.ptr(), past_bytes);
        self.cuda.copy_device_to_device(values.ptr(), kv.values.ptr(), past_bytes);
        let attn = self.matrix(x.rows, width);
        if x.rows > 0 {
            let n = x.rows * width;
            let args = [qkv.ptr().into(), table.ptr().into(), x.rows.into(), width.into(), shape.head_dim.into()];
            self.kernels().rope.launch(stream, Dims::linear(n.div_ceil(256), THREADS), &args);
            let args =
                [qkv.ptr().into(), keys.ptr().into(), values.ptr().into(), x.rows.into(), width.into(), kv.len.into()];
            self.kernels().split_kv.launch(stream, Dims::linear(n.div_ceil(256), THREADS), &args);
            let scale = (1.0 / (shape.head_dim as f64).sqrt()) as f32;
            let args = [
                qkv.ptr().into(),
                keys.ptr().into(),
                values.ptr().into(),
                attn.ptr().into(),
                x.rows.into(),
                kv.len.into(),
                shape.heads.into(),
                shape.window.into(),
                scale.into(),
            ];
            let items = x.rows * shape.heads;
            let dims = Dims::linear(items.div_ceil(ATTENTION_WARPS), (ATTENTION_WARPS * 32) as u32)
                .with_shared((ATTENTION_WARPS * shape.window * 4) as u32);
            self.kernels().attention.launch(stream, dims, &args);
        }
        let keep = total.min(kv.keys.rows);
        let from = (total - keep) * width * 4;
        self.cuda.copy_device_to_device(kv.keys.ptr(), keys.ptr() + from as u64, keep * width * 4);
        self.cuda.copy_device_to_device(kv.values.ptr(), values.ptr() + from as u64, keep * width * 4);
        kv.len = keep;
        let h = self.linear(&attn, &w.wo, None, Epilogue::Residual { x, gamma: Some(&w.attention_layer_scale) });
        let hn = self.codec_rms_norm(&w.ffn_norm, shape.norm_eps, &h);
        let gate = self.linear(&hn, &w.w1, None, Epilogue::None);
        let a = self.linear(&hn, &w.w3, None, Epilogue::SwiGlu { gate: &gate });
        self.linear(&a, &w.w2, None, Epilogue::Residual { x: &h, gamma: Some(&w.ffn_layer_scale) })
    }

    fn codec_rms_norm(&self, weight: &GpuWeight, eps: f32, x: &GpuMatrix) -> GpuMatrix {
        f32_act(x, "RMSNorm input");
        check_f32(weight, x.cols, "RMSNorm weight");
        let y = self.matrix(x.rows, x.cols);
        if x.rows > 0 {
            let args = [x.ptr().into(), weight.ptr.into(), y.ptr().into(), x.cols.into(), eps.into()];
            self.kernels().rms_norm.launch(self.cuda.stream(), Dims::linear(x.rows, THREADS), &args);
        }
        y
    }

    fn codec_causal_conv(
        &self,
        conv: &CausalConv<GpuWeight>,
        snake: Option<&GpuWeight>,
        x: &GpuMatrix,
        history: &mut F32ConvHistory,
    ) -> GpuMatrix {
        let past = conv.history();
        assert_eq!((history.rows.rows, history.rows.cols), (past, x.cols), "conv history shape");
        let input = snake.map(|alpha| self.snake(x, alpha));
        let input = input.as_ref().unwrap_or(x);
        let win = self.concat(&history.rows, input);
        let keep = past * x.cols * 4;
        self.cuda.copy_device_to_device(history.rows.ptr(), win.ptr() + (win.bytes() - keep) as u64, keep);
        let c = Conv {
            weight: &conv.weight,
            bias: Some(&conv.bias),
            taps: conv.kernel,
            stride: 1,
            dilation: conv.dilation,
            epilogue: Epilogue::None,
        };
        self.conv(&c, &win, x.rows)
    }

    fn codec_residual_unit(
        &self,
        w: &ResidualUnitParams<GpuWeight>,
        x: &GpuMatrix,
        history: &mut F32ConvHistory,
    ) -> GpuMatrix {
        let h = self.codec_causal_conv(&w.conv1, Some(&w.snake1), x, history);
        let snaked = self.snake(&h, &w.snake2);
        let c = Conv {
            weight: &w.conv2.weight,
            bias: Some(&w.conv2.bias),
            taps: 1,
            stride: 1,
            dilation: 1,
            epilogue: Epilogue::Residual { x, gamma: None },
        };
        assert_eq!(w.conv2.kernel, 1, "a residual unit's second conv has one tap");
        self.conv(&c, &snaked, x.rows)
    }
}

impl CodecEncodeOps for CudaF32<'_> {
    fn codec_samples(&self, samples: &[f32]) -> GpuMatrix {
        let x = self.matrix(samples.len(), 1);
        self.cuda.copy_to_device(x.ptr(), samples);
        x
    }

    fn codec_strided_conv(&self, conv: &StridedConv<GpuWeight>, snake: Option<&GpuWeight>, x: &GpuMatrix) -> GpuMatrix {
        let (s, k) = (conv.stride, conv.kernel);
        assert!(k >= s && x.rows.is_multiple_of(s), "strided conv: {} rows for stride {s}, kernel {k}", x.rows);
        let input = snake.map(|alpha| self.snake(x, alpha));
        let win = self.behind_zeros(k - s, input.as_ref().unwrap_or(x));
        let c = Conv {
            weight: &conv.weight,
            bias: Some(&conv.bias),
            taps: k,
            stride: s,
            dilation: 1,
            epilogue: Epilogue::None,
        };
        self.conv(&c, &win, x.rows / s)
    }

    fn codec_downsample_stage(&self, w: &DownsampleStage<GpuWeight>, x: &GpuMatrix) -> GpuMatrix {
        let down = self.codec_strided_conv(&w.conv, None, x);
        self.convnext(&w.convnext, &down)
    }

    fn codec_quantize(&self, quantizers: &[&VqEncoder<GpuWeight>], z: &GpuMatrix) -> Vec<u32> {
        f32_act(z, "quantizer input");
        let (frames, latent) = (z.rows, z.cols);
        let dim = quantizers.first().map_or(0, |q| q.codebook.shape[1]);
        assert!((1..=VQ_MAX_DIM).contains(&dim), "codebook width {dim}");
        let mut table: Vec<u64> = Vec::with_capacity(5 * quantizers.len());
        let mut sizes: Vec<i32> = Vec::with_capacity(quantizers.len());
        for q in quantizers {
            let size = q.codebook.shape[0];
            check_f32(&q.in_proj, dim * latent, "in_proj");
            check_f32(&q.in_bias, dim, "in_proj bias");
            check_f32(&q.codebook, size * dim, "codebook");
            check_f32(&q.out_proj, latent * dim, "out_proj");
            check_f32(&q.out_bias, latent, "out_proj bias");
            table.extend([q.in_proj.ptr, q.in_bias.ptr, q.codebook.ptr, q.out_proj.ptr, q.out_bias.ptr]);
            sizes.push(i32::try_from(size).expect("codebook size"));
        }
        if frames == 0 || quantizers.is_empty() {
            return Vec::new();
        }
        let table_buf = self.cuda.scratch(table.len() * 8);
        self.cuda.copy_to_device(table_buf.ptr(), &table);
        let sizes_buf = self.cuda.scratch(sizes.len() * 4);
        self.cuda.copy_to_device(sizes_buf.ptr(), &sizes);
        let codes = self.cuda.scratch(frames * quantizers.len() * 4);
        let args = [
            z.ptr().into(),
            table_buf.ptr().into(),
            sizes_buf.ptr().into(),
            codes.ptr().into(),
            quantizers.len().into(),
            latent.into(),
            dim.into(),
        ];
        let dims = Dims::linear(frames, THREADS).with_shared((latent * 4) as u32);
        self.kernels().quantize.launch(self.cuda.stream(), dims, &args);
        self.cuda.copy_to_host::<u32>(codes.ptr(), frames * quantizers.len())
    }
}
