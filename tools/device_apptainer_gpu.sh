#!/bin/bash
# Apptainer's --nv on a real GPU, with a SIF written by envbuilder's own SIF writer: for the lent
# `device` machine (one GPU, no container engine, no network, commands as root). Run from the
# repository root after tools/device_gpu_smoke.sh; writes under OUT (default ./gpu-apptainer-out).
#
#   bash tools/device_apptainer_gpu.sh CARRY
#
# CARRY holds what cannot be fetched there (docs/gpu.md says how it was made here):
#   *.deb        apptainer 1.4.5 (Debian unstable), squashfuse, libsquashfuse0, libfuse3-4, fuse3,
#                liblzo2-2 (squashfuse_ll needs it; Ubuntu 24.04 there lacks it)
#   nvtiny.sif   `envbuilder sif` of an image holding only Debian 13's C/C++ runtime and busybox
#   rootfs.tgz   the same files as a folder, for a sandbox when no SIF can be mounted there
# No GPU image fits in a call (64 MiB), so the framework is the machine's own PyTorch, bound into
# the container read-only (its interpreter, standard library and virtual environment); the driver
# comes in only through Apptainer's --nv, which is what this proves:
#   1. `apptainer exec --nv` sees the GPU (nvidia-smi bound from the host) in root mode, else
#      with --userns (squashfuse), else in a sandbox folder (root there lacks CAP_SYS_RESOURCE, which
#      Apptainer's root mode asks for: seen 2026-11-28);
#   2. the smoke suite (envbuilder/smoke as envbuilder_smoke) inside that container with --nv:
#      1 rank, NCCL, ENVBUILDER_FABRIC=tcp;
#   3. the same without --nv: the suite must fail gpu.visible naming --nv (the trap: /dev is bound,
#      the driver's libraries are not).
set -u
CARRY=${1:?usage: tools/device_apptainer_gpu.sh CARRY_DIR}
CARRY=$(cd "$CARRY" && pwd)
OUT=${OUT:-$PWD/gpu-apptainer-out}
PY=${PY:-$(command -v python3)}
mkdir -p "$OUT"
exec > >(tee "$OUT/apptainer.log") 2>&1
export PYTHONUNBUFFERED=1 LANG=C.UTF-8

echo "== machine"
uname -r; . /etc/os-release 2>/dev/null && echo "$PRETTY_NAME"
ldd --version | head -1
ls -l /dev/nvidia* /dev/fuse /dev/loop-control 2>&1 | head
ldconfig -p | grep -E 'libcuda\.so|libnvidia-ml\.so' | head -4
command -v nvidia-smi

echo "== Apptainer from the carried packages"
for f in "$CARRY"/*.deb; do
    case $(basename "$f") in
        fuse3_*) command -v fusermount3 >/dev/null && continue ;;   # keep the machine's own
    esac
    dpkg -x "$f" / || echo "could not unpack $f"
done
ldconfig
apptainer --version || { echo "apptainer does not run here"; exit 1; }

echo "== the host's PyTorch, bound into the container"
REAL=$(readlink -f "$PY")
read -r VENV BASE STDLIB < <("$PY" -c 'import sys, sysconfig; print(sys.prefix, sys.base_prefix, sysconfig.get_path("stdlib"))')
echo "python $PY -> $REAL; prefix $VENV; base $BASE; stdlib $STDLIB"
BINDS=()
CHAIN=() p=$PY                      # every link from the venv's python to the interpreter
while [ -L "$p" ]; do t=$(readlink "$p"); case $t in /*) ;; *) t=$(dirname "$p")/$t;; esac; CHAIN+=("$t"); p=$t; done
for p in "$VENV" "$STDLIB" "${CHAIN[@]}"; do
    case " ${BINDS[*]} " in *" $p:$p:ro "*) ;; *) BINDS+=(--bind "$p:$p:ro");; esac
done
[ "$BASE" != /usr ] && BINDS+=(--bind "$BASE:$BASE:ro")
LIBPY=$(ldd "$REAL" | awk '/libpython/ {print $3}')
[ -n "$LIBPY" ] && BINDS+=(--bind "$LIBPY:$LIBPY:ro")
SMOKE=$(mktemp -d); cp -r envbuilder/smoke "$SMOKE/envbuilder_smoke"
BINDS+=(--bind "$SMOKE:$SMOKE" --bind "$OUT:$OUT")
echo "binds: ${BINDS[*]}"
"$PY" tools/host_torch_manifest.py "$OUT/manifest.json" --name device-apptainer-torch >/dev/null

SIF="$CARRY/nvtiny.sif"
echo "== apptainer inspect (labels written by envbuilder's SIF writer)"
apptainer inspect --labels "$SIF" | head -4

# the first mode that runs nvidia-smi with --nv: root (kernel squashfs), --userns (squashfuse), sandbox
MODE=() TARGET=$SIF
try() { echo "-- apptainer exec --nv $* nvidia-smi -L"; timeout 60 apptainer exec --nv "$@" nvidia-smi -L; }
if try "$SIF"; then echo "mode: root, SIF"
elif try --userns "$SIF"; then MODE=(--userns); echo "mode: --userns, SIF"
else
    mkdir -p /tmp/nvtiny && tar -C /tmp/nvtiny -xzf "$CARRY/rootfs.tgz"
    TARGET=/tmp/nvtiny
    if try "$TARGET"; then echo "mode: root, sandbox folder"
    elif try --userns "$TARGET"; then MODE=(--userns); echo "mode: --userns, sandbox folder"
    else echo "no mode ran nvidia-smi"; exit 1; fi
fi

echo "== torch inside the container"
timeout 120 apptainer exec --nv "${MODE[@]}" "${BINDS[@]}" "$TARGET" "$PY" -c '
import os, torch
print("in container:", os.environ.get("APPTAINER_CONTAINER"), "torch", torch.__version__,
      "cuda", torch.cuda.is_available(), torch.cuda.device_count(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-")
print("libcuda from:", [l.split()[-1] for l in open("/proc/self/maps") if "libcuda.so" in l][:1])'
echo "torch rc=$?"

suite() {   # NAME [apptainer options]
    local name=$1; shift
    echo "== smoke suite in the container: $name"
    rm -rf "/tmp/smoke-$name"; mkdir -p "/tmp/smoke-$name"
    local t=$SECONDS
    ENVBUILDER_FABRIC=tcp timeout 240 apptainer exec "$@" "${MODE[@]}" "${BINDS[@]}" --bind "/tmp/smoke-$name" \
        --pwd "$SMOKE" "$TARGET" "$PY" -m envbuilder_smoke --manifest "$OUT/manifest.json" --ranks 1 \
        --report "$OUT/report-apptainer-$name.json" --workdir "/tmp/smoke-$name" --keep
    echo "suite $name rc=$? in $((SECONDS - t)) s"
}
suite nv --nv
suite no-nv
"$PY" - "$OUT" <<'PY'
import json, os, sys
for name in ("nv", "no-nv"):
    p = os.path.join(sys.argv[1], "report-apptainer-%s.json" % name)
    if not os.path.exists(p):
        print(name, "no report"); continue
    r = json.load(open(p))
    checks = r.get("checks") or r.get("results") or []
    for c in checks:
        if c["name"].startswith(("gpu.", "dist.init", "fabric.transport", "versions.nccl", "versions.cuda")):
            print(name, c["name"], c["status"], (c.get("detail") or "")[:220])
PY
find /tmp/smoke-nv -name 'nccl-*.log' -print0 | tar --null -czf "$OUT/apptainer-nccl-logs.tgz" -T - 2>/dev/null
ls -la "$OUT"
