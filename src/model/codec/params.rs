//! Codec decode weights as the backend computes with them (`codec.md` §1.2–1.6): weight norm
//! folded in f32 at load (`w = g · v / ‖v‖`, the norm over all dims but 0 — for a transposed conv
//! dim 0 is the INPUT channel), convs re-laid tap-major, Snake α flattened; each tensor is then
//! made resident through `CodecOps::codec_weight` (the CUDA backend rounds it to f16 there).
//! Tensor names come only from `model::weights::codec` through `Checkpoint::codec_weights`.

use super::CodecError;
use crate::backend::codec::{
    CausalConv, CausalConvTranspose, CodecOps, ConvNext, DecoderUpsample, ResidualUnitParams, RvqCodebook,
    UpsampleStage,
};
use crate::checkpoint::pth::PthArchive;
use crate::model::load::{Checkpoint, CodecTensor};
use crate::model::weights::codec::{DECODER_RATES, RESIDUAL_DILATIONS};
use crate::model::weights::{ConvNeXt, ResampleStage, ResidualUnit, TransformerLayer, Vq, WeightError, WnConv};

/// A decoder block: Snake + transposed conv, then the residual units (d = 1, 3, 9).
pub struct DecoderBlockParams<W> {
    pub upsample: DecoderUpsample<W>,
    pub units: Vec<ResidualUnitParams<W>>,
}

/// Every weight on the decode path, resident on the backend.
pub struct CodecParams<W> {
    /// Semantic codebook first, then the residual codebooks in order.
    pub books: Vec<RvqCodebook<W>>,
    pub post_layers: Vec<TransformerLayer<W>>,
    pub post_norm: W,
    pub upsample: Vec<UpsampleStage<W>>,
    pub conv_in: CausalConv<W>,
    pub blocks: Vec<DecoderBlockParams<W>>,
    pub out_snake: W,
    pub conv_out: CausalConv<W>,
}

/// `w = v · (g / ‖v‖)` per slice of dim 0, in f32 (the norm summed in f64, then rounded).
pub fn fold_weight_norm(g: &[f32], v: &[f32]) -> Vec<f32> {
    let per = v.len() / g.len();
    let mut w = Vec::with_capacity(v.len());
    for (row, &gain) in v.chunks_exact(per).zip(g) {
        let norm = row.iter().map(|&x| f64::from(x) * f64::from(x)).sum::<f64>().sqrt() as f32;
        let scale = gain / norm;
        w.extend(row.iter().map(|&x| x * scale));
    }
    w
}

/// Permutes a row-major `[a, b, c]` tensor: output axis `n` is input axis `order[n]`.
pub(super) fn permute3(x: &[f32], [a, b, c]: [usize; 3], order: [usize; 3]) -> (Vec<f32>, [usize; 3]) {
    let dims = [a, b, c];
    let shape = [dims[order[0]], dims[order[1]], dims[order[2]]];
    let mut out = vec![0.0; x.len()];
    for i in 0..a {
        for j in 0..b {
            for k in 0..c {
                let idx = [i, j, k];
                let (p, q, r) = (idx[order[0]], idx[order[1]], idx[order[2]]);
                out[(p * shape[1] + q) * shape[2] + r] = x[(i * b + j) * c + k];
            }
        }
    }
    (out, shape)
}

/// Walks codec tensors, hands each prepared tensor (shape, f32 values) to `place`.
pub(super) struct Reader<'a, W> {
    pub(super) archive: &'a PthArchive,
    pub(super) place: &'a dyn Fn(&[usize], Vec<f32>) -> W,
}

