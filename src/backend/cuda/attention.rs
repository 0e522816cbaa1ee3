//! `kernels/attention.cu` (being written).

use std::sync::Arc;

use cudarc::driver::CudaContext;

use super::launch::{KernelError, Module, embedded};

pub struct AttentionKernels {}

impl AttentionKernels {
    pub fn load(ctx: &Arc<CudaContext>) -> Result<AttentionKernels, KernelError> {
        let _m = Module::load(ctx, "attention", embedded::ATTENTION)?;
        Ok(AttentionKernels {})
    }
}
