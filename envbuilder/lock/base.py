"""Base images: a tag resolved to what it points at today, so the lock never holds a moving tag.

- An image the engine (Docker, podman or buildah: lock/engine.py) holds with a registry digest
  (``RepoDigests``): that digest; the recipes say ``FROM ref@sha256:...``.
- An image only the engine holds (imported, built locally; no registry digest): its image ID.
  BuildKit cannot address a local image by ID, so the recipes keep the tag and
  ``envbuilder build`` refuses to build when the engine's tag points at another ID.
- Otherwise the registry is asked (Docker Registry HTTP API v2, anonymous token): the
  ``Docker-Content-Digest`` of the tag's manifest (list).
"""

from __future__ import annotations

import hashlib
import json
import re
import urllib.error
import urllib.parse
import urllib.request

from ..errors import CheckFailed, EnvbuilderError
from .model import DIGEST_RE

MANIFEST_TYPES = ", ".join([
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
])


def split_reference(ref: str) -> tuple[str, str, str]:
    """'nvidia/cuda:12.2' -> ('registry-1.docker.io', 'nvidia/cuda', '12.2')."""
    name, _, digest = ref.partition("@")
    tag = "latest"
    last = name.rsplit("/", 1)[-1]
    if ":" in last:
        name, tag = name.rsplit(":", 1)
    first = name.split("/", 1)[0]
    if "/" in name and ("." in first or ":" in first or first == "localhost"):
        registry, repo = name.split("/", 1)
    else:
        registry, repo = "registry-1.docker.io", name
        if "/" not in repo:
            repo = f"library/{repo}"
    if registry == "docker.io":
        registry = "registry-1.docker.io"
    return registry, repo, digest or tag


def _token(challenge: str, timeout: float) -> str | None:
    fields = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
    if "realm" not in fields:
        return None
    query = urllib.parse.urlencode({k: v for k, v in fields.items() if k in ("service", "scope")})
    with urllib.request.urlopen(f"{fields['realm']}?{query}", timeout=timeout) as resp:
        data = json.loads(resp.read().decode())
    return data.get("token") or data.get("access_token")


DOCKER_HUB = "registry-1.docker.io"
INDEX_TYPES = ("application/vnd.oci.image.index.v1+json",
               "application/vnd.docker.distribution.manifest.list.v2+json")


def registry_mirror() -> str | None:
    """The configured pull-through mirror for Docker Hub names (config key registry_mirror), or None."""
    from ..config import load_config

    value = load_config().get("registry_mirror")
    return value.rstrip("/") if value else None


def _endpoint(registry: str, mirror: str | None) -> tuple[str, str]:
    """(base URL, what to call it in messages) for a registry: Docker Hub names through the mirror."""
    if registry == DOCKER_HUB and mirror:
        return mirror, f"the registry mirror {mirror}"
    scheme = "http" if registry.startswith(("localhost", "127.")) else "https"
    return f"{scheme}://{registry}", registry


