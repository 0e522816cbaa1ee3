//! The delta rule in 64-token chunks (`backbone.md` §3.7), the prefill algorithm of the reference:
//! per chunk and value head, the WY/UT transform `T = (I + A)⁻¹` by forward substitution, then
//! one read of the chunk-start state and one state update. Equal to the token recurrence of
//! `gdn.rs` in exact arithmetic; f64 here keeps both within rounding of each other.

use super::gdn::Prepared;
use crate::backend::backbone::GdnShape;

/// Tokens per chunk, as in the reference (a shorter last chunk equals its zero-padded form:
/// padding has k = v = 0, β = 0, g = 0).
pub const CHUNK: usize = 64;

/// Runs every value head over all rows in chunks; `s` is `[Hv, Dk, Dv]` and ends as the state
/// after the last row. Returns the outputs `[rows, Hv, Dv]`.
pub fn chunked_core(shape: &GdnShape, p: &Prepared, s: &mut [f64]) -> Vec<f64> {
    let (dk, dv, hv) = (shape.key_dim, shape.value_dim, shape.value_heads);
    let mut out = vec![f64::NAN; p.rows * hv * dv];
    for j in 0..hv {
        let sj = &mut s[j * dk * dv..(j + 1) * dk * dv];
        for start in (0..p.rows).step_by(CHUNK) {
            let head = HeadChunk { shape, p, head: j, start, len: CHUNK.min(p.rows - start) };
            head.run(sj, &mut out);
        }
    }
    out
}

/// One value head over one chunk of rows `start .. start + len`.
struct HeadChunk<'a> {
    shape: &'a GdnShape,
    p: &'a Prepared,
    head: usize,
    start: usize,
    len: usize,
}

