//! `kernels/linear.cu`: dense bf16 projections `y = x · Wᵀ` with fp32 accumulation.

use std::sync::Arc;

use cudarc::driver::CudaContext;

use super::budget::Budget;
use super::device::Device;
use super::launch::{Dims, Kernel, KernelError, Module, embedded};
use super::tensor::{DType, GpuMatrix, GpuWeight};
use super::Cuda;

pub struct LinearKernels {
    linear_bf16_warp: Kernel,
}

impl LinearKernels {
    pub fn load(ctx: &Arc<CudaContext>) -> Result<LinearKernels, KernelError> {
        let m = Module::load(ctx, "linear", embedded::LINEAR)?;
        Ok(LinearKernels { linear_bf16_warp: m.kernel("linear_bf16_warp")? })
    }
}

/// cuBLASLt for multi-row projections (not wired yet: every projection uses the warp kernel).
pub struct Blas;

impl Blas {
    pub fn open(_device: &Device, _budget: &Arc<Budget>) -> Option<Blas> {
        None
    }
}

const WARPS_PER_BLOCK: usize = 8;

/// `y = x · Wᵀ` for a bf16 weight `[n, k]`; `x` is `[rows, k]`.
pub fn linear(cuda: &Cuda, x: &GpuMatrix, w: &GpuWeight) -> GpuMatrix {
    assert_eq!(w.dtype, DType::Bf16, "dense projection weight must be bf16");
    let (n, k) = w.matrix_dims();
    assert_eq!(x.cols, k, "projection input width");
    let y = cuda.matrix(x.rows, n);
    let dims = Dims::grid(
        (n.div_ceil(WARPS_PER_BLOCK) as u32, x.rows as u32, 1),
        (WARPS_PER_BLOCK * 32) as u32,
    );
    let args = [x.ptr().into(), w.ptr.into(), y.ptr().into(), n.into(), k.into()];
    cuda.kernels.linear.linear_bf16_warp.launch(cuda.stream(), dims, &args);
    y
}
