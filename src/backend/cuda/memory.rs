//! Device memory, always through the [`Budget`]: raw buffers, the weight arena (tensors packed
//! into large chunks, one driver allocation per chunk), and the activation pool (buffers kept
//! in size classes and reused, so that after warm-up a decode step makes no driver allocation;
//! the pool counts any that happen after it was sealed).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaStream, DriverError, result, sys};

use super::budget::{AllocError, Budget, Held, allocate};

pub type MemoryError = AllocError<DriverError>;

/// Alignment of every buffer and arena placement (cuBLASLt and 16-byte vector loads need ≥ 16).
pub const ALIGN: usize = 256;

/// One driver allocation, freed (and its bytes released) on drop.
pub struct DeviceBuffer {
    ptr: sys::CUdeviceptr,
    bytes: usize,
    held: Option<Held>,
    budget: Arc<Budget>,
}

// SAFETY: a device pointer is an address in the context's memory, usable from any thread that
// binds the context; the buffer is freed exactly once, in `drop`.
unsafe impl Send for DeviceBuffer {}
unsafe impl Sync for DeviceBuffer {}

impl DeviceBuffer {
    pub fn alloc(budget: &Arc<Budget>, what: &str, bytes: usize) -> Result<DeviceBuffer, MemoryError> {
        let bytes = bytes.max(1).next_multiple_of(ALIGN);
        // SAFETY: a plain synchronous allocation on the current context; the pointer is owned here.
        let (ptr, held) = allocate(budget, what, bytes as u64, || unsafe { result::malloc_sync(bytes) })?;
        Ok(DeviceBuffer { ptr, bytes, held: Some(held), budget: Arc::clone(budget) })
    }

    /// [`DeviceBuffer::alloc`], filled with zero bytes before it is returned.
    pub fn zeroed(budget: &Arc<Budget>, what: &str, bytes: usize) -> Result<DeviceBuffer, MemoryError> {
        let buffer = DeviceBuffer::alloc(budget, what, bytes)?;
        // SAFETY: the whole of a live allocation this function owns; the fill completes before
        // the call returns (nothing else can see the buffer yet).
        unsafe { result::memset_d8_sync(buffer.ptr, 0, buffer.bytes) }.map_err(|source| MemoryError::Driver {
            what: what.to_owned(),
            bytes: buffer.bytes as u64,
            source,
        })?;
        Ok(buffer)
    }

    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from `malloc_sync` and is freed once; cuMemFree waits for work using it.
        let freed = unsafe { result::free_sync(self.ptr) };
        if freed.is_ok()
            && let Some(held) = self.held.take()
        {
            self.budget.release(held);
        }
    }
}

/// Weights packed into chunks: one driver allocation per `CHUNK` bytes instead of one per tensor
/// (the full model has ~62 000 tensors).
pub struct WeightArena {
    budget: Arc<Budget>,
    chunks: Vec<Arc<DeviceBuffer>>,
    offset: usize,
}

impl WeightArena {
    pub const CHUNK: usize = 1 << 30;

    pub fn new(budget: Arc<Budget>) -> WeightArena {
        WeightArena { budget, chunks: Vec::new(), offset: 0 }
    }

    /// Room for `bytes` at an aligned address; the chunk keeps it alive.
    pub fn place(&mut self, what: &str, bytes: usize) -> Result<(u64, Arc<DeviceBuffer>), MemoryError> {
        let bytes = bytes.max(1).next_multiple_of(ALIGN);
        let fits = self.chunks.last().is_some_and(|c| self.offset + bytes <= c.bytes());
        if !fits {
            let chunk = DeviceBuffer::alloc(&self.budget, what, bytes.max(Self::CHUNK))?;
            self.chunks.push(Arc::new(chunk));
            self.offset = 0;
        }
        let chunk = self.chunks.last().expect("a chunk was just ensured");
        let ptr = chunk.ptr() + self.offset as u64;
        self.offset += bytes;
        Ok((ptr, Arc::clone(chunk)))
    }

    /// Bytes the arena holds from the driver.
    pub fn reserved_bytes(&self) -> usize {
        self.chunks.iter().map(|c| c.bytes()).sum()
    }
}

/// Counters of the activation pool.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Driver allocations made by the pool in total.
    pub driver_allocations: u64,
    /// Of those, made after [`Pool::seal`] (a decode path that allocates shows up here).
    pub after_seal: u64,
    /// Bytes the pool holds, in use or free.
    pub bytes: u64,
}

struct PoolInner {
    free: BTreeMap<usize, Vec<DeviceBuffer>>,
    /// While a CUDA graph is captured: the buffers its recorded work uses (see [`Pool::begin_hold`]).
    hold: Option<Hold>,
    /// While work runs on a side stream beside the pool's own (see [`Pool::fork`]).
    branch: Option<Branch>,
    stats: PoolStats,
    sealed: bool,
    /// Checks set this: every buffer handed out is first filled with 0xFF bytes, a NaN in bf16,
    /// f32 and e4m3, so an element a kernel forgot to write cannot pass a comparison.
    poison: bool,
}

