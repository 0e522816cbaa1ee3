//! The CPU implementation of [`CodecOps`] (`codec.md` §1–2), one file per stage: RVQ lookup
//! (here), the post_module transformer, the quantizer upsample stages, the DAC decoder's convs;
//! and of [`CodecEncodeOps`] (`codec.md` §5.3, the encoder's strided convs, downsample stages and
//! quantizers).
//! Products are exact f32 × f32 and sums f64, rounded once per output; element-wise steps
//! follow the reference's f32 order. Scratch is NaN-poisoned before use.

mod conv;
mod encode;
mod math;
mod transformer;
mod upsample;

use super::{Cpu, CpuWeight, Matrix};
use crate::backend::codec::{
    CausalConv, CodecAttentionShape, CodecLayerOps, CodecOps, DecoderUpsample, ResidualUnitParams, RvqCodebook,
    UpsampleStage,
};
use crate::backend::codec_encode::{CodecEncodeOps, DownsampleStage, StridedConv, VqEncoder};
use crate::model::weights::TransformerLayer;
use math::{dot, poisoned};

/// The last inputs of a causal conv: a fixed number of rows, zeros at the start of a stream.
#[derive(Clone, Debug, PartialEq)]
pub struct ConvHistory {
    pub rows: Matrix,
}

/// Post-RoPE keys and values of the last `window − 1` frames: rows `0..len` are valid, the
/// rest NaN (so reading past `len` poisons the output).
#[derive(Clone, Debug, PartialEq)]
pub struct KvWindow {
    pub keys: Matrix,
    pub values: Matrix,
    pub len: usize,
}

impl CodecLayerOps for Cpu {
    type ConvHistory = ConvHistory;
    type KvWindow = KvWindow;

    fn new_conv_history(&self, rows: usize, channels: usize) -> ConvHistory {
        ConvHistory { rows: Matrix::zeros(rows, channels) }
    }

    fn new_kv_window(&self, shape: &CodecAttentionShape) -> KvWindow {
        let (rows, width) = (shape.window - 1, shape.heads * shape.head_dim);
        KvWindow { keys: poisoned(rows, width), values: poisoned(rows, width), len: 0 }
    }

    fn codec_transformer_layer(
        &self,
        shape: &CodecAttentionShape,
        w: &TransformerLayer<CpuWeight>,
        rope: &[f32],
        x: &Matrix,
        kv: &mut KvWindow,
    ) -> Matrix {
        transformer::transformer_layer(shape, w, rope, x, kv)
    }

    fn codec_rms_norm(&self, weight: &CpuWeight, eps: f32, x: &Matrix) -> Matrix {
        transformer::rms_norm(weight, eps, x)
    }

    fn codec_causal_conv(
        &self,
        conv: &CausalConv<CpuWeight>,
        snake: Option<&CpuWeight>,
        x: &Matrix,
        history: &mut ConvHistory,
    ) -> Matrix {
        conv::causal_conv(conv, snake, x, history)
    }

    fn codec_residual_unit(&self, w: &ResidualUnitParams<CpuWeight>, x: &Matrix, history: &mut ConvHistory) -> Matrix {
        conv::residual_unit(w, x, history)
    }
}

impl CodecOps for Cpu {
    fn codec_rvq(&self, books: &[RvqCodebook<CpuWeight>], codes: &[u32]) -> Matrix {
        assert!(!books.is_empty() && codes.len().is_multiple_of(books.len()), "codes are whole frames");
        let latent = books[0].proj.shape[0];
        let frames = codes.len() / books.len();
        let project = |book: &RvqCodebook<CpuWeight>, code: u32, o: usize| -> f32 {
            let entry = book.codebook.row(code as usize);
            (f64::from(book.bias.data[o]) + dot(book.proj.row(o), entry)) as f32
        };
        let mut z = poisoned(frames, latent);
        for t in 0..frames {
            let frame = &codes[t * books.len()..(t + 1) * books.len()];
            for (o, v) in z.row_mut(t).iter_mut().enumerate() {
                // The residual sum starts from its first codebook (`0.0 + q₁` is exact).
                let mut residual = 0.0f32;
                for (i, (book, &code)) in books.iter().zip(frame).enumerate().skip(1) {
                    let q = project(book, code, o);
                    residual = if i == 1 { q } else { residual + q };
                }
                *v = project(&books[0], frame[0], o) + residual;
            }
        }
        z
    }

    fn codec_upsample_stage(&self, w: &UpsampleStage<CpuWeight>, x: &Matrix, dw_history: &mut ConvHistory) -> Matrix {
        upsample::upsample_stage(w, x, dw_history)
    }

