"""A statement or bundle handed in is untrusted until its signature checked: read ONCE, at most
MAX_BYTES (a 1 GB file is refused after reading MAX_BYTES + 1), parsed depth- and count-bounded
(jsonfile.py), its shape checked before any field is used.

Read once, check those bytes, use those bytes: every signature path reads the file once into
memory (`read_text`), hands a tool (cosign, apptainer) a copy of exactly those bytes in a folder
only this process can write (`private_dir` + `private_copy`), and parses exactly those bytes. A
file swapped by rename between two reads can therefore never make the bytes checked differ from
the bytes used (tests/test_attest_race.py)."""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

from ..errors import EnvbuilderError
from ..jsonfile import check_shape, loads_bounded
from .statement import PROVENANCE_PREDICATE, STATEMENT_TYPE, VERIFY_PREDICATE

MAX_BYTES = 1 << 20        # an attestation of a few hundred checks is ~20 KiB
FIX = "give the attestation `envbuilder verify --attest` wrote (docs/attestation.md)"

_DIGEST = {"type": "object", "required": ["sha256"],
           "properties": {"sha256": {"type": "string", "pattern": "[0-9a-f]{64}",
                                     "description": "64 lower-case hex digits"}}}
SHAPE = {
    "type": "object",
    "required": ["_type", "subject", "predicateType", "predicate"],
    "properties": {
        # cosign attest writes the statement of a registry image itself (v0.1 or v1)
        "_type": {"enum": [STATEMENT_TYPE, "https://in-toto.io/Statement/v0.1"], "description": STATEMENT_TYPE},
        "subject": {"type": "array", "minItems": 1, "maxItems": 16,
                    "items": {"type": "object", "required": ["digest"],
                              "properties": {"name": {"type": "string"}, "digest": _DIGEST}}},
        "predicateType": {"enum": [VERIFY_PREDICATE, PROVENANCE_PREDICATE],
                          "description": f"{VERIFY_PREDICATE} (envbuilder's)"},
        "predicate": {"type": "object"},
    },
}
PREDICATE_SHAPE = {
    "type": "object",
    "required": ["result", "stack", "checks"],
    "properties": {
        "result": {"type": "string"},
        "gate": {"type": "string"},
        "checks": {"type": "array", "maxItems": 10000},
        "stack": {"type": "object", "required": ["id"],
                  "properties": {"id": {"type": "string"}, "spec_id": {"type": "string", "description": "spec:HEX"}}},
        "summary": {"type": ["object", "null"], "description": "the counts of verify's checks (an object)"},
        "time": {"type": ["string", "null"], "description": "a UTC time (text)"},
        # the registry form: the image verify ran (its ID), as `attest sign` records it
        "verified": {"type": "object", "required": ["digest"], "properties": {"digest": _DIGEST}},
    },
}


def read_bytes_once(path: str | Path, field: str, max_bytes: int = MAX_BYTES, fix: str = FIX,
                    missing: str | None = None) -> bytes:
    """The file's bytes, read through ONE open: never blocks on a FIFO (O_NONBLOCK), refuses what
    is not a plain file by the descriptor it read (fstat), at most MAX_BYTES (refused after
    MAX_BYTES + 1). MISSING: the reason when there is no such file (default: not readable)."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise EnvbuilderError(field, missing or f"{path} does not exist", fix) from None
    except OSError as exc:
        raise EnvbuilderError(field, f"cannot read {path}: {exc.strerror or exc}", fix) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise EnvbuilderError(field, f"{path} is not a plain file", fix)
        chunks, size = [], 0
        while size <= max_bytes:
            try:
                b = os.read(fd, min(1 << 20, max_bytes + 1 - size))
            except OSError as exc:
                raise EnvbuilderError(field, f"cannot read {path}: {exc.strerror or exc}", fix) from None
            if not b:
                break
            chunks.append(b)
            size += len(b)
    finally:
        os.close(fd)
    if size > max_bytes:
        raise EnvbuilderError(field, f"{path} is more than {max_bytes} bytes, the most this file can be "
                              f"({max_bytes // (1024 * 1024)} MiB)", fix)
    return b"".join(chunks)


def read_text(path: str | Path, field: str = "--attestation") -> str:
    """The file's text, read once (read_bytes_once), UTF-8."""
    raw = read_bytes_once(path, field, missing=f"no attestation: {path} does not exist",
                          fix="run `envbuilder verify ... --attest FILE` on a passing image, then "
                              "`envbuilder attest sign`" if field in ("--attestation", "STATEMENT") else FIX)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise EnvbuilderError(field, f"{path} is not UTF-8 text (byte {exc.start}): a binary or corrupt file",
                              FIX) from None


@contextlib.contextmanager
def private_dir() -> Iterator[Path]:
    """A folder only this process's user can write (mkdtemp: 0700), removed afterwards: where the
    copies handed to cosign / apptainer lie."""
    with tempfile.TemporaryDirectory(prefix="envbuilder-attest-") as tmp:
        os.chmod(tmp, 0o700)
        yield Path(tmp)


def private_copy(folder: Path, name: str, data: str | bytes) -> Path:
    """DATA (the bytes read once) as FOLDER/NAME, created anew (O_EXCL, never through a link)."""
    path = folder / name
    raw = data.encode("utf-8") if isinstance(data, str) else data
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(raw)
    return path


def parse(text: str, field: str = "--attestation", source: str | None = None) -> dict:
    data = loads_bounded(text, field, max_depth=16, max_values=200_000, fix=FIX, source=source)
    check_shape(data, SHAPE, field, fix=FIX, source=source)
    if data["predicateType"] == VERIFY_PREDICATE:
        check_shape(data["predicate"], PREDICATE_SHAPE, "predicate", fix=FIX, source=source)
    return data


def load(path: str | Path, field: str = "--attestation") -> tuple[str, dict]:
    text = read_text(path, field)
    return text, parse(text, field, str(path))
