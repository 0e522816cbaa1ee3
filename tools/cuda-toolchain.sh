#!/usr/bin/env bash
# Installs the pinned CUDA 13.0 compiler (nvcc from NVIDIA's PyPI wheels) into .cache/cuda-13.0,
# where build.rs finds it. No GPU or system CUDA is needed to build; 13.0 is pinned because the
# GPU machines' driver 580 cannot JIT PTX from newer toolkits (shared/crates.md §2.1).
# Idempotent: a second run only checks the version. Prints the CUDA_HOME it installed.
set -euo pipefail
cd "$(dirname "$0")/.."
dest="$PWD/.cache/cuda-13.0"
cuda_home="$dest/nvidia/cu13"
if ! "$cuda_home/bin/nvcc" --version 2>/dev/null | grep -q 'release 13.0'; then
    echo "installing nvcc 13.0 wheels into $dest" >&2
    rm -rf "$dest"
    # All five pinned: nvcc alone would pull the newest nvvm/crt/runtime and mix versions.
    python3 -m pip install --quiet --no-cache-dir --disable-pip-version-check --no-deps --target "$dest" \
        nvidia-cuda-nvcc==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-nvvm==13.0.88 \
        nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85 >&2
    "$cuda_home/bin/nvcc" --version | grep -q 'release 13.0' || { echo "nvcc 13.0 did not install" >&2; exit 1; }
fi
echo "$cuda_home"