impl HeadChunk<'_> {
    fn q(&self, i: usize) -> &[f64] {
        self.p.q(self.shape, self.start + i, self.head / self.shape.ratio())
    }
    fn k(&self, i: usize) -> &[f64] {
        self.p.k(self.shape, self.start + i, self.head / self.shape.ratio())
    }
    fn v(&self, i: usize) -> &[f64] {
        self.p.v(self.shape, self.start + i, self.head)
    }
    fn beta(&self, i: usize) -> f64 {
        self.p.beta[(self.start + i) * self.shape.value_heads + self.head]
    }
    fn g(&self, i: usize) -> f64 {
        self.p.g[(self.start + i) * self.shape.value_heads + self.head]
    }

    /// Advances `s` (`[Dk, Dv]`, the state at the chunk start) over the chunk, writing outputs.
    fn run(&self, s: &mut [f64], out: &mut [f64]) {
        let (n, dk, dv, hv) = (self.len, self.shape.key_dim, self.shape.value_dim, self.shape.value_heads);
        // γ_i: cumulative log-decay from the chunk start, restarted every chunk.
        let gamma: Vec<f64> = (0..n)
            .scan(0.0, |acc, i| {
                *acc += self.g(i);
                Some(*acc)
            })
            .collect();
        // Forward substitution of (I + A) X = B, A[i][m] = β_i (k_i·k_m) e^{γ_i − γ_m} for m < i:
        // U = T·diag(β)·V and W = T·diag(β)·(K ⊙ e^γ).
        let mut u = vec![0.0f64; n * dv];
        let mut w = vec![0.0f64; n * dk];
        for i in 0..n {
            let (beta, ki) = (self.beta(i), self.k(i));
            let eg = gamma[i].exp();
            let mut ui: Vec<f64> = self.v(i).iter().map(|x| beta * x).collect();
            let mut wi: Vec<f64> = ki.iter().map(|x| beta * eg * x).collect();
            for m in 0..i {
                let a = beta * dot(ki, self.k(m)) * (gamma[i] - gamma[m]).exp();
                axpy(&mut ui, -a, &u[m * dv..(m + 1) * dv]);
                axpy(&mut wi, -a, &w[m * dk..(m + 1) * dk]);
            }
            u[i * dv..(i + 1) * dv].copy_from_slice(&ui);
            w[i * dk..(i + 1) * dk].copy_from_slice(&wi);
        }
        // V_new = U − W S: the part of each value the chunk-start state does not already predict.
        let mut v_new = u;
        for i in 0..n {
            let row = &mut v_new[i * dv..(i + 1) * dv];
            for (kk, &wk) in w[i * dk..(i + 1) * dk].iter().enumerate() {
                axpy(row, -wk, &s[kk * dv..(kk + 1) * dv]);
            }
        }
        // O_i = e^{γ_i} q_iᵀ S + Σ_{m ≤ i} (q_i·k_m) e^{γ_i − γ_m} V_new[m].
        for i in 0..n {
            let qi = self.q(i);
            let mut o = vec![0.0f64; dv];
            let eg = gamma[i].exp();
            for (kk, &qk) in qi.iter().enumerate() {
                axpy(&mut o, eg * qk, &s[kk * dv..(kk + 1) * dv]);
            }
            for m in 0..=i {
                let c = dot(qi, self.k(m)) * (gamma[i] - gamma[m]).exp();
                axpy(&mut o, c, &v_new[m * dv..(m + 1) * dv]);
            }
            let t = self.start + i;
            out[(t * hv + self.head) * dv..][..dv].copy_from_slice(&o);
        }
        // S' = e^{γ_last} S + Σ_i (e^{γ_last − γ_i} k_i) V_new[i]ᵀ.
        let last = gamma[n - 1];
        s.iter_mut().for_each(|x| *x *= last.exp());
        for i in 0..n {
            let ki = self.k(i);
            let f = (last - gamma[i]).exp();
            for (kk, &kv) in ki.iter().enumerate() {
                axpy(&mut s[kk * dv..(kk + 1) * dv], f * kv, &v_new[i * dv..(i + 1) * dv]);
            }
        }
    }
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// `y += a·x`.
fn axpy(y: &mut [f64], a: f64, x: &[f64]) {
    y.iter_mut().zip(x).for_each(|(yi, xi)| *yi += a * xi);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::backbone::gdn::recurrent_core;

    fn uniform(state: &mut u64) -> f64 {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        (*state >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Unit-norm keys, strong decays and β near 1 make every term of the chunk algorithm matter;
    /// the two algorithms then agree to f64 rounding, not merely after rounding to f32.
    #[test]
    fn chunked_equals_token_recurrence_in_f64() {
        let shape = GdnShape { key_heads: 2, value_heads: 4, key_dim: 8, value_dim: 5, conv_kernel: 4, norm_eps: 1e-6 };
        let rows = 2 * CHUNK + 7;
        let mut rng = 0x1234_5678_9abc_def1u64;
        let unit = |n: usize, rng: &mut u64| {
            let v: Vec<f64> = (0..n).map(|_| uniform(rng) * 2.0 - 1.0).collect();
            let norm = v.iter().map(|x| x * x).sum::<f64>().sqrt();
            v.into_iter().map(move |x| x / norm)
        };
        let (hk, dk, hv, dv) = (shape.key_heads, shape.key_dim, shape.value_heads, shape.value_dim);
        let p = Prepared {
            rows,
            q: (0..rows * hk).flat_map(|_| unit(dk, &mut rng)).collect(),
            k: (0..rows * hk).flat_map(|_| unit(dk, &mut rng)).collect(),
            v: (0..rows * hv * dv).map(|_| uniform(&mut rng) * 4.0 - 2.0).collect(),
            beta: (0..rows * hv).map(|_| 0.2 + 0.8 * uniform(&mut rng)).collect(),
            g: (0..rows * hv).map(|_| -0.5 * uniform(&mut rng)).collect(),
        };
        let start: Vec<f64> = (0..hv * dk * dv).map(|_| uniform(&mut rng) - 0.5).collect();
        let (mut s_chunk, mut s_rec) = (start.clone(), start);
        let a = chunked_core(&shape, &p, &mut s_chunk);
        let b = recurrent_core(&shape, &p, &mut s_rec);
        let err = |x: &[f64], y: &[f64]| {
            let num: f64 = x.iter().zip(y).map(|(a, b)| (a - b) * (a - b)).sum();
            (num / y.iter().map(|b| b * b).sum::<f64>()).sqrt()
        };
        assert!(err(&a, &b) < 1e-12, "outputs differ by {:e}", err(&a, &b));
        assert!(err(&s_chunk, &s_rec) < 1e-12, "states differ by {:e}", err(&s_chunk, &s_rec));
        assert!(a.iter().all(|x| x.is_finite()), "every output written");
    }
}
