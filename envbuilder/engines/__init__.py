"""Container engines behind one interface: ``build_image(folder, output, args) -> dict``.

An engine is chosen by name (``--engine``); each raises CheckFailed with the failed step and
where its log is, and never removes what the build step already wrote.
docker: engines/docker.py; buildah and podman (daemonless, reproducible): engines/buildah.py;
apptainer: engines/apptainer.py.
"""

from __future__ import annotations

from pathlib import Path

ENGINES = ("docker", "buildah", "podman", "apptainer")


def build_image(folder: Path, output, args) -> dict:
    if args.engine == "apptainer":
        from .apptainer import build

        return build(folder, output, args)
    if args.engine in ("buildah", "podman"):
        from .buildah import BuildOptions, build

        return build(folder, output, BuildOptions.from_args(args))
    from .docker import build

    return build(folder, output, args)
