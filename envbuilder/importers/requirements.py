"""requirements.txt (pip's format): requirements parsed by the ``packaging`` library (PEP 508:
names, extras, version specifiers, markers, URLs), with pip's own line syntax around them:
comments, continuation lines, ``-r``/``-c`` includes (only files in the same folder), per-line
``--hash`` options (dropped: the lock records the index's own sha256 and pip checks it), index
options (kept as notes). Refused with FILE:LINE and the fix: editable installs and local paths
(the image cannot see them), VCS URLs without a pinned commit, lines that are not requirements
(a YAML or TOML file given as requirements.txt), include loops and includes outside the folder,
includes that cannot be opened (a link loop, a name too long). The files and bytes read through
includes are counted per run (every `- pip:` list of an environment.yml together); every line is
handled in linear time (no backtracking pattern over a line of the user's).
"""

from __future__ import annotations

import re
from pathlib import Path

from ..spec.model import pip_requirement_problem
from ..redact import credential_in, redact
from .model import MAX_BYTES, MAX_FILES, MAX_INCLUDED_BYTES, Dep, Found, canonical, read_text, refuse

# options that take a value, as pip's requirement file reads them
_INCLUDE = ("-r", "--requirement", "-c", "--constraint")
_EDITABLE = ("-e", "--editable")
_INDEX = ("-i", "--index-url", "--extra-index-url")
_IGNORED_WITH_VALUE = ("-f", "--find-links", "--trusted-host", "--use-feature", "--no-binary", "--only-binary",
                       "--config-settings", "--global-option")
_IGNORED_FLAGS = ("--pre", "--prefer-binary", "--no-index", "--require-hashes")
# a bare VCS URL (git+https://...#egg=name), as pip accepts it
_EGG = re.compile(r"[#&]egg=([A-Za-z0-9][A-Za-z0-9._-]*)")


def _uncomment(text: str) -> str:
    """TEXT without its comment: pip's starts at a # at the start of a line or after whitespace.
    One pass over the # signs (a regex of whitespace before a # backtracks: quadratic in a line of
    spaces)."""
    pos = text.find("#")
    while pos >= 0:
        if pos == 0 or text[pos - 1].isspace():
            return text[:pos]
        pos = text.find("#", pos + 1)
    return text


def logical_lines(text: str):
    """(first line number, text) of each logical line: continuations joined, comments removed."""
    parts: list[str] = []
    start = None
    for n, raw in enumerate(text.splitlines(), 1):
        if start is None:
            start = n
        if raw.endswith("\\") and not raw.endswith("\\\\"):
            parts.append(raw[:-1] + " ")
            continue
        parts.append(raw)
        content = _uncomment("".join(parts)).strip()
        if content:
            yield start, content
        parts, start = [], None
    if parts:
        content = _uncomment("".join(parts)).strip()
        if content:
            yield start or 1, content


def _looks_like(text: str) -> str | None:
    """What a line that is no requirement looks like (a file given under the wrong name)."""
    if re.fullmatch(r"\[[A-Za-z0-9_.\" -]+\]", text) or re.match(r"[A-Za-z0-9_-]+\s*=\s*[\"'\[{0-9tf]", text):
        return "TOML (a pyproject.toml?)"
    if re.match(r"[A-Za-z0-9_-]+:(\s|$)", text) or text.startswith("- ") or text == "---":
        return "YAML (an environment.yml?)"
    if text.startswith(("{", "[")):
        return "JSON"
    return None


def parse_requirement(text: str, source: str, line: int | None, *, note: str = "") -> Dep:
    """One requirement (PEP 508, or pip's bare VCS URL with #egg=) as a Dep; refused with the fix
    when the image could not install it as written."""
    from packaging.requirements import InvalidRequirement, Requirement

    words = text.split()
    hashes = [w for w in words if w.startswith("--hash")]
    text = " ".join(w for w in words if not w.startswith("--hash")).strip()
    if hashes:
        note = (note + "; " if note else "") + "its --hash dropped: the lock records the index's sha256"
    if text.startswith(("./", "../", "/", "~", "file:")) or re.fullmatch(r"[^ ;@]*\.(whl|tar\.gz|zip)", text):
        raise refuse(source, line, f"{text[:80]!r} is a local path: the image's build cannot see it",
                     "build it as a wheel and pass its folder with --wheelhouse DIR, then write name==version")
    m = _EGG.search(text)
    if re.match(r"(git|hg|svn|bzr)\+", text):
        if not m:
            raise refuse(source, line, f"{text[:80]!r} is a VCS URL with no package name",
                         "write it as NAME @ git+https://...@<commit>")
        text = f"{m.group(1)} @ {_EGG.sub('', text)}"
    try:
        req = Requirement(text)
    except InvalidRequirement as exc:
        looks = _looks_like(text)
        if looks:
            raise refuse(source, line, f"is not a requirements file: this line looks like {looks}",
                         "give the file under its own name (environment.yml, pyproject.toml)") from None
        raise refuse(source, line, f"{text[:80]!r} is not a requirement pip reads ({str(exc).splitlines()[0][:120]})",
                     "write name, name==version or name>=1.2,<2 (PEP 508)") from None
    problem = pip_requirement_problem(str(req))
    if problem:
        raise refuse(source, line, problem[0], problem[1])
    # kept as the user wrote it (spaces and order), unless only the normalised form passes the spec's check
    kept = text if not pip_requirement_problem(text) else str(req)
    return Dep("pip", canonical(req.name), kept, str(req.specifier), source, line, tuple(sorted(req.extras)), note)


