"""Python: the base OS's python3 with a virtual environment at /opt/venv.

The runtime stage copies the whole venv from the devel stage; that is the Python payload. With a
lock, the spec's own packages (the lock's ``packages`` group) go to /opt/packages instead
(``pip --target``, components/packages.py), installed in a stage of their own on top of the devel
stage and copied by a COPY of their own after the venv's: a changed pin in ``packages.pip`` then
re-copies that folder, not the framework's gigabyte (BuildKit caches a COPY by the content it
copies, and the devel stage it copies the venv from is unchanged). The image still has one environment: a .pth
file in the venv's site-packages puts /opt/packages on sys.path *ahead of* the site-packages
(``packages_pth``), so a package the packages group installs again at another version (the lock's
``"overrides"``) is the one imported and the one importlib.metadata and ``pip list`` report.
"""

from __future__ import annotations

from ...lock.pins import locked_pip_file
from ...paths import PACKAGES_DIR, VENV
from ..image import Copy, Step
from ...stack import Stack
from .base import Component, Layer, LockNeeds

# Bootstrap tools, pinned (they work on Python 3.8 - 3.13).
BOOTSTRAP = ["pip==24.0", "setuptools==69.5.1", "wheel==0.43.0"]


def python_exe(stack: Stack) -> str:
    return "python" if stack.ngc else f"{VENV}/bin/python"


def pip(stack: Stack) -> str:
    return f"{python_exe(stack)} -m pip install --no-cache-dir --disable-pip-version-check"


def locked_pip(stack: Stack, group: str, installer: str | None = None) -> tuple[list[str], list[str]]:
    """(commands, mounts) installing exactly the lock's GROUP with INSTALLER (default ``pip``): every
    file's sha256 required, nothing else resolved; ([], []) without a lock or for an empty group."""
    path = locked_pip_file(stack.lock, group)
    if path is None:
        return [], []
    return [f"{installer or pip(stack)} --require-hashes --no-deps -r /{path}"], [path]


def packages_apart(stack: Stack) -> bool:
    """Whether the spec's packages go to PACKAGES_DIR, a runtime layer of their own: with a lock
    whose packages group has entries (it lists exactly what the earlier groups lack or what it
    installs again at another version), on a two-stage image. Without a lock pip must see the venv
    to leave out what the framework brought (``--target`` would install torch again for a package
    that needs it), so the packages go into the venv as before; `envbuilder build` with an engine
    that caches layers (Docker, podman, buildah) always locks first. An NGC image has one stage
    and no copy to spare."""
    return packages_pth_wanted(stack) and locked_pip_file(stack.lock, "packages") is not None


def packages_pth_wanted(stack: Stack) -> bool:
    """Whether the venv gets PACKAGES_PTH: with any lock on a two-stage image, whether or not its
    packages group has entries today. The file is written in the first pip layer; were it to
    depend on the group, a pin change that empties or fills the group (a package returning to the
    framework's own version) would rebuild every layer from the venv on, Horovod's compile too."""
    return stack.ngc is None and stack.lock is not None


def site_packages(stack: Stack) -> str:
    """The venv's site-packages (purelib and platlib are one folder in a venv on Linux)."""
    return f"{VENV}/lib/python{stack.python}/site-packages"


PACKAGES_PTH = "00-envbuilder-packages.pth"      # site reads .pth files in name order: this one first


def packages_pth(stack: Stack) -> str:
    """The .pth line that puts PACKAGES_DIR ahead of the venv's site-packages. A plain path line
    in a .pth *appends* (the venv's copy of a package would win); a line starting with ``import``
    is run as site reads the file, right after it appended the site-packages: this one lets
    ``site.addsitedir`` add PACKAGES_DIR (and read .pth files a package put there), then moves what
    that added to just before the site-packages. An image whose packages group is empty has no
    such folder, and nothing is added."""
    return (f"import os, site, sys; _n = len(sys.path); os.path.isdir(\"{PACKAGES_DIR}\") and "
            f"site.addsitedir(\"{PACKAGES_DIR}\"); _new = sys.path[_n:]; del sys.path[_n:]; "
            f"_i = sys.path.index(\"{site_packages(stack)}\"); sys.path[_i:_i] = _new")


