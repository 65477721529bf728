"""An image's root file system as a folder, from the image's layers (not `docker export`,
which adds Docker's own init files: /.dockerenv, /etc/hostname...).

Sources: the Docker engine (`docker save TAG`, the docker-archive layout: manifest.json lists
Config and Layers) or an OCI image archive (index.json -> manifest -> config and layer blobs,
what buildah/podman write). Layers are applied in order; a whiteout `.wh.NAME` removes NAME from
the layers below, `.wh..wh..opq` empties its folder of what the layers below put there (OCI
image-spec, layer.md "Whiteouts").
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import CheckFailed

WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"


@dataclass
class ImageConfig:
    """The parts of the image config the SIF needs (OCI image-spec config.md names)."""

    architecture: str = "amd64"
    env: list[str] = field(default_factory=list)
    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)
    raw: dict = field(default_factory=dict)     # the "config" object as the image has it
    archive_format: str = "docker-archive"      # or oci-archive: Apptainer's bootstrap names

    @classmethod
    def from_json(cls, data: dict) -> "ImageConfig":
        cfg = data.get("config") or {}
        return cls(architecture=data.get("architecture") or "amd64", env=list(cfg.get("Env") or []),
                   entrypoint=list(cfg.get("Entrypoint") or []), cmd=list(cfg.get("Cmd") or []),
                   labels=dict(cfg.get("Labels") or {}), raw=cfg)


def broken(reason: str, fix: str = "rebuild the image: envbuilder build SPEC") -> CheckFailed:
    return CheckFailed("sif: image", reason, fix)


def save_docker_image(docker: str, tag: str, dest: Path) -> None:
    """`docker save TAG -o DEST`; a missing image or engine is a clear message."""
    proc = subprocess.run([docker, "save", "-o", str(dest), tag], capture_output=True, text=True)
    if proc.returncode != 0:
        err = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise broken(f"`docker save {tag}` failed: {err}")


def _member_json(tar: tarfile.TarFile, name: str) -> dict:
    try:
        fh = tar.extractfile(name)
        return json.loads(fh.read()) if fh else {}
    except (KeyError, ValueError) as exc:
        raise broken(f"the image archive's {name} is missing or not JSON ({exc})") from None


def _layers(archive: Path) -> tuple[dict, list[str], tarfile.TarFile, str]:
    """(config JSON, layer member names in order, the open archive, its format)."""
    try:
        tar = tarfile.open(archive)
    except tarfile.TarError:
        raise broken(f"{archive} is not an image archive (not a tar file)",
                     "give a `docker save` or OCI image archive, or rebuild the image") from None
    except OSError as exc:
        raise broken(f"cannot read {archive}: {exc.strerror}") from None
    names = set(tar.getnames())
    if "manifest.json" in names:                    # docker-archive (`docker save`)
        manifest = _member_json(tar, "manifest.json")
        if not isinstance(manifest, list) or not manifest:
            raise broken("the image archive's manifest.json lists no image")
        entry = manifest[0]
        return _member_json(tar, entry["Config"]), list(entry["Layers"]), tar, "docker-archive"
    if "index.json" in names:                       # OCI image layout archive
        index = _member_json(tar, "index.json")
        desc = (index.get("manifests") or [{}])[0]
        blob = lambda d: "blobs/" + d["digest"].replace(":", "/", 1)  # noqa: E731
        manifest = _member_json(tar, blob(desc))
        return (_member_json(tar, blob(manifest["config"])), [blob(l) for l in manifest["layers"]], tar,
                "oci-archive")
    raise broken(f"{archive} has neither manifest.json (docker save) nor index.json (OCI archive)")


def _inside(root: Path, name: str) -> Path:
    path = Path(os.path.normpath(root / name.lstrip("/")))
    if path != root and root not in path.parents:
        raise broken(f"a layer entry points outside the root file system: {name!r}")
    return path


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def _apply_layer(tar: tarfile.TarFile, member: str, root: Path, scratch: Path) -> None:
    fh = tar.extractfile(member)
    if fh is None:
        raise broken(f"layer {member} is missing from the image archive")
    layer = scratch / "layer.tar"
    with open(layer, "wb") as out:
        head = fh.read(2)
        fh.seek(0)
        shutil.copyfileobj(gzip.GzipFile(fileobj=fh) if head == b"\x1f\x8b" else fh, out, 1 << 20)
    try:
        with tarfile.open(layer) as lt:
            names = lt.getnames()
    except tarfile.TarError as exc:
        raise broken(f"layer {member} is not a tar archive ({exc})") from None
    # whiteouts act on the layers below: apply them before this layer's own files land
    whiteouts = []
    for name in names:
        base = os.path.basename(name.rstrip("/"))
        if not base.startswith(WHITEOUT):
            continue
        whiteouts.append(name)
        parent = _inside(root, os.path.dirname(name.rstrip("/")))
        if base == OPAQUE:
            if parent.is_dir():
                for child in parent.iterdir():
                    _remove(child)
        else:
            _remove(_inside(root, os.path.join(os.path.dirname(name), base[len(WHITEOUT):])))
    for name in names:
        _inside(root, name)
    # GNU tar keeps owners, modes, devices, hard links and sparse files as the layer has them
    proc = subprocess.run(["tar", "-x", "-p", "--numeric-owner", "--same-owner", "-f", str(layer),
                           "-C", str(root)], capture_output=True, text=True)
    if proc.returncode != 0:
        no_room = "No space left" in proc.stderr
        raise CheckFailed("sif: root file system", ("no room left on the device while unpacking "
                          if no_room else f"unpacking layer {member} failed: ")
                          + proc.stderr.strip()[-400:], "free disk space in the output folder's file system")
    for name in whiteouts:
        _remove(_inside(root, name))
    layer.unlink()


def unpack(archive: Path, root: Path, scratch: Path) -> ImageConfig:
    """Apply ARCHIVE's layers into ROOT (an empty folder); return its config."""
    config, layers, tar, kind = _layers(archive)
    with tar:
        for member in layers:
            _apply_layer(tar, member, root, scratch)
    image = ImageConfig.from_json(config)
    image.archive_format = kind
    return image
