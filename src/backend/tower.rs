//! The Codebook-MTP tower's operations (`model.md` §6): one tower layer over a block of
//! consecutive sequence rows with its own KV cache, the unseen-codes vector of layer 0, and a
//! codebook head. The order of layers and which code each embeds live in `model::tower`.

use super::BackendTypes;
use crate::model::config::ModelConfig;
use crate::model::weights::TowerLayer;

/// Sizes and constants every tower layer shares (`audio_decoder_config`, `model.md` §2.3).
#[derive(Clone, Debug, PartialEq)]
pub struct TowerShape {
    pub dim: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Leading dims of each head that are rotated (`head_dim × rotary_percent`).
    pub rotary_dim: usize,
    pub rope_base: f64,
    pub norm_eps: f64,
    /// SwiGLU width.
    pub intermediate: usize,
    /// Codes per codebook; also the rows of each layer's embedding and each head.
    pub codebook_vocab: usize,
}

impl TowerShape {
    /// From a validated config. The tower's own keys are read (not the backbone's): the rule
    /// that they agree is the config's, and a tower op must never depend on it silently.
    pub fn from_config(c: &ModelConfig) -> TowerShape {
        let a = &c.audio_decoder_config;
        TowerShape {
            dim: a.dim,
            heads: a.n_head,
            kv_heads: a.n_local_heads,
            head_dim: a.head_dim,
            rotary_dim: c.dims().tower_rotary_dim,
            rope_base: a.rope_base,
            norm_eps: a.norm_eps,
            intermediate: a.intermediate_size,
            codebook_vocab: a.vocab_size,
        }
    }

    /// Rows of the fused `wqkv`: [all Q | all gates | K | V].
    pub fn qkv_rows(&self) -> usize {
        2 * self.heads * self.head_dim + 2 * self.kv_heads * self.head_dim
    }

    /// Width of one position's K (or V) in a layer's cache.
    pub fn kv_width(&self) -> usize {
        self.kv_heads * self.head_dim
    }
}

/// One tower layer applied to `n` consecutive rows at positions `start..start + n`.
pub struct TowerLayerInput<'a, A> {
    /// `[n, dim]`: the backbone's final-norm rows (layer 0) or the previous layer's output.
    pub hidden: &'a A,
    /// The code each row embeds with the layer's own table (clamped into the table, as S1 does).
    pub codes: &'a [u32],
    /// Whether each row's label is semantic; a row whose label is not embeds zero.
    pub label_semantic: &'a [bool],
    /// `[n, dim]`: the unseen-codes vector added to the embedding (layer 0 only).
    pub unseen: Option<&'a A>,
    /// Backbone position of the first row. The layer's cache must already hold every earlier
    /// position; positions at or after `start` are replaced.
    pub start: usize,
}

impl<A> TowerLayerInput<'_, A> {
    /// Checks the input against the layer and its cache, for any backend: `hidden` is
    /// `(rows, cols)`, `unseen_rows` the unseen vector's rows, `cached` the positions the cache
    /// holds. Returns the row count.
    pub fn check(
        &self,
        s: &TowerShape,
        hidden: (usize, usize),
        unseen_rows: Option<usize>,
        cached: usize,
    ) -> Result<usize, TowerError> {
        let check_len = |what, expected, found| {
            if expected == found { Ok(()) } else { Err(TowerError::Length { what, expected, found }) }
        };
        let n = hidden.0;
        check_len("hidden width", s.dim, hidden.1)?;
        check_len("codes", n, self.codes.len())?;
        check_len("label mask", n, self.label_semantic.len())?;
        if let Some(rows) = unseen_rows {
            check_len("unseen rows", n, rows)?;
        }
        if self.start > cached {
            return Err(TowerError::PositionGap { start: self.start, cached });
        }
        Ok(n)
    }
}

