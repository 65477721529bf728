"""The job's plan: every decision the job script makes, computed once from the Stack (the spec
with its site profile and job options already applied). A renderer formats a JobPlan and decides
nothing: render/sbatch.py writes job.sbatch (and slurm-epilog.sh) from it; another job format is
another renderer of the same plan.

The script's failure modes (F1-F10) are those of shared/research/slurm.md; the renderer's comments
name them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .components.framework import cpu_env as framework_cpu_env
from ..stack import Stack
from ..runtimes import runtime as runtime_for
from ..slurm import sweeps
from ..slurm.preflight import GpuNeeds, needs as gpu_needs

# Slurm's pmix plugin offers each task the server's PMIx modules (PMIX_SECURITY_MODE=munge,native and
# PMIX_GDS_MODULE=ds21,ds12,hash from Slurm 22.05's pmix_v4 here). pyxis hands them to the client in
# the container as PMIX_MCA_psec/gds/ptl (NVIDIA/pyxis pyxis_slurmstepd.c, pmix_remap_list), but a
# client stops at a listed module it lacks ("psec munge" not found: pyxis #139, and the Open MPI wheel
# here). So the client gets the module every PMIx build has, when the server offers it: native (psec),
# hash (gds); a value the image set is kept; the transport follows PMIX_SERVER_URI as it is.
PMIX_COMMON = (("PMIX_SECURITY_MODE", "PMIX_MCA_psec", "native"), ("PMIX_GDS_MODULE", "PMIX_MCA_gds", "hash"))

Pairs = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class JobRuntime:
    """How one rank enters the image: the runtime's (runtimes/ REGISTRY) answers for this job."""

    name: str
    container: bool                  # False: the nodes' own software (the host runtime)
    srun_extra: str                  # words srun gets before the launch prefix
    check_image: tuple[str, ...]     # shell lines: the image exists
    bind_args: tuple[str, ...]       # shell lines: binds[] -> runtime_args[]
    launch: tuple[str, ...]          # shell lines: launch[], the prefix of every rank
    cleanup: tuple[str, ...]         # shell lines of cleanup(), before the node-local folders go
    env_prefix: str = ""             # variables with this prefix win over the image's (Apptainer)
    stages_image: bool = False       # ENVBUILDER_STAGE_IMAGE=1 copies the image file to every node
    launches_on_host: bool = True    # launch[] runs on the host before the runtime opens the image
    image_fallback_suffix: str = ""  # the default image's other name when it is not there (<name>.sif)


@dataclass(frozen=True)
class Resources:
    """What the job asks Slurm for, per Slurm task (torchrun mode: one task per node)."""

    partition: str | None
    account: str | None
    nodes: int
    tasks_per_node: int
    gpus_per_node: int | None        # every rank sees all of its node's GPUs (F4)
    cpus_per_task: int | None
    mem_per_cpu: str | None
    time: str | None


@dataclass(frozen=True)
class Image:
    """Where a container runtime finds the image (ENVBUILDER_IMAGE overrides it at submit time)."""

    path: str
    from_spec: bool                  # cluster.image_path (else the folder's default file name)
    under_job_dir: bool              # a relative path: inside the job folder


@dataclass(frozen=True)
class Network:
    interface: str | None            # NCCL/Gloo/MPI bootstrap interface (F10)
    fabric: str | None
    fabric_env: Pairs                # the fabric's tested variables (catalog), as defaults
    bandwidth_floor: Pairs


@dataclass(frozen=True)
class HostSoftware:
    """The host runtime: the nodes' environment modules and virtual environment."""

    modules: tuple[str, ...]
    venv: str | None


@dataclass(frozen=True)
class SiteMpi:
    """cluster.site_mpi: the site's MPI bound in and put first on every rank's library path."""

    paths: tuple[str, ...]
    abi: str | None
    env: Pairs


@dataclass(frozen=True)
class AttestGate:
    """cluster.attestation (require | warn): the image must carry a signed attestation of a
    passing verify of this stack (docs/attestation.md), checked before any rank starts."""

    policy: str
    keys: tuple[str, ...]            # trusted public keys (paths on the cluster)
    stack: str                       # lock:HEX (built from a lock) or spec:HEX, as the attestation records


@dataclass(frozen=True)
class JobPlan:
    name: str
    spec_sha256: str
    runtime: JobRuntime
    resources: Resources
    pmi: str                         # srun --mpi=<pmi>: the PMI the image's MPI speaks (F1)
    launch_mode: Literal["srun", "torchrun"]   # srun: one Slurm task per rank; torchrun: one per node
    ranks_per_node: int
    torch_srun: bool                 # torch.distributed started by srun (rank_main sets its variables)
    pmix_modules: tuple[tuple[str, str, str], ...]   # (offered, client parameter, module) to hand over
    command: str | None              # cluster.command; None: the smoke suite
    sweep: tuple[Pairs, ...]         # array task i -> its values
    image: Image | None              # None: the host runtime
    local_root: str | None           # cluster.local_scratch
    cleanup: str                     # who removes the node-local folder: job | epilog | slurm
    epilog_root: str | None          # the local root as a literal path, for the site's Epilog
    cpu_env: Pairs                   # CPU TensorFlow's oneDNN / OpenMP variables
    network: Network
    env: Pairs                       # cluster.env
    host: HostSoftware | None        # only for the host runtime
    binds: tuple[str, ...]
    site_mpi: SiteMpi | None
    stage: str | None                # data staged once per node
    tensorboard: bool
    timeline: bool
    vet_min_nodes: int               # 0: no node vetting
    tf_config: str | None            # tf-multiworker: keep | replace a TF_CONFIG given to the job
    gpu: GpuNeeds | None             # None: a CPU image (no GPU preflight)
    arch: str = "x86_64"             # the image's CPU architecture (uname -m), held against every node
    attestation: AttestGate | None = None   # None: no gate (off, unset, or the host runtime)

    @property
    def torchrun(self) -> bool:
        return self.launch_mode == "torchrun"


