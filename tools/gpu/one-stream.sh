#!/usr/bin/env bash
# One stream on the H200 (issue 14), ON THE GPU MACHINE from the repository root (after
# tools/gpu/build.sh here; the .gpu pack travelled):
#
#   tools/gpu/one-stream.sh [REPORT_DIR]
#
# On the full random checkpoint:
# 1. `bench engine --prompt-rows 200`: the 200-row prompt, the graph step, the codec's first frame;
# 2. `bench engine --prompt-rows 1000`: the 1000-row prompt, in the default 256-row prefill chunks
#    and in one chunk (`--prefill-chunk 1024`);
# 3. `bench batch --batch 1 --prompt-rows 200 --profile 1`: the same prompt and the batch path's
#    step at B = 1, per kernel (CUDA events around every launch).
# REPORT_DIR gets engine-200.{txt,json}, engine-1000.{txt,json}, engine-1000-chunk1024.{txt,json},
# batch-1.{txt,json}.
set -euo pipefail
cd "$(dirname "$0")/../.."
tools/gpu/unpack.sh
report_dir=${1:-${OUT:-.gpu/report}}
mkdir -p "$report_dir"
source tools/gpu/cuda-libs.sh
ckpt=$(tools/gpu/full-ckpt.sh "$report_dir")
echo "build: $(cat .gpu/bin/BUILD)"
status=0
.gpu/bin/limelight bench engine --model "$ckpt" --prompt-rows 200 --frames 128 \
    --json "$report_dir/engine-200.json" >"$report_dir/engine-200.txt" 2>&1 || status=$?
.gpu/bin/limelight bench engine --model "$ckpt" --prompt-rows 1000 --frames 16 --context-length 2048 \
    --json "$report_dir/engine-1000.json" >"$report_dir/engine-1000.txt" 2>&1 || status=$?
.gpu/bin/limelight bench engine --model "$ckpt" --prompt-rows 1000 --frames 16 --context-length 2048 \
    --prefill-chunk 1024 --json "$report_dir/engine-1000-chunk1024.json" >"$report_dir/engine-1000-chunk1024.txt" 2>&1 ||
    status=$?
.gpu/bin/limelight bench batch --model "$ckpt" --batch 1 --frames 24 --prompt-rows 200 --profile 1 \
    --json "$report_dir/batch-1.json" >"$report_dir/batch-1.txt" 2>&1 || status=$?
cat "$report_dir/engine-200.txt" "$report_dir/engine-1000.txt" "$report_dir/engine-1000-chunk1024.txt"
exit $status
