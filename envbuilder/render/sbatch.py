"""JobPlan -> job.sbatch: the Slurm wrapper (hybrid model: srun starts one container per rank).
Every decision is the plan's (slurm/job.py); this module and sbatch_sections/ only write it as
bash. The script, section by section (each section's comment in the output says why):

    #SBATCH directives        resources from the spec / site profile; an array for a sweep
    paths                     job folder, image, output folder (rank 0 writes checkpoints/logs)
    sweep                     array task i -> its values as environment variables
    threads, hygiene, network OMP_NUM_THREADS, SRUN_CPUS_PER_TASK, throw-away HOME, locale,
                              PYTHONNOUSERSITE, NCCL/Gloo interface, the site's variables
    binds                     resolved to real paths and checked before anything starts
    node set-up               one task per node: HOME folder, data staging
    monitoring                TensorBoard (prints the ssh -L line), Horovod timeline
    launch                    srun --mpi=<pmi> <runtime> COMMAND, or the smoke suite

Failure modes guarded against are the ones in shared/research/slurm.md (F1-F10); the comments
in the generated script name them.
"""

from __future__ import annotations

from ..paths import MANIFEST_IN_IMAGE as IMAGE_MANIFEST, SMOKE_DIR
from ..quoting import sbatch_value, shell_assign, shell_default, shell_word
from ..plan.job import HostSoftware, Image, JobPlan, SiteMpi
from .common import header
from .sbatch_sections import attestation, nodelocal, preflight, staging, tfconfig, vetting


def _directives(plan: JobPlan) -> list[str]:
    res = plan.resources
    d: list[tuple[str, object, str]] = [("job-name", plan.name, "name")]
    if res.partition:
        d.append(("partition", res.partition, "cluster.partition"))
    if res.account:
        d.append(("account", res.account, "cluster.account"))
    d.append(("nodes", res.nodes, "cluster.nodes"))
    d.append(("ntasks-per-node", res.tasks_per_node, "cluster.ntasks_per_node"))
    if res.gpus_per_node:
        # every rank sees all GPUs of its node and picks one by local rank: CUDA IPC between
        # ranks keeps working (F4: nccl#129, pyxis#73)
        d.append(("gpus-per-node", res.gpus_per_node, "cluster.gpus_per_node"))
    if res.cpus_per_task:
        d.append(("cpus-per-task", res.cpus_per_task, "cluster.cpus_per_task"))
    if res.mem_per_cpu:
        d.append(("mem-per-cpu", res.mem_per_cpu, "cluster.mem_per_cpu"))
    if res.time:
        d.append(("time", res.time, "cluster.time"))
    if plan.sweep:
        d.append(("array", f"0-{len(plan.sweep) - 1}", "cluster.sweep"))
        d.append(("output", "%x-%A_%a.out", "output"))
    else:
        d.append(("output", "%x-%j.out", "output"))
    return [f"#SBATCH --{opt}={sbatch_value(value, what)}" for opt, value, what in d]


def _image_default(img: Image) -> str:
    """Inside "${ENVBUILDER_IMAGE:-...}": $NAME references expand, nothing else does."""
    shown = shell_default(img.path, "cluster.image_path") if img.from_spec else img.path
    return "$JOB_DIR/" + shown if img.under_job_dir else shown


# --- sections -------------------------------------------------------------------------------------

def _usage(plan: JobPlan) -> list[str]:
    lines = [
        "Submit from this folder: sbatch job.sbatch [COMMAND...]   (default: "
        + ("cluster.command" if plan.command else "the smoke suite") + ")",
        "Overrides (environment): ENVBUILDER_DIR (this folder), "
        + ("ENVBUILDER_IMAGE, " if plan.runtime.container else "ENVBUILDER_VENV, ")
        + ("ENVBUILDER_STAGE_IMAGE=1 (the image copied to each node), " if plan.runtime.stages_image else "")
        + "OUTPUT_DIR, ENVBUILDER_LOCAL (node-local folder),",
        "  NCCL_SOCKET_IFNAME, ENVBUILDER_TENSORBOARD=1, ENVBUILDER_TIMELINE=1.",
    ]
    if plan.sweep:
        lines.append(f"Sweep: {len(plan.sweep)} array tasks; task i gets combination i and "
                     "its own folder $OUTPUT_DIR.")
    return lines


