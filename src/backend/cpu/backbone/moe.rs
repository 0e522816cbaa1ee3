//! The MoE block on the CPU (`backbone.md` §5): router softmax → top-k → renormalise, block-FP8
//! SwiGLU experts (gate | up | down), and the shared SwiGLU expert scaled by sigmoid(x·w_sg).

use super::fp8_linear::{block_input, fp8_linear_row};
use super::linear::{dot, linear_row64, poisoned, sigmoid, silu};
use crate::backend::backbone::MoeShape;
use crate::backend::cpu::{CpuWeight, Matrix};
use crate::model::weights::MoeWeights;

pub fn moe(s: &MoeShape, w: &MoeWeights<CpuWeight>, x: &Matrix) -> Matrix {
    let mut y = poisoned(x.rows, x.cols);
    for t in 0..x.rows {
        let xr = x.row(t);
        let mut acc = vec![0.0f64; x.cols];
        let input = block_input(xr, s.block[1], s.activations);
        for (expert, weight) in route(s, &linear_row64(xr, &w.router)) {
            let e = &w.experts[expert];
            let gate = fp8_linear_row(&input, &e.gate_proj, s.block);
            let up = fp8_linear_row(&input, &e.up_proj, s.block);
            let h: Vec<f32> = gate.iter().zip(&up).map(|(&g, &u)| (silu(g) * u) as f32).collect();
            let down = fp8_linear_row(&block_input(&h, s.block[1], s.activations), &e.down_proj, s.block);
            acc.iter_mut().zip(&down).for_each(|(a, d)| *a += weight * d);
        }
        let se = &w.shared_expert;
        let gate = linear_row64(xr, &se.gate_proj);
        let up = linear_row64(xr, &se.up_proj);
        let h: Vec<f32> = gate.iter().zip(&up).map(|(&g, &u)| (silu(g) * u) as f32).collect();
        let shared = linear_row64(&h, &se.down_proj);
        let shared_gate = sigmoid(dot(xr, w.shared_expert_gate.row(0)));
        for ((dst, a), sh) in y.row_mut(t).iter_mut().zip(&acc).zip(&shared) {
            *dst = (a + shared_gate * sh) as f32;
        }
    }
    y
}

/// Softmax over all router logits, the `top_k` most probable experts (ties to the lower index),
/// and their probabilities renormalised to sum to one.
pub fn route(s: &MoeShape, logits: &[f64]) -> Vec<(usize, f64)> {
    let max = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let exp: Vec<f64> = logits.iter().map(|&l| (l - max).exp()).collect();
    let total: f64 = exp.iter().sum();
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| exp[b].total_cmp(&exp[a]).then(a.cmp(&b)));
    order.truncate(s.top_k);
    let kept: f64 = order.iter().map(|&e| exp[e] / total).sum();
    order.into_iter().map(|e| (e, exp[e] / total / kept)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::backbone::ExpertActivations;

    #[test]
    fn route_takes_top_k_and_renormalises() {
        let s = MoeShape {
            experts: 4,
            top_k: 2,
            intermediate: 128,
            shared_intermediate: 128,
            block: [128, 128],
            activations: ExpertActivations::Exact,
        };
        // Probabilities ∝ e^l: experts 2 (e^2) and 0 (e^1) win; renormalised e^2/(e^2+e).
        let r = route(&s, &[1.0, 0.0, 2.0, -1.0]);
        assert_eq!(r.iter().map(|p| p.0).collect::<Vec<_>>(), vec![2, 0]);
        let e = std::f64::consts::E;
        assert!((r[0].1 - e * e / (e * e + e)).abs() < 1e-15);
        assert!((r[0].1 + r[1].1 - 1.0).abs() < 1e-15);
    }
}
