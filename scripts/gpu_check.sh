#!/usr/bin/env bash
# One prepared run for a machine with a GPU, built to fit one device command (600 s; the budget
# is GPU_CHECK_SECONDS, 570 by default) inside a 15-minute device session, and to fail loudly
# rather than report a CPU run as a GPU one. A failed check does not end the run (a first contact
# should bring back every measurement it can): it is listed at the end, and the exit status is 1.
# Only a machine that cannot run the GPU path at all (no GPU, a CPU-only build) stops it early.
# Correctness before speed:
#   machine facts -> build (refused if CPU-only) -> every CUDA/NCCL test case on its own (a
#   skip is a failure), then the rest of the suite -> training on cuda:0,0 (and cuda:0,1 with two
#   GPUs) killed with SIGKILL and resumed, checksums compared with an uninterrupted run and a
#   cuda_graph run -> with two GPUs and mpirun, two nodes over NCCL against one node ->
#   benchmarks, as many as the budget allows -> PyTorch and JAX side by side (at most 240 s).
# Everything goes to $OUT (the device tool's folder) or build/gpu-check. Works without network
# and without the Fashion-MNIST package (a small generated IDX dataset stands in).
# GPU_CHECK_DRY_RUN=1 runs it on a machine without a GPU, as a check of the script itself: the
# GPU steps then fail as they must (exit 5, "no GPU"), but a command the CLI refuses as misused
# (exit 2: an unknown option, a bad value) is reported, here as on a GPU - a typo must not cost a
# GPU session. The frameworks comparison is left out.
#   scripts/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-build/gpu-check}
# The device tool stops a command at 600 s; the order below puts correctness before speed, and
# the benchmarks stop starting once the budget (less the frameworks' 240 s) is spent.
budget_s=${GPU_CHECK_SECONDS:-570}
dry_run=${GPU_CHECK_DRY_RUN:-0}
mkdir -p "$out"
log="$out/check.log"
: >"$log"
step() { echo "=== $* (+${SECONDS}s, $(date +%T))" | tee -a "$log"; }
fail() {  # nothing more can be learnt on this machine
    echo "FAIL: $*" | tee -a "$log"
    exit 1
}
no_gpu() {  # fatal, except in a dry run
    if [[ $dry_run == 1 ]]; then echo "dry run: $* (going on)" | tee -a "$log"; else fail "$*"; fi
}
failures=()
check_failed() {  # recorded, listed at the end; the run goes on
    echo "FAIL: $*" | tee -a "$log"
    failures+=("$*")
}
misused=0
note_misuse() {  # note_misuse EXIT_STATUS WHAT: exit 2 is the CLI refusing a command line of this script
    if [[ $1 -eq 2 ]]; then
        check_failed "refused as misused (exit 2): $2"
        misused=$((misused + 1))
    fi
}

step "machine"
{
    nvidia-smi
    nvidia-smi topo -m
    nvidia-smi --query-gpu=index,name,driver_version,memory.total,compute_cap,pcie.link.gen.max --format=csv
    "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" --version
    g++ --version | head -1
    ls -l /usr/lib/x86_64-linux-gnu/libnccl* "${CUDA_HOME:-/usr/local/cuda}"/lib64/libnccl* 2>/dev/null
    nproc
    free -g
} >"$out/machine.txt" 2>&1
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
[[ $gpus -ge 1 ]] || no_gpu "no GPU visible (nvidia-smi -L lists none)"
[[ $dry_run == 1 ]] && gpus=2  # every command line of the two-GPU branches is checked too
echo "GPUs: $gpus" | tee -a "$log"

step "build"
[[ -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ]] || fail "no nvcc under ${CUDA_HOME:-/usr/local/cuda}: the build would be CPU-only"
make -j"$(nproc)" all >"$out/build.log" 2>&1 || {
    tail -40 "$out/build.log" | tee -a "$log"
    fail "build failed"
}
grep -q "CPU-only" "$out/build.log" && fail "the build is CPU-only"
build/mirrored --version 2>&1 | tee "$out/version.txt" | tee -a "$log"
build/mirrored devices 2>&1 | tee "$out/devices.txt" | tee -a "$log"
grep -q "^cuda:0 " "$out/devices.txt" || no_gpu "build/mirrored sees no GPU"

