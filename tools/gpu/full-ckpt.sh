#!/usr/bin/env bash
# On the GPU machine: writes the full-size random checkpoint once ($LIMELIGHT_FULL_CKPT, default
# /tmp/limelight-full) and prints its directory. Timing goes to $1/synth-time.txt when given.
set -euo pipefail
cd "$(dirname "$0")/../.."
ckpt=${LIMELIGHT_FULL_CKPT:-/tmp/limelight-full}
if [[ ! -f "$ckpt/config.json" ]]; then
    { time .gpu/bin/limelight checkpoint synth --preset full --out "$ckpt" >/dev/null; } 2>"${1:-/tmp}/synth-time.txt"
fi
echo "$ckpt"
