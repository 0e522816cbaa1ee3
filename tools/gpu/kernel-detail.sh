#!/usr/bin/env bash
# One launch of each named kernel of a prompt, under ncu's full set, ON THE GPU MACHINE from the
# repository root (after tools/gpu/build.sh here; the .gpu pack travelled):
#
#   tools/gpu/kernel-detail.sh REPORT_DIR PROMPT_ROWS KERNEL_REGEX...     RANGE=step: a frame step's
#
# Where step-ncu.sh says which kernels cost the most, this says why: for the first launch whose
# name matches each regex inside `bench engine --profiler-range prompt` (RANGE=step: inside the
# graph frame steps `--profiler-range step` brackets, each kernel node profiled alone), ncu's full sections
# (throughputs of DRAM, L2, shared memory and the pipes; occupancy; warp stall reasons) and the
# per-instruction samples of the source page. --clock-control none, caches flushed.
#
# REPORT_DIR gets, per regex i: detail-i.txt (the sections as ncu prints them) and source-i.csv
# (SASS with its stall samples).
set -euo pipefail
cd "$(dirname "$0")/../.."
tools/gpu/unpack.sh
report_dir=$1
rows=$2
shift 2
mkdir -p "$report_dir"
source tools/gpu/cuda-libs.sh
ckpt=$(tools/gpu/full-ckpt.sh "$report_dir")
echo "build: $(cat .gpu/bin/BUILD)"
bench=(.gpu/bin/limelight bench engine --model "$ckpt" --prompt-rows "$rows" --context-length 2048
    --prefill-chunk 1024 --frames "${FRAMES:-16}" --profiler-range "${RANGE:-prompt}")
i=0
for regex in "$@"; do
    rep="$report_dir/detail-$i"
    ncu --profile-from-start off --clock-control none --set full --import-source no \
        --kernel-name "regex:$regex" --launch-count 1 -f -o "$rep" "${bench[@]}" >"$rep.log" 2>&1
    { echo "# regex: $regex"; ncu --import "$rep.ncu-rep" --page details; } >"$rep.txt"
    ncu --import "$rep.ncu-rep" --page source --csv --print-source sass >"$report_dir/source-$i.csv" 2>&1 || true
    i=$((i + 1))
done
