#!/bin/bash
# Horovod 0.28.1 with NCCL operations compiled on a GPU machine's host PyTorch, then the smoke
# suite's Horovod run on the GPU (1 rank per GPU, Gloo controller). For the lent `device` machine
# (no engine, no network): the sdist travels with the call. Usage, from the repository root:
#   bash tools/device_horovod_gpu.sh PATH/horovod-0.28.1.tar.gz [WHEELS]
# WHEELS: a folder with wheels of Horovod's setup_requires missing there (cffi, pycparser: its
# setup.py fetches them from PyPI otherwise, which that machine cannot reach).
# It compiles with the two fixes the product's recipe applies for CUDA 13 and torch >= 2.1
# (catalog fixes horovod_cuda_cxx17 and horovod_cxx17; images/torch-horovod-pypi/Dockerfile),
# after checking the sdist against the hash the recipe pins. Writes under OUT.
set -u
SDIST=$1
WHEELS=${2:-}
OUT=${OUT:-$PWD/gpu-horovod-out}
PY=${PY:-python3}
mkdir -p "$OUT"
exec > >(tee "$OUT/horovod-gpu.log") 2>&1
export PYTHONUNBUFFERED=1 LANG=C.UTF-8
want=$(grep -o "horovod==0.28.1 --hash=sha256:[0-9a-f]*" images/torch-horovod-pypi/Dockerfile | head -n 1 | cut -d: -f2)
have=$(sha256sum "$SDIST" | cut -d' ' -f1)
if [ -z "$want" ] || [ "$want" != "$have" ]; then echo "sdist sha256 $have, recipe pins '$want'"; exit 2; fi

site=$("$PY" -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__path__[0]))')
nvcc=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
cuda_home=$(dirname "$(dirname "$(readlink -f "$nvcc")")")
echo "nvcc $nvcc ($("$nvcc" --version | tail -n 1)); CUDA_HOME $cuda_home; NCCL from $site/nccl"
# libnccl.so for the linker (the wheel ships only libnccl.so.2), outside the wheel's folder
mkdir -p /tmp/nccl/lib && ln -sf "$site/nccl/lib/libnccl.so.2" /tmp/nccl/lib/libnccl.so

if [ -n "$WHEELS" ]; then
    "$PY" -m pip install -q --no-index --no-deps --upgrade --target /tmp/buildreq "$WHEELS"/*.whl || exit 1
    export PYTHONPATH=/tmp/buildreq
fi
work=$(mktemp -d); tar -xzf "$SDIST" -C "$work"; src=$work/horovod-0.28.1
sed -i 's/CMAKE_CUDA_STANDARD 11/CMAKE_CUDA_STANDARD 17/' "$src/horovod/common/ops/cuda/CMakeLists.txt"
sed -i 's/CMAKE_CXX_STANDARD 14/CMAKE_CXX_STANDARD 17/' "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"
# GCC >= 13 no longer pulls standard headers in through other ones, and Horovod 0.28.1 uses
# std::string (horovod/common/group_table.h) and std::logic_error (common.h) without including
# them (seen on the device machine's g++ 13.3; Debian 12's GCC 12 compiles it as released)
export CXXFLAGS="${CXXFLAGS:-} -include string -include cstdint -include stdexcept -include memory -include limits"
echo "g++: $(g++ --version | head -n 1); $(command -v g++)"
t0=$(date +%s)
env CUDA_HOME="$cuda_home" HOROVOD_CUDA_HOME="$cuda_home" HOROVOD_BUILD_CUDA_CC_LIST=90 \
    HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_NCCL_INCLUDE="$site/nccl/include" HOROVOD_NCCL_LIB=/tmp/nccl/lib \
    HOROVOD_NCCL_LINK=SHARED HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
    HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 MAKEFLAGS=-j"$(nproc)" CMAKE_POLICY_VERSION_MINIMUM=3.5 \
    "$PY" -m pip install -q --no-deps --no-build-isolation --no-cache-dir --target /tmp/hvd "$src" \
    || { echo "horovod compile failed after $(( $(date +%s) - t0 )) s"; exit 1; }
echo "horovod compiled in $(( $(date +%s) - t0 )) s"
export PYTHONPATH=/tmp/hvd${PYTHONPATH:+:$PYTHONPATH} PATH=/tmp/hvd/bin:$PATH
horovodrun --check-build

"$PY" tools/host_torch_manifest.py "$OUT/manifest.json" --name device-host-torch-horovod --horovod-ops nccl,gloo
SMOKE=$(mktemp -d); cp -r envbuilder/smoke "$SMOKE/envbuilder_smoke"
( cd "$SMOKE" && ENVBUILDER_FABRIC=tcp timeout 240 "$PY" -m envbuilder_smoke --manifest "$OUT/manifest.json" \
    --ranks 1 --launcher gloo --report "$OUT/report-horovod.json" )
echo "smoke horovod rc=$?"
