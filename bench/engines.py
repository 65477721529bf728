"""Docker (BuildKit) against buildah on one lock: cold build time, image size, digests.

The stack is recipes/cpu-torch-horovod.yaml without Horovod (torch 2.13.0+cpu from the wheelhouse). One
lock is made first; then, in one run and in this order: a Docker build of the locked Dockerfile
with --no-cache, and `envbuilder build --engine buildah --check-reproducible` (two cold builds).
It prints a table: seconds, the buildah/Docker ratio, image sizes and the image digests (Docker's
image ID, buildah's two manifest digests and IDs).

    python bench/engines.py                  # about 12 min on 2 cores
    python bench/engines.py --json results.json

Images are tagged localhost/envbuilder-bench/*, buildah's storage is a temporary folder; both are
removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

TAG_DOCKER = "localhost/envbuilder-bench/cpu-torch:docker"
TAG_BUILDAH = "localhost/envbuilder-bench/cpu-torch:buildah"


def envbuilder(*args, env=None) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "envbuilder", *args], cwd=REPO, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(REPO), **(env or {})))
    if proc.returncode != 0:
        sys.exit(f"envbuilder {' '.join(args)} failed:\n{proc.stderr[-3000:]}")
    return proc


def spec_file(work: Path) -> Path:
    text = (REPO / "recipes" / "cpu-torch-horovod.yaml").read_text()
    text = re.sub(r"^horovod:.*\n", "", text, flags=re.M)
    text = re.sub(r"^name: .*$", "name: cpu-torch-bench", text, flags=re.M)
    path = work / "cpu-torch-bench.yaml"
    path.write_text(text)
    return path


def docker_build(out: Path, tag: str, ca: str, wheelhouse: str | None, cold: bool = True) -> dict:
    """The locked Dockerfile of OUT built by the BuildKit CLI envbuilder uses (cold: --no-cache):
    seconds, image bytes and ID. bench/engine_builds.py uses it too."""
    from envbuilder.engines.context import stage_context
    from envbuilder.engines.docker import buildkit_cli, docker_build_command

    files = {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file()
             and p.name not in ("build.log", "image.json") and not p.name.endswith(".sif")}
    context = stage_context(out, files, wheelhouse)
    cmd = docker_build_command(buildkit_cli(), context, tag, ca)
    if cold:
        cmd.insert(-1, "--no-cache")
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
    return {"seconds": round(seconds, 1), "size_bytes": inspect["Size"], "id": inspect["Id"]}


def docker_cold(out: Path, ca: str, wheelhouse: str) -> dict:
    return docker_build(out, TAG_DOCKER, ca, wheelhouse)


def table(r: dict) -> str:
    d, b = r["docker"], r["buildah"]
    rows = [("engine", "cold build s", "image MB", "digest / id"),
            ("docker 20.10 (BuildKit)", f"{d['seconds']:.0f}", f"{d['size_bytes'] / 1e6:.0f}", f"id {d['id']}"),
            ("buildah 1.28, build 1", f"{b['seconds'][0]:.0f}", f"{b['size_bytes'] / 1e6:.0f}",
             f"digest {b['digests'][0]}"),
            ("buildah 1.28, build 2", f"{b['seconds'][1]:.0f}", "", f"digest {b['digests'][1]}"),
            ("", "", "", f"id {b['id']}")]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = ["  ".join(row[i].ljust(widths[i]) for i in range(3)) + "  " + row[3] for row in rows]
    lines.append(f"buildah/docker cold build time: {b['seconds'][0] / d['seconds']:.2f}  "
                 f"(second buildah build: {b['seconds'][1] / d['seconds']:.2f}); "
                 f"buildah digests {'bit-identical' if b['identical'] else 'DIFFER'}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ca-bundle", default="/etc/ssl/certs/ca-certificates.crt")
    p.add_argument("--wheelhouse", default=os.environ.get("ENVBUILDER_WHEELHOUSE", "/opt/wheels"))
    p.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="envbuilder-bench-engines-"))
    conf = work / "storage.conf"
    conf.write_text(f'[storage]\ndriver = "overlay"\ngraphroot = "{work}/graph"\nrunroot = "{work}/run"\n')
    env = {"CONTAINERS_STORAGE_CONF": str(conf)}
    try:
        spec = spec_file(work)
        out = work / "out"
        envbuilder("lock", str(spec), "--out", str(out), "--wheelhouse", args.wheelhouse)
        envbuilder("build", str(spec), "--out", str(out), "--no-build")
        docker = docker_cold(out, args.ca_bundle, args.wheelhouse)
        envbuilder("build", str(spec), "--out", str(out), "--engine", "buildah", "--tag", TAG_BUILDAH,
                   "--check-reproducible", "--ca-bundle", args.ca_bundle, "--wheelhouse", args.wheelhouse, env=env)
        rec = json.loads((out / "image.json").read_text())
        rep = rec["reproducible"]
        result = {"docker": docker,
                  "buildah": {"seconds": [rec["build_seconds"], rep["second"]["build_seconds"]],
                              "size_bytes": rec["size_bytes"], "id": rec["id"],
                              "digests": [rep["first"]["digest"], rep["second"]["digest"]],
                              "identical": rep["identical"]}}
        du = subprocess.run(["du", "-sb", str(work / "graph")], capture_output=True, text=True).stdout.split()
        result["buildah"]["storage_bytes_after"] = int(du[0]) if du else None
        print(table(result))
        if result["buildah"]["storage_bytes_after"]:
            print(f"buildah storage after the builds (overlay): {result['buildah']['storage_bytes_after'] / 1e9:.2f} GB")
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    finally:
        subprocess.run(["docker", "rmi", "-f", TAG_DOCKER], capture_output=True)
        full = dict(os.environ, **env)
        subprocess.run(["buildah", "rm", "--all"], env=full, capture_output=True)
        subprocess.run(["buildah", "rmi", "--all", "--force"], env=full, capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
