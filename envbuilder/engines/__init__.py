"""Container engines behind one interface, chosen by name from ``ENGINES`` (the one registry:
``--engine``'s choices, the lock's engines and every capability the pipeline asks about come
from it; tests/test_architecture.py fails if a module outside engines/ compares an engine with
a name).

Each engine module has ``build(folder, output, opts) -> dict``, with ``opts`` an
engines.options.BuildOptions (the CLI makes it; no engine sees argparse); each raises
CheckFailed with the failed step and where its log is, and never removes what the build step
already wrote. docker: engines/docker.py; buildah and podman (daemonless, reproducible):
engines/buildah.py; apptainer: engines/apptainer.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import import_module
from pathlib import Path

from .options import BuildOptions


@dataclass(frozen=True)
class Engine:
    name: str
    module: str                   # engines/<module>.py holds its build()
    resolves_lock: bool           # resolves envbuilder.lock (base digests, OS packages) before it builds
    needs_daemon: bool = False    # its images live in a daemon (the lock's base is checked there)
    storage_root: bool = False    # its images live in a storage folder of its own (graph root)
    oci_archive: bool = False     # writes an OCI archive of its image (the SIF's source without Docker)
    writes_sif: bool = False      # its product is the .sif itself (no separate SIF step)
    pushes: bool = False          # push(info, ref): the built image to a registry, by digest (build --push)
    builds_from: str = "Dockerfile"   # the output folder's file it builds (the spec's targets write it)

    def build(self, folder: Path, output, opts: BuildOptions) -> dict:
        return import_module(f"{__name__}.{self.module}").build(folder, output, opts)


ENGINES: dict[str, Engine] = {e.name: e for e in (
    Engine("docker", "docker", resolves_lock=True, needs_daemon=True, pushes=True),
    Engine("buildah", "buildah", resolves_lock=True, storage_root=True, oci_archive=True),
    Engine("podman", "buildah", resolves_lock=True, storage_root=True, oci_archive=True),
    Engine("apptainer", "apptainer", resolves_lock=False, writes_sif=True, builds_from="Apptainer.def"),
)}


def build_image(folder: Path, output, opts: BuildOptions) -> dict:
    return ENGINES[opts.engine].build(folder, output, opts)


PUSH_REF_RE = re.compile(
    r"[a-z0-9][a-z0-9.-]*(?::[0-9]{1,5})?/[a-z0-9][a-z0-9._/-]*(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?")


def check_push(opts: BuildOptions) -> None:
    """--push REF before anything is built: a registry/repository[:tag] this engine can push to."""
    from ..errors import EnvbuilderError

    if not opts.push:
        return
    if not ENGINES[opts.engine].pushes:
        raise EnvbuilderError("--push", f"the {opts.engine} engine cannot push here yet",
                              "build with --engine docker, or push the image with your engine's own command")
    if len(opts.push) > 512 or "@" in opts.push or not PUSH_REF_RE.fullmatch(opts.push) or "//" in opts.push:
        raise EnvbuilderError("--push", f"{opts.push!r} is not a registry/repository[:tag] reference",
                              "write e.g. 127.0.0.1:5000/envbuilder/cpu-torch:1 (the digest is recorded after the push)")


def push_image(folder: Path, info: dict, opts: BuildOptions) -> dict:
    """The built image pushed to opts.push; its digest recorded in FOLDER/image.json."""
    return import_module(f"{__name__}.{ENGINES[opts.engine].module}").push(folder, info, opts.push)
