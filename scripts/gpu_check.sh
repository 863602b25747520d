#!/usr/bin/env bash
# The one prepared command for a machine with a GPU (no network, nothing installable, one command
# of at most 600 s; of its output folder at most 8 files come back). Prepared here, then one call:
#   scripts/gpu_pack.sh                    # here: gpu-pack/ (binaries for sm_90 + PTX, their libraries)
#   run  command: bash scripts/gpu_check.sh   carry: ["gpu-pack"]   timeout_s: 600
# (docs/GPU_CHECK.md). The default budget, 480 s, leaves 120 s of the call for the machine's
# start and the copies back, or for a rerun of a few cases on the warm machine. It runs, in the
# order of what they settle, each phase stopping at its share of the budget (GPU_CHECK_SECONDS):
#   build (35%)        only when no binaries came along (scripts/gpu_pack.sh makes them here)
#   preflight (10 s)   every library the binaries load (ldd; a missing one is searched for and
#                      named), the driver, the runtime, the GPU; nothing runs without a GPU
#   cases (35%)        each test case of the doctest suite `cuda` in its own process; a case that
#                      can only run elsewhere says "runs elsewhere: ..." and is listed, not failed
#   targets (20%)      the benchmarks that settle the GPU targets: the MLP at batch 256 and 2048 in
#                      fp32/tf32/bf16, uncaptured and captured; 4 replicas sharing GPU 0 at 512
#                      against 1 at 2048 (direct); cuBLAS GEMM rates; GPT-2 small's shape in bf16,
#                      attention unfused and fused
#   resume (15%)       train, killed (SIGKILL) while writing the checkpoint of a known step with
#                      checkpoints before it, resumed: bit-identical to an uninterrupted run, on the
#                      ring and on shared parameters (and from captured graphs)
#   rest               every other benchmark while time remains, PyTorch and JAX side by side last
#                      (information: a peer that is missing or fails never fails the check)
# What comes back in $OUT (4 files): summary.txt (also printed: each check, each target figure
# beside its goal), gpu_check.json (every check and number), logs.tar.gz (every log), nvidia-smi.txt
# (what the machine says of its GPUs). The first three are rewritten as each phase ends, so a
# check killed by the call's limit still returns what it had. Generated data and run folders stay
# in the work folder (GPU_CHECK_WORK, a fresh /tmp folder by default).
# Every command is bounded (timeout -k), training runs also by strategy.step_timeout_s. A failed
# check does not stop the run; the exit status is 1 when any failed, 0 when none did.
# GPU_CHECK_DRY_RUN=1, on a machine without a GPU: the GPU steps fail as they must, and only a
# command line the CLI refuses as misused (exit 2) fails the run - a typo must not cost a GPU session.
# Knobs for a smaller run (tests/gpu_check_flow.sh runs the whole flow on emulated GPUs with them):
# GPU_CHECK_BIN (folder of mirrored and mirrored_tests), GPU_CHECK_STEPS (timed steps per
# benchmark, 300), GPU_CHECK_MLP_CONFIG, GPU_CHECK_GPT_CONFIG, GPU_CHECK_TRAIN_CONFIG, GPU_CHECK_TRAIN_STEPS (400),
# GPU_CHECK_CASES (a doctest -tc filter), GPU_CHECK_CASE_SECONDS (60), GPU_CHECK_BYTES (256M),
# GPU_CHECK_GEMM_SIZES (1024,4096), GPU_CHECK_STRESS_SECONDS (30), GPU_CHECK_FRAMEWORK_ARGS (more
# arguments of scripts/bench_vs_frameworks.py, e.g. "--batches 16 --precisions fp32 --warmup 2"),
# GPU_CHECK_ONLY (an extended regular expression: only the test cases and the checks of the
# targets, resume and rest phases whose names match run, e.g. '^frameworks' for the side-by-side
# table alone on a rerun; the build and the preflight always run).
#   scripts/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-build/gpu-check}
budget_s=${GPU_CHECK_SECONDS:-480}
dry_run=${GPU_CHECK_DRY_RUN:-0}
steps=${GPU_CHECK_STEPS:-300}
mlp=${GPU_CHECK_MLP_CONFIG:-configs/synthetic_mlp.yaml}
gpt=${GPU_CHECK_GPT_CONFIG:-configs/gpt2_small_synthetic.yaml}
train_cfg=${GPU_CHECK_TRAIN_CONFIG:-configs/fashion_mnist_mlp.yaml}
train_steps=${GPU_CHECK_TRAIN_STEPS:-400}
case_filter=${GPU_CHECK_CASES:-}
case_s=${GPU_CHECK_CASE_SECONDS:-60}
step_timeout_s=${GPU_CHECK_STEP_TIMEOUT:-60}
bytes=${GPU_CHECK_BYTES:-256M}                 # all-reduce benchmarks: the largest message
gemm_sizes=${GPU_CHECK_GEMM_SIZES:-1024,4096}
stress_s=${GPU_CHECK_STRESS_SECONDS:-30}
read -ra framework_args <<<"${GPU_CHECK_FRAMEWORK_ARGS:-}"
only=${GPU_CHECK_ONLY:-}
left_out=0  # checks GPU_CHECK_ONLY did not name
if [[ -n $only ]]; then
    [[ "" =~ $only ]]
    [[ $? -eq 2 ]] && { echo "gpu_check.sh: GPU_CHECK_ONLY='$only' is not an extended regular expression" >&2; exit 2; }
