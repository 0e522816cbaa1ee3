//! The Gated DeltaNet mixer on the CPU (`backbone.md` §3): projections, causal conv with carried
//! state, SiLU, L2-normalised q/k, gates β and g, the delta-rule core (token recurrence here,
//! 64-token chunks in `gdn_chunk.rs`), gated RMSNorm and `out_proj`.
//!
//! Everything after the projections is computed in f64; the state between calls is stored in f32.

use super::gdn_chunk::chunked_core;
use super::linear::{linear, poisoned, sigmoid, silu, softplus};
use super::norm::{gated_rms_norm_into, l2_normalise};
use crate::backend::backbone::GdnShape;
use crate::backend::cpu::{CpuWeight, Matrix};
use crate::model::weights::GdnWeights;

/// Epsilon of the q/k L2 norm: fixed in the reference, independent of `rms_norm_eps`.
const L2_EPS: f64 = 1e-6;

/// Per-request state of one GDN layer.
#[derive(Clone, Debug, PartialEq)]
pub struct GdnState {
    /// The last `kernel − 1` pre-conv q|k|v inputs, oldest first (zeros before the request starts).
    pub conv: Matrix,
    /// Recurrent state per value head, `[value_heads, key_dim, value_dim]`, `S[k][v]`.
    pub recurrent: Vec<f32>,
}

impl GdnState {
    pub fn new(shape: &GdnShape) -> GdnState {
        GdnState {
            conv: Matrix::zeros(shape.conv_kernel - 1, shape.qkv_dim()),
            recurrent: vec![0.0; shape.value_heads * shape.key_dim * shape.value_dim],
        }
    }
}

/// Which algorithm runs the delta rule; both compute the same recurrence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Core {
    Chunked,
    Recurrent,
}

/// The core's inputs for `t` rows, after conv, activation, normalisation and gating.
pub struct Prepared {
    pub rows: usize,
    /// `[rows, key_heads, key_dim]`, L2-normalised and scaled by `key_dim^−½`.
    pub q: Vec<f64>,
    /// `[rows, key_heads, key_dim]`, L2-normalised.
    pub k: Vec<f64>,
    /// `[rows, value_heads, value_dim]`.
    pub v: Vec<f64>,
    /// `[rows, value_heads]`: β = sigmoid(b).
    pub beta: Vec<f64>,
    /// `[rows, value_heads]`: log-decay g = −exp(A_log)·softplus(a + dt_bias) ≤ 0.
    pub g: Vec<f64>,
}

impl Prepared {
    pub fn q(&self, s: &GdnShape, t: usize, kh: usize) -> &[f64] {
        let o = (t * s.key_heads + kh) * s.key_dim;
        &self.q[o..o + s.key_dim]
    }
    pub fn k(&self, s: &GdnShape, t: usize, kh: usize) -> &[f64] {
        let o = (t * s.key_heads + kh) * s.key_dim;
        &self.k[o..o + s.key_dim]
    }
    pub fn v(&self, s: &GdnShape, t: usize, j: usize) -> &[f64] {
        let o = (t * s.value_heads + j) * s.value_dim;
        &self.v[o..o + s.value_dim]
    }
}

/// The whole mixer: `x` `[rows, hidden]` → `out_proj` output `[rows, hidden]`; advances `state`.
pub fn gdn_mixer(shape: &GdnShape, w: &GdnWeights<CpuWeight>, x: &Matrix, state: &mut GdnState, core: Core) -> Matrix {
    let qkv = linear(x, &w.in_proj_qkv);
    let z = linear(x, &w.in_proj_z);
    let b = linear(x, &w.in_proj_b);
    let a = linear(x, &w.in_proj_a);
    let conv = causal_conv(shape, &w.conv1d, &qkv, &mut state.conv);
    let p = prepare(shape, w, &conv, &b, &a);
    let mut s: Vec<f64> = state.recurrent.iter().map(|&v| v as f64).collect();
    let o = match core {
        Core::Chunked => chunked_core(shape, &p, &mut s),
        Core::Recurrent => recurrent_core(shape, &p, &mut s),
    };
    state.recurrent = s.iter().map(|&v| v as f32).collect();
    let dv = shape.value_dim;
    let mut gated = poisoned(x.rows, shape.value_heads * dv);
    for t in 0..x.rows {
        for j in 0..shape.value_heads {
            let range = j * dv..(j + 1) * dv;
            let head = &o[(t * shape.value_heads + j) * dv..][..dv];
            let zt = &z.row(t)[range.clone()];
            gated_rms_norm_into(head, zt, &w.norm.data, shape.norm_eps, &mut gated.row_mut(t)[range]);
        }
    }
    linear(&gated, &w.out_proj)
}

