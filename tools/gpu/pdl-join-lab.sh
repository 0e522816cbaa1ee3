#!/usr/bin/env bash
# Does a kernel captured after a side stream's join launch early? ON THE GPU MACHINE from the
# repository root:
#
#   tools/gpu/pdl-join-lab.sh [REPORT_DIR]
#
# Builds and runs tools/gpu/pdl_join_lab.cu (see its header): the edges of the dependent node as
# captured, and its entry against its main-stream predecessor's end, for the launch as limelight
# captures it now, with the capture's dependencies rewritten (the predecessor's edge
# programmatic), the same launched plainly, and with no join. REPORT_DIR gets pdl-join-lab.txt.
set -euo pipefail
cd "$(dirname "$0")/../.."
report_dir=${1:-${OUT:-.gpu/report}}
mkdir -p "$report_dir"
bin=$(mktemp -d)/pdl_join_lab
nvcc -O2 -std=c++17 -gencode arch=compute_90a,code=sm_90a -Itools/gpu tools/gpu/pdl_join_lab.cu -o "$bin"
"$bin" | tee "$report_dir/pdl-join-lab.txt"