/// Buffers a captured graph owns: every buffer dropped during the capture (they are reused within
/// it, in stream order, and never handed out again), and a count of those taken during it that
/// are still out.
#[derive(Default)]
struct Hold {
    free: BTreeMap<usize, Vec<DeviceBuffer>>,
    outstanding: usize,
}

/// Work queued on a side stream beside the pool's stream, from its fork to its join. Stream
/// order no longer covers reuse: a buffer dropped meanwhile may still be read by either stream's
/// queued work, so it is parked and becomes free (or held) again only at the join, once the
/// pool's stream waits for the side's work.
struct Branch {
    side: Arc<CudaStream>,
    /// The branch's launches are being queued now: takes poison on the side stream.
    queuing: bool,
    parked: Vec<DeviceBuffer>,
}

/// Reusable scratch and activation buffers in power-of-two size classes.
pub struct Pool {
    budget: Arc<Budget>,
    stream: Arc<CudaStream>,
    inner: Mutex<PoolInner>,
}

impl Pool {
    pub fn new(budget: Arc<Budget>, stream: Arc<CudaStream>) -> Arc<Pool> {
        let inner = PoolInner {
            free: BTreeMap::new(),
            hold: None,
            branch: None,
            stats: PoolStats::default(),
            sealed: false,
            poison: false,
        };
        Arc::new(Pool { budget, stream, inner: Mutex::new(inner) })
    }

    fn class(bytes: usize) -> usize {
        bytes.max(ALIGN).next_power_of_two()
    }

    /// A buffer of at least `bytes`, reused when one is free. Contents are undefined.
    ///
    /// A free buffer of the request's size class is taken first, else the smallest free one of a
    /// larger class: after the engine's warm-up has run its largest shapes (the whole decode
    /// batch, a full prefill chunk, the codec's largest groups), the smaller shapes of any later
    /// step find room among those buffers and serving makes no driver allocation.
    pub fn take(self: &Arc<Pool>, bytes: usize) -> Result<PoolBuf, MemoryError> {
        let class = Pool::class(bytes);
        let mut inner = self.inner.lock().expect("pool lock");
        let held = inner.hold.as_mut().and_then(|h| smallest_fit(&mut h.free, class));
        let reused = held.or_else(|| smallest_fit(&mut inner.free, class));
        let buffer = match reused {
            Some(b) => b,
            None => {
                let b = DeviceBuffer::alloc(&self.budget, "activation pool", class)?;
                inner.stats.driver_allocations += 1;
                inner.stats.after_seal += u64::from(inner.sealed);
                inner.stats.bytes += class as u64;
                b
            }
        };
        if inner.poison {
            let stream = inner.branch.as_ref().filter(|b| b.queuing).map_or(&self.stream, |b| &b.side);
            // SAFETY: the buffer is live and `buffer.bytes()` long; the fill is ordered on the
            // stream the taker queues on (the side's while a branch is queued), before any kernel
            // that receives the buffer.
            unsafe { result::memset_d8_async(buffer.ptr(), 0xFF, buffer.bytes(), stream.cu_stream()) }.map_err(
                |source| AllocError::Driver {
                    what: "poisoning a pool buffer".into(),
                    bytes: buffer.bytes() as u64,
                    source,
                },
            )?;
        }
        let in_hold = match inner.hold.as_mut() {
            Some(hold) => {
                hold.outstanding += 1;
                true
            }
            None => false,
        };
        Ok(PoolBuf { buffer: Some(buffer), bytes, in_hold, pool: Arc::clone(self) })
    }

    /// Starts recording for a CUDA graph capture: from now until [`Pool::end_hold`], buffers
    /// dropped are kept apart (reused only by takes during the capture) instead of returning to
    /// the pool. A graph replays its recorded addresses long after the capture, so none of them
    /// may ever be handed to anyone else while the graph lives.
    ///
    /// # Panics
    /// If a hold is already active.
    pub fn begin_hold(&self) {
        let mut inner = self.inner.lock().expect("pool lock");
        assert!(inner.hold.is_none(), "a pool hold is already active (one graph capture at a time)");
        assert!(inner.branch.is_none(), "a graph capture began inside a side-stream branch");
        inner.hold = Some(Hold::default());
    }

    /// Ends the hold and returns its buffers, for the graph to own.
    ///
    /// # Panics
    /// If a buffer taken during the hold is still out: its owner would return it to the pool
    /// while the graph still uses its address.
    pub fn end_hold(&self) -> Vec<DeviceBuffer> {
        let mut inner = self.inner.lock().expect("pool lock");
        assert!(inner.branch.is_none(), "a graph capture ended inside a side-stream branch");
        let hold = inner.hold.take().expect("no pool hold is active");
        assert_eq!(hold.outstanding, 0, "{} buffers taken during a graph capture outlived it", hold.outstanding);
        hold.free.into_values().flatten().collect()
    }

