//! The Codebook-MTP tower's order of operations (`model.md` §6, §8.1): which code each of the 13
//! layers embeds, teacher-forced prefill over prompt rows, and one generated frame per step.
//!
//! Positions: every tower layer's cache is indexed by the backbone's row position, and a
//! [`TowerState`] covers rows `0..len` of one request.
//!
//! The last prompt row (the one generation starts from) has no label yet. S1 prefills it with
//! a placeholder label (EOS, so a zero embedding) and overwrites that cache slot when it samples
//! the first frame; S2 prefills rows `[0, T−1)` only and the first decode step writes row T−1.
//! Both leave the same caches (the golden checks S1's way against S2's). This follows S2: a
//! prefill never writes its last row, so nothing is computed twice and chunked prefill needs
//! nothing special (each chunk passes one extra row as the label of its last written row).

use std::ops::RangeInclusive;

use crate::backend::tower::{
    TowerError, TowerLayerInput, TowerManyInput, TowerOps, TowerRowsInput, TowerShape, UnseenCodes,
};
use crate::model::config::ModelConfig;
use crate::model::frame::Rows;
use crate::model::weights::TowerWeights;

/// The tower of one model: weights, sizes and the frame conventions it needs.
pub struct Tower<'w, B: TowerOps> {
    backend: &'w B,
    weights: &'w TowerWeights<B::Weight>,
    shape: TowerShape,
    shared_layers: usize,
    codebooks: usize,
    /// `vq_backbone_codebooks` (k): codebooks 1..=k entered the backbone input.
    backbone_codebooks: usize,
    semantic: RangeInclusive<u32>,
}

/// One request's tower caches, one per layer, covering positions `0..len`.
pub struct TowerState<B: TowerOps> {
    caches: Vec<B::TowerKv>,
    len: usize,
}

impl<B: TowerOps> TowerState<B> {
    /// Positions written: the next row the tower will write.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The per-layer caches (shared layers first, then residual layers).
    pub fn caches(&self) -> &[B::TowerKv] {
        &self.caches
    }

    /// The caches for a backend-specific step (a device-side frame that addresses them itself).
    pub fn caches_mut(&mut self) -> &mut [B::TowerKv] {
        &mut self.caches
    }

    /// Counts one more position, written in every cache by a backend-specific step (the decode
    /// batch's device-side draws run the layers themselves).
    pub fn advance(&mut self) {
        self.len += 1;
    }

    /// Counts `len` positions written into every cache by a restore of saved state
    /// (`engine::prefix`).
    pub fn restored(&mut self, len: usize) {
        self.len = len;
    }

    /// Restarts for a new request without reallocating: no positions, each cache emptied by
    /// `clear` (for engines that keep one state's addresses for their whole life).
    pub fn restart(&mut self, clear: &mut dyn FnMut(&mut B::TowerKv)) {
        self.caches.iter_mut().for_each(clear);
        self.len = 0;
    }
}

/// Every layer's output and every head's logits for a block of rows (host copies).
#[derive(Clone, Debug, PartialEq)]
pub struct TowerTrace {
    pub rows: usize,
    /// Per tower layer, `[rows, dim]` row-major.
    pub layers: Vec<Vec<f32>>,
    /// Per head r (predicting codebook r + 1), `[rows, V]` row-major.
    pub heads: Vec<Vec<f32>>,
}

impl<'w, B: TowerOps> Tower<'w, B> {
    pub fn new(backend: &'w B, weights: &'w TowerWeights<B::Weight>, config: &ModelConfig) -> Result<Self, TowerError> {
        let a = &config.audio_decoder_config;
        let expected_layers = a.shared_enrichment_layers + a.num_codebooks - 1;
        let check = |what, expected, found| {
            if expected == found { Ok(()) } else { Err(TowerError::Weights { what, expected, found }) }
        };
        check("layers", expected_layers, weights.layers.len())?;
        check("heads", a.num_codebooks - 1, weights.heads.len())?;
        Ok(Tower {
            backend,
            weights,
            shape: TowerShape::from_config(config),
            shared_layers: a.shared_enrichment_layers,
            codebooks: a.num_codebooks,
            backbone_codebooks: a.vq_backbone_codebooks,
            semantic: config.semantic_start_token_id..=config.semantic_end_token_id,
        })
    }

