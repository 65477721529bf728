"""Conda: an ``environment.yml`` (its ``dependencies``, the ``pip:`` list inside them, ``name``,
``channels`` noted) read with the spec's safe YAML loader (spec/yamlsource.py: no tags, bounded
size, depth and alias expansion), and an existing conda environment's folder: the packages the
user asked for (``conda-meta/*.json`` records with a ``requested_spec``, else conda-meta/history)
at the versions installed, and the pip packages installed into it by request (``*.dist-info``
holding ``INSTALLER`` = pip and a ``REQUESTED`` file).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from ..errors import EnvbuilderError
from ..spec.yamlsource import parse_yaml_text
from ..redact import credential_in, redact, strip_credentials
from ..spec.model import conda_channel_problem
from .model import CONDA_TOKEN_FIX, MAX_BYTES, Dep, Found, canonical, check_structure, read_text, refuse
from .requirements import parse_requirement, read_lines

MAX_RECORDS = 5_000        # conda-meta records / dist-info folders read from one environment
_NAME = re.compile(r"([A-Za-z0-9_][A-Za-z0-9._-]*)\s*(.*)")
_OP = re.compile(r"(==|>=|<=|!=|~=|=|<|>)")


def conda_dep(text: str, source: str, line: int | None) -> Dep:
    """One conda match spec (``numpy``, ``numpy=1.26``, ``numpy 1.26.*``, ``numpy>=1.2,<2``,
    ``conda-forge::numpy=1.26.4=py311h...``) as a Dep: the channel prefix and build string
    are dropped (noted), the version part kept; ``version`` holds it as a pip specifier so the
    framework and MPI versions are chosen the same way for both."""
    note = []
    raw = text.strip()
    if "::" in raw:
        chan, raw = raw.split("::", 1)
        note.append(f"channel {chan} dropped (the lock's channel serves every package)")
    if "[" in raw:
        raise refuse(source, line, f"{text[:80]!r}: bracketed match specs are not read",
                     "write name=version or name>=1.2,<2")
    m = _NAME.fullmatch(raw)
    if not m:
        raise refuse(source, line, f"{text[:80]!r} is not a conda package (name, name=version)",
                     "write name=version or name>=1.2,<2")
    name, rest = m.group(1), m.group(2).strip()
    version = ""
    if rest:
        parts = rest.split()
        if len(parts) > 1 and not _OP.match(parts[1]):       # "numpy 1.26.* py311_0": a build string
            note.append(f"build {parts[1]} dropped")
            parts = parts[:1]
        rest = "".join(parts)
        if not _OP.match(rest):
            rest = "=" + rest                                 # "numpy 1.26.*" means numpy=1.26.*
        if rest.startswith("=") and not rest.startswith("=="):
            pieces = rest[1:].split("=")
            if len(pieces) > 1:
                note.append(f"build {pieces[1]} dropped")
            rest = "=" + pieces[0]
        version = rest
    spec = _pip_specifier(version, source, line, text)
    return Dep("conda", name.lower(), name.lower() + version, spec, source, line, (), "; ".join(note))


def _pip_specifier(version: str, source: str, line: int | None, text: str) -> str:
    """conda's version part as a pip specifier: =1.26 -> ==1.26.* (conda's fuzzy match)."""
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    if not version:
        return ""
    if version.startswith("=") and not version.startswith("=="):
        v = version[1:]
        out = f"=={v}" if v.endswith("*") else f"=={v}.*" if v.count(".") < 2 else f"=={v}"
    else:
        out = version
    try:
        return str(SpecifierSet(out.replace(".*.*", ".*")))
    except InvalidSpecifier:
        return "?"      # a conda version pip's rules do not read (jpeg=9e): kept as written, compared with nothing


def read_environment_yml(path: Path, shown: str) -> Found:
    text = read_text(path, shown, "environment.yml")
    try:
        doc = parse_yaml_text(text, shown)
    except EnvbuilderError as exc:
        raise refuse(shown, exc.line, f"is not a YAML environment file: {exc.reason}", exc.fix) from None
    data = doc.data
    if not isinstance(data, dict) or not isinstance(data.get("dependencies"), list):
        raise refuse(shown, 1, "is not an environment.yml: no `dependencies:` list at the top level",
                     "give the file `conda env export --from-history` writes (name, channels, dependencies)")
    found = Found(source=shown, kind="environment.yml")
    if isinstance(data.get("name"), str):
        found.name = data["name"]
    chans = data.get("channels") or []
    if not isinstance(chans, list) or not all(isinstance(c, str) for c in chans):
        raise refuse(shown, doc.line_of("channels"), "`channels:` must be a list of channel names or URLs",
                     "write one channel per item: - conda-forge")
    # Anaconda's `defaults` has no single URL (and terms of its own): left to the site's mirror
    kept = []
    for n, chan in enumerate(chans):
        if chan in ("defaults", "nodefaults"):
            continue
        line = doc.line_of(f"channels[{n}]") or doc.line_of("channels")
        if credential_in(chan):
            bare = strip_credentials(chan)
            found.notes.append(f"{shown}:{line}: channel {redact(chan)[:200]} holds {credential_in(chan)}: "
                               f"not kept, the channel kept as {bare[:200]} ({CONDA_TOKEN_FIX})")
            chan = bare
        problem = conda_channel_problem(chan)
        if problem:
            raise refuse(shown, line, f"channel {redact(chan)[:120]!r} {problem[0]}", problem[1])
        kept.append(chan)
    found.conda_channels = kept
    if kept:
        found.notes.append(f"{shown}:{doc.line_of('channels')}: channels {', '.join(kept)[:200]} kept as "
                           "packages.conda_channels (a site's mirror replaces them: ENVBUILDER_CONDA_CHANNEL, "
                           "docs/lock.md)")
    if len(kept) < len(chans):
        found.notes.append(f"{shown}:{doc.line_of('channels')}: channel defaults not kept (Anaconda's; a site "
                           "names its mirror with ENVBUILDER_CONDA_CHANNEL)")
    if data.get("variables"):
        found.notes.append(f"{shown}:{doc.line_of('variables')}: variables not kept (set them in `env:`)")
    for n, entry in enumerate(data["dependencies"]):
        where = f"dependencies[{n}]"
        line = doc.line_of(where)
        if isinstance(entry, dict) and set(entry) == {"pip"} and isinstance(entry["pip"], list):
            lines = []
            for k, item in enumerate(entry["pip"]):
                if not isinstance(item, str):
                    raise refuse(shown, doc.line_of(f"{where}.pip[{k}]"), "a pip entry must be text",
                                 "write requirement lines such as numpy==1.26.4")
                lines.append((item, doc.line_of(f"{where}.pip[{k}]")))
            read_lines(lines, shown, path.resolve().parent, found)
            continue
        if not isinstance(entry, str):
            raise refuse(shown, line, f"dependency {n + 1} is not a package name",
                         "write `- name=version` (or a `- pip:` list)")
        dep = conda_dep(entry, shown, line)
        if dep.name == "python":
            found.python = (dep.version or "", shown, line)
        elif dep.name == "pip":
            continue
        elif dep.name.startswith("_"):      # conda's own mutex packages (_libgcc_mutex): what the solver picks
            found.notes.append(f"{shown}:{line}: {dep.text} not kept (a conda solver detail)")
        else:
            found.add(dep)
    return found


MAX_RECORD_BYTES = 16 * MAX_BYTES       # one conda-meta record (a large package's file list: a few MB)
MAX_META_BYTES = 256 * MAX_BYTES        # all of them together (a large CUDA environment: about 100 MB)


def _inside(path: Path, root: Path) -> bool:
    try:
        path.resolve().relative_to(root)
        return True
    except (ValueError, OSError, RuntimeError):
        return False


def _history_specs(prefix: Path, shown: str) -> set[str]:
    """Names asked for in conda-meta/history (`# update specs: [...]`, `# cmd: ... create`)."""
    path = prefix / "conda-meta" / "history"
    if path.is_symlink():
        raise refuse(f"{shown}/conda-meta/history", None, "is a link: conda writes its history as a file in the "
                     "environment", "give the environment's own folder (not links into another)")
    if not path.is_file():
        return set()
    text = read_text(path, f"{shown}/conda-meta/history", "conda history", limit=16 * MAX_BYTES)
    names = set()
    for m in re.finditer(r"^# (?:update|install|create) specs: \[(.*)\]$", text, flags=re.M):
        for item in re.findall(r"'([^']*)'|\"([^\"]*)\"", m.group(1)):
            spec = (item[0] or item[1]).split("::")[-1]
            nm = _NAME.fullmatch(spec.strip())
            if nm:
                names.add(nm.group(1).lower())
    for m in re.finditer(r"^# remove specs: \[(.*)\]$", text, flags=re.M):
        for item in re.findall(r"'([^']*)'", m.group(1)):
            names.discard(item.split("::")[-1].split("=")[0].strip().lower())
    return names


def _record(path: Path, rel: str, seen: set[tuple[int, int]], budget: list[int]) -> tuple[str, str, bool]:
    """(name, version, asked) of one conda-meta record; only those three are kept (a record's file
    list can be MBs: hundreds of them in memory at once is what a hostile folder would ask)."""
    if path.is_symlink():
        raise refuse(rel, None, "is a link: a conda record is a file", "give a real conda environment folder")
    try:
        st = path.stat()
    except OSError as exc:
        raise refuse(rel, None, f"cannot be read: {exc.strerror or exc}", "check the folder's permissions") from None
    if (st.st_dev, st.st_ino) in seen:
        raise refuse(rel, None, "is the same file as another record (a hard link): conda writes one record per "
                     "package", "give a real conda environment folder")
    seen.add((st.st_dev, st.st_ino))
    budget[0] += st.st_size
    if budget[0] > MAX_META_BYTES:
        raise refuse(rel, None, f"brings conda-meta's records over {MAX_META_BYTES} bytes together",
                     "export the environment: conda env export --from-history > environment.yml")
    text = read_text(path, rel, "conda-meta record", limit=MAX_RECORD_BYTES)
    check_structure(text, rel, "conda-meta record", json=True)
    try:
        rec = json.loads(text)
    except json.JSONDecodeError as exc:
        raise refuse(rel, exc.lineno, f"is not a conda-meta record (JSON: {exc.msg})",
                     "give a conda environment's folder (it holds conda-meta/*.json)") from None
    except (RecursionError, ValueError) as exc:
        raise refuse(rel, None, f"is not a conda-meta record ({type(exc).__name__})",
                     "give a conda environment's folder") from None
    if not isinstance(rec, dict) or not isinstance(rec.get("name"), str) or not isinstance(rec.get("version"), str):
        raise refuse(rel, 1, "is not a conda-meta record (no name and version)",
                     "give a conda environment's folder")
    return rec["name"][:200], rec["version"][:200], bool(rec.get("requested_spec"))


def read_conda_prefix(prefix: Path, shown: str) -> Found:
    root = prefix.resolve()
    meta = prefix / "conda-meta"
    if meta.is_symlink() or not _inside(meta, root):
        raise refuse(f"{shown}/conda-meta", None, "is a link (to another environment?): conda writes conda-meta "
                     "inside the environment", "give the environment's own folder")
    found = Found(source=shown, kind="conda env")
    found.name = root.name
    records = []
    seen: set[tuple[int, int]] = set()
    budget = [0]
    for count, path in enumerate(sorted(meta.glob("*.json"))):
        if count >= MAX_RECORDS:
            raise refuse(f"{shown}/conda-meta", None, f"holds more than {MAX_RECORDS} records",
                         "export the environment: conda env export --from-history > environment.yml")
        rel = f"{shown}/conda-meta/{path.name}"
        records.append((rel, *_record(path, rel, seen, budget)))
    asked = _history_specs(prefix, shown)
    for rel, raw_name, version, requested in records:
        name = raw_name.lower()
        requested = requested or name in asked
        if name == "python":
            found.python = ("==" + ".".join(version.split(".")[:2]) + ".*", rel, None)
            continue
        if not requested or name == "pip":
            continue
        found.add(conda_dep(f"{name}={version}", rel, None))
    _pip_in_prefix(prefix, root, shown, found)
    if not found.deps:
        raise refuse(shown, None, "has no package the user asked for (no requested_spec in conda-meta, "
                     "no conda-meta/history)", "export it instead: conda env export --from-history > environment.yml")
    return found


def _pip_in_prefix(prefix: Path, root: Path, shown: str, found: Found) -> None:
    count = 0
    for site in sorted(prefix.glob("lib/python3*/site-packages")):
        if not _inside(site, root):
            raise refuse(f"{shown}/{site.relative_to(prefix)}", None, "is a link leaving the environment: pip "
                         "installs into the environment's own site-packages", "give the environment's own folder")
        for info in sorted(site.glob("*.dist-info")):
            count += 1
            if count > MAX_RECORDS:
                raise refuse(str(site), None, f"holds more than {MAX_RECORDS} packages", "export the environment")
            if info.is_symlink() or not (info / "REQUESTED").is_file():
                continue
            installer = info / "INSTALLER"
            if installer.is_symlink() or not installer.is_file() \
                    or read_text(installer, str(installer), "INSTALLER", 1000).strip() != "pip":
                continue
            m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._]*)-([A-Za-z0-9.+!_]+)\.dist-info", info.name)
            if not m:
                continue
            rel = f"{shown}/{info.relative_to(prefix)}"
            found.add(parse_requirement(f"{canonical(m.group(1))}=={m.group(2)}", rel, None))
