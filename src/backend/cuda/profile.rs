//! Kernel timing for the benches (nsys does not run on the GPU machine): while a profile is
//! on, every kernel launch and cuBLASLt call is bracketed by two CUDA events on its stream, and
//! [`finish`] sums the device time per kernel name. Off (the default, and always while serving)
//! it costs one relaxed atomic load per launch. Not for graph capture: events would become nodes.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use cudarc::driver::{result, sys};

static ON: AtomicBool = AtomicBool::new(false);
static RECORDS: Mutex<Vec<Record>> = Mutex::new(Vec::new());

struct Record {
    name: &'static str,
    start: sys::CUevent,
    end: sys::CUevent,
}

// SAFETY: CUevent handles are plain driver handles, valid from any thread of the context.
unsafe impl Send for Record {}

/// One kernel's share of a profile.
#[derive(Clone, Debug, serde::Serialize)]
pub struct KernelTime {
    pub name: &'static str,
    pub launches: usize,
    pub total_ms: f64,
}

/// Starts recording (clears an earlier profile that was not finished).
pub fn start() {
    discard();
    ON.store(true, Ordering::Relaxed);
}

/// Runs `launch` on `stream`, bracketed by events when a profile is on.
pub(super) fn around<R>(name: &'static str, stream: sys::CUstream, launch: impl FnOnce() -> R) -> R {
    if !ON.load(Ordering::Relaxed) {
        return launch();
    }
    let start = event();
    // SAFETY: `start` was just created; `stream` is the live stream the launch goes to.
    unsafe { result::event::record(start, stream) }.expect("profile event record");
    let out = launch();
    let end = event();
    // SAFETY: as above.
    unsafe { result::event::record(end, stream) }.expect("profile event record");
    RECORDS.lock().expect("profile lock").push(Record { name, start, end });
    out
}

fn event() -> sys::CUevent {
    result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT).expect("profile event")
}

/// Stops recording and returns device time per kernel name, largest first. The caller has
/// synchronised the streams the kernels ran on.
pub fn finish() -> Vec<KernelTime> {
    ON.store(false, Ordering::Relaxed);
    let records = std::mem::take(&mut *RECORDS.lock().expect("profile lock"));
    let mut times: Vec<KernelTime> = Vec::new();
    for r in records {
        // SAFETY: both events were recorded and the stream was synchronised; each is destroyed
        // once, here.
        let ms = unsafe { result::event::elapsed(r.start, r.end) }.expect("profile event elapsed");
        unsafe {
            let _ = result::event::destroy(r.start);
            let _ = result::event::destroy(r.end);
        }
        match times.iter_mut().find(|t| t.name == r.name) {
            Some(t) => {
                t.launches += 1;
                t.total_ms += f64::from(ms);
            }
            None => times.push(KernelTime { name: r.name, launches: 1, total_ms: f64::from(ms) }),
        }
    }
    times.sort_by(|a, b| b.total_ms.total_cmp(&a.total_ms));
    times
}

fn discard() {
    ON.store(false, Ordering::Relaxed);
    for r in std::mem::take(&mut *RECORDS.lock().expect("profile lock")) {
        // SAFETY: recorded events of a profile nobody will read; destroying a pending event is
        // allowed (the driver releases it once it completes).
        unsafe {
            let _ = result::event::destroy(r.start);
            let _ = result::event::destroy(r.end);
        }
    }
}

/// Runs `f` between `cuProfilerStart` and `cuProfilerStop`, so that a profiler started with
/// `--profile-from-start off` (ncu) sees exactly the launches inside: one frame step, or one
/// prompt, among the thousands of launches a bench makes. The caller has synchronised its
/// streams before and does after, so no other work falls into the range.
pub fn external_range<R>(f: impl FnOnce() -> R) -> R {
    // SAFETY: both calls take no arguments and act on this thread's current context, which the
    // caller's Cuda made current; a failure (no profiler attached is not one) only loses the
    // range, so it is ignored.
    unsafe {
        let _ = sys::cuProfilerStart();
    }
    let out = f();
    // SAFETY: as above.
    unsafe {
        let _ = sys::cuProfilerStop();
    }
    out
}
