"""Everything derived from a checked spec, computed once (base images, pins, patches, env).

Components and renderers read a ``Stack``; none of them re-derives what is here, and none
changes it: a Stack is frozen, built with its lock (or without one) and never patched after.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .compat.catalog import Catalog, load_catalog
from .compat.choices import mpi_source
from .compat.check import check
from .compat.finding import Finding, context_for
from .spec.model import Spec
from .versions import major, minor

if TYPE_CHECKING:
    from .lock.model import Lock

@dataclass(frozen=True)
class Stack:
    spec: Spec
    catalog: Catalog
    base: str
    runtime_base: str
    os_name: str | None             # the base's OS (catalog), None for a base the catalog does not know
    ngc: dict | None
    findings: list[Finding] = field(default_factory=list)
    lock: Lock | None = None        # every pin comes from it; None: the spec's and the catalog's pins

    # --- derived facts used by several components -------------------------------------------
    @property
    def python(self) -> str:
        return minor(self.spec.python)

    @property
    def framework_requirement(self) -> str:
        fw = self.spec.framework
        extra = (self.pypi_cuda or {}).get("extra")
        return f"{self.catalog.framework(fw.name)['pip']}{f'[{extra}]' if extra else ''}=={fw.version}"

    @property
    def pypi_cuda(self) -> dict | None:
        """With `cuda: {source: pypi}`: what the framework's PyPI wheels bring (catalog)."""
        if not (self.spec.cuda and self.spec.cuda.from_pypi):
            return None
        fw = self.spec.framework
        return self.catalog.pypi_cuda(fw.name, fw.version)

    @property
    def cuda_toolkit_requirement(self) -> str | None:
        """The CUDA toolkit wheels (nvcc, headers) Horovod's NCCL build and NCCL's network plugin
        build need: devel stage only."""
        hv = self.spec.horovod
        horovod_nccl = bool(hv and "nccl" in hv.operations and self.horovod_sdist)
        if not (self.pypi_cuda and (horovod_nccl or self.nccl_plugin_build)):
            return None
        return self.pypi_cuda.get("toolkit")

    @property
    def framework_index_url(self) -> str | None:
        fw = self.spec.framework
        if fw.index_url:
            return fw.index_url
        if fw.name == "pytorch" and self.spec.cuda and not self.spec.cuda.from_pypi:
            return self.catalog.framework_index("pytorch", minor(self.spec.cuda.version))
        if fw.name == "pytorch" and self.spec.target_arch == "aarch64" and "+cpu" not in fw.version:
            # PyPI's aarch64 torch is a CUDA build since 2.11 (torch_pypi_aarch64_2611): CPU nodes
            # take the CPU index's; up to 2.10 PyPI's own aarch64 wheel is the CPU build
            if not self.spec.cuda and self.catalog.aarch64_pypi_cpu("pytorch", fw.version):
                return None
            if self.spec.cuda and self.spec.cuda.from_pypi:
                return None         # CUDA from PyPI: PyPI's own aarch64 torch is that build
            return self.catalog.framework_index("pytorch", None)
        return None

    @property
    def pip_constraint(self) -> str | None:
        """The base image's pip constraint file (NGC PyTorch >= 25.03: /etc/pip/constraint.txt,
        catalog `pip_constraint`): every pip step on that base installs under it."""
        return (self.ngc or {}).get("pip_constraint")

    @property
    def framework_from_base(self) -> bool:
        return bool(self.ngc)

    @property
    def horovod_from_base(self) -> bool:
        return bool(self.ngc and self.ngc.get("horovod") and self.spec.horovod)

    @property
    def mpi_source(self) -> str | None:
        if self.ngc and self.ngc.get("mpi"):
            return "image"
        return mpi_source(self.spec, self.os_name, self.catalog)

    @property
    def mpi_tarball(self) -> dict | None:
        mpi = self.spec.mpi
        if mpi is None or self.mpi_source != "build":
            return None
        return self.catalog.mpi_tarball(mpi.flavor, mpi.version)

    @property
    def nccl(self) -> str | None:
        if not self.spec.cuda:
            return None
        if self.spec.cuda.nccl:
            return self.spec.cuda.nccl
        if self.pypi_cuda:
            return self.pypi_cuda["nccl"]
        if self.ngc:
            return self.ngc.get("nccl")
        cu = self.catalog.cuda(self.spec.cuda.version)
        return cu["nccl"] if cu else None

    @property
    def cudnn(self) -> str | None:
        if not self.spec.cuda:
            return None
        if self.spec.cuda.cudnn:
            return self.spec.cuda.cudnn
        if self.pypi_cuda:
            return self.pypi_cuda["cudnn"]
        if self.ngc:
            return self.ngc.get("cudnn")
        cu = self.catalog.cuda(self.spec.cuda.version)
        return cu["cudnn"] if cu else None

    @property
    def horovod_sdist(self) -> dict | None:
        hv = self.spec.horovod
        if not hv or self.horovod_from_base:
            return None
        return (self.catalog.horovod(hv.version) or {}).get("sdist")

    @property
    def mpi4py_requirement(self) -> str | None:
        """The spec's packages.pip entry for mpi4py (name==version), None without one."""
        pin = self.spec.packages.pip_pin("mpi4py")
        return pin[0] if pin else None

    @property
    def mpi4py_version(self) -> str | None:
        pin = self.spec.packages.pip_pin("mpi4py")
        return pin[1] if pin else None

    @property
    def mpi4py_sdist(self) -> dict | None:
        """mpi4py built from its sdist against the MPI-5 standard ABI (mpi: {abi: standard} with
        mpi4py in packages.pip; its wheel has no such build): {version, url, sha256} from the
        catalog; None otherwise, or when the catalog pins no sdist of that version (rule MPI_ABI)."""
        mpi = self.spec.mpi
        if not (mpi and mpi.abi == "standard" and self.mpi_source == "pypi" and self.mpi4py_version):
            return None
        sdist = self.catalog.mpi4py_sdist(self.mpi4py_version)
        return {"version": self.mpi4py_version, **sdist} if sdist else None

    @property
    def cpu_threads_env(self) -> bool:
        """oneDNN / OpenMP settings from the seeds apply to CPU TensorFlow stacks."""
        return not self.spec.cuda and self.spec.framework.family == "tensorflow"

    @property
    def fabric(self) -> dict | None:
        """The nodes' network (cluster.fabric, a site profile's key) as the catalog describes it
        (`fabrics`: rdma, apt, ompi_configure, env, nccl_plugin); None when unset."""
        kind = self.spec.cluster.fabric
        return self.catalog.fabric(kind) if kind else None

    @property
    def fabric_libraries(self) -> bool:
        """Whether the image carries a fabric's libraries: an RDMA fabric only (tcp images
        are today's images, byte for byte)."""
        return bool(self.fabric and self.fabric.get("rdma"))

    @property
    def fabric_env(self) -> dict[str, str]:
        """The fabric's tested variables that the spec's/site's cluster.env does not set itself."""
        own = dict(self.spec.cluster.env)
        return {k: str(v) for k, v in sorted(((self.fabric or {}).get("env") or {}).items()) if k not in own}

    @property
    def libfabric_build(self) -> dict | None:
        """The libfabric the image builds for its fabric (fabrics.<kind>.libfabric_build: version,
        prefix, providers) with its tarball's url and sha256; None when the fabric needs none."""
        want = (self.fabric or {}).get("libfabric_build") if self.fabric_libraries else None
        if not want:
            return None
        return {**want, **self.catalog.libfabric_tarball(want["version"])}

    @property
    def nccl_plugin_build(self) -> dict | None:
        """NCCL's libfabric plugin built in the image (a fabric with plugin_from: image, a CUDA
        stack that is not an NGC image): name, version, prefix, its tarball and build options."""
        fab = self.fabric or {}
        if not (self.fabric_libraries and fab.get("nccl_plugin") and fab.get("plugin_from") == "image"):
            return None
        if not self.spec.cuda or self.ngc is not None:
            return None
        plugin = self.catalog.nccl_plugin(fab["nccl_plugin"])
        version = plugin["version"]
        return {"name": fab["nccl_plugin"], "version": version, "prefix": plugin["prefix"],
                "devel_apt": list(plugin.get("devel_apt") or []),
                "configure": list(plugin.get("configure") or []) + list(fab.get("plugin_configure") or []),
                **plugin["tarballs"][version]}

    @property
    def cuda_major(self) -> int | None:
        return major(self.spec.cuda.version) if self.spec.cuda else None


def resolve(spec: Spec, lock: Lock | None = None, catalog: Catalog | None = None) -> Stack:
    """Check ``spec`` (raises SpecErrors on any error finding) and derive the stack, pinned by
    ``lock`` when there is one (generate.locked_stack also checks that the lock matches what the
    stack needs)."""
    cat = catalog or load_catalog()
    found = check(spec, cat)
    ctx = context_for(spec, cat)
    base = ctx.base
    runtime = spec.runtime_base or cat.runtime_image(base) or base
    return Stack(spec=spec, catalog=cat, base=base, runtime_base=runtime, os_name=ctx.os_name,
                 ngc=ctx.ngc, findings=found, lock=lock)
