"""The lock: every pin and every hash of one stack, as data, and its file format.

``envbuilder.lock`` is JSON written by ``dump`` (one entry per line, keys in a fixed order) so it
diffs well in review and the same lock always serialises to the same bytes. Sections:

- ``inputs``    what the spec asked, per kind (the key that says whether a lock matches a spec)
- ``base``      per stage: the image reference and its digest (registry digest or local image ID)
- ``apt``       per stage: every OS package installed, name, version, architecture, .deb sha256
- ``sources``   downloaded tarballs (Horovod sdist, MPI): url and sha256
- ``pip``       per install group (python, framework, horovod, packages): name, version, file, sha256
- ``conda``     the conda-lock lockfile (its own format) when the spec asks conda packages
- ``seals``     sha256 of every section: a hand edit that breaks consistency is named by section

``load`` refuses a corrupt or inconsistent file with one message naming the entry (exit 2).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import EnvbuilderError
from ..jsonfile import check_shape, loads_bounded, read_bounded
from ..quoting import IMAGE_REF_RE
from ..redact import credential_in, redact
from ..spec.schema import URL_RE
from .schema import LOCK_SCHEMA

SCHEMA = "envbuilder.lock/1"
LOCK_NAME = "envbuilder.lock"
# install order in the image. cuda: the NVIDIA wheels the framework depends on (they change least,
# so their layer comes before the framework's own code); toolkit: nvcc and headers for compiling
# Horovod's CUDA/NCCL code, devel stage only (removed before the runtime stage copies the venv);
# build: what compiling an sdist needs besides the venv (Cython for mpi4py's), installed into a
# folder of its own in the devel stage, never into the venv, so it may repeat a runtime group's entry.
PIP_GROUPS = ("python", "cuda", "framework", "mpi", "toolkit", "horovod", "packages", "build")
DEVEL_ONLY_GROUPS = ("toolkit", "build")
SEPARATE_GROUPS = ("build",)
# full-match patterns (re.fullmatch): a lock value never carries a newline into a recipe
SHA256_RE = re.compile(r"[0-9a-f]{64}")
DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}")
# a locked package's name and version (apt, pip, source tarballs, conda), as the lock records them
PACKAGE_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,127}")
PACKAGE_VERSION_RE = re.compile(r"[A-Za-z0-9.+!_:~-]{1,128}")
FILE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+%!-]{0,254}")
TIME_RE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]{2,20}(?:Z|[+-][0-9]{2}:[0-9]{2})?")
# bounds on a lock read (a GPU stack's lock is about 200 KB; conda adds a few hundred KB)
MAX_LOCK_BYTES = 16 * 1024 * 1024
MAX_LOCK_DEPTH = 32
MAX_LOCK_VALUES = 2_000_000
_FIX = ("re-create it with `envbuilder lock SPEC` (or restore it from version control); never edit "
        "envbuilder.lock by hand")


def canonical_name(name: str) -> str:
    """PEP 503 normalised project name: 'PyYAML' -> 'pyyaml', 'typing_extensions' -> 'typing-extensions'."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pip_by_name(groups: dict[str, list[dict]]) -> dict[str, dict]:
    """Canonical name -> entry over pip groups in install order: a later group's entry
    (``overrides``) stands in place of the earlier one it replaces, as in the image."""
    return {canonical_name(e["name"]): e for g in PIP_GROUPS if g not in DEVEL_ONLY_GROUPS
            for e in groups.get(g, [])}


def _sha(data) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


