//! The backbone's order of operations (`model.md` §4–5, `backbone.md` §2.1), written once against
//! [`BackboneOps`]: the input embedding with the partial codebook mix, the hybrid layer loop
//! (`x + Mixer(norm(x))`, then `+ MoE(norm(·))`), the final norm and the restricted `lm_head`,
//! plus the per-request [`BackboneState`].

use crate::backend::backbone::{AttentionShape, BackboneOps, EmbedRow, ExpertActivations, GdnShape, MoeShape};
use crate::model::config::{LayerType, ModelConfig};
use crate::model::frame::Rows;
use crate::model::weights::{BackboneWeights, Mixer};

/// Everything the backbone's structure needs from `config.json`.
#[derive(Clone, Debug, PartialEq)]
pub struct BackboneConfig {
    pub hidden: usize,
    /// Rows of `embed_tokens` and `lm_head`.
    pub vocab: usize,
    pub layer_types: Vec<LayerType>,
    /// `rms_norm_eps` of the zero-centred norms.
    pub norm_eps: f64,
    pub gdn: GdnShape,
    pub attention: AttentionShape,
    pub moe: MoeShape,
    /// Codes per frame row (c0..c9).
    pub codebooks: usize,
    /// Codes per codebook; also the width of the semantic band.
    pub codebook_vocab: usize,
    /// k: residual codebooks c1..ck mixed into the backbone input (0 = `mtp_shared_pre`).
    pub vq_backbone_codebooks: usize,
    pub semantic_start: u32,
    pub eos: u32,
}

impl BackboneConfig {
    /// From a validated config. Expert activations start [`ExpertActivations::Exact`].
    pub fn from_model_config(c: &ModelConfig) -> BackboneConfig {
        let d = c.dims();
        let t = &c.text_config;
        BackboneConfig {
            hidden: d.hidden,
            vocab: d.vocab,
            layer_types: d.layer_types.clone(),
            norm_eps: t.rms_norm_eps,
            gdn: GdnShape {
                key_heads: d.gdn_key_heads,
                value_heads: d.gdn_value_heads,
                key_dim: d.gdn_key_dim,
                value_dim: d.gdn_value_dim,
                conv_kernel: d.gdn_conv_kernel,
                norm_eps: t.rms_norm_eps,
            },
            attention: AttentionShape {
                heads: d.heads,
                kv_heads: d.kv_heads,
                head_dim: d.head_dim,
                rotary_dim: d.rotary_dim,
                rope_theta: t.rope_parameters.rope_theta,
                norm_eps: t.rms_norm_eps,
            },
            moe: MoeShape {
                experts: d.experts,
                top_k: d.experts_per_token,
                intermediate: d.expert_intermediate,
                shared_intermediate: d.shared_expert_intermediate,
                block: d.fp8_block,
                activations: ExpertActivations::Exact,
            },
            codebooks: d.codebooks,
            codebook_vocab: d.codebook_vocab,
            vq_backbone_codebooks: d.vq_backbone_codebooks,
            semantic_start: d.semantic_start,
            eos: d.eos,
        }
    }

    /// Whether `token` is in the semantic band `<|semantic:0..V−1|>`.
    pub fn is_semantic(&self, token: u32) -> bool {
        token >= self.semantic_start && ((token - self.semantic_start) as usize) < self.codebook_vocab
    }

    /// The main-token candidates in restricted-logit order: index `i < V` is the semantic token
    /// `semantic_start + i` (code `c0 = i`), index `V` is EOS (the order mlx-audio uses).
    pub fn restricted_token_ids(&self) -> Vec<u32> {
        (0..self.codebook_vocab as u32).map(|i| self.semantic_start + i).chain([self.eos]).collect()
    }

    /// The embedding recipe of one row `[token, c0..c9]` (`model.md` §5): text rows are
    /// `E_text[token]`; semantic rows are `(E_text[token] + Σ_{i=1..k} CB[i·V + clamp(c_i)])/√(1+k)`.
    /// c0 never comes from CB: the semantic token's own embedding stands for it.
    pub fn embed_row(&self, token: u32, codes: &[u32]) -> EmbedRow {
        if !self.is_semantic(token) {
            return EmbedRow { token: token as usize, codebook_rows: Vec::new(), scale: 1.0 };
        }
        let v = self.codebook_vocab;
        let k = self.vq_backbone_codebooks;
        let codebook_rows = (1..=k).map(|i| i * v + (codes[i] as usize).min(v - 1)).collect();
        EmbedRow { token: token as usize, codebook_rows, scale: 1.0 / ((1 + k) as f64).sqrt() }
    }
}