def _paths(plan: JobPlan) -> list[str]:
    out = [
        "",
        "note() { echo \"envbuilder: $*\" >&2; }",
        "die() { echo \"envbuilder: error: $*\" >&2; exit 2; }",
        "",
        "# The folder `envbuilder build` wrote (Slurm runs a copy of this script, so it is found",
        "# through the submit directory)",
        'JOB_DIR="${ENVBUILDER_DIR:-${SLURM_SUBMIT_DIR:-$PWD}}"',
    ]
    if plan.image:
        out.append(f'IMAGE="${{ENVBUILDER_IMAGE:-{_image_default(plan.image)}}}"')
        suffix = plan.runtime.image_fallback_suffix
        if suffix and not plan.image.from_spec:
            out += [f"# no {plan.image.path} here: the folder's {plan.image.path}{suffix} (envbuilder build --sif)",
                    f'if [ -z "${{ENVBUILDER_IMAGE:-}}" ] && [ ! -e "$IMAGE" ] && [ -f "$IMAGE{suffix}" ]; then '
                    f'IMAGE="$IMAGE{suffix}"; fi']
        out += attestation.batch_lines(plan)     # the file as given, before a runtime mounts it
        out += plan.runtime.check_image
        out.append("export IMAGE   # node_setup checks it on every node")
    if plan.sweep:
        out.append('OUTPUT_DIR="${OUTPUT_DIR:-$JOB_DIR/runs/${SLURM_ARRAY_JOB_ID:-local}}/'
                   'task-${SLURM_ARRAY_TASK_ID:-0}"')
    else:
        out.append('OUTPUT_DIR="${OUTPUT_DIR:-$JOB_DIR/runs/${SLURM_JOB_ID:-local}}"')
    out += [
        "# Rank 0 alone writes checkpoints and TensorBoard logs: the other ranks do not get",
        "# these variables (see rank_main below)",
        'mkdir -p "$OUTPUT_DIR"',
        'OUTPUT_DIR=$(realpath "$OUTPUT_DIR")',
        'CHECKPOINT_DIR="$OUTPUT_DIR/checkpoints" TENSORBOARD_DIR="$OUTPUT_DIR/tensorboard"',
        'mkdir -p "$CHECKPOINT_DIR" "$TENSORBOARD_DIR"',
        "export OUTPUT_DIR CHECKPOINT_DIR TENSORBOARD_DIR",
        "# Node-local folder of this job on every node: throw-away HOME, staged data",
        'LOCAL_ROOT="${ENVBUILDER_LOCAL:-' + (shell_default(plan.local_root, "cluster.local_scratch") if plan.local_root
                                             else "${SLURM_TMPDIR:-${TMPDIR:-/tmp}}") + '}"',
        'JOB_LOCAL="$LOCAL_ROOT/envbuilder.${SLURM_JOB_ID:-$$}"',
        "export JOB_LOCAL",
    ]
    out += nodelocal.batch_lines(plan)
    return out


def _sweep(plan: JobPlan) -> list[str]:
    combos = plan.sweep
    if not combos:
        return []
    names = [name for name, _ in combos[0]]
    out = ["",
           "# Hyper-parameter sweep (cluster.sweep / --sweep): array task i runs combination i",
           'case "${SLURM_ARRAY_TASK_ID:-0}" in']
    for i, combo in enumerate(combos):
        out.append(f"    {i}) " + " ".join(shell_assign(n, v, "cluster.sweep") for n, v in combo) + " ;;")
    out += [f'    *) die "array task ${{SLURM_ARRAY_TASK_ID:-}} is outside the sweep (0-{len(combos) - 1})" ;;',
            "esac",
            "export " + " ".join(names),
            "{",
            *[f"    printf '%s=%s\\n' {n} \"${n}\"" for n in names],
            '} > "$OUTPUT_DIR/sweep.env"',
            'note "sweep task ${SLURM_ARRAY_TASK_ID:-0}: $(paste -sd " " "$OUTPUT_DIR/sweep.env")"']
    return out


