#!/usr/bin/env bash
# The GPU soak (issue 16), ON THE GPU MACHINE from the repository root (after tools/gpu/build.sh
# here; the .gpu pack travelled): `serve --device cuda` on the full random checkpoint under 64
# closed-loop clients with random formats, deliveries and disconnects, its host RSS, open
# descriptors and engine memory sampled every 10 s (`limelight bench soak`).
#
#   tools/gpu/soak.sh run  [DIR] [DURATION_SECS] [CLIENTS]   in one call (a device call lasts at
#                                                           most 10 minutes: DURATION ≤ ~420)
#   tools/gpu/soak.sh start [DIR] [DURATION_SECS] [CLIENTS]  detached, for the 30-minute soak over
#   tools/gpu/soak.sh wait  [DIR]                            several calls: start, then wait until
#                                                           DIR/done appears (≤ 9 min per call)
#
# DIR (default $OUT or .gpu/report) gets soak.{json,csv,svg,txt}, serve.log, metrics.txt and
# nvidia-smi.csv (device memory used, sampled by nvidia-smi beside the soak's own samples).
set -euo pipefail
cd "$(dirname "$0")/../.."
mode=${1:-run}
dir=${2:-${OUT:-.gpu/report}}
duration=${3:-1800}
clients=${4:-64}
mkdir -p "$dir"

if [[ "$mode" == wait ]]; then
    for _ in $(seq 540); do
        [[ -e "$dir/done" ]] && break
        sleep 1
    done
    [[ -e "$dir/done" ]] || { echo "soak still running: $(tail -c 300 "$dir/soak.txt" 2>/dev/null)"; exit 0; }
    cat "$dir/soak.txt"
    exit "$(cat "$dir/done")"
fi

tools/gpu/unpack.sh
source tools/gpu/cuda-libs.sh
ckpt=$(tools/gpu/full-ckpt.sh "$dir")

soak() {
    local port=${LIMELIGHT_PORT:-18081}
    .gpu/bin/limelight serve --model "$ckpt" --device cuda --port "$port" --log-format json \
        --context-length 4096 --max-frames 2048 --max-queue 256 >"$dir/serve.log" 2>&1 &
    local server=$!
    trap 'kill $server 2>/dev/null || true; kill $smi 2>/dev/null || true' EXIT
    until curl -sf "http://127.0.0.1:$port/ready" >/dev/null; do
        kill -0 $server 2>/dev/null || { echo "the server exited while loading"; tail -20 "$dir/serve.log"; return 1; }
        sleep 0.2
    done
    nvidia-smi --query-gpu=timestamp,memory.used --format=csv -l 10 >"$dir/nvidia-smi.csv" &
    smi=$!
    echo "soak: $clients clients for $duration s; build $(cat .gpu/bin/BUILD)" | tee "$dir/soak.txt"
    local status=0
    .gpu/bin/limelight bench soak --url "http://127.0.0.1:$port" --clients "$clients" --duration-secs "$duration" \
        --server-pid "$server" --sample-every-secs 10 --out "$dir" >>"$dir/soak.txt" 2>&1 || status=$?
    curl -sf "http://127.0.0.1:$port/metrics" >"$dir/metrics.txt" || true
    echo "server log: $(grep -c '"level":"ERROR"' "$dir/serve.log" || true) ERROR lines" >>"$dir/soak.txt"
    return $status
}

case "$mode" in
    run)
        soak && echo 0 >"$dir/done" || { echo $? >"$dir/done"; }
        cat "$dir/soak.txt"
        exit "$(cat "$dir/done")"
        ;;
    start)
        rm -f "$dir/done"
        (setsid bash -c "$(declare -f soak); ckpt='$ckpt' dir='$dir' duration='$duration' clients='$clients'; \
            soak && echo 0 >'$dir/done' || echo \$? >'$dir/done'" >/dev/null 2>&1 &)
        echo "soak started: tools/gpu/soak.sh wait $dir"
        ;;
    *)
        echo "usage: tools/gpu/soak.sh run|start|wait [DIR] [DURATION_SECS] [CLIENTS]" >&2
        exit 2
        ;;
esac
