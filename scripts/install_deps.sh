#!/usr/bin/env bash
# Installs the distribution packages mirrored needs, and only those missing (idempotent).
# Every package exists in Debian 12 and in Ubuntu 24.04. The CUDA toolkit is not installed
# here: it comes from NVIDIA's packages or the machine image; without it the build is CPU-only.
#   scripts/install_deps.sh           install what is missing
#   scripts/install_deps.sh --fuzz    also clang and its sanitizer/libFuzzer runtime (make fuzz)
#   scripts/install_deps.sh --lint    also clang-format and cppcheck (make format, make lint)
#   scripts/install_deps.sh --pytorch also PyTorch, torchvision, PIL, NumPy, sentencepiece, regex: the
#                                     tests and benchmarks that compare with PyTorch, BPE vocabularies
#                                     (prepare_text.py --bpe) and scripts/make_image_folder.py run
#                                     (they say skipped without them)
#   scripts/install_deps.sh --check   list what is missing; exit 1 if anything is
set -euo pipefail

packages=(
  build-essential pkg-config
  libyaml-cpp-dev      # configuration
  doctest-dev          # tests
  libopenblas-dev      # CPU backend GEMM
  zlib1g-dev           # .gz datasets, checkpoint checksums
  libturbojpeg0-dev libpng-dev  # image-folder data sets: JPEG and PNG decoding
  libpcre2-dev         # tokenizers: the pre-tokenizers' Unicode regexes
  libsentencepiece-dev # tokenizers: SentencePiece models (Llama 2, Mistral)
  nlohmann-json3-dev   # metrics, summaries, safetensors headers
  libcli11-dev         # command line
  dataset-fashion-mnist  # the real Fashion-MNIST files for the default run
  python3-matplotlib   # scaling.png of `mirrored scale` (it works without, and says so)
  libopenmpi-dev openmpi-bin  # multi-node runs: mpirun, rank discovery, the CPU path between nodes
)

# Optional, x86-64 only: libxsmm JIT-compiles the CPU replicas' GEMMs for their shapes
# (kernels/cpu/jit_gemm.h). Where the distribution has no package for it, the build runs every
# GEMM on OpenBLAS (and `mirrored devices` says which it uses).
optional=()
if [[ $(uname -m) == x86_64 ]]; then optional+=(libxsmm-dev); fi

for arg in "$@"; do
  [[ $arg == --fuzz ]] && packages+=(clang libclang-rt-dev)
  [[ $arg == --lint ]] && packages+=(clang-format cppcheck)
  [[ $arg == --pytorch ]] && packages+=(python3-torch python3-numpy python3-sentencepiece python3-torchvision python3-pil python3-regex)
done

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
missing=()
for p in "${packages[@]}"; do installed "$p" || missing+=("$p"); done
missing_optional=()
for p in "${optional[@]}"; do installed "$p" || missing_optional+=("$p"); done

if [[ " $* " == *" --check "* ]]; then
  [[ ${#missing_optional[@]} -gt 0 ]] && echo "optional, not installed: ${missing_optional[*]}"
  [[ ${#missing[@]} -eq 0 ]] && { echo "all dependencies installed"; exit 0; }
  echo "missing: ${missing[*]}"; exit 1
fi
[[ ${#missing[@]} -eq 0 && ${#missing_optional[@]} -eq 0 ]] && exit 0

sudo=""
if [[ $(id -u) -ne 0 ]]; then
  if ! command -v sudo >/dev/null; then
    [[ ${#missing[@]} -eq 0 ]] && { echo "mirrored: not installing ${missing_optional[*]} (optional; needs root or sudo)"; exit 0; }
    echo "error: need root or sudo to install: ${missing[*]}" >&2; exit 1
  fi
  sudo="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
# Tries without refreshing the package lists first; refreshes them once if that fails.
refreshed=0
apt_install() {
  $sudo apt-get install -y --no-install-recommends "$@" && return 0
  [[ $refreshed -eq 1 ]] && return 1
  refreshed=1
  $sudo apt-get update && $sudo apt-get install -y --no-install-recommends "$@"
}
if [[ ${#missing[@]} -gt 0 ]]; then
  echo "mirrored: installing ${missing[*]}"
  apt_install "${missing[@]}" || exit 1
fi
if [[ ${#missing_optional[@]} -gt 0 ]]; then
  echo "mirrored: installing ${missing_optional[*]} (optional)"
  apt_install "${missing_optional[@]}" ||
    echo "mirrored: ${missing_optional[*]} not available here: every GEMM runs on OpenBLAS"
fi
