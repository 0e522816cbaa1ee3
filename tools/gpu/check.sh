#!/usr/bin/env bash
# The GPU checks, run ON THE GPU MACHINE from the repository root, after tools/gpu/build.sh
# built .gpu/bin here and the directory travelled (device `run` with carry [".gpu/pack"]):
#
#   tools/gpu/check.sh [REPORT_DIR]            # every kernel + the backbone end to end vs the CPU backend
#   tools/gpu/check.sh --full [REPORT_DIR]     # also: synth the full-size checkpoint, bench the backbone and the engine
#
# LIMELIGHT_GPU_SECTIONS="engine batch" runs only those sections. The decode batch at full size and
# the serving load test are tools/gpu/serve-load.sh.
#
# Writes REPORT_DIR/gpu-checks.md (the table) and, with --full, bench-backbone.json/.txt and
# bench-engine.json/.txt.
# cuBLASLt comes from the machine's CUDA libraries (the PyTorch venv's nvidia/cu13/lib on the H200 image).
set -euo pipefail
cd "$(dirname "$0")/../.."
tools/gpu/unpack.sh
full=0
if [[ "${1:-}" == "--full" ]]; then full=1; shift; fi
report_dir=${1:-${OUT:-.gpu/report}}
mkdir -p "$report_dir"

source tools/gpu/cuda-libs.sh
echo "build: $(cat .gpu/bin/BUILD)"
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total,clocks.sm --format=csv,noheader || true

# One process per section: a GPU fault poisons its context, and must not hide the other sections.
status=0
: > "$report_dir/gpu-checks.md"
sections_dir=$(mktemp -d)
for section in ${LIMELIGHT_GPU_SECTIONS:-norm linear gdn attention moe backbone tower codec encode sampling engine batch prefix load}; do
    rc=0
    LIMELIGHT_GPU_ONLY=$section LIMELIGHT_GPU_REPORT="$sections_dir/$section.md" .gpu/bin/gpu-checks || rc=$?
    if ((rc > 1)); then
        echo "section $section crashed (exit $rc); memcheck of it:"
        LIMELIGHT_GPU_ONLY=$section compute-sanitizer --tool memcheck --print-limit 20 .gpu/bin/gpu-checks 2>&1 | head -60 || true
    fi
    ((rc == 0)) || status=1
    cat "$sections_dir/$section.md" >> "$report_dir/gpu-checks.md" 2>/dev/null || echo "| $section | crashed | | exit $rc | **NO** |" >> "$report_dir/gpu-checks.md"
done

if ((full)); then
    ckpt=$(tools/gpu/full-ckpt.sh "$report_dir")
    .gpu/bin/limelight bench backbone --model "$ckpt" --prompt-rows 200 --decode-rows 100 \
        --json "$report_dir/bench-backbone.json" | tee "$report_dir/bench-backbone.txt" || status=$?
    .gpu/bin/limelight bench engine --model "$ckpt" --frames 256 \
        --json "$report_dir/bench-engine.json" | tee "$report_dir/bench-engine.txt" || status=$?
fi
exit $status