/// Why the backbone refused a call.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum BackboneError {
    #[error("no rows to run")]
    Empty,
    #[error("row {row} has {found} values, expected {expected} (a token and one code per codebook)")]
    RowWidth { row: usize, found: usize, expected: usize },
    #[error("row {row}: token id {token} is outside the vocabulary of {vocab} ids")]
    TokenOutOfRange { row: usize, token: u32, vocab: usize },
    #[error("the weights have {found} layers but the config lists {expected}")]
    LayerCount { found: usize, expected: usize },
    #[error("layer {layer}: the weights' mixer does not match the config's `{expected}`")]
    LayerKind { layer: usize, expected: &'static str },
    #[error("vq_backbone_codebooks {k} needs at least {needed} codebooks, the config has {codebooks}")]
    Codebooks { k: usize, needed: usize, codebooks: usize },
    #[error("the state was made for another backbone ({found} layers, expected {expected})")]
    ForeignState { found: usize, expected: usize },
    #[error("{rows} rows for {states} request states: a decode step takes one row per request")]
    StatesPerRow { rows: usize, states: usize },
}

/// A point of the forward pass an observer sees (for tests and stage-by-stage checks).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// The mixed input embedding.
    Embedding,
    /// The residual stream after layer `l` (mixer and MoE).
    Layer(usize),
    /// After the final norm: what `prefill`/`decode` return.
    FinalNorm,
}

/// Per-layer state of one request.
pub enum LayerState<B: BackboneOps> {
    Gdn(B::GdnState),
    Attention(B::KvCache),
}

/// Everything one request carries between calls: GDN conv and recurrent states, KV caches,
/// and the number of rows seen (the position of the next row).
pub struct BackboneState<B: BackboneOps> {
    pub layers: Vec<LayerState<B>>,
    pub position: usize,
}

/// Runs layer `l`'s mixer on its normed input (see `Backbone::layers`).
type MixerFn<'a, B> = dyn FnMut(
        usize,
        &Mixer<<B as crate::backend::BackendTypes>::Weight>,
        &<B as crate::backend::BackendTypes>::Act,
    ) -> <B as crate::backend::BackendTypes>::Act
    + 'a;

/// Which mixer algorithms run: chunked GDN for prompts, the token recurrence for decode steps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pass {
    Prefill,
    Decode,
}

/// The backbone over weights resident on backend `B`.
pub struct Backbone<'a, B: BackboneOps> {
    backend: &'a B,
    config: BackboneConfig,
    weights: &'a BackboneWeights<B::Weight>,
    codebook_embeddings: &'a B::Weight,
    restricted_ids: Vec<u32>,
}

