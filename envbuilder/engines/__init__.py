"""Container engines behind one interface: ``build_image(folder, output, options) -> dict``.

An engine is chosen by name (``--engine``); each raises CheckFailed with the failed step and
where its log is, and never removes what the build step already wrote.
"""

from __future__ import annotations

from pathlib import Path


def build_image(folder: Path, output, args) -> dict:
    if args.engine == "apptainer":
        from .apptainer import build

        return build(folder, output, args)
    from .docker import build

    return build(folder, output, args)
