"""Hyper-parameter sweeps: a grid (`cluster.sweep` or `--sweep NAME=v1,v2`) becomes a Slurm
job array. Task i gets the i-th combination as environment variables and its own folder.

The order is fixed (names sorted, values as written), so the same spec always numbers the
tasks the same way and writes a byte-identical job script.
"""

from __future__ import annotations

import itertools
import re

from ..errors import EnvbuilderError
from ..schema import SWEEP_RE

MAX_TASKS = 10000   # Slurm's default MaxArraySize is 1001; sites raise it; beyond this is a typo


def parse_entry(entry: str, where: str = "--sweep") -> tuple[str, tuple[str, ...]]:
    """'lr=0.1,0.01' -> ('LR', ('0.1', '0.01')). Names become upper-case variables."""
    entry = entry.strip()
    if not SWEEP_RE.match(entry):
        raise EnvbuilderError(where, f"{entry!r} is not NAME=value1,value2,...",
                              "write e.g. --sweep lr=0.1,0.01 (NAME: letters, digits, _)")
    name, values = entry.split("=", 1)
    vals = tuple(v.strip() for v in values.split(","))
    if any(not v for v in vals) or len(set(vals)) != len(vals):
        raise EnvbuilderError(where, f"{entry!r} has an empty or repeated value",
                              "list each value once")
    bad = [v for v in vals if re.search(r"[\x00-\x1f]", v)]
    if bad:
        raise EnvbuilderError(where, f"{entry!r} has a control character", "use plain text values")
    return name.upper(), vals


def grid(entries: tuple[str, ...] | list[str]) -> dict[str, tuple[str, ...]]:
    """Merge entries (a later entry for the same name replaces the earlier one)."""
    out: dict[str, tuple[str, ...]] = {}
    for e in entries:
        name, vals = parse_entry(e)
        out[name] = vals
    return dict(sorted(out.items()))


def combinations(g: dict[str, tuple[str, ...]]) -> list[dict[str, str]]:
    """Every combination, in a fixed order: task i is combinations(g)[i]."""
    if not g:
        return []
    names = list(g)
    combos = [dict(zip(names, values)) for values in itertools.product(*(g[n] for n in names))]
    if len(combos) > MAX_TASKS:
        raise EnvbuilderError("cluster.sweep", f"the grid has {len(combos)} combinations",
                              f"keep it under {MAX_TASKS} (and under the site's MaxArraySize)")
    return combos


def with_overrides(spec_entries: tuple[str, ...], cli_entries: list[str]) -> tuple[str, ...]:
    """The spec's grid with --sweep entries replacing (or adding) names; canonical text."""
    g = grid(spec_entries)
    g.update(grid(cli_entries))
    return tuple(f"{n}={','.join(v)}" for n, v in sorted(g.items()))