def pmi_plugin(stack: Stack) -> str:
    cl, spec = stack.spec.cluster, stack.spec
    if cl.pmi:
        return cl.pmi
    if spec.mpi:
        return spec.mpi.pmi
    if stack.ngc and stack.ngc.get("mpi"):
        return "pmix"
    return "none"


def local_root_literal(root: str | None) -> str | None:
    """The local root as a literal path when the site gives one (an Epilog has no job variables)."""
    if root and root.startswith("/") and "$" not in root and "`" not in root:
        return root.rstrip("/") or "/"
    return None


def plan_job(stack: Stack) -> JobPlan:
    spec, cl = stack.spec, stack.spec.cluster
    rt = runtime_for(cl.runtime)
    torchrun = spec.distributed.torch and spec.distributed.launcher == "torchrun"
    ranks = cl.ntasks_per_node or cl.gpus_per_node or 1
    pmi = pmi_plugin(stack)
    combos = sweeps.combinations(sweeps.grid(cl.sweep))
    cleanup = cl.local_cleanup or "job"
    image = None
    if rt.container:
        path = cl.image_path
        image = (Image(path, True, not path.startswith(("/", "$", "~")) and "://" not in path) if path
                 else Image(f"{spec.name}{rt.image_suffix}", False, True))
    return JobPlan(
        name=spec.name,
        spec_sha256=spec.sha256(),
        runtime=JobRuntime(rt.name, rt.container, rt.srun_extra, tuple(rt.job_check_image()),
                           tuple(rt.job_bind_args()), tuple(rt.job_launch(spec.cuda is not None)),
                           tuple(rt.job_cleanup()), rt.env_prefix,
                           rt.stages_image, rt.launches_on_host, rt.image_fallback_suffix),
        resources=Resources(cl.partition, cl.account, cl.nodes, 1 if torchrun else ranks, cl.gpus_per_node,
                            cl.cpus_per_task * (ranks if torchrun else 1) if cl.cpus_per_task else None,
                            cl.mem_per_cpu, cl.time),
        pmi=pmi,
        launch_mode="torchrun" if torchrun else "srun",
        ranks_per_node=ranks,
        torch_srun=spec.distributed.torch and not torchrun,
        pmix_modules=PMIX_COMMON if rt.container and pmi.startswith("pmix") else (),
        command=cl.command,
        sweep=tuple(tuple(combo.items()) for combo in combos),
        image=image,
        local_root=cl.local_scratch,
        cleanup=cleanup,
        epilog_root=local_root_literal(cl.local_scratch) if cleanup == "epilog" else None,
        cpu_env=tuple(framework_cpu_env(stack).items()) if stack.cpu_threads_env else (),
        network=Network(cl.network_interface, cl.fabric, tuple(stack.fabric_env.items()) if cl.fabric else (),
                        cl.bandwidth_floor),
        env=cl.env,
        host=None if rt.container else HostSoftware(cl.modules, cl.venv),
        binds=cl.binds,
        site_mpi=SiteMpi(cl.site_mpi, cl.site_mpi_abi, cl.site_mpi_env) if cl.site_mpi else None,
        stage=cl.stage,
        tensorboard="tensorboard" in cl.monitor,
        timeline="timeline" in cl.monitor,
        vet_min_nodes=cl.vet_min_nodes or 0,
        tf_config=(spec.distributed.tf_config or "keep") if spec.distributed.kind == "tf-multiworker" else None,
        gpu=gpu_needs(stack),
        arch=spec.target_arch,
        attestation=attest_gate(stack) if image is not None else None,
    )


def attest_gate(stack: Stack) -> AttestGate | None:
    cl = stack.spec.cluster
    if cl.attestation in (None, "off"):
        return None
    if not cl.attestation_keys:
        from ..errors import EnvbuilderError

        raise EnvbuilderError("cluster.attestation_keys", f"attestation: {cl.attestation} needs the trusted public "
                              "keys, and none is given", "list the site's PEM public keys (absolute paths) under "
                              "attestation_keys in the site profile, or set attestation: off")
    from ..attest.statement import image_spec_sha256

    stack_id = (f"lock:{stack.lock.sha256()}" if stack.lock is not None
                else f"spec:{image_spec_sha256(stack.spec.canonical())}")
    return AttestGate(cl.attestation, cl.attestation_keys, stack_id)