# The CUDA/NCCL cases first, each on its own: a crash or a hang in one must not hide how the
# others fare (per case 60 s, 240 s in all). Then the rest of the suite in one run.
step "CUDA test cases one at a time (tests-cuda.log; the failing ones' output in tests-failed-cases.log)"
deadline=$((SECONDS + 240))
: >"$out/tests-cuda.log"
cuda_cases=$(build/mirrored_tests --list-test-cases 2>/dev/null | sed -n '/^=====/,/^=====/p' | grep -v '^=====' |
             grep -iE "cuda|nccl")
while IFS= read -r name; do
    [[ -z $name ]] && continue
    left=$((deadline - SECONDS))
    if [[ $left -le 5 ]]; then echo "NOT RUN (time): $name" >>"$out/tests-cuda.log"; continue; fi
    # doctest splits filters at commas; a wildcard stands in for each
    # stdin closed: mpirun, which some cases start, would read the rest of the case list
    timeout $((left < 60 ? left : 60)) build/mirrored_tests -tc="${name//,/*}" >"$out/case.log" 2>&1 </dev/null
    case_rc=$?
    verdict=PASS
    [[ $case_rc -eq 124 ]] && verdict=TIMEOUT
    [[ $case_rc -ne 0 && $case_rc -ne 124 ]] && verdict="FAIL (exit $case_rc)"
    [[ $case_rc -gt 128 && $case_rc -ne 124 ]] && verdict="CRASH (signal $((case_rc - 128)))"
    # On a one-GPU machine the distinct-GPU cases may say they need two; nothing else may skip.
    if [[ $verdict == PASS ]] && grep "^SKIPPED" "$out/case.log" | grep -qv "needs 2 or more GPUs"; then
        verdict="SKIPPED ($(grep "^SKIPPED" "$out/case.log" | head -1 | sed 's/.*: //'))"
    fi
    echo "$verdict: $name" >>"$out/tests-cuda.log"
    [[ $verdict == PASS ]] || { echo "--- $name" >>"$out/tests-failed-cases.log"; tail -n 60 "$out/case.log" >>"$out/tests-failed-cases.log"; }
done <<<"$cuda_cases"
rm -f "$out/case.log"
grep -c "^PASS" "$out/tests-cuda.log" | sed 's/$/ CUDA\/NCCL case(s) passed/' | tee -a "$log"
grep -v "^PASS" "$out/tests-cuda.log" | tee -a "$log"
grep -qv "^PASS" "$out/tests-cuda.log" && check_failed "CUDA/NCCL cases failed, crashed, hung or were skipped (tests-cuda.log)"

step "the rest of the suite (tests.log, per-test durations)"
if [[ $dry_run == 1 ]]; then
    echo "dry run: left out (CI runs it)" | tee -a "$log"
else
    timeout 240 build/mirrored_tests --duration=true -tce="*cuda*,*nccl*" >"$out/tests.log" 2>&1
    rc=$?
    tail -3 "$out/tests.log" | tee -a "$log"
    # A case skipped for want of the GPU fails the check. The image may lack what other cases
    # need (MPI, libxsmm, the Fashion-MNIST package, root for mounts): listed, not failed.
    skipped=$(grep "^SKIPPED" "$out/tests.log" || true)
    gpu_skipped=$(grep -F "no CUDA device (" <<<"$skipped" || true)  # the reason tests/helpers.h gives
    other_skipped=$(grep -vF -e "no CUDA device (" -e "needs 2 or more GPUs" <<<"$skipped" || true)
    [[ -n "$other_skipped" ]] && { echo "skipped for what this image lacks (not a GPU matter):"; echo "$other_skipped"; } | tee -a "$log"
    [[ -n "$gpu_skipped" ]] && { echo "$gpu_skipped" | tee -a "$log"; check_failed "tests were skipped for want of the GPU"; }
    [[ $rc -eq 124 ]] && check_failed "the rest of the suite did not finish within 240 s"
    [[ $rc -ne 0 && $rc -ne 124 ]] && check_failed "tests failed (exit $rc); see tests.log"
