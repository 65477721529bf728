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
    set once here, before any test, as a login shell would."""
    os.environ.setdefault("USER", "root" if os.geteuid() == 0 else str(os.geteuid()))


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
    """The preset images the modules shared (infra.keep_for_run) go at the end of the run."""
    from infra import remove_run_images

    remove_run_images()
