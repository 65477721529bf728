"""The framework build a lock resolved must be the one the spec asks for: a GPU spec never locks a
CPU wheel of its framework, and a CPU spec never a CUDA one.

PEP 440 ignores a local version label when the requirement has none, so `torch==2.13.0` is met by
`torch-2.13.0+cpu` from a wheelhouse (or a site mirror) as well as by PyPI's CUDA build; pip takes
whichever it finds first. Without this check the mistake shows up minutes later in the build (the
CUDA toolkit step finds no NCCL), or as a CPU-only image that passes every CPU test.

How a wheel's build is told (PyTorch's and TensorFlow's release conventions):
- the local version label: `+cpu` is a CPU build, `+cuNNN` / `+rocmN` an accelerator build;
- with no label, what pip resolved beside it: a CUDA build from PyPI requires NVIDIA's wheels
  (`nvidia-*`, `cuda-*`), a CPU build requires none. Only the framework's own closure counts (the
  lock's `cuda` group, which lock/pip.py fills from it), not a wheel the spec's packages bring.

Pure data in, a message out: the caller (lockcmd) hands in what the spec wants.
"""

from __future__ import annotations

from ..errors import EnvbuilderError
from .model import canonical_name, pip_by_name


def _label(version: str) -> str:
    return version.split("+", 1)[1].lower() if "+" in version else ""


def check_framework_build(groups: dict[str, list[dict]], package: str, *, gpu: bool, cuda_from_pypi: bool,
                          spec_version: str) -> None:
    """Refuse (exit 2) when the resolved ``package`` is the wrong build for the spec.

    ``groups``: the lock's pip groups; ``gpu``: the spec has `cuda:`;
    ``cuda_from_pypi``: `cuda: {source: pypi}` (CUDA comes as NVIDIA's wheels, so they must be
    locked too)."""
    entry = pip_by_name(groups).get(canonical_name(package))
    if entry is None:
        return
    label = _label(entry["version"])
    nvidia = sorted(e["name"] for e in groups.get("cuda", []))
    where = (f"{entry.get('file') or entry['name'] + '==' + entry['version']} "
             f"(from {'the wheelhouse' if entry.get('from') == 'wheelhouse' else 'the index'})")
    field = f"lock: pip: {entry['name']}"
    if gpu:
        cpu_build = label.startswith("cpu") or (cuda_from_pypi and not label and not nvidia)
        if cpu_build:
            raise EnvbuilderError(
                field, f"the spec asks for a GPU build (cuda:) but the lock resolved {where}, a CPU build "
                f"of {entry['name']} {entry['version']}" + ("" if label else ", with no NVIDIA wheel beside it"),
                f"remove the CPU wheel from the wheelhouse (or use one without it), or pin the CUDA build "
                f"in framework.version (e.g. \"{spec_version.split('+')[0]}\" from PyPI, or a +cuNNN wheel); "
                f"for a CPU image drop `cuda:` and use \"{spec_version.split('+')[0]}+cpu\"")
        return
    if label.startswith(("cu", "rocm")) or nvidia:
        shown = f"; it brings {', '.join(nvidia[:3])}{' ...' if len(nvidia) > 3 else ''}" if nvidia else ""
        raise EnvbuilderError(
            field, f"the spec has no `cuda:` (a CPU image) but the lock resolved {where}, an accelerator "
            f"build of {entry['name']} {entry['version']}{shown}",
            f"pin the CPU build: framework.version \"{spec_version.split('+')[0]}+cpu\" with --wheelhouse DIR "
            f"holding that wheel, or framework.index_url https://download.pytorch.org/whl/cpu; for a GPU "
            f"image add `cuda: {{version: ..., source: pypi}}`")
