#!/usr/bin/env bash
# A host Python environment with torch 2.13 (CPU), tensorflow-cpu 2.15.1 and Horovod 0.28.1
# (MPI + Gloo, both framework bindings), for the tests that run the smoke suite with
# `--runtime host` and through Slurm without a container. Idempotent: an environment that
# already imports horovod.torch and horovod.tensorflow is kept.
# Usage: .ci/make-smoke-venv.sh [DIR]   (default /opt/envbuilder-smoke-venv); prints DIR/bin/python
set -euo pipefail

VENV="${1:-/opt/envbuilder-smoke-venv}"
PY="$VENV/bin/python"
HOROVOD_SHA256=92a43f5a94c43907a56805bad15f19700c62ffc83b7ca483f9e104e229f67ef0

if [ -x "$PY" ] && "$PY" -c 'import horovod.torch, horovod.tensorflow' >/dev/null 2>&1; then
    echo "$PY"
    exit 0
fi

log() { echo "make-smoke-venv: $*" >&2; }
rm -rf "$VENV"
/usr/bin/python3 -m venv "$VENV"
pip() { "$PY" -m pip install -q --disable-pip-version-check "$@" >&2; }
pip pip==24.0 setuptools==69.5.1 wheel==0.43.0
log "installing torch 2.13.0 (CPU wheel from pip's find-links) and tensorflow-cpu 2.15.1"
pip torch==2.13.0 tensorflow-cpu==2.15.1 cloudpickle==3.0.0 packaging==24.0 psutil==5.9.8 PyYAML==6.0.1

src=$(mktemp -d)
trap 'rm -rf "$src"' EXIT
echo "horovod==0.28.1 --hash=sha256:$HOROVOD_SHA256" > "$src/req.txt"
"$PY" -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: --require-hashes \
    -r "$src/req.txt" -d "$src" >&2
tar -xzf "$src/horovod-0.28.1.tar.gz" -C "$src"
# torch >= 2.1 needs C++17 (horovod#3996): the same fix envbuilder's recipes apply
sed -i 's/CMAKE_CXX_STANDARD 14/CMAKE_CXX_STANDARD 17/' \
    "$src/horovod-0.28.1/CMakeLists.txt" "$src/horovod-0.28.1/horovod/torch/CMakeLists.txt"
log "compiling Horovod 0.28.1 (a few minutes on 2 cores)"
# Debian's cmake 3.25 (pip's cmake 4 rejects Gloo's old CMakeLists)
HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 \
HOROVOD_WITHOUT_MXNET=1 PATH="$VENV/bin:/usr/bin:/bin" MAKEFLAGS="-j$(nproc)" \
    pip --no-build-isolation --no-cache-dir "$src/horovod-0.28.1"
"$PY" -c 'import horovod.torch, horovod.tensorflow' >&2
echo "$PY"
