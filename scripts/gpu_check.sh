#!/usr/bin/env bash
# One prepared run for a machine with a GPU, built to fit a 15-minute device budget (about 7
# minutes on one H200, plus at most 4 for the frameworks comparison) and to fail loudly rather
# than report a CPU run as a GPU one. A failed check does not end the run (a first contact
# should bring back every measurement it can): it is listed at the end, and the exit status is 1.
# Only a machine that cannot run the GPU path at all (no GPU, a CPU-only build) stops it early.
#   machine facts -> build (refused if CPU-only) -> every test (refused if a CUDA test is
#   skipped) -> benchmarks -> training on cuda:0,0 (and cuda:0,1 with two GPUs) killed with
#   SIGKILL and resumed, checksums compared with an uninterrupted run and a cuda_graph run -> with two GPUs and
#   mpirun, two nodes over NCCL against one node -> PyTorch and JAX side by side.
# Everything goes to $OUT (the device tool's folder) or build/gpu-check. Works without network
# and without the Fashion-MNIST package (a small generated IDX dataset stands in).
#   scripts/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-build/gpu-check}
mkdir -p "$out"
log="$out/check.log"
: >"$log"
step() { echo "=== $* (+${SECONDS}s, $(date +%T))" | tee -a "$log"; }
fail() {  # nothing more can be learnt on this machine
    echo "FAIL: $*" | tee -a "$log"
    exit 1
}
failures=()
check_failed() {  # recorded, listed at the end; the run goes on
    echo "FAIL: $*" | tee -a "$log"
    failures+=("$*")
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
[[ $gpus -ge 1 ]] || fail "no GPU visible (nvidia-smi -L lists none)"
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
grep -q "^cuda:0 " "$out/devices.txt" || fail "build/mirrored sees no GPU"

step "tests (per-test durations in tests.log)"
timeout 420 build/mirrored_tests --duration=true >"$out/tests.log" 2>&1
rc=$?
tail -3 "$out/tests.log" | tee -a "$log"
[[ $rc -eq 124 ]] && check_failed "the tests did not finish within 420 s"
# On a one-GPU machine the distinct-GPU cases may say they need two, and not running as root the
# thread-limit case that it needs root; nothing else may skip.
skipped=$(grep "^SKIPPED" "$out/tests.log" | grep -v -e "needs 2 or more GPUs" -e "needs root and a user 'nobody'" || true)
[[ -n "$skipped" ]] && { echo "$skipped" | tee -a "$log"; check_failed "CUDA tests were skipped on a GPU machine"; }
if [[ $rc -ne 0 ]]; then
    [[ $rc -ne 124 ]] && check_failed "tests failed (exit $rc); see tests.log"
    # A crash or a hang ends the suite at the case that caused it: each CUDA/NCCL case once more on
    # its own, so that one bad kernel does not hide how the others fare (at most 240 s in all).
    step "CUDA test cases one at a time (tests-isolated.log)"
    deadline=$((SECONDS + 240))
    : >"$out/tests-isolated.log"
    while IFS= read -r name; do
        left=$((deadline - SECONDS))
        if [[ $left -le 5 ]]; then echo "NOT RUN (time): $name" >>"$out/tests-isolated.log"; continue; fi
        # doctest splits filters at commas; a wildcard stands in for each
        timeout $((left < 60 ? left : 60)) build/mirrored_tests -tc="${name//,/*}" >"$out/case.log" 2>&1
        case_rc=$?
        verdict=PASS
        [[ $case_rc -eq 124 ]] && verdict=TIMEOUT
        [[ $case_rc -ne 0 && $case_rc -ne 124 ]] && verdict="FAIL (exit $case_rc)"
        [[ $case_rc -gt 128 && $case_rc -ne 124 ]] && verdict="CRASH (signal $((case_rc - 128)))"
        echo "$verdict: $name" >>"$out/tests-isolated.log"
        [[ $verdict == PASS ]] || { echo "--- $name" >>"$out/tests-failed-cases.log"; tail -n 60 "$out/case.log" >>"$out/tests-failed-cases.log"; }
    done < <(build/mirrored_tests --list-test-cases 2>/dev/null | sed -n '/^=====/,/^=====/p' | grep -v '^=====' |
             grep -iE "cuda|nccl")
    rm -f "$out/case.log"
    grep -c "^PASS" "$out/tests-isolated.log" | sed 's/$/ CUDA\/NCCL case(s) passed alone/' | tee -a "$log"
    grep -v "^PASS" "$out/tests-isolated.log" | tee -a "$log"
fi

data_env=()
if [[ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz && -z "${MIRRORED_DATA_DIR:-}" ]]; then
    python3 scripts/make_idx_dataset.py "$out/idx" >>"$log" 2>&1 || fail "could not generate the IDX dataset"
    data_env=(MIRRORED_DATA_DIR="$out/idx")
    echo "Fashion-MNIST not installed: training on the generated IDX dataset in $out/idx" | tee -a "$log"
fi

step "benchmarks (bench.log, *.json)"
bench="$out/bench.log"
: >"$bench"
run() {
    echo "\$ $*" >>"$bench"
    timeout 120 "$@" >>"$bench" 2>&1 || echo "(exit $?)" >>"$bench"
    echo >>"$bench"
}
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
run build/mirrored plan configs/synthetic_mlp.yaml --gpu h200 --gpus 1,2,4,8 --profile "$out/scale/scaling.json"
tail -n 80 "$bench" >>"$log"

# Train, kill with SIGKILL mid-run, resume; the replica checksums must equal an uninterrupted run's.
resume_check() {
    local devices=$1 dir="$out/train-${1//[:,]/_}"
    local args=(train configs/fashion_mnist_mlp.yaml --devices "$devices" --set train.epochs=3
                --set checkpoint.every_steps=100)
    local t0=$SECONDS
    env "${data_env[@]}" timeout 120 build/mirrored "${args[@]}" --output "$dir/ref" >"$dir.ref.log" 2>&1 ||
        { check_failed "training on $devices failed (see $dir.ref.log)"; return; }
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
        -np 1 -x CUDA_VISIBLE_DEVICES=1 build/mirrored "${nodes_args[@]}" --output "$out/nodes2x1" >"$out/nodes.log" 2>&1 ||
        { check_failed "the two-node run failed (see nodes.log)"; return; }
    env "${data_env[@]}" timeout 120 build/mirrored train configs/fashion_mnist_mlp.yaml --set train.epochs=1 \
        --devices cuda:0,1 --output "$out/nodes1x2" >>"$out/nodes.log" 2>&1 || { check_failed "the one-node run failed"; return; }
    a=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['replica_checksums'])" "$out/nodes2x1/summary.json")
    b=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['replica_checksums'])" "$out/nodes1x2/summary.json")
    echo "2 nodes x cuda:0: $a / 1 node x cuda:0,1: $b" | tee -a "$log"
    [[ "$a" == "$b" ]] || check_failed "two nodes over NCCL differ from one node with two GPUs"
}
if [[ $gpus -ge 2 ]] && command -v mpirun >/dev/null && ldd build/mirrored | grep -q libmpi; then two_nodes; fi

# Side by side with PyTorch (eager, CUDA graph) and JAX on this GPU; informative, time-boxed.
step "frameworks side by side (frameworks.log)"
timeout 240 python3 scripts/bench_vs_frameworks.py --rounds 1 --steps 200 --json "$out/frameworks.json" \
    >"$out/frameworks.log" 2>&1 || echo "(frameworks benchmark: exit $?)" | tee -a "$log"
tail -n 16 "$out/frameworks.log" >>"$log"
if [[ ${#failures[@]} -gt 0 ]]; then
    step "done: ${#failures[@]} check(s) failed"
    printf 'FAILED: %s\n' "${failures[@]}" | tee -a "$log"
    exit 1
fi
step "done: all checks passed"
