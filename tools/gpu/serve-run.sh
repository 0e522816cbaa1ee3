#!/usr/bin/env bash
# A full-size serving run, ON THE GPU MACHINE from the repository root (after tools/gpu/build.sh
# here and the .gpu directory travelled):
#
#   tools/gpu/serve-run.sh [REPORT_DIR]
#
# Writes the full random-weight checkpoint if it is not there yet ($LIMELIGHT_FULL_CKPT, default
# /tmp/limelight-full), starts `limelight serve --device cuda` on it with JSON logs, waits for
# /ready, then streams requests with curl (chunked PCM, and SSE) and records, per request, curl's
# time to the first byte and the server's own request line (time to first audio, frames, real-time
# factor). REPORT_DIR gets serve.log (the server's JSON lines), requests.tsv, metrics.txt,
# audio files, and load-time.txt. The first server runs one stream at a time as a CUDA graph
# (`--max-batch 1`); then it serves the same checkpoint again with the decode batch (the default)
# and checks that the same request gives the same bytes (ab-host-loop.txt, serve-host-loop.log);
# then the graph again with the codec inside the step (`--no-codec-thread`): the same bytes, and
# its speed beside the codec thread's (ab-codec-in-step.txt, serve-codec-in-step.log).
set -euo pipefail
cd "$(dirname "$0")/../.."
tools/gpu/unpack.sh
report_dir=${1:-${OUT:-.gpu/report}}
mkdir -p "$report_dir"
ckpt=${LIMELIGHT_FULL_CKPT:-/tmp/limelight-full}
port=${LIMELIGHT_PORT:-18080}
source tools/gpu/cuda-libs.sh
if [[ ! -f "$ckpt/config.json" ]]; then
    { time .gpu/bin/limelight checkpoint synth --preset full --out "$ckpt"; } 2>"$report_dir/synth-time.txt"
fi

start_server() {  # log extra-flags...
    local log=$1
    shift
    start=$(date +%s%N)
    .gpu/bin/limelight serve --model "$ckpt" --device cuda --port "$port" --log-format json "$@" \
        >"$report_dir/$log" 2>&1 &
    server=$!
    until curl -sf "http://127.0.0.1:$port/ready" >/dev/null; do
        if ! kill -0 $server 2>/dev/null; then
            echo "the server exited while loading:"; tail -20 "$report_dir/$log"; exit 1
        fi
        sleep 0.2
    done
}
trap 'kill $server 2>/dev/null || true' EXIT
start_server serve.log --max-batch 1
echo "ready after $(( ($(date +%s%N) - start) / 1000000 )) ms" | tee "$report_dir/load-time.txt"

url="http://127.0.0.1:$port/v1/audio/speech"
printf 'request\tformat\tstatus\tbytes\tcurl_first_byte_s\tcurl_total_s\n' >"$report_dir/requests.tsv"
speak() {  # name format stream_format text max_frames
    local body
    body=$(printf '{"model":"drama-3","input":"%s","voice":"default","response_format":"%s","seed":7,"max_frames":%s%s}' \
        "$4" "$2" "$5" "${3:+,\"stream_format\":\"$3\"}")
    curl -sS -o "$report_dir/$1.$2" -w "$1\t$2\t%{http_code}\t%{size_download}\t%{time_starttransfer}\t%{time_total}\n" \
        -H 'Content-Type: application/json' -d "$body" "$url" >>"$report_dir/requests.tsv"
}
text="Hello from limelight, streaming a random-weight Drama three from the GPU, frame by frame."
speak warmup pcm "" "$text" 32
speak stream-pcm pcm "" "$text" 256
speak stream-pcm-again pcm "" "$text" 256
speak stream-sse pcm sse "$text" 128
speak whole-wav wav "" "$text" 128
# The official OpenAI SDK: a streamed PCM request, timed to its first chunk. The GPU machine has
# no network: where its Python lacks the package, it is installed into a venv from the wheels
# that travelled in .gpu/wheels (`pip download openai -d .gpu/wheels` here, per Python version).
python=python3
if ! python3 -c 'import openai' 2>/dev/null && [[ -d .gpu/wheels ]]; then
    python3 -m venv --system-site-packages /tmp/limelight-sdk &&
        /tmp/limelight-sdk/bin/pip install -q --no-index --find-links .gpu/wheels openai &&
        python=/tmp/limelight-sdk/bin/python
