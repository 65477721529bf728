"""The shape of envbuilder.lock, as data: a JSON Schema (Draft 2020-12) written from what the lock
writer produces (model.dump of what resolve.py, base.py, apt.py, sources.py, pip.py and conda.py
return). ``model.loads`` checks a lock's whole shape against it before any field is used; every
``pattern`` is a full match (jsonfile.check_shape). A new field in the writer is a new line here
(tests/test_lock_inputs.py checks a freshly written lock against it).
"""

from __future__ import annotations

from ..quoting import IMAGE_REF_RE
from ..spec.schema import URL_RE

SHA256 = r"[0-9a-f]{64}"
NAME = r"[A-Za-z0-9][A-Za-z0-9._+-]{0,127}"
VERSION = r"[A-Za-z0-9.+!_:~-]{1,128}"
FILE = r"[A-Za-z0-9][A-Za-z0-9._+%!-]{0,254}"
TIME = r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]{2,20}(?:Z|[+-][0-9]{2}:[0-9]{2})?"
MAX_ENTRIES = 100_000


def _text(n: int = 200) -> dict:
    return {"type": "string", "pattern": f"[^\\x00-\\x1f\\x7f-\\x9f\\u2028\\u2029]{{0,{n}}}", "description": f"one line of text (at most {n} characters)"}


def _s(pattern: str, what: str) -> dict:
    return {"type": "string", "pattern": pattern, "description": what}


def _obj(props: dict, required=(), extra=False) -> dict:
    return {"type": "object", "properties": props, "required": list(required), "additionalProperties": extra}


def _list(items: dict) -> dict:
    return {"type": "array", "items": items, "maxItems": MAX_ENTRIES}


def _map(keys: str, values: dict, what: str = "a name") -> dict:
    return {"type": "object", "propertyNames": _s(keys, what), "additionalProperties": values,
            "maxProperties": MAX_ENTRIES}


STAGE = r"devel|runtime"
GROUP = r"python|cuda|framework|mpi|toolkit|horovod|packages|build"     # lock/model.py PIP_GROUPS
IMAGE_REF = _s(IMAGE_REF_RE.pattern, "an image reference (registry/name:tag)")
DIGEST = _s(r"sha256:" + SHA256, "sha256:<64 hex digits>")
NAME_S = _s(NAME, "a package name")
VERSION_S = _s(VERSION, "a version")
SHA_S = _s(SHA256, "64 hex digits")
URL_S = _s(URL_RE.pattern, "a plain https URL")
ANY_URL = _s(r"(?:https?|file)://[^\s\x00-\x1f\x7f-\x9f\"'\\]{1,2048}", "an http(s):// or file:// URL")

INPUTS = _obj({
    "base": _map(STAGE, IMAGE_REF, "devel or runtime"),
    "apt": _map(STAGE, _list(_s(r"[A-Za-z0-9][A-Za-z0-9._+:=~-]{0,200}", "an OS package (name or name=version)")),
                "devel or runtime"),
    "sources": _map(NAME, VERSION_S, "a source tarball's name"),
    "pip": _obj({
        "groups": _map(GROUP, _list(_text(512)), "a pip install group"),
        "python": _s(r"[0-9]+\.[0-9]+", "a Python version (3.11)"),
        "glibc": _s(r"[0-9]+\.[0-9]+", "a glibc version (2.36)"),
        "extra_index_urls": _list(URL_S),
        "in_image": {"type": "boolean", "description": "true or false"},
        "machine": _s(r"[a-z0-9_]{1,32}", "a machine name (aarch64)"),
        "constraint": _text(1024),
    }, required=("groups", "python", "glibc", "extra_index_urls", "in_image")),
    "conda": {"type": ["object", "null"], "properties": {
        "packages": _list(_text(512)), "channels": _list(_text(1024)), "platform": _text(64)},
        "required": ["packages"], "additionalProperties": False},
}, required=("base", "apt", "sources", "pip", "conda"))

