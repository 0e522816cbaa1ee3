#!/usr/bin/env bash
# Creates or updates the virtualenv .venv at the repository root with the exact packages pinned in
# tools/requirements-compat.txt. Lines there of the form `#no-deps NAME==VERSION` (pip ignores them
# as comments) are installed afterwards with --no-deps.
#
# A stamp file (.venv/.compat-stamp: hash of the requirements file and the Python version) makes a
# second run a quick no-op. Needs only python3 with venv and pip, and access to PyPI.
# PYTHON=/path/to/python picks the interpreter (default: python3).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
req="$root/tools/requirements-compat.txt"
venv="$root/.venv"
stamp="$venv/.compat-stamp"
python="${PYTHON:-python3}"
pip_args=(--disable-pip-version-check --no-input --only-binary=:all: --quiet)

say() { echo "python-env: $*"; }

version_of() { "$1" -c 'import sys; print(sys.version)'; }

want="$("$python" - "$req" <<'PY'
import hashlib, sys
digest = hashlib.sha256(open(sys.argv[1], "rb").read())
digest.update(sys.version.encode())
print(digest.hexdigest())
PY
)"

if [[ -x "$venv/bin/python" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    say "$venv is up to date with tools/requirements-compat.txt (nothing to do)"
    exit 0
fi

start=$SECONDS
if [[ -x "$venv/bin/python" ]] && [[ "$(version_of "$venv/bin/python" 2>/dev/null)" == "$(version_of "$python")" ]]; then
    say "updating $venv"
else
    say "creating $venv with $("$python" -c 'import sys; print(sys.executable, sys.version.split()[0])')"
    rm -rf "$venv"
    "$python" -m venv "$venv"
fi
rm -f "$stamp"

say "installing the pinned packages of tools/requirements-compat.txt"
"$venv/bin/python" -m pip install "${pip_args[@]}" -r "$req"

mapfile -t nodeps < <(sed -n 's/^#no-deps[[:space:]]\{1,\}\([^[:space:]]*\).*/\1/p' "$req")
if ((${#nodeps[@]})); then
    say "installing with --no-deps: ${nodeps[*]}"
    "$venv/bin/python" -m pip install "${pip_args[@]}" --no-deps "${nodeps[@]}"
fi

say "checking that the test imports work"
"$venv/bin/python" -c '
import ml_dtypes, mlx.core, pytest, safetensors, scipy, soundfile, tokenizers
from mlx_audio.tts.models.fish_drama3.convert import convert
'

echo "$want" > "$stamp"
say "done in $((SECONDS - start)) s"
