"""Running the rules: every ``@rule`` of the rule modules below, module by module in this order,
each module's rules in the order they are written (the order findings are printed and recorded).
"""

from __future__ import annotations

from ..errors import SpecErrors
from ..spec.presets import nearest_preset
from ..spec.model import Spec
from . import rules, rules_distributed, rules_fabric, rules_gpu
from .catalog import Catalog
from .finding import ERROR, Finding, context_for

RULE_MODULES = (rules, rules_distributed, rules_gpu, rules_fabric)
RULES = tuple(fn for module in RULE_MODULES for fn in vars(module).values()
              if getattr(fn, "is_rule", False) and fn.__module__ == module.__name__)


def findings(spec: Spec, catalog: Catalog | None = None) -> list[Finding]:
    ctx = context_for(spec, catalog)
    out: list[Finding] = []
    for fn in RULES:
        out.extend(fn(spec, ctx))
    return out


def check(spec: Spec, catalog: Catalog | None = None) -> list[Finding]:
    """All findings; raises SpecErrors (naming the nearest known-good preset) when any is an error."""
    found = findings(spec, catalog)
    errors = [f for f in found if f.level == ERROR]
    if errors:
        hint = nearest_preset(spec)
        out = []
        for f in errors:
            fix = f.fix
            if hint:
                fix = f"{fix}; nearest known-good preset: {hint}" if fix else f"nearest known-good preset: {hint}"
            out.append(spec.error(f.field, f"{f.reason} [{f.rule}]", fix))
        raise SpecErrors(out)
    return found
