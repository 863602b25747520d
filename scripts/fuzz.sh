#!/usr/bin/env bash
# Runs a fuzz target (tests/fuzz/targets.h) for a while: libFuzzer with ASan + UBSan, starting
# from the seed corpus (tests/fuzz/corpus/TARGET) and the kept regressions. New inputs collect in
# build-fuzz/work/TARGET (not in the repository); a crash, leak or timeout is written to
# build-fuzz/findings/TARGET/ and the script fails. Copy a finding into
# tests/fuzz/regressions/TARGET/ once fixed: the test suite replays it from then on.
#   scripts/fuzz.sh TARGET|all SECONDS [RUNS]     e.g. scripts/fuzz.sh idx 600
# RUNS caps the executions (libFuzzer -runs). "all" runs one target per core at a time; each
# target's line says ok or FINDING with its statistics.
set -uo pipefail
cd "$(dirname "$0")/.."
targets=${1:?usage: scripts/fuzz.sh TARGET|all SECONDS [RUNS]}
seconds=${2:?usage: scripts/fuzz.sh TARGET|all SECONDS [RUNS]}
runs=${3:--1}
[[ $targets == all ]] && targets=$(make -s fuzz-targets)  # tests/fuzz/targets.h lists them
command -v clang++ >/dev/null || scripts/install_deps.sh --fuzz || exit 1
make -s fuzz >/dev/null || { echo "fuzz: the build failed (make fuzz)"; exit 1; }
for t in $targets; do
    [[ -x build-fuzz/fuzz_$t ]] || { echo "fuzz: no target '$t' (tests/fuzz/targets.h lists them)"; exit 2; }
done

# fuzz_one TARGET: one libFuzzer run; its verdict (and a finding's first lines) in build-fuzz/TARGET.result
fuzz_one() {
    local t=$1 log="build-fuzz/$1.log" result="build-fuzz/$1.result"
    mkdir -p "build-fuzz/work/$t" "build-fuzz/findings/$t"
    local dirs=("build-fuzz/work/$t" "tests/fuzz/corpus/$t")
    [[ -d tests/fuzz/regressions/$t ]] && dirs+=("tests/fuzz/regressions/$t")
    "build-fuzz/fuzz_$t" "${dirs[@]}" -max_total_time="$seconds" -runs="$runs" -timeout=10 -rss_limit_mb=2560 \
        -max_len=65536 -artifact_prefix="build-fuzz/findings/$t/" -print_final_stats=1 >"$log" 2>&1
    local rc=$? execs speed cov corpus
    execs=$(sed -nE 's/^stat::number_of_executed_units: *([0-9]+)/\1/p' "$log" | tail -1)
    speed=$(sed -nE 's/^stat::average_exec_per_sec: *([0-9]+)/\1/p' "$log" | tail -1)
    cov=$(grep -oE 'cov: [0-9]+ ft: [0-9]+' "$log" | tail -1)
    corpus=$(ls "build-fuzz/work/$t" | wc -l)
    if [[ $rc -eq 0 ]]; then
        echo "fuzz $t: ok, ${execs:-?} executions (${speed:-?}/s), $cov, $corpus new corpus inputs" >"$result"
    else
        { echo "fuzz $t: FINDING (exit $rc) after ${execs:-?} executions; see $log and build-fuzz/findings/$t/"
          grep -E "ERROR|SUMMARY|runtime error|==[0-9]+==" "$log" | head -5; } >"$result"
    fi
}

# one target per core at a time (libFuzzer runs one thread), verdicts in the targets' order
jobs=$(nproc)
for t in $targets; do
    rm -f "build-fuzz/$t.result"
    while (($(jobs -rp | wc -l) >= jobs)); do wait -n; done
    fuzz_one "$t" &
done
wait
status=0
for t in $targets; do
    if [[ -f build-fuzz/$t.result ]]; then cat "build-fuzz/$t.result"; else echo "fuzz $t: FINDING (no verdict)"; fi
    grep -q "^fuzz $t: ok" "build-fuzz/$t.result" 2>/dev/null || status=1
done
exit $status