impl<'a, B: BackboneOps> Backbone<'a, B> {
    /// `codebook_embeddings` is the tower's `audio_decoder.codebook_embeddings` table `[10·V, hidden]`.
    pub fn new(
        backend: &'a B,
        config: BackboneConfig,
        weights: &'a BackboneWeights<B::Weight>,
        codebook_embeddings: &'a B::Weight,
    ) -> Result<Backbone<'a, B>, BackboneError> {
        if weights.layers.len() != config.layer_types.len() {
            return Err(BackboneError::LayerCount { found: weights.layers.len(), expected: config.layer_types.len() });
        }
        for (layer, (w, kind)) in weights.layers.iter().zip(&config.layer_types).enumerate() {
            let ok = matches!(
                (&w.mixer, kind),
                (Mixer::GatedDeltaNet(_), LayerType::LinearAttention) | (Mixer::Attention(_), LayerType::FullAttention)
            );
            if !ok {
                return Err(BackboneError::LayerKind { layer, expected: kind.as_str() });
            }
        }
        if config.vq_backbone_codebooks >= config.codebooks {
            let (k, codebooks) = (config.vq_backbone_codebooks, config.codebooks);
            return Err(BackboneError::Codebooks { k, needed: k + 1, codebooks });
        }
        let restricted_ids = config.restricted_token_ids();
        Ok(Backbone { backend, config, weights, codebook_embeddings, restricted_ids })
    }

    pub fn config(&self) -> &BackboneConfig {
        &self.config
    }

    /// A fresh request: zero GDN states, empty KV caches, position 0.
    pub fn new_state(&self) -> BackboneState<B> {
        let layers = self
            .config
            .layer_types
            .iter()
            .map(|kind| match kind {
                LayerType::LinearAttention => LayerState::Gdn(self.backend.new_gdn_state(&self.config.gdn)),
                LayerType::FullAttention => LayerState::Attention(self.backend.new_kv_cache(&self.config.attention)),
            })
            .collect();
        BackboneState { layers, position: 0 }
    }

    /// The input embedding of every row (`model.md` §5).
    pub fn embed(&self, rows: &Rows) -> Result<B::Act, BackboneError> {
        self.check_rows(rows)?;
        let recipe: Vec<EmbedRow> =
            (0..rows.len()).map(|t| self.config.embed_row(rows.token(t), &rows.row(t)[1..])).collect();
        Ok(self.backend.embed(&self.weights.embed_tokens, self.codebook_embeddings, &recipe))
    }

    /// Runs prompt rows (chunked GDN), continuing `state`; returns the final-norm hidden of every row.
    pub fn prefill(&self, state: &mut BackboneState<B>, rows: &Rows) -> Result<B::Act, BackboneError> {
        self.forward(state, rows, Pass::Prefill, &mut |_, _| {})
    }

    /// [`Self::prefill`], showing each [`Stage`]'s activations to `observe`.
    pub fn prefill_observed(
        &self,
        state: &mut BackboneState<B>,
        rows: &Rows,
        observe: &mut dyn FnMut(Stage, &B::Act),
    ) -> Result<B::Act, BackboneError> {
        self.forward(state, rows, Pass::Prefill, observe)
    }

    /// Runs one row `[token, c0..c9]` (recurrent GDN); returns its final-norm hidden `[1, hidden]`.
    pub fn decode(&self, state: &mut BackboneState<B>, row: &[u32]) -> Result<B::Act, BackboneError> {
        self.decode_observed(state, row, &mut |_, _| {})
    }

    /// [`Self::decode`], showing each [`Stage`]'s activations to `observe`.
    pub fn decode_observed(
        &self,
        state: &mut BackboneState<B>,
        row: &[u32],
        observe: &mut dyn FnMut(Stage, &B::Act),
    ) -> Result<B::Act, BackboneError> {
        let expected = 1 + self.config.codebooks;
        if row.len() != expected {
            return Err(BackboneError::RowWidth { row: 0, found: row.len(), expected });
        }
        let rows = Rows::from_flat(self.config.codebooks, row.to_vec());
        self.forward(state, &rows, Pass::Decode, observe)
    }

    /// [`Self::decode`] of one row whose input embedding `x` `[1, hidden]` is already computed
    /// (a device-side step builds it from the sampled row without the host).
    pub fn decode_embedded(&self, state: &mut BackboneState<B>, x: B::Act) -> Result<B::Act, BackboneError> {
        self.forward_embedded(state, x, Pass::Decode, &mut |_, _| {})
    }

    /// Restarts `state` for a new request without reallocating it: positions 0, GDN states
    /// zeroed and caches emptied by `clear` (for engines that keep one state's addresses for
    /// their whole life, e.g. in a captured CUDA graph).
    pub fn restart_state(
        &self,
        state: &mut BackboneState<B>,
        clear: &mut dyn FnMut(&mut LayerState<B>),
    ) -> Result<(), BackboneError> {
        self.check_state(state)?;
        state.layers.iter_mut().for_each(clear);
        state.position = 0;
        Ok(())
    }

    /// Logits of row `row` of a final-norm `hidden` over the main-token candidates, in the order
    /// of [`Self::restricted_token_ids`] (semantic band ascending, then EOS).
    ///
    /// # Panics
    /// If `row` is not a row of `hidden`.
    pub fn restricted_logits(&self, hidden: &B::Act, row: usize) -> Vec<f32> {
        let rows = self.backend.rows(hidden);
        assert!(row < rows, "restricted_logits: row {row} of {rows}");
        self.backend.restricted_logits(&self.weights.lm_head, &self.restricted_ids, hidden, row)
    }

    /// [`Self::restricted_logits`] of every row of `hidden` (the decode batch's rows).
    pub fn restricted_logits_rows(&self, hidden: &B::Act) -> Vec<Vec<f32>> {
        self.backend.restricted_logits_rows(&self.weights.lm_head, &self.restricted_ids, hidden)
    }

    /// The `lm_head` weight (a device-side step runs the restricted head itself).
    pub fn lm_head(&self) -> &'a B::Weight {
        &self.weights.lm_head
    }

    /// `(embed_tokens, codebook_embeddings)`: the tables the input embedding gathers from.
    pub fn embedding_tables(&self) -> (&'a B::Weight, &'a B::Weight) {
        (&self.weights.embed_tokens, self.codebook_embeddings)
    }

    /// Token id of each restricted-logit index.
    pub fn restricted_token_ids(&self) -> &[u32] {
        &self.restricted_ids
    }

    fn check_rows(&self, rows: &Rows) -> Result<(), BackboneError> {
        if rows.is_empty() {
            return Err(BackboneError::Empty);
        }
        if rows.codebooks() != self.config.codebooks {
            let (found, expected) = (rows.width(), 1 + self.config.codebooks);
            return Err(BackboneError::RowWidth { row: 0, found, expected });
        }
        for t in 0..rows.len() {
            let token = rows.token(t);
            if token as usize >= self.config.vocab {
                return Err(BackboneError::TokenOutOfRange { row: t, token, vocab: self.config.vocab });
            }
        }
        Ok(())
    }

    fn check_state(&self, state: &BackboneState<B>) -> Result<(), BackboneError> {
        let expected = self.config.layer_types.len();
        let kinds_match = state.layers.len() == expected
            && state.layers.iter().zip(&self.config.layer_types).all(|(s, kind)| {
                matches!(
                    (s, kind),
                    (LayerState::Gdn(_), LayerType::LinearAttention)
                        | (LayerState::Attention(_), LayerType::FullAttention)
                )
            });
        if kinds_match { Ok(()) } else { Err(BackboneError::ForeignState { found: state.layers.len(), expected }) }
    }

    fn forward(
        &self,
        state: &mut BackboneState<B>,
        rows: &Rows,
        pass: Pass,
        observe: &mut dyn FnMut(Stage, &B::Act),
    ) -> Result<B::Act, BackboneError> {
        let x = self.embed(rows)?;
        self.forward_embedded(state, x, pass, observe)
    }

    fn forward_embedded(
        &self,
        state: &mut BackboneState<B>,
        x: B::Act,
        pass: Pass,
        observe: &mut dyn FnMut(Stage, &B::Act),
    ) -> Result<B::Act, BackboneError> {
        self.check_state(state)?;
        let (b, c) = (self.backend, &self.config);
        let rows = b.rows(&x);
        let layers = &mut state.layers;
        // Decode rows take the decode batch's paths, so one request alone (or a device-side step)
        // computes exactly what it computes inside any batch.
        let rows_contract = pass == Pass::Decode;
        let out = self.layers(x, rows_contract, observe, &mut |l, mixer, h| match (mixer, &mut layers[l]) {
            (Mixer::GatedDeltaNet(w), LayerState::Gdn(s)) => match pass {
                Pass::Prefill => b.gdn_prefill(&c.gdn, w, h, s),
                Pass::Decode => b.gdn_decode(&c.gdn, w, h, s),
            },
            (Mixer::Attention(w), LayerState::Attention(cache)) => match pass {
                Pass::Prefill => b.attention_prefill(&c.attention, w, h, cache),
                Pass::Decode => b.attention_decode(&c.attention, w, h, cache),
            },
            // `new` and `check_state` matched every layer's kind to the config.
            _ => unreachable!("layer kinds were checked against the config"),
        });
        state.position += rows;
        Ok(out)
    }

    /// One decode step of several requests at once: `rows[i]` continues `states[i]`. Returns the
    /// final-norm hidden `[n, hidden]`, row `i` for request `i`. Every operation runs under the
    /// decode batch's contract (`BackboneOps::gdn_decode_rows`), so each request's row is bit for
    /// bit what it would be with any other set of requests beside it.
    pub fn decode_rows(&self, states: &mut [&mut BackboneState<B>], rows: &[&[u32]]) -> Result<B::Act, BackboneError> {
        if rows.len() != states.len() {
            return Err(BackboneError::StatesPerRow { rows: rows.len(), states: states.len() });
        }
        let expected = 1 + self.config.codebooks;
        let mut flat = Vec::with_capacity(rows.len() * expected);
        for (i, row) in rows.iter().enumerate() {
            if row.len() != expected {
                return Err(BackboneError::RowWidth { row: i, found: row.len(), expected });
            }
            flat.extend_from_slice(row);
        }
        for state in states.iter() {
            self.check_state(state)?;
        }
        let x = self.embed(&Rows::from_flat(self.config.codebooks, flat))?;
        self.decode_rows_embedded(states, x)
    }

    /// [`Self::decode_rows`] of rows whose input embeddings `x` `[n, hidden]` are already
    /// computed (the device-side draws build them from the sampled rows without the host).
    pub fn decode_rows_embedded(
        &self,
        states: &mut [&mut BackboneState<B>],
        x: B::Act,
    ) -> Result<B::Act, BackboneError> {
        let rows = self.backend.rows(&x);
        if rows != states.len() {
            return Err(BackboneError::StatesPerRow { rows, states: states.len() });
        }
        for state in states.iter() {
            self.check_state(state)?;
        }
        let (b, c) = (self.backend, &self.config);
        let out = self.layers(x, true, &mut |_, _| {}, &mut |l, mixer, h| match mixer {
            Mixer::GatedDeltaNet(w) => {
                let mut gdn: Vec<&mut B::GdnState> = (states.iter_mut())
                    .map(|s| match &mut s.layers[l] {
                        LayerState::Gdn(g) => g,
                        LayerState::Attention(_) => unreachable!("layer kinds were checked against the config"),
                    })
                    .collect();
                b.gdn_decode_rows(&c.gdn, w, h, &mut gdn)
            }
            Mixer::Attention(w) => {
                let mut caches: Vec<&mut B::KvCache> = (states.iter_mut())
                    .map(|s| match &mut s.layers[l] {
                        LayerState::Attention(cache) => cache,
                        LayerState::Gdn(_) => unreachable!("layer kinds were checked against the config"),
                    })
                    .collect();
                b.attention_decode_rows(&c.attention, w, h, &mut caches)
            }
        });
        for state in states.iter_mut() {
            state.position += 1;
        }
        Ok(out)
    }

    /// Prompt chunks of several requests at once: `chunks[i]` continues `states[i]`. Returns the
    /// final-norm hidden of every row, request after request (`[Σ rows, hidden]`). The mixers run
    /// each request on its own rows and state, through `BackboneOps::gdn_prefill_many` and
    /// `BackboneOps::attention_prefill_many` (which may run all requests in one launch per
    /// kernel, each request's arithmetic fixed by its own rows); everything row-wise
    /// (embedding, norms, the MoE under the decode batch's contract) runs once over all rows: a
    /// request's rows are bit for bit the same whichever requests share the call, and the
    /// experts a batch of prompts routes to are read once per layer instead of once per prompt.
    pub fn prefill_rows(&self, states: &mut [&mut BackboneState<B>], chunks: &[Rows]) -> Result<B::Act, BackboneError> {
        if chunks.len() != states.len() {
            return Err(BackboneError::StatesPerRow { rows: chunks.len(), states: states.len() });
        }
        let mut all = Rows::new(self.config.codebooks);
        for (state, chunk) in states.iter().zip(chunks) {
            self.check_state(state)?;
            self.check_rows(chunk)?;
            all.extend(chunk);
        }
        let x = self.embed(&all)?;
        let (b, c) = (self.backend, &self.config);
        let lens: Vec<usize> = chunks.iter().map(Rows::len).collect();
        let out = self.layers(x, true, &mut |_, _| {}, &mut |l, mixer, h| {
            // The backend may run all requests' mixer work together, each on its own rows.
            match mixer {
                Mixer::GatedDeltaNet(w) => {
                    let mut gdn: Vec<&mut B::GdnState> = (states.iter_mut())
                        .map(|s| match &mut s.layers[l] {
                            LayerState::Gdn(g) => g,
                            LayerState::Attention(_) => unreachable!("layer kinds were checked against the config"),
                        })
                        .collect();
                    b.gdn_prefill_many(&c.gdn, w, h, &lens, &mut gdn)
                }
                Mixer::Attention(w) => {
                    let mut caches: Vec<&mut B::KvCache> = (states.iter_mut())
                        .map(|s| match &mut s.layers[l] {
                            LayerState::Attention(cache) => cache,
                            LayerState::Gdn(_) => unreachable!("layer kinds were checked against the config"),
                        })
                        .collect();
                    b.attention_prefill_many(&c.attention, w, h, &lens, &mut caches)
                }
            }
        });
        for (state, n) in states.iter_mut().zip(lens) {
            state.position += n;
        }
        Ok(out)
    }

    /// The hybrid layer loop over embedded rows `x` (`backbone.md` §2.1); `mix(l, mixer, h)` runs
    /// layer `l`'s mixer on its normed input. `rows_contract`: the MoE runs under the decode
    /// batch's contract (`moe_rows`).
    fn layers(
        &self,
        mut x: B::Act,
        rows_contract: bool,
        observe: &mut dyn FnMut(Stage, &B::Act),
        mix: &mut MixerFn<'_, B>,
    ) -> B::Act {
        let b = self.backend;
        let c = &self.config;
        observe(Stage::Embedding, &x);
        // Each residual add is fused with the norm that reads its result (the next mixer's or
        // MoE's input norm, or the final norm), so `h` is always the normed input of the next op.
        let layers = &self.weights.layers;
        let mut h = b.rms_norm(&x, &layers[0].input_norm, c.norm_eps);
        for (l, layer) in layers.iter().enumerate() {
            let mixed = mix(l, &layer.mixer, &h);
            h = b.add_rms_norm(&mut x, &mixed, &layer.post_attention_norm, c.norm_eps);
            let next_norm = layers.get(l + 1).map_or(&self.weights.final_norm, |next| &next.input_norm);
            h = if rows_contract {
                b.moe_rows_add_rms_norm(&c.moe, &layer.moe, &h, &mut x, next_norm, c.norm_eps)
            } else {
                let moe = b.moe(&c.moe, &layer.moe, &h);
                b.add_rms_norm(&mut x, &moe, next_norm, c.norm_eps)
            };
            observe(Stage::Layer(l), &x);
        }
        observe(Stage::FinalNorm, &h);
        h
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::config::{LayerType, ModelConfig};
    use crate::synth::presets::{Preset, TokenIds, model_config};

    fn config(k: usize) -> BackboneConfig {
        let ids = TokenIds { semantic_start: 1000, eos: 900, tokenizer_len: 1300 };
        let c: ModelConfig = model_config(&Preset::Tiny.dims(), &ids, k);
        BackboneConfig::from_model_config(&c)
    }

    #[test]
    fn config_follows_the_checkpoint_config() {
        let c = config(1);
        assert_eq!((c.hidden, c.codebooks, c.codebook_vocab, c.vq_backbone_codebooks), (256, 10, 256, 1));
        assert_eq!(c.layer_types[3], LayerType::FullAttention);
        assert_eq!((c.attention.rotary_dim, c.attention.rope_theta), (8, 1e7));
        assert_eq!(c.gdn.qkv_dim(), 2 * 4 * 32 + 8 * 32);
        assert_eq!(c.moe.activations, ExpertActivations::Exact);
    }

    #[test]
    fn mtp_shared_pre_adds_no_codes() {
        let c = config(0);
        let codes = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14];
        assert_eq!(c.embed_row(1005, &codes), EmbedRow { token: 1005, codebook_rows: vec![], scale: 1.0 });
    }

    #[test]
    fn partial_mix_sums_codes_one_to_k_with_clamp_and_scale() {
        let c = config(3);
        let codes = [5, 6, 300, 8, 9, 10, 11, 12, 13, 14];
        let row = c.embed_row(1005, &codes);
        // c0 is never looked up; c2 = 300 is clamped to V − 1 = 255; rows i·V + c_i.
        assert_eq!(row.codebook_rows, vec![256 + 6, 2 * 256 + 255, 3 * 256 + 8]);
        assert_eq!(row.scale, 0.5);
        // Text rows and EOS are plain token embeddings whatever k is.
        for token in [12, 900, 999, 1256] {
            assert_eq!(
                c.embed_row(token, &codes),
                EmbedRow { token: token as usize, codebook_rows: vec![], scale: 1.0 }
            );
        }
        assert!(c.is_semantic(1255) && !c.is_semantic(1256));
    }

    #[test]
    fn restricted_ids_are_the_band_then_eos() {
        let ids = config(1).restricted_token_ids();
        assert_eq!((ids.len(), ids[0], ids[255], ids[256]), (257, 1000, 1255, 900));
    }
}
