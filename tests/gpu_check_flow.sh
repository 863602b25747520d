#!/usr/bin/env bash
# scripts/gpu_check.sh's whole control flow on one emulated GPU (the CUDA backend's own code on the
# CPU: build-emu/, which make test-cuda-emu builds), its budget scaled down and its work shrunk (a
# tiny MLP, a few test cases, 3 timed steps): what a first GPU session depends on, proven here.
#   clean      exits 0; $OUT holds summary.txt, gpu_check.json and logs.tar.gz (at most 8 files);
#              every phase ran in order within the budget; a case that runs elsewhere is listed,
#              not failed; the kill-and-resume checks are bit-identical; a target figure is read
#   gpu fault  a GPU fault in every process (MIRRORED_CUDA_EMU_FAULT): exit 1 naming the checks
#   hang       a case over its cap (GPU_CHECK_CASE_SECONDS=1): exit 1 naming it a timeout
#   no GPU     the binaries see no GPU: exit 1 from the preflight, the report still written
#   no library the binaries need a library the machine lacks: exit 1, the preflight names it
#   pack       the GPU machine's layout: the tree as the device tool copies it, gpu-pack/ beside it
#              (the emulated binaries), no build/; a PyTorch that says it has a GPU: exits 0, every
#              phase (the frameworks table's mirrored rows too) ran the packed binaries
#   stub torch a PyTorch whose every measurement fails: the peers' failures are notes in the
#              frameworks table, never the check's failure; exits 0
# Ends with "N passed, N failed" (one per scenario).
#   tests/gpu_check_flow.sh [EMULATED_BUILD_DIR] [CPU_BUILD_DIR]
set -uo pipefail
cd "$(dirname "$0")/.."
emu=${1:-build-emu}
cpu=${2:-build}
if [[ ! -x $emu/mirrored || ! -x $emu/mirrored_tests ]]; then
    echo "gpu_check_flow: no emulated build in $emu/ (make test-cuda-emu builds it)"
    echo "0 passed, 1 failed"
    exit 1
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check-flow.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
cat >"$tmp/tiny.yaml" <<'EOF'
run: {name: tiny, seed: 1, output_dir: runs/tiny}
strategy: {devices: auto, cross_device_ops: ring, bucket_mb: 4, shared_parameters: true}
data: {dataset: synthetic, input_shape: [16], classes: 4, train_samples: 2048, test_samples: 256, prefetch: 2}
model:
  layers:
    - {type: dense, units: 32, activation: relu}
    - {type: dense, units: 4}
optimizer: {type: sgd, lr: 0.02, momentum: 0.9}
train: {epochs: 1, global_batch_size: 64, log_every_steps: 10}
checkpoint: {every_steps: 0, keep: 3, resume: auto}
EOF
cat >"$tmp/tiny_gpt.yaml" <<'EOF'
run: {name: tiny_gpt, seed: 1, output_dir: runs/tiny_gpt}
strategy: {devices: auto}
data: {dataset: synthetic, input_shape: [8], vocab: 32, train_samples: 256, test_samples: 16}
model:
  layers:
    - {type: embedding, vocab: 32, dim: 16}
    - {type: position_embedding, max_len: 8}
    - {type: transformer_block, heads: 2}
    - {type: transformer_block, heads: 2}
    - {type: layernorm}
    - {type: lm_head}
optimizer: {type: adamw, lr: 0.001}
train: {epochs: 0, steps: 10, global_batch_size: 8, precision: bf16, log_every_steps: 5}
checkpoint: {every_steps: 0, resume: never}
EOF
# A PyTorch that says it has a GPU and fails at everything else, as a broken install would: enough
# for gpu_check.sh to run the frameworks table (bench_vs_frameworks.py), whose peers then fail.
mkdir -p "$tmp/stub_torch/torch"
cat >"$tmp/stub_torch/torch/__init__.py" <<'EOF'
class cuda:
    @staticmethod
    def is_available():
        return True

    @staticmethod
    def get_device_name(index=0):
        return "stub GPU (tests/gpu_check_flow.sh)"


def __getattr__(name):
    raise AttributeError(f"the stub torch has no {name}")
