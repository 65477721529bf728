"""What a rule is and what it yields: a ``Finding`` (code, level, field, reason, fix, sources)
over a spec seen in its ``Context`` (the catalog, the base image, its OS, the NGC entry).

A rule is a generator ``(spec, ctx) -> Finding...`` marked with ``@rule``; compat/check.py runs
the marked functions of the rule modules it lists. Errors stop the build; warnings are printed
and recorded in the manifest.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..spec.model import Spec
from .catalog import Catalog, load_catalog
from .choices import default_base

ERROR, WARN, INFO = "error", "warning", "info"


@dataclass
class Finding:
    rule: str
    level: str
    field: str
    reason: str
    fix: str = ""
    sources: list[str] = dataclasses.field(default_factory=list)

    def as_dict(self) -> dict:
        return {"rule": self.rule, "level": self.level, "field": self.field,
                "reason": self.reason, "fix": self.fix, "sources": self.sources}


@dataclass
class Context:
    catalog: Catalog
    base: str
    os_name: str | None
    ngc: dict | None


def context_for(spec: Spec, catalog: Catalog | None = None) -> Context:
    cat = catalog or load_catalog()
    base = spec.base or default_base(spec, cat)
    ngc = cat.ngc(base)
    os_name = spec.base_os or cat.base_os(base)
    return Context(cat, base, os_name, ngc)


def rule(fn):
    """Mark FN as a rule of its module (compat/check.py collects the marked functions)."""
    fn.is_rule = True
    return fn
