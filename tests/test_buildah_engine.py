"""The daemonless engine (envbuilder/engines/buildah.py) on the real buildah and podman.

One lock of a CPU torch stack (torch 2.13.0+cpu from the wheelhouse, no Horovod: its compile
would cost ~9 min here) is built twice without cache by `--check-reproducible`: the two image
digests must be equal. That image is handed to Docker and verified with 2 ranks; the CA bundle
and the wheels must not be in any layer. (A non-root user builds the same stack rootless with
podman in tests/test_login_node.py, and makes its SIF from the OCI archive there: the same code.) Bad input (no engine, full storage, a base image nowhere) gives one message and exit 1.

Every test uses its own container storage (CONTAINERS_STORAGE_CONF) and removes it at the end.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from conftest import RECIPES, run_envbuilder
from infra import base_image, docker_cli, require_binary, require_docker, wheelhouse

CA_MARKER = "envbuilder-buildah-ca-marker-5d21e0"
TAG = "localhost/envbuilder-buildah-test/cpu-torch:repro"
ROOTLESS_USER = "ebbuildah"


def cpu_torch_spec(folder: Path, name: str = "cpu-torch-buildah", base: str | None = None) -> Path:
    """recipes/cpu-torch-horovod.yaml without Horovod (and optionally another base image)."""
    text = (RECIPES / "cpu-torch-horovod.yaml").read_text()
    text = re.sub(r"^horovod:.*\n", "", text, flags=re.M)
    text = re.sub(r"^name: .*$", f"name: {name}", text, flags=re.M)
    text = text.replace(" + Horovod (MPI, Gloo)", "")
    if base:
        text = re.sub(r"^base: .*$", f"base: {base}\nbase_os: debian-bookworm", text, flags=re.M)
    path = folder / f"{name}.yaml"
    path.write_text(text)
    return path


def storage(folder: Path, driver: str = "overlay") -> dict:
    """An environment whose buildah/podman keep images under FOLDER (removed by clean_storage)."""
    conf = folder / "storage.conf"
    conf.write_text(f'[storage]\ndriver = "{driver}"\ngraphroot = "{folder}/graph"\nrunroot = "{folder}/run"\n')
    return {"CONTAINERS_STORAGE_CONF": str(conf)}


def clean_storage(env: dict, engine: str = "buildah") -> None:
    full = dict(os.environ, **env)
    subprocess.run([engine, "rm", "--all"], env=full, capture_output=True)
    subprocess.run([engine, "rmi", "--all", "--force"], env=full, capture_output=True)
    root = Path(env["CONTAINERS_STORAGE_CONF"]).parent
    subprocess.run(["umount", "-R", str(root / "graph" / "overlay")], capture_output=True)
    shutil.rmtree(root / "graph", ignore_errors=True)


def lock(spec: Path, out: Path) -> None:
    r = run_envbuilder("lock", str(spec), "--out", str(out), "--wheelhouse", wheelhouse(), timeout=900)
    assert r.code == 0, r.err[-2000:]
    r = run_envbuilder("build", str(spec), "--out", str(out), "--no-build")
    assert r.code == 0, r.err[-2000:]


@pytest.fixture(scope="module")
def ca_bundle(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("ca") / "ca.pem"
    path.write_text(Path("/etc/ssl/certs/ca-certificates.crt").read_text() + f"\n# {CA_MARKER}\n")
    return path


@pytest.fixture(scope="module")
def locked(tmp_path_factory):
    """A locked output folder of the CPU torch stack (the lock needs the Docker engine)."""
    require_docker()
    base_image()
    require_binary("buildah", "run .ci/install-system.sh")
    root = tmp_path_factory.mktemp("buildah-lock")
    spec = cpu_torch_spec(root)
    out = root / "out"
    lock(spec, out)
    return spec, out


@pytest.fixture(scope="module")
def repro(tmp_path_factory, locked, ca_bundle):
    """`build --engine buildah --check-reproducible`: two cold builds of one lock."""
    spec, locked_out = locked
    root = tmp_path_factory.mktemp("buildah-repro")
    env = storage(root)
    out = root / "out"
    shutil.copytree(locked_out, out)
    r = run_envbuilder("build", str(spec), "--out", str(out), "--engine", "buildah", "--tag", TAG,
                       "--check-reproducible", "--export", "docker", "--export", "oci-archive",
                       "--wheelhouse", wheelhouse(), "--ca-bundle", str(ca_bundle), env=env, timeout=2400)
    yield out, r, env
    subprocess.run([docker_cli(), "rmi", "-f", TAG], capture_output=True)
    clean_storage(env)


def test_two_cold_builds_of_one_lock_give_one_digest(repro):
    out, r, _ = repro
    assert r.code == 0, r.out[-2000:] + r.err[-3000:]
    digests = re.findall(r"digest (sha256:[0-9a-f]{64})", r.out)
    assert len(digests) == 2, r.out
    assert digests[0] == digests[1]
    assert "bit-identical" in r.out
    record = json.loads((out / "image.json").read_text())
    assert record["engine"] == "buildah" and record["digest"] == digests[0]
    assert record["reproducible"]["identical"] is True
    # every file time and the creation date are the lock's own date, not the wall clock
    lock_date = json.loads((out / "envbuilder.lock").read_text())["resolved_at"]
    assert record["created"].startswith(lock_date.rstrip("Z"))
    # progress and the full log as with Docker
    assert re.search(r"\[2/2 \d+/\d+\] RUN", r.err)
    log = (out / "build.log").read_text()
    assert "--timestamp" in log and "Successfully installed" in log


def test_image_handed_to_docker_is_the_same_image(repro):
    out, r, _ = repro
    assert r.code == 0
    record = json.loads((out / "image.json").read_text())
    docker = json.loads(subprocess.run([docker_cli(), "image", "inspect", TAG], capture_output=True, text=True,
                                       check=True).stdout)[0]
    # Docker converts the config to its own format: the same layers, recorded under Docker's ID
    assert docker["RootFS"]["Layers"] == record["layers"]
    assert docker["Id"] == record["docker_id"]
    assert docker["Created"].startswith(record["created"].rstrip("Z"))


def test_oci_archive_is_what_apptainer_takes(repro):
    out, r, _ = repro
    assert r.code == 0
    archive = out / "image.oci.tar"
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
        assert {"oci-layout", "index.json"} <= names
        index = json.load(tar.extractfile("index.json"))
    assert index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"] == TAG
    # the archive holds the image's own config: the same ID as in buildah's storage
    record = json.loads((out / "image.json").read_text())
    assert f"blobs/sha256/{record['id'].split(':')[1]}" in names
    assert not list(out.glob("*.part"))


def test_sif_with_the_apptainer_engine_is_refused(locked, tmp_path):
    spec, locked_out = locked
    out = tmp_path / "out"
    shutil.copytree(locked_out, out)
    before = {n: (out / n).read_text() for n in ("envbuilder.lock", "Dockerfile")}
    r = run_envbuilder("build", str(spec), "--out", str(out), "--engine", "apptainer", "--sif")
    assert r.code == 2 and "Traceback" not in r.err, r.err
    assert "--sif" in r.err and "apptainer build" in r.err and "--engine docker, buildah or podman" in r.err
    assert {n: (out / n).read_text() for n in before} == before


def test_ca_bundle_and_wheelhouse_stay_out_of_the_layers(repro):
    out, r, env = repro
    assert r.code == 0
    history = subprocess.run(["buildah", "inspect", "--type", "image", TAG], capture_output=True, text=True,
                             env=dict(os.environ, **env), check=True).stdout
    assert CA_MARKER not in history
    # every byte of every layer (uncompressed, as Docker saves it), deleted files included
    save = subprocess.Popen([docker_cli(), "save", TAG], stdout=subprocess.PIPE)
    found = subprocess.run(["grep", "-a", "-c", CA_MARKER], stdin=save.stdout, capture_output=True, text=True)
    save.wait()
    assert save.returncode == 0
    assert found.stdout.strip() == "0", "the CA bundle ended up in a layer"
    probe = subprocess.run([docker_cli(), "run", "--rm", "--entrypoint", "sh", TAG, "-c",
                            "ls -d /wheelhouse /run/secrets/ca /var/log/apt 2>&1; "
                            "find / -xdev -name '*.whl' 2>/dev/null; true"], capture_output=True, text=True).stdout
    assert "'/wheelhouse': No such file" in probe and "'/run/secrets/ca': No such file" in probe
    assert "'/var/log/apt': No such file" in probe        # no build-time logs left in layers
    assert ".whl" not in probe


def test_verify_the_image_with_two_ranks_and_its_digest(repro, tmp_path):
    out, r, _ = repro
    assert r.code == 0
    report = tmp_path / "report.json"
    v = run_envbuilder("verify", str(out), "--runtime", "docker", "--image", TAG, "--ranks", "2",
                       "--report", str(report), timeout=900)
    assert v.code == 0, v.out[-3000:] + v.err[-2000:]
    data = json.loads(report.read_text())
    record = json.loads((out / "image.json").read_text())
    assert data["verify"]["image_record"]["digest"] == record["digest"]
    assert data["verify"]["image_record"]["same_image"] is True
    assert f"digest {record['digest']}" in v.out and "the image verified is that build" in v.out


def test_diff_of_two_builds_says_bit_identical(repro, tmp_path):
    out, r, _ = repro
    assert r.code == 0
    other = tmp_path / "other"
    shutil.copytree(out, other, ignore=shutil.ignore_patterns("*.tar"))
    d = run_envbuilder("diff", str(out), TAG)        # the folder's record against the image in Docker
    assert d.code == 0, d.err
    assert "images: bit-identical" in d.out


# --- rootless -----------------------------------------------------------------------------------

def _rootless_user(home: Path) -> pwd.struct_passwd:
    """A non-root user with 65536 subordinate uids and gids (Debian's uidmap reads them)."""
    try:
        user = pwd.getpwnam(ROOTLESS_USER)
    except KeyError:
        subprocess.run(["useradd", "--create-home", "--home-dir", str(home), "--shell", "/bin/bash",
                        ROOTLESS_USER], check=True)
        user = pwd.getpwnam(ROOTLESS_USER)
    for f in ("/etc/subuid", "/etc/subgid"):
        if not re.search(rf"^{ROOTLESS_USER}:", Path(f).read_text() if Path(f).exists() else "", re.M):
            with open(f, "a") as fh:
                fh.write(f"{ROOTLESS_USER}:400000:65536\n")
    return user


# --- bad input ----------------------------------------------------------------------------------

def _earlier_outputs(out: Path) -> dict[str, str]:
    (out / "image.json").write_text('{"engine": "earlier"}\n')
    (out / "build.log").write_text("an earlier build's log\n")
    return {n: (out / n).read_text() for n in ("image.json", "build.log", "envbuilder.lock", "Dockerfile")}


def _one_message(r, *needles: str) -> None:
    assert r.code == 1, r.out + r.err
    assert "Traceback" not in r.err
    errors = [l for l in r.err.splitlines() if l.startswith("error:")]
    assert len(errors) == 1, r.err
    for needle in needles:
        assert needle in r.err, r.err


def test_engine_missing(locked, tmp_path):
    spec, locked_out = locked
    out = tmp_path / "out"
    shutil.copytree(locked_out, out)
    before = _earlier_outputs(out)
    empty = tmp_path / "bin"
    empty.mkdir()
    r = run_envbuilder("build", str(spec), "--out", str(out), "--engine", "podman", env={"PATH": str(empty)})
    _one_message(r, "podman engine", "podman is not installed", "apt-get install podman")
    assert {n: (out / n).read_text() for n in before} == before


def test_storage_full(locked, tmp_path):
    spec, locked_out = locked
    out = tmp_path / "out"
    shutil.copytree(locked_out, out)
    before = _earlier_outputs(out)
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(small)], check=True)
    try:
        env = storage(small, driver="vfs")
        r = run_envbuilder("build", str(spec), "--out", str(out), "--engine", "buildah", env=env)
        _one_message(r, "buildah storage", f"GB free under {small}/graph", "CONTAINERS_STORAGE_CONF")
    finally:
        subprocess.run(["umount", str(small)], check=True)
    assert {n: (out / n).read_text() for n in before} == before


def test_base_image_in_no_store(tmp_path):
    """A spec locked against a local image that is gone since: not in buildah's storage, not in
    Docker, and no registry holds it."""
    require_docker()
    base = base_image()
    gone = "local/envbuilder-buildah-gone:1"
    subprocess.run([docker_cli(), "tag", base, gone], check=True)
    try:
        spec = cpu_torch_spec(tmp_path, "gone-base", base=gone)
        out = tmp_path / "out"
        lock(spec, out)
    finally:
        subprocess.run([docker_cli(), "rmi", gone], capture_output=True)
    before = _earlier_outputs(out)
    env = storage(tmp_path)
    try:
        r = run_envbuilder("build", str(spec), "--out", str(out), "--engine", "buildah", env=env, timeout=600)
        _one_message(r, "base:", f"the base image {gone} is in none of", "buildah storage", "docker-daemon")
    finally:
        clean_storage(env)
    assert {n: (out / n).read_text() for n in before} == before
