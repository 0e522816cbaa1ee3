//! GPU checks: every CUDA kernel and the backbone end to end against the CPU backend, on fresh
//! random inputs with NaN-poisoned outputs. Built here with `cargo test --release --test gpu
//! --no-run`, run on the GPU machine by `tools/gpu/check.sh` (which has no cargo). Without a GPU
//! it prints one notice and exits 0.
//!
//! `LIMELIGHT_GPU_SEED` reproduces a run's inputs; `LIMELIGHT_GPU_REPORT=path` also writes the
//! table as Markdown; `LIMELIGHT_GPU_ONLY=name` runs one section.

mod attention;
mod backbone;
mod batch;
#[path = "../common/batch_driver.rs"]
mod batch_driver;
mod codec;
mod encode;
mod engine;
mod gdn;
mod harness;
mod linear;
mod load;
mod moe;
mod norm;
mod prefix;
mod sampling;
mod tower;

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use limelight::backend::cpu::Cpu;
use limelight::backend::cuda::{Cuda, CudaOptions, device};
use limelight::synth::rng::Rng;

type Section = (&'static str, fn(&mut harness::Ctx));

const SECTIONS: &[Section] = &[
    ("norm", norm::run),
    ("linear", linear::run),
    ("gdn", gdn::run),
    ("attention", attention::run),
    ("moe", moe::run),
    ("backbone", backbone::run),
    ("tower", tower::run),
    ("codec", codec::run),
    ("encode", encode::run),
    ("sampling", sampling::run),
    ("engine", engine::run),
    ("batch", batch::run),
    ("prefix", prefix::run),
    ("load", load::run),
];

fn main() {
    if !device::driver_present() {
        println!("SKIP gpu checks: no NVIDIA driver on this machine (run tools/gpu/check.sh on a GPU machine)");
        return;
    }
    let cuda = match Cuda::open(&CudaOptions::default()) {
        Ok(c) => c,
        Err(e) => {
            println!("SKIP gpu checks: {e}");
            return;
        }
    };
    let seed = std::env::var("LIMELIGHT_GPU_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1));
    let info = cuda.info();
    println!(
        "gpu checks on {} (cc {}.{}, {} SMs), seed {seed}",
        info.name, info.compute_capability.0, info.compute_capability.1, info.multiprocessors
    );
    // Every pool buffer is handed out NaN-filled: an element a kernel does not write fails.
    cuda.pool().set_poison(true);
    let only = std::env::var("LIMELIGHT_GPU_ONLY").ok();
    let mut ctx = harness::Ctx { cuda: &cuda, cpu: Cpu, rng: Rng::new(seed), rows: Vec::new() };
    for (name, run) in SECTIONS {
        if only.as_deref().is_some_and(|o| o != *name) {
            continue;
        }
        let start = Instant::now();
        let before = ctx.rows.len();
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(&mut ctx)));
        if let Err(panic) = outcome {
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            ctx.check(format!("{name}: panicked"), "panic", "none".into(), message.replace('|', "/"), false);
        }
        println!("  {name}: {} checks in {:.1} s", ctx.rows.len() - before, start.elapsed().as_secs_f64());
    }
    let table = harness::markdown(&ctx.rows);
    println!("\n{table}");
    let failed = ctx.rows.iter().filter(|r| !r.pass).count();
    if let Ok(path) = std::env::var("LIMELIGHT_GPU_REPORT") {
        let header = format!(
            "GPU: {} (cc {}.{}), seed {seed}, {} checks, {failed} failed\n\n",
            info.name,
            info.compute_capability.0,
            info.compute_capability.1,
            ctx.rows.len()
        );
        std::fs::write(&path, header + &table).expect("write the report");
    }
    println!("{} checks, {failed} failed", ctx.rows.len());
    if failed > 0 {
        std::process::exit(1);
    }
}
