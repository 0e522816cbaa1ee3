#!/usr/bin/env bash
# The decode-attention lab, ON THE GPU MACHINE from the repository root (after tools/gpu/build.sh
# here; the .gpu pack travelled for its generated kernel_constants.cuh):
#
#   tools/gpu/attn-lab.sh [REPORT_DIR] [VARIANT...]
#
# Builds tools/gpu/attn_lab.cu once per VARIANT, THREADS:MAXGROUP (default: the build's own, then
# 256:8 512:16 512:8 1024:8), each against a copy of kernels/attention.cu with only its head_dim
# 256 entry point and kernel_constants.cuh's ATTN_THREADS and ATTN_MAX_GROUP set to the variant's,
# and runs it: `attn_decode_hd256` timed alone at 5, 11, 300 and 1000 keys, checked against fp64,
# and the hash of its outputs' bits (every variant must print the same). REPORT_DIR gets
# attn-lab.txt.
set -euo pipefail
cd "$(dirname "$0")/../.."
tools/gpu/unpack.sh
report_dir=${1:-${OUT:-.gpu/report}}
shift $(( $# >= 1 ? 1 : 0 ))
mkdir -p "$report_dir"
own=$(sed -n 's/#define ATTN_THREADS //p' .gpu/bin/kernel_constants.cuh):$(sed -n 's/#define ATTN_MAX_GROUP //p' .gpu/bin/kernel_constants.cuh)
variants=("$@")
(( ${#variants[@]} )) || variants=("$own" 256:8 512:16 512:8 1024:8)
for v in "${variants[@]}"; do
    nt=${v%%:*} g=${v##*:}
    dir=$(mktemp -d)
    sed -e "s/#define ATTN_THREADS .*/#define ATTN_THREADS $nt/" -e "s/#define ATTN_MAX_GROUP .*/#define ATTN_MAX_GROUP $g/" \
        .gpu/bin/kernel_constants.cuh >"$dir/kernel_constants.cuh"
    grep -v '^ATTN_VARIANTS(\(32\|64\|128\))$' kernels/attention.cu >"$dir/attention.cu"
    echo "== variant $v" | tee -a "$report_dir/attn-lab.txt"
    if nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -Xptxas -v -I"$dir" -Ikernels -I.gpu/bin \
        tools/gpu/attn_lab.cu -o "$dir/attn_lab" >"$dir/ptxas.txt" 2>&1; then
        grep -A2 "Compiling entry function 'attn_decode_hd256'" "$dir/ptxas.txt" | tail -2 | tee -a "$report_dir/attn-lab.txt"
        "$dir/attn_lab" 2>&1 | tee -a "$report_dir/attn-lab.txt" || true
    else
        tail -5 "$dir/ptxas.txt" | tee -a "$report_dir/attn-lab.txt"
    fi
done
