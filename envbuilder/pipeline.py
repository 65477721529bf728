"""`envbuilder build`, step by step: the one module that knows the order.

    spec -> job options (site, runtime, sweep) -> stack (with its lock; resolved first when a
         build has none) -> files (generate) -> output folder, written once -> engine -> SIF

The CLI parses arguments into a BuildRequest and prints what `on_written` and the result say;
the steps themselves live where they belong (generate.py, output.py, lockcmd.py, engines/, sif/).
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from .engines import ENGINES, build_image
from .engines.options import BuildOptions
from .errors import EnvbuilderError


@dataclass(frozen=True)
class BuildRequest:
    spec: str                            # the spec file, or a preset's name
    opts: BuildOptions
    out: str | None = None               # None: images/<name>
    lock: str | None = None              # None: <output folder>/envbuilder.lock
    site: str | None = None
    runtime: str | None = None
    sweep: tuple[str, ...] = ()
    no_build: bool = False               # write the files only
    sif: bool = False                    # also write <folder>/<name>.sif


def _check_sif_request(req: BuildRequest) -> None:
    """Before anything is written or built: a SIF is made from a built image."""
    if not req.sif:
        return
    if req.no_build:
        raise EnvbuilderError("--sif", "the SIF is made from the image the build makes",
                              "leave out --no-build (or run `envbuilder sif FOLDER` after a build)")
    if ENGINES[req.opts.engine].writes_sif:
        *others, last = [name for name, e in ENGINES.items() if not e.writes_sif]
        raise EnvbuilderError("--sif", f"--engine {req.opts.engine} writes its own .sif ({req.opts.engine} build)",
                              f"leave out --sif, or build with --engine {', '.join(others)} or {last}")


def _check_engine_file(req: BuildRequest, targets) -> None:
    """The engine's build file must be one the spec's targets write (else the engine would start
    and find no file): refused before anything is written."""
    from .generate import TARGET_WRITING, recipe_files

    engine = ENGINES[req.opts.engine]
    if req.no_build or engine.builds_from in recipe_files(targets):
        return
    want = TARGET_WRITING[engine.builds_from]
    others = sorted(n for n, e in ENGINES.items() if e.builds_from in recipe_files(targets))
    raise EnvbuilderError("targets", f"--engine {engine.name} builds {engine.builds_from}, which the spec's "
                          f"targets: [{', '.join(targets)}] do not write",
                          f"add {want} to the spec's targets (targets: [{', '.join([*targets, want])}])"
                          + (f", or build with --engine {' or '.join(others)}" if others else ""))


def make_sif_of(folder: Path, image: dict, opts: BuildOptions) -> dict:
    """The .sif of the image just built: from the Docker engine, or from the OCI archive that
    buildah/podman write (no Docker needed on that path)."""
    from .engines.docker import docker_cli
    from .sif.build import make_sif

    if ENGINES[opts.engine].oci_archive:
        from .engines.buildah import export_image

        archive = (image.get("exports") or {}).get("oci-archive") \
            or export_image(opts.engine, image["tag"], "oci-archive", folder)
        return make_sif(folder, image["tag"], archive=Path(archive), quiet=opts.quiet)
    return make_sif(folder, image["tag"], docker=docker_cli(), quiet=opts.quiet)


def _fill_wheelhouse(folder: Path, opts: BuildOptions) -> None:
    """--no-build with --wheelhouse: the folder's wheelhouse/ gets the local wheels, so that the
    build line its recipes' headers print finds them (a build stages them in a context of its own
    instead, and the output folder keeps none)."""
    from .engines.context import link_wheels

    added = link_wheels(Path(opts.wheelhouse or ""), folder / "wheelhouse")
    if added and not opts.quiet:
        print(f"  {folder}/wheelhouse/: {len(added)} local wheel(s) from {opts.wheelhouse}", file=sys.stderr)


def _without_conflicting_wheels(opts: BuildOptions, lock) -> BuildOptions:
    """The wheelhouse's wheels of a locked package that are not the locked file stay out of the
    build (engines/context.py conflicting_wheels), saying so."""
    if not opts.wheelhouse or lock is None:
        return opts
    from .engines.context import conflicting_wheels

    skip = conflicting_wheels(Path(opts.wheelhouse), lock.pip_entries())
    if skip and not opts.quiet:
        print(f"note: left out of the build from the wheelhouse {opts.wheelhouse}: {', '.join(skip)} "
              "(the lock pins another file of the same package)", file=sys.stderr)
    return replace(opts, skip_wheels=skip) if skip else opts


def _fetch_conda(lock, folder: Path, opts: BuildOptions, steps: list[dict], paths: list[Path]) -> None:
    """The locked conda packages into FOLDER/conda-pkgs/, each sha256 checked against the lock (the
    build's conda step bind-mounts that folder and installs from it offline)."""
    from .lock.conda import PKGS_DIR, fetch

    with _step(steps, "conda packages", paths):
        fetched = fetch(lock.conda_packages(), folder, opts.ca_bundle)
    if fetched and not opts.quiet:
        print(f"  {folder}/{PKGS_DIR}/: {len(fetched)} conda package(s) fetched, sha256 as locked", file=sys.stderr)


def _with_host_trust(opts: BuildOptions) -> BuildOptions:
    """Without --ca-bundle: the CA bundle this machine's pip trusts (its PIP_CERT or pip.conf
    `cert`), handed to the build as --ca-bundle would be, saying so. Else the lock reaches the
    index through a TLS-intercepting proxy and the build's own pip, which sees none of the host's
    settings, fails on the proxy's certificate minutes later."""
    if opts.ca_bundle:
        return opts
    from .engines.context import host_pip_ca_bundle

    found = host_pip_ca_bundle()
    if found is None:
        return opts
    bundle, where = found
    if not opts.quiet:
        print(f"note: this machine's pip trusts {bundle} ({where}): the build gets it as with --ca-bundle "
              "(a build secret, never in a layer); give --ca-bundle FILE to hand over another", file=sys.stderr)
    return replace(opts, ca_bundle=bundle)


def _filesystems(paths: list[Path]) -> dict[int, Path]:
    """One existing path per file system (st_dev) among PATHS (or their nearest existing parent)."""
    found: dict[int, Path] = {}
    for p in paths:
        while not p.exists() and p != p.parent:
            p = p.parent
        found.setdefault(os.stat(p).st_dev, p)
    return found


@contextmanager
def _step(steps: list[dict], name: str, paths: list[Path]):
    """Time a step and sample the used space of the file systems it writes to (every 0.5 s):
    ``disk_gb`` is the peak growth over the step (other users of the disk count too: an upper bound)."""
    fss = _filesystems(paths)
    start = {dev: shutil.disk_usage(p).used for dev, p in fss.items()}
    peak = dict(start)
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.5):
            for dev, p in fss.items():
                peak[dev] = max(peak[dev], shutil.disk_usage(p).used)
    watcher = threading.Thread(target=sample, daemon=True)
    watcher.start()
    started = time.monotonic()
    try:
        yield
    finally:
        stop.set()
        watcher.join()
        for dev, p in fss.items():
            peak[dev] = max(peak[dev], shutil.disk_usage(p).used)
        steps.append({"step": name, "seconds": round(time.monotonic() - started, 1),
                      "disk_gb": round(sum(peak[d] - start[d] for d in fss) / 1e9, 2),
                      "disk_end_gb": round(sum(shutil.disk_usage(p).used - start[d] for d, p in fss.items()) / 1e9, 2)})


