#!/usr/bin/env bash
# Builds, on this machine, what the GPU machine runs (it has no cargo): the release binary and
# the GPU check binary, copied into .gpu/bin (git-ignored) for `run`'s carry. Then, on the GPU
# machine: tools/gpu/check.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
# Its own target directory: release builds do not wait on the debug builds of tests.
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target/gpu}
cuda_home=$(tools/cuda-toolchain.sh)
cargo build --release --locked --bin limelight
# The test binary's path is printed by cargo; take the executable of the `gpu` test target.
check_bin=$(cargo test --release --locked --test gpu --no-run --message-format=json 2>/dev/null |
    python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "gpu" and m.get("executable"):
        print(m["executable"])')
mkdir -p .gpu/bin
cp "$CARGO_TARGET_DIR/release/limelight" .gpu/bin/limelight
cp "$check_bin" .gpu/bin/gpu-checks
# The generated constants header, for the standalone labs that compile kernels/ there
# (tools/gpu/gemm-lab.sh): the release build's, the one its kernels were compiled with.
out_dir=$(dirname "$(ls -t "$CARGO_TARGET_DIR"/release/build/limelight-*/out/kernel_constants.cuh | head -1)")
cp "$out_dir/kernel_constants.cuh" .gpu/bin/
strip .gpu/bin/limelight .gpu/bin/gpu-checks
# The kernel tracer (tools/gpu/kernel-trace.sh): CUPTI's headers and library from NVIDIA's pinned
# wheel, linked here; the GPU machine's own libcupti.so.13 loads at run time.
cupti="$PWD/.cache/cupti-13.0"
if [[ ! -f $cupti/nvidia/cu13/include/cupti.h ]]; then
    python3 -m pip install --quiet --no-cache-dir --disable-pip-version-check --no-deps --target "$cupti" \
        nvidia-cuda-cupti==13.0.85 >&2
fi
gcc -O2 -shared -fPIC -Wall -Wextra -Werror -I"$cupti/nvidia/cu13/include" -I"$cuda_home/include" \
    tools/gpu/kernel_trace.c -o .gpu/bin/libkernel_trace.so -L"$cupti/nvidia/cu13/lib" -l:libcupti.so.13
ls -la .gpu/bin
echo "commit $(git rev-parse --short HEAD)$(git diff --quiet || echo '+dirty')" > .gpu/bin/BUILD
# The two binaries outgrew what a device `run` carries (64 MiB with the tree): carry .gpu/pack
# instead; tools/gpu/unpack.sh (called by check.sh and serve-run.sh) restores .gpu/bin there.
mkdir -p .gpu/pack
tar -C .gpu -cf - bin | xz -T0 -6 > .gpu/pack/bin.tar.xz
ls -la .gpu/pack
