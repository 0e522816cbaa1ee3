//! The CUDA engine's side of the file-order weight upload (`model::file_order`): weights are
//! placed in the arena first, the reading threads fill pinned staging buffers (page-aligned, so
//! direct I/O reads into them), and each piece's copies go out on the stream behind one event.

use cudarc::driver::CudaEvent;

use super::staging::PinnedBuffer;
use super::tensor::{DType, GpuWeight};
use super::{Cuda, resident_dtype};
use crate::backend::{BackendTypes, FileOrderUpload};
use crate::checkpoint::TensorView;
use crate::model::weights::TensorSpec;

impl FileOrderUpload for Cuda {
    type Staging = PinnedBuffer;
    type Fence = CudaEvent;

    fn reserve(&self, spec: &TensorSpec, view: TensorView<'_>) -> (GpuWeight, Option<u64>) {
        match resident_dtype(spec.accept) {
            // Resident as stored: the file's bytes are the weight's.
            dtype @ (DType::Bf16 | DType::Fp8E4m3) => {
                let weight = self.reserve_weight(&spec.name, view.shape, dtype, view.bytes.len());
                let dst = weight.ptr;
                (weight, Some(dst))
            }
            // Converted on the host (norms, biases, scales: small), uploaded now.
            DType::F32 | DType::F16 => (self.upload(spec, view), None),
        }
    }

    fn staging(&self, count: usize, bytes: usize) -> Result<Vec<PinnedBuffer>, String> {
        (0..count)
            .map(|_| PinnedBuffer::alloc(&self.pinned, "file-order upload staging", bytes).map_err(|e| e.to_string()))
            .collect()
    }

    fn copy_staged(&self, staging: &PinnedBuffer, copies: &[(std::ops::Range<usize>, u64)]) -> CudaEvent {
        let stream = self.stream();
        for (range, dst) in copies {
            let src = &staging.as_ref()[range.clone()];
            // SAFETY: `dst .. dst + src.len()` lies inside a weight reserved in the arena
            // (`reserve`: the tensor's whole stored size, and the copy is a sub-range of the
            // tensor); `staging` is pinned memory the caller does not refill until this call's
            // event has completed (`wait`).
            unsafe { cudarc::driver::result::memcpy_htod_async(*dst, src, stream.cu_stream()) }
                .unwrap_or_else(|e| panic!("uploading weights from staging: {e}"));
        }
        let event = stream.context().new_event(None).unwrap_or_else(|e| panic!("an upload event: {e}"));
        event.record(stream).unwrap_or_else(|e| panic!("recording an upload event: {e}"));
        event
    }

    fn wait(&self, fence: CudaEvent) {
        fence.synchronize().unwrap_or_else(|e| panic!("waiting for a weight upload: {e}"));
    }
}
