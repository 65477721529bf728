"""A statement or bundle handed in is untrusted until its signature checked: read at most
MAX_BYTES (a 1 GB file is refused after reading MAX_BYTES + 1), parsed depth- and count-bounded
(jsonfile.py), its shape checked before any field is used."""

from __future__ import annotations

from pathlib import Path

from ..errors import EnvbuilderError
from ..jsonfile import check_shape, loads_bounded, read_bounded
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
        "stack": {"type": "object", "required": ["id"], "properties": {"id": {"type": "string"}}},
    },
}


def read_text(path: str | Path, field: str = "--attestation") -> str:
    p = Path(path)
    if not p.exists():
        raise EnvbuilderError(field, f"no attestation: {path} does not exist",
                              "run `envbuilder verify ... --attest FILE` on a passing image, then "
                              "`envbuilder attest sign`")
    if not p.is_file():
        raise EnvbuilderError(field, f"{path} is not a plain file", FIX)
    return read_bounded(p, field, MAX_BYTES, FIX)


def parse(text: str, field: str = "--attestation", source: str | None = None) -> dict:
    data = loads_bounded(text, field, max_depth=16, max_values=200_000, fix=FIX, source=source)
    check_shape(data, SHAPE, field, fix=FIX, source=source)
    if data["predicateType"] == VERIFY_PREDICATE:
        check_shape(data["predicate"], PREDICATE_SHAPE, "predicate", fix=FIX, source=source)
    return data


def load(path: str | Path, field: str = "--attestation") -> tuple[str, dict]:
    text = read_text(path, field)
    return text, parse(text, field, str(path))