EOF
passed=0
failed=0
skipped=0
tree=.  # the checkout gpu_check.sh runs in (pack: a copy laid out as on the GPU machine)
# flow NAME EXPECTED_EXIT [VAR=VALUE...]: gpu_check.sh in $tmp/NAME with the scaled knobs
flow() {
    local name=$1 want=$2 rc
    shift 2
    mkdir -p "$tmp/$name"
    env MIRRORED_CUDA_EMU_GPUS=1 OUT="$tmp/$name/out" GPU_CHECK_WORK="$tmp/$name/work" GPU_CHECK_BIN="$emu" \
        GPU_CHECK_MLP_CONFIG="$tmp/tiny.yaml" GPU_CHECK_GPT_CONFIG="$tmp/tiny_gpt.yaml" \
        GPU_CHECK_TRAIN_CONFIG="$tmp/tiny.yaml" GPU_CHECK_TRAIN_STEPS=12 \
        GPU_CHECK_STEPS=3 GPU_CHECK_STEP_TIMEOUT=30 GPU_CHECK_BYTES=1M GPU_CHECK_GEMM_SIZES=64,128 \
        GPU_CHECK_STRESS_SECONDS=2 GPU_CHECK_FRAMEWORK_ARGS="--batches 16 --precisions fp32 --warmup 2" \
        GPU_CHECK_CASES="cuda gemm*,cuda flat ops*,cuda all-reduce across distinct GPUs*" "$@" \
        "$tree/scripts/gpu_check.sh" >"$tmp/$name/stdout" 2>&1
    rc=$?
    echo "== $name: exit $rc (expected $want)"
    sed 's/^/   /' "$tmp/$name/out/summary.txt" 2>/dev/null | head -40
    [[ $rc -eq $want ]]
}
# verdict NAME PYTHON_CHECK: the scenario passes when the check (python over its outputs) says ok
verdict() {
    local name=$1
    if python3 - "$tmp/$name/out" <<'EOF'; then
import json, os, sys, tarfile
out = sys.argv[1]
files = sorted(os.listdir(out))
problems = []
if len(files) > 4:
    problems.append(f"{len(files)} files in $OUT: {files}")
for f in ("summary.txt", "gpu_check.json", "logs.tar.gz", "nvidia-smi.txt"):
    if f not in files:
        problems.append(f"no {f}")
r = json.load(open(os.path.join(out, "gpu_check.json")))
checks = r["checks"]
summary = open(os.path.join(out, "summary.txt")).read()
names = tarfile.open(os.path.join(out, "logs.tar.gz")).getnames()
if "logs/check.log" not in names:
    problems.append("no check.log in the tarball")
phases = ["build", "preflight", "cases", "targets", "resume", "rest"]
order = [phases.index(c["phase"]) for c in checks]
if order != sorted(order):
    problems.append("the phases ran out of order")
starts = [c["start_s"] for c in checks]
if starts != sorted(starts):
    problems.append("the checks started out of order")
if r["elapsed_s"] > r["budget_s"] + 3:
    problems.append(f"{r['elapsed_s']} s for a budget of {r['budget_s']}")
for ph in phases:  # once the budget stops a phase, nothing later in it starts
    st = [c["status"] for c in checks if c["phase"] == ph]
    stopped = [i for i, s in enumerate(st) if s in ("not run", "cut")]
    if stopped and any(s not in ("not run", "cut", "absent") for s in st[stopped[0]:]):
        problems.append(f"{ph}: a check ran after the budget stopped the phase")
def status(check):
    return [c["status"] for c in checks if c["check"] == check]
def failed_in(phase):
    return [c for c in checks if c["phase"] == phase and c["status"] in ("fail", "timeout", "crash", "refused", "skipped")]
scenario = os.path.basename(os.path.dirname(out))
if scenario == "clean":
    if r["failed"]:
        problems.append(f"{r['failed']} failed")
    for ph in ("preflight", "cases", "targets", "resume"):
        if not any(c["phase"] == ph and c["status"] == "pass" for c in checks):
            problems.append(f"nothing passed in {ph}")
    if not any(c["status"] == "elsewhere" and "distinct GPUs" in c["check"] for c in checks):
        problems.append("the distinct-GPU case was not listed as running elsewhere")
    for check in ("ring: bit-identical after the resume", "shared: bit-identical after the resume",
                  "ring: captured equals uncaptured", "step_gpt_fused_attention_false",
                  "step_gpt_fused_attention_true"):
        if status(check) != ["pass"]:
            problems.append(f"{check}: {status(check)}")
    if not any(t["measured"] is not None for t in r["targets"]):
        problems.append("no target figure measured")
elif scenario == "fault":
    if not failed_in("cases") or not failed_in("targets"):
        problems.append("the fault failed no case or no benchmark")
    if "FAILED:" not in summary or "[cases]" not in summary:
        problems.append("the summary names no failed check")
elif scenario == "hang":
    if not any(c["phase"] == "cases" and c["status"] == "timeout" for c in checks):
        problems.append("no case reported as a timeout")
    if "timeout: " not in summary:
        problems.append("the summary does not name the timeout")
elif scenario == "nolib":
    if status("libraries") != ["fail"] or "libmirrored_flow_probe.so" not in summary:
        problems.append("the preflight did not name the missing library")
    if any(c["phase"] != "preflight" for c in checks):
        problems.append("checks ran without their libraries")
elif scenario in ("pack", "torch"):
    if r["failed"]:
        problems.append(f"{r['failed']} failed: " + "; ".join(f"{c['check']} ({c['detail']})" for c in failed_in("preflight")
                        + failed_in("cases") + failed_in("targets") + failed_in("resume") + failed_in("rest")))
    if status("frameworks side by side") != ["pass"]:
        problems.append(f"frameworks side by side: {status('frameworks side by side')}")
    table = r["benchmarks"].get("frameworks", {})
    rows = table.get("rows", [])
    if not rows or any(not row["us"]["mirrored"] for row in rows):
        problems.append("the frameworks table has no mirrored time in some row")
    if not rows or any("torch-eager" not in row["errors"] for row in rows):
        problems.append("the stub torch's failures are not noted in the table")
    if scenario == "pack":
        if not any(n.endswith("pack-manifest.txt") for n in names):
            problems.append("gpu_check.sh did not take the packed binaries (no pack-manifest.txt)")
        if r["running"] is not None:
            problems.append(f"the final report still says running {r['running']}")
elif scenario == "nogpu":
    if status("GPU") != ["fail"] or any(c["phase"] != "preflight" for c in checks):
        problems.append("the preflight did not stop the run at the GPU check")
for p in problems:
    print("   problem:", p)
sys.exit(1 if problems else 0)
EOF
        echo "ok $name"
        passed=$((passed + 1))
    else
        echo "FAILED $name"
        failed=$((failed + 1))
    fi
}
scenario() {  # scenario NAME EXPECTED_EXIT [VAR=VALUE...]
    local name=$1
    if flow "$@"; then
        verdict "$name"
    else
        echo "FAILED $name (its output: $tmp/$name/stdout)"
        tail -n 20 "$tmp/$name/stdout"
        failed=$((failed + 1))
    fi
}
scenario clean 0 GPU_CHECK_SECONDS=90
scenario fault 1 GPU_CHECK_SECONDS=40 MIRRORED_CUDA_EMU_FAULT=0:20
scenario hang 1 GPU_CHECK_SECONDS=30 GPU_CHECK_CASE_SECONDS=1 GPU_CHECK_CASES="cuda: SIGKILL at an arbitrary moment*"
# binaries that need a library no machine has (built here, then the library removed)
mkdir -p "$tmp/nolib"
echo 'int mirrored_flow_probe(void) { return 0; }' >"$tmp/probe.c"
if gcc -shared -fPIC -o "$tmp/libmirrored_flow_probe.so" "$tmp/probe.c" &&
    echo 'int mirrored_flow_probe(void); int main(void) { return mirrored_flow_probe(); }' |
    gcc -x c - -o "$tmp/nolib/mirrored" -L"$tmp" -lmirrored_flow_probe; then
    cp "$tmp/nolib/mirrored" "$tmp/nolib/mirrored_tests"
    rm "$tmp/libmirrored_flow_probe.so"
    scenario nolib 1 GPU_CHECK_SECONDS=30 GPU_CHECK_BIN="$tmp/nolib"
