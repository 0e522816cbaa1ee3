#!/usr/bin/env bash
# The prefill GEMM lab, ON THE GPU MACHINE from the repository root (after tools/gpu/build.sh
# here; the .gpu pack travelled for its generated kernel_constants.cuh):
#
#   tools/gpu/gemm-lab.sh [REPORT_DIR]
#
# Builds tools/gpu/gemm_lab.cu against kernels/linear_gemm.cu for sm_90a and runs it: the
# mma.sync GEMMs (`linear_gemm_r32`, `_r64`, `_r128`) and nine tile shapes of the wgmma template
# on the prefill's projection shapes (85, 200 and 1000 rows). Each is checked against an f64
# reference on sampled rows (NaN-poisoned outputs), each row against the same row computed with
# the input shifted by 37 rows (bits), and every wgmma shape against the first (bits); then timed
# alone with L2 flushed before each launch (median of 12). REPORT_DIR gets gemm-lab.txt; the last
# line says ALL OK or SOME FAILED. Run 30 (docs/perf/2026-12-06-prefill.md) chose
# `linear.rs`'s `gemm_wg_shape` from it.
set -euo pipefail
cd "$(dirname "$0")/../.."
tools/gpu/unpack.sh
report_dir=${1:-${OUT:-.gpu/report}}
mkdir -p "$report_dir"
nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -Ikernels -I.gpu/bin tools/gpu/gemm_lab.cu -o "$report_dir/gemm_lab"
"$report_dir/gemm_lab" | tee "$report_dir/gemm-lab.txt"
