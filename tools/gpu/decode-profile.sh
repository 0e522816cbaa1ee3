#!/usr/bin/env bash
# The decode step's profile and A/B runs of docs/perf/2026-12-04-one-stream.md, runs 12–17, ON THE
# GPU MACHINE from the repository root (after tools/gpu/build.sh here; the .gpu pack travelled):
#
#   tools/gpu/decode-profile.sh [REPORT_DIR]
#
# 1. ncu (--clock-control none) on the linear and sampling checks' one-row launches:
#    ncu-linear-r8.tsv, ncu-sampling.tsv (kernel, duration, DRAM % of peak, grid);
# 2. on the full random checkpoint, `bench engine` at 200 and 1000 prompt rows (one 1024-row
#    prefill chunk), with overlapping launches (the default) and with LIMELIGHT_NO_PDL=1:
#    engine-pdl-ab.txt;
# 3. `bench batch --batch 1 --profile 1`: the B = 1 step per kernel, batch-1.txt.
set -euo pipefail
cd "$(dirname "$0")/../.."
tools/gpu/unpack.sh
report_dir=${1:-${OUT:-.gpu/report}}
mkdir -p "$report_dir"
source tools/gpu/cuda-libs.sh
echo "build: $(cat .gpu/bin/BUILD)"

metrics=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,launch__grid_size
profile() {  # SECTION KERNEL_REGEX LAUNCHES OUT
    LIMELIGHT_GPU_ONLY=$1 ncu --clock-control none -k "regex:$2" --csv --page raw --metrics "$metrics" -c "$3" \
        .gpu/bin/gpu-checks 2>/dev/null | python3 -c '
import csv, sys
rows = list(csv.reader(l for l in sys.stdin if l.startswith("\"")))
head = rows[0]
cols = [head.index(c) for c in ["Kernel Name", "gpu__time_duration.sum",
        "dram__throughput.avg.pct_of_peak_sustained_elapsed", "launch__grid_size"]]
print("kernel\tduration_ns\tdram_pct_of_peak\tgrid_blocks")
for r in rows[2:]:
    print("\t".join(r[i].replace(",", "") for i in cols))' >"$4"
}
profile linear 'linear_mma_r8$' 40 "$report_dir/ncu-linear-r8.tsv"
profile sampling 'sample_head|sample_main_draws' 40 "$report_dir/ncu-sampling.tsv"

ckpt=$(tools/gpu/full-ckpt.sh "$report_dir")
for no_pdl in 0 1; do
    echo "LIMELIGHT_NO_PDL=$no_pdl"
    for rows in 200 1000; do
        LIMELIGHT_NO_PDL=$no_pdl .gpu/bin/limelight bench engine --model "$ckpt" --prompt-rows "$rows" --frames 64 \
            --context-length 2048 --prefill-chunk 1024 2>&1 | grep -E "prompt|frame step|first frame"
    done
done | tee "$report_dir/engine-pdl-ab.txt"
.gpu/bin/limelight bench batch --model "$ckpt" --batch 1 --frames 24 --prompt-rows 200 --profile 1 \
    >"$report_dir/batch-1.txt" 2>&1
head -2 "$report_dir/batch-1.txt"
