"""The known-good stacks: the specs in recipes/, each checked and rendered by the test suite."""

from __future__ import annotations

from pathlib import Path

from .model import Spec, load_spec
from ..versions import release


def recipes_dir() -> Path:
    package = Path(__file__).resolve().parent.parent
    for candidate in (package.parent / "recipes", package / "recipes"):
        if candidate.is_dir():
            return candidate
    return package.parent / "recipes"


def preset_paths() -> list[Path]:
    return sorted(recipes_dir().glob("*.yaml"))


def load_presets() -> list[tuple[Path, Spec]]:
    return [(p, load_spec(p)) for p in preset_paths()]


def describe(spec: Spec) -> str:
    parts = [f"{spec.framework.name} {spec.framework.version}", f"Python {spec.python}"]
    parts.append(f"CUDA {spec.cuda.version}" if spec.cuda else "CPU")
    if spec.horovod:
        parts.append(f"Horovod {spec.horovod.version}")
    if spec.mpi:
        parts.append(f"{spec.mpi.flavor} {spec.mpi.version}")
    return ", ".join(parts)


def _distance(a: Spec, b: Spec) -> tuple:
    ra, rb = release(a.framework.version), release(b.framework.version)
    version_gap = abs((ra + (0, 0))[0] * 100 + (ra + (0, 0))[1] - ((rb + (0, 0))[0] * 100 + (rb + (0, 0))[1]))
    return (
        a.framework.family != b.framework.family,
        (a.cuda is None) != (b.cuda is None),
        a.framework.name != b.framework.name,
        (a.horovod is None) != (b.horovod is None),
        a.distributed.kind != b.distributed.kind,
        a.target_arch != b.target_arch,
        version_gap,
    )


def nearest_preset(spec: Spec) -> str | None:
    presets = load_presets()
    if not presets:
        return None
    path, best = min(presets, key=lambda item: (_distance(spec, item[1]), item[0].name))
    return f"recipes/{path.name} ({describe(best)})"
