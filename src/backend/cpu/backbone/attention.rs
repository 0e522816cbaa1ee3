//! Gated full attention on the CPU (`backbone.md` §2): per-head [query | gate] split of `q_proj`,
//! zero-centred q/k norms, partial NeoX RoPE, GQA causal softmax over the KV cache, output times
//! sigmoid(gate), `o_proj`.

use super::linear::{linear, poisoned, sigmoid};
use super::norm::rms_norm_into;
use crate::backend::backbone::AttentionShape;
use crate::backend::cpu::{CpuWeight, Matrix};
use crate::model::weights::AttentionWeights;

/// Keys (after k_norm and RoPE) and raw values of every position so far, `[len, kv_heads, head_dim]`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KvCache {
    pub len: usize,
    pub keys: Vec<f32>,
    pub values: Vec<f32>,
}

/// Attention over `x`'s rows at positions `cache.len ..`, appending their keys and values.
pub fn attention(s: &AttentionShape, w: &AttentionWeights<CpuWeight>, x: &Matrix, cache: &mut KvCache) -> Matrix {
    let (h, hkv, hd) = (s.heads, s.kv_heads, s.head_dim);
    let qg = linear(x, &w.q_proj);
    let k = linear(x, &w.k_proj);
    let v = linear(x, &w.v_proj);
    let start = cache.len;
    let mut queries = vec![f32::NAN; x.rows * h * hd];
    for t in 0..x.rows {
        let pos = start + t;
        for head in 0..h {
            // q_proj rows per head: hd query rows, then hd gate rows.
            let src = &qg.row(t)[head * 2 * hd..head * 2 * hd + hd];
            let dst = &mut queries[(t * h + head) * hd..][..hd];
            rms_norm_into(src, &w.q_norm.data, s.norm_eps, dst);
            rope(dst, pos, s.rotary_dim, s.rope_theta);
        }
        for kvh in 0..hkv {
            let mut key = vec![0.0f32; hd];
            rms_norm_into(&k.row(t)[kvh * hd..(kvh + 1) * hd], &w.k_norm.data, s.norm_eps, &mut key);
            rope(&mut key, pos, s.rotary_dim, s.rope_theta);
            cache.keys.extend_from_slice(&key);
        }
        cache.values.extend_from_slice(v.row(t));
        cache.len += 1;
    }
    let scale = 1.0 / (hd as f64).sqrt();
    let mut gated = poisoned(x.rows, h * hd);
    for t in 0..x.rows {
        let visible = start + t + 1; // causal: positions 0 ..= start + t
        for head in 0..h {
            let kvh = head / (h / hkv);
            let q = &queries[(t * h + head) * hd..][..hd];
            let scores: Vec<f64> = (0..visible)
                .map(|p| {
                    let key = &cache.keys[(p * hkv + kvh) * hd..][..hd];
                    q.iter().zip(key).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>() * scale
                })
                .collect();
            let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let weights: Vec<f64> = scores.iter().map(|&x| (x - max).exp()).collect();
            let total: f64 = weights.iter().sum();
            let mut o = vec![0.0f64; hd];
            for (p, &wp) in weights.iter().enumerate() {
                let value = &cache.values[(p * hkv + kvh) * hd..][..hd];
                o.iter_mut().zip(value).for_each(|(oi, &vi)| *oi += wp / total * vi as f64);
            }
            let gate = &qg.row(t)[head * 2 * hd + hd..(head + 1) * 2 * hd];
            let dst = &mut gated.row_mut(t)[head * hd..(head + 1) * hd];
            for ((d, oi), &gi) in dst.iter_mut().zip(&o).zip(gate) {
                *d = (oi * sigmoid(gi as f64)) as f32;
            }
        }
    }
    linear(&gated, &w.o_proj)
}

/// NeoX (rotate-half) RoPE on the first `rot` dims of one head: pairs `(i, i + rot/2)`.
/// `inv_freq` and the angle `pos · inv_freq` are f32, as every reference computes them, so the
/// angle's rounding (which grows with the position) is the reference's; sin/cos are exact of it.
pub fn rope(x: &mut [f32], pos: usize, rot: usize, theta: f64) {
    let half = rot / 2;
    for i in 0..half {
        let inv_freq = 1.0f32 / (theta as f32).powf((2 * i) as f32 / rot as f32);
        let angle = (pos as f32 * inv_freq) as f64;
        let (sin, cos) = angle.sin_cos();
        let (a, b) = (x[i] as f64, x[i + half] as f64);
        x[i] = (a * cos - b * sin) as f32;
        x[i + half] = (b * cos + a * sin) as f32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rope_rotates_pairs_half_apart_and_leaves_the_rest() {
        // rot = 4: pairs (0, 2) and (1, 3); inv_freq = [1, θ^(−1/2)]; dims 4.. pass through.
        let mut x = [1.0f32, 0.0, 0.0, 1.0, 7.0];
        rope(&mut x, 1, 4, 100.0);
        let (s0, c0) = 1f64.sin_cos();
        let (s1, c1) = 0.1f64.sin_cos();
        assert!((x[0] as f64 - c0).abs() < 1e-6 && (x[2] as f64 - s0).abs() < 1e-6);
        assert!((x[1] as f64 + s1).abs() < 1e-6 && (x[3] as f64 - c1).abs() < 1e-6);
        assert_eq!(x[4], 7.0);
    }

    #[test]
    fn position_zero_is_identity() {
        let mut x = [0.3f32, -1.5, 2.0, 0.25];
        rope(&mut x, 0, 4, 1e7);
        assert_eq!(x, [0.3, -1.5, 2.0, 0.25]);
    }
}
