//! The end of the MoE block: the weighted sum of a row's slots and its gated shared expert
//! (`moe_combine`), or that sum added into the residual and normed for the next layer in the same
//! launch (`moe_combine_add_norm`, the decode path's `moe_rows_add_rms_norm`).

use super::Job;
use crate::backend::cuda::kernel_constants::NORM_THREADS;
use crate::backend::cuda::launch::{Arg, Dims};
use crate::backend::cuda::tensor::GpuMatrix;

/// Where the block's output goes.
#[derive(Clone, Copy)]
pub(super) enum Output<'a> {
    /// The block's output rows.
    Block(&'a GpuMatrix),
    /// Added into a residual and normed (`moe_combine_add_norm`).
    AddNorm(AddNorm<'a>),
}

#[derive(Clone, Copy)]
pub(super) struct AddNorm<'a> {
    pub(super) residual: &'a GpuMatrix,
    /// The norm's f32 gain.
    pub(super) gain: u64,
    pub(super) eps: f32,
    pub(super) normed: &'a GpuMatrix,
}

impl Job<'_> {
    /// `out[r0..r0+rows] = Σ_slot w · y + shared_gate · shared` (y holds those rows' pairs from 0);
    /// with `Output::AddNorm`, that added into the residual rows and normed, in the same launch.
    pub(super) fn combine(&self, r0: usize, rows: usize, y: u64) {
        let (cuda, k) = (self.cuda, self.s.top_k);
        // y, the slots' weights, the shared gate and the shared expert's rows: both kernels' first
        // four arguments.
        let [y, w, gate, shared]: [Arg; 4] = [
            y.into(),
            (self.routing.weights.ptr() + (r0 * k * 4) as u64).into(),
            (self.routing.shared_gate.ptr() + (r0 * 4) as u64).into(),
            self.shared.get().row_ptr(r0).into(),
        ];
        match self.out {
            Output::Block(out) => {
                let args = [y, w, gate, shared, out.row_ptr(r0).into(), k.into(), self.hidden.into()];
                let dims = Dims::grid((rows as u32, self.hidden.div_ceil(256) as u32, 1), 256);
                cuda.kernels.moe.combine.launch(cuda.stream(), dims, &args);
            }
            Output::AddNorm(n) => {
                let args = [
                    y,
                    w,
                    gate,
                    shared,
                    n.residual.row_ptr(r0).into(),
                    n.gain.into(),
                    n.normed.row_ptr(r0).into(),
                    k.into(),
                    self.hidden.into(),
                    n.eps.into(),
                ];
                let dims = Dims::linear(rows, NORM_THREADS as u32);
                cuda.kernels.moe.combine_add_norm.launch(cuda.stream(), dims, &args);
            }
        }
    }
}