impl<W> Reader<'_, W> {
    /// A tensor's values, refusing a NaN or an infinity (issue 16, finding 8) by file and name.
    pub(super) fn values(&self, t: &CodecTensor<'_>) -> Result<(Vec<f32>, Vec<usize>), CodecError> {
        let values = self.archive.to_f32_vec(&t.name)?;
        if let Some(index) = values.iter().position(|v| !v.is_finite()) {
            let file = self.archive.path().display().to_string();
            return Err(WeightError::NonFinite { file, tensor: t.name.clone(), index }.into());
        }
        Ok((values, t.tensor.shape.clone()))
    }

    pub(super) fn plain(&self, t: &CodecTensor<'_>) -> Result<W, CodecError> {
        let (data, shape) = self.values(t)?;
        Ok((self.place)(&shape, data))
    }

    /// A per-channel vector stored `[1, C, 1]` (Snake α) or `[C]`, as `[C]`.
    pub(super) fn vector(&self, t: &CodecTensor<'_>) -> Result<W, CodecError> {
        let (data, _) = self.values(t)?;
        Ok((self.place)(&[data.len()], data))
    }

    pub(super) fn folded(&self, wn: &WnConv<CodecTensor<'_>>) -> Result<(Vec<f32>, [usize; 3]), CodecError> {
        let (g, _) = self.values(&wn.g)?;
        let (v, shape) = self.values(&wn.v)?;
        Ok((fold_weight_norm(&g, &v), [shape[0], shape[1], shape[2]]))
    }

    /// A weight-normed `Conv1d` `[out, in, k]` as `[out, k, in]`.
    pub(super) fn conv(&self, wn: &WnConv<CodecTensor<'_>>, dilation: usize) -> Result<CausalConv<W>, CodecError> {
        let (w, shape) = self.folded(wn)?;
        let (w, tap_major) = permute3(&w, shape, [0, 2, 1]);
        Ok(CausalConv { weight: (self.place)(&tap_major, w), bias: self.plain(&wn.bias)?, kernel: shape[2], dilation })
    }

    /// A weight-normed `ConvTranspose1d` `[in, out, 2s]` as `[2s, out, in]`.
    fn conv_transpose(
        &self,
        wn: &WnConv<CodecTensor<'_>>,
        stride: usize,
    ) -> Result<CausalConvTranspose<W>, CodecError> {
        let (w, shape) = self.folded(wn)?;
        let (w, tap_major) = permute3(&w, shape, [2, 1, 0]);
        Ok(CausalConvTranspose { weight: (self.place)(&tap_major, w), bias: self.plain(&wn.bias)?, stride })
    }

    fn codebook(&self, vq: &Vq<CodecTensor<'_>>) -> Result<RvqCodebook<W>, CodecError> {
        let (w, shape) = self.folded(&vq.out_proj)?;
        Ok(RvqCodebook {
            codebook: self.plain(&vq.codebook)?,
            proj: (self.place)(&shape[..2], w),
            bias: self.plain(&vq.out_proj.bias)?,
        })
    }

    pub(super) fn layer(&self, l: &TransformerLayer<CodecTensor<'_>>) -> Result<TransformerLayer<W>, CodecError> {
        Ok(TransformerLayer {
            attention_norm: self.plain(&l.attention_norm)?,
            wqkv: self.plain(&l.wqkv)?,
            wo: self.plain(&l.wo)?,
            attention_layer_scale: self.plain(&l.attention_layer_scale)?,
            ffn_norm: self.plain(&l.ffn_norm)?,
            w1: self.plain(&l.w1)?,
            w3: self.plain(&l.w3)?,
            w2: self.plain(&l.w2)?,
            ffn_layer_scale: self.plain(&l.ffn_layer_scale)?,
        })
    }

    fn upsample(&self, s: &ResampleStage<CodecTensor<'_>>) -> Result<UpsampleStage<W>, CodecError> {
        let (w, shape) = self.values(&s.conv_weight)?;
        let (w, tap_major) = permute3(&w, [shape[0], shape[1], shape[2]], [2, 1, 0]);
        Ok(UpsampleStage {
            conv_weight: (self.place)(&tap_major, w),
            conv_bias: self.plain(&s.conv_bias)?,
            convnext: self.convnext(&s.convnext)?,
        })
    }

    /// A ConvNeXt block, its depthwise `Conv1d` `[C, 1, k]` as `[k, C]`.
    pub(super) fn convnext(&self, c: &ConvNeXt<CodecTensor<'_>>) -> Result<ConvNext<W>, CodecError> {
        let (dw, dw_shape) = self.values(&c.dwconv_weight)?;
        let (dw, dw_tap_major) = permute3(&dw, [dw_shape[0], dw_shape[1], dw_shape[2]], [2, 0, 1]);
        Ok(ConvNext {
            dw_weight: (self.place)(&dw_tap_major[..2], dw),
            dw_bias: self.plain(&c.dwconv_bias)?,
            norm_weight: self.plain(&c.norm_weight)?,
            norm_bias: self.plain(&c.norm_bias)?,
            pw1_weight: self.plain(&c.pwconv1_weight)?,
            pw1_bias: self.plain(&c.pwconv1_bias)?,
            pw2_weight: self.plain(&c.pwconv2_weight)?,
            pw2_bias: self.plain(&c.pwconv2_bias)?,
            gamma: self.plain(&c.gamma)?,
        })
    }

    pub(super) fn residual_unit(
        &self,
        u: &ResidualUnit<CodecTensor<'_>>,
        d: usize,
    ) -> Result<ResidualUnitParams<W>, CodecError> {
        Ok(ResidualUnitParams {
            snake1: self.vector(&u.snake1_alpha)?,
            conv1: self.conv(&u.conv1, d)?,
            snake2: self.vector(&u.snake2_alpha)?,
            conv2: self.conv(&u.conv2, 1)?,
        })
    }
}

