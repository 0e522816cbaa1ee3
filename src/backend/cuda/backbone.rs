//! `BackboneOps` on the GPU: each operation is one call into its part's wrapper module
//! (`norm`, `linear`, `gdn`, `attention`, `moe`), so the model code in `model::backbone` runs
//! unchanged on either backend.

use super::tensor::{GpuMatrix, GpuWeight};
use super::{Cuda, attention, gdn, linear, moe, norm};
use crate::backend::backbone::{AttentionShape, BackboneOps, EmbedRow, GdnShape, MoeShape};
use crate::model::weights::{AttentionWeights, GdnWeights, MoeWeights};

impl BackboneOps for Cuda {
    type GdnState = gdn::GpuGdnState;
    type KvCache = attention::GpuKvCache;

    fn new_gdn_state(&self, shape: &GdnShape) -> gdn::GpuGdnState {
        gdn::new_state(self, shape)
    }

    fn new_kv_cache(&self, shape: &AttentionShape) -> attention::GpuKvCache {
        attention::new_cache(self, shape, self.context())
    }

    fn kv_cache_len(&self, cache: &attention::GpuKvCache) -> usize {
        cache.len
    }

    fn embed(&self, embed_tokens: &GpuWeight, codebook_embeddings: &GpuWeight, rows: &[EmbedRow]) -> GpuMatrix {
        linear::embed(self, embed_tokens, codebook_embeddings, rows)
    }

    fn rms_norm(&self, x: &GpuMatrix, weight: &GpuWeight, eps: f64) -> GpuMatrix {
        norm::rms_norm(self, x, weight, eps)
    }

    fn add_in_place(&self, x: &mut GpuMatrix, y: &GpuMatrix) {
        norm::add_in_place(self, x, y)
    }

    fn add_rms_norm(&self, x: &mut GpuMatrix, y: &GpuMatrix, weight: &GpuWeight, eps: f64) -> GpuMatrix {
        norm::add_rms_norm(self, x, y, weight, eps)
    }

    fn gdn_prefill(
        &self,
        shape: &GdnShape,
        w: &GdnWeights<GpuWeight>,
        x: &GpuMatrix,
        state: &mut gdn::GpuGdnState,
    ) -> GpuMatrix {
        gdn::prefill(self, shape, w, x, state)
    }

    fn gdn_prefill_many(
        &self,
        shape: &GdnShape,
        w: &GdnWeights<GpuWeight>,
        x: &GpuMatrix,
        lens: &[usize],
        states: &mut [&mut gdn::GpuGdnState],
    ) -> GpuMatrix {
        gdn::prefill_many(self, shape, w, x, lens, states)
    }

    fn gdn_decode(
        &self,
        shape: &GdnShape,
        w: &GdnWeights<GpuWeight>,
        x: &GpuMatrix,
        state: &mut gdn::GpuGdnState,
    ) -> GpuMatrix {
        gdn::decode(self, shape, w, x, state)
    }

    fn gdn_decode_rows(
        &self,
        shape: &GdnShape,
        w: &GdnWeights<GpuWeight>,
        x: &GpuMatrix,
        states: &mut [&mut gdn::GpuGdnState],
    ) -> GpuMatrix {
        gdn::decode_rows(self, shape, w, x, states)
    }

    fn attention_decode_rows(
        &self,
        shape: &AttentionShape,
        w: &AttentionWeights<GpuWeight>,
        x: &GpuMatrix,
        caches: &mut [&mut attention::GpuKvCache],
    ) -> GpuMatrix {
        attention::decode_rows(self, shape, w, x, caches)
    }

    fn attention_prefill(
        &self,
        shape: &AttentionShape,
        w: &AttentionWeights<GpuWeight>,
        x: &GpuMatrix,
        cache: &mut attention::GpuKvCache,
    ) -> GpuMatrix {
        attention::prefill(self, shape, w, x, cache)
    }

    fn attention_prefill_many(
        &self,
        shape: &AttentionShape,
        w: &AttentionWeights<GpuWeight>,
        x: &GpuMatrix,
        lens: &[usize],
        caches: &mut [&mut attention::GpuKvCache],
    ) -> GpuMatrix {
        attention::prefill_many(self, shape, w, x, lens, caches)
    }

    fn attention_decode(
        &self,
        shape: &AttentionShape,
        w: &AttentionWeights<GpuWeight>,
        x: &GpuMatrix,
        cache: &mut attention::GpuKvCache,
    ) -> GpuMatrix {
        attention::decode(self, shape, w, x, cache)
    }

    fn moe(&self, shape: &MoeShape, w: &MoeWeights<GpuWeight>, x: &GpuMatrix) -> GpuMatrix {
        moe::moe(self, shape, w, x)
    }

    fn moe_rows(&self, shape: &MoeShape, w: &MoeWeights<GpuWeight>, x: &GpuMatrix) -> GpuMatrix {
        moe::moe_with(self, shape, w, x, moe::MoePath::Rows)
    }

    fn moe_rows_add_rms_norm(
        &self,
        shape: &MoeShape,
        w: &MoeWeights<GpuWeight>,
        h: &GpuMatrix,
        x: &mut GpuMatrix,
        weight: &GpuWeight,
        eps: f64,
    ) -> GpuMatrix {
        moe::moe_rows_add_rms_norm(self, shape, w, h, x, weight, eps)
    }

    fn restricted_logits(&self, lm_head: &GpuWeight, token_ids: &[u32], hidden: &GpuMatrix, row: usize) -> Vec<f32> {
        self.with_restricted_head(token_ids, |head| head.logits_to_host(self, lm_head, hidden, row))
    }

    fn restricted_logits_rows(&self, lm_head: &GpuWeight, token_ids: &[u32], hidden: &GpuMatrix) -> Vec<Vec<f32>> {
        let flat = self.with_restricted_head(token_ids, |head| head.logits_rows_to_host(self, lm_head, hidden));
        flat.chunks(token_ids.len()).map(<[f32]>::to_vec).collect()
    }

    fn rows(&self, x: &GpuMatrix) -> usize {
        x.rows
    }
}
