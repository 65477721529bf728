"""Read a YAML spec into plain Python data, remembering the line of every value.

The line map lets every later error point at the place in the user's file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from .errors import EnvbuilderError


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


def _scalar(node: yaml.ScalarNode, loader: yaml.SafeLoader):
    return loader.construct_object(node, deep=True)


def _walk(node, loader, path: str, lines: dict[str, int], source: str, raw: dict[str, str]):
    lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        out: dict = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise EnvbuilderError(path or "spec", "a key must be a plain word",
                                      "write `key: value`", line=key_node.start_mark.line + 1,
                                      source=source)
            key = str(_scalar(key_node, loader))
            child = f"{path}.{key}" if path else key
            if key in out:
                raise EnvbuilderError(child, "this key appears twice",
                                      "keep one of the two entries",
                                      line=key_node.start_mark.line + 1, source=source)
            lines[child] = key_node.start_mark.line + 1
            out[key] = _walk(value_node, loader, child, lines, source, raw)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_walk(item, loader, f"{path}[{i}]", lines, source, raw) for i, item in enumerate(node.value)]
    raw[path] = node.value
    return _scalar(node, loader)


def parse_yaml_text(text: str, source: str) -> SourceDoc:
    loader = yaml.SafeLoader(text)
    try:
        root = loader.get_single_node()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        problem = (exc.problem or "invalid YAML").strip()
        raise EnvbuilderError("spec", f"YAML syntax error: {problem}",
                              "check indentation, colons and quotes on that line",
                              line=line, source=source) from None
    except yaml.YAMLError as exc:
        raise EnvbuilderError("spec", f"YAML syntax error: {exc}", "fix the YAML syntax",
                              source=source) from None
    finally:
        loader.dispose()
    if root is None:
        raise EnvbuilderError("spec", "the file is empty",
                              "start from a recipe: `envbuilder presets` lists them", source=source)
    lines: dict[str, int] = {}
    raw: dict[str, str] = {}
    data = _walk(root, yaml.SafeLoader(""), "", lines, source, raw)
    return SourceDoc(data=data, path=source, lines=lines, raw=raw)


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
    if not text.strip():
        raise EnvbuilderError("spec", "the file is empty",
                              "start from a recipe: `envbuilder presets` lists them", source=shown)
    return parse_yaml_text(text, shown)
