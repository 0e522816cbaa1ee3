#!/usr/bin/env bash
# The sampling lab, ON THE GPU MACHINE from the repository root (after tools/gpu/build.sh here;
# the .gpu pack travelled for its generated kernel_constants.cuh):
#
#   tools/gpu/sample-lab.sh [REPORT_DIR] [VARIANT...]
#
# Builds tools/gpu/sample_lab.cu once per VARIANT and runs it: the main draw on a flat and on a
# peaked row, and a codebook head's draw, each timed alone, with the hash of its picks (every
# variant must print the same) and the medians of PROBE marks that tools/gpu/sample_lab_patch.py
# puts at the draw's phase boundaries. A VARIANT is `probe` (kernels/sampling.cu and
# kept_prefix.cuh, marked) or a path to an older sampling.cu (one file then: marked where its
# lines match). Default: probe.
# REPORT_DIR gets sample-lab.txt.
set -euo pipefail
cd "$(dirname "$0")/../.."
tools/gpu/unpack.sh
report_dir=${1:-${OUT:-.gpu/report}}
shift $(( $# >= 1 ? 1 : 0 ))
mkdir -p "$report_dir"
variants=("$@")
(( ${#variants[@]} )) || variants=(probe)
for v in "${variants[@]}"; do
    dir=$(mktemp -d)
    if [[ $v == probe ]]; then
        python3 tools/gpu/sample_lab_patch.py kernels/sampling.cu "$dir/sampling.cu"
        python3 tools/gpu/sample_lab_patch.py kernels/kept_prefix.cuh "$dir/kept_prefix.cuh"
    else
        python3 tools/gpu/sample_lab_patch.py "$v" "$dir/sampling.cu"
    fi
    echo "== variant $v" | tee -a "$report_dir/sample-lab.txt"
    if nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -Xptxas -v -I"$dir" -Ikernels -I.gpu/bin \
        tools/gpu/sample_lab.cu -o "$dir/sample_lab" >"$dir/ptxas.txt" 2>&1; then
        grep -A2 "Compiling entry function 'sample_main_draws'" "$dir/ptxas.txt" | tail -2 | tee -a "$report_dir/sample-lab.txt"
        "$dir/sample_lab" 2>&1 | tee -a "$report_dir/sample-lab.txt" || true
    else
        tail -5 "$dir/ptxas.txt" | tee -a "$report_dir/sample-lab.txt"
    fi
    rm -rf "$dir"
done
