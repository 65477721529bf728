"""What a statement is about, as in-toto's subject {name, digest: {sha256: hex}}: a SIF (or any
file) by the sha256 of its bytes, read once in 1 MiB pieces; an engine image by its ID (the
sha256 of its config, which a registry's manifest digest covers, so a pulled copy has the same)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

from ..errors import EnvbuilderError
from ..lock.pip import file_sha256 as lock_file_sha256

HEX64 = re.compile(r"[0-9a-f]{64}")


def file_sha256(path: str | Path) -> str:
    try:
        return lock_file_sha256(Path(path))
    except OSError as exc:
        raise EnvbuilderError("--image", f"cannot read {path}: {exc.strerror or exc}",
                              "give the .sif file the job runs") from None


def is_file_image(image: str) -> bool:
    return image.endswith(".sif") or Path(image).is_file()


def file_subject(path: str | Path) -> dict:
    p = Path(path)
    if not p.is_file():
        raise EnvbuilderError("--image", f"{path} is not a file",
                              "give the .sif file (or an image reference of the engine)")
    return {"name": p.name, "digest": {"sha256": file_sha256(p)}}


def docker_cli() -> str:
    for cand in ("/usr/bin/docker", shutil.which("docker") or ""):
        if cand and Path(cand).is_file():
            return cand
    raise EnvbuilderError("docker", "no docker command on this machine",
                          "give a .sif file, or install Docker (.ci/install-system.sh)")


def image_id(ref: str) -> str:
    """The engine's image ID (sha256 hex of its config) of REF; one message when there is none."""
    proc = subprocess.run([docker_cli(), "image", "inspect", "--format", "{{json .Id}}", "--", ref],
                          capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise EnvbuilderError("--image", f"no image {ref} in the Docker engine",
                              "build it (envbuilder build) or pull it by digest first")
    value = json.loads(proc.stdout.strip() or '""')
    digest = value.removeprefix("sha256:") if isinstance(value, str) else ""
    if not HEX64.fullmatch(digest):
        raise EnvbuilderError("--image", f"the engine gave no sha256 ID for {ref}", "")
    return digest


def image_subject(ref: str) -> dict:
    return {"name": ref, "digest": {"sha256": image_id(ref)}}


def subject_for(image: str) -> dict:
    return file_subject(image) if is_file_image(image) else image_subject(image)
