#!/usr/bin/env bash
# Step and prompt times of several builds on one machine, ON THE GPU MACHINE from the repository
# root, with this build's pack (.gpu/pack) and earlier ones carried:
#
#   tools/gpu/ab-step.sh REPORT_DIR OLD_PACK...
#
# Timings are only comparable on the same card and the same warm machine, so each change's
# gain is measured here against the builds before it, turn about: every build's
# `bench engine` (the frame step as a CUDA graph and the host loop, a 200-row prompt, the codec)
# runs ROUNDS times (default 2), builds interleaved. REPORT_DIR gets each run's text and JSON and
# ab-step.tsv: build, round, graph ms/frame, host-loop ms/frame, prompt ms. AB_ENV=VAR=value runs
# this build a second time with that variable set (a runtime switch measured on one binary).
set -euo pipefail
cd "$(dirname "$0")/../.."
report_dir=${1:?usage: tools/gpu/ab-step.sh REPORT_DIR OLD_PACK...}
shift
rounds=${ROUNDS:-2}
mkdir -p "$report_dir"
tools/gpu/unpack.sh
source tools/gpu/cuda-libs.sh
ckpt=$(tools/gpu/full-ckpt.sh "$report_dir")

# Each build: its name (the commit in its BUILD file), its binary and its environment.
names=() bins=() envs=()
add_build() {  # binary-dir [VAR=value: run with it, named after it]
    local name
    name=$(cut -d' ' -f2 <"$1/BUILD" | tr '+' '-')  # run's files come back with plain names only
    names+=("$name${2:+-$(tr '=_' '--' <<<"$2")}")
    bins+=("$1/limelight")
    envs+=("${2:-}")
}
add_build .gpu/bin
# AB_ENV=VAR=value: this build once more with that variable set (a switch measured on one binary).
if [[ -n ${AB_ENV:-} ]]; then add_build .gpu/bin "$AB_ENV"; fi
for pack in "$@"; do
    dir=$(mktemp -d)
    xz -dc "$pack/bin.tar.xz" | tar -C "$dir" -xf -
    add_build "$dir/bin"
done

printf 'build\tround\tgraph_ms_per_frame\thost_ms_per_frame\tprompt_ms\n' >"$report_dir/ab-step.tsv"
for round in $(seq 1 "$rounds"); do
    for i in "${!bins[@]}"; do
        out="$report_dir/engine-${names[$i]}-$round"
        env ${envs[$i]} "${bins[$i]}" bench engine --model "$ckpt" --frames 64 --prompt-rows 200 --context-length 2048 \
            --prefill-chunk 1024 --json "$out.json" >"$out.txt" 2>&1
        graph=$(sed -nE 's/.* ([0-9.]+) ms\/frame as a CUDA graph.*/\1/p' "$out.txt")
        host=$(sed -nE 's/.*graph, ([0-9.]+) ms\/frame as the host loop.*/\1/p' "$out.txt")
        prompt=$(sed -nE 's/^prompt .*: ([0-9.]+) ms$/\1/p' "$out.txt")
        printf '%s\t%s\t%s\t%s\t%s\n' "${names[$i]}" "$round" "$graph" "$host" "$prompt" | tee -a "$report_dir/ab-step.tsv"
    done
done
