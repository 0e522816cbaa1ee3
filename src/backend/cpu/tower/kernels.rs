//! Plain loops the CPU tower layer is built from (`model.md` §6): linear, the zero-centred RMS
//! norm, interleaved RoPE and causal GQA attention. Every sum runs in f64 so the CPU result is
//! closer to exact than any f32 reference, and the golden comparison measures the references.

pub use crate::backend::cpu::scalar::{dot, sigmoid, silu};

/// `y[n, out] = x[n, in] · W[out, in]ᵀ`, each dot product accumulated in f64.
pub fn linear(x: &[f32], w: &[f32], inp: usize) -> Vec<f32> {
    assert_eq!(w.len() % inp, 0, "weight rows");
    assert_eq!(x.len() % inp, 0, "input rows");
    let out = w.len() / inp;
    let mut y = Vec::with_capacity(x.len() / inp * out);
    for xr in x.chunks_exact(inp) {
        y.extend(w.chunks_exact(inp).map(|wr| dot(xr, wr) as f32));
    }
    y
}

/// RMS norm with a zero-centred gain, `x / sqrt(mean(x²) + eps) · (1 + w)`, applied to every
/// `w.len()`-wide group of `x` (a row, or one head of a row) in place.
pub fn rms_norm_zero_centered(x: &mut [f32], w: &[f32], eps: f64) {
    for group in x.chunks_exact_mut(w.len()) {
        let mean_sq = group.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / w.len() as f64;
        let inv = 1.0 / (mean_sq + eps).sqrt();
        for (v, &g) in group.iter_mut().zip(w) {
            *v = (*v as f64 * inv * (1.0 + g as f64)) as f32;
        }
    }
}

/// Interleaved (GPT-J) RoPE in place on the first `rotary_dim` dims of each `head_dim`-wide
/// head of one row: pairs (0,1), (2,3), … rotate by `position · base^(−2i/rotary_dim)`.
///
/// The angle is rounded to f32 as S1's f32 cos/sin cache rounds it (S2 computes it in f32
/// too), so long positions agree with the references rather than with exact arithmetic; the
/// rotation itself is f32, as both references do it.
pub fn rope_interleaved(row: &mut [f32], head_dim: usize, rotary_dim: usize, base: f64, position: usize) {
    let pairs: Vec<(f32, f32)> = (0..rotary_dim / 2)
        .map(|i| {
            let inv_freq = base.powf(-((2 * i) as f64) / rotary_dim as f64) as f32;
            let angle = (position as f32 * inv_freq) as f64;
            (angle.cos() as f32, angle.sin() as f32)
        })
        .collect();
    for head in row.chunks_exact_mut(head_dim) {
        for (i, &(c, s)) in pairs.iter().enumerate() {
            let (even, odd) = (head[2 * i], head[2 * i + 1]);
            head[2 * i] = even * c - odd * s;
            head[2 * i + 1] = odd * c + even * s;
        }
    }
}

/// Causal GQA attention of one query row (all heads) over cached positions `0..=position`.
/// `k`/`v` hold `[positions, kv_heads·head_dim]`; query head `h` reads kv head
/// `h / (heads / kv_heads)`; scale `1/√head_dim`; softmax and the weighted sum in f64.
pub fn attend(q: &[f32], k: &[f32], v: &[f32], position: usize, kv_heads: usize, head_dim: usize) -> Vec<f32> {
    let heads = q.len() / head_dim;
    let group = heads / kv_heads;
    let width = kv_heads * head_dim;
    let scale = 1.0 / (head_dim as f64).sqrt();
    let mut out = vec![0.0f32; q.len()];
    for h in 0..heads {
        let qh = &q[h * head_dim..(h + 1) * head_dim];
        let kv_off = (h / group) * head_dim;
        let scores: Vec<f64> =
            (0..=position).map(|t| dot(qh, &k[t * width + kv_off..t * width + kv_off + head_dim]) * scale).collect();
        let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let weights: Vec<f64> = scores.iter().map(|&s| (s - max).exp()).collect();
        let total: f64 = weights.iter().sum();
        for (d, o) in out[h * head_dim..(h + 1) * head_dim].iter_mut().enumerate() {
            let acc: f64 = weights.iter().enumerate().map(|(t, &p)| p * v[t * width + kv_off + d] as f64).sum();
            *o = (acc / total) as f32;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linear_is_x_times_w_transposed() {
        // x = [[1, 2]], W = [[1, 0], [0, 1], [3, 4]] → [1, 2, 11]
        assert_eq!(linear(&[1.0, 2.0], &[1.0, 0.0, 0.0, 1.0, 3.0, 4.0], 2), vec![1.0, 2.0, 11.0]);
    }

    #[test]
    fn zero_centered_norm_uses_one_plus_w() {
        let mut x = vec![3.0, 4.0]; // rms = sqrt(12.5)
        rms_norm_zero_centered(&mut x, &[0.0, 1.0], 0.0);
        let r = 12.5f64.sqrt();
        assert!((x[0] as f64 - 3.0 / r).abs() < 1e-6);
        assert!((x[1] as f64 - 2.0 * 4.0 / r).abs() < 1e-6);
    }

    #[test]
    fn rope_rotates_adjacent_pairs_and_leaves_the_tail() {
        // head_dim 4, rotary 2: only dims (0, 1) rotate, by position·1 rad.
        let mut row = vec![1.0, 0.0, 5.0, 6.0];
        rope_interleaved(&mut row, 4, 2, 1e4, 1);
        assert!((row[0] - 1f32.cos()).abs() < 1e-6 && (row[1] - 1f32.sin()).abs() < 1e-6);
        assert_eq!(&row[2..], &[5.0, 6.0]);
        // Position 0 is the identity.
        let mut same = vec![0.3, -0.7, 1.0, 2.0];
        rope_interleaved(&mut same, 4, 4, 1e4, 0);
        assert_eq!(same, vec![0.3, -0.7, 1.0, 2.0]);
    }

    #[test]
    fn attention_over_one_position_returns_its_value() {
        // Two query heads sharing one kv head; a single cached position.
        let out = attend(&[1.0, 0.0, 0.0, 1.0], &[0.5, 0.5], &[7.0, -2.0], 0, 1, 2);
        assert_eq!(out, vec![7.0, -2.0, 7.0, -2.0]);
    }

    #[test]
    fn attention_weights_follow_scores() {
        // head_dim 1, scale 1: scores 0 and ln 3 → weights 1/4 and 3/4.
        let out = attend(&[1.0], &[0.0, 3f32.ln()], &[4.0, 8.0], 1, 1, 1);
        assert!((out[0] - 7.0).abs() < 1e-5, "{out:?}");
    }
}
