"""Shared test helpers: run the real `envbuilder` command in a subprocess."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RECIPES = ROOT / "recipes"


@dataclass
class Result:
    code: int
    out: str
    err: str


def run_envbuilder(*args: str, cwd: Path | None = None, env: dict | None = None, timeout: int = 120) -> Result:
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = str(ROOT) + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.update(env or {})
    proc = subprocess.run([sys.executable, "-m", "envbuilder", *args], cwd=cwd or ROOT, env=full_env,
                          capture_output=True, text=True, timeout=timeout)
    return Result(proc.returncode, proc.stdout, proc.stderr)


def no_config(folder: Path) -> dict:
    """Environment for a command that must not see this machine's envbuilder configuration (the set-up
    writes /etc/envbuilder/config.toml: a wheelhouse, a CA bundle, a registry mirror): an empty site
    file in its place and no user file (docs/config.md)."""
    empty = folder / "no-config.toml"
    empty.write_text("")
    return {"ENVBUILDER_CONFIG": str(empty), "XDG_CONFIG_HOME": str(folder / "no-xdg")}


def run_envbuilder_in_process(*args: str) -> Result:
    """The same command through envbuilder.cli.main in this process, its output captured: for
    tables of `check` cases, where a new interpreter per case (~0.35 s of imports) is most of the
    time. An exception escapes into the test and fails it, as its traceback would fail a
    subprocess case. Commands that build, start ranks or need a clean process use run_envbuilder."""
    from envbuilder.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exc:           # argparse's own exits
            code = exc.code if isinstance(exc.code, int) else 2
    return Result(code, out.getvalue(), err.getvalue())


@pytest.fixture
def cli():
    return run_envbuilder


@pytest.fixture
def write_spec(tmp_path):
    def _write(text: str, name: str = "spec.yaml") -> Path:
        path = tmp_path / name
        path.write_text(text)
        return path
    return _write

def pytest_configure(config):
    """srun, sbatch and ch-run want USER, which a bare environment (env -i, some CI runners) lacks:
    set once here, before any test, as a login shell would. And the run's record of what it made
    (infra.run_record): a worker of `pytest -n 2` is given the one its controller made."""
    import tempfile

    import infra

    os.environ.setdefault("USER", "root" if os.geteuid() == 0 else str(os.geteuid()))
    worker = getattr(config, "workerinput", None)
    if worker is not None and "envbuilder_run_record" in worker:
        infra.RUN_RECORD = Path(worker["envbuilder_run_record"])
    else:
        infra.RUN_RECORD = Path(tempfile.mkdtemp(prefix="envbuilder-test-run-")) / "record.json"


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """pytest-xdist, in the controller: each worker shares the controller's record of the run."""
    import infra

    node.workerinput["envbuilder_run_record"] = str(infra.RUN_RECORD)


# `pytest -n 2` (the README's test command): two workers on the machine's two cores. Most of the
# suite waits (Slurm's job start and end, container start-ups, layer exports: about 40 % of two
# cores idle, bench/suite_cpu.py), so one worker's builds run in the other's waits. Each group below
# runs whole in one worker: modules that share the test clusters, their charliecloud conversions
# or an image tag that a rebuild would move (a second build gives another image id), so they never
# run beside each other. Every other module is a group of its own. Groups start longest first (the
# seconds each took on a fresh machine, 2026-11-26), so the two workers end about together.
WORKER_GROUPS = {
    # tools/minicluster's two nodes (node vetting measures their speed), the MPI-wheel images and
    # their conversions into its shared folder, and the cpu-torch-ddp image that test_multinode
    # converts and test_distributed_ddp and test_apptainer (its .sif) build
    "cluster": ("test_multinode", "test_mpi_multinode", "test_mpi_pypi", "test_mpi_abi", "test_mpi_horovod",
                "test_tf_config", "test_distributed_ddp", "test_apptainer"),
    # the cpu-torch image: built by each of these, converted by test_slurm_jobs and test_sif;
    # test_apptainer_jobs builds it with its cluster's site (another tag, the same cached layers)
    # and runs it on tools/minicluster --flavor apptainer, not on the "cluster" group's nodes
    "cpu-torch": ("test_build_verify", "test_sif", "test_slurm_jobs", "test_apptainer_presets", "test_apptainer_jobs"),
}
LONGEST_FIRST = ("test_intel_tf", "cluster", "cpu-torch", "test_buildah_engine", "test_login_node",
                 "test_distributed_tf", "test_lock_build", "test_smoke_suite", "test_lock")


def worker_group(module: str) -> str:
    """The group a test module (its file's stem) runs in under `pytest -n 2`."""
    for group, modules in WORKER_GROUPS.items():
        if module in modules:
            return group
    return module


def pytest_collection_modifyitems(config, items):
    """The longest groups first (LONGEST_FIRST); within a group and among the rest, the order of
    collection. The workers hand the order to the scheduler below."""
    rank = {group: i for i, group in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(worker_group(item.path.stem), len(rank)))     # a stable sort


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """pytest-xdist's scheduling by scope, a scope being a worker group: each group runs whole in
    one worker, the groups handed out in the collection's order (longest first) as workers free up.
    (Not `--dist loadgroup`: pytest-xdist 3.8 marks a group in the test's nodeid, which pytest 9
    no longer reads, so every test would be a group of its own.)"""
    from xdist.scheduler import LoadScopeScheduling

    class WorkerGroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return worker_group(Path(nodeid.split("::", 1)[0]).stem)

    config.option.loadscopereorder = False      # else the groups with the most tests go first
    return WorkerGroupScheduling(config, log)


@pytest.fixture(autouse=True)
def environment_untouched():
    """A test leaves this process's environment as it found it: a variable leaked here reaches every
    later test's sbatch, srun and MPI (a UCX_LOG_FILE into a removed folder once aborted every rank).
    A leak is undone and fails the test that made it."""
    before = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}   # pytest's own
    yield
    after = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    if after != before:
        changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
        for k in changed:
            if k in before:
                os.environ[k] = before[k]
            else:
                del os.environ[k]
        pytest.fail("the test changed the test process's environment: " + ", ".join(changed)
                    + " (use monkeypatch, or pass the code an environment of its own)")


@pytest.fixture(scope="module")
def cluster():
    """The 2-node test cluster of tools/minicluster (started by .ci/setup): its client environment."""
    from infra import require_minicluster
    env = require_minicluster()
    env["USER"] = os.environ.get("USER") or "root"
    return env


@pytest.fixture(scope="module")
def shared(cluster):
    """A folder on the cluster's shared file system (same path on every node and here)."""
    import shutil
    import time
    import uuid

    from infra import MINICLUSTER_ROOT
    folder = Path(MINICLUSTER_ROOT) / "shared" / "tests" / f"{time.strftime('%H%M%S')}-{uuid.uuid4().hex[:6]}"
    folder.mkdir(parents=True)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def pytest_sessionfinish(session, exitstatus):
    """The preset images the modules shared (infra.keep_for_run) go at the end of the run: in the
    process that started it (a worker of `pytest -n 2` ends while the other may still use them)."""
    import shutil

    import infra

    if hasattr(session.config, "workerinput"):
        return
    infra.remove_run_images()
    shutil.rmtree(infra.RUN_RECORD.parent, ignore_errors=True)