def _environment(plan: JobPlan) -> list[str]:
    net = plan.network
    out = [
        "",
        "# Cores per rank: srun must be told again (Slurm >= 22.05 no longer passes",
        "# --cpus-per-task to steps; reframe#2655); threads follow the cores",
        'export SRUN_CPUS_PER_TASK="${SLURM_CPUS_PER_TASK:-1}"',
    ]
    if plan.torchrun:
        out += ["# torchrun mode: the node's task holds the cores of all its ranks",
                "# (ENVBUILDER_RANKS_PER_NODE: what `envbuilder verify --slurm --ranks N` asks)",
                f'RANKS_PER_NODE="${{ENVBUILDER_RANKS_PER_NODE:-{plan.ranks_per_node}}}"',
                'export OMP_NUM_THREADS=$(( SRUN_CPUS_PER_TASK / RANKS_PER_NODE > 0 ? '
                'SRUN_CPUS_PER_TASK / RANKS_PER_NODE : 1 ))']
    else:
        out.append('export OMP_NUM_THREADS="$SRUN_CPUS_PER_TASK"')
    if plan.cpu_env:
        out.append("# CPU TensorFlow: oneDNN on, OpenMP threads do not spin, compact binding (seeds);")
        out.append("# the smoke suite's env.cpu_threads checks every rank sees these (manifest cpu_env)")
        out.append("export " + " ".join(shell_assign(k, v) for k, v in plan.cpu_env))
    out += [
        "# Hygiene (F5, F9): no ~/.local packages, no module-set PYTHONPATH, a fixed locale,",
        "# a throw-away HOME per job on node-local storage (caches, ~/.nv, ~/.triton)",
        "export PYTHONNOUSERSITE=1 LC_ALL=C.UTF-8 LANG=C.UTF-8",
        "unset PYTHONPATH PYTHONHOME",
        'export HOME="$JOB_LOCAL/home"',
    ]
    if plan.gpu:
        out += ["# GPUs: JIT caches off the shared file system; NCCL errors surface instead of hanging",
                "export CUDA_CACHE_DISABLE=1 TORCH_NCCL_ASYNC_ERROR_HANDLING=1",
                'export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"']
    if net.interface:
        out += ["# Bootstrap NCCL and Gloo on the site's fast network (a wrong interface hangs init, F10)",
                f'export NCCL_SOCKET_IFNAME="${{NCCL_SOCKET_IFNAME:-{shell_default(net.interface, "cluster.network_interface")}}}"',
                'export GLOO_SOCKET_IFNAME="$NCCL_SOCKET_IFNAME" HOROVOD_GLOO_IFACE="$NCCL_SOCKET_IFNAME"',
                "# Open MPI (Horovod's MPI controller) otherwise tries every interface between nodes;",
                "# it takes names only (not NCCL's ^exclude / =exact forms)",
                'case $NCCL_SOCKET_IFNAME in',
                '    ^*|=*) ;;',
                '    *) export OMPI_MCA_btl_tcp_if_include="${OMPI_MCA_btl_tcp_if_include:-$NCCL_SOCKET_IFNAME}" \\',
                '              OMPI_MCA_oob_tcp_if_include="${OMPI_MCA_oob_tcp_if_include:-$NCCL_SOCKET_IFNAME}"',
                "       # libfabric's tcp provider (Intel MPI, MPICH ch4:ofi) and UCX (the MPICH wheel's ch4:ucx)",
                "       # pick interfaces themselves; a peer's management address hangs until TCP gives up",
                "       # (docs/mpi.md). UCX_NET_DEVICES limits every UCX network, so only where the node has",
                "       # no RDMA device: TCP is then all UCX has (shared memory is not a network device)",
                '       export FI_TCP_IFACE="${FI_TCP_IFACE:-$NCCL_SOCKET_IFNAME}"',
                '       [ -e /dev/infiniband ] || export UCX_NET_DEVICES="${UCX_NET_DEVICES:-$NCCL_SOCKET_IFNAME}" ;;',
                'esac']
    if net.fabric:
        out += [f"# The nodes' fabric ({net.fabric}): verify's fabric check reads it; its tested variables",
                "# (compat/catalog.yaml `fabrics`, each with its source) as defaults; cluster.env overrides",
                f'export ENVBUILDER_FABRIC="${{ENVBUILDER_FABRIC:-{shell_default(net.fabric, "cluster.fabric")}}}"']
        out += [f'export {k}="${{{k}:-{shell_default(v, f"fabrics.{net.fabric}.env.{k}")}}}"'
                for k, v in net.fabric_env]
    if net.bandwidth_floor:
        floors = ";".join(f"{k}={v}" for k, v in net.bandwidth_floor)
        out += ["# Allreduce bus bandwidth floors (cluster.bandwidth_floor): the smoke suite fails below them",
                f'export ENVBUILDER_BANDWIDTH_FLOOR="${{ENVBUILDER_BANDWIDTH_FLOOR:-{shell_default(floors, "cluster.bandwidth_floor")}}}"']
    if plan.env:
        out.append("# The site's and spec's extra variables (cluster.env)")
        out += ["export " + shell_assign(k, v, f"cluster.env.{k}") for k, v in plan.env]
    out += [
        "# torch.distributed rendezvous: the first node, a port derived from the job id",
        'MASTER_ADDR=$(scontrol show hostnames "${SLURM_JOB_NODELIST:-$(hostname)}" 2>/dev/null | head -n 1)',
        'MASTER_ADDR="${MASTER_ADDR:-$(hostname)}"',
        'export MASTER_ADDR MASTER_PORT=$((20000 + ${SLURM_JOB_ID:-0} % 20000))',
    ]
    out += tfconfig.batch_lines(plan)
    if plan.host:
        out += _host_env(plan.host)
    return out


