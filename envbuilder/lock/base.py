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

import json
import re
import urllib.error
import urllib.parse
import urllib.request

from ..errors import CheckFailed, EnvbuilderError

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


def registry_digest(ref: str, timeout: float = 20) -> str:
    """The digest the registry serves for ``ref`` today (HEAD of the manifest, anonymous pull token)."""
    registry, repo, tag = split_reference(ref)
    scheme = "http" if registry.startswith(("localhost", "127.")) else "https"
    url = f"{scheme}://{registry}/v2/{repo}/manifests/{tag}"
    headers = {"Accept": MANIFEST_TYPES}
    for _ in range(2):
        req = urllib.request.Request(url, method="HEAD", headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                digest = resp.headers.get("Docker-Content-Digest")
                if not digest:
                    raise CheckFailed("lock: base", f"{registry} sent no digest for {ref}",
                                      "pull the image and lock again")
                return digest
        except urllib.error.HTTPError as exc:
            if exc.code == 401 and "Authorization" not in headers:
                token = _token(exc.headers.get("WWW-Authenticate", ""), timeout)
                if token:
                    headers["Authorization"] = f"Bearer {token}"
                    continue
            raise CheckFailed("lock: base", f"{registry} answered {exc.code} for {ref}",
                              "check the image name and tag (private registries: docker login, then "
                              "docker pull it so the engine has it)") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise CheckFailed("lock: base", f"cannot reach {registry} to resolve {ref} ({reason})",
                              f"docker pull {ref} where the registry is reachable (or docker load it), "
                              "then lock again: the engine's digest is used") from None
    raise CheckFailed("lock: base", f"{registry} refused an anonymous token for {ref}",
                      f"docker login {registry} && docker pull {ref}, then lock again")


def resolve_base(ref: str, engine=None) -> dict:
    """{ref, digest, kind, pinned}: kind 'repo-digest' (pinned = repo@digest) or 'image-id' (local).
    ``engine``: a lock.engine.ImageEngine (Docker, podman or buildah): the same answer from each
    for the same image (an archive keeps the image's ID; registry digests only for pulled images)."""
    if engine is not None:
        image = engine.image(ref)
        if image is not None:
            registry, repo, _ = split_reference(ref)
            for rd in image.get("repo_digests") or []:
                name, _, digest = rd.partition("@")
                if split_reference(name)[:2] == (registry, repo):
                    return {"ref": ref, "digest": digest, "kind": "repo-digest", "pinned": f"{ref}@{digest}"}
            return {"ref": ref, "digest": image["id"], "kind": "image-id", "pinned": ref}
    digest = registry_digest(ref)
    return {"ref": ref, "digest": digest, "kind": "repo-digest", "pinned": f"{ref}@{digest}"}


def check_architecture(ref: str, engine, wanted: str) -> None:
    """A base whose image config names another architecture than the spec's ``arch`` (``wanted``:
    Docker's name, amd64 or arm64) is refused before anything is resolved in it: apt in an amd64
    base resolves amd64 packages whatever the spec says. Unknown (an engine that does not say, an
    image the engine does not hold): not checked."""
    image = engine.image(ref) if engine is not None else None
    have = (image or {}).get("architecture")
    if have and have != wanted:
        fix = (".ci/make-base-image.sh --arch arm64 makes local/debian:bookworm-arm64; name it as base"
               if wanted == "arm64" else f"use a base built for {wanted}")
        raise EnvbuilderError("lock: base", f"{ref} is an {have} image; the spec's arch needs {wanted} "
                              f"(OS packages and the base would be locked for {have})", fix)


def check_engine_base(entry: dict, engine) -> None:
    """Before a build: a local base (image-id) must still be the image the lock names."""
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
