//! The backbone's operations (`shared/spec/backbone.md`, `model.md` §4–5): one method per
//! submodule of the Qwen3.5-MoE text model — zero-centred RMSNorm, Gated DeltaNet mixer (chunked
//! prefill and recurrent decode), gated attention mixer, block-FP8 MoE block, the input embedding
//! gather and the restricted `lm_head`. `model::backbone` composes them; each backend implements them.

use super::BackendTypes;
use crate::model::weights::{AttentionWeights, GdnWeights, MoeWeights};

/// Sizes of one Gated DeltaNet mixer (`backbone.md` §3).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GdnShape {
    pub key_heads: usize,
    pub value_heads: usize,
    pub key_dim: usize,
    pub value_dim: usize,
    /// Causal conv kernel width; the carried conv state holds `kernel − 1` inputs.
    pub conv_kernel: usize,
    /// Epsilon of the gated RMSNorm (`rms_norm_eps`). The q/k L2 norm always uses 1e-6
    /// (`backbone.md` §3.3), as the reference does whatever the config says.
    pub norm_eps: f64,
}

impl GdnShape {
    /// Channels of the q|k|v projection and of the conv.
    pub fn qkv_dim(&self) -> usize {
        2 * self.key_heads * self.key_dim + self.value_heads * self.value_dim
    }

    /// Value heads per key head: value head `j` reads key/query head `j / ratio`.
    pub fn ratio(&self) -> usize {
        self.value_heads / self.key_heads
    }
}

/// Sizes of one gated full-attention mixer (`backbone.md` §2).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionShape {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Leading dims of each head that RoPE rotates (`head_dim × partial_rotary_factor`).
    pub rotary_dim: usize,
    pub rope_theta: f64,
    /// Epsilon of the zero-centred q/k norms.
    pub norm_eps: f64,
}

/// How the routed experts see their input activations (`backbone.md` §6.2).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ExpertActivations {
    /// Exact f32 activations against the exactly dequantised weights (the transformers golden).
    #[default]
    Exact,
    /// Emulates the serving engines' dynamic W8A8: each row is quantised to e4m3 in groups of
    /// 128 along K with scale `max(amax, 1e-10)/448` before both expert GEMMs.
    Fp8Dynamic,
}

/// Sizes of one MoE block (`backbone.md` §5–6).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MoeShape {
    pub experts: usize,
    pub top_k: usize,
    pub intermediate: usize,
    pub shared_intermediate: usize,
    /// `weight_block_size` of the block-FP8 expert weights `[rows, cols]`.
    pub block: [usize; 2],
    pub activations: ExpertActivations,
}

/// One input row of the backbone embedding: `scale · (E_text[token] + Σ CB[codebook_rows])`.
/// The model decides which rows and which scale (`model.md` §5); the backend only gathers.
#[derive(Clone, Debug, PartialEq)]
pub struct EmbedRow {
    pub token: usize,
    /// Rows of the tower's `codebook_embeddings` table to add.
    pub codebook_rows: Vec<usize>,
    pub scale: f64,
}

/// The backbone's arithmetic. Activations are `[rows, hidden]`, one row per sequence position.
/// Per-request state (`GdnState`, `KvCache`) is owned by the caller and advanced by each call.
pub trait BackboneOps: BackendTypes {
    /// Per-request state of one GDN layer: the last `kernel − 1` conv inputs and the recurrent
    /// state `[value_heads, key_dim, value_dim]`.
    type GdnState;
    /// Per-request keys (after q/k norm and RoPE) and values of one attention layer.
    type KvCache;

    /// A fresh GDN state (zeros: the start of a request).
    fn new_gdn_state(&self, shape: &GdnShape) -> Self::GdnState;
    /// An empty KV cache.
    fn new_kv_cache(&self, shape: &AttentionShape) -> Self::KvCache;
    /// Positions already held by a KV cache (the position of the next row).
    fn kv_cache_len(&self, cache: &Self::KvCache) -> usize;

    /// Gathers and mixes the input embedding of each row.
    fn embed(&self, embed_tokens: &Self::Weight, codebook_embeddings: &Self::Weight, rows: &[EmbedRow]) -> Self::Act;