def _fetch_manifest(url: str, ref: str, where: str, timeout: float) -> tuple[bytes, str, str]:
    """GET a manifest (anonymous pull token when asked): (body, media type, digest)."""
    headers = {"Accept": MANIFEST_TYPES}
    for _ in range(2):
        req = urllib.request.Request(url, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                body = resp.read(4 * 1024 * 1024 + 1)
                if len(body) > 4 * 1024 * 1024:
                    raise CheckFailed("lock: base", f"{where} sent a manifest over 4 MiB for {ref}",
                                      "check the image name and the registry")
                digest = resp.headers.get("Docker-Content-Digest") or "sha256:" + hashlib.sha256(body).hexdigest()
                media = (resp.headers.get("Content-Type") or "").split(";")[0].strip()
                return body, media, digest
        except urllib.error.HTTPError as exc:
            if exc.code == 401 and "Authorization" not in headers:
                token = _token(exc.headers.get("WWW-Authenticate", ""), timeout)
                if token:
                    headers["Authorization"] = f"Bearer {token}"
                    continue
            if exc.code == 404:
                raise CheckFailed("lock: base", f"{where} has no {ref} (404)",
                                  "check the image name and tag, or the mirror's contents") from None
            raise CheckFailed("lock: base", f"{where} answered {exc.code} for {ref}",
                              "check the image name and tag (private registries: docker login, then "
                              "docker pull it so the engine has it)") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise CheckFailed("lock: base", f"cannot reach {where} to resolve {ref} ({reason})",
                              f"docker pull {ref} where the registry is reachable (or docker load it), "
                              "then lock again: the engine's digest is used; or set registry_mirror "
                              "(envbuilder config) to your site's mirror") from None
    raise CheckFailed("lock: base", f"{where} refused an anonymous token for {ref}",
                      f"docker login {where} && docker pull {ref}, then lock again")


def registry_manifest(ref: str, platform: str | None = None, timeout: float = 20,
                      mirror: str | None = None) -> tuple[str, str | None]:
    """(the digest the registry serves for ``ref`` today, the ``platform`` (os/arch: the catalog's
    Docker platform of the spec's arch) manifest's digest when
    that is a multi-arch index, else None). Docker Hub names go through ``mirror`` when one is
    configured, as dockerd's registry-mirrors do."""
    registry, repo, tag = split_reference(ref)
    base, where = _endpoint(registry, mirror)
    body, media, digest = _fetch_manifest(f"{base}/v2/{repo}/manifests/{tag}", ref, where, timeout)
    try:
        doc = json.loads(body)
    except ValueError:
        raise CheckFailed("lock: base", f"{where} sent a manifest for {ref} that is not JSON",
                          "check the registry (or the mirror) serves OCI/Docker manifests") from None
    if not isinstance(doc, dict):
        raise CheckFailed("lock: base", f"{where} sent a manifest for {ref} that is not an object",
                          "check the registry (or the mirror)")
    if media not in INDEX_TYPES and doc.get("mediaType") not in INDEX_TYPES:
        return digest, None
    entries = [m for m in doc.get("manifests") or [] if isinstance(m, dict) and isinstance(m.get("platform"), dict)]
    if platform is None:
        return digest, None
    for m in entries:
        if f"{m['platform'].get('os')}/{m['platform'].get('architecture')}" == platform \
                and DIGEST_RE.fullmatch(str(m.get("digest", ""))):
            return digest, m["digest"]
    have = sorted({f"{m['platform'].get('os')}/{m['platform'].get('architecture')}" for m in entries})
    raise CheckFailed("lock: base", f"{ref} has no {platform} image (it has: {', '.join(have) or 'none'})",
                      "choose a base built for the spec's arch, or change arch")


def registry_digest(ref: str, timeout: float = 20) -> str:
    """The digest the registry serves for ``ref`` today (through the configured mirror for Docker Hub names)."""
    return registry_manifest(ref, timeout=timeout, mirror=registry_mirror())[0]


def _held_digests(image: dict | None, ref: str) -> list[str]:
    """The registry digests the engine's ``image`` has from ``ref``'s own registry and repository
    (a push of the same image elsewhere does not count)."""
    registry, repo, _ = split_reference(ref)
    return [rd.partition("@")[2] for rd in (image or {}).get("repo_digests") or []
            if split_reference(rd.partition("@")[0])[:2] == (registry, repo)]


def resolve_base(ref: str, engine=None, platform: str | None = None) -> dict:
    """{ref, digest, kind, pinned[, manifest_digest, platform]}: kind 'repo-digest' (pinned =
    repo@digest; for a multi-arch index, repo@ the ``platform`` manifest's digest, so a build pulls exactly
    that image on any machine) or 'image-id' (an image only the engine holds: imported, built here).
    ``engine``: a lock.engine.ImageEngine (Docker, podman or buildah). The registry (or the
    configured mirror for Docker Hub names) is asked first; unreachable, the engine's registry
    digest for the image it pulled is used."""
    name = ref.split("@", 1)[0]
    image = engine.image(ref) if engine is not None else None
    held = _held_digests(image, ref)
    if image is not None and not held:
        return {"ref": ref, "digest": image["id"], "kind": "image-id", "pinned": ref}
    try:
        digest, manifest = registry_manifest(ref, platform, mirror=registry_mirror())
    except CheckFailed:
        if not held:
            raise
        return {"ref": ref, "digest": held[0], "kind": "repo-digest", "pinned": f"{name}@{held[0]}"}
    entry = {"ref": ref, "digest": digest, "kind": "repo-digest", "pinned": f"{name}@{manifest or digest}"}
    if manifest and platform:       # a manifest is picked from an index only for a platform
        entry.update(manifest_digest=manifest, platform=platform)
    return entry


def check_architecture(ref: str, engine, wanted: str) -> None:
    """A base whose image config names another architecture than the spec's ``arch`` (``wanted``:
    Docker's name, amd64 or arm64) is refused before anything is resolved in it: apt in an amd64
    base resolves amd64 packages whatever the spec says. Unknown (an engine that does not say, an
    image the engine does not hold): not checked."""
    image = engine.image(ref) if engine is not None else None
    if _held_digests(image, ref):
        return      # pulled from its registry: a multi-arch name, whose index the lock asks for the arch's image
    have = (image or {}).get("architecture")
    if have and have != wanted:
        fix = (f"name a multi-arch base from a registry (e.g. debian:bookworm-slim): the lock takes its "
               f"{wanted} image; or a local image built for {wanted}")
        raise EnvbuilderError("lock: base", f"{ref} is an {have} image; the spec's arch needs {wanted} "
                              f"(OS packages and the base would be locked for {have})", fix)


def check_engine_base(entry: dict, engine) -> None:
    """Before a build: a local base (image-id) must still be the image the lock names; a registry
    base is pulled by its locked digest through the engine (which goes through the engine's own
    mirror settings: dockerd's registry-mirrors, registries.conf), so the build finds exactly it."""
    if entry.get("kind") == "repo-digest":
        if engine.image(entry["pinned"]) is None:
            try:
                engine.pull(entry["pinned"])
            except RuntimeError as exc:
                raise CheckFailed("base", f"cannot pull the locked base {entry['pinned']} "
                                  f"({str(exc).strip()[-300:]})",
                                  "where the registry (or its mirror) no longer serves that digest, re-lock: "
                                  "envbuilder lock SPEC --update base; unreachable: `envbuilder doctor` names "
                                  "the registry and mirror in force") from None
        return
    if entry.get("kind") != "image-id":
        return
    image = engine.image(entry["ref"])
    if image is None:
        raise CheckFailed("base", f"the engine has no image {entry['ref']} (the lock names {entry['digest'][:19]})",
                          "load or rebuild that exact image, or re-lock: envbuilder lock SPEC --update base")
    if image["id"] != entry["digest"]:
        raise CheckFailed("base", f"{entry['ref']} is now {image['id'][:19]} in the engine; the lock names "
                          f"{entry['digest'][:19]} (the base image drifted)",
                          "restore that image, or accept the new one: envbuilder lock SPEC --update base")