fi
# left_out_by_only PHASE NAME: true when GPU_CHECK_ONLY leaves this check out (counted)
left_out_by_only() {
    [[ -n $only && $1 != build && $1 != preflight && ! $2 =~ $only ]] || return 1
    left_out=$((left_out + 1))
}
work=${GPU_CHECK_WORK:-$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")}
for n in budget_s steps train_steps case_s step_timeout_s stress_s; do
    [[ ${!n} =~ ^[1-9][0-9]*$ ]] || { echo "gpu_check.sh: $n must be a positive integer, not '${!n}'" >&2; exit 2; }
done
[[ $train_steps -ge 8 ]] || { echo "gpu_check.sh: GPU_CHECK_TRAIN_STEPS must be at least 8" >&2; exit 2; }
mkdir -p "$out" "$work/logs" "$work/bench" "$work/runs"
for f in summary.txt gpu_check.json logs.tar.gz nvidia-smi.txt; do rm -f "$out/$f" "$out/$f.new"; done  # its own only
logs=$work/logs
main_log=$logs/check.log
checks=$work/checks.tsv  # phase, check, status, start (s), seconds, detail
: >"$main_log"
: >"$checks"
reserve_s=$((budget_s / 25 > 3 ? budget_s / 25 : 3))  # for the report at the end (19 s of 480)
min_start_s=$((budget_s * 3 / 100 > 3 ? budget_s * 3 / 100 : 3))  # nothing starts with less left
hard_end=$((budget_s - reserve_s))
failures=0
misused=0

say() { echo "$*" | tee -a "$main_log"; }
# report PHASE_RUNNING: summary.txt, gpu_check.json and logs.tar.gz as they stand (bounded: the
# budget holds); "" once the check has ended
report() {
    timeout -k 1 10 python3 scripts/gpu_check_report.py --work "$work" --out "$out" --budget "$budget_s" \
        --elapsed "$SECONDS" --dry-run "$dry_run" ${1:+--running "$1"} >>"$main_log" 2>&1
    local rc=$?
    timeout -k 1 10 tar -czf "$out/logs.tar.gz.new" -C "$work" logs 2>/dev/null && mv -f "$out/logs.tar.gz.new" "$out/logs.tar.gz"
    return $rc
}
# phase NAME PERCENT: the next checks may run until PERCENT of the budget from now (or the end);
# what the phases before it found is in $OUT first
phase() {
    [[ -n ${phase_name:-} ]] && report "$1"
    phase_name=$1
    phase_end=$((SECONDS + budget_s * $2 / 100))
    [[ $phase_end -gt $hard_end ]] && phase_end=$hard_end
    say "=== $1 (+${SECONDS}s of ${budget_s}s, until +${phase_end}s)"
}
left() { echo $((phase_end - SECONDS)); }
# record CHECK STATUS START DETAIL: one row of the report. Failing statuses: fail, timeout (a
# command's own cap ran out: a hang), crash, refused (exit 2: a command line of this script is
# wrong), skipped (a skip that does not say it runs elsewhere). Not failing: pass, elsewhere (a case
# declared it runs on other machines), cut and "not run" (the budget's end), absent (this machine
# lacks what an optional comparison needs).
record() {
    local detail=${4//$'\t'/ }
    detail=${detail//$'\n'/ }
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$phase_name" "$1" "$2" "$3" "$((SECONDS - $3))" "$detail" >>"$checks"
    echo "[$phase_name] $2: $1${detail:+ ($detail)}" >>"$main_log"
    case $2 in
        fail | timeout | crash | refused | skipped)
            failures=$((failures + 1))
            [[ $dry_run == 1 ]] || echo "FAIL [$phase_name] $1${detail:+: $detail}"
            ;;
    esac
    [[ $2 == refused ]] && misused=$((misused + 1))
    return 0
}
# bounded SECONDS LOG COMMAND...: the command, its output appended to LOG, stopped at SECONDS
# (SIGTERM, then SIGKILL 5 s later); returns its exit status
bounded() {
    local s=$1 log=$2
    shift 2
    echo "\$ $* (at most ${s}s)" >>"$log"
    timeout -k 5 "$s" "$@" >>"$log" 2>&1 </dev/null
}
# status_of RC: the report's word for a command's exit status
status_of() {
    case $1 in
        0) echo pass ;;
        2) echo refused ;;
        124) echo timeout ;;
        13[0-9] | 14[0-9] | 15[0-9]) echo crash ;;
        *) echo fail ;;
    esac
}
# try CHECK CAP LOG COMMAND...: a command as one check, bounded by CAP and the phase's time left;
# try_expecting RC CHECK CAP LOG COMMAND...: the same for a command that must end with exit status RC
try() { try_expecting 0 "$@"; }
try_expecting() {
    local want=$1 name=$2 cap=$3 log=$4 t0=$SECONDS rc l status
    shift 4
    left_out_by_only "$phase_name" "$name" && return 99
    l=$(left)
    if [[ $l -lt $min_start_s ]]; then
        record "$name" "not run" "$t0" "${l}s of the phase left"
        return 99
    fi
    local limit=$((l < cap ? l : cap))
    bounded $limit "$log" "$@"
    rc=$?
    status=$(status_of $rc)
    if [[ $rc -eq $want ]]; then status=pass
    elif [[ $((SECONDS - t0)) -ge $limit && ($rc -eq 124 || $rc -eq 137) ]]; then
        # stopped by the clock: a hang when its own cap ran out, the budget's end otherwise
        status=timeout
        [[ $limit -lt $cap ]] && status=cut
    elif [[ $status == pass || $want -ne 0 ]]; then status=fail
    fi
    record "$name" "$status" "$t0" "$([[ $rc -ne $want ]] && echo "exit $rc, $([[ $want -ne 0 ]] && echo "expected $want, ")$(basename "$log")")"
    [[ $status == pass ]]
}
# finish: the report into $OUT, then the exit status
finish() {
    [[ $left_out -gt 0 ]] && record "GPU_CHECK_ONLY" absent "$SECONDS" "$left_out check(s) left out: only '$only' ran"
    phase_name=report
    report "" || { echo "the report could not be written (check.log)"; tail -5 "$main_log" >"$out/summary.txt"; }
    cat "$out/summary.txt"
    if [[ $dry_run == 1 ]]; then  # only the script's own faults count: the GPU steps had to fail here
        echo "dry run: $misused command line(s) refused as misused"
        [[ $misused -eq 0 ]] && exit 0
        exit 1
    fi
    [[ $failures -eq 0 ]] && exit 0
    exit 1
}

