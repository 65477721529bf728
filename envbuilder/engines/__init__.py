"""Container engines behind one interface: ``build_image(folder, output, opts) -> dict``, with
``opts`` an engines.options.BuildOptions (the CLI makes it; no engine sees argparse).

An engine is chosen by name (``--engine``); each raises CheckFailed with the failed step and
where its log is, and never removes what the build step already wrote.
docker: engines/docker.py; buildah and podman (daemonless, reproducible): engines/buildah.py;
apptainer: engines/apptainer.py.
"""

from __future__ import annotations

from pathlib import Path

from .options import BuildOptions

ENGINES = ("docker", "buildah", "podman", "apptainer")


def build_image(folder: Path, output, opts: BuildOptions) -> dict:
    if opts.engine == "apptainer":
        from .apptainer import build
    elif opts.engine in ("buildah", "podman"):
        from .buildah import build
    else:
        from .docker import build
    return build(folder, output, opts)