def _host_env(host: HostSoftware) -> list[str]:
    out = ["", "# Host runtime: the nodes' own software (environment modules, a virtual environment)"]
    if host.modules:
        out += [
            "if ! command -v module >/dev/null 2>&1; then",
            "    for f in /etc/profile.d/lmod.sh /etc/profile.d/modules.sh; do",
            "        # shellcheck source=/dev/null",
            '        if [ -r "$f" ]; then . "$f"; break; fi',
            "    done",
            "fi",
            "module load " + " ".join(shell_word(m, "cluster.modules") for m in host.modules),
        ]
    venv = f'${{ENVBUILDER_VENV:-{shell_default(host.venv, "cluster.venv")}}}' if host.venv else "${ENVBUILDER_VENV:-}"
    out += [
        f'VENV="{venv}"',
        'if [ -n "$VENV" ]; then',
        '    [ -x "$VENV/bin/python" ] || die "virtual environment \'$VENV\' has no bin/python (cluster.venv, ENVBUILDER_VENV)"',
        '    export VIRTUAL_ENV="$VENV" PATH="$VENV/bin:$PATH"',
        "fi",
    ]
    return out


def _binds(plan: JobPlan) -> list[str]:
    container = plan.runtime.container
    out = [
        "",
        "# Bind mounts (cluster.binds): symlinks resolved to real paths, every source checked",
        "# before any rank starts: a missing path stops the job here, naming it (F7)",
        "binds=()",
        "add_bind() {",
        '    local spec=$1 src rest',
        '    src=${spec%%:*}',
        '    rest=${spec#"$src"}',
        '    [ -e "$src" ] || die "bind source \'$src\' does not exist on $(hostname) ($2)"',
        '    src=$(realpath "$src")',
        '    binds+=("$src${rest:-:$src}")',
        "}",
    ]
    for bind in plan.binds:
        out.append(f"add_bind {shell_word(bind, 'cluster.binds')} cluster.binds")
    if plan.site_mpi:
        out += _site_mpi_binds(plan.site_mpi, container)
    if container:
        out += ["# The job's own folders, at the same paths inside the image",
                'add_bind "$OUTPUT_DIR" "the output folder"',
                "make_job_local",
                'add_bind "$JOB_LOCAL" "the node-local folder"']
    out += staging.check_lines(plan)
    out += ["# ...and again on every node by node_setup, before any rank: a path that exists here but",
            "# not on another node stops the job there, naming the node (F7)",
            'ENVBUILDER_BINDS=$(declare -p binds)',
            "export ENVBUILDER_BINDS"]
    if container:
        out.append("runtime_args=()")
        out += plan.runtime.bind_args
    return out