    /// Opens a branch: `side` has just been made to wait for the pool's stream, and the launches
    /// queued from now until [`Pool::side_queued`] go to `side`. Until [`Pool::join`], dropped
    /// buffers are parked (see `Branch`).
    ///
    /// # Panics
    /// If a branch is already open (branches do not nest).
    pub fn fork(&self, side: &Arc<CudaStream>) {
        let mut inner = self.inner.lock().expect("pool lock");
        assert!(inner.branch.is_none(), "a side-stream branch is already open");
        inner.branch = Some(Branch { side: Arc::clone(side), queuing: true, parked: Vec::new() });
    }

    /// The branch's launches are queued; launches go to the pool's own stream again.
    pub fn side_queued(&self) {
        let mut inner = self.inner.lock().expect("pool lock");
        inner.branch.as_mut().expect("no side-stream branch is open").queuing = false;
    }

    /// Closes the branch once the pool's stream has been made to wait for the side's work: its
    /// parked buffers are free again (kept by the graph's hold during a capture).
    pub fn join(&self) {
        let mut inner = self.inner.lock().expect("pool lock");
        let branch = inner.branch.take().expect("no side-stream branch is open");
        for buffer in branch.parked {
            let class = buffer.bytes();
            match inner.hold.as_mut() {
                Some(hold) => hold.free.entry(class).or_default().push(buffer),
                None => inner.free.entry(class).or_default().push(buffer),
            }
        }
    }

    /// Poison every buffer handed out from now on (see `PoolInner::poison`).
    pub fn set_poison(&self, on: bool) {
        self.inner.lock().expect("pool lock").poison = on;
    }

    /// Takes back the buffers a dropped graph held (`CapturedGraph::release`) as free buffers.
    /// Safe in stream order: the graph's replays were queued on this pool's stream before any
    /// work of a later taker.
    pub fn restore(&self, buffers: Vec<DeviceBuffer>) {
        let mut inner = self.inner.lock().expect("pool lock");
        for b in buffers {
            inner.free.entry(b.bytes()).or_default().push(b);
        }
    }

    /// Frees every buffer the pool holds free (their bytes go back to the budget). Call it once
    /// the stream is idle: a freed buffer may no longer be read by queued work.
    pub fn release_free(&self) {
        let mut inner = self.inner.lock().expect("pool lock");
        let freed: u64 = inner.free.values().flatten().map(|b| b.bytes() as u64).sum();
        inner.free.clear();
        inner.stats.bytes -= freed;
    }

    /// From now on every driver allocation is counted in [`PoolStats::after_seal`].
    pub fn seal(&self) {
        self.inner.lock().expect("pool lock").sealed = true;
    }

    pub fn stats(&self) -> PoolStats {
        self.inner.lock().expect("pool lock").stats
    }

    /// The stream a taker queues on now: the side's while a branch's launches are queued.
    pub fn stream(&self) -> Arc<CudaStream> {
        let inner = self.inner.lock().expect("pool lock");
        Arc::clone(inner.branch.as_ref().filter(|b| b.queuing).map_or(&self.stream, |b| &b.side))
    }
}

/// The smallest free buffer of size class `class` or larger, taken out of `free`.
fn smallest_fit(free: &mut BTreeMap<usize, Vec<DeviceBuffer>>, class: usize) -> Option<DeviceBuffer> {
    free.range_mut(class..).find_map(|(_, buffers)| buffers.pop())
}

/// A pool buffer, returned to its size class on drop. Work queued on the one stream that reads
/// it is ordered before any later reuse, so returning it early is safe (while a side-stream
/// branch is open it is parked until the join instead).
pub struct PoolBuf {
    buffer: Option<DeviceBuffer>,
    bytes: usize,
    /// Taken during a hold (counted in its `outstanding`).
    in_hold: bool,
    pool: Arc<Pool>,
}

impl PoolBuf {
    pub fn ptr(&self) -> u64 {
        self.buffer.as_ref().expect("live pool buffer").ptr()
    }

    /// The bytes asked for (the buffer may be larger).
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }
}

impl Drop for PoolBuf {
    fn drop(&mut self) {
        if let Some(buffer) = self.buffer.take() {
            let class = buffer.bytes();
            if let Ok(mut inner) = self.pool.inner.lock() {
                let inner = &mut *inner;
                if let Some(hold) = inner.hold.as_mut() {
                    hold.outstanding -= usize::from(self.in_hold);
                }
                match (inner.branch.as_mut(), inner.hold.as_mut()) {
                    (Some(branch), _) => branch.parked.push(buffer),
                    (None, Some(hold)) => hold.free.entry(class).or_default().push(buffer),
                    // A buffer taken during a hold that ended goes back to the pool here; the
                    // hold's end has already panicked about it.
                    (None, None) => inner.free.entry(class).or_default().push(buffer),
                }
            }
        }
    }
}
