#!/usr/bin/env bash
# Do two builds give the same bytes? ON THE GPU MACHINE from the repository root, with this
# build's pack (.gpu/pack) and an earlier one (OLD_PACK, a folder holding its bin.tar.xz) carried:
#
#   tools/gpu/same-bytes.sh OLD_PACK [REPORT_DIR]
#
# For a change meant to keep every bit (a kernel's loads reordered, a launch fused away): each
# build serves the full random checkpoint twice, one stream at a time as a CUDA graph
# (`--max-batch 1`) and as the decode batch with three requests at once, and the same requests'
# audio is hashed. Prints each request's sha256 per build and one verdict line; exits 1 when any
# differs. REPORT_DIR gets same-bytes.tsv and the servers' logs.
set -euo pipefail
cd "$(dirname "$0")/../.."
old_pack=${1:?usage: tools/gpu/same-bytes.sh OLD_PACK [REPORT_DIR]}
report_dir=${2:-${OUT:-.gpu/report}}
mkdir -p "$report_dir"
tools/gpu/unpack.sh
old=$(mktemp -d)
xz -dc "$old_pack/bin.tar.xz" | tar -C "$old" -xf -
source tools/gpu/cuda-libs.sh
ckpt=$(tools/gpu/full-ckpt.sh "$report_dir")
port=${LIMELIGHT_PORT:-18090}
url="http://127.0.0.1:$port/v1/audio/speech"
texts=("Hello from limelight, streaming a random-weight Drama three from the GPU, frame by frame."
    "A second voice reads a shorter line."
    "And a third one, with numbers: 42 apples on 3 May 2026.")

serve_and_hash() {  # build-name binary mode(graph|batch)
    local name=$1 bin=$2 mode=$3 flags=()
    [[ $mode == graph ]] && flags=(--max-batch 1)
    "$bin" serve --model "$ckpt" --device cuda --port "$port" --log-format json "${flags[@]}" \
        >"$report_dir/serve-$name-$mode.log" 2>&1 &
    local server=$!
    until curl -sf "http://127.0.0.1:$port/ready" >/dev/null; do
        kill -0 $server 2>/dev/null || { echo "$name $mode: the server exited"; tail -5 "$report_dir/serve-$name-$mode.log"; exit 1; }
        sleep 0.2
    done
    local i pids=()
    for i in 0 1 2; do
        curl -sS -o "$report_dir/$name-$mode-$i.pcm" -H 'Content-Type: application/json' \
            -d "{\"model\":\"drama-3\",\"input\":\"${texts[$i]}\",\"response_format\":\"pcm\",\"seed\":$((7 + i)),\"max_frames\":96}" \
            "$url" &
        pids+=($!)
        [[ $mode == graph ]] && wait "${pids[-1]}"
    done
    wait "${pids[@]}"
    kill $server
    wait $server 2>/dev/null || true
    for i in 0 1 2; do
        printf '%s\t%s\t%s\t%s\n' "$name" "$mode" "$i" "$(sha256sum <"$report_dir/$name-$mode-$i.pcm" | cut -c1-16)"
    done
}

{
    for mode in graph batch; do
        serve_and_hash old "$old/bin/limelight" "$mode"
        serve_and_hash new .gpu/bin/limelight "$mode"
    done
} | tee "$report_dir/same-bytes.tsv"
echo "old: $(cat "$old/bin/BUILD"); new: $(cat .gpu/bin/BUILD)"
# Agreement: one hash per (mode, request) across both builds.
if [[ $(cut -f2- "$report_dir/same-bytes.tsv" | sort -u | wc -l) -eq 6 ]]; then
    echo "same bytes: every request gave the same audio on both builds"
    [[ $(cut -f3- "$report_dir/same-bytes.tsv" | sort -u | wc -l) -eq 3 ]] &&
        echo "and the graph and the decode batch gave the same audio for each request"
else
    echo "DIFFERENT BYTES between the builds"
    exit 1
fi