BASE_ENTRY = _obj({"ref": IMAGE_REF, "digest": DIGEST, "pinned": IMAGE_REF,
                   "kind": {"enum": ["repo-digest", "image-id"], "description": "repo-digest or image-id"},
                   # a multi-arch base: `digest` is the index's, this the spec's platform's manifest
                   "manifest_digest": DIGEST,
                   "platform": _s(r"[a-z0-9]{1,16}/[a-z0-9]{1,16}(/[a-z0-9]{1,8})?", "os/arch: the catalog's Docker platform of the spec's arch")},
                  required=("ref", "digest", "kind", "pinned"))
APT_ENTRY = _obj({"name": NAME_S, "version": VERSION_S, "arch": _s(r"[a-z0-9-]{1,32}", "a Debian architecture"),
                  "sha256": {"type": ["string", "null"], "pattern": SHA256, "description": "64 hex digits or null"},
                  "in_base": {"type": "boolean", "description": "true or false"}},
                 required=("name", "version"))
SOURCE_ENTRY = _obj({"name": NAME_S, "version": VERSION_S, "url": URL_S, "file": _s(FILE, "a file name"),
                     "sha256": SHA_S, "checked": _text(300)},
                    required=("name", "version", "url", "file", "sha256"))
PIP_ENTRY = _obj({"name": NAME_S, "version": VERSION_S, "file": _s(FILE, "a wheel or sdist file name"),
                  "sha256": SHA_S, "from": {"enum": ["index", "wheelhouse"], "description": "index or wheelhouse"},
                  "url": ANY_URL, "requested": {"type": "boolean", "description": "true or false"},
                  "overrides": VERSION_S},
                 required=("name", "version", "file", "sha256"))
CONDA_PACKAGE = {"type": "object", "required": ["name", "version", "url", "hash"], "properties": {
    "name": NAME_S, "version": VERSION_S, "url": ANY_URL, "manager": _text(32), "platform": _text(32),
    "hash": _obj({"sha256": SHA_S, "md5": _s(r"[0-9a-f]{32}", "32 hex digits")}, required=("sha256",)),
    "dependencies": _map(r"[^\x00-\x1f\x7f-\x9f\u2028\u2029]{1,200}", _text(512), "a package name"),
    "category": _text(64), "optional": {"type": "boolean", "description": "true or false"},
}}     # conda-lock's own format: further keys are its own
CONDA = {"type": ["object", "null"], "required": ["lockfile"], "additionalProperties": False, "properties": {
    "lockfile": _obj({"version": {"const": 1, "description": "1 (conda-lock's format v1)"},
                      "metadata": {"type": "object", "description": "conda-lock's metadata"},
                      "package": _list(CONDA_PACKAGE)}, required=("version", "package")),
    "from": _text(300)}}
NOTE = {"type": ["string", "null", "object"], "pattern": r"[^\x00-\x1f\x7f-\x9f\u2028\u2029]{0,200}",
        "propertyNames": _s(r"[^\x00-\x1f\x7f-\x9f\u2028\u2029]{1,200}", "one line of text"),
        "additionalProperties": {"type": ["string", "null"], "pattern": r"[^\x00-\x1f\x7f-\x9f\u2028\u2029]{0,200}",
                                 "description": "one line of text (at most 200 characters)"},
        "description": "one line of text (at most 200 characters), or an object of them"}

LOCK_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "envbuilder.lock",
    **_obj({
        "schema": {"const": "envbuilder.lock/1", "description": "envbuilder.lock/1"},
        "name": _s(NAME, "a spec name"),
        "generated_by": _text(),
        "resolved_at": _s(TIME, "a time (YYYY-MM-DDTHH:MM:SSZ)"),
        "resolvers": _map(r"[^\x00-\x1f\x7f-\x9f\u2028\u2029]{1,200}", NOTE, "one line of text"),
        "inputs": INPUTS,
        "base": _map(STAGE, BASE_ENTRY, "devel or runtime"),
        "apt": _map(STAGE, _list(APT_ENTRY), "devel or runtime"),
        "sources": _list(SOURCE_ENTRY),
        "pip": _map(GROUP, _list(PIP_ENTRY), "a pip install group (python, cuda, framework, mpi, toolkit, horovod, packages, build)"),
        "conda": CONDA,
        "seals": _map(r"[a-z]+(?:\.[a-z]+)?", SHA_S, "a section name"),
    }, required=("schema", "name", "resolved_at", "resolvers", "inputs", "base", "apt", "sources", "pip", "seals")),
}