    /// Zero-centred RMSNorm over each row: `x · rsqrt(mean(x²) + eps) · (1 + w)`.
    fn rms_norm(&self, x: &Self::Act, weight: &Self::Weight, eps: f64) -> Self::Act;

    /// Residual add `x += y`.
    fn add_in_place(&self, x: &mut Self::Act, y: &Self::Act);

    /// `x += y`, then the zero-centred RMSNorm of the new `x` (a backend may fuse the two).
    fn add_rms_norm(&self, x: &mut Self::Act, y: &Self::Act, weight: &Self::Weight, eps: f64) -> Self::Act {
        self.add_in_place(x, y);
        self.rms_norm(x, weight, eps)
    }

    /// GDN mixer over rows continuing `state`, with the 64-token chunked algorithm
    /// (`backbone.md` §3.7). Returns the `out_proj` output.
    fn gdn_prefill(
        &self,
        shape: &GdnShape,
        w: &GdnWeights<Self::Weight>,
        x: &Self::Act,
        state: &mut Self::GdnState,
    ) -> Self::Act;

    /// [`BackboneOps::gdn_prefill`] of several requests' prompt chunks at once: `lens[i]`
    /// consecutive rows of `x` continue `states[i]`; returns every row's output in `x`'s order.
    /// A request's rows must come out the same whichever requests share the call (so a backend
    /// that batches the work keeps each request's arithmetic fixed by its own rows); they may
    /// differ from what [`BackboneOps::gdn_prefill`] gives them. The default runs the requests
    /// one by one through `gdn_prefill`.
    fn gdn_prefill_many(
        &self,
        shape: &GdnShape,
        w: &GdnWeights<Self::Weight>,
        x: &Self::Act,
        lens: &[usize],
        states: &mut [&mut Self::GdnState],
    ) -> Self::Act {
        assert_eq!(lens.len(), states.len(), "GDN prefill: one state per request");
        if let [state] = states {
            return self.gdn_prefill(shape, w, x, state);
        }
        let mut start = 0;
        let parts: Vec<Self::Act> = (states.iter_mut().zip(lens))
            .map(|(state, &n)| {
                let own = self.act_rows(x, start, n);
                start += n;
                self.gdn_prefill(shape, w, &own, state)
            })
            .collect();
        self.stack_rows(&parts)
    }

    /// GDN mixer with the token-by-token recurrence (`backbone.md` §3.4, §3.6): the decode path,
    /// meant for one row (any number of rows is processed one after another).
    fn gdn_decode(
        &self,
        shape: &GdnShape,
        w: &GdnWeights<Self::Weight>,
        x: &Self::Act,
        state: &mut Self::GdnState,
    ) -> Self::Act;

    /// Gated attention over rows continuing `cache` (positions start at the cache length);
    /// appends their keys and values. Returns the `o_proj` output.
    fn attention_prefill(
        &self,
        shape: &AttentionShape,
        w: &AttentionWeights<Self::Weight>,
        x: &Self::Act,
        cache: &mut Self::KvCache,
    ) -> Self::Act;

    /// [`BackboneOps::attention_prefill`] of several requests' prompt chunks at once: `lens[i]`
    /// consecutive rows of `x` continue `caches[i]`; returns every row's output in `x`'s order.
    /// Each request's rows and cache must come out bit for bit as `attention_prefill` gives them
    /// alone. The default runs the requests one by one through `attention_prefill`.
    fn attention_prefill_many(
        &self,
        shape: &AttentionShape,
        w: &AttentionWeights<Self::Weight>,
        x: &Self::Act,
        lens: &[usize],
        caches: &mut [&mut Self::KvCache],
    ) -> Self::Act {
        assert_eq!(lens.len(), caches.len(), "attention prefill: one cache per request");
        if let [cache] = caches {
            return self.attention_prefill(shape, w, x, cache);
        }
        let mut start = 0;
        let parts: Vec<Self::Act> = (caches.iter_mut().zip(lens))
            .map(|(cache, &n)| {
                let own = self.act_rows(x, start, n);
                start += n;
                self.attention_prefill(shape, w, &own, cache)
            })
            .collect();
        self.stack_rows(&parts)
    }

