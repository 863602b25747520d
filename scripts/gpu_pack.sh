#!/usr/bin/env bash
# Builds the CUDA binaries for a GPU machine that has no network and nothing installable, and packs
# them with the libraries they need that such a machine may lack, so that scripts/gpu_check.sh
# compiles nothing there:
#   gpu-pack/bin/mirrored, gpu-pack/bin/mirrored_tests   (debug info stripped)
#   gpu-pack/lib/*        every shared library they load except the C/C++ runtime (the GPU
#                         machine's own, newer) and the CUDA libraries (cuBLAS, cuBLASLt, the CUDA
#                         runtime: hundreds of MiB, part of the CUDA toolkit there)
#   gpu-pack/MANIFEST     the commit, the build switches, each file's size and SHA-256
# The folder is git-ignored; copy it beside the checkout to the GPU machine. Together with the
# tracked tree it must fit the copy's size limit (GPU_PACK_LIMIT_MB, 64 by default; it is about
# 50 MiB). Here it checks that `ldd` resolves both binaries with only the pack's lib/, the CUDA
# toolkit's lib64 and the C/C++ runtime; on the GPU machine gpu_check.sh's preflight runs `ldd`
# again and names whatever is still missing.
# Defaults: machine code for one architecture (sm_90, Hopper: H100/H200) and its PTX, which the
# driver compiles on first load for any newer GPU; no MPI (one node), no NCCL (one GPU cannot run
# NCCL between replicas sharing it; with --nccl the GPU machine must have libnccl.so.2).
#   scripts/gpu_pack.sh [--arch 90] [--nccl] [--out gpu-pack]
set -euo pipefail
cd "$(dirname "$0")/.."
arch=90
nccl=0
dest=gpu-pack
while [[ $# -gt 0 ]]; do
    case $1 in
        --arch) arch=$2; shift 2 ;;
        --nccl) nccl=1; shift ;;
        --out) dest=$2; shift 2 ;;
        *) echo "gpu_pack.sh: unknown option '$1' (expected --arch N, --nccl, --out DIR)" >&2; exit 2 ;;
    esac
done
[[ $arch =~ ^[0-9]+$ ]] || { echo "gpu_pack.sh: --arch takes a compute capability such as 90, not '$arch'" >&2; exit 2; }
cuda_home=${CUDA_HOME:-/usr/local/cuda}
[[ -x $cuda_home/bin/nvcc ]] || { echo "gpu_pack.sh: no nvcc under $cuda_home (set CUDA_HOME): nothing to pack" >&2; exit 2; }
# never replace a folder this script did not write
if [[ -e $dest && ! -f $dest/MANIFEST ]]; then
    echo "gpu_pack.sh: $dest exists and is not a pack (no MANIFEST): move it away or pass --out" >&2
    exit 2
fi

build=build-gpu-sm$arch
[[ $nccl == 1 ]] && build+=-nccl
make -j"$(nproc)" BUILD="$build" WITH_MPI=0 WITH_NCCL=$nccl \
    GENCODE="-gencode arch=compute_$arch,code=sm_$arch -gencode arch=compute_$arch,code=compute_$arch" \
    "$build/mirrored" "$build/mirrored_tests"

stage=$(mktemp -d "${dest%/}.new.XXXXXX")
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib"
for b in mirrored mirrored_tests; do strip --strip-debug -o "$stage/bin/$b" "$build/$b"; done
# the libraries to bring: what ldd resolves, less the C/C++ runtime and the CUDA toolkit's own
skip='^(linux-vdso|ld-linux|libc\.|libm\.|libpthread\.|libdl\.|librt\.|libgcc_s\.|libstdc\+\+\.|libcudart\.|libcublas\.|libcublasLt\.|libnccl\.)'
ldd "$stage"/bin/* | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u | while read -r name path; do
    [[ $name =~ $skip ]] && continue
    cp -L "$path" "$stage/lib/$name"
done
{
    echo "commit $(git rev-parse HEAD)$(git diff --quiet HEAD -- . ':!gpu-pack' || echo ' (with uncommitted changes)')"
    echo "built $(date -u +%FT%TZ) on $(. /etc/os-release && echo "$PRETTY_NAME"), $("$cuda_home/bin/nvcc" --version | tail -1)"
    echo "switches sm_$arch+compute_$arch (PTX) WITH_MPI=0 WITH_NCCL=$nccl"
    echo "needs from the GPU machine: the NVIDIA driver, $(ldd "$stage/bin/mirrored" | awk '$1 ~ /^lib(cudart|cublas|cublasLt|nccl)\./ {printf "%s ", $1}')(its CUDA toolkit)"
    (cd "$stage" && find bin lib -type f | sort | xargs sha256sum | while read -r sum f; do
        echo "file $f $(stat -c %s "$f") $sum"
    done)
} >"$stage/MANIFEST"
# every library resolves from the pack, the CUDA toolkit or the C/C++ runtime, and from nowhere else
runtime='^(linux-vdso|ld-linux|libc\.|libm\.|libpthread\.|libdl\.|librt\.|libgcc_s\.|libstdc\+\+\.)'
stray=$(LD_LIBRARY_PATH="$stage/lib:$cuda_home/lib64" ldd "$stage"/bin/* | awk -v pack="$stage/lib/" -v cuda="$cuda_home" \
    '/not found/ {print $1 " (not found)"; next}
     $2 == "=>" && $3 ~ /^\// && index($3, pack) != 1 && index($3, cuda) != 1 {print $1 " (" $3 ")"}' |
    { grep -Ev "$runtime" || true; } | sort -u)  # grep finds none in a good pack: not a failure
if [[ -n $stray ]]; then
    echo "gpu_pack.sh: libraries from outside the pack, the CUDA toolkit and the C/C++ runtime: $(tr '\n' ' ' <<<"$stray")" >&2
    exit 1
fi
rm -rf "$dest"
mv "$stage" "$dest"
trap - EXIT
size=$(du -sb "$dest" | cut -f1)
limit_mb=${GPU_PACK_LIMIT_MB:-64}
tracked=$(git ls-files -z | du -cb --files0-from=- | tail -1 | cut -f1)
echo "gpu_pack.sh: $dest: $(find "$dest" -type f | wc -l) files, $((size / 1048576)) MiB; with the tree $(((size + tracked) / 1048576)) MiB of $limit_mb"
if [[ $((size + tracked)) -gt $((limit_mb * 1048576)) ]]; then
    echo "gpu_pack.sh: $dest and the tree together exceed GPU_PACK_LIMIT_MB=$limit_mb" >&2
    exit 1
fi
