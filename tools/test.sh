#!/usr/bin/env bash
# The test command (README, CI): lint, every Rust test, the deploy files, a smoke run of each
# fuzz target, then the Python cross-checks against independent readers and clients. Installs what it needs on first use.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== system packages (ffmpeg and chromium decode our audio in tests; nginx and systemd check deploy/)"
missing=()
command -v ffprobe >/dev/null || missing+=(ffmpeg)
command -v nginx >/dev/null || missing+=(nginx)
command -v systemd-analyze >/dev/null || missing+=(systemd)
command -v chromium >/dev/null || missing+=(chromium)
if ((${#missing[@]})); then
    echo "installing: ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# Tests that need these tools must not skip here.
export LIMELIGHT_REQUIRE_TOOLS=1

echo "== python environment (.venv)"
tools/python-env.sh
# Rust tests that cross-check with Python find the venv's interpreter first, and must not
# skip here: a missing package is a failure in the test command.
export PATH="$PWD/.venv/bin:$PATH"
export LIMELIGHT_REQUIRE_PYTHON=1

echo "== CUDA compiler (pinned nvcc 13.0 wheels; build.rs compiles every kernels/*.cu with it)"
tools/cuda-toolchain.sh

echo "== format and lints"
cargo fmt --check
cargo clippy --all-targets --locked -- -D warnings
# The CPU-only build (the fuzz targets' and `--no-default-features` binaries'), whose code
# behind `not(feature = "cuda")` the default build never compiles.
cargo clippy --no-default-features --lib --locked -- -D warnings

echo "== rust tests"
cargo test --all-targets --locked

echo "== deploy files"
CHECK_DEPLOY_NO_INSTALL=1 tools/check-deploy.sh

echo "== fuzz smoke (each reader's fuzz target for 5 s; long runs: tools/fuzz.sh, docs/fuzzing.md)"
tools/fuzz.sh --smoke

echo "== python cross-checks (safetensors, mlx-audio, the OpenAI SDK, python-soundfile, Chromium)"
cargo build --locked --bin limelight
LIMELIGHT_BIN="$PWD/target/debug/limelight" .venv/bin/python -m pytest tools/compat -q

echo "== the GPU trace tables' rules on synthetic traces"
.venv/bin/python -m pytest tools/gpu/test_trace_tables.py -q
