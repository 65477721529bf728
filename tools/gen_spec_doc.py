"""Write docs/spec.md, the spec and site-profile reference, from the schema.

    python tools/gen_spec_doc.py            # rewrite docs/spec.md
    python tools/gen_spec_doc.py --check    # exit 1 when docs/spec.md is out of date

Every key, its type, default, allowed values and an example come from envbuilder/spec/schema.py
(SPEC_FIELDS, the source `envbuilder schema` prints) and envbuilder/slurm/sites.py (which keys a
site profile takes). The rules that report on a key come from the rule modules themselves
(envbuilder/compat/rules*.py): an AST scan of every ``Finding(CODE, LEVEL, FIELD, ...)`` call,
so a new rule appears here without a hand-kept list. tests/test_spec_doc.py fails when the file
is stale.
"""

from __future__ import annotations

import ast
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from envbuilder.spec.schema import SPEC_FIELDS, Field  # noqa: E402
from envbuilder.slurm import sites  # noqa: E402

DOC = ROOT / "docs" / "spec.md"
RULES = sorted((ROOT / "envbuilder" / "compat").glob("rules*.py"))
COMMAND = "python tools/gen_spec_doc.py"
LEVELS = {"ERROR": "error", "WARN": "warning", "INFO": "info"}


# --- which rules report on which key (read from the rule modules) ----------------------------

