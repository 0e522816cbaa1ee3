#!/usr/bin/env bash
# The CPU soak (issue 16): `serve --demo` under closed-loop clients with random formats,
# deliveries and disconnects for DURATION seconds, its RSS, descriptors and engine memory
# sampled. Outside CI's time budget; run it by hand:
#
#   tools/soak.sh [OUT_DIR] [DURATION_SECS] [CLIENTS]     default: .soak, 600 s, 16 clients
#
# OUT_DIR gets soak.{json,csv,svg}, soak.txt (the table) and serve.log. Fails on any 5xx or any
# body that ended wrongly (`limelight bench soak --help`). The GPU soak is tools/gpu/soak.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-.soak}
duration=${2:-600}
clients=${3:-16}
mkdir -p "$out"
cargo build --locked --bin limelight
bin=target/debug/limelight
port=${SOAK_PORT:-18090}
cache=$(mktemp -d)
XDG_CACHE_HOME="$cache" "$bin" serve --demo --port "$port" --log-format json --max-queue 256 >"$out/serve.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true; rm -rf "$cache"' EXIT
until curl -sf "http://127.0.0.1:$port/ready" >/dev/null; do
    kill -0 $server 2>/dev/null || { echo "the server exited while loading:"; tail -20 "$out/serve.log"; exit 1; }
    sleep 0.5
done
echo "soak: $clients clients for $duration s against serve --demo (pid $server); build $(git rev-parse --short HEAD)"
"$bin" bench soak --url "http://127.0.0.1:$port" --clients "$clients" --duration-secs "$duration" \
    --server-pid "$server" --sample-every-secs 10 --out "$out" | tee "$out/soak.txt"
grep -c '"level":"ERROR"' "$out/serve.log" | xargs -I{} echo "server log: {} ERROR lines"