/// One tower layer's input for one row per request (each at its own position).
pub struct TowerRowsInput<'a, A> {
    /// `[n, dim]`: each request's backbone final-norm row (layer 0) or previous layer output.
    pub hidden: &'a A,
    /// The code each row embeds with the layer's own table.
    pub codes: &'a [u32],
    /// Whether each row's label is semantic.
    pub label_semantic: &'a [bool],
    /// `[n, dim]`: the unseen-codes vectors (layer 0 only).
    pub unseen: Option<&'a A>,
    /// The position each row is written at in its own cache.
    pub starts: &'a [usize],
}

/// One tower layer's input for several requests' teacher-forced rows (the prompts' prefill):
/// `lens[i]` consecutive rows belong to request `i`, written from position `starts[i]` of its
/// own cache.
pub struct TowerManyInput<'a, A> {
    /// `[Σ lens, dim]`.
    pub hidden: &'a A,
    /// The code each row embeds with the layer's own table.
    pub codes: &'a [u32],
    /// Whether each row's label is semantic.
    pub label_semantic: &'a [bool],
    /// `[Σ lens, dim]`: the unseen-codes vectors (layer 0 only).
    pub unseen: Option<&'a A>,
    pub starts: &'a [usize],
    pub lens: &'a [usize],
}

/// The codes that did not enter the backbone input, for the unseen-codes vector of `n` rows.
pub struct UnseenCodes<'a> {
    /// `[n, codebooks]` row-major: each row's c0..c(codebooks-1).
    pub codes: &'a [u32],
    pub codebooks: usize,
    /// First codebook summed (`vq_backbone_codebooks + 1`); codebooks `first..codebooks` are.
    pub first: usize,
    /// Whether each row itself is a semantic (audio) row; other rows get zero.
    pub row_semantic: &'a [bool],
}

