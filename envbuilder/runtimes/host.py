"""host: no image; the nodes' (or this machine's) own Python runs the suite from this checkout."""

from __future__ import annotations

import os
import shutil
import sys
from contextlib import contextmanager
from pathlib import Path

from ..errors import EnvbuilderError
from ..paths import HOST_MODULE
from .base import Launch, Runtime


def host_env() -> dict:
    """The host runtime imports envbuilder.smoke from this checkout, whatever the interpreter."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def venv_of(python: str) -> str | None:
    """The virtual environment a --python interpreter belongs to (its bin/ goes on PATH)."""
    root = Path(python).absolute().parent.parent
    return str(root) if (root / "pyvenv.cfg").is_file() else None


class Host(Runtime):
    name = "host"
    in_job = True
    in_verify = True
    container = False

    def command(self, t, opts, suite, **how):
        return [opts.python or sys.executable, "-m", HOST_MODULE] + suite(str(t.manifest_path)), host_env()

    @contextmanager
    def session(self, t, opts, suite):
        argv, env = self.command(t, opts, suite)
        if not (os.path.isfile(argv[0]) or shutil.which(argv[0])):
            raise EnvbuilderError("--python", f"{argv[0]} not found", "give an existing interpreter")
        yield Launch(argv, env)

    def slurm_env(self, t, image, opts, env):
        python = opts.python or sys.executable
        venv = venv_of(python)
        if venv:
            env["ENVBUILDER_VENV"] = venv
        else:
            env["PATH"] = str(Path(python).absolute().parent) + os.pathsep + env.get("PATH", "")
        t.image = None

    def job_check_image(self):
        return []

    def job_launch(self, gpu):
        return ["launch=()"]
