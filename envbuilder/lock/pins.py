"""What the recipes take from a lock, as data: the pins/ files of the build context (their names
and contents) and the locked entries a build checks against. No shell here: the components
format the install commands (components/python.py ``locked_pip``, components/system.py)."""

from __future__ import annotations

from . import apt as apt_
from . import conda as conda_
from . import pip as pip_
from .model import Lock


def apt_file(stage: str) -> str:
    """The build-context path of STAGE's locked OS packages (name=version, one a line)."""
    return f"pins/apt-{stage}.txt"


def pip_file(group: str) -> str:
    """The build-context path of a pip group's requirements, each with its sha256."""
    return f"pins/pip-{group}.txt"


def pins_files(lock: Lock) -> dict[str, bytes]:
    files = {}
    for stage, entries in sorted(lock.apt.items()):
        if entries:
            files[apt_file(stage)] = apt_.pins_text(entries).encode()
    for group, entries in lock.pip.items():
        if entries:
            files[pip_file(group)] = pip_.requirements_text(entries).encode()
    if lock.conda:
        files.update(conda_.pins_files(lock.conda["lockfile"]))
    return files


def locked_pip_file(lock: Lock | None, group: str) -> str | None:
    """GROUP's pins file when the lock holds packages for it; None without a lock or for an
    empty group (an earlier group brought everything it needs)."""
    return pip_file(group) if lock and lock.pip.get(group) else None


def source(lock: Lock | None, name: str) -> dict | None:
    """The lock's entry for source tarball NAME (url, sha256); None without a lock."""
    if not lock:
        return None
    return next((e for e in lock.sources if e["name"] == name), None)