class _Reader:
    """Reads requirement files into ``found``; the budget of files and bytes is the run's (held by
    ``found``), whatever the number of `- pip:` lists or includes it comes through."""

    def __init__(self, found: Found):
        self.found = found

    def read(self, path: Path, shown: str, folder: Path, chain: tuple[Path, ...], *, constraint: bool = False):
        found = self.found
        found.files_read += 1
        if found.files_read > MAX_FILES:
            raise refuse(shown, None, f"is one more requirement file: more than {MAX_FILES} read through -r/-c",
                         "include fewer files (merge them into one)")
        text = read_text(path, shown, "requirements file", limit=MAX_BYTES)
        found.bytes_read += len(text)
        if found.bytes_read > MAX_INCLUDED_BYTES:
            raise refuse(shown, None, f"brings the requirement files read through -r/-c over {MAX_INCLUDED_BYTES} "
                         "bytes together", "include fewer or smaller files")
        for line, content in logical_lines(text):
            self.line(content, shown, line, folder, chain + (path.resolve(),), constraint)

    def include(self, target: str, shown: str, line: int, folder: Path, chain, constraint: bool):
        if not target or len(target) > 255 or any(not c.isprintable() for c in target):
            raise refuse(shown, line, f"includes {target[:80]!r}, which is no file name (empty, over 255 "
                         "characters or with control characters)", "include a file beside this one by its name")
        rel = Path(target)
        candidate = (folder / rel)
        try:
            resolved = candidate.resolve()
            outside = "://" in target or rel.is_absolute() or resolved.parent != folder.resolve()
            is_file = not outside and resolved.is_file()
        except (OSError, RuntimeError, ValueError) as exc:       # a link loop, a name too long
            why = getattr(exc, "strerror", None) or str(exc)
            raise refuse(shown, line, f"includes {target[:80]!r}, which cannot be opened ({why[:80]}: a link "
                         "loop?)", "copy the included file beside this one, or remove the -r line") from None
        if outside:
            raise refuse(shown, line, f"includes {target[:80]!r}, which is not a file in the same folder",
                         "copy the included file beside this one and include it by its name")
        if not is_file:
            raise refuse(shown, line, f"includes {target[:80]!r}, which is not a file there",
                         "copy the included file beside this one, or remove the -r line")
        if resolved in chain:
            raise refuse(shown, line, f"includes {target[:80]!r}, which includes this file again (a loop)",
                         "remove one of the two -r lines")
        self.read(resolved, f"{Path(shown).parent / rel.name}" if Path(shown).parent != Path(".") else rel.name,
                  folder, chain, constraint=constraint)

    def line(self, content: str, shown: str, line: int, folder: Path, chain, constraint: bool):
        head, _, rest = content.partition(" ")
        if "=" in head and head.startswith("--"):
            head, _, value = head.partition("=")
            rest = (value + " " + rest).strip()
        rest = rest.strip()
        if head in _INCLUDE:
            self.include(rest.split()[0] if rest else "", shown, line, folder, chain, head in ("-c", "--constraint"))
        elif head in _EDITABLE or content.startswith("-e"):
            raise refuse(shown, line, f"{content[:80]!r} is an editable install: the image has no source tree to link",
                         "build the project as a wheel (python -m build), pass its folder with --wheelhouse DIR "
                         "and write name==version; or install it at run time from a bind mount")
        elif head in _INDEX:
            url = rest.split()[0] if rest else ""
            self.found.index_urls.append((redact(url)[:200], shown, line, credential_in(url)))
        elif head in _IGNORED_WITH_VALUE or head in _IGNORED_FLAGS:
            self.found.notes.append(f"{shown}:{line}: {head} not kept (the lock decides where wheels come from)")
        elif content.startswith("-"):
            raise refuse(shown, line, f"{head!r} is not an option of a requirements file envbuilder reads",
                         "remove the option, or write the requirement on its own")
        elif constraint:
            dep = parse_requirement(content, shown, line)
            self.found.notes.append(f"{shown}:{line}: constraint {dep.text} not kept (write it in "
                                    "packages.pip if the image needs that version)")
        else:
            self.found.add(parse_requirement(content, shown, line))


def read_requirements(path: Path, shown: str) -> Found:
    found = Found(source=shown, kind="requirements")
    _Reader(found).read(path, shown, path.resolve().parent, ())
    if not found.deps:
        raise refuse(shown, None, "holds no requirement", "give a requirements file with at least the framework "
                     "(e.g. torch==2.13.0)")
    return found


def read_lines(lines: list[tuple[str, int | None]], shown: str, folder: Path, found: Found) -> None:
    """Requirement lines from elsewhere (environment.yml's pip section): the same rules, includes
    relative to ``folder``."""
    reader = _Reader(found)
    for text, line in lines:
        for _, content in logical_lines(text):
            reader.line(content, shown, line or 0, folder, (), False)
