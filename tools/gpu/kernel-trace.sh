#!/usr/bin/env bash
# The frame step's real timeline, ON THE GPU MACHINE from the repository root (after
# tools/gpu/build.sh here built .gpu/bin/libkernel_trace.so; the .gpu pack travelled):
#
#   tools/gpu/kernel-trace.sh [REPORT_DIR] [PROMPT_ROWS] [PACK...]
#
# `bench engine` (64 graph frames) runs with CUPTI's kernel activity records on
# (tools/gpu/kernel_trace.c, by CUDA_INJECTION64_PATH), and once without, for the tracing's own
# cost. tools/gpu/trace_table.py turns the trace into the step's per-kernel in-graph times and
# the idle time between kernels. With PACKs (earlier builds' packs), each is traced too, on
# this same machine. REPORT_DIR gets, per build, trace-BUILD.tsv(.xz), step-timeline-BUILD.md and
# engine-{traced,plain}-BUILD.txt.
set -euo pipefail
cd "$(dirname "$0")/../.."
tools/gpu/unpack.sh
report_dir=${1:-${OUT:-.gpu/report}}
rows=${2:-200}
shift $(( $# >= 2 ? 2 : $# ))
mkdir -p "$report_dir"
source tools/gpu/cuda-libs.sh
# libcupti.so.13: the PyTorch venv's nvidia/cu13/lib (nvidia-cuda-cupti), where cuda-libs.sh looks.
cupti_dir=$(python3 -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13", "lib"))')
export LD_LIBRARY_PATH="$cupti_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
ckpt=$(tools/gpu/full-ckpt.sh "$report_dir")

dirs=(.gpu/bin)
for pack in "$@"; do
    dir=$(mktemp -d)
    xz -dc "$pack/bin.tar.xz" | tar -C "$dir" -xf -
    dirs+=("$dir/bin")
done
tracer=$PWD/.gpu/bin/libkernel_trace.so
[[ -f $tracer ]] || { echo "no $tracer: tools/gpu/build.sh builds it" >&2; exit 1; }
for dir in "${dirs[@]}"; do
    name=$(cut -d' ' -f2 <"$dir/BUILD" | tr '+' '-')  # run's files come back with plain names only
    bench=("$dir/limelight" bench engine --model "$ckpt" --prompt-rows "$rows" --context-length 2048
        --prefill-chunk 1024 --frames 64)
    "${bench[@]}" >"$report_dir/engine-plain-$name.txt" 2>&1
    CUDA_INJECTION64_PATH=$tracer LIMELIGHT_TRACE="$report_dir/trace-$name.tsv" \
        "${bench[@]}" >"$report_dir/engine-traced-$name.txt" 2>&1
    python3 tools/gpu/trace_table.py "$report_dir/trace-$name.tsv" >"$report_dir/step-timeline-$name.md"
    grep -h 'ms/frame' "$report_dir/engine-plain-$name.txt" "$report_dir/engine-traced-$name.txt" || true
    cat "$report_dir/step-timeline-$name.md"
    xz -T0 -6 "$report_dir/trace-$name.tsv"
done