/// Depthwise causal conv + SiLU over the q|k|v channels: output `t` sees inputs `t−K+1 ..= t`,
/// the earliest of them from the carried state; the state becomes the last `K − 1` inputs.
pub fn causal_conv(shape: &GdnShape, weight: &CpuWeight, qkv: &Matrix, conv_state: &mut Matrix) -> Matrix {
    let (kernel, channels) = (shape.conv_kernel, shape.qkv_dim());
    let history = kernel - 1;
    let mut window = Matrix::zeros(history + qkv.rows, channels);
    window.data[..history * channels].copy_from_slice(&conv_state.data);
    window.data[history * channels..].copy_from_slice(&qkv.data);
    let mut y = poisoned(qkv.rows, channels);
    for t in 0..qkv.rows {
        for c in 0..channels {
            // weight[c, 0, i]: i = kernel − 1 multiplies the current input.
            let taps = &weight.data[c * kernel..(c + 1) * kernel];
            let acc: f64 = taps.iter().enumerate().map(|(i, &wi)| wi as f64 * window.row(t + i)[c] as f64).sum();
            y.row_mut(t)[c] = silu(acc) as f32;
        }
    }
    conv_state.data.copy_from_slice(&window.data[qkv.rows * channels..]);
    y
}

/// Splits the conv output into heads, normalises q and k, and computes the gates.
fn prepare(shape: &GdnShape, w: &GdnWeights<CpuWeight>, conv: &Matrix, b: &Matrix, a: &Matrix) -> Prepared {
    let (hk, dk, hv, dv) = (shape.key_heads, shape.key_dim, shape.value_heads, shape.value_dim);
    let key_total = hk * dk;
    let scale = 1.0 / (dk as f64).sqrt();
    let mut p = Prepared {
        rows: conv.rows,
        q: Vec::with_capacity(conv.rows * key_total),
        k: Vec::with_capacity(conv.rows * key_total),
        v: Vec::with_capacity(conv.rows * hv * dv),
        beta: Vec::with_capacity(conv.rows * hv),
        g: Vec::with_capacity(conv.rows * hv),
    };
    for t in 0..conv.rows {
        let row = conv.row(t);
        for h in 0..hk {
            let mut q: Vec<f64> = row[h * dk..(h + 1) * dk].iter().map(|&v| v as f64).collect();
            let mut k: Vec<f64> = row[key_total + h * dk..key_total + (h + 1) * dk].iter().map(|&v| v as f64).collect();
            l2_normalise(&mut q, L2_EPS);
            l2_normalise(&mut k, L2_EPS);
            p.q.extend(q.iter().map(|v| v * scale));
            p.k.extend(k);
        }
        p.v.extend(row[2 * key_total..].iter().map(|&v| v as f64));
        for j in 0..hv {
            p.beta.push(sigmoid(b.row(t)[j] as f64));
            let decay_rate = (w.a_log.data[j] as f64).exp();
            p.g.push(-decay_rate * softplus(a.row(t)[j] as f64 + w.dt_bias.data[j] as f64));
        }
    }
    p
}

/// The delta rule one token at a time (`backbone.md` §3.4): decay first, then predict with the
/// decayed state, correct, and read out with the updated state. Returns `[rows, Hv, Dv]`.
pub fn recurrent_core(shape: &GdnShape, p: &Prepared, s: &mut [f64]) -> Vec<f64> {
    let (dk, dv, hv) = (shape.key_dim, shape.value_dim, shape.value_heads);
    let mut out = vec![f64::NAN; p.rows * hv * dv];
    for t in 0..p.rows {
        for j in 0..hv {
            let kh = j / shape.ratio();
            let (q, k, v) = (p.q(shape, t, kh), p.k(shape, t, kh), p.v(shape, t, j));
            let beta = p.beta[t * hv + j];
            let sj = &mut s[j * dk * dv..(j + 1) * dk * dv];
            let decay = p.g[t * hv + j].exp();
            sj.iter_mut().for_each(|x| *x *= decay);
            let mut delta = vec![0.0f64; dv];
            for (kk, &kv) in k.iter().enumerate() {
                for (d, &sv) in delta.iter_mut().zip(&sj[kk * dv..(kk + 1) * dv]) {
                    *d += sv * kv;
                }
            }
            for (d, &vv) in delta.iter_mut().zip(v) {
                *d = beta * (vv - *d);
            }
            for (kk, &kv) in k.iter().enumerate() {
                for (sv, &d) in sj[kk * dv..(kk + 1) * dv].iter_mut().zip(&delta) {
                    *sv += kv * d;
                }
            }
            let o = &mut out[(t * hv + j) * dv..(t * hv + j + 1) * dv];
            o.fill(0.0);
            for (kk, &qv) in q.iter().enumerate() {
                for (ov, &sv) in o.iter_mut().zip(&sj[kk * dv..(kk + 1) * dv]) {
                    *ov += sv * qv;
                }
            }
        }
    }
    out
}
