#!/usr/bin/env bash
# Prepares everything tools/reference/regenerate.sh needs to rebuild the golden fixtures of
# tests/fixtures/{backbone,codec,prompt,sampling,tower}, all under the git-ignored .cache/reference:
#
#   .cache/reference/venv     Python 3.11 virtualenv with exactly the packages pinned in
#                             tools/reference/requirements.txt (torch 2.11.0, transformers 5.17.0,
#                             descript-audio-codec 1.0.0 with --no-deps, ...)
#   .cache/reference/wheels/  sglang_omni-0.1.9-py3-none-any.whl (pip download --no-deps; sha256 checked)
#   .cache/reference/sglang   that wheel unzipped (never installed: the scripts load its files by path)
#
# and runs tools/python-env.sh for the mlx-audio side (.venv at the repository root).
#
# Stamp files (.cache/reference/venv/.reference-stamp: hash of requirements.txt and the Python version;
# .cache/reference/sglang/.from-wheel: the wheel's sha256) make a second run a quick no-op. Needs python3 (3.11; 3.11.7 to reproduce the recorded
# versions.json files) with venv and pip, and access to PyPI. PYTHON=/path/to/python picks the
# interpreter (default: python3). About 5 GB of disk.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cache="$root/.cache/reference"
venv="$cache/venv"
req="$root/tools/reference/requirements.txt"
stamp="$venv/.reference-stamp"
python="${PYTHON:-python3}"
pip_args=(--disable-pip-version-check --no-input --only-binary=:all: --quiet)
SGLANG_OMNI_VERSION=0.1.9
SGLANG_OMNI_WHEEL="sglang_omni-$SGLANG_OMNI_VERSION-py3-none-any.whl"
SGLANG_OMNI_SHA256=dcc1d0a4871cf0f534961db58180eda5987dd541a39641683ddf2ae24d6cac05
RECORDED_PYTHON=3.11.7  # what tests/fixtures/*/versions.json record

say() { echo "reference-setup: $*"; }
die() { echo "reference-setup: error: $*" >&2; exit 1; }

if ! grep -qxE '/\.cache/?' "$root/.gitignore"; then
    die "$root/.gitignore has no '/.cache' line; .cache/reference must stay out of git"
fi

py_version="$("$python" -c 'import sys; print(sys.version.split()[0])')"
case "$py_version" in
    3.11.*) ;;
    *) die "$python is Python $py_version; the pinned wheels are for CPython 3.11 (set PYTHON=...)" ;;
esac
if [[ "$py_version" != "$RECORDED_PYTHON" ]]; then
    say "warning: Python $py_version; the committed versions.json files record $RECORDED_PYTHON, so their" \
        "\"python\" fields will differ after regeneration"
fi
if [[ "$(uname -s)/$(uname -m)" != "Linux/x86_64" ]]; then
    say "warning: $(uname -s)/$(uname -m): the pins (torch's CUDA 13 build, reporting 2.11.0+cu130) are for" \
        "Linux x86_64; elsewhere pip may fail or the recorded versions differ"
fi

want="$("$python" - "$req" <<'PY'
import hashlib, sys
digest = hashlib.sha256(open(sys.argv[1], "rb").read())
digest.update(sys.version.encode())
print(digest.hexdigest())
PY
)"

start=$SECONDS
mkdir -p "$cache"

