//! Build script. Its final job is to compile every `kernels/*.cu` with nvcc into fatbins that
//! the binary embeds (the CUDA engine issue); until the first kernel lands there is nothing to
//! compile, so it only tells cargo when to run again.

fn main() {
    println!("cargo::rerun-if-changed=kernels");
    println!("cargo::rerun-if-changed=build.rs");
}
