"""CUDA, cuDNN and NCCL: the nvidia/cuda base images carry them; this component pins NCCL
when the spec asks for a release other than the image's, and names the runtime libraries."""

from __future__ import annotations

from ..resolve import Stack
from ..versions import minor


def _nccl_pin(stack: Stack) -> str | None:
    spec = stack.spec
    if not spec.cuda or stack.ngc or not spec.cuda.nccl:
        return None
    cu = stack.catalog.cuda(spec.cuda.version)
    if cu and cu["nccl"] == spec.cuda.nccl:
        return None
    return f"{spec.cuda.nccl}-1+cuda{minor(spec.cuda.version)}"


def devel_apt(stack: Stack) -> list[str]:
    pin = _nccl_pin(stack)
    return [f"libnccl2={pin}", f"libnccl-dev={pin}"] if pin else []


def runtime_apt(stack: Stack) -> list[str]:
    pin = _nccl_pin(stack)
    return [f"libnccl2={pin}"] if pin else []
