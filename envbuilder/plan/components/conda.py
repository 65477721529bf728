"""Conda packages from the spec, installed from the lock's conda-lock lockfile into /opt/conda:
every package downloaded by URL and checked with sha256sum, then installed offline by the
micromamba the lockfile holds. Without a lock there is nothing pinned to install: the step
says so and stops the build."""

from __future__ import annotations

from ...lock import conda as conda_
from ...paths import CONDA_PREFIX
from ..image import Copy, Step
from ...stack import Stack
from .base import Component, Layer, LockNeeds

PREFIX = CONDA_PREFIX


def wanted(stack: Stack) -> bool:
    return bool(stack.spec.packages.conda)


def devel_steps(stack: Stack) -> list[Step]:
    if not wanted(stack):
        return []
    asked = ", ".join(stack.spec.packages.conda)
    lock = stack.lock
    if not lock or not lock.conda:
        return [Step("conda", f"conda packages ({asked}): need envbuilder.lock", [
            "echo 'conda packages are installed from envbuilder.lock (conda-lock): "
            "run `envbuilder lock SPEC` and build again' >&2",
            "exit 1",
        ])]
    n = len(lock.conda_packages())
    return [Step("conda", f"conda packages ({asked}) into {PREFIX}", conda_.install_commands(lock.conda["lockfile"]),
                 network=True, notes=[f"{n} packages from the conda-lock lockfile in envbuilder.lock "
                                      "(pins/conda-lock.yml), sha256 checked"],
                 mounts=["pins/conda-urls.txt", "pins/conda-sha256.txt", "pins/conda-explicit.txt"])]


class Conda(Component):
    def devel(self, stack: Stack) -> dict[Layer, list[Step]]:
        return {Layer.CONDA: devel_steps(stack)}

    def runtime(self, stack: Stack) -> list[Copy]:
        return [Copy(PREFIX, PREFIX, from_stage="devel")] if wanted(stack) and stack.lock else []

    def env(self, stack: Stack) -> dict[str, str]:
        # after the venv and MPI on PATH: conda adds tools and libraries, it does not replace Python
        return {"CONDA_PREFIX": PREFIX, "PATH": f"$PATH:{PREFIX}/bin"} if wanted(stack) else {}

    def lock_needs(self, stack: Stack) -> LockNeeds:
        if not wanted(stack):
            return LockNeeds()
        return LockNeeds(apt={"devel": ["bzip2", "curl", "unzip", "zstd"]},
                         conda={"packages": sorted(stack.spec.packages.conda), "channels": conda_.channels(),
                                "platform": conda_.PLATFORM})

    def expect(self, stack: Stack) -> dict:
        if stack.lock is None:
            return {}
        return {"conda": {p["name"]: p["version"] for p in stack.lock.conda_packages()} or None}
