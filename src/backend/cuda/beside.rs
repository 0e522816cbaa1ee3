//! A second stream for independent work inside one step: [`Cuda::beside`] queues a branch's
//! launches on the side stream, forked from the backend's stream at that point, and the branch's
//! result joins the backend's stream where it is first read. The decode MoE runs its shared
//! expert beside the routing and the routed experts this way: those chains do not depend on each
//! other, and in series the shared expert's two short GEMVs sat on the step's critical path.
//!
//! Scheduling only: every kernel reads and writes what it would in series, so the bits do not
//! change. Under graph capture the fork and the join become graph edges (the side stream joins
//! the capture through the fork's event). The activation pool parks buffers dropped while a
//! branch is open (`Pool::fork`), so neither stream reuses memory the other may still read.

use std::cell::Cell;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use cudarc::driver::{CudaEvent, CudaStream, DriverError};

use super::Cuda;

/// The side stream and the two events that fork it from and join it to the backend's stream.
pub(super) struct SideStream {
    stream: Arc<CudaStream>,
    fork: CudaEvent,
    join: CudaEvent,
    /// Launches go to the side stream now (set while a branch is queued).
    pub(super) queuing: AtomicBool,
    /// Branches run on the side stream; off, they run in series on the backend's stream.
    pub(super) enabled: AtomicBool,
}

impl SideStream {
    pub(super) fn new(main: &CudaStream) -> Result<SideStream, DriverError> {
        let ctx = main.context();
        Ok(SideStream {
            stream: ctx.new_stream()?,
            fork: ctx.new_event(None)?,
            join: ctx.new_event(None)?,
            queuing: AtomicBool::new(false),
            enabled: AtomicBool::new(true),
        })
    }

    pub(super) fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
}

/// A branch's result. Reading it ([`Beside::get`]) first makes the backend's stream wait for the
/// branch's work; dropping it unread does the same, so no branch outlives its scope (a capture
/// must end with every stream joined).
pub struct Beside<'c, T> {
    value: T,
    /// The backend whose stream joins the branch; `None`: computed in series.
    cuda: Option<&'c Cuda>,
    /// Not joined yet.
    open: Cell<bool>,
}

impl<T> Beside<'_, T> {
    /// A value computed in series (nothing to join).
    pub fn done(value: T) -> Self {
        Beside { value, cuda: None, open: Cell::new(false) }
    }

    /// The branch's result, for work queued on the backend's stream from now on.
    pub fn get(&self) -> &T {
        self.join();
        &self.value
    }

    fn join(&self) {
        let Some(cuda) = self.cuda.filter(|_| self.open.replace(false)) else { return };
        let side = cuda.side.as_ref().expect("a branch was forked on the side stream");
        let main = &cuda.device.stream;
        let joined = side.join.record(&side.stream).and_then(|()| main.wait(&side.join));
        cuda.pool.join();
        if let Err(e) = joined {
            // Unwinding already: the fault sticks to the context and the next sync reports it.
            if !std::thread::panicking() {
                panic!("joining the side stream: {e}");
            }
        }
    }
}

impl<T> Drop for Beside<'_, T> {
    fn drop(&mut self) {
        self.join();
    }
}

/// Routes launches to the side stream while alive (also when the branch unwinds).
struct Queuing<'c> {
    cuda: &'c Cuda,
    side: &'c SideStream,
}

impl Drop for Queuing<'_> {
    fn drop(&mut self) {
        self.side.queuing.store(false, Ordering::Relaxed);
        self.cuda.pool.side_queued();
    }
}

impl Cuda {
    /// Queues `branch`'s launches on the side stream: they start after everything queued on
    /// this stream so far and run beside whatever is queued here next, until the result is read
    /// ([`Beside::get`]). Without a side stream (a [`Cuda::fork_stream`] handle, or
    /// [`Cuda::set_side_stream`] off) the branch runs here, in series.
    ///
    /// `branch` may only queue work (kernels, copies on the stream) and take pool buffers; it must
    /// not synchronise, open another branch, or call cuBLASLt (its handle is bound to the
    /// backend's stream).
    pub fn beside<'c, T>(&'c self, branch: impl FnOnce(&Cuda) -> T) -> Beside<'c, T> {
        let Some(side) = self.side.as_ref().filter(|s| s.enabled.load(Ordering::Relaxed)) else {
            return Beside::done(branch(self));
        };
        let main = &self.device.stream;
        side.fork
            .record(main)
            .and_then(|()| side.stream.wait(&side.fork))
            .unwrap_or_else(|e| panic!("forking the side stream: {e}"));
        self.pool.fork(&side.stream);
        // Joins even if the branch unwinds (the pool's branch must close).
        let joins = Beside { value: (), cuda: Some(self), open: Cell::new(true) };
        side.queuing.store(true, Ordering::Relaxed);
        let value = {
            let _queuing = Queuing { cuda: self, side };
            branch(self)
        };
        joins.open.set(false);
        Beside { value, cuda: Some(self), open: Cell::new(true) }
    }

    /// Runs later branches on the side stream (`true`, the default) or in series here (`false`:
    /// checks compare the two).
    pub fn set_side_stream(&self, on: bool) {
        if let Some(side) = &self.side {
            side.enabled.store(on, Ordering::Relaxed);
        }
    }
}
