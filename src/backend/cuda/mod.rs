//! The CUDA backend: the same contracts as the CPU backend, computed on an NVIDIA GPU with the
//! kernels in `kernels/*.cu` (one wrapper module per file). It owns the context, the stream every
//! launch is ordered on (and a side stream for independent work within a step, `beside`), the
//! memory budget, the weight arena and the activation pool.
//! All device `unsafe` of the crate lives under this module.
//!
//! Numerics: activations are bf16 between operations (the reference's rounding points),
//! reductions and recurrent state are fp32, weights are used exactly as stored (bf16 matrices,
//! e4m3 experts with their f32 block scales; small tensors widened to f32 exactly).

pub mod admission;
pub mod attention;
pub mod backbone;
pub mod beside;
pub mod budget;
pub mod codec;
pub mod codec_encode;
pub mod cublaslt;
pub mod device;
pub mod file_upload;
pub mod gdn;
pub mod graph;
pub mod kernel_constants;
pub mod launch;
pub mod linear;
pub mod memory;
pub mod moe;
pub mod norm;
pub mod profile;
pub mod sampling;
pub mod saved;
pub mod staging;
pub mod step;
pub mod tables;
pub mod tensor;
pub mod tower;

use std::sync::{Arc, Mutex};

use half::{bf16, f16};

use self::budget::Budget;
use self::device::{Device, DeviceError, DeviceInfo};
use self::launch::KernelError;
use self::memory::{MemoryError, Pool, PoolBuf, WeightArena};
use self::tensor::{DType, Elem, GpuMatrix, GpuWeight};
use super::BackendTypes;
use super::cpu::Matrix;
use crate::checkpoint::TensorView;
use crate::model::weights::{Accept, TensorSpec};

/// How to open the GPU.
#[derive(Clone, Debug)]
pub struct CudaOptions {
    pub ordinal: usize,
    /// Hard cap on device memory; `None` = what the device reports free at start minus `reserve`.
    pub memory_budget: Option<u64>,
    /// Left to the driver and other processes when the budget is derived from free memory.
    pub reserve: u64,
    /// Cap on pinned host memory (staging for uploads and audio read-back).
    pub pinned_budget: u64,
    /// Positions each request's KV caches hold.
    pub context: usize,
}

impl Default for CudaOptions {
    fn default() -> CudaOptions {
        CudaOptions { ordinal: 0, memory_budget: None, reserve: 1 << 30, pinned_budget: 1 << 30, context: 16384 }
    }
}

