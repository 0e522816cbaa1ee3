//! cuBLASLt for the multi-row bf16 projections `y[M, N] = x[M, K] · W[N, K]ᵀ` (prefill): a small
//! wrapper over `cudarc::cublaslt::{result, sys}` that runs the algorithm heuristic once per
//! (M bucket, N, K) and keeps the descriptors and the chosen algorithm, with one workspace
//! allocated at start-up. cudarc's safe `Matmul` would create descriptors and rerun the heuristic
//! on every call (tens of µs of host time, and the algorithm could change between calls).
//!
//! Every matmul is queued on the device's one stream with the fixed workspace passed explicitly,
//! so a call is legal inside CUDA graph capture (the heuristic is host-only work).
//!
//! # Layouts
//! cuBLASLt is column-major: it computes `D = op(A) · op(B)` with `D` m×n. A row-major `[r, c]`
//! matrix with row stride `c` is, read column-major, the `c × r` matrix with leading dimension
//! `c` (its transpose). So, in column-major terms:
//! - `W` (row-major `[N, K]`) is `Wᵀ`: a `K × N` matrix, ld `K`;
//! - `x` (row-major `[M, K]`) is `xᵀ`: a `K × M` matrix, ld `K`;
//! - `y` (row-major `[M, N]`) is `yᵀ`: an `N × M` matrix, ld `N`.
//!
//! `yᵀ = W · xᵀ = op(A) · op(B)` with `A` = W's buffer (stored `K × N`, `op = T`, giving `N × K`),
//! `B` = x's buffer (stored `K × M`, `op = N`), `D` = y's buffer (`N × M`): cuBLASLt's m = N,
//! n = M, k = K. This "TN" form is also the one every Hopper kernel supports (the FP8 rule).
//! `C` aliases `D` with beta = 0.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::ffi::c_void;
use std::mem::size_of;
use std::sync::{Arc, Mutex};

use cudarc::cublaslt::result::{self, CublasError};
use cudarc::cublaslt::sys;
use cudarc::driver::CudaStream;

use super::budget::Budget;
use super::device::Device;
use super::memory::DeviceBuffer;

/// cuBLASLt's recommended workspace on Hopper and newer; 4 MiB before.
const WORKSPACE_SM90: usize = 32 << 20;
const WORKSPACE_OLDER: usize = 4 << 20;

/// `cublasOperation_t` values (the cuBLASLt bindings take the attribute as a plain `int32`).
const OP_N: i32 = 0;
const OP_T: i32 = 1;

/// A matrix layout descriptor, destroyed on drop.
struct Layout(sys::cublasLtMatrixLayout_t);

impl Layout {
    /// A column-major bf16 `rows × cols` matrix with leading dimension `ld` (elements).
    fn bf16(rows: usize, cols: usize, ld: usize) -> Result<Layout, CublasError> {
        let layout =
            result::create_matrix_layout(sys::cudaDataType_t::CUDA_R_16BF, rows as u64, cols as u64, ld as i64)?;
        Ok(Layout(layout))
    }

    /// Changes the column count (the M of the problem) in place.
    fn set_cols(&self, cols: usize) -> Result<(), CublasError> {
        let cols = cols as u64;
        // SAFETY: the layout is live (owned by `self`); COLS is a uint64_t attribute and the value
        // is read during the call.
        unsafe {
            result::set_matrix_layout_attribute(
                self.0,
                sys::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_COLS,
                (&cols as *const u64).cast(),
                size_of::<u64>(),
            )
        }
    }
}

impl Drop for Layout {
    fn drop(&mut self) {
        // SAFETY: created by `create_matrix_layout`, destroyed exactly once here. A failure to
        // destroy only leaks host memory.
        let _ = unsafe { result::destroy_matrix_layout(self.0) };
    }
}

/// A matmul descriptor (fp32 compute and scale, `op(A) = T`, `op(B) = N`), destroyed on drop.
struct Desc(sys::cublasLtMatmulDesc_t);

impl Desc {
    fn tn() -> Result<Desc, CublasError> {
        let desc = Desc(result::create_matmul_desc(
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            sys::cudaDataType_t::CUDA_R_32F,
        )?);
        for (attr, op) in [
            (sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA, OP_T),
            (sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSB, OP_N),
        ] {
            // SAFETY: the descriptor is live; TRANSA/TRANSB are int32 attributes read during the call.
            unsafe { result::set_matmul_desc_attribute(desc.0, attr, (&op as *const i32).cast(), size_of::<i32>()) }?;
        }
        Ok(desc)
    }
}

