"""An image's root file system as one flattened tree (layers.py), from the image's layers (not
`docker export`, which adds Docker's own init files: /.dockerenv, /etc/hostname...).

Sources: the Docker engine (`docker save TAG`, the docker-archive layout: manifest.json lists
Config and Layers) or an OCI image archive (index.json -> manifest -> config and layer blobs,
what buildah/podman write). The archive is user input: every JSON document is checked for its
shape before a field is used, every member it names must be a file of the archive, and a
damaged one is one message. Nothing is extracted: plain layers are read in place, a compressed
layer is decompressed once into the work folder (counted against the size limit).
"""

from __future__ import annotations

import json
import posixpath
import re
import subprocess
import tarfile
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from .layers import Budget, Tree, broken, compression, decompress, read_layer

MAX_JSON = 16 << 20                  # a manifest or config bigger than this is not one
DIGEST_RE = re.compile(r"([a-z0-9]+(?:[+._-][a-z0-9]+)*):([A-Za-z0-9=_-]{1,256})")
INDEX_TYPES = ("application/vnd.oci.image.index.v1+json",
               "application/vnd.docker.distribution.manifest.list.v2+json")


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
    def from_json(cls, data, where: str = "config") -> "ImageConfig":
        data = _shape(data, dict, where)
        arch = _opt(data, "architecture", str, where) or "amd64"
        cfg = _opt(data, "config", dict, where) or {}
        at = f"{where}: config"
        env = _strings(_opt(cfg, "Env", list, at), f"{at}.Env")
        entry = _strings(_opt(cfg, "Entrypoint", list, at), f"{at}.Entrypoint")
        cmd = _strings(_opt(cfg, "Cmd", list, at), f"{at}.Cmd")
        labels = _opt(cfg, "Labels", dict, at) or {}
        if not all(isinstance(v, str) for v in labels.values()):
            raise broken(f"the image's {at}.Labels holds a value that is not text")
        return cls(architecture=arch, env=env, entrypoint=entry, cmd=cmd, labels=dict(labels), raw=cfg)


def _shape(value, kind: type, where: str):
    if not isinstance(value, kind):
        raise broken(f"the image archive's {where} is a JSON {type(value).__name__}, not "
                     f"{'an object' if kind is dict else 'a list' if kind is list else 'text'}")
    return value


def _opt(data: dict, key: str, kind: type, where: str):
    value = data.get(key)
    if value is not None and not isinstance(value, kind):
        raise broken(f"the image archive's {where}: {key!r} is a JSON {type(value).__name__}, not "
                     f"{'an object' if kind is dict else 'a list' if kind is list else 'text'}")
    return value


def _strings(value, where: str) -> list[str]:
    if value is None:
        return []
    if not all(isinstance(v, str) for v in value):
        raise broken(f"the image's {where} holds an item that is not text")
    return list(value)


def save_docker_image(docker: str, tag: str, dest: Path) -> None:
    """`docker save TAG -o DEST`; a missing image or engine is a clear message."""
    proc = subprocess.run([docker, "save", "-o", str(dest), tag], capture_output=True, text=True)
    if proc.returncode != 0:
        err = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise broken(f"`docker save {tag}` failed: {err}")


class Archive:
    """The outer archive: members by name (links inside it followed, within it)."""

    def __init__(self, path: Path, scratch: Path | None = None, limit: int = 0) -> None:
        self.path = path
        try:
            with open(path, "rb") as fh:
                kind = compression(fh.read(6))
                fh.seek(0)
                if kind is not None and scratch is not None:
                    # a compressed archive (`docker save | gzip`) is read once into the work
                    # folder: members are read out of order, which a compressed stream cannot seek
                    plain = scratch / "archive.tar"
                    decompress(fh, kind, plain, limit, f"the archive {path.name}")
                    path = plain
            self.tar = tarfile.open(path)
            self.members = {_key(m.name): m for m in self.tar.getmembers()}
        except (tarfile.TarError, EOFError) as exc:
            raise broken(f"{path.name} is not an image archive (not a readable tar file: {exc})",
                         "give a `docker save` or OCI image archive, or rebuild the image") from None
        except OSError as exc:
            if exc.errno is None:            # zlib/gzip damage inside a compressed archive
                raise broken(f"{path.name} is damaged ({exc})") from None
            raise broken(f"cannot read {path}: {exc.strerror}") from None

    def member(self, name: str, what: str) -> tarfile.TarInfo:
        key, hops = _key(name), 0
        while True:
            info = self.members.get(key)
            if info is None:
                raise broken(f"{what} {name!r} is named by the image's manifest but is not in the archive")
            if info.isreg():
                return info
            if not (info.issym() or info.islnk()) or hops >= 8:
                raise broken(f"{what} {name!r} is not a file in the archive")
            base = posixpath.dirname(key) if info.issym() else ""
            key, hops = _key(posixpath.join(base, info.linkname)), hops + 1

    def json(self, name: str, what: str):
        info = self.member(name, what)
        if info.size > MAX_JSON:
            raise broken(f"the image archive's {what} {name!r} is {info.size} bytes, too big for JSON")
        try:
            return json.loads(self.tar.extractfile(info).read())
        except (ValueError, RecursionError, UnicodeDecodeError) as exc:
            raise broken(f"the image archive's {what} {name!r} is not JSON ({str(exc)[:80]})") from None
        except (tarfile.TarError, EOFError) as exc:
            raise broken(f"the image archive's {what} {name!r} cannot be read ({exc})") from None


