"""Horovod's compile as released Horovod does it (RelWithDebInfo: -O3 -g) against the Release build
the catalog's `horovod_release_build` fix makes (-O3, no -g): wall seconds and the extension's size
before and after `strip --strip-debug` (what every envbuilder image does to it), side by side.

Each run unpacks the hash-checked sdist the catalog names into a fresh folder, applies the fixes
envbuilder applies for that framework (C++17 for torch), and runs `setup.py build_ext` with the
given Python (which must hold the framework: by default the host smoke environment,
/opt/envbuilder-smoke-venv, which has torch and tensorflow-cpu) and the host's MPI (mpicc on PATH).
The two build types alternate (--runs pairs), so a busy machine slows both alike.

    python bench/horovod_build_type.py                         # torch and tensorflow, one pair each
    python bench/horovod_build_type.py --frameworks pytorch --runs 2 --json hvd.json

About 6-7 minutes per pair on 2 cores.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from envbuilder.compat.catalog import load_catalog  # noqa: E402
from envbuilder.versions import satisfies  # noqa: E402

HOROVOD = "0.28.1"
FLAGS = {"pytorch": {"HOROVOD_WITH_PYTORCH": "1", "HOROVOD_WITHOUT_TENSORFLOW": "1"},
         "tensorflow": {"HOROVOD_WITH_TENSORFLOW": "1", "HOROVOD_WITHOUT_PYTORCH": "1"}}
COMMON = {"HOROVOD_WITHOUT_MXNET": "1", "HOROVOD_WITH_MPI": "1", "HOROVOD_WITH_GLOO": "1",
          "HOROVOD_CPU_OPERATIONS": "MPI"}
MODULE = {"pytorch": "torch", "tensorflow": "tensorflow"}


def sdist(cache: Path) -> Path:
    """The catalog's Horovod sdist, downloaded once into CACHE (pip download) and checked against its sha256."""
    entry = load_catalog().data["horovod"][HOROVOD]["sdist"]
    path = cache / entry["url"].rsplit("/", 1)[1]
    if not path.is_file():      # pip: the index and proxy settings this machine has
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                        f"horovod=={HOROVOD}", "-d", str(cache)], check=True)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != entry["sha256"]:
        sys.exit(f"{path}: sha256 {digest} is not the catalog's {entry['sha256']}")
    return path


def unpack(archive: Path, dest: Path, family: str, version: str, release: bool) -> Path:
    """The sdist unpacked into DEST with envbuilder's source fixes for FAMILY VERSION (the
    Release fix only when RELEASE)."""
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="data")
    src = dest / f"horovod-{HOROVOD}"
    catalog = load_catalog()
    for name in catalog.patches():
        patch = catalog.patch_for(name, family, version)
        applies = patch["applies"]
        if "replace" not in patch or "cuda" in applies or not satisfies(HOROVOD, applies["horovod"]):
            continue            # flags-only fixes (GCC 13) and CUDA's do not concern this build
        if name == "horovod_release_build" and not release:
            continue
        families = [k for k in ("pytorch", "tensorflow") if k in applies]
        if families and not (family in applies and satisfies(version, applies[family])):
            continue
        old, new = patch["replace"]
        for rel in patch["files"]:
            f = src / rel
            text = f.read_text()
            if old not in text:
                sys.exit(f"{name}: {old!r} not in {f}")
            f.write_text(text.replace(old, new))
    return src


def one_build(archive: Path, python: str, family: str, version: str, release: bool) -> dict:
    work = Path(tempfile.mkdtemp(prefix="envb-hvd-bench-"))
    try:
        src = unpack(archive, work, family, version, release)
        env = dict(os.environ, **COMMON, **FLAGS[family])
        log = work / "build.log"
        t0 = time.monotonic()
        with log.open("w") as out:
            proc = subprocess.run([python, "setup.py", "build_ext", "-b", str(work / "out")], cwd=src, env=env,
                                  stdout=out, stderr=subprocess.STDOUT)
        seconds = time.monotonic() - t0
        if proc.returncode != 0:
            sys.exit(f"the {'Release' if release else 'RelWithDebInfo'} build failed:\n" + log.read_text()[-3000:])
        lib = next((work / "out" / "horovod" / MODULE[family]).glob("mpi_lib*.so"))
        stripped = work / "stripped.so"
        shutil.copy(lib, stripped)
        subprocess.run(["strip", "--strip-debug", str(stripped)], check=True)
        return {"framework": family, "build": "Release" if release else "RelWithDebInfo", "seconds": round(seconds, 1),
                "so_bytes": lib.stat().st_size, "stripped_bytes": stripped.stat().st_size}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def framework_version(python: str, family: str) -> str:
    out = subprocess.run([python, "-c", f"import {MODULE[family]} as m; print(m.__version__)"],
                         capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{python} cannot import {MODULE[family]}: {out.stderr.strip()[-300:]} (--python: an "
                 "environment with the framework; bash .ci/setup makes /opt/envbuilder-smoke-venv)")
    return out.stdout.strip()


def table(rows: list[dict]) -> list[str]:
    lines = ["| framework | build | seconds (each run) | mean s | ratio to RelWithDebInfo | .so MB | stripped MB |",
             "|---|---|---|---|---|---|---|"]
    for family in dict.fromkeys(r["framework"] for r in rows):
        mine = [r for r in rows if r["framework"] == family]
        means = {}
        for build in ("RelWithDebInfo", "Release"):
            runs = [r for r in mine if r["build"] == build]
            means[build] = sum(r["seconds"] for r in runs) / len(runs)
        for build in ("RelWithDebInfo", "Release"):
            runs = [r for r in mine if r["build"] == build]
            lines.append(f"| {family} {runs[0]['version']} | {build} | {', '.join(str(r['seconds']) for r in runs)} | "
                         f"{means[build]:.0f} | {means[build] / means['RelWithDebInfo']:.2f} | "
                         f"{runs[-1]['so_bytes'] / 1e6:.1f} | {runs[-1]['stripped_bytes'] / 1e6:.2f} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", default="/opt/envbuilder-smoke-venv/bin/python")
    ap.add_argument("--frameworks", default="pytorch,tensorflow")
    ap.add_argument("--runs", type=int, default=1, help="pairs per framework")
    ap.add_argument("--json", help="also write the measurements here")
    args = ap.parse_args()
    if shutil.which("mpicc") is None:
        sys.exit("no mpicc on PATH (Horovod's MPI build needs one: apt-get install libopenmpi-dev)")
    cache = Path(tempfile.gettempdir()) / "envb-hvd-bench-sdist"
    cache.mkdir(exist_ok=True)
    archive = sdist(cache)
    rows = []
    for family in args.frameworks.split(","):
        version = framework_version(args.python, family)
        for _ in range(args.runs):
            for release in (False, True):
                row = one_build(archive, args.python, family, version, release)
                row["version"] = version
                rows.append(row)
                print(f"{family} {row['build']}: {row['seconds']} s", file=sys.stderr)
    print("\n".join(table(rows)))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
