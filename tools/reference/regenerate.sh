#!/usr/bin/env bash
# Regenerates the golden fixtures of tests/fixtures/{backbone,codec,codec_encode,prompt,sampling,tower} from their
# independent references (tools/reference/README.md says which) and proves that the result is byte for
# byte what is committed.
#
#   tools/reference/setup.sh          # once: .cache/reference (torch venv, sglang-omni) and .venv (mlx-audio)
#   tools/reference/regenerate.sh     # all six; or name some: tools/reference/regenerate.sh codec tower
#
# Steps: `cargo build --bin limelight` (debug; the scripts synthesize the tiny checkpoint with it), then
# each generator with the interpreter it needs, writing into its fixture folder, then
# `git diff --stat --exit-code` over the regenerated folders (plus a check for new untracked files).
# Exits non-zero, saying which files changed, if anything differs from the committed fixtures. It also
# compares with a copy of the folders taken before regenerating (.cache/reference/before), so a fixture
# edited but not yet committed is told apart from one the generators do not reproduce.
#
# Not run: sampling.py --check-s1-triton (S1's Triton kernels on a CUDA GPU; it writes
# tests/fixtures/sampling/s1_triton_check.json, which this script leaves as it is).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"

# The exact paths the versions.json "command" fields name (relative to the repository root).
torch_python=.cache/reference/venv/bin/python
sglang=.cache/reference/sglang
mlx_python=.venv/bin/python
bin="${CARGO_TARGET_DIR:-target}/debug/limelight"  # what `cargo build --bin limelight` writes
all=(backbone codec codec_encode prompt sampling tower)

say() { echo "regenerate: $*"; }
die() { echo "regenerate: error: $*" >&2; exit 1; }

if (($#)); then
    names=("$@")
    for name in "${names[@]}"; do
        [[ " ${all[*]} " == *" $name "* ]] || die "unknown fixture '$name' (known: ${all[*]})"
    done
else
    names=("${all[@]}")
fi
dirs=()
for name in "${names[@]}"; do dirs+=("tests/fixtures/$name"); done

[[ -x "$torch_python" && -f "$sglang/sglang_omni/__init__.py" ]] ||
    die "$torch_python or $sglang is missing: run tools/reference/setup.sh first"
[[ -x "$mlx_python" ]] || die "$mlx_python is missing: run tools/reference/setup.sh (or tools/python-env.sh) first"
git rev-parse --is-inside-work-tree >/dev/null 2>&1 || die "not a git checkout: the byte-identity check needs git"

# Nothing from the caller's environment may leak into the reference interpreters; no .pyc in the tree.
unset PYTHONPATH PYTHONHOME
export PYTHONNOUSERSITE=1 PYTHONDONTWRITEBYTECODE=1

dirty_before="$(git status --porcelain --untracked-files=all -- "${dirs[@]}")"
before=.cache/reference/before
rm -rf "$before"
mkdir -p "$before"
for name in "${names[@]}"; do cp -a "tests/fixtures/$name" "$before/$name"; done

start=$SECONDS
say "cargo build --bin limelight"
cargo build --bin limelight

step() {
    local name=$1
    shift
    say "$name: $*"
    local t=$SECONDS
    "$@"
    say "$name: done in $((SECONDS - t)) s"
}

for name in "${names[@]}"; do
    case "$name" in
        backbone) step backbone "$torch_python" tools/reference/backbone.py --bin "$bin" --out tests/fixtures/backbone ;;
        codec) step codec "$torch_python" tools/reference/codec.py --bin "$bin" --out tests/fixtures/codec ;;
        codec_encode) step codec_encode "$torch_python" tools/reference/codec_encode.py --bin "$bin" \
            --out tests/fixtures/codec_encode ;;
        prompt) step prompt "$torch_python" tools/reference/prompt.py --bin "$bin" --out tests/fixtures/prompt ;;
        sampling) step sampling "$torch_python" tools/reference/sampling.py --out tests/fixtures/sampling ;;
        tower) step tower "$mlx_python" tools/reference/tower.py --bin "$bin" --torch-python "$torch_python" \
            --sglang-omni "$sglang" --out tests/fixtures/tower ;;
    esac
done
say "build and generators done in $((SECONDS - start)) s"

# The proof is the git comparison; the copy taken before the run only explains a failure (or a success
# that overwrote uncommitted edits).
changed_by_run=0
say "comparing with the fixtures as they were before this run ($before)"
for name in "${names[@]}"; do
    diff -r -q "$before/$name" "tests/fixtures/$name" || changed_by_run=1
done

status=0
say "git diff --stat --exit-code -- ${dirs[*]}"
untracked="$(git ls-files --others --exclude-standard -- "${dirs[@]}")"
if ! git diff --stat --exit-code -- "${dirs[@]}" || [[ -n "$untracked" ]]; then
    [[ -z "$untracked" ]] || printf 'regenerate: new untracked file: %s\n' $untracked >&2
    if ((changed_by_run == 0)) && [[ -n "$dirty_before" ]]; then
        echo "regenerate: FAILED: the fixtures differ from the committed ones (listed above), but these" \
             "differences were already in the working tree before this run (uncommitted edits) and regeneration" \
             "reproduced the working tree byte for byte: commit them (or restore them) and run again" >&2
    else
        echo "regenerate: FAILED: the regenerated fixtures differ from the committed ones (listed above): the" \
             "generators do not reproduce them; the versions.json diffs show the package versions of this run" >&2
    fi
    status=1
elif ((changed_by_run)); then
    say "note: the files listed above had uncommitted edits; regeneration replaced them with the committed" \
        "bytes (the edited copies are in $before)"
fi
if ((status == 0)); then
    say "OK: ${names[*]} regenerated byte-identical to the committed fixtures in $((SECONDS - start)) s"
fi
exit "$status"