/// Why the CUDA backend did not start.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    #[error(transparent)]
    Device(#[from] DeviceError),
    #[error("a kernel failed to load: {0}")]
    Kernel(#[from] KernelError),
    #[error("--gpu-memory-budget {requested} bytes is more than GPU {ordinal} has free ({free} bytes of {total})")]
    BudgetAboveFree { ordinal: usize, requested: u64, free: u64, total: u64 },
    #[error("GPU memory: {0}")]
    Memory(#[from] MemoryError),
    #[error("CUDA driver call failed: {0}")]
    Driver(#[from] cudarc::driver::DriverError),
}

/// Every kernel of every module, resolved at start-up: a missing kernel fails start-up, not a request.
pub struct Kernels {
    pub norm: norm::NormKernels,
    pub linear: linear::LinearKernels,
    pub gdn: gdn::GdnKernels,
    pub attention: attention::AttentionKernels,
    pub moe: moe::MoeKernels,
    pub tower: tower::TowerKernels,
    pub codec: codec::CodecKernels,
    pub codec_encode: codec_encode::CodecEncodeKernels,
    pub sampling: sampling::SamplingKernels,
    pub saved: saved::SavedKernels,
    pub step: step::StepKernels,
}

impl Kernels {
    fn load(device: &Device) -> Result<Kernels, KernelError> {
        let ctx = &device.ctx;
        Ok(Kernels {
            norm: norm::NormKernels::load(ctx)?,
            linear: linear::LinearKernels::load(ctx, device.info.compute_capability == (9, 0))?,
            gdn: gdn::GdnKernels::load(ctx)?,
            attention: attention::AttentionKernels::load(ctx)?,
            moe: moe::MoeKernels::load(ctx)?,
            tower: tower::TowerKernels::load(ctx)?,
            codec: codec::CodecKernels::load(ctx)?,
            codec_encode: codec_encode::CodecEncodeKernels::load(ctx)?,
            sampling: sampling::SamplingKernels::load(ctx)?,
            saved: saved::SavedKernels::load(ctx)?,
            step: step::StepKernels::load(ctx)?,
        })
    }
}

/// The CUDA backend. Create it on the thread that will use it (the context is bound there).
pub struct Cuda {
    device: Device,
    budget: Arc<Budget>,
    pinned: Arc<Budget>,
    pool: Arc<Pool>,
    arena: Mutex<WeightArena>,
    /// Pinned staging for weight uploads; `None` on a [`Cuda::fork_stream`] handle, which
    /// uploads no weights.
    stager: Option<Mutex<staging::Stager>>,
    pub kernels: Kernels,
    pub blas: Option<linear::Blas>,
    context: usize,
    /// The restricted head for the last id list asked for (the model's band + EOS: built once).
    head: Mutex<Option<(Vec<u32>, linear::RestrictedHead)>>,
    /// The arena saved request state lives in, once reserved ([`Cuda::reserve_saved_states`]).
    saved: Mutex<Option<Arc<saved::SavedArena>>>,
    /// The stream [`Cuda::beside`] queues branches on; `None` on a [`Cuda::fork_stream`] handle.
    side: Option<beside::SideStream>,
    /// The arena [`Cuda::stage_table`] fills while a batch step is recorded (`tables`).
    tables: Mutex<Option<tables::TableArena>>,
    /// The attention decode's per-launch split counts (this handle's stream alone).
    merge_counts: attention::MergeCounts,
}

impl Cuda {
    pub fn open(options: &CudaOptions) -> Result<Cuda, CudaError> {
        let device = Device::open(options.ordinal)?;
        let (free, total) = (device.info.free_memory_at_open, device.info.total_memory);
        let cap = match options.memory_budget {
            Some(requested) if requested > free => {
                return Err(CudaError::BudgetAboveFree { ordinal: options.ordinal, requested, free, total });
            }
            Some(requested) => requested,
            None => free.saturating_sub(options.reserve),
        };
        let budget = Arc::new(Budget::new("device", cap));
        let pinned = Arc::new(Budget::new("pinned host", options.pinned_budget));
        let kernels = Kernels::load(&device)?;
        let pool = Pool::new(Arc::clone(&budget), Arc::clone(&device.stream));
        let arena = Mutex::new(WeightArena::new(Arc::clone(&budget)));
        let stager = Some(Mutex::new(staging::Stager::new(&pinned, &device.stream)?));
        let blas = linear::Blas::open(&device, &budget);
        let side = Some(beside::SideStream::new(&device.stream)?);
        let merge_counts = attention::MergeCounts::new(&budget)?;
        Ok(Cuda {
            device,
            budget,
            pinned,
            pool,
            arena,
            stager,
            kernels,
            blas,
            context: options.context,
            head: Mutex::new(None),
            saved: Mutex::new(None),
            side,
            tables: Mutex::new(None),
            merge_counts,
        })
    }

    /// A second handle on the same GPU context with its own stream and its own activation pool
    /// (sharing the device and pinned budgets): work queued on it runs concurrently with this
    /// handle's stream. It reads weights this handle uploaded (call [`Cuda::synchronize`] on
    /// this one first) but uploads none. The codec's thread runs on one (`scheduler::codec`), so
    /// the codec overlaps the decode step. Use it on one thread at a time, after
    /// [`Cuda::bind_to_thread`] there.
    pub fn fork_stream(&self) -> Result<Cuda, CudaError> {
        let stream = self.device.ctx.new_stream()?;
        let device = Device { ctx: Arc::clone(&self.device.ctx), stream, info: self.device.info.clone() };
        let pool = Pool::new(Arc::clone(&self.budget), Arc::clone(&device.stream));
        Ok(Cuda {
            merge_counts: attention::MergeCounts::new(&self.budget)?,
            kernels: Kernels::load(&device)?,
            blas: None,
            budget: Arc::clone(&self.budget),
            pinned: Arc::clone(&self.pinned),
            pool,
            arena: Mutex::new(WeightArena::new(Arc::clone(&self.budget))),
            stager: None,
            context: self.context,
            head: Mutex::new(None),
            saved: Mutex::new(None),
            side: None,
            tables: Mutex::new(None),
            device,
        })
    }

    /// Makes the context current on the calling thread (a thread other than the one that
    /// opened it must call this before its first launch or copy: raw driver calls do not bind).
    pub fn bind_to_thread(&self) -> Result<(), CudaError> {
        Ok(self.device.ctx.bind_to_thread()?)
    }

    pub fn info(&self) -> &DeviceInfo {
        &self.device.info
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The stream launches and copies are queued on: the backend's own, or the side stream
    /// while a [`Cuda::beside`] branch is being queued.
    pub fn stream(&self) -> &Arc<cudarc::driver::CudaStream> {
        match &self.side {
            Some(side) if side.queuing.load(std::sync::atomic::Ordering::Relaxed) => side.stream(),
            _ => &self.device.stream,
        }
    }

    /// The device-memory budget (cap, used, peak).
    pub fn budget(&self) -> &Arc<Budget> {
        &self.budget
    }

    pub fn pinned_budget(&self) -> &Arc<Budget> {
        &self.pinned
    }

    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    /// Positions each request's KV caches hold.
    pub fn context(&self) -> usize {
        self.context
    }

    /// Device-to-device copy bandwidth in GB/s (bytes read plus bytes written), over buffers of
    /// `bytes` each, the best of 5 copies after a warm-up: the ceiling memory-bound kernels are
    /// measured against.
    pub fn measure_copy_bandwidth(&self, bytes: usize) -> Result<f64, CudaError> {
        let src = memory::DeviceBuffer::alloc(&self.budget, "bandwidth probe", bytes)?;
        let dst = memory::DeviceBuffer::alloc(&self.budget, "bandwidth probe", bytes)?;
        let mut best = f64::INFINITY;
        for i in 0..6 {
            let t = std::time::Instant::now();
            // SAFETY: two live buffers of `bytes` bytes each, ordered on the stream.
            unsafe {
                cudarc::driver::result::memcpy_dtod_async(dst.ptr(), src.ptr(), bytes, self.stream().cu_stream())
            }?;
            self.synchronize();
            if i > 0 {
                best = best.min(t.elapsed().as_secs_f64());
            }
        }
        Ok(2.0 * bytes as f64 / best / 1e9)
    }

    /// Runs `f` with the restricted head for `ids`, building it (one upload) if the ids changed.
    pub fn with_restricted_head<R>(&self, ids: &[u32], f: impl FnOnce(&linear::RestrictedHead) -> R) -> R {
        let mut slot = self.head.lock().expect("head lock");
        if slot.as_ref().is_none_or(|(cached, _)| cached != ids) {
            *slot = Some((ids.to_vec(), linear::RestrictedHead::new(self, ids)));
        }
        f(&slot.as_ref().expect("head just built").1)
    }

    /// Bytes the weight arena holds.
    pub fn weight_bytes(&self) -> usize {
        self.arena.lock().expect("arena lock").reserved_bytes()
    }

    /// Waits for all queued work.
    ///
    /// # Panics
    /// If the GPU reported a fault (the context is unusable afterwards).
    pub fn synchronize(&self) {
        self.device.synchronize().unwrap_or_else(|e| panic!("CUDA stream failed: {e}"));
    }

    /// An uninitialised bf16 matrix from the pool.
    ///
    /// # Panics
    /// If the memory budget is exhausted (the model was admitted with room for its scratch).
    pub fn matrix(&self, rows: usize, cols: usize) -> GpuMatrix {
        GpuMatrix::uninit(&self.pool, rows, cols).unwrap_or_else(|e| panic!("activation [{rows}, {cols}]: {e}"))
    }

    /// An uninitialised f16 matrix from the pool (the codec's activations; same panics).
    pub fn matrix_f16(&self, rows: usize, cols: usize) -> GpuMatrix {
        self.matrix_of(rows, cols, Elem::F16)
    }

    /// An uninitialised matrix of `elem` from the pool (same panics).
    pub fn matrix_of(&self, rows: usize, cols: usize, elem: Elem) -> GpuMatrix {
        GpuMatrix::uninit_of(&self.pool, rows, cols, elem)
            .unwrap_or_else(|e| panic!("{elem:?} activation [{rows}, {cols}]: {e}"))
    }

    /// Uninitialised scratch of `bytes` from the pool (same panics as [`Cuda::matrix`]).
    pub fn scratch(&self, bytes: usize) -> PoolBuf {
        // A typed payload: the worker refuses the request it was for with a 503, not a 500.
        self.pool.take(bytes).unwrap_or_else(|e| {
            std::panic::panic_any(crate::backend::OutOfDeviceMemory { what: format!("scratch of {bytes} bytes: {e}") })
        })
    }

    /// Copies host values into device memory at `dst` (ordered on the stream; waits for the copy,
    /// since the host slice may be pageable and short-lived).
    pub fn copy_to_device<T: Copy>(&self, dst: u64, src: &[T]) {
        // SAFETY: callers pass the address of a live buffer of at least `size_of_val(src)` bytes;
        // the synchronize below keeps `src` borrowed until the copy has finished.
        unsafe { cudarc::driver::result::memcpy_htod_async(dst, src, self.stream().cu_stream()) }
            .expect("host-to-device copy");
        self.synchronize();
    }

    /// Queues a copy of host values into device memory at `dst` without synchronising: for small
    /// per-call data (embedding recipes). Returning early is safe with a pageable, short-lived
    /// `src`: cuMemcpyHtoDAsync from pageable memory stages the bytes into driver memory before it
    /// returns (the driver's "API synchronization behavior" rules), so `src` may be freed at once,
    /// and the transfer to `dst` runs in stream order. The driver is allowed to wait for the
    /// stream before staging; for small copies it does not in practice. A pageable copy cannot be
    /// captured into a CUDA graph.
    pub fn stage_to_device<T: Copy>(&self, dst: u64, src: &[T]) {
        // SAFETY: callers pass the address of a live buffer of at least `size_of_val(src)` bytes
        // that stays allocated until the stream runs the copy (pool buffers are reused only in
        // stream order); `src` is read before the call returns (see above).
        unsafe { cudarc::driver::result::memcpy_htod_async(dst, src, self.stream().cu_stream()) }
            .expect("host-to-device copy");
    }

    /// Copies `n` values from device address `src` to the host, after all queued work.
    pub fn copy_to_host<T: Copy + Default>(&self, src: u64, n: usize) -> Vec<T> {
        let mut out = vec![T::default(); n];
        // SAFETY: `src` addresses at least `n` values of `T` in a live buffer; the synchronize
        // below completes the copy before `out` is read or moved.
        unsafe { cudarc::driver::result::memcpy_dtoh_async(&mut out, src, self.stream().cu_stream()) }
            .expect("device-to-host copy");
        self.synchronize();
        out
    }

    /// Queues a zero fill of `bytes` at `dst` (f16 and f32 zero are all-zero bytes).
    pub fn zero(&self, dst: u64, bytes: usize) {
        if bytes == 0 {
            return;
        }
        // SAFETY: callers pass a live pool buffer of at least `bytes` bytes; the fill is ordered
        // on the stream before any kernel that reads the buffer.
        unsafe { cudarc::driver::result::memset_d8_async(dst, 0, bytes, self.stream().cu_stream()) }
            .expect("zero fill");
    }

    /// Queues a copy of `bytes` between two device buffers (ordered on the stream, no sync).
    pub fn copy_device_to_device(&self, dst: u64, src: u64, bytes: usize) {
        if bytes == 0 {
            return;
        }
        // SAFETY: callers pass the addresses of live buffers of at least `bytes` bytes each; pool
        // buffers are reused only in stream order, so both outlive the copy.
        unsafe { cudarc::driver::result::memcpy_dtod_async(dst, src, bytes, self.stream().cu_stream()) }
            .expect("device-to-device copy");
    }

    /// A host matrix as a bf16 activation (rounded to nearest even).
    pub fn upload_matrix(&self, m: &Matrix) -> GpuMatrix {
        let g = self.matrix(m.rows, m.cols);
        self.copy_to_device(g.ptr(), &tensor::to_bf16_vec(&m.data));
        g
    }

    /// A host matrix as an f16 activation (rounded to nearest even).
    pub fn upload_matrix_f16(&self, m: &Matrix) -> GpuMatrix {
        let g = self.matrix_f16(m.rows, m.cols);
        self.copy_to_device(g.ptr(), &tensor::to_f16_vec(&m.data));
        g
    }

    /// Host f32 values in a pool buffer.
    pub fn upload_f32_scratch(&self, data: &[f32]) -> PoolBuf {
        let b = self.scratch(data.len() * 4);
        self.copy_to_device(b.ptr(), data);
        b
    }

    /// Fills `n` bf16 values at `dst` with NaN (tests poison outputs before a kernel writes them).
    pub fn poison_bf16(&self, dst: u64, n: usize) {
        self.copy_to_device(dst, &vec![bf16::NAN; n]);
    }

    /// Fills `n` f32 values at `dst` with NaN.
    pub fn poison_f32(&self, dst: u64, n: usize) {
        self.copy_to_device(dst, &vec![f32::NAN; n]);
    }

    /// Room for a weight of `bytes` in the arena, not yet filled.
    fn reserve_weight(&self, name: &str, shape: &[usize], dtype: DType, bytes: usize) -> GpuWeight {
        let (ptr, chunk) = self.arena.lock().expect("arena lock").place(name, bytes).unwrap_or_else(|e| {
            panic!("weight `{name}`: {e} (the model is admitted against the budget before upload)")
        });
        GpuWeight { ptr, shape: shape.to_vec(), dtype, _chunk: chunk }
    }

    fn place_weight(&self, name: &str, shape: &[usize], dtype: DType, bytes: &[u8]) -> GpuWeight {
        let weight = self.reserve_weight(name, shape, dtype, bytes.len());
        let ptr = weight.ptr;
        // Queued through pinned staging: later launches on the stream see the weight; nothing
        // waits here, so reading the next tensor from disk overlaps this copy.
        self.stager
            .as_ref()
            .unwrap_or_else(|| panic!("weight `{name}`: a forked stream uploads no weights"))
            .lock()
            .expect("stager lock")
            .upload(self.stream(), ptr, bytes)
            .unwrap_or_else(|e| panic!("uploading weight `{name}`: {e}"));
        weight
    }
}

/// The resident dtype of a checkpoint tensor: big matrices and experts as stored, the rest f32.
pub fn resident_dtype(accept: Accept) -> DType {
    match accept {
        Accept::Bf16 => DType::Bf16,
        Accept::Fp8E4M3 => DType::Fp8E4m3,
        Accept::SmallFloat | Accept::Scale | Accept::CodecFloat => DType::F32,
    }
}

impl BackendTypes for Cuda {
    type Act = GpuMatrix;
    type Weight = GpuWeight;

    fn upload(&self, spec: &TensorSpec, view: TensorView<'_>) -> GpuWeight {
        match resident_dtype(spec.accept) {
            dtype @ (DType::Bf16 | DType::Fp8E4m3) => self.place_weight(&spec.name, view.shape, dtype, view.bytes),
            DType::F16 => {
                unreachable!("no checkpoint tensor is resident as f16 (codec weights go through codec_weight)")
            }
            DType::F32 => {
                let data = view.to_f32_vec().unwrap_or_else(|| panic!("tensor `{}` is not a float tensor", spec.name));
                self.place_weight(&spec.name, view.shape, DType::F32, bytemuck::cast_slice(&data))
            }
        }
    }

    fn upload_f32(&self, shape: &[usize], data: Vec<f32>) -> GpuWeight {
        assert_eq!(shape.iter().product::<usize>(), data.len(), "upload_f32 shape");
        self.place_weight("host-prepared tensor", shape, DType::F32, bytemuck::cast_slice(&data))
    }

    fn to_host(&self, a: &GpuMatrix) -> Matrix {
        let data = match a.elem {
            Elem::Bf16 => self.copy_to_host::<bf16>(a.ptr(), a.len()).iter().map(|v| v.to_f32()).collect(),
            Elem::F16 => self.copy_to_host::<f16>(a.ptr(), a.len()).iter().map(|v| v.to_f32()).collect(),
            Elem::F32 => self.copy_to_host::<f32>(a.ptr(), a.len()),
        };
        Matrix::from_vec(a.rows, a.cols, data)
    }

    fn act_rows(&self, a: &GpuMatrix, start: usize, count: usize) -> GpuMatrix {
        assert!(start + count <= a.rows, "rows {start}..{} of {}", start + count, a.rows);
        let out = self.matrix_of(count, a.cols, a.elem);
        if count > 0 {
            self.copy_device_to_device(out.ptr(), a.row_ptr(start), count * a.cols * a.elem.size());
        }
        out
    }

    fn stack_rows(&self, parts: &[GpuMatrix]) -> GpuMatrix {
        let first = parts.first().map_or((0, Elem::Bf16), |p| (p.cols, p.elem));
        assert!(parts.iter().all(|p| (p.cols, p.elem) == first), "stack_rows: parts of different widths or types");
        let out = self.matrix_of(parts.iter().map(|p| p.rows).sum(), first.0, first.1);
        let mut row = 0;
        for p in parts.iter().filter(|p| p.rows > 0) {
            self.copy_device_to_device(out.row_ptr(row), p.ptr(), p.bytes());
            row += p.rows;
        }
        out
    }
}
