"""Real builds from a lock: two builds of the same lock (no build cache) give images with the same
files and the same package versions; a lock whose hash does not match the download fails the
build at that step, naming the entry (exit 1).

A small stack (torch from the wheelhouse, no MPI or Horovod) keeps the two uncached builds short."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import run_envbuilder
from infra import base_image, docker_cli, require_docker, wheelhouse
from test_lock import relock

CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
SPEC = """\
name: lock-repro
description: torch 2.13 (CPU) on Debian bookworm, for the reproducibility test
base: local/debian:bookworm-slim
framework: {name: pytorch, version: "2.13.0+cpu"}
python: "3.11"
targets: [docker]
"""
# What a rebuild may legitimately change, listed with their paths: nothing here is a package.
PROBE = r"""
set -e
find / -xdev \( -path /proc -o -path /sys -o -path /dev \) -prune -o -printf '%y %p\n' | LC_ALL=C sort > /tmp/files
/opt/venv/bin/python -m pip list --format=freeze --disable-pip-version-check | LC_ALL=C sort > /tmp/pip
dpkg-query -W -f='${Package} ${Version}\n' | LC_ALL=C sort > /tmp/dpkg
find / -xdev \( -path /proc -o -path /sys -o -path /dev \) -prune -o -type f -print0 | LC_ALL=C sort -z \
  | xargs -0 sha256sum > /tmp/sums 2>/dev/null || true
cat /tmp/files; echo @@PIP; cat /tmp/pip; echo @@DPKG; cat /tmp/dpkg; echo @@SUMS; cat /tmp/sums
"""


def docker(*args: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([docker_cli(), *args], capture_output=True, text=True, check=check, **kw)


@pytest.fixture(scope="module")
def locked(tmp_path_factory):
    require_docker()
    base_image()
    root = tmp_path_factory.mktemp("repro")
    spec = root / "spec.yaml"
    spec.write_text(SPEC)
    out = root / "out"
    r = run_envbuilder("lock", str(spec), "--out", str(out), "--wheelhouse", wheelhouse(), timeout=900)
    assert r.code == 0, r.err[-3000:]
    r = run_envbuilder("build", str(spec), "--no-build", "--out", str(out))
    assert r.code == 0, r.err[-3000:]
    return spec, out


def _build_uncached(out: Path, tag: str) -> None:
    from envbuilder.engines.context import stage_context

    files = {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    ctx = stage_context(out, files, wheelhouse())
    try:
        cmd = ["build", "--no-cache", "--progress=plain", "-t", tag]
        if Path(CA_BUNDLE).is_file():
            cmd += ["--secret", f"id=ca,src={CA_BUNDLE}"]
        for _ in range(2):     # BuildKit under load can drop the client session once: retry that only
            proc = docker(*cmd, str(ctx), check=False, env=dict(os.environ, DOCKER_BUILDKIT="1"))
            if proc.returncode == 0 or "no active session" not in proc.stdout + proc.stderr:
                break
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    finally:
        shutil.rmtree(ctx, ignore_errors=True)


def _probe(tag: str) -> dict:
    text = docker("run", "--rm", "--entrypoint", "sh", tag, "-c", PROBE).stdout
    files, rest = text.split("@@PIP\n", 1)
    pip, rest = rest.split("@@DPKG\n", 1)
    dpkg, sums = rest.split("@@SUMS\n", 1)
    return {"files": files.splitlines(), "pip": pip.splitlines(), "dpkg": dpkg.splitlines(),
            "sums": dict(reversed(l.split("  ", 1)) for l in sums.splitlines() if "  " in l)}


def test_two_builds_of_one_lock_have_the_same_files_and_versions(locked, tmp_path):
    _, out = locked
    tags = ["envbuilder-test/lock-repro:a", "envbuilder-test/lock-repro:b"]
    try:
        for tag in tags:
            _build_uncached(out, tag)
        a, b = (_probe(t) for t in tags)
        assert a["pip"] == b["pip"] and any(l.startswith("torch==2.13.0+cpu") for l in a["pip"])
        assert a["dpkg"] == b["dpkg"]
        assert a["files"] == b["files"]
        lock = json.loads((out / "envbuilder.lock").read_text())
        locked_pip = sorted(f"{e['name']}=={e['version']}".lower().replace("_", "-")
                            for g in lock["pip"].values() for e in g)
        assert sorted(l.lower().replace("_", "-") for l in a["pip"]) == locked_pip
        # the record for the README/report: how close the images come
        probe_own = {"/etc/hostname", "/etc/hosts", "/etc/resolv.conf", "/tmp/sums", "/tmp/files", "/tmp/pip",
                     "/tmp/dpkg"}                                   # written by `docker run`/the probe
        differ = sorted(p for p in a["sums"] if a["sums"][p] != b["sums"].get(p) and p not in probe_own)
        ids = [json.loads(docker("image", "inspect", t).stdout)[0] for t in tags]
        layers = [i["RootFS"]["Layers"] for i in ids]
        same_layers = sum(1 for x, y in zip(*layers) if x == y)
        report = {"image_ids_equal": ids[0]["Id"] == ids[1]["Id"], "layers": len(layers[0]),
                  "layers_equal": same_layers, "files": len(a["sums"]), "files_differing": len(differ),
                  "differing": differ[:40]}
        (Path(os.environ.get("ENVBUILDER_REPRO_REPORT", tmp_path / "repro.json"))).write_text(
            json.dumps(report, indent=2) + "\n")
        print(json.dumps(report, indent=2))
        # content: the same bytes in every file (hash-based .pyc from SOURCE_DATE_EPOCH, no logs)
        assert not differ, differ
    finally:
        for tag in tags:
            docker("rmi", "-f", tag, check=False)


def test_a_hash_that_does_not_match_the_download_fails_the_build_naming_the_entry(locked, tmp_path):
    spec, out = locked
    bad = tmp_path / "out"
    shutil.copytree(out, bad)

    def wrong_hash(lock):
        e = next(e for e in lock.pip["framework"] if e["name"] == "mpmath")
        e["sha256"] = "0" * 64
    relock(bad / "envbuilder.lock", wrong_hash)            # consistent lock, wrong hash
    args = ["build", str(spec), "--out", str(bad), "--wheelhouse", wheelhouse(), "--tag", "envbuilder-test/lock-bad:1"]
    if Path(CA_BUNDLE).is_file():
        args += ["--ca-bundle", CA_BUNDLE]
    r = run_envbuilder(*args, timeout=1800)
    docker("rmi", "-f", "envbuilder-test/lock-bad:1", check=False)
    assert r.code == 1, r.err[-3000:]
    assert "docker build: step failed" in r.err
    assert "lock: pip: mpmath==1.3.0: the download mpmath-1.3.0-py3-none-any.whl does not match the sha256 " \
           "in envbuilder.lock" in r.err
    assert "Traceback" not in r.err