def _key(name: str) -> str:
    return posixpath.normpath("/" + name).lstrip("/")


def _blob(desc, where: str) -> str:
    desc = _shape(desc, dict, where)
    digest = desc.get("digest")
    m = DIGEST_RE.fullmatch(digest) if isinstance(digest, str) else None
    if not m:
        raise broken(f"the image archive's {where} has no valid digest ({str(digest)[:80]!r})")
    return f"blobs/{m.group(1)}/{m.group(2)}"


def describe(archive: Archive) -> tuple[dict, list[str], str]:
    """(config JSON, layer member names in order, the archive's format)."""
    if "manifest.json" in archive.members:               # docker-archive (`docker save`)
        manifest = _shape(archive.json("manifest.json", "manifest"), list, "manifest.json")
        if not manifest:
            raise broken("the image archive's manifest.json lists no image")
        entry = _shape(manifest[0], dict, "manifest.json entry")
        config = entry.get("Config")
        layers = entry.get("Layers")
        if not isinstance(config, str):
            raise broken("the image archive's manifest.json entry has no Config file name")
        if not isinstance(layers, list) or not all(isinstance(x, str) for x in layers):
            raise broken("the image archive's manifest.json entry: Layers is not a list of file names")
        return archive.json(config, "config"), list(layers), "docker-archive"
    if "index.json" in archive.members:                  # OCI image layout archive
        index = _shape(archive.json("index.json", "index"), dict, "index.json")
        for _ in range(4):                                # nested indexes (multi-platform)
            manifests = _opt(index, "manifests", list, "index.json")
            if not manifests:
                raise broken("the image archive's index.json lists no manifest")
            desc = _shape(manifests[0], dict, "index.json manifest")
            doc = _shape(archive.json(_blob(desc, "index.json manifest"), "manifest"), dict, "manifest")
            if desc.get("mediaType") in INDEX_TYPES or doc.get("mediaType") in INDEX_TYPES:
                index = doc
                continue
            layers = _opt(doc, "layers", list, "manifest") or []
            config = archive.json(_blob(doc.get("config"), "manifest's config"), "config")
            return config, [_blob(d, "manifest's layer") for d in layers], "oci-archive"
        raise broken("the image archive's index.json nests indexes more than 4 deep")
    raise broken(f"{archive.path.name} has neither manifest.json (docker save) nor index.json (OCI archive)")


class Layers:
    """The layers of one archive, open for reading headers and, later, contents."""

    def __init__(self, archive: Path, scratch: Path, limit: int) -> None:
        self.stack = ExitStack()
        self.archive = Archive(archive, scratch, limit)
        self.stack.callback(self.archive.tar.close)
        self.scratch = scratch
        self.budget = Budget(limit)
        self.open: list[tarfile.TarFile | None] = []

    def __enter__(self) -> "Layers":
        return self

    def __exit__(self, *exc) -> None:
        self.stack.close()

    def flatten(self) -> tuple[Tree, "ImageConfig"]:
        config_json, members, kind = describe(self.archive)
        config = ImageConfig.from_json(config_json)
        config.archive_format = kind
        tree = Tree()
        decompressed = 0
        for index, name in enumerate(members):
            info = self.archive.member(name, "layer")
            if info.size == 0:                           # an empty layer
                self.open.append(None)
                continue
            fh = self.archive.tar.extractfile(info)
            kind = compression(fh.read(6))
            fh.seek(0)
            if kind is None:
                layer_file, length = fh, info.size
            else:
                dest = self.scratch / f"layer-{index}.tar"
                decompress(fh, kind, dest, self.budget.limit - decompressed, name)
                length = dest.stat().st_size
                decompressed += length
                self.stack.callback(dest.unlink, missing_ok=True)    # before the SIF is assembled
                layer_file = self.stack.enter_context(open(dest, "rb"))
            try:
                layer = tarfile.open(fileobj=layer_file, mode="r:")
            except (tarfile.TarError, EOFError) as exc:
                raise broken(f"layer {name} is not a tar archive ({exc})") from None
            self.open.append(layer)
            read_layer(tree, index, layer, name, self.budget, length)
        return tree, config

    def layer(self, index: int) -> tarfile.TarFile:
        return self.open[index]
