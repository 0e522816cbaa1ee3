//! Pinned host memory, under its own budget, and the double-buffered staging that uploads
//! weights through it: the host copies a piece of the (memory-mapped) checkpoint into one
//! pinned buffer while the DMA engine copies the other to the device.

use std::sync::Arc;

use cudarc::driver::{CudaEvent, CudaStream, DriverError, result};

use super::budget::{Budget, Held, allocate};
use super::memory::MemoryError;

/// Page-locked host memory, freed (and its bytes released) on drop.
pub struct PinnedBuffer {
    ptr: *mut u8,
    bytes: usize,
    held: Option<Held>,
    budget: Arc<Budget>,
}

// SAFETY: the buffer is plain host memory owned by this value; it moves between threads with it.
unsafe impl Send for PinnedBuffer {}

impl PinnedBuffer {
    pub fn alloc(budget: &Arc<Budget>, what: &str, bytes: usize) -> Result<PinnedBuffer, MemoryError> {
        // SAFETY: cuMemHostAlloc with no flags: portable to this context, not write-combined
        // (so host reads stay fast); the pointer is owned here and freed once in `drop`.
        let (ptr, held) = allocate(budget, what, bytes as u64, || unsafe { result::malloc_host(bytes, 0) })?;
        Ok(PinnedBuffer { ptr: ptr.cast(), bytes, held: Some(held), budget: Arc::clone(budget) })
    }

    pub fn len(&self) -> usize {
        self.bytes
    }

    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` addresses `bytes` bytes of host memory owned by `self`; `&mut self`
        // makes the slice the only access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.bytes) }
    }
}

impl AsRef<[u8]> for PinnedBuffer {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `ptr` addresses `bytes` bytes of host memory owned by `self`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.bytes) }
    }
}

impl AsMut<[u8]> for PinnedBuffer {
    fn as_mut(&mut self) -> &mut [u8] {
        self.as_mut_slice()
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from cuMemHostAlloc and is freed once. Copies reading it were
        // waited for by the stager's events before it can be dropped.
        if unsafe { result::free_host(self.ptr.cast()) }.is_ok()
            && let Some(held) = self.held.take()
        {
            self.budget.release(held);
        }
    }
}

/// Two pinned buffers used alternately for host → device uploads.
pub struct Stager {
    buffers: [PinnedBuffer; 2],
    /// Marks the end of the last copy out of each buffer.
    done: [CudaEvent; 2],
    next: usize,
}

impl Stager {
    pub const PIECE: usize = 32 << 20;

    pub fn new(budget: &Arc<Budget>, stream: &Arc<CudaStream>) -> Result<Stager, MemoryError> {
        let buffers = [
            PinnedBuffer::alloc(budget, "upload staging", Self::PIECE)?,
            PinnedBuffer::alloc(budget, "upload staging", Self::PIECE)?,
        ];
        let event = || {
            stream.context().new_event(None).map_err(|source| super::budget::AllocError::Driver {
                what: "upload staging event".into(),
                bytes: 0,
                source,
            })
        };
        let done = [event()?, event()?];
        // Record both once so the first wait on each returns at once.
        for e in &done {
            e.record(stream).map_err(|source| super::budget::AllocError::Driver {
                what: "upload staging event".into(),
                bytes: 0,
                source,
            })?;
        }
        Ok(Stager { buffers, done, next: 0 })
    }

    /// Queues the copy of `src` to device address `dst` on `stream`, piece by piece. Returns
    /// once every piece is in a pinned buffer; the device copies may still be in flight.
    pub fn upload(&mut self, stream: &CudaStream, dst: u64, src: &[u8]) -> Result<(), DriverError> {
        for (i, piece) in src.chunks(Self::PIECE).enumerate() {
            let b = self.next;
            self.next = 1 - b;
            // The previous copy out of this buffer must be finished before it is refilled.
            self.done[b].synchronize()?;
            let staged = &mut self.buffers[b].as_mut_slice()[..piece.len()];
            staged.copy_from_slice(piece);
            let offset = (i * Self::PIECE) as u64;
            // SAFETY: `dst + offset .. + piece.len()` lies inside the caller's device allocation;
            // `staged` is pinned memory that is not touched again until `done[b]` (recorded
            // right after this copy) has completed.
            unsafe { result::memcpy_htod_async(dst + offset, staged, stream.cu_stream()) }?;
            self.done[b].record(stream)?;
        }
        Ok(())
    }
}

impl Drop for Stager {
    fn drop(&mut self) {
        // The pinned buffers are freed right after this: no copy may still read them.
        for e in &self.done {
            let _ = e.synchronize();
        }
    }
}
