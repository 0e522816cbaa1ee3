#!/usr/bin/env bash
# Long text and dialogue served on the GPU (issue 15), ON THE GPU MACHINE from the repository
# root (after tools/gpu/build.sh here; the .gpu pack travelled):
#
#   tools/gpu/long-text.sh [REPORT_DIR]
#
# Starts `limelight serve --device cuda` on the full random checkpoint, uploads a 10 s reference
# clip as two voices (alice, bob), then:
# 1. a short two-speaker text and a SCRIPT_CHARS-character (default 20 000) two-speaker script,
#    each streamed twice as pcm with `voices` {0: alice, 1: bob}: curl's time to the first byte
#    (the script's must be no later than the short text's; the second requests compare like for
#    like, the voices' prefixes kept), total time, audio seconds, and the
#    server's request line (chunks run as one stream; finish reason, frames);
# 2. the same script twice with one seed: the same bytes;
# 3. `bench serve` with LOAD_CLIENTS (default 33) closed-loop clients each streaming a
#    LOAD_CHARS-character (default 1500) text: the slowest stream against real time, and the
#    pauses a client playing each stream as it arrives would hear (held chunks included).
# CHUNK_FRAMES (default 400) is each chunk's max_frames; SCRIPT_CHUNK_FRAMES (default CHUNK_FRAMES)
# overrides it for the four single requests (random weights never end a chunk, so a 20 000-character
# script at 400 frames a chunk is ~27 000 frames, minutes of device time). REPORT_DIR gets serve.log,
# requests.tsv, same-bytes.txt, load.txt/json, metrics.txt.
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
# A two-speaker script of about N characters, its turns alternating, as a JSON string.
script() {
    python3 - "$1" <<'PY'
import json, sys
n = int(sys.argv[1])
lines = ["The morning was quiet, and the river ran slowly past the old stone bridge.",
         "Did you see the boats come in before the rain started, or were you still asleep?",
         "I counted 12 of them, each one heavier than the last, riding low in the water.",
         "Then we should go down to the harbour at 7:30 and ask what they brought back."]
out, i = [], 0
while sum(len(s) for s in out) < n:
    out.append(f"<|speaker:{i % 2}|> {lines[i % len(lines)]} ")
    i += 1
print(json.dumps("".join(out)[:n].rsplit(" <|", 1)[0]))
PY
}

.gpu/bin/limelight serve --model "$ckpt" --device cuda --port "$port" --log-format json \
    --voices-dir "$voices" --max-queue 256 >"$report_dir/serve.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
until curl -sf "http://127.0.0.1:$port/ready" >/dev/null; do
    kill -0 $server 2>/dev/null || { echo "the server exited while loading:"; tail -20 "$report_dir/serve.log"; exit 1; }
    sleep 0.2
done
base="http://127.0.0.1:$port"
for who in alice bob; do
    curl -sS -o /dev/null -w "upload $who\t%{http_code}\n" -F name=$who -F consent=yes \
        -F "ref_text=A quiet evening by the river, the water moving slowly past the stones." \
        -F "audio_sample=@$report_dir/reference.wav;type=audio/wav" "$base/v1/audio/voices"
done

frames=${CHUNK_FRAMES:-400}
script_frames=${SCRIPT_CHUNK_FRAMES:-$frames}
printf 'request\tchars\tstatus\tbytes\taudio_s\tfirst_byte_s\ttotal_s\n' >"$report_dir/requests.tsv"
speak() {  # name json-text
    local chars
    chars=$(python3 -c 'import json,sys; print(len(json.loads(sys.argv[1])))' "$2")
    printf '{"model":"drama-3","input":%s,"voices":{"0":"alice","1":"bob"},"response_format":"pcm","seed":7,"max_frames":%s}' \
        "$2" "$script_frames" >"/tmp/$1.json"
    curl -sS -o "/tmp/$1.pcm" -w "%{http_code}\t%{size_download}\t%{time_starttransfer}\t%{time_total}\n" \
        -H 'Content-Type: application/json' --data-binary "@/tmp/$1.json" "$base/v1/audio/speech" |
        awk -v n="$1" -v c="$chars" -F'\t' '{ printf "%s\t%s\t%s\t%s\t%.1f\t%s\t%s\n", n, c, $1, $2, $2 / 48000, $3, $4 }' \
            >>"$report_dir/requests.tsv"
}
# Each text twice: the first request of a form pays for its voices' prefix (then kept); the second
# is the like-for-like comparison of first audio.
speak short "$(script 160)"
speak short-again "$(script 160)"
speak script "$(script "${SCRIPT_CHARS:-20000}")"
speak script-again "$(script "${SCRIPT_CHARS:-20000}")"
cat "$report_dir/requests.tsv"
cmp -s /tmp/script.pcm /tmp/script-again.pcm && echo "script twice: same bytes" | tee "$report_dir/same-bytes.txt" ||
    echo "script twice: BYTES DIFFER" | tee "$report_dir/same-bytes.txt"
grep '"request"' "$report_dir/serve.log" | tail -3 || true

load_text=$(script "${LOAD_CHARS:-1500}" | python3 -c 'import json,sys; print(json.load(sys.stdin))')
.gpu/bin/limelight bench serve --url "$base" --clients "${LOAD_CLIENTS:-33}" --requests 1 --frames "$frames" \
    --text "$load_text" --timeout-secs 500 --json "$report_dir/load.json" >"$report_dir/load.txt" 2>&1 ||
    echo "bench serve failed: $?"
cat "$report_dir/load.txt"
curl -sf "$base/metrics" >"$report_dir/metrics.txt" || true
grep -E "limelight_chunks_cut_total|limelight_device_allocations_after_warm_up" "$report_dir/metrics.txt" || true
rm -f /tmp/short.pcm /tmp/short-again.pcm /tmp/script.pcm /tmp/script-again.pcm
