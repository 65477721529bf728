"""The way back from a lock (`envbuilder export`): the Python packages as a requirements file with
their hashes, and the conda packages as conda's explicit list, so the same environment can be made
outside a container. Both name the image's Python and platform: a hash belongs to one wheel file,
so they install as they are on that platform only (``pip install --require-hashes --no-deps -r``;
``conda create --file`` / ``micromamba create --file``)."""

from __future__ import annotations

from ..quoting import comment_text
from .model import Lock, canonical_name


def requirements(lock: Lock, source: str) -> str:
    entries = sorted(lock.pip_entries(), key=lambda e: canonical_name(e["name"]))
    local = [e["name"] for e in entries if e.get("from") == "wheelhouse"]
    # SOURCE is the path the user gave (a folder name may hold a newline): escaped, so it stays a comment
    lines = [f"# Exported by `envbuilder export requirements` from {comment_text(source)} ({comment_text(lock.name)}): "
             "every package the image",
             "# ends with, its exact version and sha256, for the image's Python and platform (a hash names one wheel).",
             "# pip install --require-hashes --no-deps -r THIS_FILE"]
    if local:
        lines.append(f"# from a local wheelhouse (give it with --find-links DIR): {comment_text(', '.join(local))}")
    lines += [f"{e['name']}=={e['version']} --hash=sha256:{e['sha256']}" for e in entries]
    return "\n".join(lines) + "\n"


def conda_explicit(lock: Lock, source: str) -> str:
    pkgs = sorted(lock.conda_packages(), key=lambda p: p["name"])
    lines = [f"# Exported by `envbuilder export conda` from {comment_text(source)} ({comment_text(lock.name)}): "
             "conda's explicit list",
             "# conda create --name ENV --file THIS_FILE (or micromamba create --file); md5 after the #",
             "# platform: linux-64", "@EXPLICIT"]
    for p in pkgs:
        md5 = (p.get("hash") or {}).get("md5")
        lines.append(p["url"] + (f"#{md5}" if md5 else ""))
    return "\n".join(lines) + "\n"
