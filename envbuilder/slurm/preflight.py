"""What the GPU preflight of the job holds every node against: the NVIDIA driver against the CUDA
in the image, the node's GPU against the compiled arch list of the image's framework
(render/sbatch_sections/preflight.py writes the check).

Values come from the catalog (compat/catalog.yaml: cuda.*.compat_driver / min_driver,
arch_lists), never from free text of the spec.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..compat.finding import context_for
from ..compat.rules_gpu import COMPAT_RE, arch_list
from ..stack import Stack


@dataclass(frozen=True)
class GpuNeeds:
    cuda: str
    floor: str                 # the oldest driver (the CUDA major's minor-version compatibility)
    full: str                  # the driver of full support
    archs: tuple[str, ...]     # the framework's compiled arch list
    ptx: str                   # the PTX arch ("": none)
    ptx_any: bool              # the PTX runs on every newer GPU
    compat: bool               # the image has cuda-compat (forward compatibility)

    @property
    def compat_below_floor(self) -> bool:
        """cuda-compat goes on the library path only on a driver older than the floor (forcing
        it on a newer one fails with error 803)."""
        return self.compat and bool(self.floor)


def needs(stack: Stack) -> GpuNeeds | None:
    """What the image needs from a node; None on CPU stacks."""
    spec = stack.spec
    if not spec.cuda:
        return None
    cu = stack.catalog.cuda(spec.cuda.version) if not stack.ngc else None
    floor = (cu or {}).get("compat_driver") or (stack.ngc or {}).get("min_driver")
    full = (cu or {}).get("min_driver") or floor
    found = arch_list(spec, context_for(spec, stack.catalog))
    archs, entry = found if found else ([], {})
    ptx = (entry.get("ptx_arch") or (archs[-1] if archs else "")) if entry.get("ptx") else ""
    return GpuNeeds(spec.cuda.version, floor or "", full or "", tuple(archs), ptx, entry.get("max_cc") is None,
                    any(COMPAT_RE.match(p) for p in spec.packages.apt))