fi

data_env=()
if [[ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz && -z "${MIRRORED_DATA_DIR:-}" ]]; then
    python3 scripts/make_idx_dataset.py "$out/idx" >>"$log" 2>&1 || fail "could not generate the IDX dataset"
    data_env=(MIRRORED_DATA_DIR="$out/idx")
    echo "Fashion-MNIST not installed: training on the generated IDX dataset in $out/idx" | tee -a "$log"
fi

# Train, kill with SIGKILL mid-run, resume; the replica checksums must equal an uninterrupted run's.
resume_check() {
    local devices=$1 dir="$out/train-${1//[:,]/_}"
    local args=(train configs/fashion_mnist_mlp.yaml --devices "$devices" --set train.epochs=3
                --set checkpoint.every_steps=100)
    local t0=$SECONDS
    env "${data_env[@]}" timeout 120 build/mirrored "${args[@]}" --output "$dir/ref" >"$dir.ref.log" 2>&1 </dev/null ||
        { note_misuse $? "training on $devices"; check_failed "training on $devices failed (see $dir.ref.log)"; return; }
    local half
    half=$(python3 -c "print(max(0.5, ($SECONDS - $t0) / 2))")  # kill about half-way through
    env "${data_env[@]}" build/mirrored "${args[@]}" --output "$dir/killed" >"$dir.killed.log" 2>&1 &
    local pid=$!
    sleep "$half"
    kill -9 $pid 2>/dev/null && echo "$devices: killed after ${half}s" | tee -a "$log"
    wait $pid 2>/dev/null
    env "${data_env[@]}" timeout 120 build/mirrored "${args[@]}" --output "$dir/killed" >>"$dir.killed.log" 2>&1 ||
        { check_failed "resuming on $devices failed (see $dir.killed.log)"; return; }
    local a b
    a=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['replica_checksums'])" "$dir/ref/summary.json")
    b=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['replica_checksums'])" "$dir/killed/summary.json")
    cp "$dir/ref/summary.json" "$out/summary-${devices//[:,]/_}.json"
    echo "$devices: uninterrupted $a / killed+resumed $b" | tee -a "$log"
    tail -n 2 "$dir.ref.log" | tee -a "$log"
    [[ "$a" == "$b" ]] || check_failed "resume on $devices is not bit-identical"
    # the same run from captured graphs must end with the same parameters
    env "${data_env[@]}" timeout 120 build/mirrored "${args[@]}" --set strategy.cuda_graph=true --output "$dir/graph" \
        >"$dir.graph.log" 2>&1 || { check_failed "training on $devices with cuda_graph failed (see $dir.graph.log)"; return; }
    b=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['replica_checksums'])" "$dir/graph/summary.json")
    echo "$devices: uncaptured $a / cuda_graph $b" | tee -a "$log"
    tail -n 1 "$dir.graph.log" | tee -a "$log"
    [[ "$a" == "$b" ]] || check_failed "cuda_graph on $devices is not bit-identical to uncaptured steps"
    rm -rf "$dir"
}
step "train, SIGKILL, resume"
resume_check cuda:0,0
[[ $gpus -ge 2 ]] && resume_check cuda:0,1

# Two nodes on one machine (NCCL between the processes needs a GPU each: two GPUs and mpirun):
# 2 processes x cuda:0 (each its own GPU) must train bit-identically to one process on cuda:0,1.
two_nodes() {
    step "two nodes over NCCL (nodes.log)"
    nodes_args=(train configs/fashion_mnist_mlp.yaml --set train.epochs=1 --devices cuda:0)
    env "${data_env[@]}" timeout 180 mpirun --allow-run-as-root --oversubscribe \
        -np 1 -x CUDA_VISIBLE_DEVICES=0 build/mirrored "${nodes_args[@]}" --output "$out/nodes2x1" : \
        -np 1 -x CUDA_VISIBLE_DEVICES=1 build/mirrored "${nodes_args[@]}" --output "$out/nodes2x1" >"$out/nodes.log" 2>&1 </dev/null ||
        { note_misuse $? "the two-node run"; check_failed "the two-node run failed (see nodes.log)"; return; }
    env "${data_env[@]}" timeout 120 build/mirrored train configs/fashion_mnist_mlp.yaml --set train.epochs=1 \
        --devices cuda:0,1 --output "$out/nodes1x2" >>"$out/nodes.log" 2>&1 || { check_failed "the one-node run failed"; return; }
    a=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['replica_checksums'])" "$out/nodes2x1/summary.json")
    b=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['replica_checksums'])" "$out/nodes1x2/summary.json")
    echo "2 nodes x cuda:0: $a / 1 node x cuda:0,1: $b" | tee -a "$log"
    [[ "$a" == "$b" ]] || check_failed "two nodes over NCCL differ from one node with two GPUs"
}
if [[ $gpus -ge 2 ]] && command -v mpirun >/dev/null && ldd build/mirrored | grep -q libmpi; then two_nodes; fi

