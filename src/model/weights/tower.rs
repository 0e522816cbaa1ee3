//! Codebook-MTP tower tensor names (`model.md` §3.3): the shared codebook table, 4 shared
//! enrichment layers, 9 residual layers and 9 heads.

use super::{Accept, Init, TensorSource, TensorSpec, WeightError};
use crate::checkpoint::Dtype;
use crate::model::config::Dims;

pub struct TowerWeights<T> {
    /// `[codebooks·V, dim]`: codebook i uses rows `[i·V, (i+1)·V)`.
    pub codebook_embeddings: T,
    /// Shared enrichment layers first, then one residual layer per codebook 1..9.
    pub layers: Vec<TowerLayer<T>>,
    /// `[V, dim]` each; head r predicts codebook r + 1.
    pub heads: Vec<T>,
}

pub struct TowerLayer<T> {
    /// `[V, dim]`: `semantic_embedding` (shared layers) or `codebook_embedding` (residual layers).
    pub code_embedding: T,
    pub enorm: T,
    pub hnorm: T,
    /// `[dim, 2·dim]`, input `concat(enorm(e), hnorm(h))`, embedding first.
    pub eh_proj: T,
    /// `[2·H·hd + 2·Hkv·hd, dim]`, rows [all Q | all gates | K | V].
    pub wqkv: T,
    pub wo: T,
    pub q_norm: T,
    pub k_norm: T,
    pub attention_norm: T,
    pub ffn_norm: T,
    /// SwiGLU gate `[I, dim]`.
    pub w1: T,
    /// SwiGLU up `[I, dim]`.
    pub w3: T,
    /// SwiGLU down `[dim, I]`.
    pub w2: T,
    pub final_norm: T,
}

/// Walks the tower's tensors in checkpoint order.
pub fn tower_weights<S: TensorSource>(d: &Dims, src: &mut S) -> Result<TowerWeights<S::Tensor>, WeightError> {
    let codebook_embeddings = src.tensor(TensorSpec::new(
        "audio_decoder.codebook_embeddings.weight",
        &[d.codebooks * d.codebook_vocab, d.hidden],
        Accept::Bf16,
        Dtype::BF16,
        Init::Normalish { std: 0.5 },
    ))?;
    let mut layers = Vec::with_capacity(d.tower_layers());
    for l in 0..d.tower_shared_layers {
        let p = format!("audio_decoder_mtp_shared.layers.{l}");
        layers.push(tower_layer(d, &p, &format!("{p}.semantic_embedding.weight"), src)?);
    }
    for r in 0..d.tower_residual_layers() {
        let p = format!("audio_decoder_mtp.layers.{r}");
        layers.push(tower_layer(d, &p, &format!("{p}.codebook_embedding.weight"), src)?);
    }
    let heads = (0..d.tower_residual_layers())
        .map(|r| {
            src.tensor(TensorSpec::linear(format!("audio_decoder_mtp.heads.{r}.weight"), d.codebook_vocab, d.hidden))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(TowerWeights { codebook_embeddings, layers, heads })
}

fn tower_layer<S: TensorSource>(
    d: &Dims,
    p: &str,
    embedding_name: &str,
    src: &mut S,
) -> Result<TowerLayer<S::Tensor>, WeightError> {
    let (dim, hd, inter) = (d.hidden, d.head_dim, d.tower_intermediate);
    let t = format!("{p}.transformer_layer");
    let norm = |name: String| TensorSpec::zero_centered_norm(name, dim);
    Ok(TowerLayer {
        code_embedding: src.tensor(TensorSpec::new(
            embedding_name,
            &[d.codebook_vocab, dim],
            Accept::Bf16,
            Dtype::BF16,
            Init::Normalish { std: 0.5 },
        ))?,
        enorm: src.tensor(norm(format!("{p}.enorm.weight")))?,
        hnorm: src.tensor(norm(format!("{p}.hnorm.weight")))?,
        eh_proj: src.tensor(TensorSpec::linear(format!("{p}.eh_proj.weight"), dim, 2 * dim))?,
        wqkv: src.tensor(TensorSpec::linear(format!("{t}.attention.wqkv.weight"), d.tower_qkv_rows(), dim))?,
        wo: src.tensor(TensorSpec::linear(format!("{t}.attention.wo.weight"), dim, d.attn_out_dim()))?,
        q_norm: src.tensor(TensorSpec::zero_centered_norm(format!("{t}.attention.q_norm.weight"), hd))?,
        k_norm: src.tensor(TensorSpec::zero_centered_norm(format!("{t}.attention.k_norm.weight"), hd))?,
        attention_norm: src.tensor(norm(format!("{t}.attention_norm.weight")))?,
        ffn_norm: src.tensor(norm(format!("{t}.ffn_norm.weight")))?,
        w1: src.tensor(TensorSpec::linear(format!("{t}.feed_forward.w1.weight"), inter, dim))?,
        w3: src.tensor(TensorSpec::linear(format!("{t}.feed_forward.w3.weight"), inter, dim))?,
        w2: src.tensor(TensorSpec::linear(format!("{t}.feed_forward.w2.weight"), dim, inter))?,
        final_norm: src.tensor(norm(format!("{p}.final_layernorm.weight")))?,
    })
}