def _strings(node: ast.AST) -> list[str]:
    """The field paths an expression can take: a string, an f-string's literal head, or (for a
    name) every string its assignments in the same function hold."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.JoinedStr):
        head = ""
        for part in node.values:
            if not (isinstance(part, ast.Constant) and isinstance(part.value, str)):
                break
            head += part.value
        return [head]
    return []


def rule_fields() -> list[tuple[str, str, str, str]]:
    """(code, level, field path as written, module) for every Finding the rule modules create."""
    out = []
    for path in RULES:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            assigned: dict[str, list[str]] = defaultdict(list)
            for node in ast.walk(fn):
                if isinstance(node, ast.Assign):
                    for target in node.targets:
                        if isinstance(target, ast.Name):
                            assigned[target.id] += [s for sub in ast.walk(node.value) for s in _strings(sub)]
            for node in ast.walk(fn):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                        and node.func.id == "Finding" and len(node.args) >= 3):
                    continue
                code, level, where = node.args[:3]
                if not (isinstance(code, ast.Constant) and isinstance(code.value, str)):
                    raise SystemExit(f"{path.name}:{node.lineno}: a Finding whose code is not a string")
                lvl = LEVELS.get(level.id, "error or warning") if isinstance(level, ast.Name) else "?"
                fields = assigned[where.id] if isinstance(where, ast.Name) else _strings(where)
                if not fields:
                    raise SystemExit(f"{path.name}:{node.lineno}: cannot read the field of {code.value}")
                for f in fields:
                    out.append((code.value, lvl, f, path.name))
    return out


def key_of(field_path: str) -> str:
    """cluster.binds[1] -> cluster.binds; an f-string head `distributed.` -> distributed."""
    return re.sub(r"\[.*$", "", field_path).rstrip(".")


def all_keys(fields: dict, prefix: str = "") -> dict[str, Field]:
    out = {}
    for name, f in fields.items():
        path = f"{prefix}{name}"
        out[path] = f
        if f.kind == "object":
            out.update(all_keys(f.children, path + "."))
    return out


def rules_by_key() -> dict[str, list[tuple[str, str, str]]]:
    keys = all_keys(SPEC_FIELDS)
    found: dict[str, set] = defaultdict(set)
    for code, level, path, module in rule_fields():
        key = key_of(path)
        if key not in keys:
            raise SystemExit(f"{module}: {code} reports on {path!r}, which is not a spec key")
        found[key].add((code, level, module))
    return {k: sorted(v) for k, v in found.items()}


# --- rendering --------------------------------------------------------------------------------

KIND = {"string": "text", "version": "version (write it in quotes: \"3.10\", YAML reads 3.10 as 3.1)",
        "integer": "whole number", "boolean": "true or false", "object": "mapping of the keys below",
        "map": "mapping NAME: value (environment variable names: letters, digits, _)"}


def type_text(f: Field) -> str:
    if f.kind == "list":
        return f"list of {type_text(f.items)}" if f.items else "list"
    return KIND[f.kind]


def anchor(path: str) -> str:
    return path.replace(".", "-").replace("_", "-")


def examples_in_files() -> dict[str, tuple[object, str]]:
    """The first value each key has in recipes/*.yaml, then in sites/*.yaml (a site profile's keys
    are cluster.KEY): real examples for keys the schema gives none."""
    found: dict[str, tuple[object, str]] = {}

    def walk(data, prefix, where):
        for key, value in data.items():
            path = prefix + str(key)
            if isinstance(value, dict) and path != "env" and not path.endswith(".env"):
                walk(value, path + ".", where)
            found.setdefault(path, (value, where))

    for path in sorted((ROOT / "recipes").glob("*.yaml")):
        walk(yaml.safe_load(path.read_text(encoding="utf-8")), "", f"recipes/{path.name}")
    for path in sorted((ROOT / "sites").glob("*.yaml")):
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        walk({k: v for k, v in data.items() if k in sites.SITE_FIELDS and k not in sites.PROFILE_ONLY},
             "cluster.", f"sites/{path.name}")
    return found


EXAMPLES = examples_in_files()


def example_value(path: str, f: Field) -> tuple[object, str]:
    """An example and where it comes from ("" for the schema)."""
    if f.example is not None:
        return f.example, ""
    if f.default not in (None, [], {}):
        return f.default, ""
    if path in EXAMPLES:
        return EXAMPLES[path]
    if f.enum:
        return f.enum[0], ""
    if f.kind == "list" and f.items is not None and f.items.enum:
        return [f.items.enum[0]], ""
    return None, ""


def nested(path: str, value) -> dict:
    out = value
    for part in reversed(path.split(".")):
        out = {part: out}
    return out


PLAIN = re.compile(r"[A-Za-z_/][A-Za-z0-9_./:@+=-]*")
YAML_WORDS = {"true", "false", "yes", "no", "on", "off", "null", "y", "n", "~"}


def flow(value) -> str:
    """A value as YAML flow text, as the recipes write it: versions and other text that YAML could
    read as something else in double quotes."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return value if PLAIN.fullmatch(value) and value.lower() not in YAML_WORDS else json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(flow(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {flow(v)}" for k, v in value.items()) + "}"
    raise TypeError(value)


def example_block(path: str, f: Field) -> list[str]:
    value, where = example_value(path, f)
    if value is None:
        return []
    parts = path.split(".")
    lines = [f"{'  ' * n}{part}:" for n, part in enumerate(parts[:-1])]
    indent = "  " * (len(parts) - 1)
    if f.kind == "object" and isinstance(value, dict):      # a section: one key a line
        lines.append(f"{indent}{parts[-1]}:")
        lines += [f"{indent}  {k}: {flow(v)}" for k, v in value.items()]
    else:
        lines.append(f"{indent}{parts[-1]}: {flow(value)}")
    text = "\n".join(lines)
    if yaml.safe_load(text) != nested(path, value):
        raise SystemExit(f"{path}: the example {text!r} does not read back as {value!r}")
    return ["", f"Example{f' (from {where})' if where else ''}:", "", "```yaml", text, "```"]


def key_section(path: str, f: Field, rules: dict) -> list[str]:
    lines = [f'<a id="{anchor(path)}"></a>', f"### `{path}`", "", f.doc, ""]
    facts = [f"- **type**: {type_text(f)}" + (", required" if f.required else ", optional")]
    if f.default not in (None, [], {}):
        facts.append(f"- **default**: `{json.dumps(f.default)}`")
    enum = f.enum or (f.items.enum if f.kind == "list" and f.items is not None else ())
    if enum:
        facts.append("- **allowed values**: " + ", ".join(f"`{e}`" for e in enum))
    pattern = f.pattern or (f.items.pattern if f.kind == "list" and f.items is not None else None)
    if pattern is not None:
        hint = f.pattern_hint or (f.items.pattern_hint if f.items is not None else "")
        facts.append(f"- **form**: {hint} (full match of `{pattern.pattern}`)")
    elif f.kind == "version":
        facts.append("- **form**: an exact version such as `2.12.1` or `2.13.0+cpu` (no ranges)")
    if f.minimum is not None or f.maximum is not None:
        facts.append(f"- **range**: {f.minimum if f.minimum is not None else '-'} to "
                     f"{f.maximum if f.maximum is not None else '-'}")
    if f.kind == "map" and not f.secret_ok:
        facts.append("- **refused**: names that look like secrets (TOKEN, PASSWORD, ...)")
    site = site_role(path)
    if site:
        facts.append(f"- **site profile**: {site}")
    found = rules.get(path, [])
    if found:
        facts.append("- **rules**: " + ", ".join(f"`{code}` ({level}, {module})" for code, level, module in found))
    return lines + facts + example_block(path, f) + [""]


def site_role(path: str) -> str:
    if not path.startswith("cluster."):
        return ""
    key = path.split(".", 1)[1]
    if key in sites.NOT_IN_PROFILES:
        return "not allowed (it belongs to one experiment, not to a cluster)"
    if key in sites.ADDED:
        return "allowed; its entries are added after the spec's"
    if key in sites.MAP_KEYS:
        return "allowed; merged with the spec's, the site's value wins for a name both set"
    return "allowed; the site's value overrides the spec's"


def render() -> str:
    rules = rules_by_key()
    keys = all_keys(SPEC_FIELDS)
    out = [
        "# Spec and site-profile reference",
        "",
        f"<!-- Generated from envbuilder/spec/schema.py by `{COMMAND}`: do not edit by hand. -->",
        "",
        "A spec is one YAML file (`recipes/` holds working ones; `envbuilder presets` lists them). This page",
        "lists every key it takes, generated from the same declaration that checks a spec",
        "(envbuilder/spec/schema.py); `envbuilder schema` prints it as a JSON Schema for editors. A key",
        "envbuilder does not know is refused with the nearest known one. Under **rules** are the",
        "compatibility rules (envbuilder/compat/) that report a finding on the key: an error stops",
        "`check` and `build` (exit 2), a warning or an info is printed and recorded in the manifest.",
        "A [site profile](#site-profiles) holds a cluster's part of the `cluster` section.",
        "",
        "## Keys",
        "",
    ]
    for path in keys:
        depth = path.count(".")
        out.append("  " * depth + f"- [`{path}`](#{anchor(path)})")
    out += ["", "## Spec", ""]
    for path, f in keys.items():
        out += key_section(path, f, rules)
    out += [
        "## Site profiles",
        "",
        "A site profile is one YAML file per cluster (`envbuilder build SPEC --site NAME` reads",
        "`sites/NAME.yaml`, a folder in `$ENVBUILDER_SITES`, or a file path), so one spec serves",
        "several clusters. It is checked like a spec; [sites/example-gpu.yaml](../sites/example-gpu.yaml)",
        "is a commented example.",
        "Its keys:",
        "",
    ]
    for name, f in sites.PROFILE_ONLY.items():
        out.append(f"- `{name}`: {type_text(f)}. {f.doc}")
    for name in sites.SITE_FIELDS:
        if name in sites.PROFILE_ONLY:
            continue
        role = site_role("cluster." + name).replace("allowed; ", "")
        out.append(f"- [`{name}`](#{anchor('cluster.' + name)}): as `cluster.{name}`; {role}")
    out += ["", "Not in a profile (they belong to one experiment): "
            + ", ".join(f"`cluster.{k}`" for k in sites.NOT_IN_PROFILES) + ".", ""]
    return "\n".join(out)


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if not DOC.is_file() or DOC.read_text(encoding="utf-8") != text:
            print(f"{DOC.relative_to(ROOT)} is out of date: run `{COMMAND}`", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(text, encoding="utf-8")
    print(DOC.relative_to(ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
