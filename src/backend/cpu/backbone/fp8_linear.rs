//! Block-FP8 expert GEMMs on the CPU (`backbone.md` §6): weights are e4m3 code values times a
//! `[rows/128, cols/128]` scale grid, and optionally the input row is quantised like the serving
//! engines' dynamic W8A8 (1×128 groups along K, `s = max(amax, 1e-10)/448`, RNE e4m3 of `x/s`).
//! Both cases are one formula: `y[o] = Σ_kb s_x[kb] · s_w[o/bo][kb] · Σ_{i∈kb} x[i]·w[o,i]`.

use crate::backend::backbone::ExpertActivations;
use crate::backend::cpu::CpuWeight;
use crate::checkpoint::fp8::{E4M3_MAX, e4m3_to_f32, f32_to_e4m3};
use crate::model::weights::Fp8Linear;

/// An input row as a block-FP8 GEMM consumes it: values and one scale per K group.
#[derive(Clone, Debug, PartialEq)]
pub struct BlockInput {
    pub values: Vec<f32>,
    pub scales: Vec<f64>,
    pub group: usize,
}

/// The input row for `mode`, grouped by `group` (the weight's K block).
pub fn block_input(x: &[f32], group: usize, mode: ExpertActivations) -> BlockInput {
    match mode {
        ExpertActivations::Exact => {
            BlockInput { values: x.to_vec(), scales: vec![1.0; x.len().div_ceil(group)], group }
        }
        ExpertActivations::Fp8Dynamic => quantise(x, group),
    }
}

/// Dynamic per-group e4m3 quantisation: each group's decoded codes and its f32 scale.
pub fn quantise(x: &[f32], group: usize) -> BlockInput {
    let mut values = Vec::with_capacity(x.len());
    let mut scales = Vec::with_capacity(x.len().div_ceil(group));
    for g in x.chunks(group) {
        let amax = g.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let s = amax.max(1e-10) / E4M3_MAX;
        values.extend(g.iter().map(|&v| e4m3_to_f32(f32_to_e4m3((v / s).clamp(-E4M3_MAX, E4M3_MAX)))));
        scales.push(s as f64);
    }
    BlockInput { values, scales, group }
}

/// `W x` for a block-FP8 weight, in f64. The input's groups must be the weight's K blocks.
pub fn fp8_linear_row(x: &BlockInput, w: &Fp8Linear<CpuWeight>, block: [usize; 2]) -> Vec<f64> {
    let (out, inp) = (w.weight.shape[0], w.weight.shape[1]);
    let [bo, bi] = block;
    assert_eq!(x.values.len(), inp, "fp8 linear: input width {} vs weight {:?}", x.values.len(), w.weight.shape);
    assert_eq!(x.group, bi, "activation groups must match the weight's K blocks");
    let grid_cols = w.scale_inv.shape[1];
    (0..out)
        .map(|o| {
            let row = w.weight.row(o);
            let scale_row = &w.scale_inv.data[(o / bo) * grid_cols..][..grid_cols];
            (0..inp.div_ceil(bi))
                .map(|kb| {
                    let span = kb * bi..((kb + 1) * bi).min(inp);
                    let partial: f64 =
                        x.values[span.clone()].iter().zip(&row[span]).map(|(&a, &b)| a as f64 * b as f64).sum();
                    partial * x.scales[kb] * scale_row[kb] as f64
                })
                .sum()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Group 4, amax 3.5, so s = 3.5/448 = 2⁻⁷ and x/s = 128·x exactly; checked by hand.
    #[test]
    fn dynamic_quantisation_hand_checked() {
        let x = [3.5f32, 0.781_25, -0.0101, 1e-4, 0.0, 0.0, 0.0, 0.0];
        let q = quantise(&x, 4);
        assert_eq!(q.scales[0], 2f64.powi(-7));
        // 448 → 448; 100 is halfway between 96 and 104 → even mantissa 96; −1.2928 → −1.25;
        // 0.0128 is subnormal (step 2⁻⁹): 6.5536 steps → 7·2⁻⁹.
        assert_eq!(&q.values[..4], &[448.0, 96.0, -1.25, 7.0 / 512.0]);
        // An all-zero group takes the 1e-10 floor and stays zero (no NaN from 0/0).
        assert_eq!(q.scales[1], (1e-10f32 / 448.0) as f64);
        assert_eq!(&q.values[4..], &[0.0; 4]);

        // One output row, K blocks of 4: codes [1,1,1,1 | 2,2,2,2], weight scales [0.5, 3].
        let w = Fp8Linear {
            weight: CpuWeight { shape: vec![1, 8], data: vec![1.0, 1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 2.0] },
            scale_inv: CpuWeight { shape: vec![1, 2], data: vec![0.5, 3.0] },
        };
        let y = fp8_linear_row(&q, &w, [1, 4]);
        assert_eq!(y, vec![(448.0 + 96.0 - 1.25 + 7.0 / 512.0) / 128.0 * 0.5]);
        let exact = fp8_linear_row(&block_input(&x, 4, ExpertActivations::Exact), &w, [1, 4]);
        let want = (3.5f64 + 0.781_25 + (-0.0101f32) as f64 + (1e-4f32) as f64) * 0.5;
        assert!((exact[0] - want).abs() < 1e-15);
    }

    #[test]
    fn scale_grid_is_indexed_by_row_block_then_column_block() {
        // Two output rows in different row blocks, one K block: row o uses scale_inv[o / 1][0].
        let w = Fp8Linear {
            weight: CpuWeight { shape: vec![2, 2], data: vec![1.0, 2.0, 3.0, 4.0] },
            scale_inv: CpuWeight { shape: vec![2, 1], data: vec![10.0, 100.0] },
        };
        let y = fp8_linear_row(&block_input(&[1.0, 1.0], 2, ExpertActivations::Exact), &w, [1, 2]);
        assert_eq!(y, vec![30.0, 700.0]);
    }
}
