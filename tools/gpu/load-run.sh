#!/usr/bin/env bash
# Start-up time at full size (issue 16, "fast, safe restarts"), ON THE GPU MACHINE from the
# repository root, with this build's pack carried (and, optionally, an earlier one):
#
#   tools/gpu/load-run.sh [OLD_PACK] [REPORT_DIR]
#
# 1. The disk's sequential read bandwidth: `dd iflag=direct` over the shards one after another,
#    and over all of them at once (the floor a cold load is measured against).
# 2. Cold: `serve --weights-io direct`, every byte read from the disk by direct I/O as on a cold
#    machine (the page cache is bypassed, so this needs no cache drop): time to /ready and the
#    server's own read rate.
# 3. Warm: the shards read into the page cache first, `--weights-io auto` (the default).
# 4. With OLD_PACK: the earlier build warm, and cold after the shards are dropped from the page
#    cache (posix_fadvise DONTNEED, which needs no root and drops clean pages only).
# REPORT_DIR gets load-run.tsv (one line per start), disk.txt and each server's log.
set -euo pipefail
cd "$(dirname "$0")/../.."
old_pack=${1:-}
report_dir=${2:-${OUT:-.gpu/report}}
mkdir -p "$report_dir"
tools/gpu/unpack.sh
source tools/gpu/cuda-libs.sh
ckpt=$(tools/gpu/full-ckpt.sh "$report_dir")
shards=("$ckpt"/*.safetensors)
bytes=$(stat -c %s "${shards[@]}" | awk '{ s += $1 } END { printf "%d", s }')
port=${LIMELIGHT_PORT:-18095}
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
gib_per_s() { python3 -c "print(f'{$1 / 2**30 / ($2 / 1000):.2f}')"; }
drop_cache() {
    python3 - "${shards[@]}" <<'PY'
import os, sys
for p in sys.argv[1:]:
    fd = os.open(p, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
PY
}
fill_cache() { cat "${shards[@]}" >/dev/null; }

{
    echo "shards: ${#shards[@]}, $bytes bytes ($(python3 -c "print(f'{$bytes / 2**30:.1f}')") GiB)"
    t=$(now_ms)
    for s in "${shards[@]}"; do dd if="$s" of=/dev/null bs=64M iflag=direct status=none; done
    ms=$(( $(now_ms) - t ))
    echo "dd iflag=direct bs=64M, shards one after another: $ms ms, $(gib_per_s "$bytes" "$ms") GiB/s"
    t=$(now_ms)
    for s in "${shards[@]}"; do dd if="$s" of=/dev/null bs=64M iflag=direct status=none & done
    wait
    ms=$(( $(now_ms) - t ))
    echo "dd iflag=direct bs=64M, all shards at once: $ms ms, $(gib_per_s "$bytes" "$ms") GiB/s"
    df -h "$ckpt" | tail -1
} | tee "$report_dir/disk.txt"

printf 'build\tstart\tweights_io\tready_ms\tupload_line\n' >"$report_dir/load-run.tsv"
start() {  # label binary cache(cold|warm) flags...
    local label=$1 bin=$2 cache=$3
    shift 3
    if [[ $cache == cold ]]; then drop_cache; else fill_cache; fi
    local log="$report_dir/serve-$label.log" t server
    t=$(now_ms)
    "$bin" serve --model "$ckpt" --device cuda --port "$port" --log-format json "$@" >"$log" 2>&1 &
    server=$!
    until curl -sf "http://127.0.0.1:$port/ready" >/dev/null; do
        kill -0 $server 2>/dev/null || { echo "$label: the server exited"; tail -5 "$log"; return 1; }
        sleep 0.05
    done
    local ms=$(( $(now_ms) - t ))
    kill $server
    wait $server 2>/dev/null || true
    printf '%s\t%s\t%s\t%s\t%s\n' "${label%%-*}" "$cache" "${*:-default}" "$ms" \
        "$(grep -m1 'weights resident' "$log" | tr -d '\t')" | tee -a "$report_dir/load-run.tsv"
}

start new-cold-direct .gpu/bin/limelight cold --max-batch 1 --weights-io direct
start new-warm-direct .gpu/bin/limelight warm --max-batch 1 --weights-io direct
start new-warm-auto .gpu/bin/limelight warm --max-batch 1
start new-cold-auto .gpu/bin/limelight cold --max-batch 1
start new-warm-cached .gpu/bin/limelight warm --max-batch 1 --weights-io cached
if [[ -n $old_pack ]]; then
    old=$(mktemp -d)
    xz -dc "$old_pack/bin.tar.xz" | tar -C "$old" -xf -
    start old-warm "$old/bin/limelight" warm --max-batch 1
    start old-cold "$old/bin/limelight" cold --max-batch 1
    echo "old: $(cat "$old/bin/BUILD")"
fi
echo "new: $(cat .gpu/bin/BUILD)"
