#!/usr/bin/env bash
# One prepared run for a machine with a GPU: build, every test, the benchmarks, and the default
# training run. Logs go to $OUT (the device tool's folder) or build/gpu-check; at most a few
# files, so they all come back. Fashion-MNIST is read from $MIRRORED_DATA_DIR when set (e.g. a
# carried .fmnist folder on an image without the dataset package).
#   scripts/gpu_check.sh            everything (about 5 minutes on one H200)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-build/gpu-check}
mkdir -p "$out"
log="$out/check.log"
bench="$out/bench.log"
: >"$log"
: >"$bench"
step() { echo "=== $* ($(date +%T))" | tee -a "$log"; }

step build
{ nvidia-smi; nvcc --version; g++ --version | head -1; } >>"$log" 2>&1
make -j"$(nproc)" all >>"$log" 2>&1 || { echo "build failed" | tee -a "$log"; exit 1; }
build/mirrored devices 2>&1 | tee -a "$log"

step tests
timeout 600 build/mirrored_tests 2>&1 | tee "$out/tests.log" | tail -5 | tee -a "$log"

step benchmarks
run() { echo "\$ $*" >>"$bench"; timeout 300 "$@" >>"$bench" 2>&1; echo >>"$bench"; }
run build/mirrored bench-gemm --device cuda:0 --sizes 256,1024,4096 --json "$out/gemm.json"
run build/mirrored bench-gemm --device cuda:0 --sizes 1024,4096 --tf32
for devs in cuda:0,0 cuda:0,0,0,0; do
  for op in ring reduce_to_one; do
    run build/mirrored bench-allreduce --devices "$devs" --op "$op" --max-bytes 256M
  done
done
run build/mirrored bench-allreduce --devices cuda:0,0,0,0 --op ring --max-bytes 256M --transport staged
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
if [[ $gpus -ge 2 ]]; then
  for op in ring nccl reduce_to_one; do run build/mirrored bench-allreduce --devices cuda:all --op "$op" --max-bytes 256M; done
  run build/mirrored bench-allreduce --devices cuda:all --op ring --max-bytes 256M --transport staged
fi
run build/mirrored bench-step configs/synthetic_mlp.yaml --devices 'cuda:0;cuda:0,0;cuda:0,0,0,0' --steps 300 --json "$out/step.json"
run build/mirrored bench-step configs/synthetic_mlp.yaml --devices 'cuda:0;cuda:0,0' --steps 300 --set strategy.bucket_mb=0
run build/mirrored bench-step configs/synthetic_mlp.yaml --devices 'cuda:0' --steps 300 --set train.precision=tf32
run build/mirrored bench-loader --threads 1,2,4,8
tail -n 60 "$bench" | tee -a "$log" >/dev/null

step train
timeout 300 build/mirrored train configs/fashion_mnist_mlp.yaml --output "$out/run" --set checkpoint.resume=never \
  >>"$log" 2>&1
tail -n 3 "$log"
cp "$out/run/summary.json" "$out/summary.json" 2>/dev/null
rm -rf "$out/run"
step done
