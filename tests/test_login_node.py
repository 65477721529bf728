"""The login-node path (docs/login-node.md): a lock resolved by podman or buildah, rootless, with no
Docker daemon; `build --engine podman --sif` and `verify x.sif` as a non-root user whose Docker
socket is out of reach; the named refusals for what a login node lacks, before any work.

The stack is the smallest that proves it: recipes/cpu-torch-horovod.yaml without Horovod (no compile).
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path

import pytest

from conftest import ROOT, run_envbuilder
from infra import base_image, require_binary, require_docker, require_slurm, user_python, wheelhouse
from test_buildah_engine import ROOTLESS_USER, _rootless_user, clean_storage, cpu_torch_spec, storage


def _lock(spec: Path, out: Path, engine: str, env: dict | None = None):
    r = run_envbuilder("lock", str(spec), "--out", str(out), "--wheelhouse", wheelhouse(), "--engine", engine,
                       env=env, timeout=900)
    assert r.code == 0, r.err[-3000:]
    from envbuilder.lock import load

    return load(out / "envbuilder.lock"), r


def _docker_archive(dest: Path, env: dict) -> None:
    """The local base as a docker archive (it keeps the image ID the Docker engine has)."""
    full = dict(os.environ, **env)
    pulled = subprocess.run(["buildah", "pull", "-q", f"docker-daemon:{base_image()}"], env=full, check=True,
                            capture_output=True, text=True).stdout.split()[-1]
    subprocess.run(["buildah", "push", "-q", pulled, f"docker-archive:{dest}:{base_image()}"], env=full,
                   check=True, capture_output=True)


# --- 1. one lock, whichever engine resolves it ----------------------------------------------------

def test_docker_podman_and_buildah_make_the_same_lock(tmp_path):
    require_docker()
    require_binary("podman", "run .ci/install-system.sh")
    # a site's local base, brought to the login node as an archive (the presets' public base is
    # locked by its registry digest by every engine alike: tests/test_mirror.py)
    spec = cpu_torch_spec(tmp_path, "login-lock", base=base_image())
    docker_lock, _ = _lock(spec, tmp_path / "docker", "docker")
    env = storage(tmp_path)
    try:
        archive = tmp_path / "base.docker.tar"
        _docker_archive(archive, env)
        clean_storage(env)
        env = storage(tmp_path)
        subprocess.run(["podman", "load", "-q", "-i", str(archive)], env=dict(os.environ, **env), check=True,
                       capture_output=True)
        podman_lock, r = _lock(spec, tmp_path / "podman", "podman", env)
        buildah_lock, _ = _lock(spec, tmp_path / "buildah", "buildah", env)
    finally:
        clean_storage(env, "podman")
    assert "(engine: podman)" in r.out
    # the base keeps its ID in podman's storage: the same image-id entry; the same apt closure
    assert docker_lock.base == podman_lock.base == buildah_lock.base
    assert docker_lock.base["devel"]["kind"] == "image-id"
    assert docker_lock.flat() == podman_lock.flat() == buildah_lock.flat()
    assert docker_lock.apt == podman_lock.apt == buildah_lock.apt and docker_lock.pip == podman_lock.pip
    assert docker_lock.inputs == podman_lock.inputs
    # ... except the resolver record: which engine, and its version under its own name only
    assert (docker_lock.resolvers["engine"], podman_lock.resolvers["engine"], buildah_lock.resolvers["engine"]) \
        == ("docker", "podman", "buildah")
    assert "docker" not in podman_lock.resolvers and podman_lock.resolvers["podman"]
    same = {k: v for k, v in docker_lock.resolvers.items() if k not in ("engine", "docker")}
    assert same == {k: v for k, v in podman_lock.resolvers.items() if k not in ("engine", "podman")}


def test_no_usable_engine_is_one_message_naming_each(tmp_path):
    spec = cpu_torch_spec(tmp_path, "login-none")
    empty = tmp_path / "bin"
    empty.mkdir()
    r = run_envbuilder("lock", str(spec), "--out", str(tmp_path / "out"),
                       env={"PATH": str(empty), "DOCKER_HOST": f"unix://{tmp_path}/no.sock"})
    assert r.code == 2 and "Traceback" not in r.err, r.err
    assert "no container engine to lock" in r.err
    for tried in ("docker: no Docker engine answers", "podman: podman is not installed",
                  "buildah: buildah is not installed"):
        assert tried in r.err, r.err
    assert "--engine podman|buildah" in r.err and "docs/login-node.md" in r.err
    assert not (tmp_path / "out" / "envbuilder.lock").exists()


# --- 3. named refusals before any work ------------------------------------------------------------

def test_refusal_no_subordinate_ids(tmp_path):
    from envbuilder.engines.rootless import check_subids
    from envbuilder.errors import EnvbuilderError

    (tmp_path / "subuid").write_text("alice:100000:65536\nbob:165536:1000\n")
    (tmp_path / "subgid").write_text("alice:100000:65536\n")
    check_subids("podman", "alice", 1000, etc=tmp_path)
    for user in ("bob", "carol"):
        with pytest.raises(EnvbuilderError) as exc:
            check_subids("podman", user, 1001, etc=tmp_path)
        assert exc.value.exit_code == 2
        assert f"user {user} has" in exc.value.reason and "subordinate uids" in exc.value.reason
        assert f"usermod --add-subuids 100000-165535 --add-subgids 100000-165535 {user}" in exc.value.fix


def test_refusal_runtime_dir_not_writable(tmp_path):
    from envbuilder.engines.rootless import check_runtime_dir
    from envbuilder.errors import EnvbuilderError

    mine = tmp_path / "run"
    mine.mkdir(mode=0o700)
    uid = os.stat(mine).st_uid
    assert check_runtime_dir("podman", uid, {"XDG_RUNTIME_DIR": str(mine)}) == str(mine)
    for env, why in (({"XDG_RUNTIME_DIR": str(tmp_path / "gone")}, "does not exist"),
                     ({"XDG_RUNTIME_DIR": str(mine)}, "belongs to uid")):
        with pytest.raises(EnvbuilderError) as exc:
            check_runtime_dir("podman", uid + 4242 if why == "belongs to uid" else uid, env)
        assert why in exc.value.reason and "XDG_RUNTIME_DIR" in exc.value.fix
    # unset: the engines' own fallback under $TMPDIR
    assert check_runtime_dir("podman", 4242, {"TMPDIR": str(tmp_path)}) == f"{tmp_path}/podman-run-4242"


def test_warning_vfs_storage_names_the_cause_and_the_disk():
    from envbuilder.engines.rootless import kernel_version, storage_warning

    assert kernel_version("5.4.0-150-generic") == (5, 4)
    old = storage_warning("podman", "vfs", Path("/home/u/.local/share/containers/storage"), kernel=(5, 4),
                          fuse_overlayfs=None, image_gb=6)
    assert "no fuse-overlayfs and kernel 5.4" in old and "about 18 GB" in old and "about 6 GB" in old
    assert "fuse-overlayfs" in old and "docs/login-node.md" in old
    asked = storage_warning("podman", "vfs", Path("/s"), kernel=(6, 1), fuse_overlayfs="/usr/bin/fuse-overlayfs",
                            image_gb=6)
    assert "the storage configuration asks for vfs" in asked
    assert storage_warning("podman", "overlay", Path("/s"), kernel=(5, 4), fuse_overlayfs=None, image_gb=6) is None


def test_refusal_storage_without_room(tmp_path):
    """graphroot on a file system without room: the lock step refuses before resolving anything."""
    from infra import small_tmpfs

    require_binary("podman", "run .ci/install-system.sh")
    spec = cpu_torch_spec(tmp_path, "login-full")
    with small_tmpfs(tmp_path / "small", "64m") as small:
        env = storage(small, driver="vfs")
        r = run_envbuilder("lock", str(spec), "--out", str(tmp_path / "out"), "--engine", "podman", env=env)
    assert r.code == 1 and "Traceback" not in r.err, r.err
    assert "podman storage: only" in r.err and f"GB free under {small}/graph" in r.err
    assert "this build needs about 18 GB (vfs storage)" in r.err
    assert "resolving" not in r.err and not (tmp_path / "out" / "envbuilder.lock").exists()


# --- 2. the whole path as a non-root user ---------------------------------------------------------

def _as_user(env: dict, script: str, timeout: int = 1800) -> subprocess.CompletedProcess:
    return subprocess.run(["runuser", "-u", ROOTLESS_USER, "--", "env", "-i",
                           *[f"{k}={v}" for k, v in env.items()], "bash", "-c", script],
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def login(tmp_path_factory):
    """ebbuildah's home with the spec, the torch wheel, the base as a docker archive and a venv."""
    require_docker()
    for tool in ("podman", "buildah", "newuidmap", "tar2sqfs", "siftool", "squashfuse", "ch-run"):
        require_binary(tool, "run .ci/install-system.sh")
    home = Path("/home") / ROOTLESS_USER
    user = _rootless_user(home)
    work = home / "login"
    shutil.rmtree(work, ignore_errors=True)
    (work / "wheels").mkdir(parents=True)
    spec = cpu_torch_spec(work, "login-cpu-torch")
    for w in Path(wheelhouse()).glob("torch-*.whl"):
        shutil.copy(w, work / "wheels" / w.name)
    shutil.copy("/etc/ssl/certs/ca-certificates.crt", work / "ca.pem")
    root_env = storage(tmp_path_factory.mktemp("login-root"))
    try:
        _docker_archive(work / "base.docker.tar", root_env)
    finally:
        clean_storage(root_env)
    subprocess.run(["chown", "-R", f"{user.pw_uid}:{user.pw_gid}", str(work)], check=True)
    python = user_python(ROOTLESS_USER, home / "venv")
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(home), "USER": ROOTLESS_USER,
           "XDG_RUNTIME_DIR": f"/tmp/{ROOTLESS_USER}-run", "PYTHONPATH": str(ROOT)}
    Path(env["XDG_RUNTIME_DIR"]).mkdir(mode=0o700, exist_ok=True)
    os.chown(env["XDG_RUNTIME_DIR"], user.pw_uid, user.pw_gid)
    yield {"work": work, "spec": spec, "python": python, "env": env, "user": user}
    _as_user(env, "podman system reset --force")
    shutil.rmtree(work, ignore_errors=True)


