//! Token sampling (`model.md` §8.1 step 2 and 4, §8.2, §8.3): top-k / top-p with temperature
//! before top-p, the main token's repetition-aware second draw (RAS), and the codebook heads.
//!
//! Written from S1 `sampling.py` (`sample_top_k_top_p`, `sample_semantic_with_ras`) and its
//! Triton kernels (`sampling_selection.py`). One draw over logits `x` (one row):
//!
//! 1. scores `s_i = x_i / max(T, 1e-5)` in f32 (so T = 0 is greedy);
//! 2. rank by score, descending; equal scores rank the lower index first (S1's kernels do; its
//!    PyTorch path leaves tie order to an unstable sort);
//! 3. weights `w_r = exp(s_r - s_0)` and probabilities `p_r = w_r / Σ w` over the FULL row (f64);
//! 4. rank r > 0 is dropped if `r >= top_k`, or by top-p: for heads if `Σ_{i<=r} p_i > top_p`
//!    (the crossing token is dropped), for main draws if `Σ_{i<r} p_i > top_p` (kept, so EOS stays
//!    reachable); rank 0 is always kept, and the kept ranks are a prefix;
//! 5. pick `argmax_r w_r / E(candidate_r)` over the kept ranks, `E` the candidate's Exp(1)
//!    variate from `rng::DrawKey` (the exponential race, S1's method: P(r) = w_r / Σ_kept w);
//!    an exact tie goes to the better rank.
//!
//! Where S1 computes step 3 in f32 we accumulate in f64; picks differ only when a cumulative sum
//! lies within f32 rounding of `top_p`, or two race values within rounding of each other.

use super::rng::{DrawKey, MAIN_STREAM, RAS_STREAM};
use crate::checkpoint::tokenizer::SpecialTokenIds;
use crate::model::frame::Rows;

/// Temperatures below this act as this (greedy up to exact ties).
pub const MIN_TEMPERATURE: f32 = 1e-5;
/// RAS looks back over the main tokens of this many frames.
pub const RAS_WINDOW: usize = 16;
/// The RAS draw's fixed parameters (not request parameters).
pub const RAS_TEMPERATURE: f32 = 1.0;
pub const RAS_TOP_K: usize = 30;
pub const RAS_TOP_P: f32 = 0.95;
/// Codebook heads sample with `top_k = min(request top_k, 30)`; wider caps cost speaker similarity.
pub const HEAD_TOP_K_CAP: usize = 30;
/// The largest top_k a request may give (S1 stores it as int32); no top_k means no cap.
pub const MAX_TOP_K: u32 = i32::MAX as u32;

/// A request's sampling knobs. Defaults are Drama 3's (S1 0.1.9): T 1.0, top-p 0.9, no main top-k.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplingParams {
    pub temperature: f32,
    pub top_p: f32,
    /// Cap on the main token's candidates; `None` keeps all. Heads use `min(top_k, 30)`.
    pub top_k: Option<u32>,
}

impl Default for SamplingParams {
    fn default() -> SamplingParams {
        SamplingParams { temperature: 1.0, top_p: 0.9, top_k: None }
    }
}

/// A sampling knob out of range (S1 `request_builders.py` ranges); names the request field.
#[derive(Clone, Copy, Debug, PartialEq, thiserror::Error)]
pub enum ParamsError {
    #[error("temperature must be finite and >= 0; got {0}")]
    Temperature(f32),
    #[error("top_p must be in (0, 1]; got {0}")]
    TopP(f32),
    #[error("top_k must be in [1, {MAX_TOP_K}]; got {0}")]
    TopK(u32),
}

impl ParamsError {
    /// The request field at fault.
    pub fn field(&self) -> &'static str {
        match self {
            ParamsError::Temperature(_) => "temperature",
            ParamsError::TopP(_) => "top_p",
            ParamsError::TopK(_) => "top_k",
        }
    }
}

impl SamplingParams {
    pub fn validate(&self) -> Result<(), ParamsError> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(ParamsError::Temperature(self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(ParamsError::TopP(self.top_p));
        }
        match self.top_k {
            Some(k) if !(1..=MAX_TOP_K).contains(&k) => Err(ParamsError::TopK(k)),
            _ => Ok(()),
        }
    }

