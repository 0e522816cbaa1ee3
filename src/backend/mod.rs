//! The seam between Drama 3's structure (`src/model`) and arithmetic. Model code is written once
//! against these traits; `cpu` implements them in plain f32 (the readable reference and test
//! oracle) and `cuda` implements the same contracts with its own kernels.
//!
//! Operations are named after the model's own submodules (a gated DeltaNet mixer, a MoE block,
//! a tower layer, a codec stage), one sub-trait per model part, so each part's arithmetic reads
//! like its section of `shared/spec`. A backend may fuse inside an operation but never changes
//! its contract. The decode batch's operations (`*_rows`) add one: each output row depends only
//! on its own input row and state, bit for bit, whatever other rows share the call. The codec
//! encoder (voice cloning) is not part of [`Backend`]: `codec_encode::CodecEncodeOps` is
//! implemented by the CPU and, in f32, by `cuda::codec_encode::CudaF32`.

pub mod backbone;
pub mod codec;
pub mod codec_encode;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod saved;
pub mod tower;

use crate::checkpoint::TensorView;
use crate::model::weights::TensorSpec;

/// The panic payload of a device allocation that failed while a stream was being set up (its
/// state, from the memory pool). Backend operations return no `Result`, so a failed allocation
/// unwinds; the worker, which catches every panic of a stream's work, knows this payload by its
/// type and refuses that one request with a 503 and `Retry-After` (issue 16: "device OOM at
/// admission"), where any other panic is that request's 500.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutOfDeviceMemory {
    /// What was being allocated, and the allocator's error.
    pub what: String,
}

impl std::fmt::Display for OutOfDeviceMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "out of device memory: {}", self.what)
    }
}

/// The text of a panic payload (`panic!` with a literal or a format string, or
/// [`OutOfDeviceMemory`]).
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else if let Some(oom) = payload.downcast_ref::<OutOfDeviceMemory>() {
        oom.to_string()
    } else {
        String::from("(no message)")
    }
}

/// Types every operation shares.
pub trait BackendTypes {
    /// Activations: a row-major `[rows, width]` matrix, one row per sequence position.
    type Act: Clone;
    /// A weight tensor resident where the backend computes.
    type Weight;

    /// Makes a checkpoint tensor resident (converted as the backend computes with it).
    fn upload(&self, spec: &TensorSpec, view: TensorView<'_>) -> Self::Weight;

    /// Makes a host-prepared f32 tensor resident (e.g. a folded weight-norm weight).
    fn upload_f32(&self, shape: &[usize], data: Vec<f32>) -> Self::Weight;

    /// Copies activations to the host (for traces and comparisons, never on the hot path).
    fn to_host(&self, a: &Self::Act) -> cpu::Matrix;

    /// Rows `start..start + count` of an activation, as a new activation.
    fn act_rows(&self, a: &Self::Act, start: usize, count: usize) -> Self::Act;

    /// The rows of `parts` stacked in order (all of one width) into one activation.
    fn stack_rows(&self, parts: &[Self::Act]) -> Self::Act;
}

/// A backend that takes big checkpoint tensors straight from file pieces, in file order
/// (`model::file_order`, issue 16's fast restarts): each weight is allocated first, then its bytes
/// are copied out of staging buffers as the reading threads fill them. The CUDA engine does this
/// through pinned memory; the CPU backend converts every weight and has no need to.
pub trait FileOrderUpload: BackendTypes {
    /// A host buffer the reading threads fill, aligned for direct I/O.
    type Staging: AsRef<[u8]> + AsMut<[u8]> + Send;
    /// Marks the end of the copies out of one staging buffer.
    type Fence;

    /// Allocates `spec`'s resident weight. `Some(address)`: the weight is the stored bytes as they
    /// are, copied to `address` later by [`FileOrderUpload::copy_staged`]; `None`: the backend
    /// converted `view` and made it resident now (the small tensors).
    fn reserve(&self, spec: &TensorSpec, view: TensorView<'_>) -> (Self::Weight, Option<u64>);

    /// `count` staging buffers of `bytes` each (a multiple of the direct-I/O alignment).
    fn staging(&self, count: usize, bytes: usize) -> Result<Vec<Self::Staging>, String>;

    /// Queues copies out of `staging`, each `(range in the buffer, destination address)`.
    fn copy_staged(&self, staging: &Self::Staging, copies: &[(std::ops::Range<usize>, u64)]) -> Self::Fence;

    /// Returns once the fence's copies are done, so that their buffer may be refilled.
    fn wait(&self, fence: Self::Fence);
}

/// Everything the engine needs from a backend: one sub-trait per model part, and saved request
/// state (a voice's prompt prefix kept across requests).
pub trait Backend: backbone::BackboneOps + tower::TowerOps + codec::CodecOps + saved::SavedStateOps {}

impl<B: backbone::BackboneOps + tower::TowerOps + codec::CodecOps + saved::SavedStateOps> Backend for B {}
