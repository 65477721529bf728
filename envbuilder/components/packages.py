"""The spec's extra packages: pip requirements (pinned) and OS packages."""

from __future__ import annotations

from ..plan import Step
from ..resolve import Stack
from .python import pip, pip_env


def apt(stack: Stack) -> list[str]:
    return list(stack.spec.packages.apt)


def requirements(stack: Stack) -> list[str]:
    """The spec's pip requirements this step installs: all but an mpi4py the image builds from its
    sdist against the MPI-5 standard ABI (components/mpi4py.py)."""
    built = stack.mpi4py_requirement if stack.mpi4py_sdist else None
    return [r for r in stack.spec.packages.pip if r != built]


def pip_steps(stack: Stack) -> list[Step]:
    reqs = requirements(stack)
    if not reqs:
        return []
    from ..lock.render import pip_group

    # Last: the pins users change most often, so a changed pin rebuilds one small layer.
    locked, mounts = pip_group(stack, "packages", pip(stack))
    if stack.lock and not locked:
        return []       # everything they need is already installed by an earlier group
    return [Step("packages", "extra Python packages from the spec", locked or [
        f"{pip(stack)} {' '.join(sorted(reqs, key=str.lower))}",
    ], network=True, mounts=mounts, build_env=pip_env(stack))]


def pip_groups(stack: Stack) -> dict[str, list[str]]:
    """The lock's `packages` group: the spec's own pip requirements, resolved last."""
    reqs = requirements(stack)
    return {"packages": sorted(reqs, key=str.lower)} if reqs else {}
