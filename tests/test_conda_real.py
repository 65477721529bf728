"""Conda packages for real: a local channel of real conda packages (built here with rattler-build's
`assemble_package`, indexed with py-rattler), solved by `envbuilder lock` (py-rattler), fetched
and hash-checked by `envbuilder build`, installed offline in the image by py-rattler from PyPI,
and checked by `envbuilder verify` (versions.conda, from the image's /opt/conda/conda-meta).

conda-forge cannot be reached from these machines: the channel is a `file://` folder, the way a
site points at its mirror (ENVBUILDER_CONDA_CHANNEL; docs/lock.md)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import RECIPES, ROOT, run_envbuilder
from infra import base_image, docker_cli, long_build, require_docker, wheelhouse

CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
HELLO = "envbuilder-conda-hello"
GREETING = "envbuilder-conda-greeting"
TAG = "envbuilder-test/conda-real:1"


_MAKE_CHANNEL = """
import asyncio, os, sys
from pathlib import Path
import rattler_build
from rattler.index.index import index_fs
root, hello_name, greeting_name = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
channel = root / "channel"
(channel / "noarch").mkdir(parents=True)
(channel / "linux-64").mkdir()
greet = root / "src-greeting" / "share" / "envbuilder-conda"
greet.mkdir(parents=True)
(greet / "greeting.txt").write_text("hello from a conda package\\n")
hello = root / "src-hello" / "bin"
hello.mkdir(parents=True)
prog = hello / hello_name
prog.write_text('#!/bin/sh\\nhere=$(dirname "$(readlink -f "$0")")\\n'
                'cat "$here/../share/envbuilder-conda/greeting.txt"\\n')
prog.chmod(0o755)
rattler_build.assemble_package(name=greeting_name, version="1.2", target_platform="noarch", build_string="0",
                               output_dir=channel / "noarch", files_dir=greet.parent.parent, noarch="generic")
rattler_build.assemble_package(name=hello_name, version="1.0", target_platform="noarch", build_string="0",
                               output_dir=channel / "noarch", files_dir=hello.parent, noarch="generic",
                               depends=[greeting_name + " >=1.2"])
