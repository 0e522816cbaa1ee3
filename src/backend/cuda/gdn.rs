//! `kernels/gdn.cu` (being written).

use std::sync::Arc;

use cudarc::driver::CudaContext;

use super::launch::{KernelError, Module, embedded};

pub struct GdnKernels {}

impl GdnKernels {
    pub fn load(ctx: &Arc<CudaContext>) -> Result<GdnKernels, KernelError> {
        let _m = Module::load(ctx, "gdn", embedded::GDN)?;
        Ok(GdnKernels {})
    }
}
