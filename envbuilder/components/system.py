"""OS packages: one apt step per stage, gathering what every component needs.

Owns: the locale and the apt invocation. Other components only name their packages.
"""

from __future__ import annotations

from ..plan import Step
from ..resolve import Stack
from . import conda, cuda, fabric, horovod, mpi, packages, python


# apt's caches, removed in the step that made them, whatever the base's apt settings: Docker
# Hub's debian images delete them through /etc/apt/apt.conf.d/docker-clean, a base made by plain
# debootstrap keeps the .deb files (135 MB for the torch image) and pkgcache.bin/srcpkgcache.bin
# (which differ between two builds of one lock).
APT_CLEAN = ["apt-get clean",
             "rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/cache/apt/archives/*.deb "
             "/var/cache/apt/archives/partial/*"]


def _apt_install(packages_: list[str]) -> list[str]:
    return [
        "apt-get update",
        "DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "
        + " ".join(sorted(set(packages_))),
        *APT_CLEAN,
    ]


def devel_packages(stack: Stack) -> list[str]:
    """What the first stage installs with apt (names, or name=version where the spec pins)."""
    if stack.ngc:
        return sorted(set(packages.apt(stack)))
    pkgs = ["ca-certificates"]
    for part in (python, cuda, mpi, fabric, horovod, conda):
        pkgs += part.devel_apt(stack)
    return sorted(set(pkgs))


def runtime_packages(stack: Stack) -> list[str]:
    if stack.ngc:
        return []
    pkgs = ["ca-certificates"]
    for part in (python, cuda, mpi, fabric):
        pkgs += part.runtime_apt(stack)
    pkgs += packages.apt(stack)
    return sorted(set(pkgs))


def _locked_install(stage: str) -> tuple[list[str], str]:
    """apt-get install of the exact versions the lock holds (pins/apt-STAGE.txt, bind-mounted)."""
    pins = f"pins/apt-{stage}.txt"
    return [
        "apt-get update",
        f"xargs -a /{pins} env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends",
        *APT_CLEAN,
        # logs and caches that carry the build's wall-clock time: gone, so two builds of one lock
        # give the same bytes (update-alternatives logs the time of every link it sets)
        "rm -rf /var/log/apt /var/log/dpkg.log /var/log/alternatives.log /var/cache/ldconfig/aux-cache",
    ], pins


def _step(stack: Stack, stage: str, title: str, pkgs: list[str]) -> Step:
    lock = stack.lock
    if lock is not None and lock.apt.get(stage):
        cmds, pins = _locked_install(stage)
        return Step("system", title, cmds, mounts=[pins],
                    notes=[f"{len(lock.apt[stage])} packages at the versions in envbuilder.lock ({pins})"])
    return Step("system", title, _apt_install(pkgs))


def devel_steps(stack: Stack) -> list[Step]:
    pkgs = devel_packages(stack)
    if stack.ngc:
        if not pkgs:
            return []
        return [_step(stack, "devel", "OS packages the spec asks for (the NGC image has the rest)", pkgs)]
    return [_step(stack, "devel", "OS packages for building: compilers and headers (this stage is discarded)",
                  pkgs)]


def runtime_steps(stack: Stack) -> list[Step]:
    return [_step(stack, "runtime", "OS packages the image needs at run time (no compilers)",
                  runtime_packages(stack))]


def runtime_env(stack: Stack) -> dict[str, str]:
    # C.UTF-8 ships with glibc: a locale that always exists, so host LANG/LC_* cannot break tools
    # inside (apptainer/singularity#645).
    return {"LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
