"""The spec's extra packages: pip requirements (pinned) and OS packages."""

from __future__ import annotations


from ..image import Step
from ...stack import Stack
from .base import Component, Layer, LockNeeds
from .python import locked_pip, pip, pip_env
from ...quoting import shell_words
from ...spec.model import PIP_PIN_RE


def requirements(stack: Stack) -> list[str]:
    """The spec's pip requirements this step installs: all but an mpi4py the image builds from its
    sdist against the MPI-5 standard ABI (components/mpi4py.py)."""
    built = stack.mpi4py_requirement if stack.mpi4py_sdist else None
    return [r for r in stack.spec.packages.pip if r != built]


def pip_steps(stack: Stack) -> list[Step]:
    reqs = requirements(stack)
    if not reqs:
        return []
    locked, mounts = locked_pip(stack, "packages")
    if stack.lock and not locked:
        return []       # everything they need is already installed by an earlier group
    return [Step("packages", "extra Python packages from the spec", locked or [
        f"{pip(stack)} {shell_words(sorted(reqs, key=str.lower), 'packages.pip')}",
    ], network=True, mounts=mounts, build_env=pip_env(stack))]


def pip_groups(stack: Stack) -> dict[str, list[str]]:
    """The lock's `packages` group: the spec's own pip requirements, resolved last."""
    reqs = requirements(stack)
    return {"packages": sorted(reqs, key=str.lower)} if reqs else {}


class Packages(Component):
    def devel(self, stack: Stack) -> dict[Layer, list[Step]]:
        return {Layer.PACKAGES: pip_steps(stack)}

    def lock_needs(self, stack: Stack) -> LockNeeds:
        # the spec's OS packages are what the image keeps (an NGC image's one stage: system.py)
        return LockNeeds(apt={"runtime": list(stack.spec.packages.apt)}, pip_groups=pip_groups(stack))

    def expect(self, stack: Stack) -> dict:
        """The pinned Python packages the smoke suite's drift check compares: the spec's ``==``
        pins, or every locked package."""
        lock = stack.lock
        if lock is not None:
            return {"packages": dict(sorted(lock.pip_versions().items()))}
        pins = {}
        for req in stack.spec.packages.pip:
            m = PIP_PIN_RE.fullmatch(req)
            if m:           # a range is checked once a lock pins it
                pins[m.group(1).lower()] = m.group(3)
        return {"packages": dict(sorted(pins.items()))}
