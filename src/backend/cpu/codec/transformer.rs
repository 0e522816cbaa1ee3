//! The post_module transformer on the CPU (`codec.md` §1.3): RMSNorm, fused q|k|v projection,
//! interleaved RoPE, attention over a causal window of frames, LayerScale, SwiGLU. The window of
//! past keys and values is carried between calls, so a frame sees the same keys in the same order
//! however the stream was cut.

use super::KvWindow;
use super::math::{dot, linear, poisoned, silu};
use crate::backend::codec::CodecAttentionShape;
use crate::backend::cpu::{CpuWeight, Matrix};
use crate::model::weights::TransformerLayer;

/// `x · rsqrt(mean(x²) + eps)` rounded to f32, then `· w` in f32 (the reference's order).
pub fn rms_norm(weight: &CpuWeight, eps: f32, x: &Matrix) -> Matrix {
    let mut y = poisoned(x.rows, x.cols);
    for t in 0..x.rows {
        let row = x.row(t);
        let ms = row.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>() / row.len() as f64;
        let r = 1.0 / (ms + f64::from(eps)).sqrt();
        for ((o, &v), &g) in y.row_mut(t).iter_mut().zip(row).zip(&weight.data) {
            *o = ((f64::from(v) * r) as f32) * g;
        }
    }
    y
}

/// Rotates the pairs `(2i, 2i+1)` of every head of `row` by `rope` = `[head_dim/2, 2]` (cos, sin),
/// in f32 as the reference does.
fn rotate(row: &mut [f32], rope: &[f32], head_dim: usize) {
    for head in row.chunks_exact_mut(head_dim) {
        for (pair, cs) in head.chunks_exact_mut(2).zip(rope.chunks_exact(2)) {
            let (x0, x1, c, s) = (pair[0], pair[1], cs[0], cs[1]);
            pair[0] = x0 * c - x1 * s;
            pair[1] = x1 * c + x0 * s;
        }
    }
}

/// Windowed causal attention of the new frames; keys/values of `kv` come first in `keys_all`.
fn attention(shape: &CodecAttentionShape, q: &Matrix, keys: &Matrix, values: &Matrix, past: usize) -> Matrix {
    let (hd, width) = (shape.head_dim, shape.heads * shape.head_dim);
    let scale = 1.0 / (hd as f64).sqrt();
    let mut out = poisoned(q.rows, width);
    let mut probs = Vec::with_capacity(shape.window);
    for i in 0..q.rows {
        let last = past + i;
        let first = (last + 1).saturating_sub(shape.window);
        for h in 0..shape.heads {
            let qh = &q.row(i)[h * hd..(h + 1) * hd];
            probs.clear();
            probs.extend((first..=last).map(|j| dot(qh, &keys.row(j)[h * hd..(h + 1) * hd]) * scale));
            let max = probs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let mut sum = 0.0;
            for p in probs.iter_mut() {
                *p = (*p - max).exp();
                sum += *p;
            }
            for (d, o) in out.row_mut(i)[h * hd..(h + 1) * hd].iter_mut().enumerate() {
                let acc: f64 =
                    probs.iter().enumerate().map(|(n, p)| p * f64::from(values.row(first + n)[h * hd + d])).sum();
                *o = (acc / sum) as f32;
            }
        }
    }
    out
}

/// Past rows of the window, then `new` rows, in NaN-poisoned scratch.
fn extend(past: &Matrix, len: usize, new: &Matrix) -> Matrix {
    let c = new.cols;
    let mut all = poisoned(len + new.rows, c);
    all.data[..len * c].copy_from_slice(&past.data[..len * c]);
    all.data[len * c..].copy_from_slice(&new.data);
    all
}

/// Keeps the last `capacity` rows of `all` in `dst`, re-poisoning the rest.
fn keep_tail(dst: &mut Matrix, all: &Matrix) -> usize {
    let keep = all.rows.min(dst.rows);
    let c = all.cols;
    dst.data.fill(f32::NAN);
    dst.data[..keep * c].copy_from_slice(&all.data[(all.rows - keep) * c..]);
    keep
}

/// `x + γ ⊙ y`, the LayerScale'd residual (the reference scales `y` in place, then adds).
fn add_scaled(x: &Matrix, gamma: &CpuWeight, y: &Matrix) -> Matrix {
    let mut out = poisoned(x.rows, x.cols);
    for t in 0..x.rows {
        for (((o, &a), &b), &g) in out.row_mut(t).iter_mut().zip(x.row(t)).zip(y.row(t)).zip(&gamma.data) {
            *o = a + b * g;
        }
    }
    out
}

pub fn transformer_layer(
    shape: &CodecAttentionShape,
    w: &TransformerLayer<CpuWeight>,
    rope: &[f32],
    x: &Matrix,
    kv: &mut KvWindow,
) -> Matrix {
    let width = shape.heads * shape.head_dim;
    assert_eq!(x.cols, width, "transformer width");
    assert_eq!(rope.len(), x.rows * shape.head_dim, "one rope row per frame");
    let qkv = linear(&rms_norm(&w.attention_norm, shape.norm_eps, x), &w.wqkv, None);
    let (mut q, mut k, mut v) = (poisoned(x.rows, width), poisoned(x.rows, width), poisoned(x.rows, width));
    for t in 0..x.rows {
        let row = qkv.row(t);
        q.row_mut(t).copy_from_slice(&row[..width]);
        k.row_mut(t).copy_from_slice(&row[width..2 * width]);
        v.row_mut(t).copy_from_slice(&row[2 * width..]);
        let r = &rope[t * shape.head_dim..(t + 1) * shape.head_dim];
        rotate(q.row_mut(t), r, shape.head_dim);
        rotate(k.row_mut(t), r, shape.head_dim);
    }
    let keys = extend(&kv.keys, kv.len, &k);
    let values = extend(&kv.values, kv.len, &v);
    let attn = attention(shape, &q, &keys, &values, kv.len);
    kv.len = keep_tail(&mut kv.keys, &keys);
    keep_tail(&mut kv.values, &values);
    let h = add_scaled(x, &w.attention_layer_scale, &linear(&attn, &w.wo, None));
    let hn = rms_norm(&w.ffn_norm, shape.norm_eps, &h);
    let (mut a, b) = (linear(&hn, &w.w1, None), linear(&hn, &w.w3, None));
    for (g, &u) in a.data.iter_mut().zip(&b.data) {
        *g = silu(*g) * u;
    }
    add_scaled(&h, &w.ffn_layer_scale, &linear(&a, &w.w2, None))
}
