//! CUDA graphs: a sequence of launches on the backend's stream recorded once and replayed as a
//! single launch (no per-kernel launch cost, no host work between kernels). The recorded work
//! keeps using the addresses it was captured with, so the pool buffers it touched are held by
//! the graph for as long as it lives (`Pool::begin_hold`).

use cudarc::driver::{CudaGraph, DriverError, sys};

use super::Cuda;
use super::memory::DeviceBuffer;

/// A captured, instantiated graph and the pool buffers its work uses.
pub struct CapturedGraph {
    // Field order is drop order: the executable graph goes before the memory it addresses.
    graph: CudaGraph,
    _held: Vec<DeviceBuffer>,
}

impl CapturedGraph {
    /// Records the launches `record` queues on the backend's stream. `record` must queue only
    /// capturable work: kernels and device-to-device copies on fixed addresses, no host copies
    /// from pageable memory, no synchronisation, and every pool buffer it takes dropped before it
    /// returns (else this panics: the buffer could be reused while the graph still writes it).
    /// Relaxed capture mode: a pool miss may still allocate from the driver during the capture.
    pub fn capture(cuda: &Cuda, record: impl FnOnce()) -> Result<CapturedGraph, DriverError> {
        let stream = cuda.stream();
        cuda.pool().begin_hold();
        let begun = stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED);
        if let Err(e) = begun {
            drop(cuda.pool().end_hold());
            return Err(e);
        }
        // A panic inside `record` (a pool miss the budget refuses, say) must not leave the stream
        // capturing, which would fail every later call on it: end the capture, then go on
        // unwinding.
        let recorded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(record));
        let ended = stream.end_capture(sys::CUgraphInstantiate_flags(0));
        let held = cuda.pool().end_hold();
        if let Err(panic) = recorded {
            drop(ended);
            cuda.pool().restore(held);
            std::panic::resume_unwind(panic);
        }
        let graph = ended?.expect("a capture that recorded work yields a graph");
        Ok(CapturedGraph { graph, _held: held })
    }

    /// Queues one replay on the stream the graph was captured on (no sync).
    pub fn replay(&self) -> Result<(), DriverError> {
        self.graph.launch()
    }

    /// Destroys the graph and gives its buffers back to the pool (`Pool::restore`), so the next
    /// capture takes them again instead of the driver's memory.
    pub fn release(self, cuda: &Cuda) {
        let CapturedGraph { graph, _held: held } = self;
        drop(graph);
        cuda.pool().restore(held);
    }
}