/// Why a tower operation refused its input.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum TowerError {
    #[error("tower: rows at position {start} would leave a gap after the {cached} cached positions")]
    PositionGap { start: usize, cached: usize },
    #[error("tower: {what} has {found} entries, expected {expected}")]
    Length { what: &'static str, expected: usize, found: usize },
    #[error("tower: head {head} produced code {code}, outside the codebook of {vocab}")]
    CodeOutOfRange { head: usize, code: u32, vocab: usize },
    #[error("tower: the weights hold {found} {what}, the config implies {expected}")]
    Weights { what: &'static str, expected: usize, found: usize },
}

/// The tower's arithmetic, implemented by each backend.
pub trait TowerOps: BackendTypes {
    /// One tower layer's K/V cache for one request, indexed by backbone position.
    type TowerKv;

    /// An empty cache for one layer.
    fn tower_kv(&self, shape: &TowerShape) -> Self::TowerKv;

    /// Positions the cache holds (`0..len`).
    fn tower_kv_len(&self, kv: &Self::TowerKv) -> usize;

    /// `Σ_{i=first..codebooks} CB[i·V + c_i]` per semantic row, zero elsewhere (`model.md` §5).
    fn tower_unseen(&self, table: &Self::Weight, shape: &TowerShape, codes: &UnseenCodes<'_>) -> Self::Act;

    /// One tower layer (`model.md` §6 steps 1–5): mix the masked code embedding (plus the
    /// unseen vector) into the hidden with enorm/hnorm/eh_proj, then the pre-norm gated
    /// attention block over this layer's cache (writing rows `start..start + n`), the SwiGLU
    /// block and `final_layernorm`. Returns `[n, dim]`.
    fn tower_layer(
        &self,
        shape: &TowerShape,
        layer: &TowerLayer<Self::Weight>,
        kv: &mut Self::TowerKv,
        input: TowerLayerInput<'_, Self::Act>,
    ) -> Result<Self::Act, TowerError>;

    /// A codebook head: logits `[n, V]` from `[n, dim]`.
    fn tower_head(&self, head: &Self::Weight, hidden: &Self::Act) -> Self::Act;

    /// One tower layer over one row per request: row `i` is at position `starts[i]` of
    /// `kvs[i]`. Under the decode batch's contract (`BackboneOps::gdn_decode_rows`): each output
    /// row depends only on its own inputs and cache, bit for bit. The default runs each row alone.
    fn tower_layer_rows(
        &self,
        shape: &TowerShape,
        layer: &TowerLayer<Self::Weight>,
        kvs: &mut [&mut Self::TowerKv],
        input: TowerRowsInput<'_, Self::Act>,
    ) -> Result<Self::Act, TowerError> {
        let n = kvs.len();
        let check =
            |what, found| if found == n { Ok(()) } else { Err(TowerError::Length { what, expected: n, found }) };
        check("hidden rows", self.tower_act_shape(input.hidden).0)?;
        check("codes", input.codes.len())?;
        check("label mask", input.label_semantic.len())?;
        check("positions", input.starts.len())?;
        let unseen: Option<Vec<Self::Act>> = input.unseen.map(|u| (0..n).map(|i| self.act_rows(u, i, 1)).collect());
        let mut parts = Vec::with_capacity(n);
        for (i, kv) in kvs.iter_mut().enumerate() {
            let hidden = self.act_rows(input.hidden, i, 1);
            let row = TowerLayerInput {
                hidden: &hidden,
                codes: &input.codes[i..=i],
                label_semantic: &input.label_semantic[i..=i],
                unseen: unseen.as_ref().map(|u| &u[i]),
                start: input.starts[i],
            };
            parts.push(self.tower_layer(shape, layer, kv, row)?);
        }
        Ok(self.stack_rows(&parts))
    }

    /// [`Self::tower_layer`] of several requests' rows at once (prompt prefill): request `i`'s
    /// `lens[i]` rows continue `kvs[i]` at `starts[i]`. Each request's rows and cache must come
    /// out bit for bit as `tower_layer` gives them alone, whichever requests share the call. The
    /// default runs the requests one by one.
    fn tower_layer_many(
        &self,
        shape: &TowerShape,
        layer: &TowerLayer<Self::Weight>,
        kvs: &mut [&mut Self::TowerKv],
        input: TowerManyInput<'_, Self::Act>,
    ) -> Result<Self::Act, TowerError> {
        let n = kvs.len();
        let check =
            |what, found| if found == n { Ok(()) } else { Err(TowerError::Length { what, expected: n, found }) };
        check("positions", input.starts.len())?;
        check("row counts", input.lens.len())?;
        let total: usize = input.lens.iter().sum();
        if self.tower_act_shape(input.hidden).0 != total {
            return Err(TowerError::Length {
                what: "hidden rows",
                expected: total,
                found: self.tower_act_shape(input.hidden).0,
            });
        }
        let mut parts = Vec::with_capacity(n);
        let mut row0 = 0;
        for (i, kv) in kvs.iter_mut().enumerate() {
            let rows = row0..row0 + input.lens[i];
            let hidden = self.act_rows(input.hidden, row0, rows.len());
            let unseen = input.unseen.map(|u| self.act_rows(u, row0, rows.len()));
            let own = TowerLayerInput {
                hidden: &hidden,
                codes: input.codes.get(rows.clone()).unwrap_or(&[]),
                label_semantic: input.label_semantic.get(rows.clone()).unwrap_or(&[]),
                unseen: unseen.as_ref(),
                start: input.starts[i],
            };
            parts.push(self.tower_layer(shape, layer, kv, own)?);
            row0 = rows.end;
        }
        Ok(if parts.len() == 1 { parts.pop().expect("one part") } else { self.stack_rows(&parts) })
    }

    /// [`Self::tower_head`] under the decode batch's contract: a path that does not depend on
    /// the row count. The default is `tower_head`, right where that is already row by row.
    fn tower_head_rows(&self, head: &Self::Weight, hidden: &Self::Act) -> Self::Act {
        self.tower_head(head, hidden)
    }

    /// `(rows, cols)` of an activation.
    fn tower_act_shape(&self, a: &Self::Act) -> (usize, usize);

    /// An activation's values on the host, row-major (sampling and traces read these).
    fn tower_act_host(&self, a: &Self::Act) -> Vec<f32>;
}
