"""Helpers for tests that need the machine's real engines (Docker, Slurm).

Plain module, not a conftest: ``from tests.infra import require_docker`` or
``from infra import ...`` (pytest puts ``tests/`` on ``sys.path`` in rootdir mode).

Policy: on a developer's machine a missing engine *skips* the test with the reason.
In CI (``.ci/run`` exports ``ENVBUILDER_REQUIRE_ENGINES=1``) a missing engine is a
*failure*: CI sets the engines up, so a skip there would hide a broken set-up.
"""
from __future__ import annotations

import contextlib
import functools
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

BASE_IMAGE = os.environ.get("ENVBUILDER_SLIM_BASE_IMAGE", "local/debian:bookworm-slim")   # .ci/make-base-image.sh --slim
REQUIRE_ENV = "ENVBUILDER_REQUIRE_ENGINES"

# Debian's docker CLI (20.10) has BuildKit built in. A newer CLI without the buildx
# plugin may come first in PATH (/usr/local/bin/docker on these machines) and then
# refuses DOCKER_BUILDKIT=1 builds, so prefer Debian's.
DOCKER_CLI = os.environ.get("ENVBUILDER_DOCKER_CLI") or (
    "/usr/bin/docker" if os.access("/usr/bin/docker", os.X_OK) else (shutil.which("docker") or "docker")
)


