"""What an importer reads out of a user's file: each dependency with the file and line it came from.

Every reader (requirements.py, condaenv.py, pyproject.py) returns a ``Found``; mapping.py turns
it into a spec. Nothing read here is ever run: files are read as text, bounded in size and count.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import EnvbuilderError

# a requirements file, an environment.yml or a pyproject.toml is a page or two; a lock (uv.lock,
# pylock.toml) can be a few MB
MAX_BYTES = 1_000_000
MAX_LOCK_BYTES = 16_000_000
MAX_FILES = 32                  # -r includes, conda-meta records are counted separately
MAX_DEPS = 5_000


@dataclass(frozen=True)
class Dep:
    """One dependency as the user wrote it. ``kind``: pip or conda; ``name``: PEP 503 / conda
    name, lower case; ``text``: the requirement to keep (pip: PEP 508, conda: a match spec);
    ``version``: the specifier part (pip: ``==2.13.0``, ``>=1.2,<2``; conda: ``=1.2``, ``>=1.2``)."""
    kind: str
    name: str
    text: str
    version: str
    source: str
    line: int | None
    extras: tuple[str, ...] = ()
    note: str = ""

    @property
    def where(self) -> str:
        return f"{self.source}:{self.line}" if self.line else self.source


@dataclass
class Found:
    """Everything one file (and its includes) says, in the order written."""
    source: str
    kind: str                                   # requirements | environment.yml | pyproject.toml | conda env
    deps: list[Dep] = field(default_factory=list)
    name: str | None = None
    python: tuple[str, str, int | None] | None = None     # (version or specifier, source, line)
    notes: list[str] = field(default_factory=list)        # what was read but not kept
    index_urls: list[tuple[str, str, int | None]] = field(default_factory=list)
    conda_channels: list[str] = field(default_factory=list)   # environment.yml's channels, in order

    def add(self, dep: Dep) -> None:
        if len(self.deps) >= MAX_DEPS:
            raise refuse(dep.source, dep.line, f"holds more than {MAX_DEPS} dependencies",
                         "give the file of the environment's top-level requirements")
        self.deps.append(dep)


def refuse(source: str, line: int | None, reason: str, fix: str) -> EnvbuilderError:
    """The one shape of an import refusal: FILE:LINE: init: reason, fix; exit 2."""
    return EnvbuilderError("init", reason, fix, line=line, source=source)


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_text(path: Path, shown: str, what: str, limit: int = MAX_BYTES) -> str:
    """A user's file as text: a regular file (a link is followed only to a regular file), at most
    ``limit`` bytes, UTF-8, no NUL byte."""
    try:
        if not path.is_file():
            raise refuse(shown, None, f"is not a file ({what} expected)", f"give the path of a {what}")
        size = path.stat().st_size
        if size > limit:
            raise refuse(shown, None, f"is {size} bytes, more than a {what} can be ({limit})",
                         f"give the {what} itself, not a generated or binary file")
        with open(path, "rb") as fh:
            raw = fh.read(limit + 1)
    except OSError as exc:
        raise refuse(shown, None, f"cannot be read: {exc.strerror or exc}", "check the path and its permissions") from None
    if len(raw) > limit:
        raise refuse(shown, None, f"is more than {limit} bytes", f"give the {what} itself")
    if b"\x00" in raw:
        raise refuse(shown, None, f"is a binary file, not a {what}", f"give the path of a {what}")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise refuse(shown, line, f"is not UTF-8 text (byte {exc.start})", f"save the {what} as UTF-8") from None
    return text