@dataclass
class Lock:
    name: str
    inputs: dict
    base: dict = field(default_factory=dict)          # stage -> {ref, digest, kind, pinned}
    apt: dict = field(default_factory=dict)           # stage -> [entries]
    sources: list = field(default_factory=list)       # [entries]
    pip: dict = field(default_factory=dict)           # group -> [entries]
    conda: dict | None = None                         # {"lockfile": {...}} or None
    resolved_at: str = ""
    resolvers: dict = field(default_factory=dict)
    generated_by: str = ""
    path: str | None = None                           # where it was read from (messages)

    # --- queries ---------------------------------------------------------------------------
    def pip_entries(self) -> list[dict]:
        """What the image ends with: one entry per package (see ``pip_by_name``)."""
        return list(pip_by_name(self.pip).values())

    def pip_versions(self) -> dict[str, str]:
        return {canonical_name(e["name"]): e["version"] for e in self.pip_entries()}

    def conda_packages(self) -> list[dict]:
        if not self.conda:
            return []
        return [p for p in self.conda["lockfile"].get("package", []) if p.get("manager", "conda") == "conda"]

    def sections(self) -> dict:
        """Every section with its entries, in file order (what the seals cover)."""
        out = {"inputs": self.inputs}
        for stage in sorted(self.base):
            out[f"base.{stage}"] = self.base[stage]
        for stage in sorted(self.apt):
            out[f"apt.{stage}"] = self.apt[stage]
        out["sources"] = self.sources
        for group in PIP_GROUPS:
            if group in self.pip:
                out[f"pip.{group}"] = self.pip[group]
        if self.conda is not None:
            out["conda"] = self.conda
        return out

    def seals(self) -> dict[str, str]:
        return {k: _sha(v) for k, v in self.sections().items()}

    def sha256(self) -> str:
        return hashlib.sha256(dump(self).encode()).hexdigest()

    def flat(self) -> dict[str, str]:
        """Every pinned thing as 'kind:name' -> 'version (hash)': what `envbuilder diff` compares."""
        out = {}
        for stage, b in sorted(self.base.items()):
            out[f"base:{stage}"] = f"{b['ref']}@{b['digest']}"
        for stage, entries in sorted(self.apt.items()):
            for e in entries:
                out[f"apt.{stage}:{e['name']}"] = e["version"]
        for e in self.sources:
            out[f"source:{e['name']}"] = f"{e['version']} sha256:{e['sha256'][:12]}"
        for e in self.pip_entries():
            out[f"pip:{canonical_name(e['name'])}"] = e["version"]
        for p in self.conda_packages():
            out[f"conda:{p['name']}"] = p["version"]
        return out


# --- file format ----------------------------------------------------------------------------

def _line(obj) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(", ", ": "))


def _list_block(entries: list, indent: str) -> str:
    if not entries:
        return "[]"
    return "[\n" + ",\n".join(indent + "  " + _line(e) for e in entries) + "\n" + indent + "]"


def dump(lock: Lock) -> str:
    """The lock as text: stable key order, one entry per line, newline at the end."""
    parts = [
        ("schema", _line(SCHEMA)),
        ("name", _line(lock.name)),
        ("generated_by", _line(lock.generated_by)),
        ("resolved_at", _line(lock.resolved_at)),
        ("resolvers", _line(dict(sorted(lock.resolvers.items())))),
        ("inputs", json.dumps(lock.inputs, indent=2, sort_keys=True).replace("\n", "\n  ")),
        ("base", "{\n" + ",\n".join(f"    {_line(s)}: {_line(lock.base[s])}" for s in sorted(lock.base))
         + "\n  }" if lock.base else "{}"),
        ("apt", "{\n" + ",\n".join(f"    {_line(s)}: {_list_block(lock.apt[s], '    ')}" for s in sorted(lock.apt))
         + "\n  }" if lock.apt else "{}"),
        ("sources", _list_block(lock.sources, "  ")),
        ("pip", "{\n" + ",\n".join(f"    {_line(g)}: {_list_block(lock.pip[g], '    ')}"
                                   for g in PIP_GROUPS if g in lock.pip) + "\n  }" if lock.pip else "{}"),
        ("conda", json.dumps(lock.conda, indent=2, sort_keys=True).replace("\n", "\n  ")),
        ("seals", json.dumps(lock.seals(), indent=2, sort_keys=True).replace("\n", "\n  ")),
    ]
    return "{\n" + ",\n".join(f"  {_line(k)}: {v}" for k, v in parts) + "\n}\n"


class LockError(EnvbuilderError):
    """A lock file that cannot be used: corrupt, inconsistent, or for another spec (exit 2)."""


def _err(path: str | None, entry: str, reason: str, fix: str = "") -> LockError:
    return LockError(entry, reason, fix or _FIX, source=path)


def loads(text: str, path: str | None = None) -> Lock:
    """A lock from its text: bounded size and nesting, then its whole shape (lock/schema.py), then the
    consistency of every entry, then the seals. One LockError naming the place otherwise."""
    if len(text) > MAX_LOCK_BYTES:
        raise _err(path, "envbuilder.lock", f"is {len(text)} bytes, more than a lock can be "
                   f"({MAX_LOCK_BYTES // (1024 * 1024)} MiB)")
    try:
        data = loads_bounded(text, "envbuilder.lock", max_depth=MAX_LOCK_DEPTH, max_values=MAX_LOCK_VALUES,
                             fix=_FIX, source=path)
    except EnvbuilderError as exc:
        raise LockError(exc.field, exc.reason, exc.fix, source=path) from None
    return from_data(data, path)


