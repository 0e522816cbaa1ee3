#!/usr/bin/env bash
# The decode batch at full size, ON THE GPU MACHINE from the repository root (after
# tools/gpu/build.sh here; the .gpu pack travelled):
#
#   tools/gpu/serve-load.sh [REPORT_DIR] [CLIENTS]
#
# 1. `limelight bench batch`: the step of B streams together against its floor, per batch size;
# 2. `limelight serve --device cuda` on the full random checkpoint, then `limelight bench serve`:
#    N closed-loop clients (CLIENTS, default 1,8,32,64,128) each streaming `pcm` requests of 200
#    frames with distinct seeds; the server's /metrics after the load.
# Environment: BATCH_SIZES (bench batch sizes), PROFILE_SIZES (sizes whose step bench batch
# profiles per kernel), BENCH_ONLY=1 (stop after bench batch), LOADED_AFTER (seconds into the
# load before the same-bytes request), SERVE_FLAGS (more `serve` flags, e.g. --no-codec-thread).
# REPORT_DIR gets bench-batch.{txt,json}, serve-load.{txt,json}, serve.log, metrics.txt.
set -euo pipefail
cd "$(dirname "$0")/../.."
tools/gpu/unpack.sh
report_dir=${1:-${OUT:-.gpu/report}}
clients=${2:-1,8,32,64,128}
mkdir -p "$report_dir"
source tools/gpu/cuda-libs.sh
ckpt=$(tools/gpu/full-ckpt.sh "$report_dir")
echo "build: $(cat .gpu/bin/BUILD)"

.gpu/bin/limelight bench batch --model "$ckpt" --batch "${BATCH_SIZES:-1,8,32,64,128}" --frames 24 \
    ${PROFILE_SIZES:+--profile "$PROFILE_SIZES"} \
    --json "$report_dir/bench-batch.json" 2>&1 | tee "$report_dir/bench-batch.txt" || echo "bench batch failed: $?"
[[ -n "${BENCH_ONLY:-}" ]] && exit 0

port=${LIMELIGHT_PORT:-18080}
.gpu/bin/limelight serve --model "$ckpt" --device cuda --port "$port" --log-format json \
    --context-length 4096 --max-frames 2048 --max-queue 256 ${SERVE_FLAGS:-} >"$report_dir/serve.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
until curl -sf "http://127.0.0.1:$port/ready" >/dev/null; do
    kill -0 $server 2>/dev/null || { echo "the server exited while loading:"; tail -20 "$report_dir/serve.log"; exit 1; }
    sleep 0.2
done
grep -m1 '"memory plan"' "$report_dir/serve.log" || true
# One request alone, then the same request again while the load runs: the same bytes.
speak() {
    curl -sS -o "$1" -H 'Content-Type: application/json' "http://127.0.0.1:$port/v1/audio/speech" \
        -d '{"model":"drama-3","input":"The same seed gives the same bytes under any load.","response_format":"pcm","seed":99,"max_frames":120}'
}
speak /tmp/alone.pcm
.gpu/bin/limelight bench serve --url "http://127.0.0.1:$port" --clients "$clients" --requests 1 --frames 200 \
    --json "$report_dir/serve-load.json" >"$report_dir/serve-load.txt" 2>&1 &
load=$!
sleep "${LOADED_AFTER:-20}"
speak /tmp/loaded.pcm
wait $load || echo "bench serve failed: $?"
cat "$report_dir/serve-load.txt"
cmp -s /tmp/alone.pcm /tmp/loaded.pcm &&
    echo "same request alone and under load: identical bytes ($(stat -c %s /tmp/alone.pcm) bytes)" | tee "$report_dir/under-load.txt" ||
    echo "same request alone and under load: BYTES DIFFER" | tee "$report_dir/under-load.txt"
curl -sf "http://127.0.0.1:$port/metrics" >"$report_dir/metrics.txt" || true