def _storage_paths(opts: BuildOptions, folder: Path) -> list[Path]:
    """Where a step writes: the output folder, and the engine's storage (buildah/podman)."""
    paths = [folder]
    if ENGINES[opts.engine].storage_root:
        from .engines.buildah import OciEngine

        try:
            paths.append(OciEngine(opts.engine).graph_root())
        except Exception:  # noqa: BLE001 - the figures are best effort; the build reports the error
            pass
    return paths


def print_steps(steps: list[dict]) -> None:
    print("steps: " + "; ".join(f"{s['step']} {s['seconds']:.0f} s, peak disk +{s['disk_gb']:.2f} GB"
                                for s in steps), file=sys.stderr, flush=True)


def build(req: BuildRequest, on_written: Callable[[Path, list[str], list], None] | None = None) -> dict:
    """Run the build steps in order; return the result `build --json` prints. Raises
    EnvbuilderError (bad input, exit 2) or CheckFailed (a failed step, exit 1); what an earlier
    step wrote stays."""
    from .generate import files_for, locked_stack
    from .lock.model import LOCK_NAME
    from .lockcmd import ensure_locked, existing_lock, lock_path
    from .output import check_output_folder, write_folder
    from .slurm.options import apply_job_options
    from .spec.presets import load_spec_arg

    from .config import load_config

    cfg = load_config()         # the site profile and runtime a site or user set once (docs/config.md)
    spec = apply_job_options(load_spec_arg(req.spec, quiet=req.opts.quiet), site=req.site or cfg.get("site"),
                             runtime=req.runtime or cfg.get("runtime"), sweep=list(req.sweep))
    _check_sif_request(req)
    _check_engine_file(req, spec.targets)
    from .engines import check_push

    check_push(req.opts)
    if req.opts.wheelhouse:
        from .engines.context import check_inputs

        check_inputs(None, req.opts.wheelhouse)          # before anything is written
    folder = Path(req.out) if req.out else Path("images") / spec.name
    check_output_folder(folder, "--out")
    path = lock_path(spec, req.lock, req.out)
    if req.lock:
        check_output_folder(path.parent, "--lock")
    stack = locked_stack(spec, existing_lock(path))   # an existing lock is used as is, if it matches
    engine = ENGINES[req.opts.engine]
    sif_now = not req.no_build and (req.sif or "sif" in spec.targets) and not engine.writes_sif
    if sif_now:
        from .sif.build import require_tools

        require_tools()                   # before an hour of build, not after
    opts = req.opts if req.no_build else _with_host_trust(req.opts)
    steps: list[dict] = []
    paths = _storage_paths(opts, folder)
    result: dict = {"ok": True, "folder": str(folder)}
    try:
        newly_locked = False
        if not req.no_build:
            with _step(steps, "lock", paths):
                lock = ensure_locked(opts, stack)      # no lock yet: resolved now, written below
            newly_locked = lock is not stack.lock
            if newly_locked:                           # resolved from this stack's needs: it matches
                stack = replace(stack, lock=lock)
        out = files_for(stack)
        written = write_folder(folder, out.files, complete=True, force=opts.force)
        if newly_locked and path.parent.resolve() != folder.resolve():
            write_folder(path.parent, {path.name: out.files[LOCK_NAME]}, force=opts.force)
        shown = sorted({str(folder / p.relative_to(folder).parts[0]) for p in written})
        result.update({"files": shown, "findings": [f.as_dict() for f in stack.findings]})
        if on_written is not None:
            on_written(folder, shown, stack.findings)
        if stack.lock is not None and stack.lock.conda_packages():
            _fetch_conda(stack.lock, folder, opts, steps, paths)
        if req.no_build:
            if opts.wheelhouse and opts.wheelhouse_given:     # a configured one stays out of the folder
                _fill_wheelhouse(folder, opts)
            return result
        result["steps"] = steps
        opts = _without_conflicting_wheels(opts, stack.lock)
        with _step(steps, "build", paths):
            result["image"] = build_image(folder, out, opts)
        if sif_now and engine.oci_archive and "oci-archive" not in (result["image"].get("exports") or {}):
            from .engines.buildah import export_image

            with _step(steps, "oci-archive", paths):
                result["image"].setdefault("exports", {})["oci-archive"] = export_image(
                    opts.engine, result["image"]["tag"], "oci-archive", folder)
        if sif_now:
            with _step(steps, "sif", paths):
                result["sif"] = make_sif_of(folder, result["image"], opts)
        if opts.push:
            from .engines import push_image

            with _step(steps, "push", paths):
                result["pushed"] = push_image(folder, result["image"], opts)
        # the build's provenance (docs/attestation.md): its inputs' hashes, the engine, the image
        from .attest.commands import provenance

        record = {**result["image"], **({"pushed": result["pushed"]} if result.get("pushed") else {})}
        result["provenance"] = provenance(str(folder), image=record, by_build=True)
    finally:
        if steps and not opts.quiet:
            print_steps(steps)
    return result
