#!/usr/bin/env bash
# Voice cloning served on the GPU, ON THE GPU MACHINE from the repository root (after
# tools/gpu/build.sh here; the .gpu pack travelled):
#
#   tools/gpu/voices-run.sh [REPORT_DIR]
#
# Starts `limelight serve --device cuda --voices-dir` on the full random checkpoint, uploads a
# 10 s reference clip (tools/gpu/reference-clip.py) as a named voice, speaks in
# it twice with one seed (the bytes must match: the second starts from the voice's kept prompt
# prefix, the first ran it) and in the default voice, then restarts the
# server over the same voices directory and speaks in the voice again (the bytes must match the
# first server's). REPORT_DIR gets serve*.log, upload.json, voices.json, requests.tsv (status,
# bytes, time to first byte), same-bytes.txt, metrics.txt, load-time.txt. MAX_BATCH sets
# --max-batch (default: what the memory budget holds).
set -euo pipefail
cd "$(dirname "$0")/../.."
tools/gpu/unpack.sh
report_dir=${1:-${OUT:-.gpu/report}}
mkdir -p "$report_dir"
port=${LIMELIGHT_PORT:-18080}
voices=$(mktemp -d)
ckpt=$(tools/gpu/full-ckpt.sh "$report_dir")
echo "build: $(cat .gpu/bin/BUILD)"
python3 tools/gpu/reference-clip.py "$report_dir/reference.wav"

start_server() {  # log
    start=$(date +%s%N)
    .gpu/bin/limelight serve --model "$ckpt" --device cuda --port "$port" --log-format json \
        --voices-dir "$voices" --voice-alias alloy=narrator ${MAX_BATCH:+--max-batch "$MAX_BATCH"} >"$report_dir/$1" 2>&1 &
    server=$!
    until curl -sf "http://127.0.0.1:$port/ready" >/dev/null; do
        if ! kill -0 $server 2>/dev/null; then echo "the server exited while loading:"; tail -20 "$report_dir/$1"; exit 1; fi
        sleep 0.2
    done
    echo "$1: ready after $(( ($(date +%s%N) - start) / 1000000 )) ms" | tee -a "$report_dir/load-time.txt"
}
trap 'kill $server 2>/dev/null || true' EXIT
start_server serve.log

base="http://127.0.0.1:$port"
curl -sS -o "$report_dir/upload.json" -w "upload\t%{http_code}\t%{time_total}\n" \
    -F name=narrator -F consent=yes -F "ref_text=A quiet evening by the river, the water moving slowly past the stones." \
    -F "audio_sample=@$report_dir/reference.wav;type=audio/wav" "$base/v1/audio/voices" | tee "$report_dir/upload.tsv"
cat "$report_dir/upload.json"; echo
curl -sS "$base/v1/audio/voices" >"$report_dir/voices.json"

printf 'request\tvoice\tstatus\tbytes\tfirst_byte_s\ttotal_s\n' >"$report_dir/requests.tsv"
speak() {  # name voice
    curl -sS -o "$report_dir/$1.pcm" -w "$1\t$2\t%{http_code}\t%{size_download}\t%{time_starttransfer}\t%{time_total}\n" \
        -H 'Content-Type: application/json' \
        -d "{\"model\":\"drama-3\",\"input\":\"Hello from limelight, in a voice it was given.\",\"voice\":\"$2\",\"response_format\":\"pcm\",\"seed\":7,\"max_frames\":64}" \
        "$base/v1/audio/speech" >>"$report_dir/requests.tsv"
}
speak default-voice default
speak narrator-1 narrator
speak narrator-2 narrator
speak alias alloy
curl -sS "$base/metrics" >"$report_dir/metrics.txt"
kill $server; wait $server 2>/dev/null || true
start_server serve-restarted.log
speak narrator-restarted narrator
kill $server; wait $server 2>/dev/null || true
cat "$report_dir/requests.tsv"
{
    cmp -s "$report_dir/narrator-1.pcm" "$report_dir/narrator-2.pcm" && echo "narrator twice: same bytes" || echo "narrator twice: DIFFERENT"
    cmp -s "$report_dir/narrator-1.pcm" "$report_dir/alias.pcm" && echo "alloy alias: same bytes as narrator" || echo "alloy alias: DIFFERENT"
    cmp -s "$report_dir/narrator-1.pcm" "$report_dir/narrator-restarted.pcm" && echo "after restart: same bytes" || echo "after restart: DIFFERENT"
    cmp -s "$report_dir/narrator-1.pcm" "$report_dir/default-voice.pcm" && echo "default voice: same bytes (UNEXPECTED)" || echo "default voice: different bytes, as expected"
} | tee "$report_dir/same-bytes.txt"
grep -E "limelight_device_allocations_after_warm_up|limelight_memory|limelight_voice_cache" "$report_dir/metrics.txt" || true
grep -h '"reference encoded"\|"voice created"\|encoder\|memory plan' "$report_dir/serve.log" | head -5
