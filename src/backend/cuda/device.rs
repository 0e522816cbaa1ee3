//! Finding and opening the GPU: probe for the driver library before touching it (the same binary
//! runs on machines without CUDA), open the primary context and one non-blocking stream, and
//! refuse GPUs the embedded kernels do not target.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream, sys};

/// Oldest compute capability the fatbins carry SASS for (Ampere, sm_80).
pub const MIN_COMPUTE_CAPABILITY: (i32, i32) = (8, 0);

/// Why no usable GPU was opened.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error("no NVIDIA driver found (libcuda.so.1 could not be loaded): use --device cpu, or install the driver")]
    NoDriver,
    #[error("the NVIDIA driver reports no GPU")]
    NoDevice,
    #[error("GPU {ordinal} does not exist: the driver reports {count}")]
    NoSuchOrdinal { ordinal: usize, count: i32 },
    #[error(
        "GPU {ordinal} ({name}) has compute capability {major}.{minor}; limelight's kernels need 8.0 (Ampere) or newer"
    )]
    TooOld { ordinal: usize, name: String, major: i32, minor: i32 },
    #[error("CUDA driver call failed while {during}: {source}")]
    Driver { during: &'static str, source: cudarc::driver::DriverError },
}

/// Whether the driver library can be loaded at all (no driver call is made).
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen libcuda; nothing is called through it.
    unsafe { sys::is_culib_present() }
}

/// GPU `ordinal`'s name, if the driver is there and the GPU is one the kernels support; opens no
/// context (so `serve --device auto` can decide on its main thread, and the engine thread opens
/// the context it uses).
pub fn probe(ordinal: usize) -> Result<String, DeviceError> {
    use cudarc::driver::result;
    if !driver_present() {
        return Err(DeviceError::NoDriver);
    }
    let driver = |during| move |source| DeviceError::Driver { during, source };
    result::init().map_err(driver("initialising the driver"))?;
    let count = result::device::get_count().map_err(driver("counting GPUs"))?;
    if count == 0 {
        return Err(DeviceError::NoDevice);
    }
    if ordinal >= count as usize {
        return Err(DeviceError::NoSuchOrdinal { ordinal, count });
    }
    let dev = result::device::get(ordinal as i32).map_err(driver("finding the GPU"))?;
    let name = result::device::get_name(dev).map_err(driver("reading the GPU name"))?;
    use sys::CUdevice_attribute::{
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR as MAJOR, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR as MINOR,
    };
    // SAFETY: `dev` is a device handle the driver just returned; attributes are plain queries.
    let (major, minor) =
        unsafe { (result::device::get_attribute(dev, MAJOR), result::device::get_attribute(dev, MINOR)) };
    let (major, minor) = (
        major.map_err(driver("reading the compute capability"))?,
        minor.map_err(driver("reading the compute capability"))?,
    );
    if (major, minor) < MIN_COMPUTE_CAPABILITY {
        return Err(DeviceError::TooOld { ordinal, name, major, minor });
    }
    Ok(name)
}

/// What the engine needs to know about its GPU.
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    pub ordinal: usize,
    pub name: String,
    pub compute_capability: (i32, i32),
    pub multiprocessors: i32,
    pub total_memory: u64,
    pub free_memory_at_open: u64,
}

/// The context and the one stream everything is ordered on.
pub struct Device {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    pub info: DeviceInfo,
}

impl Device {
    /// Opens GPU `ordinal`, binding its primary context to the calling thread.
    pub fn open(ordinal: usize) -> Result<Device, DeviceError> {
        if !driver_present() {
            return Err(DeviceError::NoDriver);
        }
        let driver = |during| move |source| DeviceError::Driver { during, source };
        let count = CudaContext::device_count().map_err(driver("counting GPUs"))?;
        if count == 0 {
            return Err(DeviceError::NoDevice);
        }
        if ordinal >= count as usize {
            return Err(DeviceError::NoSuchOrdinal { ordinal, count });
        }
        let ctx = CudaContext::new(ordinal).map_err(driver("opening the context"))?;
        // One engine thread, one stream: order everything ourselves. Event tracking would add
        // two events per allocation and records per launch (and graph nodes under capture).
        // SAFETY: called before any allocation or stream exists on this context.
        unsafe { ctx.disable_event_tracking() };
        let name = ctx.name().map_err(driver("reading the GPU name"))?;
        let (major, minor) = ctx.compute_capability().map_err(driver("reading the compute capability"))?;
        if (major, minor) < MIN_COMPUTE_CAPABILITY {
            return Err(DeviceError::TooOld { ordinal, name, major, minor });
        }
        let multiprocessors = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(driver("reading the multiprocessor count"))?;
        let (free, total) = ctx.mem_get_info().map_err(driver("reading free memory"))?;
        let stream = ctx.new_stream().map_err(driver("creating the stream"))?;
        let info = DeviceInfo {
            ordinal,
            name,
            compute_capability: (major, minor),
            multiprocessors,
            total_memory: total as u64,
            free_memory_at_open: free as u64,
        };
        Ok(Device { ctx, stream, info })
    }

    /// Waits for everything queued on the stream.
    pub fn synchronize(&self) -> Result<(), cudarc::driver::DriverError> {
        self.stream.synchronize()
    }
}