# --- the machine, first: what it says of itself comes back even when nothing else can run ---------
if command -v nvidia-smi >/dev/null; then
    bounded 5 "$logs/machine.txt" nvidia-smi --query-gpu=index,name,driver_version,memory.total,compute_cap \
        --format=csv
    bounded 5 "$logs/machine.txt" nvidia-smi topo -m
    bounded 5 "$out/nvidia-smi.txt" nvidia-smi
    bounded 5 "$out/nvidia-smi.txt" nvidia-smi topo -m
else
    echo "nvidia-smi: not on this machine" | tee -a "$logs/machine.txt" >"$out/nvidia-smi.txt"
fi
{
    echo "cores: $(nproc)"
    free -g | head -2
    grep PRETTY_NAME /etc/os-release
} >>"$logs/machine.txt" 2>&1

# --- which binaries: those packed here (scripts/gpu_pack.sh), else built on this machine --------
if [[ -n ${GPU_CHECK_BIN:-} ]]; then
    bin=$GPU_CHECK_BIN
elif [[ -x gpu-pack/bin/mirrored ]]; then
    bin=gpu-pack/bin
    export LD_LIBRARY_PATH=$PWD/gpu-pack/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    cp gpu-pack/MANIFEST "$logs/pack-manifest.txt"
elif [[ -x build/mirrored && -x build/mirrored_tests ]]; then
    bin=build
