"""manifest.json as input (`envbuilder diff`, `verify`, `sif`): read bounded, parsed depth-limited
and its shape checked (the parts envbuilder reads: image, expect, lock) before any field is used.
The writer is render/manifest.py; the format is in docs/architecture.md."""

from __future__ import annotations

from pathlib import Path

from .jsonfile import check_shape, loads_bounded, read_bounded

MAX_MANIFEST_BYTES = 16 * 1024 * 1024
MAX_MANIFEST_DEPTH = 32
MAX_MANIFEST_VALUES = 1_000_000
FIX = "give the output folder of `envbuilder build` (or re-run `envbuilder build --no-build SPEC` to rewrite it)"


def _text(what: str = "text") -> dict:
    return {"type": "string", "maxLength": 4096, "description": what}


def _opt(schema: dict) -> dict:
    return {**schema, "type": [schema["type"], "null"]} if isinstance(schema.get("type"), str) else schema


_STRMAP = {"type": "object", "additionalProperties": _text("a version"), "description": "an object of name: version"}
_STRLIST = {"type": "array", "items": _text(), "maxItems": 64, "description": "a list of names"}
MANIFEST_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "envbuilder manifest.json (the parts envbuilder reads)",
    "type": "object",
    "required": ["expect"],
    "properties": {
        "schema": _text("envbuilder.manifest/1"),
        "name": _text("the spec's name"),
        "image": {"type": "object", "properties": {
            "tag": _text("an image tag"), "base": _text("an image reference"),
            "runtime_base": _opt(_text("an image reference")), "os": _opt(_text("an OS name")),
            "arch": _text("an architecture")}, "description": "an object"},
        "expect": {"type": "object", "description": "an object", "properties": {
            "python": _opt(_text("a Python version")),
            "arch": {"type": "string", "enum": ["x86_64", "aarch64"], "description": "x86_64 or aarch64"},
            "framework": _opt({"type": "object", "description": "an object", "properties": {
                "name": _text("a framework name"), "module": _text("a module name"), "version": _text("a version"),
                "distribution": _text("a PyPI distribution name")}}),
            "horovod": _opt({"type": "object", "description": "an object", "properties": {
                "version": _text("a version"), "frameworks": _STRLIST, "controllers": _STRLIST,
                "operations": _STRLIST}}),
            "mpi": _opt({"type": "object", "description": "an object", "properties": {
                "flavor": _text("an MPI flavor"), "version": _text("a version")}}),
            "cuda": _opt(_text("a version")), "cudnn": _opt(_text("a version")), "nccl": _opt(_text("a version")),
            "cuda_runtime": _opt(_text("a version")),
            "gpu": {"type": "boolean", "description": "true or false"},
            "packages": _opt(_STRMAP), "apt": _opt(_STRMAP), "conda": _opt(_STRMAP),
            "cpu_env": _opt({"type": "object", "additionalProperties": _text("a value"),
                             "description": "an object of variable: value"}),
        }},
        "lock": {"type": "object", "description": "an object", "properties": {
            "base": {"type": "object", "additionalProperties": _text("a digest"), "description": "an object"}}},
    },
}


def parse_manifest(text: str, field: str, source: str | None = None) -> dict:
    data = loads_bounded(text, field, max_depth=MAX_MANIFEST_DEPTH, max_values=MAX_MANIFEST_VALUES, fix=FIX,
                         source=source)
    check_manifest(data, field, source)
    return data


def check_manifest(data, field: str, source: str | None = None) -> dict:
    if not isinstance(data, dict) or not isinstance(data.get("expect"), dict):
        from .errors import EnvbuilderError

        raise EnvbuilderError(field, f"{source or 'the file'} is not an envbuilder manifest (no 'expect' section)", FIX)
    check_shape(data, MANIFEST_SCHEMA, field, fix=FIX, source=source)
    return data


def read_manifest_file(path: str | Path, field: str) -> dict:
    text = read_bounded(path, field, MAX_MANIFEST_BYTES, FIX)
    return parse_manifest(text, field, str(path))
