"""OS packages: one apt step per stage, gathering what every component needs.

Owns: the locale and the apt invocation. Other components only name their packages.
"""

from __future__ import annotations

from ..plan import Step
from ..resolve import Stack
from . import cuda, horovod, mpi, packages, python


def _apt_install(packages_: list[str]) -> list[str]:
    return [
        "apt-get update",
        "DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "
        + " ".join(sorted(set(packages_))),
        "rm -rf /var/lib/apt/lists/*",
    ]


def devel_steps(stack: Stack) -> list[Step]:
    pkgs = ["ca-certificates"]
    for part in (python, cuda, mpi, horovod):
        pkgs += part.devel_apt(stack)
    if stack.ngc:
        pkgs = packages.apt(stack)
        if not pkgs:
            return []
        return [Step("system", "OS packages the spec asks for (the NGC image has the rest)",
                     _apt_install(pkgs))]
    return [Step("system", "OS packages for building: compilers and headers (this stage is discarded)",
                 _apt_install(pkgs))]


def runtime_steps(stack: Stack) -> list[Step]:
    pkgs = ["ca-certificates"]
    for part in (python, cuda, mpi):
        pkgs += part.runtime_apt(stack)
    pkgs += packages.apt(stack)
    return [Step("system", "OS packages the image needs at run time (no compilers)", _apt_install(pkgs))]


def runtime_env(stack: Stack) -> dict[str, str]:
    # C.UTF-8 ships with glibc: a locale that always exists, so host LANG/LC_* cannot break tools
    # inside (apptainer/singularity#645).
    return {"LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