else
    phase build 35
    record "packed binaries" absent "$SECONDS" "no gpu-pack/ (scripts/gpu_pack.sh): building here"
    try "build here (make all)" 100000 "$logs/build.log" make -j"$(nproc)" all || finish
    bin=build
fi

# --- preflight: their libraries, the driver and the GPU -----------------------------------------
phase preflight 2
[[ $((phase_end - SECONDS)) -lt 10 ]] && phase_end=$((SECONDS + 10))
t0=$SECONDS
missing=$(ldd "$bin/mirrored" "$bin/mirrored_tests" 2>&1 | awk '/not found/ {print $1}' | sort -u)
if [[ -n $missing ]]; then  # look where the image may keep them (the CUDA toolkit, Python wheels)
    # Python wheels' nvidia/*/lib first (PyTorch's CUDA libraries), then the usual roots; found.txt
    # is written line by line, so a search cut by its timeout keeps what it had found
    mapfile -t site < <(timeout 3 python3 -c 'import site; print("\n".join(site.getsitepackages()))' 2>/dev/null)
    roots=("${site[@]}" /usr/local /usr/lib /opt)
    names=()
    for m in $missing; do names+=(-o -name "$m"); done
    timeout -k 1 5 stdbuf -oL find "${roots[@]}" \( "${names[@]:1}" \) -print >"$logs/found.txt" 2>/dev/null
    found=$(sort -u "$logs/found.txt")
    for d in $(xargs -rn1 dirname <<<"$found" | sort -u); do export LD_LIBRARY_PATH=$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}; done
    ldd "$bin/mirrored" "$bin/mirrored_tests" >"$logs/ldd.txt" 2>&1
    missing=$(awk '/not found/ {print $1}' "$logs/ldd.txt" | sort -u)
    [[ -n $found ]] && say "found elsewhere and added to LD_LIBRARY_PATH: $(tr '\n' ' ' <<<"$found")"
else
    ldd "$bin/mirrored" "$bin/mirrored_tests" >"$logs/ldd.txt" 2>&1
fi
if [[ -n $missing ]]; then
    record "libraries" fail "$t0" "missing: $(tr '\n' ' ' <<<"$missing")"
    [[ $dry_run == 1 ]] || finish
else
    record "libraries" pass "$t0" "every library found"
fi
t0=$SECONDS
bounded 10 "$logs/devices.txt" "$bin/mirrored" devices
rc=$?
gpus=$(grep -c '^cuda:[0-9]' "$logs/devices.txt")
gpu_line=$(grep -m1 '^cuda:0 ' "$logs/devices.txt")
runtime_line=$(grep -m1 -i 'CUDA runtime\|CPU-only' "$logs/devices.txt")
if [[ $rc -eq 0 && $gpus -ge 1 ]]; then
    record "GPU" pass "$t0" "$gpus GPU(s); $gpu_line; $runtime_line"
else
    record "GPU" fail "$t0" "$bin/mirrored devices lists no GPU (exit $rc): $runtime_line $(grep -m1 -i 'no nvidia\|driver' "$logs/devices.txt")"
    [[ $dry_run == 1 ]] || finish
    gpus=2  # a dry run checks the command lines of the two-GPU branches too
fi