step "benchmarks (bench.log, *.json)"
bench="$out/bench.log"
: >"$bench"
run() {  # one benchmark, at most 120 s, none once the budget is spent (the frameworks keep their 240 s)
    echo "\$ $*" >>"$bench"
    local left=$((budget_s - 240 - SECONDS))
    if [[ $left -lt 20 ]]; then
        echo "(not run: the time budget is spent)" >>"$bench"
        skipped_benchmarks=$((skipped_benchmarks + 1))
        return
    fi
    timeout $((left < 120 ? left : 120)) "$@" >>"$bench" 2>&1 </dev/null
    local rc=$?
    [[ $rc -ne 0 ]] && echo "(exit $rc)" >>"$bench"
    note_misuse $rc "$* (bench.log)"
    echo >>"$bench"
}
skipped_benchmarks=0
run build/mirrored bench-gemm --device cuda:0 --sizes 256,1024,4096 --json "$out/gemm.json"
run build/mirrored bench-gemm --device cuda:0 --sizes 1024,4096 --tf32 --json "$out/gemm_tf32.json"
for t in direct staged; do
    run build/mirrored bench-allreduce --devices cuda:0,0,0,0 --op ring --max-bytes 256M --transport $t \
        --json "$out/allreduce_shared_$t.json"
done
run build/mirrored bench-allreduce --devices cuda:0,0,0,0 --op reduce_to_one --max-bytes 256M
run build/mirrored bench-allreduce --devices cuda:0,0,0,0 --op direct --max-bytes 256M --json "$out/allreduce_shared_direct.json"
run build/mirrored bench-step configs/synthetic_mlp.yaml --devices 'cuda:0,0,0,0' --steps 300 --layers 20 \
    --set strategy.cross_device_ops=direct
if [[ $gpus -ge 2 ]]; then
    for op in ring direct nccl reduce_to_one; do
        run build/mirrored bench-allreduce --devices cuda:all --op $op --max-bytes 256M --json "$out/allreduce_$op.json"
    done
    run build/mirrored bench-allreduce --devices cuda:all --op ring --max-bytes 256M --transport staged
fi
run build/mirrored bench-step configs/synthetic_mlp.yaml --devices 'cuda:0;cuda:0,0;cuda:0,0,0,0' --steps 300 \
    --json "$out/step.json"
run build/mirrored bench-step configs/synthetic_mlp.yaml --devices 'cuda:0' --steps 300 --set train.precision=tf32
# strategy.cuda_graph (off by default until measured here): captured steps against uncaptured, in
# one run each, and its host calls per replica and step (last column)
for g in false true; do
    run build/mirrored bench-step configs/synthetic_mlp.yaml --devices 'cuda:0;cuda:0,0,0,0' --steps 300 \
        --set strategy.cuda_graph=$g --set strategy.cross_device_ops=direct --json "$out/step_graph_$g.json"
    run build/mirrored bench-step configs/synthetic_mlp.yaml --devices 'cuda:0' --steps 300 --set train.precision=tf32 \
        --set strategy.cuda_graph=$g