def from_data(data, path: str | None = None) -> Lock:
    """A lock from parsed JSON (``loads`` and `envbuilder diff`)."""
    if not isinstance(data, dict):
        raise _err(path, "envbuilder.lock", "is not a JSON object")
    if data.get("schema") != SCHEMA:
        shown_schema = data.get("schema") if isinstance(data.get("schema"), str) else type(data.get("schema")).__name__
        raise _err(path, "schema", f"is {str(shown_schema)[:60]!r}, this envbuilder reads {SCHEMA!r}",
                   "re-create it with `envbuilder lock SPEC`")
    try:
        check_shape(data, LOCK_SCHEMA, "envbuilder.lock", fix=_FIX, source=path)
    except EnvbuilderError as exc:
        raise LockError(exc.field, exc.reason, exc.fix, source=path) from None
    lock = Lock(name=data["name"], inputs=data["inputs"], base=data["base"], apt=data["apt"],
                sources=data["sources"], pip=data["pip"], conda=data.get("conda"),
                resolved_at=data["resolved_at"], resolvers=data["resolvers"],
                generated_by=data.get("generated_by", ""), path=path)
    check_entries(lock)
    # seals last: a consistency problem above names the entry; this names the section
    want = data["seals"]
    have = lock.seals()
    for section in sorted(set(want) | set(have)):
        if want.get(section) != have.get(section):
            what = "is missing" if section not in have else "was changed by hand or corrupted"
            if section not in want:
                what = "has no seal (added by hand?)"
            raise _err(path, section, f"{what}: its content does not match the lock's seal",
                       "restore envbuilder.lock from version control, or re-resolve with "
                       "`envbuilder lock SPEC --update NAME`")
    return lock


def load(path: str | Path) -> Lock:
    path = Path(path)
    try:
        text = read_bounded(path, "envbuilder.lock", MAX_LOCK_BYTES, _FIX)
    except EnvbuilderError as exc:
        raise LockError(exc.field, exc.reason, exc.fix, source=str(path)) from None
    return loads(text, str(path))


# --- consistency of single entries ----------------------------------------------------------

_WHEEL_RE = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+)(-\d[^-]*)?-[^-]+-[^-]+-[^-]+\.whl$")
_SDIST_RE = re.compile(r"^(?P<name>.+)-(?P<version>[^-]+)\.(tar\.gz|zip|tar\.bz2)$")


def file_version(filename: str) -> tuple[str, str] | None:
    """(name, version) from a wheel or sdist file name (URL-quoted '+' allowed)."""
    filename = filename.replace("%2B", "+").replace("%2b", "+")
    m = _WHEEL_RE.match(filename) or _SDIST_RE.match(filename)
    return (m.group("name"), m.group("version")) if m else None