asyncio.run(index_fs(channel))
sys.stdout.flush()
os._exit(0)   # py-rattler's runtime threads can crash the interpreter as it exits
"""


def make_channel(root: Path) -> Path:
    """Two real noarch packages: HELLO (a program, bin/envbuilder-conda-hello) depends on GREETING
    (a data file it prints); indexed as a channel. Made in a process of its own (py-rattler 0.28 can
    crash an interpreter as it exits: lock/rattler_solve.py)."""
    proc = subprocess.run([sys.executable, "-c", _MAKE_CHANNEL, str(root), HELLO, GREETING],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return root / "channel"


@pytest.fixture(scope="module")
def channel(tmp_path_factory) -> Path:
    pytest.importorskip("rattler_build")
    return make_channel(tmp_path_factory.mktemp("conda"))


def _sha(path: Path) -> str:
    import hashlib
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --- without an engine: solve, fetch, install on the host ----------------------------------------

def test_py_rattler_locks_a_local_channel_in_conda_locks_format(channel):
    from envbuilder.lock import conda as conda_

    lockfile, version = conda_.resolve([f"{HELLO}>=1.0"], [f"file://{channel}"])
    assert version == "0.28.0"
    pkgs = {p["name"]: p for p in lockfile["package"]}
    assert set(pkgs) == {HELLO, GREETING}                        # the dependency is solved in
    for p in pkgs.values():
        f = channel / "noarch" / p["url"].rsplit("/", 1)[-1]
        assert p["url"] == f"file://{channel}/noarch/{f.name}"
        assert p["hash"]["sha256"] == _sha(f) and len(p["hash"]["md5"]) == 32
        assert p["manager"] == "conda" and p["platform"] == "linux-64"
    assert pkgs[HELLO]["dependencies"] == {GREETING: ">=1.2"}
    assert lockfile["version"] == 1 and lockfile["metadata"]["platforms"] == ["linux-64"]
    # an unknown package: one message naming it and the channel, exit 1 (a failed step)
    from envbuilder.errors import CheckFailed
    with pytest.raises(CheckFailed) as exc:
        conda_.resolve(["no-such-package"], [f"file://{channel}"])
    assert "no-such-package" in exc.value.reason and str(channel) in exc.value.reason


def test_fetched_packages_install_offline_and_conda_meta_proves_it(channel, tmp_path):
    from envbuilder.lock import conda as conda_
    from envbuilder.smoke.static import check_conda_packages

    lockfile, _ = conda_.resolve([f"{HELLO}==1.0"], [f"file://{channel}"])
    folder = tmp_path / "out"
    assert sorted(conda_.fetch(lockfile["package"], folder)) == sorted(
        p["url"].rsplit("/", 1)[-1] for p in lockfile["package"])
    assert conda_.fetch(lockfile["package"], folder) == []         # kept: the hash matches
    pins = conda_.pins_files(lockfile)
    for name, data in pins.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    prefix = tmp_path / "prefix"
    proc = subprocess.run([sys.executable, str(folder / "pins/conda-install.py"), str(folder / "pins/conda-packages.json"),
                           str(folder / "conda-pkgs"), str(prefix), str(tmp_path / "work")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert subprocess.run([str(prefix / "bin" / HELLO)], capture_output=True, text=True).stdout == \
        "hello from a conda package\n"
    records = {json.loads(p.read_text())["name"]: json.loads(p.read_text()) for p in (prefix / "conda-meta").glob("*.json")}
    assert set(records) == {HELLO, GREETING}
    assert records[HELLO]["sha256"] == next(p["hash"]["sha256"] for p in lockfile["package"] if p["name"] == HELLO)
    expect = {"conda": {HELLO: "1.0", GREETING: "1.2"}}
    assert check_conda_packages(expect, str(prefix))["status"] == "pass"
    drift = check_conda_packages({"conda": {HELLO: "1.1", GREETING: "1.2"}}, str(prefix))
    assert drift["status"] == "fail" and "envbuilder-conda-hello 1.0 installed, lock has 1.1" in drift["detail"]
    # the in-image installer refuses a file whose hash differs, before installing anything
    pkg = next((folder / "conda-pkgs").glob(f"{HELLO}-*"))
    pkg.write_bytes(pkg.read_bytes() + b"x")
    proc = subprocess.run([sys.executable, str(folder / "pins/conda-install.py"), str(folder / "pins/conda-packages.json"),
                           str(folder / "conda-pkgs"), str(tmp_path / "p2"), str(tmp_path / "w2")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and f"conda: {HELLO} 1.0:" in proc.stderr and "the lock has" in proc.stderr
    assert not (tmp_path / "p2").exists()


def test_a_package_whose_hash_differs_from_the_lock_is_refused_naming_it_and_the_fix(channel, tmp_path):
    from envbuilder.errors import CheckFailed
    from envbuilder.lock import conda as conda_

    chan = tmp_path / "channel"
    shutil.copytree(channel, chan)
    lockfile, _ = conda_.resolve([f"{HELLO}==1.0"], [f"file://{chan}"])
    pkg = next((chan / "noarch").glob(f"{HELLO}-*.conda"))
    pkg.write_bytes(pkg.read_bytes() + b"republished")
    with pytest.raises(CheckFailed) as exc:
        conda_.fetch(lockfile["package"], tmp_path / "out")
    assert exc.value.field == f"conda: {HELLO} 1.0"
    assert "the lock has" in exc.value.reason and f"envbuilder lock SPEC --update {HELLO}" in exc.value.fix
    assert not list((tmp_path / "out" / "conda-pkgs").glob(f"{HELLO}-*"))       # nothing half-written kept


# --- lock -> build (Docker) -> verify --------------------------------------------------------------

def conda_spec(tmp_path: Path) -> Path:
    """The cpu-torch preset (its layers are the suite's most built) with one conda package."""
    spec = tmp_path / "conda.yaml"
    spec.write_text((RECIPES / "cpu-torch-horovod.yaml").read_text().replace(
        "horovod: {version", f"packages: {{conda: [\"{HELLO}>=1.0\"]}}\nhorovod: {{version"))
    return spec


@long_build
def test_lock_build_verify_with_a_conda_package_used_in_the_image(channel, tmp_path):
    """The cpu-torch preset + one conda package: 2 min or more on 2 cores when the preset's layers
    are not cached (Horovod's compile), so it runs with ENVBUILDER_LONG_BUILDS=1."""
    require_docker()
    base_image()
    spec = conda_spec(tmp_path)
    out = tmp_path / "out"
    env = dict(os.environ, ENVBUILDER_CONDA_CHANNEL=f"file://{channel}")
    r = run_envbuilder("lock", str(spec), "--out", str(out), "--wheelhouse", wheelhouse(), "--json",
                       env=env, timeout=900)
    assert r.code == 0, r.err[-3000:]
    assert json.loads(r.out)["counts"]["conda"] == 2
    lock = json.loads((out / "envbuilder.lock").read_text())
    assert {p["name"] for p in lock["conda"]["lockfile"]["package"]} == {HELLO, GREETING}
    assert lock["resolvers"]["conda"] == "py-rattler 0.28.0"
    assert any(e["name"] == "py-rattler" for e in lock["pip"]["build"])
    args = ["build", str(spec), "--out", str(out), "--wheelhouse", wheelhouse(), "--tag", TAG, "--json"]
    if Path(CA_BUNDLE).is_file():
        args += ["--ca-bundle", CA_BUNDLE]
    try:
        r = run_envbuilder(*args, env=env, timeout=1800)
        assert r.code == 0, r.err[-3000:]
        assert sorted(p.name for p in (out / "conda-pkgs").iterdir()) == sorted(
            p["url"].rsplit("/", 1)[-1] for p in lock["conda"]["lockfile"]["package"])
        docker = (out / "Dockerfile").read_text()
        assert "pins/conda-install.py /pins/conda-packages.json /conda-pkgs /opt/conda" in docker
        assert "micromamba" not in docker and "COPY --from=devel /opt/conda /opt/conda" in docker
        run = subprocess.run([docker_cli(), "run", "--rm", TAG, HELLO], capture_output=True, text=True, timeout=120)
        assert run.stdout == "hello from a conda package\n", run.stderr
        meta = subprocess.run([docker_cli(), "run", "--rm", "--entrypoint", "ls", TAG, "/opt/conda/conda-meta"],
                              capture_output=True, text=True, timeout=120).stdout.split()
        assert sorted(m for m in meta if m.endswith(".json")) == [f"{GREETING}-1.2-0.json", f"{HELLO}-1.0-0.json"]
        r = run_envbuilder("verify", str(out), "--image", TAG, "--ranks", "2", "--json", timeout=600)
        report = json.loads(r.out)
        checks = {c["name"]: c for c in report["checks"]}
        assert checks["versions.conda"]["status"] == "pass", checks["versions.conda"]
        assert "2 conda packages as locked" in checks["versions.conda"]["detail"]
        assert r.code == 0, r.out[-3000:]
        # the channel republishes the package with other bytes: the build refuses it, naming it
        bad_chan = tmp_path / "moved"
        shutil.copytree(channel, bad_chan)
        shutil.rmtree(out / "conda-pkgs")
        pkg = next((channel / "noarch").glob(f"{HELLO}-*.conda"))
        (bad_chan / "noarch" / pkg.name).write_bytes(pkg.read_bytes() + b"republished")
        r = _build_with_lock_moved_to(out, str(channel), str(bad_chan), [a for a in args if a != "--json"])
        assert r.code == 1, r.err[-3000:]
        assert f"conda: {HELLO} 1.0" in r.err and "the lock has" in r.err and "docker build" not in r.err
        assert f"envbuilder lock SPEC --update {HELLO}" in r.err and "Traceback" not in r.err
    finally:
        subprocess.run([docker_cli(), "rmi", "-f", TAG], capture_output=True, check=False)


def _build_with_lock_moved_to(out: Path, old: str, new: str, args: list[str]):
    """The same lock with its conda urls pointing at NEW (a mirror whose file differs), sealed again
    as `envbuilder lock` would write it: only the download differs."""
    from envbuilder.lock.model import dump, load

    path = out / "envbuilder.lock"
    lock = load(path)
    for p in lock.conda["lockfile"]["package"]:
        p["url"] = p["url"].replace(f"file://{old}", f"file://{new}")
    path.write_text(dump(lock))
    return run_envbuilder(*args, timeout=600)


def test_a_channel_that_is_not_one_is_refused_naming_the_variable(tmp_path):
    spec = conda_spec(tmp_path)
    for bad in ("https://user:secret@mirror.example/conda", "ftp://mirror/x", "a b", "$(id)"):
        r = run_envbuilder("lock", str(spec), "--out", str(tmp_path / "o"),
                           env=dict(os.environ, ENVBUILDER_CONDA_CHANNEL=bad))
        assert r.code == 2, (bad, r.err)
        assert "ENVBUILDER_CONDA_CHANNEL" in r.err and "is not a conda channel" in r.err and "Traceback" not in r.err
        assert "secret" not in r.err
        assert not (tmp_path / "o").exists()


def test_the_spec_names_its_channels_and_the_sites_variable_replaces_them(channel, tmp_path, monkeypatch):
    from envbuilder.needs import needs
    from envbuilder.spec.model import load_spec
    from envbuilder.stack import resolve

    spec = conda_spec(tmp_path)
    spec.write_text(spec.read_text().replace("packages: {conda:", f"packages: {{conda_channels: [\"file://{channel}\"], conda:"))
    monkeypatch.delenv("ENVBUILDER_CONDA_CHANNEL", raising=False)
    assert needs(resolve(load_spec(str(spec))))["conda"]["channels"] == [f"file://{channel}"]
    monkeypatch.setenv("ENVBUILDER_CONDA_CHANNEL", "https://mirror.example/conda-forge")
    assert needs(resolve(load_spec(str(spec))))["conda"]["channels"] == ["https://mirror.example/conda-forge"]
    monkeypatch.delenv("ENVBUILDER_CONDA_CHANNEL")
    spec.write_text(spec.read_text().replace(f"file://{channel}", "ftp://x/$(id)"))
    r = run_envbuilder("check", str(spec))
    assert r.code == 2 and "packages.conda_channels[0]" in r.err and "is not a conda channel" in r.err, r.err


def test_the_shipped_installer_is_the_module_in_the_package():
    from envbuilder.lock import conda as conda_

    assert conda_.SCRIPT == ROOT / "envbuilder" / "lock" / "conda_install.py"
    assert b"import subprocess" not in conda_.SCRIPT.read_bytes()      # reads data only, runs nothing
