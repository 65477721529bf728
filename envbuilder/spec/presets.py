"""The known-good stacks: the specs in recipes/, each checked and rendered by the test suite.

A preset's name is its file's name (recipes/NAME.yaml holds `name: NAME`). The wheel ships them as
envbuilder/presets/ (setup.py); a checkout or an editable install reads recipes/ itself. Where a
command takes a spec (check, build, lock), ``locate_spec`` turns its argument into a file: a file
of that name in the working folder wins, else the preset of that name, else one message with the
close names. The one place a spec argument becomes a path."""

from __future__ import annotations

import difflib
import sys
from dataclasses import dataclass
from pathlib import Path

from ..errors import EnvbuilderError
from .model import Spec, load_spec
from ..versions import release

PACKAGE = Path(__file__).resolve().parent.parent
REINSTALL = ("reinstall envbuilder from its wheel or sdist (pipx reinstall envbuilder, or pip install "
             "--force-reinstall envbuilder in its venv; docs/install.md)")


def recipes_dir() -> Path:
    """The presets: the installed package's presets/ folder, or the checkout's recipes/."""
    shipped = PACKAGE / "presets"
    return shipped if shipped.is_dir() else PACKAGE.parent / "recipes"


def preset_paths() -> list[Path]:
    return sorted(recipes_dir().glob("*.yaml"))


def preset_names() -> dict[str, Path]:
    return {p.stem: p for p in preset_paths()}


def require_presets() -> dict[str, Path]:
    """Every preset by name; none at all is a broken installation (exit 1)."""
    found = preset_names()
    if not found:
        raise EnvbuilderError("presets", f"this envbuilder has no presets: {recipes_dir()} holds no *.yaml "
                              "(its package data is missing)", REINSTALL, exit_code=1)
    return found


def shown(name: str) -> str:
    """How a message names a preset's file."""
    return f"envbuilder's recipes/{name}.yaml"


def unknown(arg: str, reason: str, field: str = "spec") -> EnvbuilderError:
    """No such file or preset: the close names (difflib) and where to see them all."""
    names = preset_names()
    close = difflib.get_close_matches(Path(arg).stem, list(names), n=5, cutoff=0.5)
    if not names:
        return EnvbuilderError(field, f"{reason}, and this envbuilder has no presets (its package data is "
                               "missing)", f"give the path of a YAML spec, or {REINSTALL}")
    hint = f"close presets: {', '.join(close)}; " if close else ""
    tail = "; or give the path of a YAML spec" if field == "spec" else ""
    return EnvbuilderError(field, reason, f"{hint}`envbuilder presets` lists all {len(names)}{tail}")


@dataclass(frozen=True)
class SpecSource:
    path: Path
    preset: str | None = None      # the preset's name when the argument named one


def locate_spec(arg: str) -> SpecSource:
    """SPEC of check/build/lock: a path, or a preset's name (a file of that name here wins)."""
    path = Path(arg)
    if path.exists() or path.is_symlink():
        return SpecSource(path)             # read_spec_file says what is wrong with it, if anything
    names = preset_names()
    if "/" in arg or path.suffix in (".yaml", ".yml") or arg.startswith("."):
        if path.suffix in (".yaml", ".yml") and path.stem in names and path.name == arg:
            raise EnvbuilderError("spec", f"no such file: {arg}",
                                  f"the preset of that name is `{path.stem}` (without .yaml): "
                                  f"envbuilder build {path.stem}; or give the path of a YAML spec")
        raise unknown(arg, f"no such file: {arg}")
    if arg in names:
        return SpecSource(names[arg], preset=arg)
    raise unknown(arg, f"no such file or preset: {arg!r}")


def load_spec_arg(arg: str, *, quiet: bool = False) -> Spec:
    """The spec a command's SPEC argument names; says which preset it took (not with --json)."""
    source = locate_spec(arg)
    if source.preset and not quiet:
        print(f"using preset {source.preset} ({shown(source.preset)}; no file of that name here); to edit "
              f"it: envbuilder init --preset {source.preset} -o my.yaml", file=sys.stderr)
    return load_spec(source.path)


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
