#!/bin/bash
# The GPU half of the smoke suite on a machine with a GPU and a host PyTorch (no container engine
# there): run from the repository root, writes everything under OUT (default ./gpu-smoke-out).
#
#   1. the GPU preflight of job.sbatch (images/*/job.sbatch), against the node's real driver, for
#      each GPU image, plus its refusal path (an arch list without the node's GPU);
#   2. the smoke suite that ships in the images (envbuilder/smoke as envbuilder_smoke), run with
#      the host's torch on a manifest written from that torch (its CUDA, cuDNN and NCCL versions):
#      1 rank per GPU with NCCL, ENVBUILDER_FABRIC=tcp and =ib (NCCL's transport line read from its
#      own init log), then 2 ranks on one GPU, which must fail and say why;
#   3. NCCL's raw init logs, kept for the parsers' test data (tests/data/fabric).
# Used on the `device` machine (docs/testing.md); nothing here needs the network.
set -u
OUT=${OUT:-$PWD/gpu-smoke-out}
PY=${PY:-python3}
mkdir -p "$OUT"
exec > >(tee "$OUT/device.log") 2>&1     # one log of everything below (reports are separate files)
# the suite as images carry it: envbuilder/smoke copied in as the package envbuilder_smoke
SMOKE=$(mktemp -d); cp -r envbuilder/smoke "$SMOKE/envbuilder_smoke"
export PYTHONUNBUFFERED=1 LANG=C.UTF-8

echo "== machine"
nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv 2>&1
"$PY" - <<'PY'
import torch
nccl = ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else None
print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version(),
      "nccl", nccl, "gpus", torch.cuda.device_count())
PY

echo "== GPU preflight of job.sbatch against this driver"
for img in images/*/job.sbatch; do
    [ -f "$img" ] || continue
    grep -q '^gpu_preflight()' "$img" || continue
    fn=$(sed -n '/^note() /p; /^die() /p; /^version_lt() /p; /^gpu_preflight() {/,/^}/p' "$img")
    ( eval "$fn"; gpu_preflight ); rc=$?
    echo "preflight $img rc=$rc"
    # the same function with an arch list that leaves this GPU out: must stop with exit 2
    bad=$(printf '%s\n' "$fn" | sed "s/local archs='[^']*' ptx=[^ ]*/local archs='7.0 7.5' ptx=''/")
    ( eval "$bad"; gpu_preflight ); rc=$?
    echo "preflight $img without this GPU's arch rc=$rc"
done

echo "== manifest from the host's torch"
"$PY" tools/host_torch_manifest.py "$OUT/manifest.json" --name device-host-torch

run_suite() {   # NAME RANKS FABRIC [args]
    local name=$1 ranks=$2 fab=$3; shift 3
    echo "== smoke suite: $name ($ranks rank(s), ENVBUILDER_FABRIC=$fab)"
    rm -rf "/tmp/smoke-$name"; mkdir -p "/tmp/smoke-$name"
    ( cd "$SMOKE" && ENVBUILDER_FABRIC=$fab timeout 240 "$PY" -m envbuilder_smoke --manifest "$OUT/manifest.json" \
        --ranks "$ranks" --report "$OUT/report-$name.json" --workdir "/tmp/smoke-$name" --keep "$@" )
    echo "smoke $name rc=$?"
}
run_suite tcp 1 tcp
run_suite ib 1 ib
run_suite two-on-one 2 tcp --timeout 60
# NCCL's own init logs (the parsers' evidence), one archive: few files come back from the device
find /tmp/smoke-* -name 'nccl-*.log' -print0 | tar --null -czf "$OUT/nccl-logs.tgz" -T - 2>/dev/null
ls -la "$OUT"
