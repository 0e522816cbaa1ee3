//! `kernels/norm.cu`: the backbone's zero-centred RMSNorm, alone or fused with the residual add
//! before it, and the plain residual add.

use std::sync::Arc;

use cudarc::driver::CudaContext;

use super::Cuda;
use super::launch::{Dims, Kernel, KernelError, Module, embedded};
use super::tensor::{DType, GpuMatrix, GpuWeight};

pub struct NormKernels {
    rms_norm_zc: Kernel,
    add_rms_norm_zc: Kernel,
    add_bf16: Kernel,
}

impl NormKernels {
    pub fn load(ctx: &Arc<CudaContext>) -> Result<NormKernels, KernelError> {
        let m = Module::load_overlapping(ctx, "norm", embedded::NORM)?;
        Ok(NormKernels {
            rms_norm_zc: m.kernel("rms_norm_zc")?,
            add_rms_norm_zc: m.kernel("add_rms_norm_zc")?,
            add_bf16: m.kernel("add_bf16")?,
        })
    }
}

use super::kernel_constants::{NORM_REGS, NORM_THREADS};

const THREADS: u32 = NORM_THREADS as u32;

/// Rows of `cols` columns that one norm block holds in registers (`kernels/norm.cuh`): the norms
/// that end other kernels (`moe_combine_add_norm`) take only these.
pub fn fits_registers(cols: usize) -> bool {
    cols <= NORM_REGS * NORM_THREADS
}

pub(super) fn check_gain(x: &GpuMatrix, w: &GpuWeight) {
    assert_eq!(w.dtype, DType::F32, "norm gain must be resident as f32");
    assert_eq!(w.numel(), x.cols, "norm gain width");
}

/// `y = x · rsqrt(mean(x²) + eps) · (1 + w)` per row.
pub fn rms_norm(cuda: &Cuda, x: &GpuMatrix, w: &GpuWeight, eps: f64) -> GpuMatrix {
    check_gain(x, w);
    let y = cuda.matrix(x.rows, x.cols);
    let args = [x.ptr().into(), w.ptr.into(), y.ptr().into(), x.cols.into(), (eps as f32).into()];
    cuda.kernels.norm.rms_norm_zc.launch(cuda.stream(), Dims::linear(x.rows, THREADS), &args);
    y
}

/// `residual ← bf16(residual + delta)`, then returns `rms_norm(residual)`, in one pass.
pub fn add_rms_norm(cuda: &Cuda, residual: &mut GpuMatrix, delta: &GpuMatrix, w: &GpuWeight, eps: f64) -> GpuMatrix {
    check_gain(residual, w);
    assert_eq!((residual.rows, residual.cols), (delta.rows, delta.cols), "residual add of different shapes");
    let y = cuda.matrix(residual.rows, residual.cols);
    let args = [
        residual.ptr().into(),
        delta.ptr().into(),
        w.ptr.into(),
        y.ptr().into(),
        residual.cols.into(),
        (eps as f32).into(),
    ];
    cuda.kernels.norm.add_rms_norm_zc.launch(cuda.stream(), Dims::linear(residual.rows, THREADS), &args);
    y
}

/// `x += y` (bf16).
pub fn add_in_place(cuda: &Cuda, x: &mut GpuMatrix, y: &GpuMatrix) {
    assert_eq!((x.rows, x.cols), (y.rows, y.cols), "residual add of different shapes");
    let n = x.len();
    let args = [x.ptr().into(), y.ptr().into(), n.into()];
    cuda.kernels.norm.add_bf16.launch(cuda.stream(), Dims::linear(n.div_ceil(THREADS as usize), THREADS), &args);
}
