"""aarch64 presets against their x86_64 twins (issue 37 item 2): build seconds, image size, and
the wall time of `envbuilder verify --ranks 2` (docker runtime; the aarch64 image runs under
qemu-user through binfmt_misc). Prints one JSON line per recipe and the machine's load.

    python bench/aarch64_twins.py [--no-cache] [--verify-only] RECIPE [RECIPE ...]
    python bench/aarch64_twins.py --no-cache cpu-torch-ddp cpu-torch-ddp-aarch64

--no-cache adds `--no-cache` to envbuilder's `docker build` (a cold build of every step; the
base image stays), so the figures do not depend on what the engine's cache holds. A recipe that
names the torch +cpu wheel (`2.13.0+cpu`, x86_64) gets the tests' wheelhouse (pip's find-links).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CA = "/etc/ssl/certs/ca-certificates.crt"
NO_CACHE_HOOK = ("import sys, envbuilder.engines.docker as d; f = d.docker_build_command; "
                 "d.docker_build_command = lambda *a, **k: (lambda c: c[:-1] + ['--no-cache', c[-1]])(f(*a, **k)); "
                 "from envbuilder.cli import main; sys.exit(main(sys.argv[1:]))")


def envbuilder(*args: str, no_cache: bool = False) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    head = [sys.executable, "-c", NO_CACHE_HOOK] if no_cache else [sys.executable, "-m", "envbuilder"]
    return subprocess.run([*head, *args], cwd=ROOT, env=env, capture_output=True, text=True)


def docker_inspect(tag: str, fmt: str) -> str:
    return subprocess.run(["docker", "image", "inspect", "--format", fmt, tag], capture_output=True,
                          text=True).stdout.strip()


def one(recipe: str, no_cache: bool, verify_only: bool, work: Path) -> dict:
    spec = ROOT / "recipes" / f"{recipe}.yaml"
    out = work / recipe
    tag = f"envbuilder-bench/{recipe}:twins"
    args = ["build", str(spec), "--out", str(out), "--ca-bundle", CA, "--tag", tag]
    if "+cpu" in spec.read_text():
        sys.path.insert(0, str(ROOT / "tests"))
        from infra import wheelhouse
        args += ["--wheelhouse", wheelhouse()]
    row: dict = {"recipe": recipe, "no_cache": no_cache}
    if verify_only:
        args.append("--no-build")
    t0 = time.time()
    r = envbuilder(*args, no_cache=no_cache and not verify_only)
    row["build_s"] = None if verify_only else round(time.time() - t0, 1)
    if r.returncode != 0:
        row["error"] = r.stderr[-1500:]
        return row
    if verify_only:
        tag = json.loads((out / "manifest.json").read_text()).get("image", {}).get("tag") or tag
    row["architecture"] = docker_inspect(tag, "{{.Architecture}}")
    row["image_mb"] = round(int(docker_inspect(tag, "{{.Size}}") or 0) / 1e6, 1)
    report = out / "report.json"
    t0 = time.time()
    r = envbuilder("verify", str(out), "--image", tag, "--runtime", "docker", "--ranks", "2", "--report", str(report))
    row["verify_s"] = round(time.time() - t0, 1)
    row["verify_rc"] = r.returncode
    if report.exists():
        checks = {c["name"]: c for c in json.loads(report.read_text())["checks"]}
        row["versions.arch"] = checks.get("versions.arch", {}).get("figure")
        row["passed"] = sum(c["status"] == "pass" for c in checks.values())
        row["failed"] = sum(c["status"] == "fail" for c in checks.values())
    row["load"] = os.getloadavg()[0]
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("recipes", nargs="+")
    p.add_argument("--no-cache", action="store_true")
    p.add_argument("--verify-only", action="store_true", help="the image exists: time verify only")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="aarch64-twins-"))
    for recipe in args.recipes:
        print(json.dumps(one(recipe, args.no_cache, args.verify_only, work)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