    fn codec_decoder_upsample(&self, w: &DecoderUpsample<CpuWeight>, x: &Matrix, history: &mut ConvHistory) -> Matrix {
        conv::decoder_upsample(w, x, history)
    }

    fn codec_tanh_pcm(&self, x: &Matrix) -> Vec<f32> {
        assert_eq!(x.cols, 1, "PCM has one channel");
        x.data.iter().map(|v| v.tanh()).collect()
    }
}

impl CodecEncodeOps for Cpu {
    fn codec_samples(&self, samples: &[f32]) -> Matrix {
        Matrix::from_vec(samples.len(), 1, samples.to_vec())
    }

    fn codec_strided_conv(&self, conv: &StridedConv<CpuWeight>, snake: Option<&CpuWeight>, x: &Matrix) -> Matrix {
        encode::strided_conv(conv, snake, x)
    }

    fn codec_downsample_stage(&self, w: &DownsampleStage<CpuWeight>, x: &Matrix) -> Matrix {
        encode::downsample_stage(w, x)
    }

    fn codec_quantize(&self, quantizers: &[&VqEncoder<CpuWeight>], z: &Matrix) -> Vec<u32> {
        encode::quantize(quantizers, z)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::codec::rope::{inverse_frequencies, rope_rows};

    fn weight(shape: &[usize], seed: u32) -> CpuWeight {
        let n = shape.iter().product::<usize>();
        let data = (0..n).map(|i| ((i as f32 + 1.0) * 0.618 + seed as f32 * 0.377).sin() * 0.5).collect();
        CpuWeight { shape: shape.to_vec(), data }
    }

    /// A window of 3 frames: chunked calls see exactly the keys a whole call sees, and the
    /// carried window keeps 2 rows with NaN beyond them.
    #[test]
    fn transformer_layer_is_chunk_invariant_and_keeps_a_poisoned_window() {
        let shape = CodecAttentionShape { heads: 2, head_dim: 4, window: 3, norm_eps: 1e-5 };
        let (d, inter) = (8, 12);
        let w = TransformerLayer {
            attention_norm: weight(&[d], 1),
            wqkv: weight(&[3 * d, d], 2),
            wo: weight(&[d, d], 3),
            attention_layer_scale: weight(&[d], 4),
            ffn_norm: weight(&[d], 5),
            w1: weight(&[inter, d], 6),
            w3: weight(&[inter, d], 7),
            w2: weight(&[d, inter], 8),
            ffn_layer_scale: weight(&[d], 9),
        };
        let frames = 7;
        let x = Matrix::from_vec(frames, d, weight(&[frames, d], 10).data);
        let inv = inverse_frequencies(shape.head_dim);
        let mut kv = Cpu.new_kv_window(&shape);
        assert!(kv.keys.data.iter().all(|v| v.is_nan()));
        let whole = Cpu.codec_transformer_layer(&shape, &w, &rope_rows(&inv, 0, frames), &x, &mut kv);
        let mut kv = Cpu.new_kv_window(&shape);
        let mut chunked = Vec::new();
        let mut at = 0;
        for n in [1, 2, 4] {
            let part = Matrix::from_vec(n, d, x.data[at * d..(at + n) * d].to_vec());
            let y = Cpu.codec_transformer_layer(&shape, &w, &rope_rows(&inv, at, n), &part, &mut kv);
            chunked.extend(y.data);
            at += n;
            assert_eq!(kv.len, at.min(shape.window - 1));
            assert!(kv.keys.data[kv.len * d..].iter().chain(&kv.values.data[kv.len * d..]).all(|v| v.is_nan()));
        }
        assert!(whole.data.iter().all(|v| v.is_finite()));
        assert!(whole.data.iter().zip(&chunked).all(|(a, b)| a.to_bits() == b.to_bits()));
        // The window holds the last two frames' keys; a query never reaches further back.
        assert_eq!(kv.keys.rows, 2);
        let later = Matrix::from_vec(1, d, x.data[..d].to_vec());
        let y = Cpu.codec_transformer_layer(&shape, &w, &rope_rows(&inv, frames, 1), &later, &mut kv);
        assert!(y.data.iter().all(|v| v.is_finite()));
    }

    #[test]
    fn a_fresh_conv_history_is_the_zero_padding() {
        let h = Cpu.new_conv_history(6, 3);
        assert_eq!((h.rows.rows, h.rows.cols), (6, 3));
        assert!(h.rows.data.iter().all(|&v| v == 0.0));
    }
}
