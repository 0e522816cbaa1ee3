//! `kernels/moe.cu` (being written).

use std::sync::Arc;

use cudarc::driver::CudaContext;

use super::launch::{KernelError, Module, embedded};

pub struct MoeKernels {}

impl MoeKernels {
    pub fn load(ctx: &Arc<CudaContext>) -> Result<MoeKernels, KernelError> {
        let _m = Module::load(ctx, "moe", embedded::MOE)?;
        Ok(MoeKernels {})
    }
}