def _site_mpi_binds(site_mpi: SiteMpi, container: bool) -> list[str]:
    """cluster.site_mpi: the site's MPI folders bound at their own paths through the runtime's
    bind arguments (apptainer --bind, charliecloud -b, pyxis --container-mounts: binds[] below),
    put first on the library path by rank_main inside the container, so that the dynamic loader
    picks the site's libmpi before the image's (LD_LIBRARY_PATH is searched before the RUNPATH
    the image's mpicc wrote)."""
    paths = [shell_word(p, "cluster.site_mpi") for p in site_mpi.paths]
    out = ["# The site's MPI (cluster.site_mpi, ABI " + (site_mpi.abi or "unstated") + "): every path bound",
           "# at the same place, its folders first on each rank's library path (rank_main)",
           f"site_mpi=({' '.join(paths)})",
           'site_mpi_path=""',
           'for p in "${site_mpi[@]}"; do',
           '    [ -e "$p" ] || die "site MPI path \'$p\' (cluster.site_mpi) does not exist on $(hostname)"',
           '    p=$(realpath "$p")',
           '    add_bind "$p" cluster.site_mpi' if container else "    :",
           '    if [ -d "$p" ]; then site_mpi_path="${site_mpi_path:+$site_mpi_path:}$p"; '
           'else site_mpi_path="${site_mpi_path:+$site_mpi_path:}${p%/*}"; fi',
           "done",
           'ENVBUILDER_SITE_MPI_PATH=$site_mpi_path',
           'ENVBUILDER_SITE_MPI_DIR=${site_mpi_path%%:*}   # where verify expects every rank\'s libmpi',
           'ENVBUILDER_SITE_MPI_LIST=$(declare -p site_mpi)',
           "export ENVBUILDER_SITE_MPI_PATH ENVBUILDER_SITE_MPI_DIR ENVBUILDER_SITE_MPI_LIST"]
    for key, value in site_mpi.env:
        out.append(f"export {key}={shell_word(value, 'cluster.site_mpi_env')}")
    return out


def _over_the_image(plan: JobPlan) -> list[str]:
    """A runtime that keeps the image's value of a variable the image also sets (Apptainer: only
    unset variables pass from the host) gets the job's own choices (cluster.env, the site MPI's
    variables, the fabric's) under its prefix, which wins; and the site's MPI first on the library
    path through its own variable, the image's path after it (expanded inside the container)."""
    prefix = plan.runtime.env_prefix
    names = dict.fromkeys([k for k, _ in plan.env] + [k for k, _ in plan.network.fabric_env]
                          + [k for k, _ in (plan.site_mpi.env if plan.site_mpi else ())])
    if not prefix:
        return []
    out = [""]
    if names or plan.site_mpi:
        out += [f"# {plan.runtime.name} keeps the image's value of a variable its image sets (ENV, %environment):",
                "# only unset ones pass from here, so an exported choice the image also makes was dropped",
                "# without a word (run here: OMPI_MCA_btl_vader_single_copy_mechanism=cma stayed the image's",
                f"# none). {prefix}NAME wins over the image; {plan.runtime.name} evaluates its value once more",
                "# inside the container, so \\, $ and ` are escaped",
                "image_escape() {",
                "    local v=$1",
                r"    v=${v//\\/\\\\}",
                r"    v=${v//\$/\\\$}",
                r"    v=${v//\`/\\\`}",
                "    printf '%s' \"$v\"",
                "}"]
    if names:
        out += [f"image_vars=({' '.join(names)})",
                'for v in "${image_vars[@]}"; do',
                f'    if [ -n "${{!v+set}}" ]; then export "{prefix}$v=$(image_escape "${{!v}}")"; fi',
                "done"]
    site = plan.site_mpi is not None
    out += [f"# The library path the ranks get: {prefix}LD_LIBRARY_PATH set before the job (by a site module)",
            "# replaces the image's own unless it names \\$LD_LIBRARY_PATH; it is kept and said"
            + (", after the site's MPI, which goes first by the runtime's own mechanism (binds above +" if site
               else ""),
            *(["# this variable; \\$LD_LIBRARY_PATH is the image's own, expanded inside the container)"] if site else []),
            "image_library_path() {",
            f'    local set="${{{prefix}LD_LIBRARY_PATH:-}}"',
            '    if [ -n "$set" ]; then',
            '        case $set in',
            '            *"\\$LD_LIBRARY_PATH"*|*"\\${LD_LIBRARY_PATH"*) '
            f'note "{prefix}LD_LIBRARY_PATH is set ($set): kept for the ranks" ;;',
            f'            *) note "{prefix}LD_LIBRARY_PATH is set ($set): it replaces the image\'s own library '
            f'path in every rank; to keep the image\'s, end it with :\\\\\\$LD_LIBRARY_PATH" ;;',
            "        esac",
            "    fi",
            *([f'    if [ -n "$set" ]; then {prefix}LD_LIBRARY_PATH="$(image_escape "$ENVBUILDER_SITE_MPI_PATH"):$set"',
               f'    else {prefix}LD_LIBRARY_PATH="$(image_escape "$ENVBUILDER_SITE_MPI_PATH"):\\$LD_LIBRARY_PATH"; fi',
               f"    export {prefix}LD_LIBRARY_PATH"] if site else []),
            "}",
            "image_library_path"]
    return out


