"""envbuilder as a user installs it (issue 46 item 1): the wheel and sdist built by `python -m build`
from the checkout's tracked files, the wheel installed into a fresh venv outside the clone (and
by `pipx install`), then run in an empty folder with PATH=/usr/sbin:/usr/bin:/sbin:/bin and an
empty HOME, nothing else: the presets and site profiles it ships, a preset built by name, the
messages of a name that is no preset, and the README's main job: a CPU preset built by name through
the machine's registry mirror and verified with 2 ranks (docs/install.md)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
import yaml

import infra
from conftest import ROOT, RECIPES
from envbuilder import __version__

BARE_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
# the CA bundle of this machine's TLS-intercepting proxy: what a site behind one hands pip
# (PIP_CERT, as docs/install.md says), and nothing else of this machine's pip set-up
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
PRESETS = sorted(p.stem for p in RECIPES.glob("*.yaml"))
SITES = sorted(p.stem for p in (ROOT / "sites").glob("*.yaml"))


def bare_env(home: Path, **extra: str) -> dict:
    env = {"PATH": BARE_PATH, "HOME": str(home)}
    env.update(extra)
    return env


def pip_env(home: Path, **extra: str) -> dict:
    return bare_env(home, **({"PIP_CERT": str(CA_BUNDLE)} if CA_BUNDLE.is_file() else {}), **extra)


def run(argv, *, cwd: Path, env: dict, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> dict:
    """`python -m build` of a copy of the tracked files: the sdist, then the wheel built from it."""
    top = tmp_path_factory.mktemp("dist")
    src = top / "src"
    files = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, check=True).stdout
    for name in filter(None, files.decode().split("\0")):
        path = ROOT / name
        if path.is_file() and not path.is_symlink():        # a file deleted but not yet committed: left out
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, src / name)
    out = top / "out"
    r = subprocess.run([sys.executable, "-m", "build", "--outdir", str(out), str(src)], capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    wheels, sdists = list(out.glob("*.whl")), list(out.glob("*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, list(out.iterdir())
    return {"wheel": wheels[0], "sdist": sdists[0], "log": r.stdout + r.stderr, "top": top}


@pytest.fixture(scope="module")
def installed(dist, tmp_path_factory) -> Path:
    """The wheel pip-installed into a fresh venv outside the clone; its bin/ folder."""
    top = tmp_path_factory.mktemp("venv")
    python3 = shutil.which("python3", path=BARE_PATH)
    assert python3, f"python3 on {BARE_PATH} (Debian: python3 python3-venv)"
    venv = top / "venv"
    r = run([python3, "-m", "venv", venv], cwd=top, env=bare_env(top / "home"))
    assert r.returncode == 0, r.stderr
    r = run([venv / "bin" / "pip", "install", "-q", dist["wheel"]], cwd=top, env=pip_env(top / "home"), timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert not str(venv).startswith(str(ROOT))
    return venv / "bin"


@pytest.fixture
def user(tmp_path):
    """An empty working folder and an empty HOME; `user(bin, *args)` runs envbuilder there."""
    cwd, home = tmp_path / "work", tmp_path / "home"
    cwd.mkdir()
    home.mkdir()

    def _run(bindir: Path, *args: str, timeout: int = 300):
        r = run([bindir / "envbuilder", *args], cwd=cwd, env=bare_env(home), timeout=timeout)
        assert "Traceback" not in r.stderr, r.stderr
        return r
    _run.cwd = cwd          # type: ignore[attr-defined]
    return _run


def test_sdist_holds_recipes_and_sites_and_its_wheel_the_presets(dist):
    top = f"envbuilder-{__version__}"
    with tarfile.open(dist["sdist"]) as tar:
        names = set(tar.getnames())
    assert {f"{top}/recipes/{n}.yaml" for n in PRESETS} <= names
    assert {f"{top}/sites/{n}.yaml" for n in SITES} <= names
    assert f"{top}/setup.py" in names
    assert "Building wheel from sdist" in dist["log"], dist["log"][-2000:]       # the wheel is the sdist's
    with zipfile.ZipFile(dist["wheel"]) as whl:
        members = set(whl.namelist())
        assert whl.read("envbuilder/presets/cpu-torch-ddp.yaml") == (RECIPES / "cpu-torch-ddp.yaml").read_bytes()
    assert {f"envbuilder/presets/{n}.yaml" for n in PRESETS} <= members
    assert {f"envbuilder/sites/{n}.yaml" for n in SITES} <= members
    assert "envbuilder/compat/catalog.yaml" in members
    assert not [m for m in members if m.startswith(("recipes/", "sites/", "images/", "tests/"))]


def test_version(installed, user):
    r = user(installed, "--version")
    assert r.returncode == 0 and r.stdout.strip() == f"envbuilder {__version__}", r.stdout + r.stderr


def test_presets_lists_every_preset_from_the_installed_package(installed, user):
    r = user(installed, "presets")
    assert r.returncode == 0, r.stderr
    listed = sorted(line.split()[0] for line in r.stdout.splitlines() if line and not line[0].isspace()
                    and not line.startswith(f"{len(PRESETS)} presets"))
    assert listed == PRESETS
    rows = json.loads(user(installed, "presets", "--json").stdout)
    assert sorted(row["name"] for row in rows) == PRESETS
    venv = installed.parent
    assert all(Path(row["path"]).is_relative_to(venv) for row in rows), rows[0]["path"]   # the shipped copy


def test_build_a_preset_by_name(installed, user):
    from dockerfile_parse import DockerfileParser

    r = user(installed, "build", "torch-horovod-pypi", "--no-build")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "using preset torch-horovod-pypi (envbuilder's recipes/torch-horovod-pypi.yaml" in r.stderr
    folder = user.cwd / "images" / "torch-horovod-pypi"
    assert {"Dockerfile", "Apptainer.def", "job.sbatch", "manifest.json"} <= {p.name for p in folder.iterdir()}
    base = yaml.safe_load((RECIPES / "torch-horovod-pypi.yaml").read_text())["base"]
    parser = DockerfileParser(path=str(folder / "Dockerfile"))
    froms = [i["value"].split()[0] for i in parser.structure if i["instruction"] == "FROM"]
    assert froms and froms[0].split("@")[0] == base, froms
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["name"] == "torch-horovod-pypi" and manifest["envbuilder"] == __version__


def test_sites_lists_the_shipped_profiles(installed, user):
    r = user(installed, "sites")
    assert r.returncode == 0, r.stderr
    assert sorted(line.split()[0] for line in r.stdout.splitlines()[:-1]) == SITES
    data = json.loads(user(installed, "sites", "--json").stdout)
    assert data["ok"] and sorted(s["name"] for s in data["sites"]) == SITES
    assert {s["where"] for s in data["sites"]} == {"envbuilder's sites/"}
    assert all(Path(s["path"]).is_relative_to(installed.parent) for s in data["sites"])
    assert next(s for s in data["sites"] if s["name"] == "example-gpu")["description"]


def test_a_name_that_is_no_preset(installed, user):
    r = user(installed, "build", "nosuchpreset", "--no-build")
    assert r.returncode == 2
    assert "spec: no such file or preset: 'nosuchpreset'" in r.stderr and "envbuilder presets" in r.stderr, r.stderr
    r = user(installed, "build", "cpu-torch-dd", "--no-build")
    assert r.returncode == 2
    assert "close presets: cpu-torch-ddp" in r.stderr, r.stderr
    assert list(user.cwd.iterdir()) == []           # nothing written


def test_init_a_preset_then_check_it(installed, user):
    r = user(installed, "init", "--preset", "cpu-torch-ddp", "-o", "my.yaml")
    assert r.returncode == 0, r.stderr
    mine = user.cwd / "my.yaml"
    assert mine.read_text() == (RECIPES / "cpu-torch-ddp.yaml").read_text()
    r = user(installed, "check", "my.yaml")
    assert r.returncode == 0 and r.stdout.startswith("my.yaml: ok"), r.stdout + r.stderr
    mine.write_text(mine.read_text() + "# my edit\n")
    r = user(installed, "init", "--preset", "cpu-torch-ddp", "-o", "my.yaml")
    assert r.returncode == 2 and "--force" in r.stderr, r.stderr
    assert mine.read_text().endswith("# my edit\n")


def test_pipx_install(dist, tmp_path, user):
    """docs/install.md's `pipx install`: Debian 12's pipx, its venvs and commands under tmp."""
    pipx = infra.require_binary("pipx")
    home = tmp_path / "pipx-user"
    home.mkdir()
    pipx_env = pip_env(home, PIPX_HOME=str(tmp_path / "pipx"), PIPX_BIN_DIR=str(tmp_path / "pipx-bin"))
    r = run([pipx, "install", dist["wheel"]], cwd=tmp_path, env=pipx_env, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    r = user(tmp_path / "pipx-bin", "presets", "--json")
    assert r.returncode == 0, r.stderr
    assert sorted(row["name"] for row in json.loads(r.stdout)) == PRESETS
    assert user(tmp_path / "pipx-bin", "--version").stdout.strip() == f"envbuilder {__version__}"


def test_a_preset_built_by_name_through_the_mirror_and_verified_with_two_ranks(installed, user):
    """The README's main job, from the installed wheel with a bare PATH and an empty HOME: a CPU
    preset built by name on Docker, its public base (debian:bookworm-slim) pulled through the
    registry mirror the machine's site config names (/etc/envbuilder/config.toml, with the
    wheelhouse and the CA bundle: .ci/mirror-bases.sh), then verified with 2 ranks."""
    infra.require_docker()
    tag = "envbuilder-test/install-ddp:1"           # its own tag: other modules build cpu-torch-ddp's
    try:
        r = user(installed, "build", "cpu-torch-ddp", "--tag", tag, timeout=2400)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        assert "using preset cpu-torch-ddp" in r.stderr
        folder = user.cwd / "images" / "cpu-torch-ddp"
        lock = json.loads((folder / "envbuilder.lock").read_text())
        base = lock["base"]["runtime"]
        assert base["ref"] == "debian:bookworm-slim" and base["kind"] == "repo-digest", base
        assert base["pinned"] == f"debian:bookworm-slim@{base['manifest_digest']}", base
        assert lock["generated_by"] == f"envbuilder {__version__}"
        v = user(installed, "verify", str(folder), "--ranks", "2", timeout=900)
        assert v.returncode == 0, v.stdout[-3000:] + v.stderr[-3000:]
        assert re.search(rf"^OK: cpu-torch-ddp \(docker {re.escape(tag)}\): \d+ passed, 0 failed", v.stdout, re.M), v.stdout
    finally:
        subprocess.run([infra.docker_cli(), "rmi", "-f", tag], capture_output=True)


def test_doctor_from_the_installed_wheel_reports_this_machines_engines_and_slurm(installed, user):
    infra.require_docker()
    infra.require_slurm()
    r = user(installed, "doctor", "--json", timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    checks = {c["name"]: c for c in json.loads(r.stdout)["checks"]}
    assert checks["docker"]["status"] == "ok" and checks["slurm"]["status"] == "ok", checks
    assert checks["registry"]["status"] == "ok", checks["registry"]
