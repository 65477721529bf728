"""`envbuilder build`, step by step: the one module that knows the order.

    spec -> job options (site, runtime, sweep) -> stack, findings, files (generate)
         -> output folder -> lock (resolved when there is none) -> engine -> SIF

The CLI parses arguments into a BuildRequest and prints what `on_written` and the result say;
the steps themselves live where they belong (generate.py, output.py, lockcmd.py, engines/, sif/).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .engines.options import BuildOptions
from .errors import EnvbuilderError


@dataclass(frozen=True)
class BuildRequest:
    spec: str                            # the spec file
    opts: BuildOptions
    out: str | None = None               # None: images/<name>
    lock: str | None = None              # None: <output folder>/envbuilder.lock
    site: str | None = None
    runtime: str | None = None
    sweep: tuple[str, ...] = ()
    no_build: bool = False               # write the files only
    sif: bool = False                    # also write <folder>/<name>.sif


def _check_sif_request(req: BuildRequest, want_sif: bool) -> None:
    """Before anything is written or built: a SIF is made from a built image."""
    if not req.sif:
        return
    if req.no_build:
        raise EnvbuilderError("--sif", "the SIF is made from the image the build makes",
                              "leave out --no-build (or run `envbuilder sif FOLDER` after a build)")
    if req.opts.engine == "apptainer":
        raise EnvbuilderError("--sif", "--engine apptainer writes its own .sif (apptainer build)",
                              "leave out --sif, or build with --engine docker, buildah or podman")


def make_sif_of(folder: Path, image: dict, opts: BuildOptions) -> dict:
    """The .sif of the image just built: from the Docker engine, or from the OCI archive that
    buildah/podman write (no Docker needed on that path)."""
    from .engines.docker import docker_cli
    from .sif.build import make_sif

    if opts.engine in ("buildah", "podman"):
        from .engines.buildah import export_image

        archive = (image.get("exports") or {}).get("oci-archive") \
            or export_image(opts.engine, image["tag"], "oci-archive", folder)
        return make_sif(folder, image["tag"], archive=Path(archive), quiet=opts.quiet)
    return make_sif(folder, image["tag"], docker=docker_cli(), quiet=opts.quiet)


def build(req: BuildRequest, on_written: Callable[[Path, list[str], list], None] | None = None) -> dict:
    """Run the build steps in order; return the result `build --json` prints. Raises
    EnvbuilderError (bad input, exit 2) or CheckFailed (a failed step, exit 1); what an earlier
    step wrote stays."""
    from .generate import generate
    from .lockcmd import ensure_locked, existing_lock, lock_path
    from .output import write_folder
    from .slurm.options import apply_job_options
    from .spec import load_spec

    spec = apply_job_options(load_spec(req.spec), site=req.site, runtime=req.runtime, sweep=list(req.sweep))
    want_sif = req.sif or "sif" in spec.targets
    _check_sif_request(req, want_sif)
    path = lock_path(spec, req.lock, req.out)
    out = generate(spec, existing_lock(path))      # an existing lock is used as is, if it matches
    folder = Path(req.out) if req.out else Path("images") / spec.name
    written = write_folder(folder, out.files, complete=True, force=req.opts.force)
    shown = sorted({str(folder / p.relative_to(folder).parts[0]) for p in written})
    result = {"ok": True, "folder": str(folder), "files": shown,
              "findings": [f.as_dict() for f in out.stack.findings]}
    if on_written is not None:
        on_written(folder, shown, out.stack.findings)
    if req.no_build:
        return result
    sif_now = want_sif and req.opts.engine != "apptainer"
    if sif_now:
        from .sif.build import require_tools

        require_tools()                   # before an hour of build, not after
    out = ensure_locked(req.opts, spec, folder, out, path)      # no lock yet: resolve and write one
    from .engines import build_image

    result["image"] = build_image(folder, out, req.opts)
    if sif_now:
        result["sif"] = make_sif_of(folder, result["image"], req.opts)
    return result
