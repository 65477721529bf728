"""The spec's extra packages: pip requirements (pinned) and OS packages.

With a lock, the packages group installs into PACKAGES_DIR (``pip --target``: exactly the group's
files, nothing of the venv's replaced) and the runtime stage copies that folder after the venv: a
changed pin re-copies it, not the venv (components/python.py: how it joins the venv's sys.path).
"""

from __future__ import annotations


from ..image import Copy, Step
from ...paths import PACKAGES_DIR
from ...stack import Stack
from .base import Component, Layer, LockNeeds
from .python import locked_pip, packages_apart, pip, pip_env
from ...quoting import shell_words
from ...spec.model import PIP_PIN_RE


STAGE = "packages"          # the Dockerfile's stage (FROM devel) that installs them, with a lock


def requirements(stack: Stack) -> list[str]:
    """The spec's pip requirements this step installs: all but an mpi4py the image builds from its
    sdist against the MPI-5 standard ABI (components/mpi4py.py)."""
    built = stack.mpi4py_requirement if stack.mpi4py_sdist else None
    return [r for r in stack.spec.packages.pip if r != built]


def pip_steps(stack: Stack) -> list[Step]:
    reqs = requirements(stack)
    if not reqs:
        return []
    apart = packages_apart(stack)
    locked, mounts = locked_pip(stack, "packages", f"{pip(stack)} --target {PACKAGES_DIR}" if apart else None)
    if stack.lock and not locked:
        return []       # everything they need is already installed by an earlier group
    title = f"extra Python packages from the spec, in {PACKAGES_DIR}" if apart else "extra Python packages from the spec"
    notes = ["a folder of their own, ahead of the venv's site-packages on sys.path, in a stage of its own: the "
             "runtime stage copies it apart, so a changed pin leaves the devel stage and the venv's layer cached"
             ] if apart else []
    if apart and stack.mpi4py_sdist:
        # the image's own mpi4py, built from its sdist in the devel stage (components/mpi4py.py),
        # wins over a wheel of it a package brought, which would come first on sys.path
        locked = locked + [f"rm -rf {PACKAGES_DIR}/mpi4py {PACKAGES_DIR}/mpi4py-*.dist-info"]
    return [Step("packages", title, locked or [
        f"{pip(stack)} {shell_words(sorted(reqs, key=str.lower), 'packages.pip')}",
    ], network=True, mounts=mounts, build_env=pip_env(stack), notes=notes)]


def pip_groups(stack: Stack) -> dict[str, list[str]]:
    """The lock's `packages` group: the spec's own pip requirements, resolved last."""
    reqs = requirements(stack)
    return {"packages": sorted(reqs, key=str.lower)} if reqs else {}


class Packages(Component):
    def devel(self, stack: Stack) -> dict[Layer, list[Step]]:
        return {Layer.PACKAGES: pip_steps(stack)}

    def runtime(self, stack: Stack) -> list[Copy]:
        return [Copy(PACKAGES_DIR, PACKAGES_DIR, from_stage=STAGE)] if packages_apart(stack) else []

    def env(self, stack: Stack) -> dict[str, str]:
        # their console scripts, ahead of the venv's (a package installed again over the venv's)
        return {"PATH": f"{PACKAGES_DIR}/bin:$PATH"} if packages_apart(stack) else {}

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
