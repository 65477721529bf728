"""The site's fabric in the image (cluster.fabric, a site profile's key): the libraries an RDMA
fabric needs in the runtime stage (rdma-core/libibverbs and its providers, UCX, libfabric; Debian
packages, locked and hashed by the apt lock like every other package) and, for a source-built
Open MPI, the headers its `--with-ucx`/`--with-ofi` build needs. The facts per fabric are
compat/catalog.yaml `fabrics` (each with its source); `tcp` or no fabric adds nothing, so those
images are unchanged. The variables go to job.sbatch (render/sbatch.py), not into the image: one
image serves several sites."""

from __future__ import annotations

from ..resolve import Stack


def _builds_open_mpi(stack: Stack) -> bool:
    return bool(stack.spec.mpi) and stack.spec.mpi.flavor == "openmpi" and stack.mpi_source == "build"


def devel_apt(stack: Stack) -> list[str]:
    if not stack.fabric_libraries or not _builds_open_mpi(stack):
        return []
    return list(stack.fabric.get("ompi_devel_apt") or [])


def runtime_apt(stack: Stack) -> list[str]:
    return list(stack.fabric["apt"]) if stack.fabric_libraries else []


def ompi_configure(stack: Stack) -> list[str]:
    """Open MPI's configure options for the fabric (--with-ucx=/usr, --with-ofi=/usr)."""
    if not stack.fabric_libraries or not _builds_open_mpi(stack):
        return []
    return list(stack.fabric.get("ompi_configure") or [])