# --- the torch virtualenv --------------------------------------------------------------------------------
if [[ -x "$venv/bin/python" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    say "$venv is up to date with tools/reference/requirements.txt (nothing to do)"
else
    rm -f "$stamp"
    say "creating $venv with $("$python" -c 'import sys; print(sys.executable, sys.version.split()[0])')"
    rm -rf "$venv"
    "$python" -m venv "$venv"
    say "installing the pinned packages of tools/reference/requirements.txt (torch with its CUDA libraries:" \
        "about 3 GB to download)"
    t=$SECONDS
    "$venv/bin/python" -m pip install "${pip_args[@]}" -r "$req"
    mapfile -t nodeps < <(sed -n 's/^#no-deps[[:space:]]\{1,\}\([^[:space:]]*\).*/\1/p' "$req")
    if ((${#nodeps[@]})); then
        say "installing with --no-deps: ${nodeps[*]}"
        "$venv/bin/python" -m pip install "${pip_args[@]}" --no-deps "${nodeps[@]}"
    fi
    say "installed in $((SECONDS - t)) s"
    say "checking that the installed set is exactly the pinned set"
    "$venv/bin/python" - "$req" <<'PY'
import re, subprocess, sys

def norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()

want = {}
for line in open(sys.argv[1]):
    line = line.strip()
    if line.startswith("#no-deps"):
        line = line.split(None, 1)[1]
    elif line.startswith("#"):
        continue
    line = line.split("#")[0].strip()
    if line:
        name, version = line.split("==")
        want[norm(name)] = version.strip()
have = {}
freeze = subprocess.run([sys.executable, "-m", "pip", "freeze"], check=True, capture_output=True, text=True).stdout
for line in freeze.splitlines():
    name, version = line.split("==")
    have[norm(name)] = version
if have != want:
    extra = sorted(f"{k}=={v}" for k, v in have.items() if want.get(k) != v)
    missing = sorted(f"{k}=={v}" for k, v in want.items() if have.get(k) != v)
    sys.exit(f"installed packages differ from requirements.txt:\n  installed, not pinned: {extra}\n"
             f"  pinned, not installed: {missing}")
PY

    say "checking the imports"
    "$venv/bin/python" -P -c '
import importlib.util, sys
import einops, numpy, safetensors, tokenizers, torch, transformers
from transformers import Qwen3_5MoeForCausalLM
assert importlib.util.find_spec("dac") is not None, "descript-audio-codec is missing"
for kernel_package in ("fla", "causal_conv1d", "kernels"):  # backbone.py wants the pure-torch paths
    assert importlib.util.find_spec(kernel_package) is None, kernel_package + " is installed"
print("reference-setup: torch", torch.__version__, "transformers", transformers.__version__)
'

    echo "$want" > "$stamp"
fi

# --- sglang-omni 0.1.9, unzipped -------------------------------------------------------------------------
sglang_stamp="$cache/sglang/.from-wheel"
if [[ -f "$sglang_stamp" && "$(cat "$sglang_stamp")" == "$SGLANG_OMNI_SHA256" ]]; then
    say "$cache/sglang is up to date (nothing to do)"
else
    wheel="$cache/wheels/$SGLANG_OMNI_WHEEL"
    if [[ ! -f "$wheel" ]]; then
        say "downloading sglang-omni==$SGLANG_OMNI_VERSION (pip download --no-deps)"
        "$venv/bin/python" -m pip download --disable-pip-version-check --no-input --quiet --no-deps \
            --only-binary=:all: "sglang-omni==$SGLANG_OMNI_VERSION" -d "$cache/wheels"
    fi
    got="$(sha256sum "$wheel" | cut -d' ' -f1)"
    [[ "$got" == "$SGLANG_OMNI_SHA256" ]] || die "$wheel has sha256 $got, expected $SGLANG_OMNI_SHA256"
    say "unzipping $SGLANG_OMNI_WHEEL into $cache/sglang"
    rm -rf "$cache/sglang" "$cache/sglang.partial"
    "$venv/bin/python" -m zipfile -e "$wheel" "$cache/sglang.partial"
    mv "$cache/sglang.partial" "$cache/sglang"
    version="$("$venv/bin/python" -P -c 'import sys; sys.path.insert(0, sys.argv[1]); import sglang_omni; print(sglang_omni.__version__)' "$cache/sglang")"
    [[ "$version" == "$SGLANG_OMNI_VERSION" ]] || die "unzipped sglang_omni reports __version__ $version"

    echo "$SGLANG_OMNI_SHA256" > "$sglang_stamp"
fi
say "$cache: $(du -sh "$cache" | cut -f1)"

# --- the mlx-audio side (its own stamp makes this a no-op when up to date) -------------------------------
say "running tools/python-env.sh for the mlx-audio interpreter (.venv)"
PYTHON="$python" "$root/tools/python-env.sh"
say "done in $((SECONDS - start)) s; next: tools/reference/regenerate.sh"