def engines_required() -> bool:
    """True when a missing engine must fail the test (CI), not skip it."""
    return os.environ.get(REQUIRE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def _unavailable(what: str, reason: str, fix: str) -> None:
    msg = f"{what} not available: {reason}"
    if engines_required():
        pytest.fail(f"{msg} ({REQUIRE_ENV}=1, so this is a failure; {fix})", pytrace=False)
    pytest.skip(f"{msg} ({fix})")


# --------------------------------------------------------------------------- docker
@functools.lru_cache(maxsize=1)
def _docker_probe() -> tuple[object | None, str]:
    try:
        import docker  # type: ignore
    except ImportError as exc:  # pragma: no cover - docker is a dependency
        return None, f"docker SDK not importable ({exc})"
    try:
        client = docker.from_env(timeout=30)
        client.ping()
        return client, ""
    except Exception as exc:  # noqa: BLE001 - any failure means "not reachable"
        return None, f"engine not reachable ({type(exc).__name__}: {exc})"


def docker_client():
    """A docker SDK client; skips (or fails under ENVBUILDER_REQUIRE_ENGINES=1)
    when the engine does not answer."""
    client, reason = _docker_probe()
    if client is None:
        _unavailable("Docker", reason, "run .ci/install-system.sh and .ci/start-docker.sh")
    return client


def require_docker():
    """Same as docker_client(): returns the client, or fails in CI / skips elsewhere."""
    return docker_client()


def docker_cli() -> str:
    """Path of the docker CLI to use for BuildKit builds (``DOCKER_BUILDKIT=1``)."""
    return DOCKER_CLI


def base_image() -> str:
    """The tag of the local base image, after checking that the engine has it."""
    client = docker_client()
    try:
        client.images.get(BASE_IMAGE)
    except Exception as exc:  # noqa: BLE001 - docker.errors.ImageNotFound and others
        _unavailable(
            f"Base image {BASE_IMAGE}",
            f"{type(exc).__name__}: {exc}",
            "run .ci/make-base-image.sh --slim",
        )
    return BASE_IMAGE


ARM64_BASE = "local/debian:bookworm-arm64"          # .ci/make-base-image.sh --arch arm64


def image_arch(ref: str) -> str | None:
    """The Docker engine's Architecture of image REF (amd64, arm64); None without the image or
    without a docker CLI."""
    if not os.path.exists(DOCKER_CLI) and not shutil.which("docker"):
        return None
    proc = subprocess.run([DOCKER_CLI, "image", "inspect", "--format", "{{.Architecture}}", ref],
                          capture_output=True, text=True)
    return proc.stdout.strip() if proc.returncode == 0 else None


PLAIN_BASE_IMAGE = os.environ.get("ENVBUILDER_PLAIN_BASE_IMAGE", "local/debian:bookworm-plain")


def plain_base_image() -> str:
    """The debootstrap base without Docker Hub's docker-clean apt settings (.ci/make-base-image.sh
    --plain), after checking that the engine has it."""
    client = docker_client()
    try:
        client.images.get(PLAIN_BASE_IMAGE)
    except Exception as exc:  # noqa: BLE001
        _unavailable(f"Base image {PLAIN_BASE_IMAGE}", f"{type(exc).__name__}: {exc}",
                     "run .ci/make-base-image.sh --plain")
    return PLAIN_BASE_IMAGE


# --------------------------------------------------------------------------- slurm
@functools.lru_cache(maxsize=1)
def _slurm_probe() -> str:
    sinfo = shutil.which("sinfo")
    if not sinfo:
        return "sinfo not installed"
    try:
        proc = subprocess.run(
            [sinfo, "-h", "-o", "%T"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"sinfo failed ({exc})"
    if proc.returncode != 0:
        return f"sinfo exited {proc.returncode}: {proc.stderr.strip()[:300]}"
    states = proc.stdout.split()
    usable = [s for s in states if s.rstrip("*~#") in ("idle", "mixed", "allocated", "completing")
              and not s.endswith("*")]
    if not usable:
        return f"no usable node (states: {' '.join(states) or 'none'})"
    return ""


REGISTRY = "127.0.0.1:5000"          # .ci/start-registry.sh: the distribution registry on loopback


def require_registry() -> str:
    """The loopback OCI registry of .ci/start-registry.sh (docs/attestation.md); skips, or fails
    under ENVBUILDER_REQUIRE_ENGINES=1, when it does not answer."""
    import urllib.request

    try:
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(f"http://{REGISTRY}/v2/", timeout=5):
            return REGISTRY
    except OSError as exc:
        _unavailable("registry", f"nothing answers on {REGISTRY} ({exc})", "run bash .ci/start-registry.sh (.ci/setup does)")
    return REGISTRY


def require_slurm() -> None:
    """Checks that a Slurm controller answers and a node is up; skips (or fails
    under ENVBUILDER_REQUIRE_ENGINES=1) otherwise."""
    reason = _slurm_probe()
    if reason:
        _unavailable("Slurm", reason, "run .ci/install-system.sh and .ci/start-slurm.sh")


def require_binary(name: str, fix: str = "run .ci/install-system.sh") -> str:
    """Path of a host program (mpirun, shellcheck, ch-run...), with the same policy."""
    path = shutil.which(name)
    if not path:
        _unavailable(name, "not on PATH", fix)
    return path  # type: ignore[return-value]


def venv_tool(name: str) -> str:
    """A tool the README installs into the virtual environment (pip install -e '.[test]'):
    found beside the running Python, not on PATH (the README's test command does not put the
    venv's bin/ on PATH)."""
    from pathlib import Path

    beside = Path(sys.executable).parent / name
    assert beside.is_file(), f"{name} must be installed in this venv: pip install -e '.[test]' ({beside})"
    return str(beside)


# --------------------------------------------------------------------------- apptainer
APPTAINER_NODE = Path(__file__).resolve().parent.parent / "tools" / "apptainer-node"


def require_apptainer_node() -> str:
    """The image of .ci/install-apptainer.sh (real Apptainer, Debian 13) that tools/apptainer-node
    runs commands in; skips, or fails under ENVBUILDER_REQUIRE_ENGINES=1, when Docker lacks it."""
    docker_client()
    script = APPTAINER_NODE.parent.parent / ".ci" / "install-apptainer.sh"
    tag = subprocess.run(["bash", str(script), "--tag"], capture_output=True, text=True, check=True).stdout.strip()
    if not _image_exists(tag):
        _unavailable("Apptainer", f"no image {tag} in the Docker engine", "run .ci/install-apptainer.sh (.ci/setup does)")
    return tag


# --------------------------------------------------------------------------- host smoke Python
SMOKE_VENV_PYTHON = "/opt/envbuilder-smoke-venv/bin/python"   # made by .ci/make-smoke-venv.sh


def smoke_python() -> str | None:
    """A Python with torch, tensorflow-cpu and Horovod for host-runtime tests:
    ENVBUILDER_SMOKE_PYTHON, else the environment .ci/setup makes, else None."""
    explicit = os.environ.get("ENVBUILDER_SMOKE_PYTHON")
    if explicit:
        return explicit
    return SMOKE_VENV_PYTHON if os.access(SMOKE_VENV_PYTHON, os.X_OK) else None


# --------------------------------------------------------------------------- torch wheelhouse
TORCH_WHEEL = "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"


def wheelhouse() -> str:
    """The folder holding the torch CPU wheel: pip's configured find-links (ENVIRONMENT.md)."""
    from pathlib import Path

    candidates = ["/opt/wheels"]
    proc = subprocess.run(["python3", "-m", "pip", "config", "list"], capture_output=True, text=True)
    for line in proc.stdout.splitlines():
        if "find-links" in line:
            candidates.append(line.split("=", 1)[1].strip().strip("'\""))
    for folder in candidates:
        if (Path(folder) / TORCH_WHEEL).is_file():
            return folder
    pytest.fail(f"{TORCH_WHEEL} not found in pip's find-links folder (ENVIRONMENT.md)")


# --------------------------------------------------------------------------- long builds
LONG_ENV = "ENVBUILDER_LONG_BUILDS"

# Builds that do not fit CI's 45-minute budget on 2 cores beside the rest of the suite (a
# Horovod GPU image from PyPI wheels) run when
# asked for: ENVBUILDER_LONG_BUILDS=1 .venv/bin/python -m pytest tests/...
long_build = pytest.mark.skipif(os.environ.get(LONG_ENV, "") != "1",
                                reason=f"a long image build: runs with {LONG_ENV}=1 (outside CI's budget)")


def finished_code(records: list[dict]) -> int | None:
    """A job's exit code once every record of `scontrol show job -o` is in a final state (a step
    ended by a signal counts 1), else None."""
    from envbuilder.verify.slurm import DONE_STATES

    if not records or not all(r.get("JobState") in DONE_STATES for r in records):
        return None
    codes = []
    for r in records:
        status, signal = (int(x) for x in r.get("ExitCode", "0:0").split(":"))
        codes.append(1 if signal else status)
    return max(codes)


def wait_for(what, seconds: float, step: float = 0.5) -> bool:
    """True as soon as WHAT() is, polled every STEP seconds for SECONDS."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        if what():
            return True
        time.sleep(step)
    return bool(what())


def sbatch_until_done(argv: list[str], cwd: Path, env: dict, timeout: float = 300) -> tuple[int, str, str]:
    """`sbatch --parsable ARGV`, then wait for the job (every task of an array) to end, polling
    scontrol every half second: (exit code as `sbatch --wait` gives it, job id, sbatch's stderr).

    Not `sbatch --wait` itself: Slurm 22.05 polls at 2, 10 and 42 s, then every 32 s, so a 12 s job
    returned after 42 s and a 45 s one after 74 s (each test job lost 15 s on average). The exit code
    is the same: the largest exit status of the job's tasks, 1 for a task ended by a signal; a job
    still running at TIMEOUT is cancelled and raises subprocess.TimeoutExpired, as `sbatch --wait`
    under subprocess's timeout did."""

    from envbuilder.verify.slurm import job_records

    full = {**os.environ, **env}
    proc = subprocess.run(["sbatch", "--parsable", *argv], cwd=cwd, capture_output=True, text=True, env=full,
                          timeout=60)
    job_id = proc.stdout.strip().split(";")[0]
    if proc.returncode != 0 or not job_id:
        return proc.returncode or 1, job_id, proc.stderr
    deadline = time.monotonic() + timeout
    while True:
        show = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, env=full,
                              timeout=60)
        records = job_records(show.stdout)
        code = finished_code(records) if show.returncode == 0 else None
        if code is not None:
            return code, job_id, proc.stderr
        if time.monotonic() > deadline:
            subprocess.run(["scancel", job_id], env=full, capture_output=True)
            raise subprocess.TimeoutExpired(["sbatch", *argv], timeout)
        time.sleep(0.5)


# --------------------------------------------------------------------------- multi-node cluster
MINICLUSTER_ROOT = "/var/lib/envbuilder-minicluster"


def require_minicluster() -> dict:
    """The multi-node test cluster of tools/minicluster (controller + 2 compute containers):
    the environment a login-node command needs to reach it (SLURM_CONF). Skips, or fails under
    ENVBUILDER_REQUIRE_ENGINES=1, when `tools/minicluster status` says it is not up."""
    from pathlib import Path

    tool = Path(__file__).resolve().parent.parent / "tools" / "minicluster"
    proc = subprocess.run(["bash", str(tool), "status"], capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        _unavailable("The multi-node cluster", (proc.stderr or proc.stdout).strip()[-300:],
                     "run tools/minicluster start (.ci/setup does)")
    return {"SLURM_CONF": f"{MINICLUSTER_ROOT}/etc/slurm.conf"}


# --------------------------------------------------------------------------- the Apptainer cluster
APPTAINER_CLUSTER_ROOT = "/var/lib/envbuilder-apptainer-cluster"
_MINICLUSTER = Path(__file__).resolve().parent.parent / "tools" / "minicluster"


def require_apptainer_cluster() -> None:
    """The 2-node cluster of `tools/minicluster --flavor apptainer` (Debian 13, Slurm 24.11, real
    Apptainer): skips, or fails under ENVBUILDER_REQUIRE_ENGINES=1, when it is not up."""
    proc = subprocess.run(["bash", str(_MINICLUSTER), "--flavor", "apptainer", "status"], capture_output=True,
                          text=True, timeout=120)
    if proc.returncode != 0:
        _unavailable("The Apptainer cluster", (proc.stderr or proc.stdout).strip()[-300:],
                     "run tools/minicluster --flavor apptainer start (.ci/setup does)")


def on_apptainer_login(argv: list[str], cwd: Path, timeout: float = 60,
                       env: dict | None = None) -> subprocess.CompletedProcess:
    """ARGV as the user builder on the Apptainer cluster's login node (its controller), in CWD
    (a folder of its shared file system), with ENV added: this machine's Slurm 22.05 cannot talk
    to its Slurm 24.11."""
    extra = ["env", *(f"{k}={v}" for k, v in (env or {}).items())] if env else []
    return subprocess.run(["bash", str(_MINICLUSTER), "--flavor", "apptainer", "exec", "-w", str(cwd),
                           *extra, *argv], capture_output=True, text=True, timeout=timeout)


def apptainer_sbatch_until_done(argv: list[str], cwd: Path, env: dict | None = None,
                                timeout: float = 300) -> tuple[int, str, str]:
    """sbatch_until_done on the Apptainer cluster, as builder: (exit code, job id, sbatch's stderr)."""

    from envbuilder.verify.slurm import job_records

    proc = on_apptainer_login(["sbatch", "--parsable", *argv], cwd, env=env)
    job_id = proc.stdout.strip().split(";")[0]
    if proc.returncode != 0 or not job_id:
        return proc.returncode or 1, job_id, proc.stderr
    deadline = time.monotonic() + timeout
    while True:
        show = on_apptainer_login(["scontrol", "show", "job", "-o", job_id], cwd)
        records = job_records(show.stdout)
        code = finished_code(records) if show.returncode == 0 else None
        if code is not None:
            return code, job_id, proc.stderr
        if time.monotonic() > deadline:
            on_apptainer_login(["scancel", job_id], cwd)
            raise subprocess.TimeoutExpired(["sbatch", *argv], timeout)
        time.sleep(0.5)


# --------------------------------------------------------------------------- another user's envbuilder
ROOT = Path(__file__).resolve().parent.parent


def runtime_requirements() -> list[str]:
    """envbuilder's own dependencies, as pyproject.toml lists them (what `pip install envbuilder`
    brings a user on a login node)."""
    import tomllib

    return list(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"])


def user_python(user: str, folder: Path) -> str:
    """A virtual environment owned by USER in FOLDER (its parent writable by USER) with envbuilder's dependencies (the test's
    own venv may lie where USER cannot read); envbuilder itself comes from the checkout through
    PYTHONPATH. Made once per folder; returns its python."""
    python = folder / "bin" / "python"
    if not python.exists():
        script = (f"/usr/bin/python3 -m venv {shlex.quote(str(folder))} && {shlex.quote(str(python))} -m pip "
                  f"install -q --disable-pip-version-check " + " ".join(shlex.quote(r) for r in runtime_requirements()))
        proc = subprocess.run(["runuser", "-u", user, "--", "env", "HOME=/tmp", "PATH=/usr/bin:/bin",
                               "bash", "-c", script], capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, f"a venv for {user}: {proc.stderr[-2000:]}"
    return str(python)


# --------------------------------------------------------------------------- what the run made
# One record per test run, shared by every process of the run (the `pytest -n 2` workers each run
# modules of their own): the images kept for the run, the tags built in it and the charliecloud
# directories converted for it. A JSON file under a lock; conftest points RUN_RECORD at it before
# any test and removes what it lists at the end of the run, in the process that started the run
# only (a worker ending early must not remove an image the other worker is still using).
RUN_RECORD: Path | None = None


@contextlib.contextmanager
def run_record():
    """The run's record (a dict) for reading and changing, the other processes kept out meanwhile;
    written back when the block ends."""
    import fcntl
    import json

    if RUN_RECORD is None:
        raise RuntimeError("tests/conftest.py sets infra.RUN_RECORD in pytest_configure")
    with open(RUN_RECORD.with_name(RUN_RECORD.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        data = json.loads(RUN_RECORD.read_text()) if RUN_RECORD.is_file() else {}
        data.setdefault("images", {})     # tag -> it was in the engine before this test run
        data.setdefault("built", [])      # tags `envbuilder build` made in this run (built_once)
        data.setdefault("dirs", [])       # charliecloud directories converted for this run
        yield data
        tmp = RUN_RECORD.with_name(RUN_RECORD.name + ".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, RUN_RECORD)


def _image_exists(tag: str) -> bool:
    return subprocess.run([docker_cli(), "image", "inspect", tag], capture_output=True).returncode == 0


def keep_for_run(tag: str) -> None:
    """Call before building TAG: the image stays until the end of the test run (conftest removes
    it then, unless it was there before the run), so that every module building the same preset
    finds the image itself, not only its build cache (a cached rebuild of a removed image still
    exports and unpacks every layer again)."""
    with run_record() as record:
        if tag not in record["images"]:
            record["images"][tag] = _image_exists(tag)


def built_once(tag: str) -> bool:
    """True when TAG was already built in this test run (and is still there); else marks it, for
    the caller to build now. A second build of the same spec gives another image id (the image's
    creation time), which would undo every conversion made of the first."""
    with run_record() as record:
        if tag in record["built"] and _image_exists(tag):
            return True
        if tag not in record["built"]:
            record["built"].append(tag)
        return False


def charliecloud_for_run(tag: str) -> str:
    """TAG (kept for the run: keep_for_run) as a charliecloud directory, converted once per test run
    into the multi-node cluster's shared folder when this machine has one (the one-node Slurm reads
    it too, and every node sees it), else into the default cache; a conversion made here goes at the
    end of the run (remove_run_images)."""
    from envbuilder.runtimes.charliecloud import charliecloud_dir

    shared = Path(MINICLUSTER_ROOT) / "shared"
    cache = shared / "charliecloud" if shared.is_dir() else Path(
        os.environ.get("ENVBUILDER_CH_CACHE", "/var/tmp/envbuilder-charliecloud"))
    cache.mkdir(parents=True, exist_ok=True)
    before = set(cache.iterdir())
    directory, _owned = charliecloud_dir(tag, cache)
    made = sorted(str(p) for p in set(cache.iterdir()) - before)
    with run_record() as record:
        record["dirs"].extend(p for p in made if p not in record["dirs"])
    return directory


def remove_run_images() -> None:
    """At the end of the run: the images it kept (those not there before it) and the directories
    it converted go (conftest then removes the record's folder)."""
    from envbuilder.runtimes.charliecloud import remove_directory_image

    with run_record() as record:
        for tag, existed in record["images"].items():
            if not existed:
                subprocess.run([docker_cli(), "rmi", "-f", tag], capture_output=True)
        for folder in record["dirs"]:
            remove_directory_image(Path(folder))


@contextlib.contextmanager
def small_tmpfs(folder: Path, size: str):
    """A file system of SIZE mounted at FOLDER (made here) for the test's body: a disk that fills.
    Needs root; skips otherwise."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    folder.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], check=True)
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)
