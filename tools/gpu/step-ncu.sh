#!/usr/bin/env bash
# Per-kernel device time and DRAM traffic of one frame step and of one prompt, under ncu, ON THE
# GPU MACHINE from the repository root (after tools/gpu/build.sh here; the .gpu pack travelled):
#
#   tools/gpu/step-ncu.sh [REPORT_DIR] [PROMPT_ROWS]      RANGES="prompt": profile only the prompt
#
# `bench engine --profiler-range step|prompt` brackets two graph frame steps (after eight
# unprofiled ones), or one prompt, with cuProfilerStart/Stop; ncu (--profile-from-start off,
# --clock-control none, caches flushed between kernels) measures each launch inside alone. Each
# kernel's time is set against its own floor, its DRAM bytes at the measured copy bandwidth.
# The sum of the kernels' own times against the step's wall time (from the same bench) is the
# share lost between kernels: launch gaps and dependency waits.
#
# REPORT_DIR gets ncu-{step,prompt}.csv (ncu's raw rows), {step,prompt}-kernels.tsv (one row per
# launch, in order) and {step,prompt}-by-kernel.md (the table); engine.{txt,json} (the wall times).
set -euo pipefail
cd "$(dirname "$0")/../.."
tools/gpu/unpack.sh
report_dir=${1:-${OUT:-.gpu/report}}
rows=${2:-200}
mkdir -p "$report_dir"
source tools/gpu/cuda-libs.sh
ckpt=$(tools/gpu/full-ckpt.sh "$report_dir")
echo "build: $(cat .gpu/bin/BUILD)"
metrics=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,launch__grid_size,launch__block_size
bench=(.gpu/bin/limelight bench engine --model "$ckpt" --prompt-rows "$rows" --context-length 2048 --prefill-chunk 1024)
# Wall times without the profiler attached: the step and prompt the kernels are set against.
"${bench[@]}" --frames 64 --json "$report_dir/engine.json" >"$report_dir/engine.txt" 2>&1
for range in ${RANGES:-step prompt}; do
    ncu --profile-from-start off --clock-control none --metrics "$metrics" -f -o "$report_dir/ncu-$range" \
        "${bench[@]}" --frames 16 --profiler-range "$range" >"$report_dir/engine-ncu-$range.txt" 2>&1
    ncu --import "$report_dir/ncu-$range.ncu-rep" --csv --page raw --print-units base >"$report_dir/ncu-$range.csv"
    python3 tools/gpu/ncu_table.py "$report_dir/ncu-$range.csv" "$report_dir/engine.json" "$range" \
        "$report_dir/$range-kernels.tsv" >"$report_dir/$range-by-kernel.md"
    cat "$report_dir/$range-by-kernel.md"
done