def devel_steps(stack: Stack) -> list[Step]:
    if stack.ngc:
        return []
    locked, mounts = locked_pip(stack, "python")
    pth = []
    if packages_pth_wanted(stack):
        pth = [f"test -d {site_packages(stack)}",
               f"echo '{packages_pth(stack)}' > {site_packages(stack)}/{PACKAGES_PTH}"]
    return [Step("python", f"Python {stack.python} virtual environment in {VENV}", [
        f"python3 -c 'import sys; v = \"%d.%d\" % sys.version_info[:2]; "
        f"assert v == \"{stack.python}\", \"base has Python \" + v + \", spec asks {stack.python}\"'",
        f"python3 -m venv {VENV}",
        *pth,
        *(locked or [f"{pip(stack)} {' '.join(BOOTSTRAP)}"]),
    ], network=True, mounts=mounts, build_env=pip_env(stack),
        notes=[f"{PACKAGES_PTH}: the spec's packages ({PACKAGES_DIR}, a layer of their own) ahead of the venv's "
               "site-packages on sys.path"] if pth else [])]


# 1980-01-01T00:00:00Z, the earliest time a wheel (zip) can hold.
SOURCE_DATE_EPOCH = "315532800"


def locked_env(stack: Stack) -> dict[str, str]:
    """With a lock: SOURCE_DATE_EPOCH, so pip writes hash-based .pyc files (the same bytes in
    every build of the lock). A fixed value, not the lock's time: every pip step carries it, and
    a value that moved with each `envbuilder lock` would rebuild every pip layer after a one-pin
    change."""
    if not stack.lock:
        return {}
    return {"SOURCE_DATE_EPOCH": SOURCE_DATE_EPOCH}


def pip_env(stack: Stack) -> dict[str, str]:
    """The environment of every pip step: ``locked_env``, and on a base that pins its Python
    packages in a constraint file (NGC PyTorch >= 25.03) PIP_CONSTRAINT naming it, so what the
    spec adds never replaces a package the base was built and tested with. The image sets it
    too; stating it in the step makes it hold in Apptainer's %post and in `docker build` alike.
    A requirement that conflicts with the base's pin fails the step (pip: ResolutionImpossible):
    pick the base tag that ships the version you need."""
    env = locked_env(stack)
    if stack.pip_constraint:
        env["PIP_CONSTRAINT"] = stack.pip_constraint
    return env


def pip_groups(stack: Stack) -> dict[str, list[str]]:
    """The lock's `python` group: the bootstrap tools at their usual pins when the rest allows
    (torch >= 2.13 needs a newer setuptools; the lock holds what was chosen). An NGC base has
    its own."""
    if stack.ngc:
        return {}
    return {"python": [b if b.startswith("pip==") else b.replace("==", ">=") for b in BOOTSTRAP]}


def bootstrap_prefer(stack: Stack) -> dict[str, str]:
    """The bootstrap tools' usual versions (BOOTSTRAP, the one place they are written): the lock's
    pip resolution keeps them when the rest allows (pip's own pin is exact already)."""
    if stack.ngc:
        return {}
    return dict(b.split("==", 1) for b in BOOTSTRAP if not b.startswith("pip=="))


class Python(Component):
    def devel(self, stack: Stack) -> dict[Layer, list[Step]]:
        return {Layer.PYTHON: devel_steps(stack)}

    def runtime(self, stack: Stack) -> list[Copy]:
        return [Copy(VENV, VENV, from_stage="devel")]       # the Python payload

    def env(self, stack: Stack) -> dict[str, str]:
        env = {"PYTHONNOUSERSITE": "1", "PYTHONDONTWRITEBYTECODE": "1"}
        if not stack.ngc:
            env = {"VIRTUAL_ENV": VENV, "PATH": f"{VENV}/bin:$PATH", **env}
        return env

    def lock_needs(self, stack: Stack) -> LockNeeds:
        return LockNeeds(apt={"devel": ["python3", "python3-dev", "python3-venv"], "runtime": ["python3"]},
                         pip_groups=pip_groups(stack))

    def expect(self, stack: Stack) -> dict:
        return {"python": stack.python}
