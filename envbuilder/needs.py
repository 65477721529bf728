"""What a stack needs, per kind of lock entry: base images, OS packages, source tarballs, Python
requirement groups. The components know it; the lock (envbuilder/lock/) only resolves it into pins
and records it as the lock's ``inputs``, so a changed spec shows as a changed need.
"""

from __future__ import annotations

from .components import horovod, mpi, python, system
from .lock import conda as conda_

def glibc(stack) -> str:
    return str((stack.catalog.os(stack.os_name) or {}).get("glibc", "2.28"))


def pip_groups(stack) -> dict[str, list[str]]:
    groups = {}
    if not stack.ngc:
        # the bootstrap tools at their usual pins when the rest allows (torch >= 2.13 needs a newer
        # setuptools): the lock holds what was chosen
        groups["python"] = [b if b.startswith("pip==") else b.replace("==", ">=") for b in python.BOOTSTRAP]
    if not stack.framework_from_base:
        groups["framework"] = [stack.framework_requirement]
    if stack.cuda_toolkit_requirement:
        groups["toolkit"] = [stack.cuda_toolkit_requirement]       # nvcc + headers, devel stage only
    groups.update(horovod.pip_groups(stack))
    if stack.spec.packages.pip:
        groups["packages"] = sorted(stack.spec.packages.pip, key=str.lower)
    return groups


def source_tarballs(stack) -> list[dict]:
    """What each component downloads as source (name, version, url, file, sha256, index)."""
    return horovod.source_tarballs(stack) + mpi.source_tarballs(stack)   # the order the lock records


def needs(stack) -> dict:
    base = {"devel": stack.base}
    apt = {"devel": system.devel_packages(stack)}
    if not stack.ngc:
        base["runtime"] = stack.runtime_base
        apt["runtime"] = system.runtime_packages(stack)
    return {
        "base": base,
        "apt": {s: p for s, p in apt.items() if p},
        "sources": {s["name"]: s["version"] for s in source_tarballs(stack)},
        "pip": {"groups": pip_groups(stack), "python": stack.python, "glibc": glibc(stack),
                "extra_index_urls": [stack.framework_index_url] if stack.framework_index_url else [],
                "in_image": bool(stack.ngc)},
        "conda": {"packages": sorted(stack.spec.packages.conda), "channels": conda_.channels(),
                  "platform": conda_.PLATFORM} if stack.spec.packages.conda else None,
    }
