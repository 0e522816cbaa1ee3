#!/usr/bin/env bash
# Where a served stream's frame time goes beyond the graph step, ON THE GPU MACHINE from the
# repository root (after tools/gpu/build.sh here built .gpu/bin/libkernel_trace.so; the .gpu pack
# travelled):
#
#   tools/gpu/serve-trace.sh [REPORT_DIR] [FRAMES]
#
# A server with defaults (the decode batch, its step graphs, the codec on its own thread and
# stream) runs on the full random checkpoint with CUPTI's kernel records on
# (tools/gpu/kernel_trace.c, by CUDA_INJECTION64_PATH). One streamed `pcm` request of FRAMES
# (default 256) frames, alone; curl's timings beside it. tools/gpu/serve_trace_table.py then
# gives, per step replay: the GPU's frame period, the replay's span, the host's gap before the
# next replay, and the codec's kernels inside and between replays (and the spans of replays that
# overlap codec work against those that do not), and the host's side of the gap between
# replays from the driver calls the tracer records too (LIMELIGHT_TRACE_API). REPORT_DIR gets
# trace.tsv.xz, api.tsv.xz, serve-trace.md, curl.txt and serve.log.
set -euo pipefail
cd "$(dirname "$0")/../.."
tools/gpu/unpack.sh
report_dir=${1:-${OUT:-.gpu/report}}
frames=${2:-256}
mkdir -p "$report_dir"
source tools/gpu/cuda-libs.sh
cupti_dir=$(python3 -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13", "lib"))')
export LD_LIBRARY_PATH="$cupti_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
ckpt=$(tools/gpu/full-ckpt.sh "$report_dir")
tracer=$PWD/.gpu/bin/libkernel_trace.so
[[ -f $tracer ]] || { echo "no $tracer: tools/gpu/build.sh builds it" >&2; exit 1; }
port=${LIMELIGHT_PORT:-18080}
CUDA_INJECTION64_PATH=$tracer LIMELIGHT_TRACE="$report_dir/trace.tsv" LIMELIGHT_TRACE_API="$report_dir/api.tsv" \
    .gpu/bin/limelight serve --model "$ckpt" --device cuda --port "$port" --log-format json \
    ${SERVE_FLAGS:-} >"$report_dir/serve.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
until curl -sf "http://127.0.0.1:$port/ready" >/dev/null; do
    kill -0 $server 2>/dev/null || { tail -20 "$report_dir/serve.log"; exit 1; }
    sleep 0.2
done
echo "build: $(cat .gpu/bin/BUILD)" | tee "$report_dir/curl.txt"
curl -sS -o /dev/null -H 'Content-Type: application/json' \
    -w 'first byte %{time_starttransfer} s, total %{time_total} s, %{size_download} bytes\n' \
    -d "{\"model\":\"drama-3\",\"input\":\"Where does a served frame's time go, kernel by kernel?\",\"response_format\":\"pcm\",\"seed\":5,\"max_frames\":$frames}" \
    "http://127.0.0.1:$port/v1/audio/speech" | tee -a "$report_dir/curl.txt"
# SIGTERM drains; the tracer's buffers are flushed at exit.
kill -TERM $server
wait $server || true
trap - EXIT
python3 tools/gpu/serve_trace_table.py "$report_dir/trace.tsv" --api "$report_dir/api.tsv" | tee "$report_dir/serve-trace.md"
xz -T0 -6 "$report_dir/trace.tsv" "$report_dir/api.tsv"
