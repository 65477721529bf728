"""Spec -> the files of an output folder, in memory (nothing touches the disk here)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from .plan.components import assemble
from .lock.model import Lock, dump
from .lock.pins import pins_files
from .lock.resolve import check_matches
from .needs import needs
from .paths import SMOKE_DIR
from .render.apptainer import render_apptainer
from .render.dockerfile import render_dockerfile
from .render.manifest import render_manifest
from .render.sbatch import render_epilog, render_sbatch
from .render.sbatch_sections.nodelocal import EPILOG
from .stack import Stack, resolve
from .plan.job import plan_job
from .spec.model import Spec

SMOKE_SOURCE = Path(__file__).resolve().parent / "smoke"

WHEELHOUSE_README = """\
Local wheels for offline or air-gapped builds: put .whl files here, or pass
`envbuilder build --wheelhouse DIR`. pip looks here before the index. The folder is
bind-mounted during the build (Docker) or copied into the discarded build stage
(Apptainer): wheels never end up in the final image's layers.
"""


@dataclass
class Output:
    stack: Stack
    files: dict[str, bytes]          # relative path -> content

    @property
    def manifest(self) -> bytes:
        return self.files["manifest.json"]


def smoke_files() -> dict[str, bytes]:
    out = {}
    for path in sorted(SMOKE_SOURCE.rglob("*.py")):
        rel = path.relative_to(SMOKE_SOURCE).as_posix()
        out[f"{SMOKE_DIR}/{rel}"] = path.read_bytes()
    return out


def _tree_sha(files: dict[str, bytes]) -> str:
    h = hashlib.sha256()
    for name, data in sorted(files.items()):
        h.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    return h.hexdigest()


def generate(spec: Spec, lock: Lock | None = None) -> Output:
    """The output folder's files. With ``lock`` every pin comes from it: base digests, apt
    versions, pip hashes, source hashes; the lock and its pins/ lists join the files (a lock that
    does not match what the spec needs is refused, naming the differences). Without one, the
    pins the spec and catalog know."""
    return files_for(locked_stack(spec, lock))


def locked_stack(spec: Spec, lock: Lock | None = None) -> Stack:
    """SPEC's stack pinned by LOCK, once the lock is checked against what the stack needs (a lock
    that does not match is refused, naming the differences)."""
    stack = resolve(spec, lock)
    if lock is not None:
        check_matches(lock, stack, needs(stack))
    return stack


TARGET_WRITING = {"Dockerfile": "docker", "Apptainer.def": "apptainer"}   # a build file: its target


def recipe_files(targets) -> set[str]:
    """The build files a spec's targets have written: the Dockerfile for docker (and for sif: the
    SIF is made from the Docker image), Apptainer.def for apptainer."""
    return ({"Dockerfile"} if {"docker", "sif"} & set(targets) else set()) | \
        ({"Apptainer.def"} if "apptainer" in targets else set())


def files_for(stack: Stack) -> Output:
    """The output folder's files for a stack (its lock already checked: locked_stack)."""
    spec, lock = stack.spec, stack.lock
    plan = assemble(stack)
    sha = spec.sha256()
    recipes: dict[str, bytes] = {}
    wanted = recipe_files(spec.targets)
    if "Dockerfile" in wanted:
        recipes["Dockerfile"] = render_dockerfile(plan, sha).encode()
    if "Apptainer.def" in wanted:
        recipes["Apptainer.def"] = render_apptainer(plan, sha).encode()
    job = plan_job(stack)
    recipes["job.sbatch"] = render_sbatch(job).encode()
    epilog = render_epilog(job)
    if epilog is not None:          # cluster.local_cleanup: epilog: what the site installs
        recipes[EPILOG] = epilog.encode()
    if lock is not None:
        recipes["envbuilder.lock"] = dump(lock).encode()
        recipes.update(pins_files(lock))
    smoke = smoke_files()
    files = dict(recipes)
    files["manifest.json"] = render_manifest(stack, plan, recipes, _tree_sha(smoke)).encode()
    files.update(smoke)
    files["wheelhouse/README.md"] = WHEELHOUSE_README.encode()
    return Output(stack, files)