def _pmix_remap(plan: JobPlan) -> list[str]:
    if not plan.pmix_modules:
        return []
    out = ["    # srun --mpi=pmix: the PMIx modules the server offers that every client has (not munge)"]
    for offer, param, module in plan.pmix_modules:
        out.append(f'    if [ -z "${{{param}:-}}" ]; then case ",${{{offer}:-}}," in *,{module},*) '
                   f"export {param}={module} ;; esac; fi")
    return out


def _rank_setup(plan: JobPlan) -> list[str]:
    return [
        "",
        "# Every rank starts through rank_main: its identity for torch.distributed, and only",
        "# rank 0 keeps the checkpoint and TensorBoard folders",
        "rank_main() {",
        "    # inside the srun step: srun's task ids (torchrun sets its own: TORCHELASTIC_RUN_ID)",
        '    if [ -z "${TORCHELASTIC_RUN_ID:-}" ]; then',
        '        export RANK="${SLURM_PROCID:-0}" LOCAL_RANK="${SLURM_LOCALID:-0}" WORLD_SIZE="${SLURM_NTASKS:-1}"',
        '        export LOCAL_WORLD_SIZE="${SLURM_NTASKS_PER_NODE:-${SLURM_TASKS_PER_NODE%%(*}}"',
        "    fi",
        *_pmix_remap(plan),
        *tfconfig.rank_lines(plan),
        *preflight.rank_lines(plan),
        *(['    # the site\'s MPI before the image\'s own (cluster.site_mpi; already first where the',
           '    # runtime put it there)',
           '    case ":${LD_LIBRARY_PATH:-}:" in',
           '        ":$ENVBUILDER_SITE_MPI_PATH:"*) ;;',
           '        *) export LD_LIBRARY_PATH="$ENVBUILDER_SITE_MPI_PATH${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ;;',
           '    esac',
           "    # mpi4py >= 4 dlopens the venv's own lib/libmpi by full path before the loader's search",
           '    export MPI4PY_LIBMPI="$ENVBUILDER_SITE_MPI_DIR"']
          if plan.site_mpi else []),
        '    if [ "$RANK" != 0 ]; then unset CHECKPOINT_DIR TENSORBOARD_DIR; fi',
        '    exec "$@"',
        "}",
        "# One task per node: the node-local folder (HOME, staged data)"
        + (", the GPU preflight" if plan.gpu else ""),
        "node_setup() {",
        f'    [ "$(uname -m)" = {plan.arch} ] || die "node $(hostname) is $(uname -m), but the image is built for '
        f'{plan.arch}: ask for {plan.arch} nodes (--partition), or build the image with arch: $(uname -m)"',
        '    mkdir -p "$HOME"',
        '    local b',
        '    eval "$ENVBUILDER_BINDS"',
        *(['    local p',
           '    eval "$ENVBUILDER_SITE_MPI_LIST"',
           '    for p in "${site_mpi[@]}"; do',
           '        [ -e "$p" ] || die "site MPI path \'$p\' (cluster.site_mpi) does not exist on node $(hostname)"',
           "    done"] if plan.site_mpi else []),
        '    for b in "${binds[@]}"; do',
        '        [ -e "${b%%:*}" ] || die "bind source \'${b%%:*}\' does not exist on node $(hostname)"',
        "    done",
        *(['    case $IMAGE in  # a file or folder (not a registry reference pyxis pulls)',
           '        /*|./*|../*) [ -e "$IMAGE" ] || die "image \'$IMAGE\' does not exist on node $(hostname)" ;;',
           '    esac'] if plan.runtime.container and not plan.runtime.stages_image else []),
        *(['    local image=${IMAGE_SRC:-$IMAGE}   # staged: the copy is made below',
           '    [ -e "$image" ] || die "image \'$image\' does not exist on node $(hostname)"']
          if plan.runtime.stages_image else []),
        *(["    gpu_preflight"] if plan.gpu else []),
        *staging.node_setup_lines(plan),
        *attestation.node_lines(plan),    # after staging: the file the ranks will open
        "}",
        "export -f note die rank_main node_setup" + (" gpu_preflight version_lt" if plan.gpu else "")
        + tfconfig.export_names(plan),
        *nodelocal.function_lines(plan),
    ]


