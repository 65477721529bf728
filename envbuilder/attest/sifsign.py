"""The attestation inside the SIF's signed group, with Apptainer's own tools (Apptainer >= 1.2
signs with PEM keys as DSSE envelopes; checked by hand with 1.4.5, unprivileged:
/work/shared/research/apptainer.md §3): `apptainer sif add --datatype 6 --groupid 1 --filename
envbuilder-attestation.json` puts the statement into group 1 beside the root file system, then
`apptainer sign --key` signs the group, so `apptainer verify --key` alone proves the file system
and the attestation together; a byte changed in either fails it."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

from ..errors import EXIT_CHECK_FAILED, EnvbuilderError
from .bounded import MAX_BYTES

OBJECT_NAME = "envbuilder-attestation.json"
JSON_GENERIC = "6"
ROW = re.compile(r"^(\d+)\s*\|(\d+|NONE)\s*\|\S+\s*\|(\d+)-(\d+)\s*\|(.+)$")


def apptainer() -> str:
    exe = shutil.which("apptainer") or shutil.which("singularity")
    if not exe:
        raise EnvbuilderError("apptainer", "no apptainer command on this machine",
                              "run where Apptainer >= 1.2 is (here: tools/apptainer-node), or sign with cosign "
                              "(--format cosign)")
    return exe


_OPEN_FDS: list[int] = []       # descriptors of opened(): handed to every apptainer run


@contextlib.contextmanager
def opened(sif: Path) -> Iterator[tuple[Path, tuple[int, ...]]]:
    """SIF opened once: (/proc/self/fd/N, its fingerprint). Every apptainer command given that
    path reads the same open file (the same inode), whatever SIF's path names meanwhile."""
    from .subject import fingerprint

    try:
        fd = os.open(sif, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise EnvbuilderError("--image", f"cannot read {sif}: {exc.strerror or exc}", "give the signed .sif") from None
    _OPEN_FDS.append(fd)
    try:
        path = Path(f"/proc/self/fd/{fd}")
        yield path, fingerprint(path)
    finally:
        _OPEN_FDS.remove(fd)
        os.close(fd)


def _run(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    try:
        return subprocess.run([apptainer(), *args], capture_output=True, text=True, errors="replace", timeout=timeout,
                              stdin=subprocess.DEVNULL, pass_fds=tuple(_OPEN_FDS))
    except subprocess.TimeoutExpired:
        raise EnvbuilderError(f"apptainer {args[0]}", f"took more than {timeout} s", "") from None


def _reason(proc: subprocess.CompletedProcess) -> str:
    lines = [l.strip() for l in (proc.stderr + proc.stdout).splitlines() if l.strip()]
    fatal = [l for l in lines if "FATAL" in l or "ERROR" in l]
    return ((fatal or lines or [f"exit {proc.returncode}"])[-1])[:300]


def objects(sif: Path) -> list[tuple[str, str, int, str]]:
    """(id, group, size, type) of each object `apptainer sif list` shows."""
    proc = _run("sif", "list", str(sif))
    if proc.returncode != 0:
        raise EnvbuilderError("--image", f"{sif} is not a SIF Apptainer can read: {_reason(proc)}",
                              "give the .sif file")
    rows = []
    for line in proc.stdout.splitlines():
        m = ROW.match(line.strip())
        if m:
            rows.append((m.group(1), m.group(2), int(m.group(4)) - int(m.group(3)), m.group(5).strip()))
    return rows


def attestation_objects(sif: Path) -> list[tuple[str, int]]:
    """(id, size) of the JSON objects named envbuilder-attestation.json."""
    out = []
    for oid, _, size, kind in objects(sif):
        if kind != "JSON.Generic":
            continue
        info = _run("sif", "info", oid, str(sif))
        if any(l.split(":", 1)[-1].strip() == OBJECT_NAME for l in info.stdout.splitlines() if l.strip().startswith("Name:")):
            out.append((oid, size))
    return out


def add_and_sign(sif: Path, statement: Path, key: Path) -> None:
    if attestation_objects(sif):
        raise EnvbuilderError("--image", f"{sif} already holds an envbuilder attestation",
                              "sign a fresh copy of the SIF (an object added after signing breaks the signature)")
    proc = _run("sif", "add", "--datatype", JSON_GENERIC, "--groupid", "1", "--filename", OBJECT_NAME,
                str(sif), str(statement))
    if proc.returncode != 0:
        raise EnvbuilderError("apptainer sif add", _reason(proc), "check that the SIF is writable",
                              exit_code=EXIT_CHECK_FAILED)
    proc = _run("sign", "--key", str(key), str(sif))
    if proc.returncode != 0:
        raise EnvbuilderError("apptainer sign", _reason(proc),
                              "give a PEM private key (openssl genpkey -algorithm ed25519)", exit_code=EXIT_CHECK_FAILED)


def verify(sif: Path, pub: Path) -> str | None:
    """None when `apptainer verify --key PUB` passes; else Apptainer's reason."""
    proc = _run("verify", "--key", str(pub), str(sif))
    return None if proc.returncode == 0 else _reason(proc)


def read_attestation(sif: Path, shown: Path | None = None) -> str | None:
    """The attestation object's text (None: the SIF holds none); bounded before it is read.
    SHOWN: the name to print (SIF may be an open descriptor's /proc path)."""
    found = attestation_objects(sif)
    if not found:
        return None
    if len(found) > 1:
        raise EnvbuilderError("--image", f"{shown or sif} holds {len(found)} envbuilder attestations, one is expected",
                              "sign a fresh copy of the SIF")
    oid, size = found[0]
    # the statement must lie in the group of the root file system (the one signature covers
    # both); in a group of its own, a signed attestation of one image could sit beside another's
    # file system
    group = next((g for i, g, _, _ in objects(sif) if i == oid), None)
    fs_groups = {g for _, g, _, kind in objects(sif) if kind.startswith("FS")}
    if group not in fs_groups:
        raise EnvbuilderError("attestation", f"no attestation: the attestation in {shown or sif} is in object group "
                              f"{group}, not in the root file system's ({', '.join(sorted(fs_groups)) or 'none'})",
                              "envbuilder attest sign --format apptainer on a fresh copy of the SIF (group 1)")
    if size > MAX_BYTES:
        raise EnvbuilderError("--image", f"the attestation in {shown or sif} is {size} bytes, more than {MAX_BYTES} "
                              f"({MAX_BYTES // (1 << 20)} MiB)", "sign a fresh copy with the attestation verify wrote")
    proc = _run("sif", "dump", oid, str(sif))
    if proc.returncode != 0:
        raise EnvbuilderError("apptainer sif dump", _reason(proc), "")
    return proc.stdout