impl Drop for Desc {
    fn drop(&mut self) {
        // SAFETY: created by `create_matmul_desc`, destroyed exactly once here.
        let _ = unsafe { result::destroy_matmul_desc(self.0) };
    }
}

/// A preference descriptor (only the workspace cap is set), destroyed on drop.
struct Preference(sys::cublasLtMatmulPreference_t);

impl Preference {
    fn with_workspace(bytes: usize) -> Result<Preference, CublasError> {
        let pref = Preference(result::create_matmul_pref()?);
        let bytes = bytes as u64;
        // SAFETY: the preference is live; MAX_WORKSPACE_BYTES is a uint64_t attribute.
        unsafe {
            result::set_matmul_pref_attribute(
                pref.0,
                sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                (&bytes as *const u64).cast(),
                size_of::<u64>(),
            )
        }?;
        Ok(pref)
    }
}

impl Drop for Preference {
    fn drop(&mut self) {
        // SAFETY: created by `create_matmul_pref`, destroyed exactly once here.
        let _ = unsafe { result::destroy_matmul_pref(self.0) };
    }
}

/// Problems share a plan when N and K match and M falls in the same power-of-two bucket
/// (`(bucket / 2, bucket]`, at least 16); the heuristic is asked about M = bucket.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
struct PlanKey {
    bucket: usize,
    n: usize,
    k: usize,
}

impl PlanKey {
    fn new(m: usize, n: usize, k: usize) -> PlanKey {
        PlanKey { bucket: m.next_power_of_two().max(16), n, k }
    }
}

/// Everything one matmul call needs, built once per [`PlanKey`].
struct Plan {
    desc: Desc,
    a: Layout,
    b: Layout,
    d: Layout,
    /// The M the `b` and `d` layouts currently describe.
    m: usize,
    algo: sys::cublasLtMatmulAlgo_t,
}

/// The cuBLASLt handle, its workspace and the cached plans.
pub struct Blas {
    handle: sys::cublasLtHandle_t,
    stream: Arc<CudaStream>,
    workspace: DeviceBuffer,
    /// Also serialises every use of the handle and the workspace.
    plans: Mutex<HashMap<PlanKey, Plan>>,
}

// SAFETY: the handle and every descriptor are only touched with the `plans` lock held, and all
// matmuls are ordered on the one stream, so the single workspace is never used concurrently.
unsafe impl Send for Blas {}
unsafe impl Sync for Blas {}

impl Blas {
    /// Opens cuBLASLt on the device's stream, with a workspace taken from `budget`. `None` (with a
    /// warning) when libcublasLt cannot be loaded or set up: projections then use limelight's own
    /// kernels.
    pub fn open(device: &Device, budget: &Arc<Budget>) -> Option<Blas> {
        // SAFETY: only tries to dlopen libcublasLt; nothing is called through it.
        if !unsafe { sys::is_culib_present() } {
            tracing::warn!(
                "libcublasLt (libcublasLt.so.13) could not be loaded: multi-row projections use the slower \
                 built-in tiled kernel (put the CUDA 13 cuBLAS libraries on LD_LIBRARY_PATH)"
            );
            return None;
        }
        let handle = match result::create_handle() {
            Ok(h) => h,
            Err(e) => {
                tracing::warn!("libcublasLt: cublasLtCreate failed ({e}); using the built-in tiled kernel");
                return None;
            }
        };
        let bytes = if device.info.compute_capability.0 >= 9 { WORKSPACE_SM90 } else { WORKSPACE_OLDER };
        let workspace = match DeviceBuffer::alloc(budget, "cuBLASLt workspace", bytes) {
            Ok(w) => w,
            Err(e) => {
                tracing::warn!(
                    "libcublasLt: no room for its {bytes}-byte workspace ({e}); using the built-in tiled kernel"
                );
                // SAFETY: the handle was just created and is not used anywhere else.
                let _ = unsafe { result::destroy_handle(handle) };
                return None;
            }
        };
        Some(Blas { handle, stream: Arc::clone(&device.stream), workspace, plans: Mutex::new(HashMap::new()) })
    }

