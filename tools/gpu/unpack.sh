#!/usr/bin/env bash
# On the GPU machine: restores .gpu/bin from the .gpu/pack/bin.tar.xz that tools/gpu/build.sh
# wrote, when only the pack travelled (device `run` with carry [".gpu/pack"]).
set -euo pipefail
cd "$(dirname "$0")/../.."
if [[ -f .gpu/pack/bin.tar.xz && ( ! -x .gpu/bin/gpu-checks || .gpu/pack/bin.tar.xz -nt .gpu/bin/BUILD ) ]]; then
    xz -dc .gpu/pack/bin.tar.xz | tar -C .gpu -xf -
fi
