#!/usr/bin/env bash
# Every CPU number in docs/PERFORMANCE.md, measured in one run, one benchmark at a time (run it
# on an otherwise idle machine: the numbers are only as quiet as the machine). Writes each
# benchmark's output and JSON under OUT and prints a summary at the end.
#   scripts/bench_cpu.sh OUT [--quick] [--cnn]
#     --quick  fewer rounds and steps (a smoke run of the script itself, numbers not for the docs)
#     --cnn    also the Fashion-MNIST CNN in fp32, bf16 and fp16 (20 epochs each: about 30-40 min)
#              and the CNN and ResNet-20 against PyTorch (about 7 min more)
# Needs a built build/mirrored; the PyTorch comparison needs python3-torch (skipped without).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/bench_cpu.sh OUT [--quick] [--cnn]}
shift
quick=0 cnn=0
for a in "$@"; do
    case $a in
    --quick) quick=1 ;;
    --cnn) cnn=1 ;;
    *) echo "bench_cpu: unknown option '$a' (known: --quick, --cnn)"; exit 2 ;;
    esac
done
[[ -x build/mirrored ]] || { echo "bench_cpu: build/mirrored is missing: run make first"; exit 1; }
mkdir -p "$out"
py=/usr/bin/python3
[[ -x $py ]] || py=python3
rounds=5 steps=1500 train_runs=3 ar_iters="" scale_steps=200
[[ $quick == 1 ]] && rounds=1 steps=200 train_runs=1 ar_iters="--iters 20" scale_steps=20

step() {  # step NAME COMMAND...: runs one benchmark, its output in OUT/NAME.txt
    local name=$1
    shift
    echo "== $name: $*"
    "$@" >"$out/$name.txt" 2>&1
    local rc=$?
    [[ $rc == 0 ]] || echo "   failed (exit $rc): see $out/$name.txt"
    return 0
}

step machine bash -c 'date -u; uname -m; lscpu | grep -E "Model name|^CPU\(s\)|Thread|L2|L3"; build/mirrored devices'
step gemm build/mirrored bench-gemm --sizes 128,256,512,1024 --json "$out/gemm.json"
if $py -c 'import torch, numpy' 2>/dev/null; then
    peer=()
    [[ -f ../shared/reference/pytorch_cpu_peer.py ]] && peer=(--peer-script ../shared/reference/pytorch_cpu_peer.py)
    step vs_pytorch $py scripts/bench_cpu_vs_pytorch.py --rounds $rounds --steps $steps --also-env-kernel \
        "${peer[@]}" --json "$out/vs_pytorch.json"
else
    echo "== vs_pytorch: skipped (python3-torch or python3-numpy missing)"
fi
# `make train` as a user runs it: the whole run, start-up and evaluation included
data_env=()
if [[ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz && -z ${MIRRORED_DATA_DIR:-} ]]; then
    $py scripts/make_idx_dataset.py "$out/idx" >/dev/null && data_env=(MIRRORED_DATA_DIR="$out/idx")
fi
for i in $(seq 1 $train_runs); do
    step "train_$i" env "${data_env[@]}" /usr/bin/time -f "process wall time %e s" build/mirrored train configs/fashion_mnist_mlp.yaml --output "$out/train_$i" \
        --set checkpoint.resume=never
done
for op in ring direct reduce_to_one; do
    step "allreduce_$op" build/mirrored bench-allreduce --devices cpu:2 --op $op --min-bytes 4K --max-bytes 64M $ar_iters \
        --json "$out/allreduce_$op.json"
done
step loader env "${data_env[@]}" build/mirrored bench-loader --threads 1,2 --json "$out/loader.json"
step conv_layout build/mirrored bench-conv-layout --json "$out/conv_layout.json"
for cfg in synthetic_mlp fashion_mnist_mlp; do
    step "scale_$cfg" env "${data_env[@]}" build/mirrored scale configs/$cfg.yaml --kind cpu --replicas 1,2 \
        --steps $scale_steps --out "$out/scale_$cfg"
done
# the planner against measurements: the validation test, with its predicted/measured lines
[[ -x build/mirrored_tests ]] && step planner build/mirrored_tests -tc="planner validated*" -s
if [[ $cnn == 1 ]] && $py -c 'import torch, numpy' 2>/dev/null; then
    conv_rounds=3
    [[ $quick == 1 ]] && conv_rounds=1
    step vs_pytorch_cnn $py scripts/bench_cpu_vs_pytorch.py --model cnn --rounds $conv_rounds --steps 150 --warmup 20 \
        --json "$out/vs_pytorch_cnn.json"
    step vs_pytorch_resnet20 $py scripts/bench_cpu_vs_pytorch.py --model resnet20 --rounds $conv_rounds --steps 40 \
        --warmup 5 --json "$out/vs_pytorch_resnet20.json"
fi
if [[ $cnn == 1 ]]; then
    for p in fp32 bf16 fp16; do
        step "cnn_$p" env "${data_env[@]}" /usr/bin/time -f "process wall time %e s" build/mirrored train configs/fashion_mnist_cnn.yaml --output "$out/cnn_$p" \
            --set checkpoint.resume=never --set train.precision=$p
    done
fi

echo
echo "== summary ($out)"
for f in "$out"/vs_pytorch*.txt; do
    [[ -f $f ]] || continue
    echo "-- $(basename "$f" .txt)"
    grep -hE "^(vs|ratio|mirrored|pytorch|cpu:2)" "$f" | head -20
done
for f in "$out"/train_*/summary.json "$out"/cnn_*/summary.json; do
    [[ -f $f ]] || continue
    $py - "$f" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
print(f"{sys.argv[1]}: test accuracy {s['test_accuracy']:.4f}, {s['samples_per_sec']:.0f} samples/s, "
      f"training {s['train_time_s']:.1f} s, peak memory {s['peak_memory_bytes'] / 2**20:.1f} MiB")
EOF
done
grep -h "process wall time" "$out"/train_*.txt "$out"/cnn_*.txt 2>/dev/null
grep -hE "replicas:|->" "$out"/scale_*.txt 2>/dev/null | head -10
grep -hE "predicted" "$out"/planner.txt 2>/dev/null | sed 's/^.*MESSAGE: *//' | head -10
