"""Horovod's compile as released Horovod does it (RelWithDebInfo: -O3 -g) against the Release build
the catalog's `horovod_release_build` fix makes (-O3, no -g): wall seconds and the extension's size
before and after `strip --strip-debug` (what every envbuilder image does to it), side by side.

Each run unpacks the hash-checked sdist into a fresh folder and builds it as the preset's image
does (recipes/cpu-torch-horovod.yaml for torch, recipes/cpu-tf-horovod.yaml for TensorFlow): the source fixes and
HOROVOD_* flags come from envbuilder.plan.components.horovod for that preset's stack, then
`setup.py build_ext` runs with the given Python (which must hold the preset's framework release: by
default the host smoke environment, /opt/envbuilder-smoke-venv) and the host's MPI (mpicc on PATH).
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

from envbuilder.plan.components.horovod import build_flags, patches  # noqa: E402
from envbuilder.stack import Stack, resolve  # noqa: E402
from envbuilder.spec.model import load_spec  # noqa: E402

PRESET = {"pytorch": "cpu-torch-horovod.yaml", "tensorflow": "cpu-tf-horovod.yaml"}
MODULE = {"pytorch": "torch", "tensorflow": "tensorflow"}
RELEASE_FIX = "horovod_release_build"


def preset_stack(family: str) -> Stack:
    return resolve(load_spec(REPO / "recipes" / PRESET[family]))


def sdist(stack: Stack, cache: Path) -> Path:
    """The stack's Horovod sdist, downloaded once into CACHE (pip download) and checked against the
    catalog's sha256."""
    entry, version = stack.horovod_sdist, stack.spec.horovod.version
    path = cache / entry["url"].rsplit("/", 1)[1]
    if not path.is_file():      # pip: the index and proxy settings this machine has
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                        f"horovod=={version}", "-d", str(cache)], check=True)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != entry["sha256"]:
        sys.exit(f"{path}: sha256 {digest} is not the catalog's {entry['sha256']}")
    return path


def unpack(stack: Stack, archive: Path, dest: Path, release: bool) -> Path:
    """The sdist unpacked into DEST with the source fixes envbuilder applies for STACK (the Release
    fix only when RELEASE; fixes by compiler flags, which concern other compilers, left out)."""
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="data")
    src = dest / f"horovod-{stack.spec.horovod.version}"
    for name, patch in patches(stack):
        if "replace" not in patch or (name == RELEASE_FIX and not release):
            continue
        old, new = patch["replace"]
        for rel in patch["files"]:
            f = src / rel
            text = f.read_text()
            if old not in text:
                sys.exit(f"{name}: {old!r} not in {f}")
            f.write_text(text.replace(old, new))
    return src


def one_build(stack: Stack, archive: Path, python: str, release: bool) -> dict:
    family = stack.spec.framework.family
    work = Path(tempfile.mkdtemp(prefix="envb-hvd-bench-"))
    try:
        src = unpack(stack, archive, work, release)
        env = dict(os.environ, **build_flags(stack))
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


def framework_version(python: str, stack: Stack) -> str:
    """The framework release PYTHON imports; it must be the preset's (the fixes depend on it)."""
    family, want = stack.spec.framework.family, stack.spec.framework.version
    out = subprocess.run([python, "-c", f"import {MODULE[family]} as m; print(m.__version__)"],
                         capture_output=True, text=True)
    if out.returncode != 0 or out.stdout.strip() != want:
        sys.exit(f"{python} does not import {MODULE[family]} {want} ({out.stdout.strip() or out.stderr.strip()[-300:]}); "
                 f"--python: an environment with recipes/{PRESET[family]}'s framework (bash .ci/setup makes "
                 "/opt/envbuilder-smoke-venv)")
    return want


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
    rows = []
    for family in args.frameworks.split(","):
        stack = preset_stack(family)
        version = framework_version(args.python, stack)
        archive = sdist(stack, cache)
        for _ in range(args.runs):
            for release in (False, True):
                row = one_build(stack, archive, args.python, release)
                row["version"] = version
                rows.append(row)
                print(f"{family} {row['build']}: {row['seconds']} s", file=sys.stderr)
    print("\n".join(table(rows)))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
