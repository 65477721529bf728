#!/usr/bin/env python3
"""A multi-arch index in a registry, from one tag per architecture (stdlib only; .ci/mirror-bases.sh).

    mirror_index.py join  ADDR REPO TAG ARCH...   # REPO:TAG-ARCH for each ARCH -> REPO:TAG, an index
    mirror_index.py check ADDR REPO TAG ARCH...   # exit 0 when REPO:TAG is an index naming every ARCH

ADDR is a plain-HTTP registry on this machine (127.0.0.1:5000). The index has Docker Hub's shape:
a manifest list (application/vnd.docker.distribution.manifest.list.v2+json) with one entry per
platform, each naming its manifest by digest and size, so `docker pull debian:bookworm-slim`, a
pull by the index digest and a pull by one platform's manifest digest all work as they do against
Docker Hub.
"""

from __future__ import annotations

import hashlib
import json
import sys
import urllib.request

LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def _get(url: str, accept: str) -> tuple[bytes, str]:
    req = urllib.request.Request(url, headers={"Accept": accept})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return resp.read(), resp.headers.get("Content-Type", "")


def join(addr: str, repo: str, tag: str, arches: list[str]) -> str:
    entries = []
    for arch in arches:
        body, media = _get(f"http://{addr}/v2/{repo}/manifests/{tag}-{arch}", f"{MANIFEST}, {OCI_MANIFEST}")
        config = json.loads(body)["config"]["digest"]
        blob, _ = _get(f"http://{addr}/v2/{repo}/blobs/{config}", "*/*")
        have = json.loads(blob).get("architecture")
        if have != arch:
            raise SystemExit(f"mirror_index: {repo}:{tag}-{arch} is an {have} image")
        entries.append({"mediaType": media.split(";")[0] or MANIFEST, "size": len(body),
                        "digest": "sha256:" + hashlib.sha256(body).hexdigest(),
                        "platform": {"architecture": arch, "os": "linux", **({"variant": "v8"} if arch == "arm64" else {})}})
    index = json.dumps({"schemaVersion": 2, "mediaType": LIST, "manifests": entries}, indent=3).encode()
    req = urllib.request.Request(f"http://{addr}/v2/{repo}/manifests/{tag}", data=index, method="PUT",
                                 headers={"Content-Type": LIST})
    with urllib.request.urlopen(req, timeout=30) as resp:
        digest = resp.headers.get("Docker-Content-Digest")
    print(f"mirror_index: {addr}/{repo}:{tag} = {digest} ({', '.join(arches)})")
    return digest


def check(addr: str, repo: str, tag: str, arches: list[str]) -> bool:
    try:
        body, _ = _get(f"http://{addr}/v2/{repo}/manifests/{tag}", f"{LIST}, {OCI_INDEX}")
    except OSError:
        return False
    have = {m.get("platform", {}).get("architecture") for m in json.loads(body).get("manifests", [])}
    return set(arches) <= have


def main(argv: list[str]) -> int:
    if len(argv) < 5 or argv[0] not in ("join", "check"):
        print(__doc__, file=sys.stderr)
        return 2
    verb, addr, repo, tag, *arches = argv
    if verb == "check":
        return 0 if check(addr, repo, tag, arches) else 1
    join(addr, repo, tag, arches)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