    pub fn shape(&self) -> &TowerShape {
        &self.shape
    }

    /// Empty caches for a new request.
    pub fn new_state(&self) -> TowerState<B> {
        TowerState {
            caches: (0..self.weights.layers.len()).map(|_| self.backend.tower_kv(&self.shape)).collect(),
            len: 0,
        }
    }

    /// Whether `token` is in the semantic band (the tower's label mask).
    pub fn is_semantic(&self, token: u32) -> bool {
        self.semantic.contains(&token)
    }

    pub fn weights(&self) -> &'w TowerWeights<B::Weight> {
        self.weights
    }

    /// Shared enrichment layers (they embed c0); residual layer r follows at `shared_layers + r`.
    pub fn shared_layers(&self) -> usize {
        self.shared_layers
    }

    /// Codes per frame row (c0..c9).
    pub fn codebooks(&self) -> usize {
        self.codebooks
    }

    /// `vq_backbone_codebooks` (k): the unseen-codes vector sums codebooks k+1.. of the input row.
    pub fn backbone_codebooks(&self) -> usize {
        self.backbone_codebooks
    }

    /// Teacher-forced prefill. `rows[0]` is at position `state.len()`; every row but the last is
    /// written, labelled by its successor (`model.md` §6 "Prefill"): shared layers embed c0 of
    /// row p+1, residual layer r embeds c_r of row p+1, masked by "row p+1 is semantic"; layer 0
    /// adds the unseen codes of row p. `hidden` holds the backbone's final-norm rows for `rows`
    /// (the last may be omitted: it is not used).
    pub fn prefill(&self, state: &mut TowerState<B>, hidden: &B::Act, rows: &Rows) -> Result<(), TowerError> {
        self.prefill_inner(state, hidden, rows, None)
    }

    /// [`Tower::prefill`] of several requests at once: `rows[i]` continues `states[i]`, and
    /// `hidden[i]` holds its backbone rows (as `prefill` takes them). Every layer runs once over
    /// all requests' written rows (`TowerOps::tower_layer_many`), so each request's cache is bit
    /// for bit what `prefill` makes of it alone, and the weights are read once per layer instead
    /// of once per request.
    pub fn prefill_many(
        &self,
        states: &mut [&mut TowerState<B>],
        hidden: &[&B::Act],
        rows: &[Rows],
    ) -> Result<(), TowerError> {
        let requests = states.len();
        for (what, found) in [("backbone row sets", hidden.len()), ("prompt chunks", rows.len())] {
            if found != requests {
                return Err(TowerError::Length { what, expected: requests, found });
            }
        }
        // Request i writes n_i = rows_i − 1 rows (each labelled by its successor).
        let mut written: Vec<usize> = Vec::new();
        let mut parts: Vec<B::Act> = Vec::new();
        let (mut inputs, mut labels): (Vec<&[u32]>, Vec<&[u32]>) = (Vec::new(), Vec::new());
        for (i, r) in rows.iter().enumerate() {
            self.check_width(r.codebooks())?;
            let n = r.len().saturating_sub(1);
            let (hidden_rows, _) = self.backend.tower_act_shape(hidden[i]);
            if hidden_rows != n && hidden_rows != r.len() {
                return Err(TowerError::Length { what: "backbone rows", expected: r.len(), found: hidden_rows });
            }
            written.push(n);
            if n > 0 {
                parts.push(self.backend.act_rows(hidden[i], 0, n));
                inputs.extend((0..n).map(|p| r.row(p)));
                labels.extend((1..=n).map(|p| r.row(p)));
            }
        }
        let active: Vec<usize> = (0..requests).filter(|&i| written[i] > 0).collect();
        if active.is_empty() {
            return Ok(());
        }
        let h0 = if parts.len() == 1 { parts.pop().expect("one part") } else { self.backend.stack_rows(&parts) };
        let mask: Vec<bool> = labels.iter().map(|l| self.is_semantic(l[0])).collect();
        let unseen = self.unseen(&inputs);
        let lens: Vec<usize> = active.iter().map(|&i| written[i]).collect();
        let starts: Vec<usize> = active.iter().map(|&i| states[i].len).collect();
        // Shared layers embed c0 of the label (layer 0 adds the unseen codes); residual layer r
        // embeds c_r (label column 1 + r), as `prefill` does.
        let mut h: Option<B::Act> = None;
        for index in 0..self.weights.layers.len() {
            let column = 1 + index.saturating_sub(self.shared_layers);
            let codes: Vec<u32> = labels.iter().map(|l| l[column]).collect();
            let mut kvs: Vec<&mut B::TowerKv> = Vec::with_capacity(active.len());
            for (i, state) in states.iter_mut().enumerate() {
                if written[i] > 0 {
                    kvs.push(&mut state.caches[index]);
                }
            }
            let input = TowerManyInput {
                hidden: h.as_ref().unwrap_or(&h0),
                codes: &codes,
                label_semantic: &mask,
                unseen: (index == 0).then_some(&unseen),
                starts: &starts,
                lens: &lens,
            };
            h = Some(self.backend.tower_layer_many(&self.shape, &self.weights.layers[index], &mut kvs, input)?);
        }
        for &i in &active {
            states[i].len += written[i];
        }
        Ok(())
    }

    /// [`Tower::prefill`], also returning every layer's output and every head's logits per
    /// written row (what the golden compares and `trace` dumps).
    pub fn prefill_traced(
        &self,
        state: &mut TowerState<B>,
        hidden: &B::Act,
        rows: &Rows,
    ) -> Result<TowerTrace, TowerError> {
        let mut trace = TowerTrace { rows: rows.len().saturating_sub(1), layers: Vec::new(), heads: Vec::new() };
        self.prefill_inner(state, hidden, rows, Some(&mut trace))?;
        Ok(trace)
    }

    fn prefill_inner(
        &self,
        state: &mut TowerState<B>,
        hidden: &B::Act,
        rows: &Rows,
        mut trace: Option<&mut TowerTrace>,
    ) -> Result<(), TowerError> {
        self.check_width(rows.codebooks())?;
        let n = rows.len().saturating_sub(1);
        let (hidden_rows, _) = self.backend.tower_act_shape(hidden);
        if hidden_rows != n && hidden_rows != rows.len() {
            return Err(TowerError::Length { what: "backbone rows", expected: rows.len(), found: hidden_rows });
        }
        if n == 0 {
            return Ok(());
        }
        let hidden = self.backend.act_rows(hidden, 0, n);
        let inputs: Vec<&[u32]> = (0..n).map(|p| rows.row(p)).collect();
        let labels: Vec<&[u32]> = (1..=n).map(|p| rows.row(p)).collect();
        let mask: Vec<bool> = labels.iter().map(|l| self.is_semantic(l[0])).collect();
        let mut h = self.shared(state, &hidden, &inputs, &labels, &mask, trace.as_deref_mut())?;
        for r in 0..self.codebooks - 1 {
            let codes: Vec<u32> = labels.iter().map(|l| l[1 + r]).collect();
            h = self.residual(state, r, &h, &codes, &mask, trace.as_deref_mut())?;
            if let Some(t) = trace.as_deref_mut() {
                let logits = self.backend.tower_head(&self.weights.heads[r], &h);
                t.heads.push(self.backend.tower_act_host(&logits));
            }
        }
        state.len += n;
        Ok(())
    }

    /// One generated frame at position `state.len()` (`model.md` §8.1 steps 3–4): `h_t` is the
    /// backbone's final-norm row for `input_row` (the row at that position), `main` the sampled
    /// main token. The 4 shared layers embed c0 of the new frame, then residual layer r embeds
    /// c_r and `sample_head(r, logits)` picks c_{r+1}. Every layer masks its embedding by "main
    /// is semantic"; an EOS frame still runs the whole tower (as S1 does). Returns `[c0..c9]`.
    pub fn frame(
        &self,
        state: &mut TowerState<B>,
        h_t: &B::Act,
        input_row: &[u32],
        main: u32,
        sample_head: &mut dyn FnMut(usize, &[f32]) -> u32,
    ) -> Result<Vec<u32>, TowerError> {
        self.frame_inner(state, h_t, input_row, main, sample_head, None)
    }

    /// [`Tower::frame`] teacher-forced with the given next frame `[main, c0..c9]`: returns every
    /// layer's output and every head's logits instead of sampling.
    pub fn frame_traced(
        &self,
        state: &mut TowerState<B>,
        h_t: &B::Act,
        input_row: &[u32],
        next_frame: &[u32],
    ) -> Result<TowerTrace, TowerError> {
        self.check_width(next_frame.len().saturating_sub(1))?;
        let mut trace = TowerTrace { rows: 1, layers: Vec::new(), heads: Vec::new() };
        let mut given = |r: usize, _: &[f32]| next_frame[2 + r];
        self.frame_inner(state, h_t, input_row, next_frame[0], &mut given, Some(&mut trace))?;
        Ok(trace)
    }

    fn frame_inner(
        &self,
        state: &mut TowerState<B>,
        h_t: &B::Act,
        input_row: &[u32],
        main: u32,
        sample_head: &mut dyn FnMut(usize, &[f32]) -> u32,
        mut trace: Option<&mut TowerTrace>,
    ) -> Result<Vec<u32>, TowerError> {
        self.check_width(input_row.len().saturating_sub(1))?;
        let (rows, _) = self.backend.tower_act_shape(h_t);
        if rows != 1 {
            return Err(TowerError::Length { what: "backbone rows", expected: 1, found: rows });
        }
        let vocab = self.shape.codebook_vocab as u32;
        let c0 = main.saturating_sub(*self.semantic.start()).min(vocab - 1);
        let mask = [self.is_semantic(main)];
        // Shared layers read only the label's c0; the rest of this label row is filled as sampled.
        let mut label = vec![main, c0];
        label.resize(1 + self.codebooks, 0);
        let mut h = self.shared(state, h_t, &[input_row], &[&label], &mask, trace.as_deref_mut())?;
        let mut codes = vec![c0];
        for r in 0..self.codebooks - 1 {
            h = self.residual(state, r, &h, &[codes[r]], &mask, trace.as_deref_mut())?;
            let logits = self.backend.tower_act_host(&self.backend.tower_head(&self.weights.heads[r], &h));
            let code = sample_head(r, &logits);
            if code >= vocab {
                return Err(TowerError::CodeOutOfRange { head: r, code, vocab: vocab as usize });
            }
            if let Some(t) = trace.as_deref_mut() {
                t.heads.push(logits);
            }
            codes.push(code);
        }
        state.len += 1;
        Ok(codes)
    }

    /// One generated frame for each of several requests at once (the decode batch; [`Tower::frame`]
    /// is the same for one). `h` row `i` is request `i`'s backbone final-norm row for
    /// `input_rows[i]`, `mains[i]` its sampled main token. Every operation runs under the decode batch's contract (`tower_layer_rows`),
    /// so each request's codes are what they would be beside any others. `sample_head(r, logits)`
    /// picks c_{r+1} of every row from head r's logits `[n, V]` (row-major). Returns each
    /// `[c0..c9]`.
    pub fn frame_rows(
        &self,
        states: &mut [&mut TowerState<B>],
        h: &B::Act,
        input_rows: &[&[u32]],
        mains: &[u32],
        sample_head: &mut dyn FnMut(usize, &[f32]) -> Vec<u32>,
    ) -> Result<Vec<Vec<u32>>, TowerError> {
        let n = states.len();
        let check =
            |what, found| if found == n { Ok(()) } else { Err(TowerError::Length { what, expected: n, found }) };
        check("backbone rows", self.backend.tower_act_shape(h).0)?;
        check("input rows", input_rows.len())?;
        check("main tokens", mains.len())?;
        for row in input_rows {
            self.check_width(row.len().saturating_sub(1))?;
        }
        let vocab = self.shape.codebook_vocab;
        let mask: Vec<bool> = mains.iter().map(|&m| self.is_semantic(m)).collect();
        let starts: Vec<usize> = states.iter().map(|s| s.len).collect();
        let mut codes: Vec<Vec<u32>> =
            mains.iter().map(|&m| vec![m.saturating_sub(*self.semantic.start()).min(vocab as u32 - 1)]).collect();
        let unseen = self.unseen(input_rows);
        // Shared layers embed c0 (layer 0 adds the unseen codes); residual layer r embeds c_r.
        let mut hidden: Option<B::Act> = None;
        for index in 0..self.weights.layers.len() {
            let r = index.checked_sub(self.shared_layers);
            let labels: Vec<u32> = codes.iter().map(|c| c[r.unwrap_or(0)]).collect();
            let mut kvs: Vec<&mut B::TowerKv> = states.iter_mut().map(|s| &mut s.caches[index]).collect();
            let input = TowerRowsInput {
                hidden: hidden.as_ref().unwrap_or(h),
                codes: &labels,
                label_semantic: &mask,
                unseen: (index == 0).then_some(&unseen),
                starts: &starts,
            };
            let out = self.backend.tower_layer_rows(&self.shape, &self.weights.layers[index], &mut kvs, input)?;
            if let Some(r) = r {
                // Head r reads residual layer r's output and picks c_{r+1} of every row.
                let logits = self.backend.tower_act_host(&self.backend.tower_head_rows(&self.weights.heads[r], &out));
                let picked = sample_head(r, &logits);
                check("head draws", picked.len())?;
                for (row_codes, code) in codes.iter_mut().zip(picked) {
                    if code as usize >= vocab {
                        return Err(TowerError::CodeOutOfRange { head: r, code, vocab });
                    }
                    row_codes.push(code);
                }
            }
            hidden = Some(out);
        }
        for state in states.iter_mut() {
            state.len += 1;
        }
        Ok(codes)
    }

    /// The shared enrichment layers: each embeds c0 of the label row; layer 0 also adds the
    /// unseen codes of the input row.
    fn shared(
        &self,
        state: &mut TowerState<B>,
        hidden: &B::Act,
        inputs: &[&[u32]],
        labels: &[&[u32]],
        mask: &[bool],
        mut trace: Option<&mut TowerTrace>,
    ) -> Result<B::Act, TowerError> {
        let unseen = self.unseen(inputs);
        let c0: Vec<u32> = labels.iter().map(|l| l[1]).collect();
        let mut h = self.layer(state, 0, hidden, &c0, mask, Some(&unseen), trace.as_deref_mut())?;
        for l in 1..self.shared_layers {
            h = self.layer(state, l, &h, &c0, mask, None, trace.as_deref_mut())?;
        }
        Ok(h)
    }

    /// Residual layer r (embedding c_r of the label).
    fn residual(
        &self,
        state: &mut TowerState<B>,
        r: usize,
        hidden: &B::Act,
        codes: &[u32],
        mask: &[bool],
        trace: Option<&mut TowerTrace>,
    ) -> Result<B::Act, TowerError> {
        self.layer(state, self.shared_layers + r, hidden, codes, mask, None, trace)
    }

    /// The unseen-codes vector of each input row (its codebooks past the backbone's k, if the
    /// row is semantic).
    fn unseen(&self, inputs: &[&[u32]]) -> B::Act {
        let flat: Vec<u32> = inputs.iter().flat_map(|row| row[1..].iter().copied()).collect();
        let row_semantic: Vec<bool> = inputs.iter().map(|row| self.is_semantic(row[0])).collect();
        self.backend.tower_unseen(
            &self.weights.codebook_embeddings,
            &self.shape,
            &UnseenCodes {
                codes: &flat,
                codebooks: self.codebooks,
                first: self.backbone_codebooks + 1,
                row_semantic: &row_semantic,
            },
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn layer(
        &self,
        state: &mut TowerState<B>,
        index: usize,
        hidden: &B::Act,
        codes: &[u32],
        mask: &[bool],
        unseen: Option<&B::Act>,
        trace: Option<&mut TowerTrace>,
    ) -> Result<B::Act, TowerError> {
        let input = TowerLayerInput { hidden, codes, label_semantic: mask, unseen, start: state.len };
        let out =
            self.backend.tower_layer(&self.shape, &self.weights.layers[index], &mut state.caches[index], input)?;
        if let Some(t) = trace {
            t.layers.push(self.backend.tower_act_host(&out));
        }
        Ok(out)
    }

    fn check_width(&self, codebooks: usize) -> Result<(), TowerError> {
        if codebooks == self.codebooks {
            Ok(())
        } else {
            Err(TowerError::Length { what: "codes per frame row", expected: self.codebooks, found: codebooks })
        }
    }
}