done
# strategy.fused_epilogues (off by default until measured here): bias and ReLU in cuBLASLt's GEMMs,
# unfused against fused, uncaptured and captured, batch 256 and 2048; --layers: where the step's
# device time goes, layer by layer, with each layer's GEMM rate
for f in false true; do
    run build/mirrored bench-step configs/synthetic_mlp.yaml --devices 'cuda:0' --steps 300 --layers 20 \
        --set strategy.fused_epilogues=$f --json "$out/step_fused_$f.json"
    run build/mirrored bench-step configs/synthetic_mlp.yaml --devices 'cuda:0' --steps 300 --set train.precision=tf32 \
        --set strategy.cuda_graph=true --set strategy.fused_epilogues=$f
    run build/mirrored bench-step configs/synthetic_mlp.yaml --devices 'cuda:0' --steps 300 --set train.global_batch_size=2048 \
        --set strategy.cuda_graph=true --set strategy.fused_epilogues=$f
done
run env "${data_env[@]}" build/mirrored bench-loader --threads 1,2,4,8 --json "$out/loader.json"
run build/mirrored bench-allreduce --devices cuda:0,0,0,0 --op ring --max-bytes 64M --dtype bf16
run build/mirrored bench-conv-layout
# the scaling test with the planner's prediction beside it, the links' stress test, and a plan
# from the profile measured here
kind=cuda-shared
[[ $gpus -ge 2 ]] && kind=cuda
run build/mirrored scale configs/synthetic_mlp.yaml --kind $kind --steps 100 --out "$out/scale"
run env "${data_env[@]}" build/mirrored scale configs/fashion_mnist_cnn.yaml --kind $kind --replicas 1,2 --steps 60 \
    --out "$out/scale_cnn"
# ResNet-20 (configs/cifar10_resnet20.yaml on synthetic CIFAR-shaped data, as the CPU comparison
# makes it): the convolutions' first GPU numbers, layer by layer, fp32 and bf16
resnet=$(python3 -c "import sys; sys.path.insert(0, 'scripts'); import bench_cpu_vs_pytorch as b; \
print(b.resnet20_synthetic_config(sys.argv[1]))" "$out")
for p in fp32 bf16; do
    run build/mirrored bench-step "$resnet" --devices 'cuda:0' --steps 100 --layers 10 --set train.precision=$p \
        --json "$out/step_resnet20_$p.json"
done
run build/mirrored bench-allreduce --devices "$([[ $gpus -ge 2 ]] && echo cuda:all || echo cuda:0,0,0,0)" \
    --max-bytes 64M --duration 30s --json "$out/stress.json"
[[ -f "$out/scale/scaling.json" ]] &&  # not when the scaling test failed (that failure is reported)
    run build/mirrored plan configs/synthetic_mlp.yaml --gpu h200 --gpus 1,2,4,8 --profile "$out/scale/scaling.json"
tail -n 80 "$bench" >>"$log"
[[ $skipped_benchmarks -gt 0 ]] && echo "$skipped_benchmarks benchmark(s) not run: the time budget was spent (bench.log)" | tee -a "$log"

# Side by side with PyTorch (eager, CUDA graph) and JAX on this GPU; informative, time-boxed.
step "frameworks side by side (frameworks.log)"
left=$((budget_s - SECONDS))
if [[ $dry_run == 1 ]]; then
    echo "dry run: the frameworks comparison is left out" | tee -a "$log"
elif [[ $left -ge 60 ]]; then
    timeout $((left < 240 ? left : 240)) python3 scripts/bench_vs_frameworks.py --rounds 1 --steps 200 \
        --json "$out/frameworks.json" >"$out/frameworks.log" 2>&1 || echo "(frameworks benchmark: exit $?)" | tee -a "$log"
    tail -n 16 "$out/frameworks.log" >>"$log"
else
    echo "frameworks comparison not run: ${left} s of the budget left" | tee -a "$log"
fi
if [[ $dry_run == 1 ]]; then  # only the script's own faults count: the GPU steps had to fail here
    step "dry run done: $misused command line(s) refused as misused"
    [[ $misused -eq 0 ]] || exit 1
    exit 0
fi
if [[ ${#failures[@]} -gt 0 ]]; then
    step "done: ${#failures[@]} check(s) failed"
    printf 'FAILED: %s\n' "${failures[@]}" | tee -a "$log"
    exit 1
fi
step "done: all checks passed"
