#!/usr/bin/env bash
# Fuzzes the readers (issue 16) with cargo-fuzz (libFuzzer): each target in fuzz/ runs for a
# bounded time, from the committed seeds (fuzz/seeds/<target>) and the working corpus
# (fuzz/corpus/<target>, git-ignored). A crash stops the script with the input saved under
# fuzz/artifacts/<target>/; turn it into a regression test (docs/fuzzing.md).
#
#   tools/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]    default: 60 s, every target
#   tools/fuzz.sh --smoke                             5 s each (the test command's check)
#   FUZZ_RUNS=10000000 tools/fuzz.sh 0 TARGET         a fixed number of executions instead
#   FUZZ_SANITIZER=none                               no AddressSanitizer (2-3x the executions;
#                                                     the code under test is safe Rust)
#   FUZZ_MAX_LEN=4096                                 longest input (default 1 MiB)
#
# Installs cargo-fuzz if missing.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=60
if [[ "${1:-}" == "--smoke" ]]; then
    seconds=5
    shift
elif [[ "${1:-}" =~ ^[0-9]+$ ]]; then
    seconds=$1
    shift
fi
targets=("$@")
if ((${#targets[@]} == 0)); then
    targets=(safetensors pth config tokenizer speech_request voice_clip)
fi

# libFuzzer's instrumentation takes -Z flags: the nightly toolchain where the machine has one,
# else the stable one told to accept them.
toolchain=(+nightly)
if ! rustup run nightly rustc --version >/dev/null 2>&1; then
    echo "fuzz: no nightly toolchain; using stable with RUSTC_BOOTSTRAP=1"
    toolchain=()
    export RUSTC_BOOTSTRAP=1
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz: installing cargo-fuzz"
    cargo install --locked cargo-fuzz@0.13.2 >/dev/null
fi

# cargo-fuzz's default build: release, debug assertions, AddressSanitizer.
cd fuzz
mkdir -p logs
for target in "${targets[@]}"; do
    mkdir -p "corpus/$target"
    limit=(-max_total_time="$seconds")
    if [[ -n "${FUZZ_RUNS:-}" ]]; then
        limit=(-runs="$FUZZ_RUNS")
    fi
    if [[ -n "${FUZZ_RUNS:-}" ]]; then what="$FUZZ_RUNS runs"; else what="$seconds s"; fi
    echo "== fuzz $target ($what, ${FUZZ_SANITIZER:-address} sanitizer, inputs up to ${FUZZ_MAX_LEN:-1048576} bytes)"
    log="logs/$target-${FUZZ_SANITIZER:-address}.log"
    # -malloc_limit_mb: one allocation of 256 MB from an input of at most 1 MiB is a memory bomb,
    # not work (a reference clip's resampling filter was one); libFuzzer can see single
    # allocations under AddressSanitizer only.
    memory=(-rss_limit_mb=4096 -malloc_limit_mb=256)
    if [[ $target == voice_clip ]]; then
        # The server decodes clips in a child process limited to 2 GiB and 30 s of CPU
        # (voice::isolated): a file that makes symphonia allocate more (the m4a-* seeds ask for
        # 16-64 GB) or spin longer is refused there, by design. So here only those limits count,
        # and libFuzzer's fork mode records such inputs as OOMs and timeouts and goes on; a panic
        # or a failed assertion still stops it.
        memory=(-rss_limit_mb=3072 -malloc_limit_mb=2048 -fork=1 -ignore_ooms=1 -ignore_timeouts=1)
    fi
    # One build folder per sanitizer: a smoke run (address) and a campaign (none) do not rebuild
    # each other's binaries.
    if ! cargo "${toolchain[@]}" fuzz run --sanitizer "${FUZZ_SANITIZER:-address}" \
        --target-dir "target/${FUZZ_SANITIZER:-address}" "$target" "corpus/$target" "seeds/$target" -- "${limit[@]}" \
        -print_final_stats=1 -max_len="${FUZZ_MAX_LEN:-1048576}" "${memory[@]}" -timeout=30 >"$log" 2>&1; then
        tail -n 60 "$log" >&2
        echo "fuzz: $target failed; the input is under fuzz/artifacts/$target/ (log: fuzz/$log)" >&2
        exit 1
    fi
    grep -a "cov: " "$log" | tail -n 1
    # Fork mode prints no final stats: its last status line counts the executions (#N).
    grep -aE "^stat::(number_of_executed_units|average_exec_per_sec|peak_rss_mb)" "$log" || true
done
echo "fuzz: every target ran clean"
