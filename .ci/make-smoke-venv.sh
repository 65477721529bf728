#!/usr/bin/env bash
# A host Python environment with torch 2.13 (CPU), tensorflow-cpu 2.15.1 and Horovod 0.28.1
# (MPI + Gloo, PyTorch binding), for the tests that run the smoke suite with `--runtime host` and
# through Slurm without a container. Idempotent: an environment that already imports
# horovod.torch and tensorflow is kept.
#
# Horovod is not compiled here: it is the cpu-torch preset's own build, taken from its image.
# `envbuilder build recipes/cpu-torch-horovod.yaml` with the tests' flags makes that image (the tests'
# `torch_image` then comes from Docker's build cache), and its venv's Horovod (built on the same
# Debian 12, Python 3.11, Open MPI 4.1.4 and torch 2.13.0+cpu wheel as this environment) is copied
# in. On a bare machine that is one Horovod compile for both instead of two (the host one took
# ~22 of set-up's 26 minutes, 2026-11-25). Horovod's TensorFlow binding is not on the host: the
# intel-tensorflow image's verify runs Horovod under TensorFlow (tests/test_build_verify.py).
# Needs the Docker engine and the base image (.ci/setup makes both first).
# Usage: .ci/make-smoke-venv.sh [DIR]   (default /opt/envbuilder-smoke-venv); prints DIR/bin/python
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

VENV="${1:-/opt/envbuilder-smoke-venv}"
PY="$VENV/bin/python"
CA=/etc/ssl/certs/ca-certificates.crt
TORCH_WHEEL=torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl

if [ -x "$PY" ] && "$PY" -c 'import horovod.torch, tensorflow' >/dev/null 2>&1; then
    echo "$PY"
    exit 0
fi

log() { echo "make-smoke-venv: $*" >&2; }
pip() { "$1" -m pip install -q --disable-pip-version-check "${@:2}" >&2; }

# the folder holding the torch CPU wheel: pip's find-links (tests/infra.py wheelhouse() likewise)
wheelhouse=""
for dir in /opt/wheels $(python3 -m pip config list 2>/dev/null | sed -n "s/^.*find-links='\(.*\)'$/\1/p"); do
    if [ -f "$dir/$TORCH_WHEEL" ]; then wheelhouse="$dir"; break; fi
done
[ -n "$wheelhouse" ] || { log "$TORCH_WHEEL is in none of pip's find-links folders (ENVIRONMENT.md)"; exit 1; }

work=$(mktemp -d)
cid=""
cleanup() { [ -z "$cid" ] || docker rm -f "$cid" >/dev/null 2>&1 || true; rm -rf "$work"; }
trap cleanup EXIT

log "building the cpu-torch preset's image (its Horovod compile is this environment's)"
/usr/bin/python3 -m venv "$work/envbuilder"
pip "$work/envbuilder/bin/python" .
"$work/envbuilder/bin/envbuilder" build recipes/cpu-torch-horovod.yaml --out "$work/cpu-torch" --ca-bundle "$CA" \
    --wheelhouse "$wheelhouse" >&2
tag=$("$work/envbuilder/bin/python" -c 'import json, sys; print(json.load(open(sys.argv[1]))["image"]["tag"])' \
    "$work/cpu-torch/manifest.json")

log "the environment: torch 2.13.0 (the CPU wheel), tensorflow-cpu 2.15.1, Horovod from $tag"
rm -rf "$VENV"
/usr/bin/python3 -m venv "$VENV"
pip "$PY" pip==24.0 setuptools==69.5.1 wheel==0.43.0
pip "$PY" torch==2.13.0 tensorflow-cpu==2.15.1 cloudpickle==3.0.0 packaging==24.0 psutil==5.9.8 PyYAML==6.0.1
site=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')
cid=$(docker create "$tag" /bin/true)
image_site=/opt/venv/lib/python3.11/site-packages
docker cp "$cid:$image_site/horovod" "$site/"
docker cp "$cid:$image_site/horovod-0.28.1.dist-info" "$site/"
docker cp "$cid:/opt/venv/bin/horovodrun" "$VENV/bin/horovodrun"
sed -i "1s|^#!.*|#!$PY|" "$VENV/bin/horovodrun"
"$PY" - >&2 <<'EOF'
import torch
import horovod.torch as hvd
assert hvd.mpi_built() and hvd.gloo_built(), "Horovod without MPI or Gloo"
import horovod
print("make-smoke-venv: Horovod %s (mpi, gloo) on torch %s" % (horovod.__version__, torch.__version__))
EOF
"$PY" -c 'import tensorflow' >&2
echo "$PY"