# --- cases: the CUDA test cases, one process each ----------------------------------------------
phase cases 35
bounded 20 "$logs/case-list.txt" "$bin/mirrored_tests" -ts=cuda ${case_filter:+-tc="$case_filter"} --list-test-cases
mapfile -t cases < <(sed -n '/^=====/,/^=====/p' "$logs/case-list.txt" | grep -v '^=====')
[[ ${#cases[@]} -gt 0 ]] || record "the suite's case list" fail "$SECONDS" "none listed (case-list.txt)"
for name in "${cases[@]}"; do
    left_out_by_only cases "$name" && continue
    t0=$SECONDS
    l=$(left)
    if [[ $l -lt 3 ]]; then record "$name" "not run" "$t0" "the phase's time is spent"; continue; fi
    : >"$work/case.log"
    limit=$((l < case_s ? l : case_s))
    # doctest splits filters at commas: a wildcard stands in for each
    bounded $limit "$work/case.log" "$bin/mirrored_tests" -tc="${name//,/*}"
    rc=$?
    status=$(status_of $rc)
    detail=$([[ $rc -ne 0 ]] && echo "exit $rc")
    # stopped by the phase's end before its own cap: the budget's cut, not a hang (as try_expecting)
    if [[ ($rc -eq 124 || $rc -eq 137) && $limit -lt $case_s && $((SECONDS - t0)) -ge $limit ]]; then
        status=cut
        detail="the phase's time ran out after ${limit}s"
    fi
    skip=$(grep -m1 '^SKIPPED: ' "$work/case.log" | sed 's/^SKIPPED: .*: \(runs elsewhere: \)/\1/; s/^SKIPPED: .*: //')
    if [[ $status == pass && -n $skip ]]; then
        if [[ $skip == "runs elsewhere: "* ]]; then status=elsewhere; else status=skipped; fi
        detail=${skip#runs elsewhere: }
    fi
    record "$name" "$status" "$t0" "$detail"
    { echo "--- $name ($status)"; grep -v '^test seed\|^\[doctest\]\|^====' "$work/case.log"; } >>"$logs/cases.log"
    [[ $status == pass || $status == elsewhere || $status == cut ]] || { echo "--- $name ($status)"; tail -n 60 "$work/case.log"; } >>"$logs/cases-failed.log"
done
rm -f "$work/case.log"

# --- targets: the benchmarks that settle the GPU targets ----------------------------------------
# bench NAME CAP COMMAND...: a benchmark writing $work/bench/NAME.json (--json is added)
bench() {
    local name=$1 cap=$2
    shift 2
    try "$name" "$cap" "$logs/bench.log" "$@" --json "$work/bench/$name.json"
}
phase targets 20
bench_sets=(--set strategy.step_timeout_s="$step_timeout_s")
# first, being the newest: a language model, every block's attention as cuBLAS-batched products,
# then as the fused kernels
gpt_blocks=$(grep -c 'type: transformer_block' "$gpt")
for f in false true; do
    gpt_sets=()
    for ((k = 2; k < gpt_blocks + 2; ++k)); do gpt_sets+=(--set "model.layers.$k.fused_attention=$f"); done
    bench "step_gpt_fused_attention_$f" 90 "$bin/mirrored" bench-step "$gpt" --devices cuda:0 \
        --steps $((steps / 30 + 2)) --layers 2 "${gpt_sets[@]}" "${bench_sets[@]}"
done
for g in true false; do  # 4 replicas sharing GPU 0 at 512 each against 1 at 2048 (direct)
    bench "step_shared_4x512_graph_$g" 60 "$bin/mirrored" bench-step "$mlp" --devices 'cuda:0;cuda:0,0,0,0' \
        --steps "$steps" --set train.global_batch_size=2048 --set strategy.cross_device_ops=direct \
        --set strategy.cuda_graph=$g "${bench_sets[@]}"
done
for b in 256 2048; do
    for p in fp32 tf32 bf16; do
        for g in true false; do
            bench "step_b${b}_${p}_graph_$g" 60 "$bin/mirrored" bench-step "$mlp" --devices cuda:0 --steps "$steps" \
                --set train.global_batch_size=$b --set train.precision=$p --set strategy.cuda_graph=$g "${bench_sets[@]}"
        done
    done
done
for p in fp32 tf32 bf16; do
    bench "gemm_$p" 60 "$bin/mirrored" bench-gemm --device cuda:0 --sizes "$gemm_sizes" --precision $p
done

# --- resume: SIGKILL during a known step's checkpoint, then resume ------------------------------
phase resume 15
data_env=()
if grep -q 'dataset: *idx' "$train_cfg" && [[ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz &&
    -z ${MIRRORED_DATA_DIR:-} ]]; then
    try "generate an IDX dataset" 60 "$logs/resume.log" python3 scripts/make_idx_dataset.py "$work/data" \
        --train 20000 --test 2000 && data_env=(MIRRORED_DATA_DIR="$work/data")
fi
every=$((train_steps / 4))
kill_at=$((every * 3))
checksums() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['replica_checksums'])" "$1/summary.json" 2>/dev/null; }
# resume_check NAME DEVICES [--set K=V...]: uninterrupted, then killed while writing the
# checkpoint of step kill_at (every/2*every kept) and resumed; optionally from captured graphs too
resume_check() {
    local name=$1 devices=$2 dir=$work/runs/$1 t0 rc
    shift 2
    local args=(train "$train_cfg" --devices "$devices" --set train.steps="$train_steps"
                --set checkpoint.every_steps="$every" --set strategy.step_timeout_s="$step_timeout_s" "$@")
    local log=$logs/resume-$name.log
    try "$name: uninterrupted" 60 "$log" env "${data_env[@]}" "$bin/mirrored" "${args[@]}" --output "$dir/ref" || return
    try_expecting 137 "$name: killed at step $kill_at (SIGKILL while writing its checkpoint)" 60 "$log" \
        env "${data_env[@]}" MIRRORED_TEST_KILL_DURING_CHECKPOINT=$kill_at "$bin/mirrored" "${args[@]}" \
        --output "$dir/killed" || return
    try "$name: resumed" 60 "$log" env "${data_env[@]}" "$bin/mirrored" "${args[@]}" --output "$dir/killed" || return
    t0=$SECONDS
    local a b from
    a=$(checksums "$dir/ref")
    b=$(checksums "$dir/killed")
    from=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1])).get('resumed_from_step'))" "$dir/killed/summary.json" 2>/dev/null)
    if [[ -n $a && $a == "$b" && $from == $((kill_at - every)) ]]; then
        record "$name: bit-identical after the resume" pass "$t0" "resumed from step $from"
    else
        record "$name: bit-identical after the resume" fail "$t0" "resumed from step ${from:-?} (expected $((kill_at - every))); checksums $a / $b"
    fi
    if [[ ${graphs:-0} == 1 ]]; then
        try "$name: from captured graphs" 60 "$log" env "${data_env[@]}" "$bin/mirrored" "${args[@]}" \
            --set strategy.cuda_graph=true --output "$dir/graph" || return
        t0=$SECONDS
        b=$(checksums "$dir/graph")
        if [[ -n $a && $a == "$b" ]]; then record "$name: captured equals uncaptured" pass "$t0" ""
        else record "$name: captured equals uncaptured" fail "$t0" "checksums $a / $b"; fi
    fi
}
graphs=1 resume_check ring cuda:0,0 --set strategy.shared_parameters=false --set strategy.cross_device_ops=ring
resume_check shared cuda:0,0 --set strategy.shared_parameters=true
[[ $gpus -ge 2 ]] && graphs=1 resume_check two-gpus cuda:0,1 --set strategy.shared_parameters=false

