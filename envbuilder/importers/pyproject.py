"""pyproject.toml (PEP 621): ``[project].dependencies``, the optional groups asked for
(``--extra NAME``), ``requires-python``, ``name``; read with the standard library's tomllib. When
a ``uv.lock`` or ``pylock.toml`` (PEP 751) lies beside it, each direct dependency is pinned to the
version that lock holds (what the project was tested with); the lock's hashes are not copied:
envbuilder's own lock records the index's for the image's platform.
"""

from __future__ import annotations

import bisect
import importlib
import re
from pathlib import Path

from .model import MAX_LOCK_BYTES, Found, canonical, check_structure, read_text, refuse
from .requirements import parse_requirement


def _toml(text: str, shown: str, what: str) -> dict:
    try:
        tomllib = importlib.import_module("tomllib")
    except ModuleNotFoundError:            # Python < 3.11
        raise refuse(shown, None, "reading TOML needs Python 3.11 or later (tomllib)",
                     "run envbuilder with Python >= 3.11") from None
    check_structure(text, shown, what)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        m = re.search(r"line (\d+)", str(exc))
        raise refuse(shown, int(m.group(1)) if m else None, f"is not a {what}: TOML error: {str(exc)[:160]}",
                     f"give a valid {what}") from None
    except (RecursionError, ValueError, MemoryError) as exc:     # what the scan above should already stop
        raise refuse(shown, None, f"is not a {what} tomllib can read ({type(exc).__name__})",
                     f"give the {what} itself") from None


def _line_of(text: str, needle: str, after: int = 0) -> int | None:
    """The line of the first occurrence of ``needle`` at or after line ``after`` (tomllib keeps
    no positions)."""
    lines = text.splitlines()
    for n in range(after, len(lines)):
        if needle in lines[n]:
            return n + 1
    return None


_TOKEN = re.compile(r'"""|\'\'\'|["\'#]')
_BASIC = re.compile(r'(?:[^"\\\n]|\\.)*"')


class _Strings:
    """Where each quoted string of a TOML text lies, read once: the line of a requirement in
    O(1) (a search of the text per requirement is quadratic: 5,000 requirements in 1 MB)."""

    def __init__(self, text: str):
        self.at: dict[str, list[int]] = {}
        self.starts = [0] + [m.end() for m in re.finditer("\n", text)]
        # one pass, each string or comment skipped whole (a pattern retried at every quote of an
        # unclosed run, `"\"\"\"...` in a comment, is quadratic)
        pos, n = 0, len(text)
        while pos < n:
            m = _TOKEN.search(text, pos)
            if not m:
                break
            tok, start, pos = m.group(0), m.start(), m.end()
            if tok == "#":
                end = text.find("\n", pos)
                pos = n if end < 0 else end
            elif tok in ('"""', "'''"):
                end = text.find(tok, pos)
                pos = n if end < 0 else end + 3
            else:
                end, nl = text.find(tok, pos), text.find("\n", pos)
                if tok == '"':
                    e = _BASIC.match(text, pos)
                    end = e.end() - 1 if e else -1
                if end >= 0 and (nl < 0 or end < nl):
                    self.at.setdefault(text[pos:end], []).append(start)
                    pos = end + 1
                else:
                    pos = n if nl < 0 else nl

    def line(self, value: str, after: int = 0) -> int | None:
        """The line of the first string VALUE at or after line AFTER (1-based), else its first."""
        hits = self.at.get(value)
        if not hits:
            return None
        lines = [bisect.bisect_right(self.starts, pos) for pos in hits[:50]]
        return next((ln for ln in lines if ln >= after), lines[0])


def _version(value: str, name: str, lock_shown: str, lock_text: str) -> str:
    """A version a lock pins, checked as a version (PEP 440) before it becomes ==VALUE."""
    from packaging.version import InvalidVersion, Version

    try:
        Version(value)
    except InvalidVersion:
        raise refuse(lock_shown, _line_of(lock_text, f'"{value}"') if len(value) < 200 else None,
                     f"pins {name} to {value[:80]!r}, which is not a version (PEP 440)",
                     f"regenerate the lock ({Path(lock_shown).name}), or pin {name} in pyproject.toml") from None
    return value