    /// The main token's first draw.
    pub fn main_filter(&self) -> Filter {
        let top_k = self.top_k.map_or(usize::MAX, |k| k as usize);
        Filter { temperature: self.temperature, top_k, top_p: self.top_p, crossing: Crossing::Keep }
    }

    /// The codebook heads' draws.
    pub fn head_filter(&self) -> Filter {
        let top_k = self.top_k.map_or(HEAD_TOP_K_CAP, |k| (k as usize).min(HEAD_TOP_K_CAP));
        Filter { temperature: self.temperature, top_k, top_p: self.top_p, crossing: Crossing::Drop }
    }
}

/// The RAS draw's fixed filter.
pub const RAS_FILTER: Filter =
    Filter { temperature: RAS_TEMPERATURE, top_k: RAS_TOP_K, top_p: RAS_TOP_P, crossing: Crossing::Keep };

/// What happens to the token whose cumulative probability first exceeds top_p.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Crossing {
    /// Main-token draws keep it (EOS stays reachable).
    Keep,
    /// Codebook heads drop it (unless it ranks first).
    Drop,
}

/// The parameters of one draw.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Filter {
    pub temperature: f32,
    pub top_k: usize,
    pub top_p: f32,
    pub crossing: Crossing,
}

/// Logits that cannot be sampled: a bug upstream, reported rather than sampled from.
#[derive(Clone, Copy, Debug, PartialEq, thiserror::Error)]
pub enum SamplingError {
    #[error("logit {index} scales to {score} (logits must be finite or -inf)")]
    NonFinite { index: usize, score: f32 },
    #[error("no candidate has a finite logit")]
    NoCandidates,
}

/// The candidates a filter keeps, best first: `(index in the row, weight w_r)`, weights relative
/// to the best (`w_0 = 1`). Their probabilities are the weights over their sum.
pub fn kept_candidates(logits: &[f32], filter: &Filter) -> Result<Vec<(usize, f64)>, SamplingError> {
    let divisor = filter.temperature.max(MIN_TEMPERATURE);
    let scores: Vec<f32> = logits.iter().map(|&x| x / divisor).collect();
    if let Some((index, &score)) = scores.iter().enumerate().find(|(_, s)| s.is_nan() || **s == f32::INFINITY) {
        return Err(SamplingError::NonFinite { index, score });
    }
    // Best first, ties by index: the order is unique, so an unstable sort gives the stable one's.
    // Sorted as one integer key per candidate (the host draws of a decode batch sort thousands
    // of rows per step): `descending_key` orders scores as `partial_cmp` does, with -0.0 and 0.0
    // equal as in S1's keys; the index in the low bits breaks ties.
    let mut keys: Vec<u64> =
        (scores.iter().enumerate()).map(|(i, &s)| (u64::from(descending_key(s)) << 32) | i as u64).collect();
    keys.sort_unstable();
    let order: Vec<usize> = keys.iter().map(|&k| (k & u64::from(u32::MAX)) as usize).collect();
    let best = match order.first() {
        Some(&i) if scores[i] > f32::NEG_INFINITY => f64::from(scores[i]),
        _ => return Err(SamplingError::NoCandidates),
    };
    let weights: Vec<f64> = order.iter().map(|&i| (f64::from(scores[i]) - best).exp()).collect();
    let total: f64 = weights.iter().sum();
    let top_p = f64::from(filter.top_p);
    let mut kept = vec![(order[0], weights[0])];
    let mut cumulative = weights[0] / total;
    for r in 1..order.len().min(filter.top_k) {
        let before = cumulative;
        cumulative += weights[r] / total;
        let passed = match filter.crossing {
            Crossing::Keep => before,
            Crossing::Drop => cumulative,
        };
        if passed > top_p {
            break;
        }
        kept.push((order[r], weights[r]));
    }
    Ok(kept)
}

