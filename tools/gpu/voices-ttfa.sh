#!/usr/bin/env bash
# Time to first audio with and without a voice, ON THE GPU MACHINE from the repository root
# (after tools/gpu/build.sh here; the .gpu pack travelled):
#
#   tools/gpu/voices-ttfa.sh [REPORT_DIR]
#
# One server on the full random checkpoint; a 10 s reference uploaded as five voices (one
# transcript each, so five prompt prefixes); then, one request at a time (seed 7, 64 frames,
# streamed pcm), five rounds of: the default voice; voice k for the first time (its reference
# rows prefilled: `stored-uncached`); voice k again (started from its kept prefix:
# `stored-cached`); and the same clip as an inline reference (decoded, encoded and prefilled per
# request: `inline`). Prints, per request, curl's time to the first byte; writes ttfa.tsv (one
# file: a device run returns few) and the voice cache's metrics.
set -euo pipefail
cd "$(dirname "$0")/../.."
tools/gpu/unpack.sh
report_dir=${1:-${OUT:-.gpu/report}}
mkdir -p "$report_dir"
port=${LIMELIGHT_PORT:-18080}
work=$(mktemp -d)
ckpt=$(tools/gpu/full-ckpt.sh "$work")
python3 - "$work/reference.wav" <<'PY'
import math, struct, sys, wave
rate, seconds = 24000, 10.0
with wave.open(sys.argv[1], "wb") as w:
    w.setnchannels(1); w.setsampwidth(2); w.setframerate(rate)
    w.writeframes(b"".join(struct.pack("<h", int(0.4 * 32767 * math.sin(2 * math.pi * 170 * i / rate) * (0.6 + 0.4 * math.sin(2 * math.pi * 2.1 * i / rate)))) for i in range(int(rate * seconds))))
PY
.gpu/bin/limelight serve --model "$ckpt" --device cuda --port "$port" --log-format json \
    --max-body-bytes 4194304 >"$work/serve.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
until curl -sf "http://127.0.0.1:$port/ready" >/dev/null; do
    kill -0 $server 2>/dev/null || { tail -20 "$work/serve.log"; exit 1; }
    sleep 0.2
done
base="http://127.0.0.1:$port"
for k in 1 2 3 4 5; do
    curl -sS -o /dev/null -w "upload voice$k %{http_code} %{time_total}s\n" -F name=voice$k -F consent=yes \
        -F "ref_text=A quiet evening by the river, take $k." -F "audio_sample=@$work/reference.wav;type=audio/wav" \
        "$base/v1/audio/voices"
done
b64=$(base64 -w0 "$work/reference.wav")
printf '{"model":"drama-3","input":"Hello from limelight.","voice":"default","response_format":"pcm","seed":7,"max_frames":64,"references":[{"audio":"data:audio/wav;base64,%s","text":"A quiet evening by the river."}]}' "$b64" >"$work/inline.json"
say() {  # case run voice
    curl -sS -o /dev/null -w "$1\t$2\t%{http_code}\t%{time_starttransfer}\t%{time_total}\n" -H 'Content-Type: application/json' \
        -d "{\"model\":\"drama-3\",\"input\":\"Hello from limelight.\",\"voice\":\"$3\",\"response_format\":\"pcm\",\"seed\":7,\"max_frames\":64}" \
        "$base/v1/audio/speech" | tee -a "$report_dir/ttfa.tsv"
}
printf 'case\trun\tstatus\tfirst_byte_s\ttotal_s\n' | tee "$report_dir/ttfa.tsv"
for run in 1 2 3 4 5; do
    say default "$run" default
    say stored-uncached "$run" "voice$run"
    say stored-cached "$run" "voice$run"
    curl -sS -o /dev/null -w "inline\t$run\t%{http_code}\t%{time_starttransfer}\t%{time_total}\n" -H 'Content-Type: application/json' \
        --data-binary "@$work/inline.json" "$base/v1/audio/speech" | tee -a "$report_dir/ttfa.tsv"
done
python3 - "$report_dir/ttfa.tsv" <<'PY'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
for case in ["default", "stored-uncached", "stored-cached", "inline"]:
    t = sorted(float(r["first_byte_s"]) * 1000 for r in rows if r["case"] == case)
    print(f"{case:16s} first byte median {statistics.median(t):7.1f} ms  min {t[0]:7.1f}  max {t[-1]:7.1f}  (n={len(t)})")
PY
curl -sS "$base/metrics" | grep -E '^limelight_voice_cache' || true
grep -h '"reference encoded"' "$work/serve.log" | head -2 | cut -c1-200
grep -h 'memory plan' "$work/serve.log" | head -1 | cut -c1-600