def check_entries(lock: Lock) -> None:
    """Every entry complete and self-consistent; raises LockError naming the first bad entry."""
    p = lock.path
    for stage, b in lock.base.items():
        where = f"base.{stage}"
        if not isinstance(b, dict) or not isinstance(b.get("ref"), str) or not isinstance(b.get("digest"), str):
            raise _err(p, where, "needs ref and digest")
        if not DIGEST_RE.fullmatch(b["digest"]):
            raise _err(p, where, f"digest {b['digest']!r} is not sha256:<64 hex digits>")
        if not IMAGE_REF_RE.fullmatch(b["ref"]) or not IMAGE_REF_RE.fullmatch(str(b.get("pinned", b["ref"]))):
            raise _err(p, where, f"reference {b['ref'][:80]!r} is not an image reference")
        pinned_digest = b.get("manifest_digest") or b["digest"]
        if b.get("manifest_digest") is not None and not DIGEST_RE.fullmatch(str(b["manifest_digest"])):
            raise _err(p, where, f"manifest_digest {b['manifest_digest']!r} is not sha256:<64 hex digits>")
        if b.get("kind") == "repo-digest" and b.get("pinned") != f"{b['ref'].split('@')[0]}@{pinned_digest}":
            raise _err(p, where, f"pinned reference {b.get('pinned')!r} does not carry its digest {pinned_digest}")
    for stage, entries in lock.apt.items():
        if not isinstance(entries, list):
            raise _err(p, f"apt.{stage}", "is not a list")
        seen = set()
        for e in entries:
            if not isinstance(e, dict) or not PACKAGE_NAME_RE.fullmatch(str(e.get("name", ""))) \
                    or not PACKAGE_VERSION_RE.fullmatch(str(e.get("version", ""))):
                raise _err(p, f"apt.{stage}", f"entry {e!r} needs a package name and a version")
            where = f"apt.{stage}: {e['name']}"
            if e["name"] in seen:
                raise _err(p, where, "is listed twice")
            seen.add(e["name"])
            if e.get("sha256") is not None and not SHA256_RE.fullmatch(str(e["sha256"])):
                raise _err(p, where, f"sha256 {e['sha256']!r} is not 64 hex digits")
    for e in lock.sources:
        if not isinstance(e, dict) or not PACKAGE_NAME_RE.fullmatch(str(e.get("name", ""))):
            raise _err(p, "sources", f"entry {str(e)[:80]!r} has no valid name")
        where = f"sources: {e['name']}"
        if not URL_RE.fullmatch(str(e.get("url", ""))) or not FILE_RE.fullmatch(str(e.get("file", ""))):
            raise _err(p, where, f"url {str(e.get('url'))[:80]!r} or file is not a plain https URL / file name")
        if not SHA256_RE.fullmatch(str(e.get("sha256", ""))):
            raise _err(p, where, f"sha256 {e.get('sha256')!r} is not 64 hex digits")
        if not str(e.get("url", "")).endswith(str(e.get("file", "\0"))):
            raise _err(p, where, f"url {e.get('url')!r} does not end in its file {e.get('file')!r}")
        if str(e.get("version", "\0")) not in str(e.get("file", "")):
            raise _err(p, where, f"version {e.get('version')!r} does not match its file {e.get('file')!r}")
    seen = {}
    for group in lock.pip:
        if group not in PIP_GROUPS:
            raise _err(p, f"pip.{group}", f"is not an install group ({', '.join(PIP_GROUPS)})")
        if not isinstance(lock.pip[group], list):
            raise _err(p, f"pip.{group}", "is not a list")
        for e in lock.pip[group]:
            if not isinstance(e, dict) or not PACKAGE_NAME_RE.fullmatch(str(e.get("name", ""))):
                raise _err(p, f"pip.{group}", f"entry {e!r} has no valid name")
            where = f"pip.{group}: {e['name']}"
            key = canonical_name(e["name"])
            if group not in SEPARATE_GROUPS:    # one in its own install folder repeats the others freely
                if key in seen and (PIP_GROUPS.index(group) <= PIP_GROUPS.index(seen[key][0])
                                    or e.get("overrides") != seen[key][1]):
                    raise _err(p, where, f"is listed twice (also in pip.{seen[key][0]}); a later group may "
                               f"install it again only with \"overrides\": \"{seen[key][1]}\"")
                if key not in seen and e.get("overrides") is not None:
                    raise _err(p, where, f"overrides {e['overrides']} but no earlier group lists it")
                seen[key] = (group, e.get("version"))
            if not PACKAGE_VERSION_RE.fullmatch(str(e.get("version", ""))):
                raise _err(p, where, f"version {str(e.get('version'))[:80]!r} is not a version")
            if not FILE_RE.fullmatch(str(e.get("file", ""))):
                raise _err(p, where, f"file {str(e.get('file'))[:80]!r} is not a file name")
            if not SHA256_RE.fullmatch(str(e.get("sha256", ""))):
                raise _err(p, where, f"sha256 {e.get('sha256')!r} is not 64 hex digits")
            parsed = file_version(str(e.get("file", "")))
            if not parsed:
                raise _err(p, where, f"file {e.get('file')!r} is not a wheel or sdist name")
            fname, fversion = parsed
            if canonical_name(fname) != key or fversion != e["version"]:
                raise _err(p, where, f"version {e['version']} does not match its file {e['file']} "
                           "(edited by hand?)")
    for pkg in lock.conda_packages():
        where = f"conda: {pkg.get('name')}"
        h = pkg.get("hash") or {}
        if not SHA256_RE.fullmatch(str(h.get("sha256", ""))):
            raise _err(p, where, "has no sha256 (conda-lock records md5 and sha256 for every package)")
        url = str(pkg.get("url", ""))
        if credential_in(url):         # a channel's token or login: the export and the build would repeat it
            raise _err(p, where, f"url {redact(url)[:200]} holds {credential_in(url)}: a lock never keeps one "
                       "(lock again from a channel named without it)")
        if f"-{pkg.get('version')}-" not in url.rsplit("/", 1)[-1]:
            raise _err(p, where, f"version {pkg.get('version')} does not match its url {url}")
        fname = url.rsplit("/", 1)[-1]
        if not FILE_RE.fullmatch(fname) or not fname.endswith((".conda", ".tar.bz2")) \
                or not url.startswith(("https://", "http://", "file:///")):
            raise _err(p, where, f"url {url[:200]} is not a conda package file (NAME-VERSION-BUILD.conda or .tar.bz2 "
                       "at an http(s):// or file:/// channel)")
