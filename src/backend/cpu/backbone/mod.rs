//! `BackboneOps` for the CPU backend (`backbone.md`), one file per submodule: norms, dense
//! linears, the Gated DeltaNet mixer (recurrent and chunked cores), gated attention, the
//! block-FP8 MoE block. Embedding gather and the restricted head are small enough to live here.

mod attention;
mod fp8_linear;
mod gdn;
mod gdn_chunk;
mod linear;
mod moe;
mod norm;

pub use attention::{KvCache, rope};
pub use fp8_linear::{BlockInput, block_input, fp8_linear_row, quantise};
pub use gdn::{Core, GdnState, gdn_mixer};
pub use gdn_chunk::CHUNK as GDN_CHUNK;
pub use moe::route;

use super::{Cpu, CpuWeight, Matrix};
use crate::backend::backbone::{AttentionShape, BackboneOps, EmbedRow, GdnShape, MoeShape};
use crate::model::weights::{AttentionWeights, GdnWeights, MoeWeights};

impl BackboneOps for Cpu {
    type GdnState = GdnState;
    type KvCache = KvCache;

    fn new_gdn_state(&self, shape: &GdnShape) -> GdnState {
        GdnState::new(shape)
    }

    fn new_kv_cache(&self, _shape: &AttentionShape) -> KvCache {
        KvCache::default()
    }

    fn kv_cache_len(&self, cache: &KvCache) -> usize {
        cache.len
    }

    fn embed(&self, embed_tokens: &CpuWeight, codebook_embeddings: &CpuWeight, rows: &[EmbedRow]) -> Matrix {
        let hidden = embed_tokens.shape[1];
        let mut y = linear::poisoned(rows.len(), hidden);
        for (r, row) in rows.iter().enumerate() {
            let mut acc: Vec<f64> = embed_tokens.row(row.token).iter().map(|&v| v as f64).collect();
            for &cb in &row.codebook_rows {
                acc.iter_mut().zip(codebook_embeddings.row(cb)).for_each(|(a, &v)| *a += v as f64);
            }
            y.row_mut(r).iter_mut().zip(&acc).for_each(|(d, a)| *d = (a * row.scale) as f32);
        }
        y
    }

    fn rms_norm(&self, x: &Matrix, weight: &CpuWeight, eps: f64) -> Matrix {
        norm::rms_norm(x, weight, eps)
    }

    fn add_in_place(&self, x: &mut Matrix, y: &Matrix) {
        assert_eq!((x.rows, x.cols), (y.rows, y.cols), "residual add of different shapes");
        x.data.iter_mut().zip(&y.data).for_each(|(a, b)| *a += b);
    }

    fn gdn_prefill(&self, shape: &GdnShape, w: &GdnWeights<CpuWeight>, x: &Matrix, state: &mut GdnState) -> Matrix {
        gdn_mixer(shape, w, x, state, Core::Chunked)
    }

    fn gdn_decode(&self, shape: &GdnShape, w: &GdnWeights<CpuWeight>, x: &Matrix, state: &mut GdnState) -> Matrix {
        gdn_mixer(shape, w, x, state, Core::Recurrent)
    }

    fn attention_prefill(
        &self,
        shape: &AttentionShape,
        w: &AttentionWeights<CpuWeight>,
        x: &Matrix,
        cache: &mut KvCache,
    ) -> Matrix {
        attention::attention(shape, w, x, cache)
    }

    fn attention_decode(
        &self,
        shape: &AttentionShape,
        w: &AttentionWeights<CpuWeight>,
        x: &Matrix,
        cache: &mut KvCache,
    ) -> Matrix {
        attention::attention(shape, w, x, cache)
    }

    fn moe(&self, shape: &MoeShape, w: &MoeWeights<CpuWeight>, x: &Matrix) -> Matrix {
        moe::moe(shape, w, x)
    }

    fn restricted_logits(&self, lm_head: &CpuWeight, token_ids: &[u32], hidden: &Matrix, row: usize) -> Vec<f32> {
        let h = hidden.row(row);
        token_ids.iter().map(|&id| linear::dot(h, lm_head.row(id as usize)) as f32).collect()
    }

    fn rows(&self, x: &Matrix) -> usize {
        x.rows
    }
}
