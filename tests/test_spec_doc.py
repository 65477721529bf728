"""docs/spec.md is generated from the schema (tools/gen_spec_doc.py) and must match it, as
images/ must match the recipes; the rule codes it lists are read from the rule modules."""

from __future__ import annotations

import importlib.util
import re

from conftest import ROOT

spec = importlib.util.spec_from_file_location("gen_spec_doc", ROOT / "tools" / "gen_spec_doc.py")
gen = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gen)


def test_spec_doc_is_up_to_date():
    committed = (ROOT / "docs" / "spec.md").read_text(encoding="utf-8")
    assert committed == gen.render(), f"docs/spec.md is out of date: run `{gen.COMMAND}`"


def test_every_spec_key_and_every_rule_code_is_in_the_doc():
    text = gen.render()
    for path in gen.all_keys(gen.SPEC_FIELDS):
        assert f"### `{path}`" in text, path
    source = "".join(p.read_text(encoding="utf-8") for p in gen.RULES)
    codes = set(re.findall(r'Finding\(\s*"([A-Z0-9_]+)"', source))
    assert codes and codes == {code for code, *_ in gen.rule_fields()}
    for code in codes:
        assert f"`{code}`" in text, code


def test_a_rule_is_listed_under_the_key_its_finding_names():
    rules = gen.rules_by_key()
    assert ("BIND_FORMAT", "error", "rules.py") in rules["cluster.binds"]        # f"cluster.binds[{n}]"
    assert {c for c, *_ in rules["cluster.gpu"]} >= {"GPU_UNKNOWN", "WHEEL_ARCH"}  # field = ... if ... else
    assert "WHEEL_ARCH" in {c for c, *_ in rules["cuda.compute_capability"]}


def test_every_key_has_an_example_the_schema_accepts():
    from envbuilder.spec.schema import _check

    class Doc:
        raw: dict = {}

        def line_of(self, _path):
            return None

    for path, f in gen.all_keys(gen.SPEC_FIELDS).items():
        value, _where = gen.example_value(path, f)
        assert value is not None, f"{path}: no example (give the field example= in envbuilder/spec/schema.py)"
        errors: list = []
        _check(path, f, value, Doc(), errors, "docs/spec.md")
        assert not errors, (path, [e.message() for e in errors])
