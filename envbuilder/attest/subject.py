"""What a statement is about, as in-toto's subject {name, digest: {sha256: hex}}: a SIF (or any
file) by the sha256 of its bytes, read once in 1 MiB pieces; an engine image by its ID (the
sha256 of its config, which a registry's manifest digest covers, so a pulled copy has the same)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

from ..errors import EnvbuilderError

HEX64 = re.compile(r"[0-9a-f]{64}")


def fingerprint(path: str | Path) -> tuple[int, ...]:
    """What changes when a file's bytes can have changed, without reading them: size, mtime,
    ctime (nanoseconds) and inode, device. ctime cannot be set back by its owner (utime sets it
    to now), so a rewrite in place with the mtime put back still shows."""
    return _fp(os.stat(path))


def stable_file_sha256(path: str | Path, field: str = "--image") -> str:
    """sha256 of PATH read through one open descriptor, its fingerprint taken before and after
    (fstat of that descriptor): a file written while it was hashed is refused, never hashed
    half old, half new."""
    try:
        with open(path, "rb") as fh:
            before = _fp(os.fstat(fh.fileno()))
            h = hashlib.sha256()
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
            after = _fp(os.fstat(fh.fileno()))
    except OSError as exc:
        raise EnvbuilderError(field, f"cannot read {path}: {exc.strerror or exc}",
                              "give the .sif file the job runs") from None
    if before != after:
        raise EnvbuilderError("attestation", f"digest differs: {path} changed while it was hashed",
                              "hash it again once nothing writes it")
    return h.hexdigest()


def _fp(st: os.stat_result) -> tuple[int, ...]:
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)


def is_file_image(image: str) -> bool:
    return image.endswith(".sif") or Path(image).is_file()


def file_subject(path: str | Path) -> dict:
    p = Path(path)
    if not p.is_file():
        raise EnvbuilderError("--image", f"{path} is not a file",
                              "give the .sif file (or an image reference of the engine)")
    return {"name": p.name, "digest": {"sha256": stable_file_sha256(p)}}


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


MANIFEST_TYPES = ("application/vnd.oci.image.manifest.v1+json",
                  "application/vnd.docker.distribution.manifest.v2+json")
INDEX_TYPES = ("application/vnd.oci.image.index.v1+json",
               "application/vnd.docker.distribution.manifest.list.v2+json")
MAX_MANIFEST = 4 << 20


def registry_config_digest(ref: str, field: str = "--image") -> str:
    """The image ID (config digest, hex) that REPO@sha256:D is: from the local engine when it
    pulled or pushed that digest (its RepoDigests), else from the registry's manifest (anonymous
    read; the manifest's own sha256 must be D, so the registry cannot answer another). One
    message when neither can tie D to an image: a digest never taken on trust."""
    repo, _, digest = ref.rpartition("@sha256:")
    if not repo or not HEX64.fullmatch(digest):
        raise EnvbuilderError(field, f"{ref} names no digest", "give REPO@sha256:DIGEST (a tag can move)")
    try:
        return image_id(ref)
    except EnvbuilderError:
        pass
    body = _fetch_manifest(repo, digest)
    if body is None or hashlib.sha256(body).hexdigest() != digest:
        raise EnvbuilderError(field, f"cannot tie {ref} to an image: the local engine does not hold it and the "
                              "registry gave no manifest of that digest",
                              f"pull it first (docker pull {ref}) so its image ID can be compared")
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    config = data.get("config") if isinstance(data, dict) else None
    got = config.get("digest") if isinstance(config, dict) else None
    if not isinstance(got, str) or not HEX64.fullmatch(got.removeprefix("sha256:")):
        kind = data.get("mediaType") if isinstance(data, dict) else None
        raise EnvbuilderError(field, f"{ref} is no single image manifest ({kind or 'no config digest'})",
                              "give the digest of one platform's manifest (docker pull it and use its RepoDigests)")
    return got.removeprefix("sha256:")


def _fetch_manifest(repo: str, digest: str) -> bytes | None:
    host, _, name = repo.partition("/")
    if not name or ("." not in host and ":" not in host and host != "localhost"):
        host, name = "registry-1.docker.io", repo if "/" in repo else f"library/{repo}"
    scheme = "http" if host.startswith(("127.0.0.1", "localhost", "[::1]")) else "https"
    url = f"{scheme}://{host}/v2/{name}/manifests/sha256:{digest}"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}) if scheme == "http"
                                         else urllib.request.ProxyHandler())
    headers = {"Accept": ", ".join(MANIFEST_TYPES + INDEX_TYPES)}
    for _ in range(2):
        try:
            with opener.open(urllib.request.Request(url, headers=headers), timeout=30) as resp:
                return resp.read(MAX_MANIFEST + 1)[:MAX_MANIFEST + 1]
        except urllib.error.HTTPError as exc:
            challenge = exc.headers.get("WWW-Authenticate", "") if exc.code == 401 else ""
            token = _anonymous_token(opener, challenge) if challenge.lower().startswith("bearer ") else None
            if not token:
                return None
            headers["Authorization"] = f"Bearer {token}"
        except (OSError, ValueError):
            return None
    return None


def _anonymous_token(opener, challenge: str) -> str | None:
    fields = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
    realm = fields.pop("realm", "")
    if not realm.startswith("https://"):
        return None
    query = "&".join(f"{k}={urllib.request.quote(v)}" for k, v in fields.items() if k in ("service", "scope"))
    try:
        with opener.open(f"{realm}?{query}", timeout=30) as resp:
            data = json.loads(resp.read(1 << 20))
    except (OSError, ValueError):
        return None
    token = data.get("token") or data.get("access_token") if isinstance(data, dict) else None
    return token if isinstance(token, str) else None
