#!/usr/bin/env bash
# The decode-attention lab, ON THE GPU MACHINE from the repository root (after tools/gpu/build.sh
# here; the .gpu pack travelled for its generated kernel_constants.cuh):
#
#   tools/gpu/attn-lab.sh [REPORT_DIR] [VARIANT...]
#
# Builds tools/gpu/attn_lab.cu once per VARIANT and runs it: `attn_decode_hd256` timed alone at
# 5, 11, 300 and 1000 keys, checked against fp64, and the hash of its outputs' bits (every
# variant must print the same). A VARIANT is THREADS:CTA_HEADS (kernels/attention.cu with
# kernel_constants.cuh's ATTN_THREADS and ATTN_CTA_HEADS set so), or FILE:THREADS:GROUP for an
# older attention.cu whose CTAs take a kv head's whole group (ATTN_MAX_GROUP). Each builds against
# a copy of its attention.cu with only the head_dim 256 entry point. Default: 256:2 256:1 256:4
# 256:8 512:4. REPORT_DIR gets attn-lab.txt.
set -euo pipefail
cd "$(dirname "$0")/../.."
tools/gpu/unpack.sh
report_dir=${1:-${OUT:-.gpu/report}}
shift $(( $# >= 1 ? 1 : 0 ))
mkdir -p "$report_dir"
variants=("$@")
(( ${#variants[@]} )) || variants=(256:2 256:1 256:4 256:8 512:4)
for v in "${variants[@]}"; do
    dir=$(mktemp -d)
    IFS=: read -r -a part <<<"$v"
    if (( ${#part[@]} == 3 )); then
        src=${part[0]} nt=${part[1]} heads="#define ATTN_MAX_GROUP ${part[2]}"
    else
        src=kernels/attention.cu nt=${part[0]} heads="#define ATTN_CTA_HEADS ${part[1]}"
    fi
    grep -v '#define ATTN_THREADS \|#define ATTN_MAX_GROUP \|#define ATTN_CTA_HEADS ' .gpu/bin/kernel_constants.cuh \
        >"$dir/kernel_constants.cuh"
    printf '#define ATTN_THREADS %s\n%s\n' "$nt" "$heads" >>"$dir/kernel_constants.cuh"
    grep -v '^ATTN_VARIANTS(\(32\|64\|128\))$' "$src" >"$dir/attention.cu"
    echo "== variant $v" | tee -a "$report_dir/attn-lab.txt"
    if nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -Xptxas -v -I"$dir" -Ikernels -I.gpu/bin \
        tools/gpu/attn_lab.cu -o "$dir/attn_lab" >"$dir/ptxas.txt" 2>&1; then
        grep -A2 "Compiling entry function 'attn_decode_hd256'" "$dir/ptxas.txt" | tail -2 | tee -a "$report_dir/attn-lab.txt"
        "$dir/attn_lab" 2>&1 | tee -a "$report_dir/attn-lab.txt" || true
    else
        tail -5 "$dir/ptxas.txt" | tee -a "$report_dir/attn-lab.txt"
    fi
done
