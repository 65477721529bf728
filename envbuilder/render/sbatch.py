"""Stack -> job.sbatch: the Slurm wrapper (hybrid model: srun starts one container per rank)."""

from __future__ import annotations

import shlex

from ..plan import SMOKE_DIR
from ..resolve import Stack
from .common import header

RUNTIME_EXEC = {
    "apptainer": "apptainer",
    "singularity": "singularity",
}


def _directives(stack: Stack, ntasks_per_node: int) -> list[str]:
    cl = stack.spec.cluster
    d = [f"--job-name={stack.spec.name}"]
    if cl.partition:
        d.append(f"--partition={cl.partition}")
    if cl.account:
        d.append(f"--account={cl.account}")
    d.append(f"--nodes={cl.nodes}")
    d.append(f"--ntasks-per-node={ntasks_per_node}")
    if cl.gpus_per_node:
        # every rank sees all GPUs of its node and picks one by local rank: CUDA IPC between
        # ranks keeps working (nccl#129, pyxis#73)
        d.append(f"--gpus-per-node={cl.gpus_per_node}")
    if cl.cpus_per_task:
        d.append(f"--cpus-per-task={cl.cpus_per_task}")
    if cl.mem_per_cpu:
        d.append(f"--mem-per-cpu={cl.mem_per_cpu}")
    if cl.time:
        d.append(f"--time={cl.time}")
    d.append("--output=%x-%j.out")
    return [f"#SBATCH {x}" for x in d]


def _command(stack: Stack) -> str:
    cl = stack.spec.cluster
    if cl.command:
        return cl.command
    return f"python -m {SMOKE_DIR} --launcher srun"


def render_sbatch(stack: Stack) -> str:
    spec, cl = stack.spec, stack.spec.cluster
    runtime = cl.runtime
    ntasks = cl.ntasks_per_node or cl.gpus_per_node or 1
    pmi = spec.mpi.pmi if spec.mpi else ("pmix" if stack.ngc and stack.ngc.get("mpi") else None)
    srun_mpi = f"--mpi={pmi}" if pmi else "--mpi=none"
    image = cl.image_path or f"{spec.name}.sif"
    lines = ["#!/bin/bash"]
    lines += _directives(stack, ntasks)
    lines += header("#", f"Slurm job for {spec.name} ({runtime} runtime)", spec.sha256(), [
        "Submit: sbatch job.sbatch [COMMAND...]   (default command: the smoke suite)",
        "Environment overrides: ENVBUILDER_IMAGE, OUTPUT_DIR, NCCL_SOCKET_IFNAME.",
    ])
    lines += [
        "set -euo pipefail",
        "ulimit -c 0   # no core-dump floods from many ranks",
        "",
        f"IMAGE=\"${{ENVBUILDER_IMAGE:-${{SLURM_SUBMIT_DIR:-$PWD}}/{image}}}\"",
        "OUTPUT_DIR=\"${OUTPUT_DIR:-${SLURM_SUBMIT_DIR:-$PWD}/runs/${SLURM_JOB_ID:-local}}\"",
        "mkdir -p \"$OUTPUT_DIR\"",
        "export OUTPUT_DIR   # checkpoints and TensorBoard logs: written by rank 0 only",
        "",
        "# Cores per rank: srun inherits them (Slurm >= 22.05 no longer does by itself)",
        "export SRUN_CPUS_PER_TASK=\"${SLURM_CPUS_PER_TASK:-1}\"",
        "export OMP_NUM_THREADS=\"${SLURM_CPUS_PER_TASK:-1}\"",
        "# Hygiene: no ~/.local packages, a fixed locale, a throw-away HOME per job",
        "export PYTHONNOUSERSITE=1",
        "export LC_ALL=C.UTF-8 LANG=C.UTF-8",
    ]
    if cl.network_interface:
        iface = shlex.quote(cl.network_interface)
        lines += ["# Bootstrap NCCL and Gloo on the site's fast network (a wrong interface hangs init)",
                  f"export NCCL_SOCKET_IFNAME=\"${{NCCL_SOCKET_IFNAME:-{iface}}}\"",
                  "export GLOO_SOCKET_IFNAME=\"$NCCL_SOCKET_IFNAME\""]
    if spec.cuda:
        lines += ["export NCCL_DEBUG=\"${NCCL_DEBUG:-WARN}\""]
    lines += [
        "",
        "# Bind mounts: resolved to real paths and checked before any rank starts",
        "binds=()",
        "add_bind() {",
        "    local spec=$1 src rest",
        "    src=${spec%%:*}",
        "    rest=${spec#\"$src\"}",
        "    if [ ! -e \"$src\" ]; then",
        "        echo \"envbuilder: bind source '$src' does not exist on $(hostname) (cluster.binds)\" >&2",
        "        exit 2",
        "    fi",
        "    binds+=(\"$(realpath \"$src\")${rest:-:$src}\")",
        "}",
    ]
    for bind in cl.binds:
        lines.append(f"add_bind {shlex.quote(bind)}")
    lines += [
        "",
        f"if [ \"$#\" -gt 0 ]; then cmd=(\"$@\"); else cmd=({_command(stack)}); fi",
        "",
    ]
    lines += _launch(stack, runtime, srun_mpi)
    return "\n".join(lines) + "\n"


def _launch(stack: Stack, runtime: str, srun_mpi: str) -> list[str]:
    gpu = stack.spec.cuda is not None
    srun = f"srun {srun_mpi} --kill-on-bad-exit=1"
    if runtime in RUNTIME_EXEC:
        exe = RUNTIME_EXEC[runtime]
        nv = " --nv" if gpu else ""
        return [
            "JOBHOME=\"${SLURM_TMPDIR:-/tmp}/envbuilder-home.${SLURM_JOB_ID:-$$}\"",
            "srun --ntasks-per-node=1 mkdir -p \"$JOBHOME\"",
            "bind_args=()",
            "for b in \"${binds[@]}\"; do bind_args+=(--bind \"$b\"); done",
            "# No --cleanenv/--containall: PMIx needs the SLURM_* and PMIX_* variables inside.",
            f"{srun} \\",
            f"    {exe} exec{nv} --home \"$JOBHOME\" \"${{bind_args[@]}}\" \"$IMAGE\" \\",
            "    \"${cmd[@]}\"",
        ]
    if runtime == "charliecloud":
        return [
            "bind_args=()",
            "for b in \"${binds[@]}\"; do bind_args+=(-b \"${b%:ro}\"); done",
            f"{srun} \\",
            "    ch-run --home --set-env=PYTHONNOUSERSITE=1 \"${bind_args[@]}\" \"$IMAGE\" -- \\",
            "    \"${cmd[@]}\"",
        ]
    if runtime == "pyxis":
        return [
            "mounts=$(IFS=,; echo \"${binds[*]}\")",
            f"{srun} \\",
            "    --container-image=\"$IMAGE\" ${mounts:+--container-mounts=\"$mounts\"} \\",
            "    \"${cmd[@]}\"",
        ]
    # host: the environment is already on the nodes (a venv or modules)
    return [
        "if [ -n \"${ENVBUILDER_VENV:-}\" ]; then export PATH=\"$ENVBUILDER_VENV/bin:$PATH\"; fi",
        f"{srun} \"${{cmd[@]}}\"",
    ]
