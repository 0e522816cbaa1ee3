#!/usr/bin/env bash
# Where first audio goes, phase by phase, ON THE GPU MACHINE from the repository root (after
# tools/gpu/build.sh here; the .gpu pack travelled):
#
#   tools/gpu/first-audio.sh [REPORT_DIR] [ROUNDS]
#
# One server with defaults on the full random checkpoint (`RUST_LOG=info,limelight=debug`, so
# each request logs its `first audio` phases: queue, open, prefill, first_frame, codec). Two
# voices are stored: a 5 s reference (first use ≈ 200 prompt rows: issue 14's case) and a 10 s
# one (≈ 320 rows). Then, one request at a time (seed 7, 32 frames, streamed pcm), ROUNDS
# (default 5) rounds of: a short text (≈ 55 rows); a ~290-byte text, one chunk (its rows are
# logged); each voice on first use (its kept prefix dropped before by a fresh name) and again
# (kept). Writes first-audio.tsv: per request curl's first byte and the server's phases.
set -euo pipefail
cd "$(dirname "$0")/../.."
tools/gpu/unpack.sh
report_dir=${1:-${OUT:-.gpu/report}}
rounds=${2:-5}
mkdir -p "$report_dir"
source tools/gpu/cuda-libs.sh
port=${LIMELIGHT_PORT:-18080}
work=$(mktemp -d)
ckpt=$(tools/gpu/full-ckpt.sh "$work")
python3 tools/gpu/reference-clip.py "$work/ref5.wav" 5
python3 tools/gpu/reference-clip.py "$work/ref10.wav" 10
RUST_LOG=info,limelight=debug .gpu/bin/limelight serve --model "$ckpt" --device cuda --port "$port" \
    --log-format json --max-body-bytes 4194304 ${SERVE_FLAGS:-} >"$work/serve.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true; cp "$work/serve.log" "$report_dir/first-audio-serve.log" 2>/dev/null || true' EXIT
until curl -sf "http://127.0.0.1:$port/ready" >/dev/null; do
    kill -0 $server 2>/dev/null || { tail -20 "$work/serve.log"; exit 1; }
    sleep 0.2
done
echo "build: $(cat .gpu/bin/BUILD)"
base="http://127.0.0.1:$port"
upload() {  # name seconds
    curl -sS -o /dev/null -w "upload $1 %{http_code}\n" -F name="$1" -F consent=yes \
        -F "ref_text=A quiet evening by the river, said $1." -F "audio_sample=@$work/ref$2.wav;type=audio/wav" \
        "$base/v1/audio/voices"
}
short="Hello from limelight."
long="The quick brown fox jumps over the lazy dog near the quiet river bank, while the evening \
light fades slowly behind the hills. A small boat drifts past the old mill, and somewhere a \
bell rings twice before the town falls silent again for the night, as it has for years."
say() {  # case round voice text
    local id="fa-$1-$2"
    curl -sS -o /dev/null -H "x-request-id: $id" -H 'Content-Type: application/json' \
        -w "$1\t$2\t$id\t%{http_code}\t%{time_starttransfer}\n" \
        -d "{\"model\":\"drama-3\",\"input\":\"$4\",\"voice\":\"$3\",\"response_format\":\"pcm\",\"seed\":7,\"max_frames\":32}" \
        "$base/v1/audio/speech" >>"$work/curl.tsv"
}
: >"$work/curl.tsv"
say warm 0 default "$short"
for round in $(seq 1 "$rounds"); do
    upload "v5r$round" 5 && upload "v10r$round" 10
    # Each upload warms its voice (the prefix prefilled on the engine, ~20 ms of GPU work): let
    # that finish, or the short case measures the wait behind it.
    sleep 0.5
    say short "$round" default "$short"
    say one-chunk "$round" default "$long"
    say voice5-first "$round" "v5r$round" "$short"
    say voice5-kept "$round" "v5r$round" "$short"
    say voice10-first "$round" "v10r$round" "$short"
    say voice10-kept "$round" "v10r$round" "$short"
done
python3 - "$work/curl.tsv" "$work/serve.log" "$report_dir/first-audio.tsv" <<'PY'
import json, statistics, sys
curl = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])]
phases = {}
for line in open(sys.argv[2]):
    try:
        rec = json.loads(line)
    except ValueError:
        continue
    if rec.get("message") == "first audio":
        phases[rec.get("span", {}).get("request_id")] = rec
keys = ["prompt_rows", "queue_ms", "open_ms", "prefill_ms", "first_frame_ms", "codec_ms"]
with open(sys.argv[3], "w") as out:
    out.write("case\tround\tstatus\tfirst_byte_ms\t" + "\t".join(keys) + "\n")
    table = {}
    for case, rnd, rid, status, first in curl:
        p = phases.get(rid, {})
        vals = [p.get(k, float("nan")) for k in keys]
        out.write(f"{case}\t{rnd}\t{status}\t{float(first) * 1e3:.2f}\t" + "\t".join(f"{v:.2f}" for v in vals) + "\n")
        if case != "warm":
            table.setdefault(case, []).append([float(first) * 1e3] + vals)
print(f"{'case (median of rounds)':24s} {'rows':>5s} {'first byte':>10s} {'queue':>6s} {'open':>6s} {'prefill':>8s} {'frame':>6s} {'codec':>6s} {'rest':>6s}")
for case, rs in table.items():
    m = [statistics.median(r[i] for r in rs) for i in range(len(rs[0]))]
    rest = m[0] - sum(m[2:])
    print(f"{case:24s} {m[1]:5.0f} {m[0]:10.1f} {m[2]:6.1f} {m[3]:6.1f} {m[4]:8.1f} {m[5]:6.1f} {m[6]:6.1f} {rest:6.1f}")
PY
curl -sS "$base/metrics" | grep -E '^limelight_(first_audio_phase|step_graph|voice_cache)' >"$report_dir/first-audio-metrics.txt" || true
grep -h 'memory plan' "$work/serve.log" | head -1 | cut -c1-400