def _lock_versions(folder: Path, shown_folder: str) -> tuple[dict[str, str], str | None, str]:
    for name, key in (("pylock.toml", "packages"), ("uv.lock", "package")):
        path = folder / name
        if path.is_file():
            shown = f"{shown_folder}/{name}" if shown_folder not in ("", ".") else name
            text = read_text(path, shown, name, MAX_LOCK_BYTES)
            data = _toml(text, shown, name)
            pkgs = data.get(key)
            if not isinstance(pkgs, list):
                raise refuse(shown, None, f"is not a {name}: no [[{key}]] tables", f"regenerate it ({name})")
            out: dict[str, str] = {}
            for p in pkgs:
                if isinstance(p, dict) and isinstance(p.get("name"), str) and isinstance(p.get("version"), str):
                    out.setdefault(canonical(p["name"])[:200], p["version"])
            return out, shown, text
    return {}, None, ""


def read_pyproject(path: Path, shown: str, extras: tuple[str, ...] = ()) -> Found:
    text = read_text(path, shown, "pyproject.toml")
    data = _toml(text, shown, "pyproject.toml")
    project = data.get("project")
    if not isinstance(project, dict):
        raise refuse(shown, 1, "has no [project] table (PEP 621): its dependencies are not declared there",
                     "declare them under [project] dependencies = [...], or give a requirements file")
    dynamic = project.get("dynamic") or []
    if isinstance(dynamic, list) and "dependencies" in dynamic and not project.get("dependencies"):
        raise refuse(shown, _line_of(text, "dynamic"), "declares its dependencies `dynamic`: they are computed "
                     "by the build backend (setup.py, a requirements file), which envbuilder never runs",
                     "give the requirements file the backend reads (envbuilder init requirements.txt)")
    found = Found(source=shown, kind="pyproject.toml")
    if isinstance(project.get("name"), str):
        found.name = project["name"]
    section = _line_of(text, "[project]") or 1
    if isinstance(project.get("requires-python"), str):
        found.python = (project["requires-python"], shown, _line_of(text, "requires-python", section - 1))
    pins, lock_name, lock_text = _lock_versions(path.resolve().parent, str(Path(shown).parent))
    strings = _Strings(text)
    groups: list[tuple[str, list]] = [("dependencies", project.get("dependencies") or [])]
    optional = project.get("optional-dependencies") or {}
    if not isinstance(optional, dict):
        raise refuse(shown, _line_of(text, "optional-dependencies"), "[project.optional-dependencies] is not a table",
                     "write [project.optional-dependencies] with NAME = [...] lists")
    for extra in extras:
        if extra not in optional:
            raise refuse(shown, _line_of(text, "optional-dependencies"),
                         f"has no optional group {extra!r} (it has: {', '.join(sorted(optional)) or 'none'})",
                         "name one of them with --extra")
        groups.append((extra, optional[extra]))
    if optional and not extras:
        found.notes.append(f"{shown}: optional groups {', '.join(sorted(optional))} not read "
                           "(envbuilder init --extra NAME reads one)")
    for group, reqs in groups:
        if not isinstance(reqs, list) or not all(isinstance(r, str) for r in reqs):
            raise refuse(shown, _line_of(text, group), f"{group} is not a list of requirement strings",
                         "write dependencies = [\"numpy>=1.26\", ...]")
        start = _line_of(text, f"{group} =") or _line_of(text, f"{group}=") or section
        for req in reqs:
            line = strings.line(req, start)
            dep = parse_requirement(req, shown, line)
            if dep.name in pins and not dep.version.startswith("=="):
                from packaging.requirements import Requirement

                pinned = _version(pins[dep.name], dep.name, lock_name or "", lock_text)
                r = Requirement(dep.text)
                asked = str(r.specifier) or "any version"
                r.specifier = type(r.specifier)(f"=={pinned}")
                dep = parse_requirement(str(r), shown, line, note=f"pinned from {lock_name} ({asked} asked)")
            found.add(dep)
    return found
