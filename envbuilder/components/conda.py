"""Conda packages from the spec, installed from the lock's conda-lock lockfile into /opt/conda:
every package downloaded by URL and checked with sha256sum, then installed offline by the
micromamba the lockfile holds. Without a lock there is nothing pinned to install: the step
says so and stops the build."""

from __future__ import annotations

from ..paths import CONDA_PREFIX
from ..plan import Copy, Step
from ..resolve import Stack

PREFIX = CONDA_PREFIX


def wanted(stack: Stack) -> bool:
    return bool(stack.spec.packages.conda)


def lock_needs(stack: Stack) -> dict | None:
    """What the lock's conda resolver needs (None without conda packages)."""
    if not wanted(stack):
        return None
    from ..lock import conda as conda_

    return {"packages": sorted(stack.spec.packages.conda), "channels": conda_.channels(),
            "platform": conda_.PLATFORM}


def devel_apt(stack: Stack) -> list[str]:
    return ["bzip2", "curl", "unzip", "zstd"] if wanted(stack) else []


def devel_steps(stack: Stack) -> list[Step]:
    if not wanted(stack):
        return []
    from ..lock.conda import install_commands

    asked = ", ".join(stack.spec.packages.conda)
    lock = stack.lock
    if not lock or not lock.conda:
        return [Step("conda", f"conda packages ({asked}): need envbuilder.lock", [
            "echo 'conda packages are installed from envbuilder.lock (conda-lock): "
            "run `envbuilder lock SPEC` and build again' >&2",
            "exit 1",
        ])]
    n = len(lock.conda_packages())
    return [Step("conda", f"conda packages ({asked}) into {PREFIX}", install_commands(lock.conda["lockfile"]),
                 network=True, notes=[f"{n} packages from the conda-lock lockfile in envbuilder.lock "
                                      "(pins/conda-lock.yml), sha256 checked"],
                 mounts=["pins/conda-urls.txt", "pins/conda-sha256.txt", "pins/conda-explicit.txt"])]


def runtime_copies(stack: Stack) -> list[Copy]:
    return [Copy(PREFIX, PREFIX, from_stage="devel")] if wanted(stack) and stack.lock else []


def runtime_env(stack: Stack) -> dict[str, str]:
    # after the venv and MPI on PATH: conda adds tools and libraries, it does not replace Python
    return {"CONDA_PREFIX": PREFIX, "PATH": f"$PATH:{PREFIX}/bin"} if wanted(stack) else {}
