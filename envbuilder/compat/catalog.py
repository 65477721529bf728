"""Load the version catalog (catalog.yaml) and answer questions about it."""

from __future__ import annotations

import fnmatch
from functools import lru_cache
from pathlib import Path

import yaml

from ..versions import minor

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

@lru_cache(maxsize=1)
def load_catalog() -> Catalog:
    with open(CATALOG_PATH, encoding="utf-8") as fh:
        return Catalog(yaml.safe_load(fh))