def test_the_docker_socket_is_out_of_reach(login):
    p = _as_user(login["env"], "test -r /var/run/docker.sock || test -w /var/run/docker.sock")
    assert p.returncode != 0, "the test user can reach the Docker socket"


def test_refusals_as_the_user_before_any_work(login):
    eb = f"{login['python']} -m envbuilder"
    spec = login["spec"]
    # XDG_RUNTIME_DIR not the user's
    p = _as_user(dict(login["env"], XDG_RUNTIME_DIR="/root"), f"cd {login['work']} && {eb} lock {spec.name} "
                 "--out refused --engine podman")
    assert p.returncode == 2 and "XDG_RUNTIME_DIR=/root" in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert not (login["work"] / "refused").exists()
    # a user without subordinate ids (nobody)
    shared = Path(tempfile.mkdtemp(prefix="envbuilder-nobody-", dir="/tmp"))
    shutil.copy(spec, shared / spec.name)
    os.chown(shared, pwd.getpwnam("nobody").pw_uid, -1)
    p = subprocess.run(["runuser", "-u", "nobody", "--", "env", "-i", "PATH=/usr/bin:/bin", f"HOME={shared}",
                        f"PYTHONPATH={ROOT}", "bash", "-c",
                        f"cd {shared} && {login['python']} -m envbuilder lock {spec.name} --engine podman"],
                       capture_output=True, text=True)
    shutil.rmtree(shared, ignore_errors=True)
    assert p.returncode == 2 and "user nobody has no subordinate uids in /etc/subuid" in p.stderr, p.stderr


