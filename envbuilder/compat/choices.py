"""What the catalog chooses where the spec is silent: the default base image, where MPI comes from.

Read by the rules (compat/rules*.py, compat/finding.py) and by the stack (stack.py); imports neither.
"""

from __future__ import annotations

from ..spec.model import Spec
from ..versions import matches, minor
from .catalog import Catalog

CPU_BASE_FOR_PYTHON = {"3.11": "debian:bookworm", "3.10": "ubuntu:22.04", "3.12": "ubuntu:24.04",
                       "3.8": "ubuntu:20.04"}


def default_base(spec: Spec, cat: Catalog) -> str:
    if spec.cuda and not spec.cuda.from_pypi:
        cu = cat.cuda(spec.cuda.version)
        if cu is None:
            return f"nvidia/cuda:{spec.cuda.version}-devel-ubuntu22.04"
        os_name = spec.base_os or next(
            (o for o in cu["os"] if cat.os(o) and cat.os(o)["python"] == minor(spec.python)), "ubuntu22.04")
        return f"nvidia/cuda:{cu['full']}-{cu['tag_cudnn']}-devel-{os_name}"
    return CPU_BASE_FOR_PYTHON.get(minor(spec.python), "debian:bookworm")


def mpi_source(spec: Spec, os_name: str | None, cat: Catalog) -> str | None:
    """distro (the OS package), build (pinned tarball), pypi (the wheel) or None (no MPI)."""
    if not spec.mpi:
        return None
    if spec.mpi.source:
        return spec.mpi.source
    distro = (cat.os(os_name) or {}).get("openmpi") if os_name else None
    if spec.mpi.flavor == "openmpi" and distro and matches(spec.mpi.version, distro):
        return "distro"
    return "build"
