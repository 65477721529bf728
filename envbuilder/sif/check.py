"""`envbuilder verify x.sif`, the half that needs no container: the SIF's structure as the
reference tool reads it (`siftool list`, `siftool dump`), and its SquashFS partition mounted at
its offset (squashfuse) so that charliecloud can run the smoke suite from exactly those bytes.

What only Apptainer can check (its runtime: namespaces, `--nv`, its own handling of
/.singularity.d) is printed as a command for a cluster node; see the README.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from ..errors import CheckFailed, EnvbuilderError
from . import layout

EXPECTED = ("Def.FILE", "JSON.Labels", "JSON.Generic", "SBOM", "FS")
MANIFEST_OBJECT = "envbuilder-manifest.json"


def _siftool() -> str:
    path = shutil.which("siftool")
    if not path:
        raise CheckFailed("sif", "siftool is not installed (Debian package siftool)",
                          "apt-get install siftool  (or run .ci/install-system.sh)")
    return path


def structure(sif: Path) -> dict:
    """The objects siftool lists; CheckFailed naming what is missing or wrong."""
    try:
        header, descriptors = layout.read(sif)
    except layout.NotSif as exc:
        raise CheckFailed("sif: structure", str(exc), "give a .sif made by `envbuilder build --sif` "
                          "or `apptainer build`") from None
    except OSError as exc:
        raise EnvbuilderError("FOLDER", f"cannot read {sif}: {exc.strerror}") from None
    proc = subprocess.run([_siftool(), "list", str(sif)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise CheckFailed("sif: structure", f"siftool cannot read {sif}: {proc.stderr.strip()[-300:]}",
                          "rebuild it: envbuilder build SPEC --sif")
    listed = proc.stdout
    kinds = [d.kind for d in descriptors]
    missing = [k for k in EXPECTED if k not in kinds or k not in listed]
    part = layout.primary_partition(descriptors)
    if part is None or part.fstype != layout.FS_SQUASH:
        missing.append("FS (Squashfs/*System): the primary system partition")
    if missing:
        raise CheckFailed("sif: structure", f"{sif} lacks " + ", ".join(missing),
                          "rebuild it: envbuilder build SPEC --sif")
    return {"objects": [{"id": d.id, "type": d.kind, "name": d.name, "offset": d.offset, "size": d.size}
                        for d in descriptors],
            "partition": {"offset": part.offset, "size": part.size, "arch": layout.arch_name(part.arch)},
            "siftool_list": listed}


def embedded_manifest(sif: Path) -> dict | None:
    """The envbuilder manifest stored as a JSON.Generic object (siftool dump ID)."""
    _, descriptors = layout.read(sif)
    for d in descriptors:
        if d.kind == "JSON.Generic" and d.name == MANIFEST_OBJECT:
            proc = subprocess.run([_siftool(), "dump", str(d.id), str(sif)], capture_output=True)
            if proc.returncode == 0:
                try:
                    return json.loads(proc.stdout)
                except ValueError:
                    return None
    return None


@contextmanager
def mounted(sif: Path, offset: int):
    """The SquashFS partition at OFFSET, read-only through squashfuse, unmounted afterwards."""
    squashfuse = shutil.which("squashfuse")
    if not squashfuse:
        raise CheckFailed("sif", "squashfuse is not installed (Debian package squashfuse)",
                          "apt-get install squashfuse  (or run .ci/install-system.sh)")
    where = Path(tempfile.mkdtemp(prefix="envbuilder-sif-"))
    proc = subprocess.run([squashfuse, "-o", f"offset={offset}", str(sif), str(where)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        where.rmdir()
        raise CheckFailed("sif: mount", f"squashfuse cannot mount the partition at byte {offset} of {sif}: "
                          + proc.stderr.strip()[-300:], "needs /dev/fuse; or rebuild the SIF")
    try:
        yield where
    finally:
        fusermount = shutil.which("fusermount3") or shutil.which("fusermount") or "fusermount3"
        for _ in range(10):
            if subprocess.run([fusermount, "-u", str(where)], capture_output=True).returncode == 0:
                break
            time.sleep(1)
        try:
            os.rmdir(where)
        except OSError:
            pass
