//! `kernels/codec.cu` and `CodecOps` on the GPU: the Fish modded-DAC decode path (`codec.md`
//! §1–2) in FP16 as the reference runs it. Weights are folded in f32 on the host (as
//! `model::codec::params` does for every backend) and rounded to f16 at upload; activations are
//! f16 between operations, arithmetic inside a kernel is f32; RoPE uses the model's bf16-rounded
//! cos/sin with the rotation in f32.
//!
//! Exact streaming: conv histories and the attention windows live in device memory and carry
//! exactly the values a whole decode would read, and every kernel computes an output element by
//! the same operations whatever the number of rows in the call (one GEMM with a fixed reduction
//! order instead of cuBLAS, attention visiting a query's keys oldest first); see
//! `kernels/codec.cu`. So a whole decode and any chunked decode agree bit for bit.

mod conv;
pub mod gemm;
mod transformer;

use std::sync::Arc;

use cudarc::driver::CudaContext;

use super::Cuda;
use super::launch::{Kernel, KernelError, Module, embedded};
use super::tensor::{DType, GpuMatrix, GpuWeight, to_f16_vec};
use crate::backend::codec::{
    CausalConv, CodecAttentionShape, CodecLayerOps, CodecOps, DecoderUpsample, ResidualUnitParams, RvqCodebook,
    UpsampleStage,
};
use crate::model::weights::TransformerLayer;

pub struct CodecKernels {
    rvq: Kernel,
    rms_norm: Kernel,
    rope_split: Kernel,
    attention: Kernel,
    window: Kernel,
    convnext_dw_norm: Kernel,
    tanh: Kernel,
    gemm: gemm::GemmKernels,
}

impl CodecKernels {
    pub fn load(ctx: &Arc<CudaContext>) -> Result<CodecKernels, KernelError> {
        let m = Module::load(ctx, "codec", embedded::CODEC)?;
        Ok(CodecKernels {
            rvq: m.kernel("codec_rvq")?,
            rms_norm: m.kernel("codec_rms_norm")?,
            rope_split: m.kernel("codec_rope_split")?,
            attention: m.kernel("codec_attention")?,
            window: m.kernel("codec_window")?,
            convnext_dw_norm: m.kernel("codec_convnext_dw_norm")?,
            tanh: m.kernel("codec_tanh")?,
            gemm: gemm::GemmKernels::load(&m)?,
        })
    }
}

/// The last inputs of a causal conv (after its Snake) or of a transposed conv, `[rows, channels]`
/// f16 in a pool buffer; zeros at the start of a stream.
pub struct GpuConvHistory {
    pub rows: GpuMatrix,
}

/// Post-RoPE keys and values of the last `window − 1` frames of one layer, f16 `[window − 1,
/// width]`, oldest first: rows `0..len` are valid.
pub struct GpuKvWindow {
    pub keys: GpuMatrix,
    pub values: GpuMatrix,
    pub len: usize,
}

impl CodecLayerOps for Cuda {
    type ConvHistory = GpuConvHistory;
    type KvWindow = GpuKvWindow;

    /// Rounds the host-folded f32 values to f16 (nearest even) and places them in the arena.
    fn codec_weight(&self, shape: &[usize], data: Vec<f32>) -> GpuWeight {
        assert_eq!(shape.iter().product::<usize>(), data.len(), "codec weight shape");
        let half = to_f16_vec(&data);
        self.place_weight("codec weight", shape, DType::F16, bytemuck::cast_slice(&half))
    }

    fn new_conv_history(&self, rows: usize, channels: usize) -> GpuConvHistory {
        let history = self.matrix_f16(rows, channels);
        self.zero(history.ptr(), history.len() * 2);
        GpuConvHistory { rows: history }
    }

    fn new_kv_window(&self, shape: &CodecAttentionShape) -> GpuKvWindow {
        let (rows, width) = (shape.window - 1, shape.heads * shape.head_dim);
        GpuKvWindow { keys: self.matrix_f16(rows, width), values: self.matrix_f16(rows, width), len: 0 }
    }