    /// Queues `y[m, n] = x[m, k] · w[n, k]ᵀ` (bf16 row-major, fp32 accumulation) on the stream.
    ///
    /// # Safety
    /// `x`, `w` and `y` must be device addresses of live buffers of at least `m·k`, `n·k` and
    /// `m·n` bf16 values, 16-byte aligned, that stay allocated until the stream has run the
    /// matmul (pool buffers and arena weights do).
    pub unsafe fn matmul(&self, x: u64, w: u64, y: u64, m: usize, n: usize, k: usize) -> Result<(), CublasError> {
        let mut plans = self.plans.lock().expect("cuBLASLt plan lock");
        let key = PlanKey::new(m, n, k);
        let plan = match plans.entry(key) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => e.insert(self.plan(key)?),
        };
        if plan.m != m {
            plan.b.set_cols(m)?;
            plan.d.set_cols(m)?;
            plan.m = m;
        }
        // SAFETY: forwarded from the caller (see above).
        let stream = self.stream.cu_stream();
        let first = super::profile::around("cublasLt matmul", stream, || unsafe { self.launch(plan, x, w, y) });
        match first {
            // The bucket's algorithm, chosen for M = bucket, may not cover a smaller M: ask again
            // for this exact M and keep the answer.
            Err(CublasError(
                sys::cublasStatus_t::CUBLAS_STATUS_NOT_SUPPORTED | sys::cublasStatus_t::CUBLAS_STATUS_INVALID_VALUE,
            )) => {
                plan.algo = self.heuristic(&plan.desc, &plan.a, &plan.b, &plan.d)?;
                // SAFETY: as above.
                unsafe { self.launch(plan, x, w, y) }
            }
            other => other,
        }
    }

    /// Builds the descriptors for a bucket and runs the heuristic at M = bucket.
    fn plan(&self, key: PlanKey) -> Result<Plan, CublasError> {
        let PlanKey { bucket, n, k } = key;
        let desc = Desc::tn()?;
        let a = Layout::bf16(k, n, k)?;
        let b = Layout::bf16(k, bucket, k)?;
        let d = Layout::bf16(n, bucket, n)?;
        let algo = self.heuristic(&desc, &a, &b, &d)?;
        Ok(Plan { desc, a, b, d, m: bucket, algo })
    }

    /// The heuristic's first choice for these descriptors within the workspace.
    fn heuristic(
        &self,
        desc: &Desc,
        a: &Layout,
        b: &Layout,
        d: &Layout,
    ) -> Result<sys::cublasLtMatmulAlgo_t, CublasError> {
        let pref = Preference::with_workspace(self.workspace.bytes())?;
        // SAFETY: every descriptor is live for the call; C and D share the `d` layout.
        let found = unsafe { result::get_matmul_algo_heuristic(self.handle, desc.0, a.0, b.0, d.0, d.0, pref.0) }?;
        Ok(found.algo)
    }

    /// # Safety
    /// As [`Blas::matmul`].
    unsafe fn launch(&self, plan: &Plan, x: u64, w: u64, y: u64) -> Result<(), CublasError> {
        let (alpha, beta) = (1f32, 0f32);
        // SAFETY: descriptors are live; alpha/beta are host scalars (default pointer mode) read
        // during the call; the buffers are valid per the caller; the workspace is ours and its
        // size is passed; the stream belongs to the context current on this thread.
        unsafe {
            result::matmul(
                self.handle,
                plan.desc.0,
                (&alpha as *const f32).cast::<c_void>(),
                (&beta as *const f32).cast::<c_void>(),
                w as *const c_void,
                plan.a.0,
                x as *const c_void,
                plan.b.0,
                y as *const c_void,
                plan.d.0,
                y as *mut c_void,
                plan.d.0,
                &plan.algo,
                self.workspace.ptr() as *mut c_void,
                self.workspace.bytes(),
                self.stream.cu_stream() as sys::cudaStream_t,
            )
        }
    }

    /// Plans built so far (for diagnostics).
    pub fn plan_count(&self) -> usize {
        self.plans.lock().expect("cuBLASLt plan lock").len()
    }
}

impl Drop for Blas {
    fn drop(&mut self) {
        // Descriptors first, then the handle; the workspace frees itself after.
        if let Ok(plans) = self.plans.get_mut() {
            plans.clear();
        }
        // SAFETY: the handle was created in `open` and is destroyed exactly once, here.
        let _ = unsafe { result::destroy_handle(self.handle) };
    }
}
