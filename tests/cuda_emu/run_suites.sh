#!/usr/bin/env bash
# make test-cuda-emu's runs of the emulated build's tests: the suites on eager streams (work runs
# when it is issued), then the same tests but the emulator's own once more on asynchronous streams
# (MIRRORED_CUDA_EMU_ASYNC, default newest: work runs later and out of issue order, so a missing
# event wait or a host read before its copy shows; tests/cuda_emu/README.md). Ends with one line
# "N passed, N failed[, N skipped]" over both runs; exit 1 when either failed.
# Usage: run_suites.sh TEST_BINARY [DOCTEST_FILTERS...]
set -uo pipefail
source "$(dirname "$0")/../../scripts/test_summary.sh"
binary=$1
shift
passed=0 failed=0 skipped=0

run() {  # run LABEL COMMAND...: adds the command's summary line to the totals
    local label=$1 log status
    shift
    log=$(mktemp)
    echo "== $label"
    "$@" 2>&1 | tee "$log"
    status=${PIPESTATUS[0]}
    if ! summary_counts "$log"; then
        rm -f "$log"
        echo "$label: no summary (exit status $status)"
        failed=$((failed + 1))
        return
    fi
    rm -f "$log"
    local f=$summary_failed
    [[ $status -ne 0 && $f -eq 0 ]] && f=1
    passed=$((passed + summary_passed))
    failed=$((failed + f))
    skipped=$((skipped + summary_skipped))
}

order=${MIRRORED_CUDA_EMU_ASYNC:-newest}
MIRRORED_CUDA_EMU_ASYNC=0 run "eager streams" "$binary" "$@"
MIRRORED_CUDA_EMU_ASYNC=$order run "asynchronous streams ($order)" "$binary" "$@" -tse=emulator
printf '%d passed, %d failed' "$passed" "$failed"
[[ $skipped -gt 0 ]] && printf ', %d skipped' "$skipped"
printf '\n'
[[ $failed -eq 0 ]]
