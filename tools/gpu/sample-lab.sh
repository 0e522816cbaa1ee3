#!/usr/bin/env bash
# The sampling lab, ON THE GPU MACHINE from the repository root (after tools/gpu/build.sh here;
# the .gpu pack travelled for its generated kernel_constants.cuh):
#
#   tools/gpu/sample-lab.sh [REPORT_DIR] [VARIANT...]
#
# Builds tools/gpu/sample_lab.cu once per VARIANT and runs it: the main draw on a flat and on a
# peaked row, and a codebook head's draw, each timed alone, with the hash of its picks (every
# variant must print the same) and the medians of PROBE marks that tools/gpu/sample_lab_patch.py
# puts at the draw's phase boundaries. A VARIANT is `probe` (kernels/sampling.cu, rank.cuh and
# kept_prefix.cuh, marked) or a path to an older sampling.cu (one file then: marked where its
# lines match), or a directory whose files (any of sampling.cu, kept_prefix.cuh, rank.cuh,
# draw.cuh) replace kernels/' before marking. Default: probe. Where cuobjdump is found, the count
# of a few telling SASS instructions (MATCH, ATOMS, BAR, CAS loops) follows each variant.
# REPORT_DIR gets sample-lab.txt.
set -euo pipefail
cd "$(dirname "$0")/../.."
tools/gpu/unpack.sh
report_dir=${1:-${OUT:-.gpu/report}}
shift $(( $# >= 1 ? 1 : 0 ))
mkdir -p "$report_dir"
variants=("$@")
(( ${#variants[@]} )) || variants=(probe)
for v in "${variants[@]}"; do
    dir=$(mktemp -d)
    if [[ $v == probe || -d $v ]]; then
        for f in sampling.cu kept_prefix.cuh rank.cuh draw.cuh; do
            src=kernels/$f
            [[ -d $v && -f $v/$f ]] && src=$v/$f
            case $f in
                sampling.cu | kept_prefix.cuh | rank.cuh) python3 tools/gpu/sample_lab_patch.py "$src" "$dir/$f" ;;
                *) cp "$src" "$dir/$f" ;;
            esac
        done
    else
        python3 tools/gpu/sample_lab_patch.py "$v" "$dir/sampling.cu"
    fi
    echo "== variant $v" | tee -a "$report_dir/sample-lab.txt"
    if nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -Xptxas -v -I"$dir" -Ikernels -I.gpu/bin \
        tools/gpu/sample_lab.cu -o "$dir/sample_lab" >"$dir/ptxas.txt" 2>&1; then
        grep -A2 "Compiling entry function 'sample_main_draws'" "$dir/ptxas.txt" | tail -2 | tee -a "$report_dir/sample-lab.txt"
        if command -v cuobjdump >/dev/null; then
            cuobjdump -sass "$dir/sample_lab" >"$dir/sass.txt" 2>/dev/null || true
            for op in MATCH ATOMS.ADD ATOMS.CAS ATOMS.POPC REDUX BAR.SYNC; do
                printf '    SASS %-10s %4d\n' "$op" "$(grep -c "$op" "$dir/sass.txt" || true)"
            done | tee -a "$report_dir/sample-lab.txt"
            gzip -c "$dir/sass.txt" >"$report_dir/sass-$(basename "$v").txt.gz"
        fi
        "$dir/sample_lab" 2>&1 | tee -a "$report_dir/sample-lab.txt" || true
    else
        tail -5 "$dir/ptxas.txt" | tee -a "$report_dir/sample-lab.txt"
    fi
    rm -rf "$dir"
done
