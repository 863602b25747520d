# Sourced by .ci/run and tests/cuda_emu/run_suites.sh: the counts of a test log's summary line.
# summary_counts LOG: from LOG's last "N passed, N failed[, N skipped]" line, sets summary_passed,
# summary_failed and summary_skipped (0 when the line names none); status 1 when LOG has no such line.
summary_counts() {
    local line
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$1" | tail -n 1)
    [[ -n "$line" ]] || return 1
    summary_passed=$(sed -E 's/^([0-9]+) passed.*/\1/' <<<"$line")
    summary_failed=$(sed -E 's/^[0-9]+ passed, ([0-9]+) failed.*/\1/' <<<"$line")
    summary_skipped=$(sed -nE 's/.*, ([0-9]+) skipped.*/\1/p' <<<"$line")
    summary_skipped=${summary_skipped:-0}
}