def _monitoring(plan: JobPlan) -> list[str]:
    tb = "1" if plan.tensorboard else "0"
    tl = "1" if plan.timeline else "0"
    srun_one = ('srun --overlap --nodes=1 --ntasks=1 --nodelist="$MASTER_ADDR" --mpi=none'
                f'{plan.runtime.srun_extra} "${{launch[@]}}"')
    return [
        "",
        "# Monitoring (cluster.monitor): the Horovod timeline is written by rank 0 and covers all",
        "# ranks; TensorBoard has no login, so it listens on 127.0.0.1 and is reached by ssh -L",
        f'if [ "${{ENVBUILDER_TIMELINE:-{tl}}}" = 1 ]; then',
        '    export HOROVOD_TIMELINE="$OUTPUT_DIR/horovod-timeline.json" HOROVOD_TIMELINE_MARK_CYCLES=1',
        '    note "Horovod timeline: $HOROVOD_TIMELINE (open it in chrome://tracing or ui.perfetto.dev)"',
        "fi",
        f'if [ "${{ENVBUILDER_TENSORBOARD:-{tb}}}" = 1 ]; then',
        "    TB_PORT=$((16006 + ${SLURM_JOB_ID:-0} % 10000))",
        f'    {srun_one} \\',
        '        tensorboard --logdir "$TENSORBOARD_DIR" --host 127.0.0.1 --port "$TB_PORT" \\',
        '        > "$OUTPUT_DIR/tensorboard.log" 2>&1 &',
        "    tb_pid=$!",
        '    note "TensorBoard on $MASTER_ADDR:$TB_PORT; from your computer run:"',
        '    note "  ssh -N -L $TB_PORT:127.0.0.1:$TB_PORT -J ${SLURM_SUBMIT_HOST:-LOGIN-NODE} $MASTER_ADDR"',
        '    note "  then open http://localhost:$TB_PORT"',
        "fi",
    ]


def _launch(plan: JobPlan) -> list[str]:
    rt = plan.runtime
    gpu_bind = " --gpu-bind=none" if plan.resources.gpus_per_node else ""
    opts = vetting.rank_opts() if plan.vet_min_nodes else ""
    out = ["", *staging.image_lines(plan), *rt.launch, *attestation.launch_lines(plan), ""]
    out += nodelocal.launch_lines(plan)
    out += vetting.lines(plan)
    out += _monitoring(plan)
    if plan.torchrun:
        out += _torchrun_launch(plan, gpu_bind + opts)
    else:
        out += [
            "",
            f"# The hybrid model: srun --mpi={plan.pmi} starts one rank per "
            + ("GPU" if plan.resources.gpus_per_node else "task") + "; the MPI in the image must speak",
            "# the same PMI as this Slurm (F1)" + ("; --gpu-bind=none keeps all node GPUs visible (F4)"
                                                 if gpu_bind else ""),
        ]
        if plan.torch_srun:
            out += ["# torch.distributed, srun mode: one task per rank, srun binds its CPUs; rank_main",
                    "# exports RANK/LOCAL_RANK/WORLD_SIZE inside the step (MASTER_ADDR/PORT: above)"]
        out += [
            "run_ranks() {",
            f"    srun --mpi={plan.pmi} --kill-on-bad-exit=1{gpu_bind}{opts}{rt.srun_extra} \\",
            "        \"${launch[@]}\" bash -c 'rank_main \"$@\"' rank \"$@\"",
            "}",
        ]
    out += [
        "",
        'note "job ${SLURM_JOB_ID:-local}: ${SLURM_NTASKS:-1} rank(s) on ${SLURM_JOB_NUM_NODES:-1} node(s), '
        + rt.name + ', output in $OUTPUT_DIR"',
        'if [ "$#" -gt 0 ]; then',
        '    run_ranks "$@"',
    ]
    if plan.command:
        out += ["else",
                "    # cluster.command (its variables expand here, once for the whole job)",
                f"    run_ranks {plan.command}"]
    else:
        out += ["else", "    run_smoke"]
    out.append("fi")
    return out