def test_spec_to_verified_sif_as_a_non_root_user(login):
    """lock (podman), build, OCI and docker archives, SIF in one command; then verify x.sif, as
    ebbuildah (rootless podman: what a login node has, no daemon, no root)."""
    work, env, spec = login["work"], login["env"], login["spec"]
    eb = f"{login['python']} -m envbuilder"
    started = time.monotonic()
    p = _as_user(env, f"set -e; cd {work}; podman load -q -i base.docker.tar >/dev/null; "
                      f"{eb} build {spec.name} --out out --engine podman --sif --tag localhost/login/cpu-torch:1 "
                      "--wheelhouse wheels --ca-bundle ca.pem --export docker-archive")
    seconds = time.monotonic() - started
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-4000:]
    lock = json.loads((work / "out" / "envbuilder.lock").read_text())
    assert lock["resolvers"]["engine"] == "podman" and lock["base"]["devel"]["kind"] == "image-id"
    assert (work / "out" / "image.oci.tar").is_file()
    record = json.loads((work / "out" / "image.json").read_text())
    assert record["engine"] == "podman" and record["digest"].startswith("sha256:")
    assert "built localhost/login/cpu-torch:1 with podman" in p.stdout, p.stdout[-2000:]
    with tarfile.open(work / "out" / "image.docker.tar") as tar:      # what `docker load` takes
        assert "manifest.json" in tar.getnames()
    # the layers' files belong to root inside the image, not to the user who built it
    owner = _as_user(env, "podman run --rm --network none localhost/login/cpu-torch:1 stat -c %u /opt/venv/bin/python3")
    assert owner.stdout.strip() == "0", owner.stderr
    # the .sif comes from the OCI archive the engine wrote, as `apptainer build x.sif
    # oci-archive://image.oci.tar` would make it (no Docker involved)
    sif = work / "out" / f"{spec.stem}.sif"
    assert sif.is_file() and not list((work / "out").glob(".*.sif*")), sorted(x.name for x in (work / "out").iterdir())
    listing = subprocess.run(["siftool", "list", str(sif)], capture_output=True, text=True, check=True).stdout
    assert re.search(r"FS\s+\(Squashfs/\*System/amd64\)", listing), listing
    assert "Def.FILE" in listing, listing
    dump = subprocess.run(["siftool", "dump", "1", str(sif)], capture_output=True, check=True).stdout
    assert dump.decode() == "bootstrap: oci-archive\nfrom: image.oci.tar\n"
    steps = p.stderr[p.stderr.rindex("steps: "):].splitlines()[0]
    for step in ("lock", "build", "oci-archive", "sif"):
        assert f"{step} " in steps, steps
    print(f"\nbuild as {ROOTLESS_USER}: {seconds:.0f} s; {steps}")
    # verify x.sif: squashfuse needs /dev/fuse open to the user (a site's choice: named refusal otherwise)
    fuse_mode = os.stat("/dev/fuse").st_mode & 0o777
    if fuse_mode & 0o006 != 0o006:
        p = _as_user(env, f"cd {work} && {eb} verify out/{sif.name}")
        assert p.returncode == 2 and "/dev/fuse is not readable and writable by you" in p.stderr, p.stderr
        os.chmod("/dev/fuse", 0o666)
    try:
        started = time.monotonic()
        p = _as_user(env, f"cd {work} && {eb} verify out/{sif.name} --ranks 2", timeout=900)
        print(f"verify x.sif as {ROOTLESS_USER}: {time.monotonic() - started:.0f} s")
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
        # and a job submitted by that user runs the SIF on the one-node Slurm (job.sbatch, charliecloud)
        require_slurm()
        started = time.monotonic()
        # the SIF runs under charliecloud here, which can bind only folders that exist in the image or
        # lie under /tmp (Apptainer makes bind points itself): the job's folder goes under /tmp
        jobdir = Path(f"/tmp/envb-{ROOTLESS_USER}-job")
        shutil.rmtree(jobdir, ignore_errors=True)
        job = _as_user(env, f"set -e; cp -r {work}/out {jobdir}; cd {jobdir} && {eb} verify . --slurm --ranks 2 "
                            f"--image {jobdir}/{sif.name} --report {work}/slurm-report.json", timeout=900)
        print(f"verify --slurm with the SIF as {ROOTLESS_USER}: {time.monotonic() - started:.0f} s")
    finally:
        os.chmod("/dev/fuse", fuse_mode)
    report = work / "slurm-report.json"
    assert report.is_file(), job.stdout[-2000:] + job.stderr[-3000:]
    data = json.loads(report.read_text())
    failed = [(c["name"], c.get("detail", "")[:300]) for c in data["checks"] if c["status"] == "fail"]
    assert job.returncode == 0 and not failed, failed or job.stderr[-3000:]
    log = Path(data["slurm"]["log"])
    assert log.stat().st_uid == pwd.getpwnam(ROOTLESS_USER).pw_uid      # the job ran as that user
    assert "mounted the SquashFS partition of" in log.read_text(), log.read_text()[-2000:]
    shutil.rmtree(jobdir, ignore_errors=True)