else
    echo "FAILED nolib: could not build the probe binaries with gcc"
    failed=$((failed + 1))
fi
# the GPU machine's layout: the tree as the device tool copies it (tracked files and untracked ones
# git does not ignore), gpu-pack/ beside it holding the binaries, and no build/
tree=$tmp/pack/tree
mkdir -p "$tree/gpu-pack/bin" "$tree/gpu-pack/lib"
git ls-files -co --exclude-standard -z | while IFS= read -r -d '' f; do [[ -f $f ]] && printf '%s\0' "$f"; done |
    tar -c --null -T - | tar -x -C "$tree"
cp "$emu/mirrored" "$emu/mirrored_tests" "$tree/gpu-pack/bin/"
echo "commit $(git rev-parse HEAD) (the emulated build, tests/gpu_check_flow.sh)" >"$tree/gpu-pack/MANIFEST"
if [[ -e $tree/build || ! -x $tree/scripts/gpu_check.sh ]]; then
    echo "FAILED pack: the copied tree is not laid out as on the GPU machine"
    failed=$((failed + 1))
else
    scenario pack 0 GPU_CHECK_SECONDS=120 GPU_CHECK_BIN= PYTHONPATH="$tmp/stub_torch" \
        GPU_CHECK_CASES="cuda gemm only on the compute stream*" \
        GPU_CHECK_ONLY='^(cuda gemm only|step_b256_fp32|ring: |frameworks)' 
fi
tree=.
scenario torch 0 GPU_CHECK_SECONDS=90 PYTHONPATH="$tmp/stub_torch" GPU_CHECK_ONLY='^frameworks' 
if [[ -x $cpu/mirrored && -x $cpu/mirrored_tests ]] && ! "$cpu/mirrored" devices 2>/dev/null | grep -q '^cuda:0 '; then
    scenario nogpu 1 GPU_CHECK_SECONDS=30 GPU_CHECK_BIN="$cpu"
else
    echo "SKIPPED: no GPU: needs a build in $cpu/ that sees no GPU"
    skipped=1
fi
echo "$passed passed, $failed failed$([[ $skipped -gt 0 ]] && echo ", $skipped skipped")"
[[ $failed -eq 0 ]]
