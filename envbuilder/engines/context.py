"""The build context handed to an engine: the output folder's files plus local wheels.

Assembled in a temporary folder so a wheelhouse never lands in the output folder, and the
CA bundle never lands anywhere but a BuildKit secret.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from ..errors import EnvbuilderError


def check_inputs(ca_bundle: str | None, wheelhouse: str | None) -> None:
    if ca_bundle and not Path(ca_bundle).is_file():
        raise EnvbuilderError("--ca-bundle", f"no such file: {ca_bundle}",
                              "give a PEM bundle, e.g. /etc/ssl/certs/ca-certificates.crt")
    if wheelhouse and not Path(wheelhouse).is_dir():
        raise EnvbuilderError("--wheelhouse", f"no such folder: {wheelhouse}",
                              "give a folder that holds .whl files")


def stage_context(folder: Path, files: dict[str, bytes], wheelhouse: str | None) -> Path:
    root = Path(tempfile.mkdtemp(prefix="envbuilder-context-"))
    for name, data in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    wh = root / "wheelhouse"
    wh.mkdir(exist_ok=True)
    if wheelhouse:
        for wheel in sorted(Path(wheelhouse).iterdir()):
            if wheel.is_file() and wheel.suffix in (".whl", ".gz", ".zip"):
                try:
                    os.link(wheel, wh / wheel.name)
                except OSError:
                    shutil.copy2(wheel, wh / wheel.name)
    return root


def platform_of(stack) -> str | None:
    """Docker's platform name for a non-x86_64 image (spec/site `arch`; catalog `arches`)."""
    arch = stack.spec.target_arch
    return None if arch == "x86_64" else stack.catalog.arch(arch)["docker"]