# --- rest: every other measurement while time remains -------------------------------------------
phase rest 100
bench step_layers 90 "$bin/mirrored" bench-step "$mlp" --devices cuda:0 --steps "$steps" --layers 20 "${bench_sets[@]}"
for f in true false; do  # cuBLASLt epilogues: fused against unfused, where the time goes
    bench "step_fused_${f}_layers" 90 "$bin/mirrored" bench-step "$mlp" --devices cuda:0 --steps "$steps" --layers 20 \
        --set strategy.fused_epilogues=$f "${bench_sets[@]}"
    bench "step_b2048_fused_${f}_graph" 60 "$bin/mirrored" bench-step "$mlp" --devices cuda:0 --steps "$steps" \
        --set train.global_batch_size=2048 --set strategy.cuda_graph=true --set strategy.fused_epilogues=$f "${bench_sets[@]}"
done
for op in ring direct reduce_to_one; do
    bench "allreduce_shared_$op" 60 "$bin/mirrored" bench-allreduce --devices cuda:0,0,0,0 --op $op --max-bytes "$bytes"
done
bench allreduce_shared_ring_staged 60 "$bin/mirrored" bench-allreduce --devices cuda:0,0,0,0 --op ring --max-bytes "$bytes" \
    --transport staged
bench allreduce_shared_ring_bf16 60 "$bin/mirrored" bench-allreduce --devices cuda:0,0,0,0 --op ring --max-bytes "$bytes" --dtype bf16
if [[ $gpus -ge 2 ]]; then
    for op in ring direct nccl reduce_to_one; do
        bench "allreduce_$op" 60 "$bin/mirrored" bench-allreduce --devices cuda:all --op $op --max-bytes "$bytes"
    done