/// A key whose ascending order is the descending order of non-NaN scores (-0.0 as 0.0): the
/// IEEE bits made monotone (negative values flipped whole, positive ones with the sign bit set),
/// then inverted.
fn descending_key(score: f32) -> u32 {
    let bits = (score + 0.0).to_bits(); // -0.0 + 0.0 = +0.0
    let ascending = if bits & 0x8000_0000 != 0 { !bits } else { bits | 0x8000_0000 };
    !ascending
}

/// The exponential race over kept candidates: the index with the largest `w / E(index)`.
pub fn race(kept: &[(usize, f64)], key: &DrawKey) -> usize {
    let mut best = (kept[0].0, f64::NEG_INFINITY);
    for &(index, weight) in kept {
        let value = weight / key.exponential(u32::try_from(index).expect("row index fits u32"));
        // Strictly greater: an exact tie keeps the better-ranked candidate.
        if value > best.1 {
            best = (index, value);
        }
    }
    best.0
}

/// One draw: the index in `logits` of the sampled candidate.
pub fn sample_top_k_top_p(logits: &[f32], filter: &Filter, key: &DrawKey) -> Result<usize, SamplingError> {
    Ok(race(&kept_candidates(logits, filter)?, key))
}

/// The restricted main-token vocabulary: the semantic band plus EOS, in ascending token-id order
/// (S1 `main_token_candidate_ids`). Row i of the restricted logits is token `ids()[i]`; its Philox
/// counter is i.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MainCandidates {
    ids: Vec<u32>,
    semantic_start: u32,
    semantic_end: u32,
}

impl MainCandidates {
    /// The band `semantic_start .. semantic_start + codes` plus `eos`, ascending.
    pub fn new(semantic_start: u32, codes: u32, eos: u32) -> MainCandidates {
        assert!(codes > 0, "a semantic band needs at least one code");
        let semantic_end = semantic_start + (codes - 1);
        let mut ids: Vec<u32> = (semantic_start..=semantic_end).collect();
        ids.push(eos);
        ids.sort_unstable();
        ids.dedup();
        MainCandidates { ids, semantic_start, semantic_end }
    }

    pub fn from_special_tokens(special: &SpecialTokenIds) -> MainCandidates {
        MainCandidates::new(special.semantic_start, special.semantic_end - special.semantic_start + 1, special.eos())
    }

    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// The token id of restricted row `index`.
    pub fn token(&self, index: usize) -> u32 {
        self.ids[index]
    }

    pub fn is_semantic(&self, token: u32) -> bool {
        (self.semantic_start..=self.semantic_end).contains(&token)
    }

    /// `c0` of a frame whose main token is `token`: clamp(token − semantic_start, 0, V − 1), so an
    /// EOS frame carries a valid (masked) code.
    pub fn code0(&self, token: u32) -> u32 {
        token.saturating_sub(self.semantic_start).min(self.semantic_end - self.semantic_start)
    }
}

/// The main tokens of the last `RAS_WINDOW` rows, oldest first; fewer rows leave empty slots.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RasWindow {
    slots: [Option<u32>; RAS_WINDOW],
}

impl RasWindow {
    /// The window at the first decode step: the last prompt rows' tokens (S1 and S2 both start
    /// from the prompt; a short user turn can leave reference audio rows in it).
    pub fn from_prompt(rows: &Rows) -> RasWindow {
        RasWindow::from_tokens((0..rows.len()).map(|t| rows.token(t)))
    }

    /// The window after pushing `tokens` in order into an empty one (only the last 16 remain).
    pub fn from_tokens(tokens: impl IntoIterator<Item = u32>) -> RasWindow {
        let mut window = RasWindow { slots: [None; RAS_WINDOW] };
        for token in tokens {
            window.push(token);
        }
        window
    }

    /// Appends a frame's main token, forgetting the oldest.
    pub fn push(&mut self, token: u32) {
        self.slots.rotate_left(1);
        self.slots[RAS_WINDOW - 1] = Some(token);
    }

    pub fn contains(&self, token: u32) -> bool {
        self.slots.contains(&Some(token))
    }

    /// The tokens it holds, oldest first (at most `RAS_WINDOW`): what a device-side sampler's
    /// window is loaded from.
    pub fn tokens(&self) -> Vec<u32> {
        self.slots.iter().flatten().copied().collect()
    }
}

