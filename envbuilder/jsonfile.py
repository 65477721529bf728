"""JSON that a user hands in (a lock, a manifest): read bounded, parsed depth-limited, its shape
checked against a schema before any field is used. One message (exit 2) for whatever is wrong.

- size: at most MAX_BYTES are read (the message names the cap); a bigger file is refused unread
- nesting and count: a scan of the text (strings skipped) refuses more than ``max_depth`` levels
  or ``max_values`` values before json.loads builds anything (a deep document would overflow
  the stack; a huge flat one, the memory)
- shape: ``check_shape`` validates against a JSON Schema (jsonschema, Draft 2020-12), with
  ``pattern`` matched as a full match (as every pattern in envbuilder is: re.fullmatch)

Imports only errors.py and redact.py (for lock/, verify/, diff alike).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from .errors import EnvbuilderError
from .redact import redact

_TOKENS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{},]')


def _fail(field: str, reason: str, fix: str, source: str | None) -> EnvbuilderError:
    return EnvbuilderError(field, reason, fix, source=None if source == field else source)


def read_bounded(path: str | Path, field: str, max_bytes: int, fix: str) -> str:
    """The file's text: at most MAX_BYTES, UTF-8; else one message naming FIELD."""
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            raw = fh.read(max_bytes + 1)
    except IsADirectoryError:
        raise _fail(field, f"{path} is a folder, not a file", fix, None) from None
    except OSError as exc:
        raise _fail(field, f"cannot read {path}: {exc.strerror or exc}", fix, None) from None
    if len(raw) > max_bytes:
        raise _fail(field, f"{path} is more than {max_bytes} bytes, the most this file can be "
                    f"({max_bytes // (1024 * 1024)} MiB)", fix, str(path))
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _fail(field, f"{path} is not UTF-8 text (byte {exc.start}): a binary or corrupt file",
                    fix, str(path)) from None


def loads_bounded(text: str, field: str, *, max_depth: int, max_values: int, fix: str,
                  source: str | None = None):
    """json.loads, after a linear scan has bounded nesting and size; one message on any problem."""
    depth = values = 0
    for m in _TOKENS.finditer(text):
        c = m.group(0)
        values += 1
        if values > max_values:
            raise _fail(field, f"holds more than {max_values} values, more than this file can hold", fix, source)
        if c in "[{":
            depth += 1
            if depth > max_depth:
                raise _fail(field, f"is nested more than {max_depth} levels deep; the file is corrupt",
                            fix, source)
        elif c in "]}":
            depth -= 1
    try:
        return json.loads(text, parse_constant=_no_constant)
    except RecursionError:          # pragma: no cover - the scan above stops it first
        raise _fail(field, "is nested too deeply; the file is corrupt", fix, source) from None
    except ValueError as exc:
        raise _fail(field, f"is not valid JSON (line {getattr(exc, 'lineno', '?')}: "
                    f"{getattr(exc, 'msg', str(exc))[:120]}); the file is corrupt or truncated", fix, source) from None


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON value")


# --- shape -------------------------------------------------------------------------------------

def _validator(schema: dict):
    from jsonschema import Draft202012Validator, validators
    from jsonschema.exceptions import ValidationError

    def full_pattern(validator, pattern, instance, schema_):
        if isinstance(instance, str) and not re.fullmatch(pattern, instance):
            yield ValidationError(f"does not match {pattern!r}")

    cls = validators.extend(Draft202012Validator, {"pattern": full_pattern})
    return cls(schema)


_VALIDATORS: dict[int, object] = {}
_TYPE_WORDS = {"string": "text", "object": "an object", "array": "a list", "integer": "a whole number",
               "number": "a number", "boolean": "true or false", "null": "null"}


def _json_type(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, (int, float)):
        return f"the number {value!r}"[:60]
    if isinstance(value, str):
        text = redact(value)
        return repr(text if len(text) <= 60 else text[:60] + "...")
    return {dict: "an object", list: "a list"}.get(type(value), type(value).__name__)


def place(path) -> str:
    """A JSON path as a dotted field: pip.packages[3].name."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            part = redact(str(part))
            part = part if len(part) <= 60 and part.isprintable() else repr(part[:60])
            out += f".{part}" if out else part
    return out


def check_shape(data, schema: dict, root: str, *, fix: str, source: str | None = None) -> None:
    """Refuse DATA unless it has SCHEMA's shape: one message naming the first wrong place
    (ROOT.path) with what is there and what belongs there (the schema's ``description``)."""
    validator = _VALIDATORS.get(id(schema))
    if validator is None:
        validator = _VALIDATORS[id(schema)] = _validator(schema)
    errors = sorted(validator.iter_errors(data), key=lambda e: (len(e.absolute_path), [str(p) for p in e.absolute_path]))
    if not errors:
        return
    e = errors[0]
    where = place(e.absolute_path) or root
    want = e.schema.get("description") if isinstance(e.schema, dict) else None
    if e.validator == "required":
        missing = [k for k in e.validator_value if k not in e.instance]
        reason = f"has no {missing[0]!r}" if missing else "misses a key"
        want = None
    elif e.validator in ("additionalProperties", "unevaluatedProperties"):
        extra = [k for k in e.instance if k not in (e.schema.get("properties") or {})]
        reason = f"has a key {place([extra[0]]) if extra else '?'} that no lock/manifest holds"
        want = None
    elif e.validator == "propertyNames":
        reason = "has a key that is not allowed here"
    elif e.validator in ("maxItems", "maxProperties"):
        reason = f"has more than {e.validator_value} entries"
    elif e.validator == "maxLength":
        reason = f"is longer than {e.validator_value} characters"
    elif e.validator == "type":
        expected = e.validator_value if isinstance(e.validator_value, list) else [e.validator_value]
        reason = f"is {_json_type(e.instance)}, not " + " or ".join(_TYPE_WORDS.get(t, t) for t in expected)
    else:
        reason = f"is {_json_type(e.instance)}"
    if want:
        reason += f"; it must be {want}"
    raise EnvbuilderError(where, reason, fix, source=None if source == where else source)
