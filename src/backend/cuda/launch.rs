//! Loading the embedded fatbins into typed kernel handles, and launching them. Every kernel
//! takes raw device addresses and plain scalars, so one small argument type covers them all.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream, result, sys};

/// The fatbins `build.rs` compiled from `kernels/*.cu`, one `&[u8]` per file.
pub mod embedded {
    include!(concat!(env!("OUT_DIR"), "/kernels.rs"));
}

/// A kernel or module missing from the embedded fatbins (a build problem), or a kernel whose
/// shared memory the GPU cannot grant; found at start-up.
#[derive(Debug, thiserror::Error)]
#[error("CUDA module `{module}`{}: {source}", kernel.map(|k| format!(", kernel `{k}`")).unwrap_or_default())]
pub struct KernelError {
    pub module: &'static str,
    pub kernel: Option<&'static str>,
    pub source: cudarc::driver::DriverError,
}

thread_local! {
    /// Open [`DecodeLaunches`] scopes on this thread.
    static DECODE_SCOPES: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// While alive, the kernels of overlapping modules ([`Module::load_overlapping`]) that this
/// thread launches start overlapping their predecessor. Only the decode step opens one: its
/// kernels are short, so their launches are a large share of the step (on the H200 the graph
/// step went 5.71 → 5.28 ms), while a prompt's long kernels gain nothing and its 200-row prefill
/// measured 39.6 → 41.5 ms with every launch overlapping (docs/perf/2026-12-04-one-stream.md,
/// run 14).
pub struct DecodeLaunches(());

impl DecodeLaunches {
    pub fn open() -> DecodeLaunches {
        DECODE_SCOPES.with(|n| n.set(n.get() + 1));
        DecodeLaunches(())
    }
}

impl Drop for DecodeLaunches {
    fn drop(&mut self) {
        DECODE_SCOPES.with(|n| n.set(n.get() - 1));
    }
}

/// One loaded `kernels/<name>.cu`.
pub struct Module {
    name: &'static str,
    module: Arc<CudaModule>,
    /// Its kernels are launched overlapping their predecessor (see [`Module::load_overlapping`]).
    overlapping: bool,
}

impl Module {
    /// Loads a fatbin; the driver picks the SASS for this GPU (or JITs the embedded PTX).
    pub fn load(ctx: &Arc<CudaContext>, name: &'static str, image: &[u8]) -> Result<Module, KernelError> {
        // The copy gives the driver an aligned image (include_bytes! is only byte-aligned).
        let module = ctx
            .load_module(cudarc::nvrtc::Ptx::from_binary(image.to_vec()))
            .map_err(|source| KernelError { module: name, kernel: None, source })?;
        Ok(Module { name, module, overlapping: false })
    }

    /// [`Module::load`] for a module whose kernels all begin with `pdl_begin()` (or, the decode
    /// GEMVs, fetch only weights before `pdl_wait()`; kernels/common.cuh): inside a
    /// [`DecodeLaunches`] scope each is launched with programmatic stream serialization, so it
    /// may start while the kernel before it on the stream still runs, and its launch hides under
    /// that kernel's tail. Compute capability 9.0
    /// and newer; elsewhere plain launches. `LIMELIGHT_NO_PDL=1` in the environment keeps plain
    /// launches (to measure the gain, or should a driver mishandle it): the bits are the same.
    pub fn load_overlapping(ctx: &Arc<CudaContext>, name: &'static str, image: &[u8]) -> Result<Module, KernelError> {
        let mut module = Module::load(ctx, name, image)?;
        let disabled = std::env::var_os("LIMELIGHT_NO_PDL").is_some_and(|v| v == "1");
        module.overlapping = !disabled && ctx.compute_capability().is_ok_and(|cc| cc >= (9, 0));
        Ok(module)
    }

    pub fn kernel(&self, name: &'static str) -> Result<Kernel, KernelError> {
        let function = self.module.load_function(name).map_err(|source| KernelError {
            module: self.name,
            kernel: Some(name),
            source,
        })?;
        Ok(Kernel { name, function, overlapping: self.overlapping })
    }

    /// [`Module::kernel`] with its dynamic shared-memory limit raised to `bytes` (needed above
    /// 48 KiB).
    pub fn kernel_with_shared(&self, name: &'static str, bytes: usize) -> Result<Kernel, KernelError> {
        let kernel = self.kernel(name)?;
        let bytes = u32::try_from(bytes).expect("shared memory in bytes fits u32");
        kernel.allow_shared_bytes(bytes).map_err(|source| KernelError {
            module: self.name,
            kernel: Some(name),
            source,
        })?;
        Ok(kernel)
    }
}

/// A kernel handle, resolved once at start-up.
pub struct Kernel {
    pub name: &'static str,
    function: CudaFunction,
    /// Launched with programmatic stream serialization (see [`Module::load_overlapping`]).
    overlapping: bool,
}

/// Most arguments any kernel takes (the widest, `gdn_conv_prepare`, takes 20).
const MAX_ARGS: usize = 24;

/// A kernel argument: a device address or a scalar.
#[derive(Clone, Copy, Debug)]
pub enum Arg {
    Ptr(u64),
    I32(i32),
    U32(u32),
    F32(f32),
}

impl From<u64> for Arg {
    fn from(v: u64) -> Arg {
        Arg::Ptr(v)
    }
}

impl From<i32> for Arg {
    fn from(v: i32) -> Arg {
        Arg::I32(v)
    }
}

impl From<u32> for Arg {
    fn from(v: u32) -> Arg {
        Arg::U32(v)
    }
}

impl From<f32> for Arg {
    fn from(v: f32) -> Arg {
        Arg::F32(v)
    }
}

impl From<usize> for Arg {
    /// Sizes and indices are passed as `int` (every size here is far below 2³¹).
    fn from(v: usize) -> Arg {
        Arg::I32(i32::try_from(v).expect("kernel size argument exceeds i32"))
    }
}

/// Grid, block and dynamic shared memory of one launch.
#[derive(Clone, Copy, Debug)]
pub struct Dims {
    pub grid: (u32, u32, u32),
    pub block: (u32, u32, u32),
    pub shared_bytes: u32,
}

impl Dims {
    pub fn linear(blocks: usize, threads: u32) -> Dims {
        Dims { grid: (u32::try_from(blocks).expect("grid size"), 1, 1), block: (threads, 1, 1), shared_bytes: 0 }
    }

    pub fn grid(grid: (u32, u32, u32), threads: u32) -> Dims {
        Dims { grid, block: (threads, 1, 1), shared_bytes: 0 }
    }

    pub fn with_shared(mut self, bytes: u32) -> Dims {
        self.shared_bytes = bytes;
        self
    }
}

impl Kernel {
    /// Queues the kernel on `stream`.
    ///
    /// # Panics
    /// If the driver refuses the launch (bad dimensions, or a sticky error from an earlier
    /// fault): a broken context cannot serve any request, so this is not recoverable here.
    pub fn launch(&self, stream: &CudaStream, dims: Dims, args: &[Arg]) {
        // Fixed arrays on the stack: the decode path launches hundreds of kernels per row and
        // should not allocate for each.
        let n = args.len();
        assert!(n <= MAX_ARGS, "kernel `{}` takes {n} arguments, more than {MAX_ARGS}", self.name);
        let mut values = [Arg::I32(0); MAX_ARGS];
        values[..n].copy_from_slice(args);
        let mut pointers = [std::ptr::null_mut::<c_void>(); MAX_ARGS];
        for (p, a) in pointers.iter_mut().zip(values[..n].iter_mut()) {
            *p = match a {
                Arg::Ptr(v) => v as *mut u64 as *mut c_void,
                Arg::I32(v) => v as *mut i32 as *mut c_void,
                Arg::U32(v) => v as *mut u32 as *mut c_void,
                Arg::F32(v) => v as *mut f32 as *mut c_void,
            };
        }
        // SAFETY: `pointers[..n]` address `values`, which lives (unmoved) across the call; the driver
        // copies parameter values during cuLaunchKernel. Each wrapper module passes the argument
        // list its kernel's C signature declares, with device addresses of live buffers sized
        // for the launch (checked by the wrapper's asserts).
        let launched = super::profile::around(self.name, stream.cu_stream(), || unsafe {
            if self.overlapping && DECODE_SCOPES.with(|n| n.get() > 0) {
                launch_overlapping(self.function.cu_function(), dims, stream.cu_stream(), &mut pointers[..n])
            } else {
                result::launch_kernel(
                    self.function.cu_function(),
                    dims.grid,
                    dims.block,
                    dims.shared_bytes,
                    stream.cu_stream(),
                    &mut pointers[..n],
                )
            }
        });
        if let Err(e) = launched {
            panic!("CUDA kernel `{}` failed to launch ({dims:?}): {e}", self.name);
        }
    }

    /// Raises the kernel's dynamic shared-memory limit (needed above 48 KiB).
    pub fn allow_shared_bytes(&self, bytes: u32) -> Result<(), cudarc::driver::DriverError> {
        self.function.set_attribute(
            cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            bytes as i32,
        )
    }
}

/// `cuLaunchKernelEx` with programmatic stream serialization allowed.
///
/// # Safety
/// As `result::launch_kernel`: `params` address live values matching the kernel's signature.
unsafe fn launch_overlapping(
    function: sys::CUfunction,
    dims: Dims,
    stream: sys::CUstream,
    params: &mut [*mut c_void],
) -> Result<(), cudarc::driver::DriverError> {
    // SAFETY: a zeroed attribute is a valid plain-data value; its id and value are set below.
    let mut attribute: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    attribute.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attribute.value.programmaticStreamSerializationAllowed = 1;
    let config = sys::CUlaunchConfig {
        gridDimX: dims.grid.0,
        gridDimY: dims.grid.1,
        gridDimZ: dims.grid.2,
        blockDimX: dims.block.0,
        blockDimY: dims.block.1,
        blockDimZ: dims.block.2,
        sharedMemBytes: dims.shared_bytes,
        hStream: stream,
        attrs: &mut attribute,
        numAttrs: 1,
    };
    // SAFETY: `config` and `attribute` live across the call; the caller vouches for `params`.
    unsafe { sys::cuLaunchKernelEx(&config, function, params.as_mut_ptr(), std::ptr::null_mut()) }.result()
}