fi
bench step_replicas 90 "$bin/mirrored" bench-step "$mlp" --devices 'cuda:0;cuda:0,0;cuda:0,0,0,0' --steps "$steps" "${bench_sets[@]}"
resnet=
# helpers outside try are bounded too and start only while the phase has time: the budget holds
[[ $(left) -ge $min_start_s ]] && resnet=$(timeout -k 1 10 python3 -c "import sys; sys.path.insert(0, 'scripts'); \
import bench_cpu_vs_pytorch as b; print(b.resnet20_synthetic_config(sys.argv[1]))" "$work" 2>>"$main_log")
for p in fp32 bf16; do  # the convolutions' first GPU numbers, layer by layer
    [[ -n $resnet ]] && bench "step_resnet20_$p" 90 "$bin/mirrored" bench-step "$resnet" --devices cuda:0 \
        --steps $((steps / 3 + 1)) --layers 10 --set train.precision=$p "${bench_sets[@]}"
done
kind=cuda-shared
[[ $gpus -ge 2 ]] && kind=cuda
try scale 120 "$logs/bench.log" "$bin/mirrored" scale "$mlp" --kind $kind --steps $((steps / 3 + 1)) --out "$work/scale"
[[ -f $work/scale/scaling.json ]] && cp "$work/scale/scaling.json" "$work/bench/scaling.json" &&
    try plan 30 "$logs/bench.log" "$bin/mirrored" plan "$mlp" --gpu h200 --gpus 1,2,4,8 --profile "$work/scale/scaling.json"
bench stress 60 "$bin/mirrored" bench-allreduce --devices "$([[ $gpus -ge 2 ]] && echo cuda:all || echo cuda:0,0,0,0)" \
    --max-bytes "$bytes" --duration "${stress_s}s"
bench loader 60 env "${data_env[@]}" "$bin/mirrored" bench-loader --config "$train_cfg" --threads 1,2,4,8
try "conv layouts" 60 "$logs/bench.log" "$bin/mirrored" bench-conv-layout
if [[ $gpus -ge 2 ]] && command -v mpirun >/dev/null && ldd "$bin/mirrored" | grep -q libmpi; then
    # two processes with a GPU each over NCCL must train as one process on cuda:0,1
    nodes_args=(train "$train_cfg" --set train.steps="$train_steps" --devices cuda:0)
    try "two nodes over NCCL" 120 "$logs/nodes.log" env "${data_env[@]}" mpirun --allow-run-as-root --oversubscribe \
        -np 1 -x CUDA_VISIBLE_DEVICES=0 "$bin/mirrored" "${nodes_args[@]}" --output "$work/runs/nodes2x1" : \
        -np 1 -x CUDA_VISIBLE_DEVICES=1 "$bin/mirrored" "${nodes_args[@]}" --output "$work/runs/nodes2x1" &&
        try "one node, two GPUs" 60 "$logs/nodes.log" env "${data_env[@]}" "$bin/mirrored" train "$train_cfg" \
            --set train.steps="$train_steps" --devices cuda:0,1 --output "$work/runs/nodes1x2" && {
        t0=$SECONDS
        a=$(checksums "$work/runs/nodes2x1")
        b=$(checksums "$work/runs/nodes1x2")
        if [[ -n $a && $a == "$b" ]]; then record "two nodes equal one" pass "$t0" ""
        else record "two nodes equal one" fail "$t0" "checksums $a / $b"; fi
    }
fi
# PyTorch (eager, CUDA graph) and JAX on the same MLP, informative: the check fails only where
# mirrored's own rows of the table fail (the script's exit 1); a peer's failure is a note there
gemm_largest=$(tr ',' '\n' <<<"$gemm_sizes" | sort -n | tail -1)
if [[ $dry_run != 1 && $(left) -lt $min_start_s ]]; then
    record "frameworks side by side" "not run" "$SECONDS" "$(left)s of the phase left"
elif [[ $dry_run != 1 ]] && timeout -k 1 "$(($(left) < 30 ? $(left) : 30))" \
    python3 -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 3)" >/dev/null 2>&1; then
    try "frameworks side by side" 240 "$logs/frameworks.log" python3 scripts/bench_vs_frameworks.py --rounds 1 \
        --steps "$steps" --mirrored "$bin/mirrored" --gemm-size "$gemm_largest" "${framework_args[@]}" \
        --json "$work/bench/frameworks.json"
else
    record "frameworks side by side" absent "$SECONDS" "$([[ $dry_run == 1 ]] && echo "dry run" || echo "no PyTorch with a GPU here")"
fi
finish