fi
if "$python" -c 'import openai' 2>/dev/null; then
    "$python" - "$port" "$text" >"$report_dir/openai-sdk.txt" 2>&1 <<'PY' || true
import sys, time
from openai import OpenAI
client = OpenAI(base_url=f"http://127.0.0.1:{sys.argv[1]}/v1", api_key="unused")
start = time.perf_counter(); first = None; size = 0
with client.audio.speech.with_streaming_response.create(
        model="tts-1", voice="alloy", input=sys.argv[2], response_format="pcm",
        extra_body={"max_frames": 256, "seed": 7}) as response:
    for chunk in response.iter_bytes():
        first = first or time.perf_counter() - start
        size += len(chunk)
total = time.perf_counter() - start
print(f"openai {__import__('openai').__version__}: {size} bytes of 24 kHz s16 PCM "
      f"({size / 48000:.2f} s of audio), first chunk after {first * 1e3:.1f} ms, done in {total:.2f} s")
PY
else
    echo "the openai package is not installed on this machine; curl only" >"$report_dir/openai-sdk.txt"
fi
cat "$report_dir/openai-sdk.txt"
cmp -s "$report_dir/stream-pcm.pcm" "$report_dir/stream-pcm-again.pcm" &&
    echo "same seed twice: identical bytes" | tee "$report_dir/determinism.txt" ||
    echo "same seed twice: BYTES DIFFER" | tee "$report_dir/determinism.txt"
curl -sf "http://127.0.0.1:$port/metrics" >"$report_dir/metrics.txt" || true
cat "$report_dir/requests.tsv"
grep '"request"' "$report_dir/serve.log" | tail -5 || true
kill -TERM $server
wait $server || true

# The same request through the decode batch (no graph): the same bytes, and its speed for comparison.
start_server serve-host-loop.log
echo "host loop: ready after $(( ($(date +%s%N) - start) / 1000000 )) ms" | tee -a "$report_dir/load-time.txt"
speak warmup-host-loop pcm "" "$text" 32
speak stream-pcm-host-loop pcm "" "$text" 256
cmp -s "$report_dir/stream-pcm.pcm" "$report_dir/stream-pcm-host-loop.pcm" &&
    echo "CUDA graph vs the decode batch, same request: identical bytes" | tee "$report_dir/ab-host-loop.txt" ||
    echo "CUDA graph vs the decode batch, same request: BYTES DIFFER" | tee "$report_dir/ab-host-loop.txt"
tail -2 "$report_dir/requests.tsv"
grep '"request"' "$report_dir/serve-host-loop.log" | tail -2 || true
kill -TERM $server
wait $server || true

# The graph step with the codec inside it (no codec thread): the same bytes, and how much the
# codec thread's overlap is worth.
start_server serve-codec-in-step.log --max-batch 1 --no-codec-thread
echo "codec in the step: ready after $(( ($(date +%s%N) - start) / 1000000 )) ms" | tee -a "$report_dir/load-time.txt"
speak warmup-codec-in-step pcm "" "$text" 32
speak stream-pcm-codec-in-step pcm "" "$text" 256
cmp -s "$report_dir/stream-pcm.pcm" "$report_dir/stream-pcm-codec-in-step.pcm" &&
    echo "codec thread vs codec in the step, same request: identical bytes" | tee "$report_dir/ab-codec-in-step.txt" ||
    echo "codec thread vs codec in the step, same request: BYTES DIFFER" | tee "$report_dir/ab-codec-in-step.txt"
tail -2 "$report_dir/requests.tsv"
grep '"request"' "$report_dir/serve-codec-in-step.log" | tail -2 || true
kill -TERM $server
wait $server || true
rm -f "$report_dir"/*.pcm "$report_dir"/*.wav  # audio of random weights is noise; keep the numbers
