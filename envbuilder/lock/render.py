"""What the recipes take from a lock: the pins/ files of the build context and the commands that
install exactly them. Components call these only when the stack carries a lock."""

from __future__ import annotations

from . import apt as apt_
from . import conda as conda_
from . import pip as pip_
from .model import Lock


def pins_files(lock: Lock) -> dict[str, bytes]:
    files = {}
    for stage, entries in sorted(lock.apt.items()):
        if entries:
            files[f"pins/apt-{stage}.txt"] = apt_.pins_text(entries).encode()
    for group, entries in lock.pip.items():
        if entries:
            files[f"pins/pip-{group}.txt"] = pip_.requirements_text(entries).encode()
    if lock.conda:
        files.update(conda_.pins_files(lock.conda["lockfile"]))
    return files


def pip_group(stack, group: str, pip: str) -> tuple[list[str], list[str]]:
    """(commands, mounts) installing one locked pip group; ([], []) when the group is empty."""
    lock = stack.lock
    if not lock or not lock.pip.get(group):
        return [], []
    path = f"pins/pip-{group}.txt"
    return [f"{pip} --require-hashes --no-deps -r /{path}"], [path]


def source(stack, name: str) -> dict | None:
    lock = stack.lock
    if not lock:
        return None
    return next((e for e in lock.sources if e["name"] == name), None)
