"""Conda packages from the spec, installed from the lock into /opt/conda by py-rattler (from
PyPI: the lock's pip group ``build``, hash-checked, in a folder of its own that the step removes):
every package file fetched into the output folder's conda-pkgs/ before the build (sha256 checked
against the lock), bind-mounted into the step, checked again and installed offline
(lock/conda_install.py). Without a lock there is nothing pinned to install: the step says so and
stops the build."""

from __future__ import annotations

from ...lock import conda as conda_
from ...paths import CONDA_PREFIX
from ..image import Copy, Step
from ...stack import Stack
from .base import Component, Layer, LockNeeds
from .python import locked_pip, pip, pip_env, python_exe

PREFIX = CONDA_PREFIX
GROUP = "build"                     # the lock's pip group py-rattler is in (devel stage only)


def wanted(stack: Stack) -> bool:
    return bool(stack.spec.packages.conda)


def devel_steps(stack: Stack) -> list[Step]:
    if not wanted(stack):
        return []
    asked = ", ".join(stack.spec.packages.conda)
    lock = stack.lock
    if not lock or not lock.conda:
        return [Step("conda", f"conda packages ({asked}): need envbuilder.lock", [
            "echo 'conda packages are installed from envbuilder.lock: "
            "run `envbuilder lock SPEC` and build again' >&2",
            "exit 1",
        ])]
    target = f"{pip(stack)} --target {conda_.WORK}/rattler"
    locked, mounts = locked_pip(stack, GROUP, target)
    n = len(lock.conda_packages())
    return [Step("conda", f"conda packages ({asked}) into {PREFIX}",
                 conda_.install_commands(python_exe(stack), locked or [f"{target} {conda_.RATTLER}"]),
                 network=True, build_env=pip_env(stack),
                 notes=[f"{n} packages locked in envbuilder.lock (pins/conda-lock.yml), fetched into "
                        f"{conda_.PKGS_DIR}/ by envbuilder build, sha256 checked, installed offline by py-rattler"],
                 mounts=mounts + conda_.MOUNTS)]


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
        return LockNeeds(pip_groups={GROUP: [conda_.RATTLER]},
                         conda={"packages": sorted(stack.spec.packages.conda), "channels": conda_.channels(stack.spec.packages.conda_channels),
                                "platform": conda_.PLATFORM})

    def expect(self, stack: Stack) -> dict:
        if stack.lock is None:
            return {}
        return {"conda": {p["name"]: p["version"] for p in stack.lock.conda_packages()} or None}
