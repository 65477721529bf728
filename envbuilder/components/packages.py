"""The spec's extra packages: pip requirements (pinned) and OS packages."""

from __future__ import annotations

from ..plan import Step
from ..resolve import Stack
from .python import pip


def apt(stack: Stack) -> list[str]:
    return list(stack.spec.packages.apt)


def pip_steps(stack: Stack) -> list[Step]:
    reqs = stack.spec.packages.pip
    if not reqs:
        return []
    # Last: the pins users change most often, so a changed pin rebuilds one small layer.
    return [Step("packages", "extra Python packages from the spec", [
        f"{pip(stack)} {' '.join(sorted(reqs, key=str.lower))}",
    ], network=True)]
