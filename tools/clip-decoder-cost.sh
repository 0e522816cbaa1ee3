#!/usr/bin/env bash
# What the clip decoder's child process costs (voice::isolated; docs/operations.md), on this
# machine with a release build:
#
#   tools/clip-decoder-cost.sh [BINARY]      default target/release/limelight
#
# Times `limelight decode-clip` three times each on: a refused input (the child's start and
# exchange alone), a 10 s mono WAV at 24 kHz (decoded and resampled), and the largest clip the
# limits allow, 60 s of 8-channel 192 kHz WAV (its peak resident memory). Needs .venv (numpy).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-target/release/limelight}
[[ -x $bin ]] || cargo build --release --locked --bin limelight
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
.venv/bin/python - "$dir" <<'PY'
import io, json, sys, wave
import numpy as np
out = sys.argv[1]
def request(name, rate, channels, seconds, max_bytes):
    limits = {"max_bytes": max_bytes, "max_seconds": 60.0, "min_seconds": 0.5,
              "rates": {"start": 8000, "end": 192000}, "max_channels": 8}
    head = (json.dumps({"hint": None, "limits": limits}) + "\n").encode()
    t = np.arange(int(seconds * rate)) / rate
    x = (8000 * np.sin(2 * np.pi * 220 * t)).astype("<i2")
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(channels); w.setsampwidth(2); w.setframerate(rate)
        w.writeframes(np.repeat(x[:, None], channels, axis=1).tobytes())
    open(f"{out}/{name}", "wb").write(head + buf.getvalue())
    if name == "wav-10s":
        open(f"{out}/refused", "wb").write(head + b"not audio at all")
request("wav-10s", 24000, 1, 10.0, 16 << 20)
request("wav-60s-8ch-192k", 192000, 8, 60.0, 400_000_000)
PY
for input in refused wav-10s wav-60s-8ch-192k; do
    for _ in 1 2 3; do
        /usr/bin/time -f "$input: %e s, peak resident %M KB" \
            "$bin" decode-clip --memory-bytes $((2 << 30)) --cpu-seconds 30 <"$dir/$input" >/dev/null
    done
done
