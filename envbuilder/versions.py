"""Version strings as users write them: "2.13.0+cpu", "3.10", "12.2.2", "2.4.0a0"."""

from __future__ import annotations

import re

_NUM = re.compile(r"^([0-9]+(?:\.[0-9]+)*)")


def release(version: str) -> tuple[int, ...]:
    """The numeric release part: "2.13.0+cpu" -> (2, 13, 0); "2.4.0a0" -> (2, 4, 0)."""
    m = _NUM.match(str(version))
    if not m:
        raise ValueError(f"not a version: {version!r}")
    return tuple(int(p) for p in m.group(1).split("."))


def minor(version: str) -> str:
    """"2.13.0+cpu" -> "2.13"."""
    r = release(version)
    return ".".join(str(p) for p in r[:2])


def major(version: str) -> int:
    return release(version)[0]


def cmp(a: str, b: str) -> int:
    """Compare release parts, padding with zeros (2.1 == 2.1.0)."""
    ra, rb = release(a), release(b)
    n = max(len(ra), len(rb))
    ra += (0,) * (n - len(ra))
    rb += (0,) * (n - len(rb))
    return (ra > rb) - (ra < rb)


def matches(expected: str, actual: str) -> bool:
    """True when ``actual`` is ``expected`` or a more precise release of it (3.11 ~ 3.11.7)."""
    re_, ra = release(expected), release(actual)
    return ra[: len(re_)] == re_


def satisfies(version: str, constraint: str) -> bool:
    """``constraint`` like ">=2.1", "<=0.28.1", "==2.13", "<2" (comma-separated: all must hold)."""
    for part in constraint.split(","):
        part = part.strip()
        m = re.match(r"^(>=|<=|==|<|>|!=)\s*(.+)$", part)
        if not m:
            raise ValueError(f"bad constraint {constraint!r}")
        op, ref = m.groups()
        c = cmp(version, ref)
        ok = {">=": c >= 0, "<=": c <= 0, "==": matches(ref, version), "<": c < 0,
              ">": c > 0, "!=": not matches(ref, version)}[op]
        if not ok:
            return False
    return True