    /// Gated attention for one decode row (same contract as `attention_prefill`).
    fn attention_decode(
        &self,
        shape: &AttentionShape,
        w: &AttentionWeights<Self::Weight>,
        x: &Self::Act,
        cache: &mut Self::KvCache,
    ) -> Self::Act;

    /// MoE block: router softmax → top-k → renormalise; block-FP8 SwiGLU experts; sigmoid-gated
    /// shared expert (`backbone.md` §5).
    fn moe(&self, shape: &MoeShape, w: &MoeWeights<Self::Weight>, x: &Self::Act) -> Self::Act;

    /// [`Self::gdn_decode`] of one row per request: row `i` of `x` continues `states[i]`.
    ///
    /// The decode batch's contract (for this and every `*_rows` op, and the row-wise norms and
    /// adds it also calls): each output row depends only on its own input row and state, bit for
    /// bit, whatever other rows share the call. That is what makes a request's bytes the same
    /// alone or in any batch. The default runs each row alone.
    fn gdn_decode_rows(
        &self,
        shape: &GdnShape,
        w: &GdnWeights<Self::Weight>,
        x: &Self::Act,
        states: &mut [&mut Self::GdnState],
    ) -> Self::Act {
        assert_eq!(self.rows(x), states.len(), "gdn_decode_rows: one state per row");
        let parts: Vec<Self::Act> = (states.iter_mut().enumerate())
            .map(|(i, state)| self.gdn_decode(shape, w, &self.act_rows(x, i, 1), state))
            .collect();
        self.stack_rows(&parts)
    }

    /// [`Self::attention_decode`] of one row per request: row `i` of `x` continues `caches[i]`
    /// (the contract of [`Self::gdn_decode_rows`]). The default runs each row alone.
    fn attention_decode_rows(
        &self,
        shape: &AttentionShape,
        w: &AttentionWeights<Self::Weight>,
        x: &Self::Act,
        caches: &mut [&mut Self::KvCache],
    ) -> Self::Act {
        assert_eq!(self.rows(x), caches.len(), "attention_decode_rows: one cache per row");
        let parts: Vec<Self::Act> = (caches.iter_mut().enumerate())
            .map(|(i, cache)| self.attention_decode(shape, w, &self.act_rows(x, i, 1), cache))
            .collect();
        self.stack_rows(&parts)
    }

    /// [`Self::moe`] under the decode batch's contract (see [`Self::gdn_decode_rows`]): whatever
    /// path a backend picks by row count for prompts, these rows take one that does not depend
    /// on how many there are. The default is `moe`, right for a backend whose `moe` is already
    /// row by row (the CPU's).
    fn moe_rows(&self, shape: &MoeShape, w: &MoeWeights<Self::Weight>, x: &Self::Act) -> Self::Act {
        self.moe(shape, w, x)
    }

    /// [`Self::moe_rows`] of `h`, then [`Self::add_rms_norm`] of its output into the residual
    /// `x` with `weight`: the normed input of the next op (a backend may end the MoE in the norm).
    fn moe_rows_add_rms_norm(
        &self,
        shape: &MoeShape,
        w: &MoeWeights<Self::Weight>,
        h: &Self::Act,
        x: &mut Self::Act,
        weight: &Self::Weight,
        eps: f64,
    ) -> Self::Act {
        let moe = self.moe_rows(shape, w, h);
        self.add_rms_norm(x, &moe, weight, eps)
    }

    /// Logits of row `row` of `hidden` for the `lm_head` rows `token_ids`, in that order, on the host.
    fn restricted_logits(&self, lm_head: &Self::Weight, token_ids: &[u32], hidden: &Self::Act, row: usize) -> Vec<f32>;

    /// [`Self::restricted_logits`] of every row of `hidden` (under the decode batch's contract:
    /// each row's logits are what it gets alone). The default asks row by row.
    fn restricted_logits_rows(&self, lm_head: &Self::Weight, token_ids: &[u32], hidden: &Self::Act) -> Vec<Vec<f32>> {
        (0..self.rows(hidden)).map(|row| self.restricted_logits(lm_head, token_ids, hidden, row)).collect()
    }

    /// Number of rows of an activation.
    fn rows(&self, x: &Self::Act) -> usize;
}
