//! Frame-by-frame decoding (`codec.md` §2): every stage is causal, so a decoder that carries
//! exactly each stage's past — per transformer layer the keys/values of the last 127 frames, per
//! causal conv its last `(k−1)·d` inputs, per transposed conv its previous input — produces the
//! whole decode's samples bit for bit, however the frames are grouped.

use super::rope::{ROPE_POSITIONS, inverse_frequencies, rope_rows};
use super::{CodecError, CodecModel, clamp_codes};
use crate::backend::codec::{CausalConv, CodecOps};
use crate::model::weights::codec::CONV_KERNEL;

/// The outputs of each stage for the frames of one call.
pub struct DecodeTrace<A> {
    /// RVQ sum (post_module input) `[frames, latent]`.
    pub rvq: A,
    pub post_module: A,
    /// After both upsample stages `[4·frames, latent]`.
    pub upsample: A,
    /// The final conv's output before tanh `[2048·frames, 1]`.
    pub pre_tanh: A,
}

/// Samples and stage outputs of one call.
type Decoded<A> = (Vec<f32>, DecodeTrace<A>);

struct BlockState<B: CodecOps> {
    upsample: B::ConvHistory,
    units: Vec<B::ConvHistory>,
}

/// Decodes frames as they come; the concatenated outputs equal [`CodecModel::decode`] of all
/// frames, bit for bit.
pub struct StreamingDecoder<'m, B: CodecOps> {
    model: &'m CodecModel<B>,
    backend: &'m B,
    inv_freq: Vec<f32>,
    frames: usize,
    kv: Vec<B::KvWindow>,
    upsample: Vec<B::ConvHistory>,
    conv_in: B::ConvHistory,
    blocks: Vec<BlockState<B>>,
    conv_out: B::ConvHistory,
}

