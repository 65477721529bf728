"""Read a YAML spec into plain Python data, remembering the line of every value.

The line map lets every later error point at the place in the user's file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ..errors import EnvbuilderError


@dataclass
class SourceDoc:
    data: object
    path: str
    lines: dict[str, int] = field(default_factory=dict)
    raw: dict[str, str] = field(default_factory=dict)   # scalar text as written

    def line_of(self, dotted: str) -> int | None:
        """Line of a field, or of its nearest enclosing field that has one."""
        probe = dotted
        while probe:
            if probe in self.lines:
                return self.lines[probe]
            if "[" in probe and probe.endswith("]"):
                probe = probe[: probe.rindex("[")]
            elif "." in probe:
                probe = probe.rsplit(".", 1)[0]
            else:
                break
        return None


# Bounds: a spec is a page of settings. Aliases are expanded as the tree is walked, so their
# total is bounded too (an "alias bomb" of a few hundred bytes would otherwise expand to
# billions of values).
MAX_BYTES = 1_000_000
MAX_DEPTH = 50
MAX_VALUES = 100_000
MAX_NUMBER_DIGITS = 100
_T = "tag:yaml.org,2002:"
_SCALAR_TAGS = {_T + "str", _T + "int", _T + "float", _T + "bool", _T + "null", _T + "timestamp"}


class _Walk:
    def __init__(self, source: str):
        self.source = source
        self.count = 0
        self.resolver = yaml.SafeLoader("")
        self.lines: dict[str, int] = {}
        self.raw: dict[str, str] = {}

    def refuse(self, node, field: str, reason: str, fix: str):
        raise EnvbuilderError(field or "spec", reason, fix, line=node.start_mark.line + 1, source=self.source)

    def scalar(self, node: yaml.ScalarNode, path: str):
        plain = node.style is None
        expected = self.resolver.resolve(yaml.ScalarNode, node.value, (True, False)) if plain else _T + "str"
        if node.tag == _T + "merge":
            self.refuse(node, path, "merge keys (<<) are not supported",
                        "write the keys out in full (anchors and aliases of whole values are fine)")
        if node.tag != expected or node.tag not in _SCALAR_TAGS:
            self.refuse(node, path, f"YAML tag {node.tag.replace(_T, '!!')} is not supported here",
                        "write the plain value (quote text: \"...\"), without a !tag")
        if node.tag == _T + "timestamp":
            return node.value                     # a date as written: text, not a datetime
        if node.tag in (_T + "int", _T + "float") and len(node.value) > MAX_NUMBER_DIGITS:
            self.refuse(node, path, f"a number of {len(node.value)} characters",
                        f"write a number of at most {MAX_NUMBER_DIGITS} digits")
        try:
            return self.resolver.construct_object(node, deep=True)
        except (ValueError, yaml.YAMLError) as exc:   # pragma: no cover - resolver said it fits
            self.refuse(node, path, f"cannot read this value: {str(exc)[:80]}", "quote it as text")

    def walk(self, node, path: str, depth: int):
        self.count += 1
        if self.count > MAX_VALUES:
            self.refuse(node, path, f"expands to more than {MAX_VALUES} values (YAML aliases?)",
                        "write a spec without aliases that repeat large parts")
        if depth > MAX_DEPTH:
            self.refuse(node, path, f"is nested more than {MAX_DEPTH} levels deep (or an alias refers to "
                        "itself)", "flatten the structure; a spec is a few levels deep")
        self.lines.setdefault(path, node.start_mark.line + 1)
        if isinstance(node, yaml.MappingNode):
            if node.tag != _T + "map":
                self.refuse(node, path, f"YAML tag {node.tag.replace(_T, '!!')} is not supported here",
                            "write a plain mapping, without a !tag")
            out: dict = {}
            for key_node, value_node in node.value:
                if not isinstance(key_node, yaml.ScalarNode):
                    raise EnvbuilderError(path or "spec", "a key must be a plain word",
                                          "write `key: value`", line=key_node.start_mark.line + 1,
                                          source=self.source)
                key = str(self.scalar(key_node, path))
                child = f"{path}.{key}" if path else key
                if key in out:
                    raise EnvbuilderError(child[:120], "this key appears twice",
                                          "keep one of the two entries",
                                          line=key_node.start_mark.line + 1, source=self.source)
                self.lines[child] = key_node.start_mark.line + 1
                out[key] = self.walk(value_node, child, depth + 1)
            return out
        if isinstance(node, yaml.SequenceNode):
            if node.tag != _T + "seq":
                self.refuse(node, path, f"YAML tag {node.tag.replace(_T, '!!')} is not supported here",
                            "write a plain list, without a !tag")
            return [self.walk(item, f"{path}[{i}]", depth + 1) for i, item in enumerate(node.value)]
        self.raw[path] = node.value
        return self.scalar(node, path)


def _prescan(text: str, source: str) -> None:
    """Depth and size from the event stream (the parser is iterative; composing a deeply nested
    document is recursive and would overflow the stack)."""
    depth = events = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        events += 1
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > MAX_DEPTH:
                raise EnvbuilderError("spec", f"is nested more than {MAX_DEPTH} levels deep",
                                      "flatten the structure; a spec is a few levels deep",
                                      line=event.start_mark.line + 1, source=source)
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1
        if events > MAX_VALUES:
            raise EnvbuilderError("spec", f"holds more than {MAX_VALUES} values",
                                  "a spec is a page of settings", source=source)


def parse_yaml_text(text: str, source: str) -> SourceDoc:
    if len(text) > MAX_BYTES:
        raise EnvbuilderError("spec", f"is {len(text)} characters long, more than a spec can be "
                              f"({MAX_BYTES})", "give the path of a YAML spec", source=source)
    loader = None
    try:
        _prescan(text, source)
        loader = yaml.SafeLoader(text)
        root = loader.get_single_node()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        problem = (exc.problem or "invalid YAML").strip()
        raise EnvbuilderError("spec", f"YAML syntax error: {problem}",
                              "check indentation, colons and quotes on that line",
                              line=line, source=source) from None
    except yaml.YAMLError as exc:
        raise EnvbuilderError("spec", f"YAML syntax error: {str(exc)[:200]}", "fix the YAML syntax",
                              source=source) from None
    finally:
        if loader is not None:
            loader.dispose()
    if root is None:
        raise EnvbuilderError("spec", "the file is empty",
                              "start from a recipe: `envbuilder presets` lists them", source=source)
    walker = _Walk(source)
    data = walker.walk(root, "", 0)
    return SourceDoc(data=data, path=source, lines=walker.lines, raw=walker.raw)


def read_spec_file(path: str | Path) -> SourceDoc:
    p = Path(path)
    shown = str(path)
    if not p.exists():
        raise EnvbuilderError("spec", f"no such file: {shown}",
                              "give the path of a YAML spec (recipes/ holds examples)")
    if p.is_dir():
        raise EnvbuilderError("spec", f"{shown} is a folder, not a spec file",
                              "give the path of a YAML spec file")
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise EnvbuilderError("spec", f"cannot read {shown}: {exc.strerror}",
                              "check the file's permissions") from None
    if b"\x00" in raw:
        raise EnvbuilderError("spec", f"{shown} is a binary file, not YAML",
                              "give the path of a YAML spec file", source=shown)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise EnvbuilderError("spec", f"{shown} is not UTF-8 text (byte {exc.start})",
                              "save the spec as UTF-8", source=shown) from None
    if len(raw) > MAX_BYTES:
        raise EnvbuilderError("spec", f"{shown} is {len(raw)} bytes, more than a spec can be ({MAX_BYTES})",
                              "give the path of a YAML spec file", source=shown)
    if not text.strip():
        raise EnvbuilderError("spec", "the file is empty",
                              "start from a recipe: `envbuilder presets` lists them", source=shown)
    return parse_yaml_text(text, shown)