/// Reads, folds and uploads every decode-path weight of the checkpoint's codec.
pub fn load_params<B: CodecOps>(ckpt: &Checkpoint, backend: &B) -> Result<CodecParams<B::Weight>, CodecError> {
    read_params(ckpt, &|shape: &[usize], data| backend.codec_weight(shape, data))
}

/// A decode-path tensor prepared on the host (read, folded, laid out), not yet resident.
pub struct HostTensor {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

/// Every decode-path weight prepared on the host: the slow part of loading the codec (reading
/// `codec.pth`, folding weight norm), with no backend involved, so it can run on its own thread
/// while the backbone uploads. [`upload_params`] makes it resident.
pub fn host_params(ckpt: &Checkpoint) -> Result<CodecParams<HostTensor>, CodecError> {
    read_params(ckpt, &|shape: &[usize], data| HostTensor { shape: shape.to_vec(), data })
}

/// Makes a host image resident on `backend`, tensor by tensor (as [`load_params`] would have).
pub fn upload_params<B: CodecOps>(backend: &B, host: CodecParams<HostTensor>) -> CodecParams<B::Weight> {
    host.map(&mut |t| backend.codec_weight(&t.shape, t.data))
}

fn read_params<W>(ckpt: &Checkpoint, place: &dyn Fn(&[usize], Vec<f32>) -> W) -> Result<CodecParams<W>, CodecError> {
    let w = ckpt.codec_weights()?;
    let r = Reader { archive: &ckpt.codec, place };
    let books =
        std::iter::once(&w.semantic_vq).chain(&w.residual_vqs).map(|vq| r.codebook(vq)).collect::<Result<_, _>>()?;
    let post_layers = w.post_module.layers.iter().map(|l| r.layer(l)).collect::<Result<_, _>>()?;
    let upsample = w.upsample.iter().map(|s| r.upsample(s)).collect::<Result<_, _>>()?;
    let mut blocks = Vec::new();
    for (b, &stride) in w.decoder_blocks.iter().zip(&DECODER_RATES) {
        let units = b
            .residual_units
            .iter()
            .zip(RESIDUAL_DILATIONS)
            .map(|(u, d)| r.residual_unit(u, d))
            .collect::<Result<_, _>>()?;
        let upsample =
            DecoderUpsample { snake: r.vector(&b.snake_alpha)?, conv: r.conv_transpose(&b.upsample, stride)? };
        blocks.push(DecoderBlockParams { upsample, units });
    }
    Ok(CodecParams {
        books,
        post_layers,
        post_norm: r.plain(&w.post_module.norm)?,
        upsample,
        conv_in: r.conv(&w.decoder_conv_in, 1)?,
        blocks,
        out_snake: r.vector(&w.decoder_snake_alpha)?,
        conv_out: r.conv(&w.decoder_conv_out, 1)?,
    })
}

impl<W> CodecParams<W> {
    /// The same parameters with every weight passed through `f`, in one fixed order.
    pub fn map<V>(self, f: &mut impl FnMut(W) -> V) -> CodecParams<V> {
        let conv = |c: CausalConv<W>, f: &mut dyn FnMut(W) -> V| CausalConv {
            weight: f(c.weight),
            bias: f(c.bias),
            kernel: c.kernel,
            dilation: c.dilation,
        };
        let mut f = |w: W| f(w);
        CodecParams {
            books: self
                .books
                .into_iter()
                .map(|b| RvqCodebook { codebook: f(b.codebook), proj: f(b.proj), bias: f(b.bias) })
                .collect(),
            post_layers: self
                .post_layers
                .into_iter()
                .map(|l| TransformerLayer {
                    attention_norm: f(l.attention_norm),
                    wqkv: f(l.wqkv),
                    wo: f(l.wo),
                    attention_layer_scale: f(l.attention_layer_scale),
                    ffn_norm: f(l.ffn_norm),
                    w1: f(l.w1),
                    w3: f(l.w3),
                    w2: f(l.w2),
                    ffn_layer_scale: f(l.ffn_layer_scale),
                })
                .collect(),
            post_norm: f(self.post_norm),
            upsample: self
                .upsample
                .into_iter()
                .map(|u| UpsampleStage {
                    conv_weight: f(u.conv_weight),
                    conv_bias: f(u.conv_bias),
                    convnext: ConvNext {
                        dw_weight: f(u.convnext.dw_weight),
                        dw_bias: f(u.convnext.dw_bias),
                        norm_weight: f(u.convnext.norm_weight),
                        norm_bias: f(u.convnext.norm_bias),
                        pw1_weight: f(u.convnext.pw1_weight),
                        pw1_bias: f(u.convnext.pw1_bias),
                        pw2_weight: f(u.convnext.pw2_weight),
                        pw2_bias: f(u.convnext.pw2_bias),
                        gamma: f(u.convnext.gamma),
                    },
                })
                .collect(),
            conv_in: conv(self.conv_in, &mut f),
            blocks: self
                .blocks
                .into_iter()
                .map(|b| DecoderBlockParams {
                    upsample: DecoderUpsample {
                        snake: f(b.upsample.snake),
                        conv: CausalConvTranspose {
                            weight: f(b.upsample.conv.weight),
                            bias: f(b.upsample.conv.bias),
                            stride: b.upsample.conv.stride,
                        },
                    },
                    units: b
                        .units
                        .into_iter()
                        .map(|u| ResidualUnitParams {
                            snake1: f(u.snake1),
                            conv1: conv(u.conv1, &mut f),
                            snake2: f(u.snake2),
                            conv2: conv(u.conv2, &mut f),
                        })
                        .collect(),
                })
                .collect(),
            out_snake: f(self.out_snake),
            conv_out: conv(self.conv_out, &mut f),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::backend::cpu::{Cpu, CpuWeight};

    /// A tiny random checkpoint (the folder lives as long as the checkpoint is used).
    fn tiny_checkpoint(seed: u64) -> (tempfile::TempDir, Checkpoint) {
        let dir = tempfile::tempdir().unwrap();
        let options =
            crate::synth::SynthOptions { preset: crate::synth::presets::Preset::Tiny, seed, vq_backbone_codebooks: 1 };
        crate::synth::SynthPlan::new(&options).write(dir.path()).unwrap();
        let ckpt = Checkpoint::open(dir.path()).unwrap();
        (dir, ckpt)
    }

    /// Every weight's shape and bits, in the order a parameter map visits them.
    fn flat(map: impl FnOnce(&mut dyn FnMut(CpuWeight))) -> Vec<(Vec<usize>, Vec<u32>)> {
        let mut all = Vec::new();
        map(&mut |w: CpuWeight| all.push((w.shape, w.data.iter().map(|v| v.to_bits()).collect())));
        all
    }

    /// The two-phase load (host image on another thread, then upload) gives the very weights, in
    /// the very order, that the direct load gives.
    #[test]
    fn the_host_image_uploads_to_the_same_weights() {
        let (_dir, ckpt) = tiny_checkpoint(5);
        let direct = flat(|f| drop(load_params(&ckpt, &Cpu).unwrap().map(&mut |w| f(w))));
        let staged = flat(|f| drop(upload_params(&Cpu, host_params(&ckpt).unwrap()).map(&mut |w| f(w))));
        assert!(direct.len() > 100, "{} tensors", direct.len());
        assert!(direct == staged, "the staged load differs from the direct one");
    }

    /// The same for the encoder's weights (`encode::host_params`, `CodecEncoder::from_host`).
    #[test]
    fn the_encoders_host_image_uploads_to_the_same_weights() {
        use super::super::encode::{CodecEncoder, host_params as encoder_host_params};
        let (_dir, ckpt) = tiny_checkpoint(6);
        let direct = flat(|f| drop(CodecEncoder::load(&ckpt, &Cpu).unwrap().params.map(&mut |w| f(w))));
        let staged = flat(|f| {
            drop(CodecEncoder::from_host(&ckpt, &Cpu, encoder_host_params(&ckpt).unwrap()).params.map(&mut |w| f(w)))
        });
        assert!(direct.len() > 100, "{} tensors", direct.len());
        assert!(direct == staged, "the staged load differs from the direct one");
    }

    #[test]
    fn weight_norm_rows_get_norm_g() {
        let v = [3.0, 4.0, 0.0, 1.0, 0.0, 0.0];
        let w = fold_weight_norm(&[2.0, 0.5], &v);
        assert_eq!(w, vec![1.2, 1.6, 0.0, 0.5, 0.0, 0.0]);
    }

    #[test]
    fn permutes_to_tap_major() {
        // [out=1, in=2, k=3] -> [out, k, in]
        let x = [0.0, 1.0, 2.0, 10.0, 11.0, 12.0];
        let (y, shape) = permute3(&x, [1, 2, 3], [0, 2, 1]);
        assert_eq!(shape, [1, 3, 2]);
        assert_eq!(y, vec![0.0, 10.0, 1.0, 11.0, 2.0, 12.0]);
        // [in=2, out=1, k=3] -> [k, out, in]
        let (y, shape) = permute3(&x, [2, 1, 3], [2, 1, 0]);
        assert_eq!(shape, [3, 1, 2]);
        assert_eq!(y, vec![0.0, 10.0, 1.0, 11.0, 2.0, 12.0]);
    }
}
