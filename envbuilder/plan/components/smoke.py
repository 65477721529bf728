"""The manifest and the smoke suite, shipped in every image so `envbuilder verify` can compare
what is inside with what was asked for."""

from __future__ import annotations

from ...paths import PREFIX, SMOKE_DIR
from ..image import Copy, Step
from ...spec.presets import describe
from ...stack import Stack
from .python import python_exe
from ...smoke.tf_coordination import PTH_LINE

MANIFEST = "manifest.json"


def install(stack: Stack) -> list:
    py = python_exe(stack)
    return [
        Copy(MANIFEST, f"{PREFIX}/{MANIFEST}"),
        Copy(SMOKE_DIR, f"{PREFIX}/{SMOKE_DIR}"),
        Step("smoke", "make the smoke suite importable as `python -m envbuilder_smoke`", [
            f"{py} -c 'import sysconfig; "
            f"open(sysconfig.get_paths()[\"purelib\"] + \"/envbuilder.pth\", \"w\").write("
            f"\"{PREFIX}\\n{start_up_hook(stack)}\")'",
            f"{py} -B -m {SMOKE_DIR} --help > /dev/null",   # -B: no .pyc with build times
        ]),
    ]


def start_up_hook(stack: Stack) -> str:
    """The .pth's import line, TensorFlow images only: the coordination service's heartbeat timeout
    from ENVBUILDER_TF_HEARTBEAT_S, when a job sets it (envbuilder_smoke/tf_coordination.py;
    job.sbatch of a tf-multiworker job does)."""
    if stack.spec.framework.module != "tensorflow":
        return ""
    return PTH_LINE + "\\n"


def test_command(stack: Stack) -> list[str]:
    return ["python", "-m", SMOKE_DIR, "--manifest", f"{PREFIX}/{MANIFEST}", "--ranks", "1"]


def labels(stack: Stack) -> dict[str, str]:
    """The image's labels: what it is, from which spec, base and lock, and its stack's versions."""
    spec = stack.spec
    out = {
        "org.opencontainers.image.title": spec.name,
        "org.opencontainers.image.description": spec.description or describe(spec),
        "org.opencontainers.image.base.name": stack.base,
        "dev.envbuilder.spec-sha256": spec.sha256(),
        "dev.envbuilder.framework": f"{spec.framework.name}=={spec.framework.version}",
        "dev.envbuilder.python": stack.python,
    }
    if stack.lock:
        base = stack.lock.base.get("runtime") or stack.lock.base["devel"]
        out["org.opencontainers.image.base.digest"] = base["digest"]
        out["dev.envbuilder.lock-resolved-at"] = stack.lock.resolved_at
    if spec.horovod:
        out["dev.envbuilder.horovod"] = f"{spec.horovod.version} ({','.join(spec.horovod.operations)})"
    if stack.mpi4py_sdist:
        out["dev.envbuilder.mpi4py"] = f"{stack.mpi4py_sdist['version']} (MPI-5 standard ABI, from its sdist)"
    if spec.cuda:
        out["dev.envbuilder.cuda"] = spec.cuda.version
    if spec.mpi:
        out["dev.envbuilder.mpi"] = f"{spec.mpi.flavor}-{spec.mpi.version} ({spec.mpi.pmi})"
    return out


def help_text(stack: Stack) -> str:
    spec = stack.spec
    return "\n".join([
        f"{spec.name}: {spec.description or describe(spec)}",
        f"Stack: {describe(spec)}.",
        f"Built by envbuilder from a spec (sha256 {spec.sha256()[:12]}); manifest at {PREFIX}/{MANIFEST}.",
        "Check it works:  envbuilder verify --runtime apptainer --image THIS.sif",
        f"  or inside:     python -m {SMOKE_DIR} --ranks 2",
    ])
