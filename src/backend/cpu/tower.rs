//! The tower layer on the CPU (`model.md` §6), written step by step as the spec states it: f32
//! storage, f64 sums, one sequence row at a time where rows interact (attention).

mod kernels;

use super::{Cpu, CpuWeight, Matrix};
use crate::backend::tower::{TowerError, TowerLayerInput, TowerOps, TowerShape, UnseenCodes};
use crate::model::weights::TowerLayer;
use kernels::{attend, linear, rms_norm_zero_centered, rope_interleaved, sigmoid, silu};

/// One tower layer's cache: K (after q/k norm and RoPE) and V per position.
#[derive(Clone, Debug, PartialEq)]
pub struct CpuTowerKv {
    /// `kv_heads · head_dim`.
    pub width: usize,
    /// `[len, width]`.
    pub k: Vec<f32>,
    /// `[len, width]`.
    pub v: Vec<f32>,
}

impl CpuTowerKv {
    pub fn len(&self) -> usize {
        self.k.len() / self.width
    }

    pub fn is_empty(&self) -> bool {
        self.k.is_empty()
    }
}

/// Row `code` of an embedding table, clamped into the table as S1 clamps placeholder codes.
fn embedding_row(table: &CpuWeight, code: u32) -> &[f32] {
    let rows = table.shape[0];
    table.row((code as usize).min(rows - 1))
}

impl TowerOps for Cpu {
    type TowerKv = CpuTowerKv;

    fn tower_kv(&self, shape: &TowerShape) -> CpuTowerKv {
        CpuTowerKv { width: shape.kv_width(), k: Vec::new(), v: Vec::new() }
    }

    fn tower_kv_len(&self, kv: &CpuTowerKv) -> usize {
        kv.len()
    }

    fn tower_unseen(&self, table: &CpuWeight, shape: &TowerShape, u: &UnseenCodes<'_>) -> Matrix {
        let n = u.row_semantic.len();
        assert_eq!(u.codes.len(), n * u.codebooks, "unseen codes are [rows, codebooks]");
        let vocab = shape.codebook_vocab;
        let mut out = Matrix::zeros(n, shape.dim);
        for (r, &semantic) in u.row_semantic.iter().enumerate() {
            if !semantic {
                continue;
            }
            let codes = &u.codes[r * u.codebooks..(r + 1) * u.codebooks];
            let mut sum = vec![0.0f64; shape.dim];
            for (i, &code) in codes.iter().enumerate().skip(u.first) {
                let row = table.row(i * vocab + (code as usize).min(vocab - 1));
                sum.iter_mut().zip(row).for_each(|(s, &x)| *s += x as f64);
            }
            out.row_mut(r).iter_mut().zip(&sum).for_each(|(o, &s)| *o = s as f32);
        }
        out
    }

    fn tower_layer(
        &self,
        s: &TowerShape,
        w: &TowerLayer<CpuWeight>,
        kv: &mut CpuTowerKv,
        input: TowerLayerInput<'_, Matrix>,
    ) -> Result<Matrix, TowerError> {
        let hidden = (input.hidden.rows, input.hidden.cols);
        let n = input.check(s, hidden, input.unseen.map(|u| u.rows), kv.len())?;
        let dim = s.dim;

        // 1–2. e = mask ? Emb[code] : 0 (+ U), then eh_proj(concat(enorm(e), hnorm(h))).
        let mut eh = vec![0.0f32; n * 2 * dim];
        for r in 0..n {
            let (e, h) = eh[r * 2 * dim..(r + 1) * 2 * dim].split_at_mut(dim);
            if input.label_semantic[r] {
                e.copy_from_slice(embedding_row(&w.code_embedding, input.codes[r]));
            }
            if let Some(u) = input.unseen {
                e.iter_mut().zip(u.row(r)).for_each(|(x, &y)| *x += y);
            }
            rms_norm_zero_centered(e, &w.enorm.data, s.norm_eps);
            h.copy_from_slice(input.hidden.row(r));
            rms_norm_zero_centered(h, &w.hnorm.data, s.norm_eps);
        }
        let mixed = linear(&eh, &w.eh_proj.data, 2 * dim);

        // 3. Gated attention, pre-norm. wqkv rows are [all Q | all gates | K | V].
        let mut a = mixed.clone();
        rms_norm_zero_centered(&mut a, &w.attention_norm.data, s.norm_eps);
        let qkv = linear(&a, &w.wqkv.data, dim);
        let (qw, kvw) = (s.heads * s.head_dim, s.kv_width());
        kv.k.truncate(input.start * kvw);
        kv.v.truncate(input.start * kvw);
        let mut queries = Vec::with_capacity(n);
        for r in 0..n {
            let row = &qkv[r * s.qkv_rows()..(r + 1) * s.qkv_rows()];
            let (q, rest) = row.split_at(qw);
            let (gate, rest) = rest.split_at(qw);
            let (k, v) = rest.split_at(kvw);
            let (mut q, mut k) = (q.to_vec(), k.to_vec());
            // q/k norm is always applied (whatever `attention_qk_norm` says), per head.
            rms_norm_zero_centered(&mut q, &w.q_norm.data, s.norm_eps);
            rms_norm_zero_centered(&mut k, &w.k_norm.data, s.norm_eps);
            let position = input.start + r;
            rope_interleaved(&mut q, s.head_dim, s.rotary_dim, s.rope_base, position);
            rope_interleaved(&mut k, s.head_dim, s.rotary_dim, s.rope_base, position);
            kv.k.extend_from_slice(&k);
            kv.v.extend_from_slice(v);
            queries.push((q, gate));
        }
        let mut gated = Vec::with_capacity(n * qw);
        for (r, (q, gate)) in queries.iter().enumerate() {
            let o = attend(q, &kv.k, &kv.v, input.start + r, s.kv_heads, s.head_dim);
            gated.extend(o.iter().zip(*gate).map(|(&o, &g)| (o as f64 * sigmoid(g as f64)) as f32));
        }
        let attn = linear(&gated, &w.wo.data, qw);
        let mut x: Vec<f32> = mixed.iter().zip(&attn).map(|(&m, &a)| m + a).collect();

        // 4. SwiGLU: x + w2(silu(w1 f) · w3 f), f = ffn_norm(x).
        let mut f = x.clone();
        rms_norm_zero_centered(&mut f, &w.ffn_norm.data, s.norm_eps);
        let (g, u) = (linear(&f, &w.w1.data, dim), linear(&f, &w.w3.data, dim));
        let act: Vec<f32> = g.iter().zip(&u).map(|(&g, &u)| (silu(g as f64) * u as f64) as f32).collect();
        let down = linear(&act, &w.w2.data, s.intermediate);
        x.iter_mut().zip(&down).for_each(|(x, &d)| *x += d);

        // 5. final_layernorm.
        rms_norm_zero_centered(&mut x, &w.final_norm.data, s.norm_eps);
        Ok(Matrix::from_vec(n, dim, x))
    }

    fn tower_head(&self, head: &CpuWeight, hidden: &Matrix) -> Matrix {
        Matrix::from_vec(hidden.rows, head.shape[0], linear(&hidden.data, &head.data, hidden.cols))
    }

    fn tower_act_shape(&self, a: &Matrix) -> (usize, usize) {
        (a.rows, a.cols)
    }

    fn tower_act_host(&self, a: &Matrix) -> Vec<f32> {
        a.data.clone()
    }
}
