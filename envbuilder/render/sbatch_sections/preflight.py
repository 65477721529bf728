"""The GPU preflight of job.sbatch: before any rank starts, every node's NVIDIA driver is held
against the CUDA in the image, and the node's GPU against the compiled arch list of the image's
framework (where nvidia-smi can say), with one clear message naming the node. What it holds them
against is the plan's (slurm/preflight.py); each value is still shell-quoted.
"""

from __future__ import annotations

import re

from ...quoting import shell_word
from ...plan.job import JobPlan

VERSION_LT = ('version_lt() { [ "$1" != "$2" ] && '
              '[ "$(printf \'%s\\n%s\\n\' "$1" "$2" | sort -V | head -n 1)" = "$1" ]; }')


def function_lines(plan: JobPlan) -> list[str]:
    n = plan.gpu
    if n is None:
        return []
    def q(value: str) -> str:
        return shell_word(value, "the GPU preflight") if value else "''"
    for v in [n.cuda, n.floor, n.full, n.ptx, *n.archs]:
        assert re.fullmatch(r"[0-9][0-9a-z.+_-]*|", v), v      # catalog/spec versions only
    return [
        "",
        "# GPU preflight (one task per node, before any rank starts): the node's driver against",
        "# the image's CUDA, the node's GPU against the arch list the framework was compiled for",
        "# (F4: 'driver version is insufficient', 'no kernel image is available')",
        VERSION_LT,
        "gpu_preflight() {",
        f"    local host drv cc a ok=0 cuda={q(n.cuda)} floor={q(n.floor)} full={q(n.full)}",
        f"    local archs={q(' '.join(n.archs))} ptx={q(n.ptx)} ptx_any={1 if n.ptx_any else 0}"
        f" compat={1 if n.compat else 0}",
        "    host=$(hostname)",
        "    if ! command -v nvidia-smi >/dev/null 2>&1; then",
        '        note "$host: no nvidia-smi on the node: driver and GPU not checked (preflight)"',
        "        return 0",
        "    fi",
        "    drv=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n 1 | tr -d ' ')",
        '    [ -n "$drv" ] || die "$host: nvidia-smi lists no GPU (driver not loaded, or none allocated: --gpus-per-node)"',
        '    if [ -n "$floor" ] && version_lt "$drv" "$floor"; then',
        '        if [ "$compat" = 1 ]; then',
        '            note "$host: driver $drv < $floor: CUDA $cuda runs through the image\'s cuda-compat (forward compatibility)"',
        "        else",
        '            die "$host: NVIDIA driver $drv is older than the image\'s CUDA $cuda needs (>= $floor); use nodes with a newer driver, or rebuild with an older CUDA"',
        "        fi",
        '    elif [ -n "$full" ] && version_lt "$drv" "$full"; then',
        '        note "$host: driver $drv < $full: CUDA $cuda runs through minor-version compatibility (no PTX JIT of newer code)"',
        "    fi",
        "    cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | sort -V | head -n 1 | tr -d ' ')",
        '    if [ -n "$cc" ] && [ -n "$archs" ]; then',
        "        for a in $archs; do",
        '            if [ "${a%%.*}" = "${cc%%.*}" ] && ! version_lt "$cc" "$a"; then ok=1; fi',
        "        done",
        '        if [ -n "$ptx" ] && ! version_lt "$cc" "$ptx" && { [ "$ptx_any" = 1 ] || [ "${cc%%.*}" = "${ptx%%.*}" ]; }; then ok=1; fi',
        '        [ "$ok" = 1 ] || die "$host: the GPU (compute capability $cc) is not in the arch list the image\'s framework was compiled for ($archs${ptx:+ + PTX $ptx}): no kernel image would run"',
        "    fi",
        '    note "$host: driver $drv, compute capability ${cc:-unknown}: GPU preflight passed"',
        "}",
    ]


def rank_lines(plan: JobPlan) -> list[str]:
    """Inside each rank (the image): cuda-compat on LD_LIBRARY_PATH only on an older driver."""
    n = plan.gpu
    if not n or not n.compat_below_floor:
        return []
    return [
        '    if [ -d /usr/local/cuda/compat ] && command -v nvidia-smi >/dev/null 2>&1 && \\',
        f'        version_lt "$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -n 1)" {shell_word(n.floor, "the driver floor")}; then',
        '        export LD_LIBRARY_PATH="/usr/local/cuda/compat${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"',
        "    fi",
    ]
