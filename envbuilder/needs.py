"""What a stack needs, per kind of lock entry: base images, OS packages, source tarballs, Python
requirement groups, conda packages. The components know it (gathered in one pass:
``components.lock_needs``); the lock (envbuilder/lock/) only resolves it into pins and records it
as the lock's ``inputs``, so a changed spec shows as a changed need.
"""

from __future__ import annotations

from .plan.components import lock_needs, python

def glibc(stack) -> str:
    return str((stack.catalog.os(stack.os_name) or {}).get("glibc") or stack.catalog.default_glibc())


def _machine(stack) -> dict:
    """The wheel platform's machine for a non-x86_64 image (x86_64 is the lock's default, so the
    inputs of existing locks stay as they were)."""
    machine = stack.catalog.arch(stack.spec.target_arch)["manylinux"]
    return {} if machine == "x86_64" else {"machine": machine}


def bootstrap_prefer(stack) -> dict[str, str]:
    """Versions the lock keeps when they fit (not a need: the lock's inputs leave it out)."""
    return python.bootstrap_prefer(stack)


def source_tarballs(stack) -> list[dict]:
    """What the components download as source (name, version, url, file, sha256, index)."""
    return lock_needs(stack).tarballs


def needs(stack) -> dict:
    wanted = lock_needs(stack)
    base = {"devel": stack.base}
    if not stack.ngc:
        base["runtime"] = stack.runtime_base
    return {
        "base": base,
        "apt": {s: p for s, p in wanted.apt.items() if p},
        "sources": {s["name"]: s["version"] for s in wanted.tarballs},
        "pip": {"groups": wanted.pip_groups, "python": stack.python, "glibc": glibc(stack),
                "extra_index_urls": [stack.framework_index_url] if stack.framework_index_url else [],
                "in_image": bool(stack.ngc), **_machine(stack),
                # the base's constraint file (NGC PyTorch >= 25.03): the in-image resolution runs
                # under it, as the build's pip steps do
                **({"constraint": stack.pip_constraint} if stack.pip_constraint else {})},
        "conda": wanted.conda,
    }
