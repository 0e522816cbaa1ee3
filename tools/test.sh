#!/usr/bin/env bash
# The test command (README, CI): lint, every Rust test, then the Python cross-checks against
# independent readers of our checkpoint layout. Installs what it needs on first use.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== python environment (.venv)"
tools/python-env.sh
# Rust tests that cross-check with Python find the venv's interpreter first, and must not
# skip here: a missing package is a failure in the test command.
export PATH="$PWD/.venv/bin:$PATH"
export LIMELIGHT_REQUIRE_PYTHON=1

echo "== format and lints"
cargo fmt --check
cargo clippy --all-targets --locked -- -D warnings

echo "== rust tests"
cargo test --all-targets --locked

echo "== python cross-checks"
cargo build --locked --bin limelight
LIMELIGHT_BIN="$PWD/target/debug/limelight" .venv/bin/python -m pytest tools/compat -q