/// The main token of one frame and how it was chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MainPick {
    /// The frame's main token (a semantic token or EOS).
    pub token: u32,
    /// The first draw's token.
    pub first: u32,
    /// The RAS draw's token (always drawn; its randomness is its own stream).
    pub ras: u32,
    /// Whether the RAS draw replaced the first: the first was semantic and in the window.
    pub ras_used: bool,
}

/// Samples frame `frame`'s main token from the restricted logits (one per `candidates` row).
/// The caller appends `token` to the window and stops on EOS.
pub fn sample_main(
    logits: &[f32],
    candidates: &MainCandidates,
    window: &RasWindow,
    params: &SamplingParams,
    seed: u64,
    frame: u64,
) -> Result<MainPick, SamplingError> {
    assert_eq!(logits.len(), candidates.len(), "one restricted logit per main-token candidate");
    let first =
        candidates.token(sample_top_k_top_p(logits, &params.main_filter(), &DrawKey::new(seed, frame, MAIN_STREAM))?);
    let ras = candidates.token(sample_top_k_top_p(logits, &RAS_FILTER, &DrawKey::new(seed, frame, RAS_STREAM))?);
    let ras_used = candidates.is_semantic(first) && window.contains(first);
    Ok(MainPick { token: if ras_used { ras } else { first }, first, ras, ras_used })
}

/// Samples code `c_{r+1}` from codebook head `r`'s logits (one per code).
pub fn sample_head(
    logits: &[f32],
    r: usize,
    params: &SamplingParams,
    seed: u64,
    frame: u64,
) -> Result<u32, SamplingError> {
    let code = sample_top_k_top_p(logits, &params.head_filter(), &DrawKey::head(seed, frame, r))?;
    Ok(u32::try_from(code).expect("codebook sizes fit u32"))
}

#[cfg(test)]
mod tests {
    use super::{RAS_WINDOW, RasWindow, descending_key};

    /// A window's tokens (what a device sampler's window is loaded from) are the last
    /// `RAS_WINDOW` pushed, oldest first, and hold exactly what `contains` sees.
    #[test]
    fn window_tokens_are_the_last_pushed_oldest_first() {
        assert!(RasWindow::from_tokens([]).tokens().is_empty());
        assert_eq!(RasWindow::from_tokens([7, 8, 9]).tokens(), vec![7, 8, 9]);
        let mut window = RasWindow::from_tokens(100..130);
        assert_eq!(window.tokens(), (114..130).collect::<Vec<u32>>());
        window.push(5);
        let tokens = window.tokens();
        assert_eq!(tokens.len(), RAS_WINDOW);
        assert_eq!((tokens[0], tokens[RAS_WINDOW - 1]), (115, 5));
        assert!(tokens.iter().all(|&t| window.contains(t)) && !window.contains(114));
        assert_eq!(RasWindow::from_tokens(tokens.iter().copied()), window);
    }

    /// The integer keys sort scores exactly as the comparator they replace: best first, -0.0 and
    /// 0.0 equal (so their ties break by index), -inf last.
    #[test]
    fn descending_keys_order_as_partial_cmp() {
        let mut scores = vec![0.0f32, -0.0, 1.5, -1.5, f32::NEG_INFINITY, f32::MAX, -f32::MAX, 1e-45, -1e-45, 3.0, 3.0];
        let mut x = 0x9e37_79b9u32;
        for _ in 0..2000 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            let v = f32::from_bits(x);
            if !v.is_nan() && v != f32::INFINITY {
                scores.push(v);
            }
        }
        let mut by_cmp: Vec<usize> = (0..scores.len()).collect();
        by_cmp.sort_by(|&a, &b| scores[b].partial_cmp(&scores[a]).unwrap().then(a.cmp(&b)));
        let mut by_key: Vec<usize> = (0..scores.len()).collect();
        by_key.sort_by_key(|&i| (descending_key(scores[i]), i));
        assert_eq!(by_key, by_cmp);
        assert_eq!(descending_key(0.0), descending_key(-0.0));
    }
}
