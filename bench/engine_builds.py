"""One lock per preset built by each engine, cold and warm: Docker (BuildKit), buildah and the
real Apptainer (`apptainer build --fakeroot`, unprivileged, through tools/apptainer-node).

For each preset (`--preset NAME`, repeatable; default cpu-torch-ddp) the lock is made once, then in
one run and in this order, each engine twice on the same lock:
- docker: the locked Dockerfile with `--no-cache` (cold), then the same build again (warm: what its
  layer cache saves a user who builds again with nothing changed);
- buildah: `envbuilder build --engine buildah` twice in a fresh storage (envbuilder builds with
  `--layers=false --no-cache` for a reproducible digest, so a second build is a cold one again);
- apptainer: `envbuilder build --engine apptainer` twice (Apptainer caches the base's blobs in
  `APPTAINER_CACHEDIR`, kept between the two; it has no cache of `%post`).
It prints a table per preset: cold and warm seconds, image bytes (Docker's image, buildah's image,
the .sif), each cold time against Docker's.

    python bench/engine_builds.py                             # cpu-torch-ddp: about 20 min on 2 cores
    python bench/engine_builds.py --preset cpu-torch-ddp --preset cpu-tf-multiworker --json r.json

Needs Docker, buildah and the Apptainer image of .ci/install-apptainer.sh (.ci/setup). Images are
tagged localhost/envbuilder-bench/*; they, buildah's storage and the .sifs are removed at the end.
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
sys.path.insert(0, str(REPO / "bench"))

from engines import docker_build, envbuilder  # noqa: E402  (bench/engines.py: the Docker build; envbuilder as a command)

ENGINES = ("docker", "buildah", "apptainer")
BUILDER_UID = 1000          # the user of .ci/install-apptainer.sh's image (tools/apptainer-node)


def buildah_build(spec: Path, out: Path, tag: str, ca: str, wheel_args: list[str], env: dict) -> dict:
    started = time.monotonic()
    envbuilder("build", str(spec), "--out", str(out), "--engine", "buildah", "--tag", tag, "--ca-bundle", ca,
               *wheel_args, env=env)
    rec = json.loads((out / "image.json").read_text())
    return {"seconds": round(time.monotonic() - started, 1), "build_seconds": rec["build_seconds"],
            "size_bytes": rec["size_bytes"]}


def chown_tree(path: Path, uid: int) -> None:
    for root, dirs, files in os.walk(path):
        for name in [root, *(os.path.join(root, d) for d in dirs), *(os.path.join(root, f) for f in files)]:
            os.lchown(name, uid, uid)


def apptainer_build(spec: Path, out: Path, ca: str, wheel_args: list[str], cache: Path) -> dict:
    """`envbuilder build --engine apptainer` in tools/apptainer-node as the unprivileged user, the
    base's blobs cached in CACHE (kept between runs)."""
    chown_tree(out.parent, BUILDER_UID)
    mounts = ["-v", str(out.parent)]
    if wheel_args:
        mounts += ["-v", wheel_args[1]]
    started = time.monotonic()
    proc = subprocess.run(["bash", str(REPO / "tools" / "apptainer-node"), *mounts, "--", "env",
                           f"APPTAINER_CACHEDIR={cache}", "python", "-m", "envbuilder", "build", str(spec), "--out",
                           str(out), "--engine", "apptainer", "--ca-bundle", ca, *wheel_args],
                          capture_output=True, text=True)
    seconds = time.monotonic() - started
    if proc.returncode != 0:
        sys.exit(f"apptainer build failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    # envbuilder's line for an Apptainer build (no image.json: the .sif is the image)
    m = re.search(r"^built (\S+\.sif) \(\d+ MB\) in (\d+) s", proc.stdout, re.M)
    if not m:
        sys.exit(f"apptainer build: no 'built ... .sif' line in its output:\n{proc.stdout[-2000:]}")
    sif = Path(m.group(1))
    size = sif.stat().st_size
    sif.unlink()
    return {"seconds": round(seconds, 1), "build_seconds": float(m.group(2)), "size_bytes": size}


def needs_wheelhouse(spec: Path) -> bool:
    return "+cpu" in spec.read_text()       # torch's CPU build: the local wheelhouse (no download.pytorch.org here)


def bench_preset(name: str, engines: tuple[str, ...], work: Path, ca: str, wheelhouse: str) -> dict:
    spec = REPO / "recipes" / f"{name}.yaml"
    if not spec.is_file():
        sys.exit(f"--preset {name}: no recipes/{name}.yaml")
    wheel_args = ["--wheelhouse", wheelhouse] if needs_wheelhouse(spec) else []
    out = work / name / "out"
    envbuilder("lock", str(spec), "--out", str(out), *wheel_args)
    envbuilder("build", str(spec), "--out", str(out), "--no-build")
    result: dict = {}
    def done(engine: str) -> None:
        c, w = result[engine]["cold"], result[engine]["warm"]
        print(f"{name}: {engine} cold {c['seconds']:.0f} s, warm {w['seconds']:.0f} s, "
              f"{c['size_bytes'] / 1e6:.0f} MB", flush=True)

    if "docker" in engines:
        tag = f"localhost/envbuilder-bench/{name}:docker"
        try:
            result["docker"] = {"cold": docker_build(out, tag, ca, wheelhouse if wheel_args else None, True),
                                "warm": docker_build(out, tag, ca, wheelhouse if wheel_args else None, False)}
        finally:
            subprocess.run(["docker", "rmi", "-f", tag], capture_output=True)
        done("docker")
    if "buildah" in engines:
        conf = work / "storage.conf"
        conf.write_text(f'[storage]\ndriver = "overlay"\ngraphroot = "{work}/graph"\nrunroot = "{work}/run"\n')
        env = {"CONTAINERS_STORAGE_CONF": str(conf)}
        tag = f"localhost/envbuilder-bench/{name}:buildah"
        try:
            result["buildah"] = {"cold": buildah_build(spec, out, tag, ca, wheel_args, env),
                                 "warm": buildah_build(spec, out, tag, ca, wheel_args, env)}
        finally:
            full = dict(os.environ, **env)
            subprocess.run(["buildah", "rm", "--all"], env=full, capture_output=True)
            subprocess.run(["buildah", "rmi", "--all", "--force"], env=full, capture_output=True)
        done("buildah")
    if "apptainer" in engines:
        a_out = work / name / "apptainer" / name
        a_out.mkdir(parents=True)
        shutil.copy(out / "envbuilder.lock", a_out / "envbuilder.lock")
        cache = work / name / "apptainer" / "cache"
        cache.mkdir()
        result["apptainer"] = {"cold": apptainer_build(spec, a_out, ca, wheel_args, cache),
                               "warm": apptainer_build(spec, a_out, ca, wheel_args, cache)}
        done("apptainer")
    return result


def table(name: str, r: dict) -> str:
    ref = r.get("docker", {}).get("cold", {}).get("seconds")
    rows = [(name, "cold s", "warm s", "warm/cold", "cold vs docker", "image MB")]
    label = {"docker": "docker 20.10 (BuildKit)", "buildah": "buildah 1.28", "apptainer": "apptainer 1.4.5 (--fakeroot)"}
    for engine in ENGINES:
        if engine not in r:
            continue
        c, w = r[engine]["cold"], r[engine]["warm"]
        rows.append((label[engine], f"{c['seconds']:.0f}", f"{w['seconds']:.0f}", f"{w['seconds'] / c['seconds']:.2f}",
                     f"{c['seconds'] / ref:.2f}" if ref else "-",
                     f"{c['size_bytes'] / 1e6:.0f}" + (" (.sif)" if engine == "apptainer" else "")))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)) for row in rows)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", action="append", help="a recipe's name in recipes/ (repeatable; default cpu-torch-ddp)")
    p.add_argument("--engine", action="append", choices=ENGINES, help="engines to run (repeatable; default all three)")
    p.add_argument("--ca-bundle", default="/etc/ssl/certs/ca-certificates.crt")
    p.add_argument("--wheelhouse", default=os.environ.get("ENVBUILDER_WHEELHOUSE", "/opt/wheels"))
    p.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = p.parse_args(argv)
    engines = tuple(args.engine or ENGINES)
    work = Path(tempfile.mkdtemp(prefix="envbuilder-bench-engine-builds-"))
    results = {}
    try:
        for name in args.preset or ["cpu-torch-ddp"]:
            results[name] = bench_preset(name, engines, work, args.ca_bundle, args.wheelhouse)
            print(table(name, results[name]), flush=True)
            print()
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