impl<'m, B: CodecOps> StreamingDecoder<'m, B> {
    /// A decoder at the start of an utterance (frame position 0, zero conv histories).
    pub fn new(model: &'m CodecModel<B>, backend: &'m B) -> StreamingDecoder<'m, B> {
        let (p, d) = (&model.params, &model.dims);
        let shape = model.attention_shape();
        let history =
            |conv: &CausalConv<B::Weight>, channels: usize| backend.new_conv_history(conv.history(), channels);
        let mut channels = d.decoder_dim;
        let blocks = p
            .blocks
            .iter()
            .map(|b| {
                let state = BlockState {
                    upsample: backend.new_conv_history(1, channels),
                    units: b.units.iter().map(|u| history(&u.conv1, channels / 2)).collect(),
                };
                channels /= 2;
                state
            })
            .collect();
        StreamingDecoder {
            model,
            backend,
            inv_freq: inverse_frequencies(shape.head_dim),
            frames: 0,
            kv: p.post_layers.iter().map(|_| backend.new_kv_window(&shape)).collect(),
            upsample: p.upsample.iter().map(|_| backend.new_conv_history(CONV_KERNEL - 1, d.latent)).collect(),
            conv_in: history(&p.conv_in, d.latent),
            blocks,
            conv_out: history(&p.conv_out, channels),
        }
    }

    /// Frames decoded so far (the absolute position of the next frame).
    pub fn frames(&self) -> usize {
        self.frames
    }

    /// Decodes the next frames (`codes` row-major `[n, codes_per_frame]`, any `n`) into
    /// `2048 · n` samples.
    pub fn push(&mut self, codes: &[u32]) -> Result<Vec<f32>, CodecError> {
        Ok(self.run(codes)?.map(|(pcm, _)| pcm).unwrap_or_default())
    }

    /// [`Self::push`], also returning each stage's output for these frames (at least one).
    pub fn push_traced(&mut self, codes: &[u32]) -> Result<(Vec<f32>, DecodeTrace<B::Act>), CodecError> {
        self.run(codes)?.ok_or(CodecError::Empty)
    }

    /// Decodes the next frames of several streams together (the decode batch's ready groups):
    /// `codes[s]` continues `decoders[s]`, all of one model. The stages stack the streams' rows,
    /// so each stage is one backend call for all of them (`CodecOps::*_rows`), and each stream's
    /// samples equal what [`Self::push`] would give it, bit for bit. A stream whose codes are
    /// malformed gets its error; the others decode.
    pub fn push_many(
        decoders: &mut [&mut StreamingDecoder<'m, B>],
        codes: &[&[u32]],
    ) -> Vec<Result<Vec<f32>, CodecError>> {
        assert_eq!(decoders.len(), codes.len(), "one code list per decoder");
        let mut results: Vec<Result<Vec<f32>, CodecError>> = Vec::with_capacity(codes.len());
        // Streams that decode: their index and frames.
        let mut live: Vec<(usize, usize)> = Vec::new();
        for (i, (d, c)) in decoders.iter().zip(codes).enumerate() {
            results.push(d.check(c).map(|n| {
                if n > 0 {
                    live.push((i, n));
                }
                Vec::new()
            }));
        }
        let Some(&(first, _)) = live.first() else { return results };
        let (model, b) = (decoders[first].model, decoders[first].backend);
        let p = &model.params;
        let mut stacked: Vec<u32> = Vec::new();
        for &(i, _) in &live {
            assert!(std::ptr::eq(decoders[i].model, model), "push_many: decoders of one model");
            stacked.extend_from_slice(codes[i]);
        }
        clamp_codes(&model.dims, &mut stacked);
        let mut rows: Vec<usize> = live.iter().map(|&(_, n)| n).collect();
        let mut is_live = vec![false; decoders.len()];
        for &(i, _) in &live {
            is_live[i] = true;
        }
        let mut states: Vec<&mut StreamingDecoder<'m, B>> =
            decoders.iter_mut().zip(&is_live).filter(|(_, live)| **live).map(|(d, _)| &mut **d).collect();

        let shape = model.attention_shape();
        let ropes: Vec<Vec<f32>> =
            states.iter().zip(&rows).map(|(d, &n)| rope_rows(&d.inv_freq, d.frames, n)).collect();
        let mut x = b.codec_rvq(&p.books, &stacked);
        for (l, layer) in p.post_layers.iter().enumerate() {
            let mut kvs: Vec<&mut B::KvWindow> = states.iter_mut().map(|d| &mut d.kv[l]).collect();
            x = b.codec_transformer_layer_rows(&shape, layer, &ropes, &x, &rows, &mut kvs);
        }
        x = b.codec_rms_norm(&p.post_norm, shape.norm_eps, &x);
        for (k, stage) in p.upsample.iter().enumerate() {
            let mut histories: Vec<&mut B::ConvHistory> = states.iter_mut().map(|d| &mut d.upsample[k]).collect();
            x = b.codec_upsample_stage_rows(stage, &x, &rows, &mut histories);
            rows.iter_mut().for_each(|n| *n *= 2);
        }
        let mut histories: Vec<&mut B::ConvHistory> = states.iter_mut().map(|d| &mut d.conv_in).collect();
        x = b.codec_causal_conv_rows(&p.conv_in, None, &x, &rows, &mut histories);
        for (k, block) in p.blocks.iter().enumerate() {
            let mut histories: Vec<&mut B::ConvHistory> =
                states.iter_mut().map(|d| &mut d.blocks[k].upsample).collect();
            x = b.codec_decoder_upsample_rows(&block.upsample, &x, &rows, &mut histories);
            rows.iter_mut().for_each(|n| *n *= block.upsample.conv.stride);
            for (u, unit) in block.units.iter().enumerate() {
                let mut histories: Vec<&mut B::ConvHistory> =
                    states.iter_mut().map(|d| &mut d.blocks[k].units[u]).collect();
                x = b.codec_residual_unit_rows(unit, &x, &rows, &mut histories);
            }
        }
        let mut histories: Vec<&mut B::ConvHistory> = states.iter_mut().map(|d| &mut d.conv_out).collect();
        let pre_tanh = b.codec_causal_conv_rows(&p.conv_out, Some(&p.out_snake), &x, &rows, &mut histories);
        let pcm = b.codec_tanh_pcm(&pre_tanh);
        // One channel: a stream's samples are its final rows.
        let mut start = 0;
        for ((&(i, n), &samples), d) in live.iter().zip(&rows).zip(states.iter_mut()) {
            d.frames += n;
            results[i] = Ok(pcm[start..start + samples].to_vec());
            start += samples;
        }
        debug_assert_eq!(start, pcm.len(), "every sample belongs to a stream");
        results
    }

    /// The frames in `codes`, if they are whole frames that fit the positions left.
    fn check(&self, codes: &[u32]) -> Result<usize, CodecError> {
        let width = self.model.codes_per_frame();
        if !codes.len().is_multiple_of(width) {
            return Err(CodecError::Codes { len: codes.len(), width });
        }
        let n = codes.len() / width;
        if self.frames + n > ROPE_POSITIONS {
            return Err(CodecError::TooLong { frames: self.frames + n, max: ROPE_POSITIONS });
        }
        Ok(n)
    }

    fn run(&mut self, codes: &[u32]) -> Result<Option<Decoded<B::Act>>, CodecError> {
        let n = self.check(codes)?;
        if n == 0 {
            return Ok(None);
        }
        let (b, p) = (self.backend, &self.model.params);
        let mut codes = codes.to_vec();
        clamp_codes(&self.model.dims, &mut codes);

        let rvq = b.codec_rvq(&p.books, &codes);
        let shape = self.model.attention_shape();
        let rope = rope_rows(&self.inv_freq, self.frames, n);
        let mut x = rvq.clone();
        for (layer, kv) in p.post_layers.iter().zip(&mut self.kv) {
            x = b.codec_transformer_layer(&shape, layer, &rope, &x, kv);
        }
        let post_module = b.codec_rms_norm(&p.post_norm, shape.norm_eps, &x);
        let mut x = post_module.clone();
        for (stage, history) in p.upsample.iter().zip(&mut self.upsample) {
            x = b.codec_upsample_stage(stage, &x, history);
        }
        let upsample = x.clone();
        x = b.codec_causal_conv(&p.conv_in, None, &x, &mut self.conv_in);
        for (block, state) in p.blocks.iter().zip(&mut self.blocks) {
            x = b.codec_decoder_upsample(&block.upsample, &x, &mut state.upsample);
            for (unit, history) in block.units.iter().zip(&mut state.units) {
                x = b.codec_residual_unit(unit, &x, history);
            }
        }
        let pre_tanh = b.codec_causal_conv(&p.conv_out, Some(&p.out_snake), &x, &mut self.conv_out);
        let pcm = b.codec_tanh_pcm(&pre_tanh);
        self.frames += n;
        Ok(Some((pcm, DecodeTrace { rvq, post_module, upsample, pre_tanh })))
    }
}
