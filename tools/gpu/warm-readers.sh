#!/usr/bin/env bash
# Warm starts by reading-thread count (issue 16, "fast, safe restarts"), ON THE GPU MACHINE from
# the repository root with this build's pack carried:
#
#   tools/gpu/warm-readers.sh [REPORT_DIR] [COUNTS]     COUNTS default "4 8 16 8 4"
#
# For each count N: the shards read into the page cache (`cat`), then `limelight serve --device
# cuda --max-batch 1 --weights-readers N`, timed from the process start to the first 200 from
# /ready; the server's "weights resident" line beside it. Then one shard dropped from the page
# cache (posix_fadvise DONTNEED) and read by `dd iflag=direct`: the cold read rate.
# REPORT_DIR gets warm.tsv, warm-N.log and cold-dd.txt.
set -euo pipefail
cd "$(dirname "$0")/../.."
report_dir=${1:-${OUT:-.gpu/report}}
counts=${2:-4 8 16 8 4}
mkdir -p "$report_dir"
tools/gpu/unpack.sh
source tools/gpu/cuda-libs.sh
ckpt=$(tools/gpu/full-ckpt.sh "$report_dir")
port=${LIMELIGHT_PORT:-18097}
for n in $counts; do
    cat "$ckpt"/*.safetensors >/dev/null
    log="$report_dir/warm-$n.log"
    t0=$(date +%s%N)
    .gpu/bin/limelight serve --model "$ckpt" --device cuda --port "$port" --max-batch 1 --log-format json \
        --weights-readers "$n" >"$log" 2>&1 &
    pid=$!
    until curl -sf "http://127.0.0.1:$port/ready" >/dev/null; do
        kill -0 $pid 2>/dev/null || break
        sleep 0.05
    done
    ms=$(( ($(date +%s%N) - t0) / 1000000 ))
    kill $pid
    wait $pid 2>/dev/null || true
    printf 'readers %s\tready_ms %s\t%s\n' "$n" "$ms" "$(grep -m1 'weights resident' "$log" | tr -d '\t')" \
        | tee -a "$report_dir/warm.tsv"
done
shard=$(ls "$ckpt"/*.safetensors | head -1)
python3 -c "import os, sys; fd = os.open(sys.argv[1], os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)" "$shard"
{ time timeout 60 dd if="$shard" of=/dev/null bs=64M iflag=direct; } >"$report_dir/cold-dd.txt" 2>&1 || true
ls -la "$shard" >>"$report_dir/cold-dd.txt"
cat "$report_dir/cold-dd.txt"