def _torchrun_launch(plan: JobPlan, gpu_bind: str) -> list[str]:
    """torch.distributed, torchrun mode: one Slurm task per node runs torchrun, which starts the
    node's ranks and meets the other nodes at a c10d rendezvous on the first node."""
    nnodes = "${RANK_NODES:-${SLURM_JOB_NUM_NODES:-1}}" if plan.vet_min_nodes else "${SLURM_JOB_NUM_NODES:-1}"
    return [
        "",
        "# torchrun mode: one task per node; torchrun starts RANKS_PER_NODE ranks there and the",
        "# nodes meet at the c10d rendezvous on the first node (MASTER_ADDR:MASTER_PORT), keyed by",
        "# the job id. torchrun cannot bind CPUs per rank (srun mode can)",
        "run_nodes() {",
        f'    srun --mpi=none --kill-on-bad-exit=1 --ntasks-per-node=1 --ntasks="${{SLURM_JOB_NUM_NODES:-1}}"'
        f'{gpu_bind}{plan.runtime.srun_extra} \\',
        '        "${launch[@]}" "$@"',
        "}",
        "run_ranks() {",
        "    run_nodes python -m torch.distributed.run \\",
        f'        --nnodes="{nnodes}" --nproc_per_node="$RANKS_PER_NODE" \\',
        '        --rdzv_backend=c10d --rdzv_endpoint="$MASTER_ADDR:$MASTER_PORT" \\',
        '        --rdzv_id="${SLURM_JOB_ID:-0}" --no-python bash -c \'rank_main "$@"\' rank "$@"',
        "}",
    ]


def _smoke(plan: JobPlan) -> list[str]:
    """The smoke suite through this wrapper: what `envbuilder verify --slurm` submits."""
    gpu = " --require-gpu" if plan.gpu else ""
    out = [
        "",
        "# No command: the smoke suite, through exactly the path a training job takes. Every rank",
        "# runs it; rank 0 adds the static checks, watches the ranks (a crash or a hang stops them",
        "# all after ENVBUILDER_SMOKE_TIMEOUT s in one check) and writes the report + the table.",
        "run_smoke() {",
    ]
    if plan.runtime.container:
        out.append(f'    local manifest="${{ENVBUILDER_MANIFEST:-{IMAGE_MANIFEST}}}"')
    else:
        out += ['    local manifest="${ENVBUILDER_MANIFEST:-$JOB_DIR/manifest.json}"',
                '    export PYTHONPATH="$JOB_DIR"   # the suite as `envbuilder build` wrote it']
    if plan.torchrun:
        # the suite's launcher runs on every node and starts torchrun itself; the first node's reports
        out += [
            f"    run_nodes python -m {SMOKE_DIR} --launcher torchrun \\",
            '        --ranks "$(( ${SLURM_JOB_NUM_NODES:-1} * RANKS_PER_NODE ))" \\',
            '        --manifest "$manifest" --workdir "$OUTPUT_DIR/smoke" \\',
            f'        --timeout "${{ENVBUILDER_SMOKE_TIMEOUT:-120}}" --report "$OUTPUT_DIR/smoke-report.json"{gpu}',
            "}",
        ]
        return out
    out += [
        f"    run_ranks python -m {SMOKE_DIR} --manifest \"$manifest\" --workdir \"$OUTPUT_DIR/smoke\" \\",
        f'        --timeout "${{ENVBUILDER_SMOKE_TIMEOUT:-120}}" --report "$OUTPUT_DIR/smoke-report.json"{gpu}',
        "}",
    ]
    return out


def render_sbatch(plan: JobPlan) -> str:
    lines = ["#!/bin/bash"]
    lines += _directives(plan)
    lines += header("#", f"Slurm job for {plan.name} ({plan.runtime.name} runtime)", plan.spec_sha256,
                    _usage(plan))
    lines += ["set -euo pipefail",
              "ulimit -c 0   # no core-dump floods from many ranks"]
    lines += _paths(plan)
    lines += _sweep(plan)
    lines += _environment(plan)
    lines += _binds(plan)
    lines += _over_the_image(plan)
    lines += staging.function_lines(plan)
    lines += staging.image_function_lines(plan)
    lines += preflight.function_lines(plan)
    lines += tfconfig.function_lines(plan)
    lines += _rank_setup(plan)
    if not plan.command:
        lines += _smoke(plan)
    lines += _launch(plan)
    return "\n".join(lines) + "\n"


def render_epilog(plan: JobPlan) -> str | None:
    """slurm-epilog.sh for `cluster.local_cleanup: epilog`: the node Epilog a site installs."""
    if plan.cleanup != "epilog":
        return None
    first, rest = nodelocal.epilog_text(plan.epilog_root).split("\n", 1)
    head = header("#", f"Node Epilog for the jobs of {plan.name}", plan.spec_sha256, [])
    return "\n".join([first, *head, rest])
