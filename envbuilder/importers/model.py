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
MAX_FILES = 32                  # requirement files read in one run (-r/-c includes, every `- pip:` list's)
MAX_INCLUDED_BYTES = 4_000_000  # their bytes together
MAX_DEPS = 5_000
# a TOML or JSON file is scanned before its parser sees it: tomllib and json recurse once per level
# (tens of thousands of [ ... a RecursionError) and int() of a 5,000-digit number raises; no real
# pyproject.toml, lock or conda-meta record nests deeper than ten or holds an integer over 20 digits
MAX_NESTING = 64
MAX_DIGITS = 100
# where a login or token in a URL goes instead of the file (messages and the spec's notes)
CREDENTIAL_FIX = ("a login or token never goes into a spec: put it in a netrc file (machine HOST login USER "
                  "password TOKEN) given with --netrc FILE or the config file's `netrc` key (envbuilder config, "
                  "docs/config.md), and the index's URL without it in `extra_index_url` / "
                  "ENVBUILDER_EXTRA_INDEX_URL")
CONDA_TOKEN_FIX = ("a channel's token never goes into a spec: name the channel without it, and give the token "
                   "to the conda solver (py-rattler) in its credentials file, RATTLER_AUTH_FILE "
                   "({\"HOST\": {\"CondaToken\": \"TOKEN\"}}), or a netrc file (NETRC or ~/.netrc)")


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
    # (URL with any login hidden, file, line, what credential it held or None)
    index_urls: list[tuple[str, str, int | None, str | None]] = field(default_factory=list)
    conda_channels: list[str] = field(default_factory=list)   # environment.yml's channels, in order
    files_read: int = 0                         # requirement files read so far (the budget is per run)
    bytes_read: int = 0

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


_SCAN_TOML = re.compile(r'"""|\'\'\'|["\'#\[\]{}]|[0-9_]{' + str(MAX_DIGITS + 1) + ',}')
_SCAN_JSON = re.compile(r'["\[\]{}]|[0-9]{' + str(MAX_DIGITS + 1) + ',}')
_BASIC = re.compile(r'(?:[^"\\\n]|\\.)*"')
_BASIC_ML = re.compile(r'(?:[^"\\]|\\[\s\S]|"(?!""))*"""')
_JSON_STR = re.compile(r'(?:[^"\\]|\\.)*"')


def check_structure(text: str, shown: str, what: str, *, json: bool = False) -> None:
    """Refuse, before tomllib or json reads TEXT, nesting deeper than MAX_NESTING and numbers of more
    than MAX_DIGITS digits (each would raise inside the parser: RecursionError, ValueError). One
    linear pass that skips strings and comments; the parser still judges the syntax."""
    scan = _SCAN_JSON if json else _SCAN_TOML
    depth, pos, n = 0, 0, len(text)
    while pos < n:
        m = scan.search(text, pos)
        if not m:
            return
        tok, pos = m.group(0), m.end()
        if tok in ("[", "{"):
            depth += 1
            if depth > MAX_NESTING:
                raise refuse(shown, text.count("\n", 0, m.start()) + 1,
                             f"nests arrays or tables more than {MAX_NESTING} deep: not a {what}",
                             f"give the {what} itself (a real one nests a few levels)")
        elif tok in ("]", "}"):
            depth = max(0, depth - 1)
        elif tok == "#":
            end = text.find("\n", pos)
            pos = n if end < 0 else end
        elif tok in ('"""', "'''"):
            if tok == '"""':
                e = _BASIC_ML.match(text, pos)
                pos = e.end() if e else n
            else:
                end = text.find("'''", pos)
                pos = n if end < 0 else end + 3
        elif tok == '"':
            e = (_JSON_STR if json else _BASIC).match(text, pos)
            pos = e.end() if e else (n if json else (text.find("\n", pos) % (n + 1)))
        elif tok == "'":
            end, nl = text.find("'", pos), text.find("\n", pos)
            if end >= 0 and (nl < 0 or end < nl):
                pos = end + 1                       # a literal string ends on its line
            else:
                pos = n if nl < 0 else nl
        else:
            raise refuse(shown, text.count("\n", 0, m.start()) + 1,
                         f"holds a number of {len(tok)} digits: not a {what}",
                         f"give the {what} itself (its numbers have at most {MAX_DIGITS} digits)")