    fn codec_transformer_layer(
        &self,
        shape: &CodecAttentionShape,
        w: &TransformerLayer<GpuWeight>,
        rope: &[f32],
        x: &GpuMatrix,
        kv: &mut GpuKvWindow,
    ) -> GpuMatrix {
        transformer::layer(self, shape, w, &[rope], x, &[x.rows], &mut [kv])
    }

    fn codec_rms_norm(&self, weight: &GpuWeight, eps: f32, x: &GpuMatrix) -> GpuMatrix {
        transformer::rms_norm(self, weight, eps, x)
    }

    fn codec_causal_conv(
        &self,
        conv: &CausalConv<GpuWeight>,
        snake: Option<&GpuWeight>,
        x: &GpuMatrix,
        history: &mut GpuConvHistory,
    ) -> GpuMatrix {
        conv::causal_conv(self, conv, snake, x, &[x.rows], &mut [history])
    }

    fn codec_residual_unit(
        &self,
        w: &ResidualUnitParams<GpuWeight>,
        x: &GpuMatrix,
        history: &mut GpuConvHistory,
    ) -> GpuMatrix {
        conv::residual_unit(self, w, x, &[x.rows], &mut [history])
    }
}

impl CodecOps for Cuda {
    fn codec_rvq(&self, books: &[RvqCodebook<GpuWeight>], codes: &[u32]) -> GpuMatrix {
        transformer::rvq(self, books, codes)
    }

    fn codec_upsample_stage(
        &self,
        w: &UpsampleStage<GpuWeight>,
        x: &GpuMatrix,
        dw_history: &mut GpuConvHistory,
    ) -> GpuMatrix {
        conv::upsample_stage(self, w, x, &[x.rows], &mut [dw_history])
    }

    fn codec_decoder_upsample(
        &self,
        w: &DecoderUpsample<GpuWeight>,
        x: &GpuMatrix,
        history: &mut GpuConvHistory,
    ) -> GpuMatrix {
        conv::decoder_upsample(self, w, x, &[x.rows], &mut [history])
    }

    fn codec_tanh_pcm(&self, x: &GpuMatrix) -> Vec<f32> {
        conv::tanh_pcm(self, x)
    }

    // Several streams: one launch per stage for all of them (their windows stacked).

    fn codec_transformer_layer_rows(
        &self,
        shape: &CodecAttentionShape,
        w: &TransformerLayer<GpuWeight>,
        ropes: &[Vec<f32>],
        x: &GpuMatrix,
        rows: &[usize],
        kvs: &mut [&mut GpuKvWindow],
    ) -> GpuMatrix {
        let ropes: Vec<&[f32]> = ropes.iter().map(Vec::as_slice).collect();
        transformer::layer(self, shape, w, &ropes, x, rows, kvs)
    }

    fn codec_upsample_stage_rows(
        &self,
        w: &UpsampleStage<GpuWeight>,
        x: &GpuMatrix,
        rows: &[usize],
        dw_histories: &mut [&mut GpuConvHistory],
    ) -> GpuMatrix {
        conv::upsample_stage(self, w, x, rows, dw_histories)
    }

    fn codec_causal_conv_rows(
        &self,
        conv: &CausalConv<GpuWeight>,
        snake: Option<&GpuWeight>,
        x: &GpuMatrix,
        rows: &[usize],
        histories: &mut [&mut GpuConvHistory],
    ) -> GpuMatrix {
        conv::causal_conv(self, conv, snake, x, rows, histories)
    }

    fn codec_decoder_upsample_rows(
        &self,
        w: &DecoderUpsample<GpuWeight>,
        x: &GpuMatrix,
        rows: &[usize],
        histories: &mut [&mut GpuConvHistory],
    ) -> GpuMatrix {
        conv::decoder_upsample(self, w, x, rows, histories)
    }

    fn codec_residual_unit_rows(
        &self,
        w: &ResidualUnitParams<GpuWeight>,
        x: &GpuMatrix,
        rows: &[usize],
        histories: &mut [&mut GpuConvHistory],
    ) -> GpuMatrix {
        conv::residual_unit(self, w, x, rows, histories)
    }
}
