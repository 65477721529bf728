"""Load the version catalog (catalog.yaml) and answer questions about it."""

from __future__ import annotations

import fnmatch
from functools import lru_cache
from pathlib import Path

import yaml

from ..versions import cmp, minor

CATALOG_PATH = Path(__file__).with_name("catalog.yaml")


class Catalog:
    def __init__(self, data: dict):
        self.data = data
        self.sources: dict[str, str] = data["sources"]

    # frameworks -------------------------------------------------------------------------------
    def framework(self, name: str) -> dict:
        return self.data["frameworks"][name]

    def framework_releases(self, name: str) -> dict:
        fw = self.framework(name)
        if "same_as" in fw:
            return self.framework(fw["same_as"])["releases"]
        return fw["releases"]

    def framework_release(self, name: str, version: str) -> dict | None:
        return self.framework_releases(name).get(minor(version))

    def framework_known_patch(self, name: str, version: str) -> bool:
        entry = self.framework_release(name, version)
        if not entry:
            return False
        plain = version.split("+", 1)[0]
        return plain in entry["patches"]

    # other components -------------------------------------------------------------------------
    def horovod(self, version: str) -> dict | None:
        return self.data["horovod"].get(version)

    def cuda(self, version: str) -> dict | None:
        return self.data["cuda"].get(minor(version))

    def nccl_cuda_major(self, version: str) -> int | None:
        return self.data["nccl"].get(version)

    def os(self, name: str) -> dict | None:
        return self.data["os"].get(name)

    def mpi(self, flavor: str) -> dict:
        return self.data["mpi"][flavor]

    def mpi_tarball(self, flavor: str, version: str) -> dict | None:
        return self.mpi(flavor)["tarballs"].get(version)

    def mpi_pypi(self, flavor: str) -> dict | None:
        """The flavor's PyPI wheel (mpi: {source: pypi}): package, versions, PMI, ABI, env."""
        return self.mpi(flavor).get("pypi")

    def mpi4py_standard_abi(self) -> dict:
        """How mpi4py's sdist builds against the MPI-5 standard ABI (since, build_env, mpicc_env)."""
        return self.data["mpi4py"]["standard_abi"]

    def mpi4py_sdist(self, version: str) -> dict | None:
        """mpi4py's sdist for VERSION (url, sha256), None where the catalog pins none."""
        return self.data["mpi4py"]["sdists"].get(version)

    def mpi4py_sdist_versions(self) -> list[str]:
        return list(self.data["mpi4py"]["sdists"])

    def arch(self, name: str) -> dict:
        """Per-architecture names: wheel platform tag, Docker platform, multiarch, CUDA targets."""
        return self.data["arches"][name]

    def default_glibc(self) -> str:
        return str(self.data["default_glibc"]["version"])

    def framework_index(self, family: str, cuda: str | None) -> str | None:
        """The extra index of a framework's non-PyPI wheels: the CUDA build for CUDA major.minor
        ``cuda``, the CPU build for None (None: the framework has no such index)."""
        entry = (self.data.get("indexes") or {}).get(family)
        if not entry:
            return None
        return entry["cuda"].format(cuda=cuda.replace(".", "")) if cuda else entry["cpu"]

    def aarch64_pypi_cpu(self, family: str, version: str) -> bool | None:
        """Whether PyPI's aarch64 wheel of ``family`` ``version`` is a CPU build (catalog
        `aarch64_pypi`: releases up to `cpu_until`); None: the catalog does not say."""
        entry = (self.data.get("aarch64_pypi") or {}).get(family)
        if not entry:
            return None
        return cmp(minor(version), entry["cpu_until"]) <= 0

    def runtime_image(self, devel: str) -> str | None:
        """The runtime flavour of an nvidia/cuda devel image (None: not such an image)."""
        ci = self.data["cuda_images"]
        if devel.startswith(ci["prefix"]) and ci["devel"] in devel:
            return devel.replace(ci["devel"], ci["runtime"])
        return None

    def ngc(self, image: str) -> dict | None:
        return self.data["ngc"].get(image)

    def base_os(self, image: str) -> str | None:
        ngc = self.ngc(image)
        if ngc:
            return ngc["os"]
        for entry in self.data["known_bases"]:
            if fnmatch.fnmatchcase(image, entry["match"]) or image == entry["match"]:
                return entry["os"]
        return None

    def pypi_cuda(self, framework: str, version: str) -> dict | None:
        """What the framework's PyPI wheel brings for `cuda: {source: pypi}` (None: not known)."""
        family = "pytorch" if framework == "pytorch" else "tensorflow"
        return (self.data.get("pypi_cuda") or {}).get(family, {}).get(version)

    def patches(self) -> dict:
        return self.data["patches"]

    def patch_for(self, name: str, family: str, version: str) -> dict:
        """Patch NAME as it applies to framework FAMILY VERSION. A patch with `standard_from: F`
        sets a C++ standard: at least F's release's `cxx:` (the oldest standard its headers
        accept), so torch 2.14's C++20 headers get CMAKE_CXX_STANDARD 20, not the 17 written."""
        patch = dict(self.patches()[name])
        if patch.get("standard_from") != family:
            return patch
        old, new = patch["replace"]
        key, _, written = new.rpartition(" ")
        need = (self.framework_release(family, version) or {}).get("cxx", 0)
        if need > int(written):
            patch["replace"] = [old, f"{key} {need}"]
            patch["reason"] = f"{patch['reason']}; torch {minor(version)}'s headers need C++{need}"
            patch["sources"] = [*patch["sources"], "torch_cxx"]
        return patch

    # fabrics ----------------------------------------------------------------------------------
    def fabric(self, kind: str) -> dict:
        """What fabric KIND (cluster.fabric) needs: rdma, apt, ompi_configure, env, nccl_plugin."""
        return self.data["fabrics"][kind]

    def nccl_plugin(self, name: str) -> dict:
        return self.data["nccl_plugins"][name]

    def libfabric_tarball(self, version: str) -> dict:
        """libfabric's release tarball (url, sha256, sources) for a fabric that builds it."""
        return self.data["libfabric"]["tarballs"][version]


@lru_cache(maxsize=1)
def load_catalog() -> Catalog:
    with open(CATALOG_PATH, encoding="utf-8") as fh:
        return Catalog(yaml.safe_load(fh))
