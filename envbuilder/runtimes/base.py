"""What every runtime answers. Two halves, as reframe's ContainerPlatform has one class per
platform that both checks and emits its launch command:

- verify's half: the image to use when none is given, the command line that runs the smoke suite
  (``command``: pure, for tests and messages), and ``session``: the checks before it runs, the
  preparation (a conversion, a mount) and the cleanup after it, around that command line;
- job.sbatch's half (``job_*``, read once into the JobPlan by slurm/job.py): shell lines that check
  the image, turn binds into the runtime's arguments, set the launch prefix srun runs on every
  rank, clean up;
  ``slurm_env`` is what `verify --slurm` hands the job for this runtime.

A runtime imports nothing above it (no verify, no render): verify hands it the suite's arguments.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

Suite = Callable[[Optional[str]], list[str]]   # manifest path inside the image (or None) -> suite args (evaluated at import: Python 3.9 has no `str | None` there)


@dataclass
class Launch:
    """A prepared run: the command line, its environment (None: inherit), what stops it."""

    argv: list[str]
    env: dict | None = None
    on_timeout: Callable[[], None] | None = None


def user_env() -> dict:
    """This environment with USER set (ch-run and Slurm want one; a container's root has none)."""
    env = dict(os.environ)
    env.setdefault("USER", "root" if os.geteuid() == 0 else str(os.geteuid()))
    return env


class Runtime:
    name = ""                 # the name in specs, --runtime, reports
    in_job = False            # a cluster.runtime of job.sbatch
    in_verify = False         # a `verify --runtime`
    container = True          # job.sbatch: the ranks run inside an image
    image_suffix = ""         # job.sbatch: the default image file's suffix
    hint = ""                 # job.sbatch: how to make the image, in the "not found" message
    srun_extra = ""           # job.sbatch: words srun gets before the launch prefix
    bind_list_separator = ""  # job.sbatch: the character the runtime splits its bind list on (a
                              # bind path holding it would be read as two binds: refused, BIND_SPLIT)
    bind_list_source = ""     # the catalog source (compat/catalog.yaml sources) that says so
    stages_image = False      # job.sbatch: the image is one file the job may copy to each node
    # job.sbatch: launch[] runs on the node's host before the runtime opens the image (the
    # attestation gate's per-rank check goes there); False: srun itself opens it (pyxis)
    launches_on_host = True
    # job.sbatch: the default image (no ENVBUILDER_IMAGE, no cluster.image_path) when the default
    # name is not there: the same name with this suffix (charliecloud: <name>.sif of build --sif)
    image_fallback_suffix = ""
                              # (ENVBUILDER_STAGE_IMAGE=1) and start its ranks from
    env_prefix = ""           # job.sbatch: the prefix whose variables win over the image's own (a
                              # runtime that keeps an image's value over the host's, as Apptainer)

    # --- verify -------------------------------------------------------------------------------
    def default_image(self, manifest: dict, folder: Path | None, cwd: Path) -> str | None:
        """The image verify runs when neither FOLDER nor --image names one."""
        return None

    def command(self, t, opts, suite: Suite, **how) -> tuple[list[str], dict | None]:
        """The command line that runs the suite for target T (and its environment)."""
        raise NotImplementedError(f"{self.name} is not a verify runtime")

    @contextmanager
    def session(self, t, opts, suite: Suite) -> Iterator[Launch]:
        """Check what the run needs (EnvbuilderError, exit 2, with the fix), prepare, yield the
        launch, clean up."""
        argv, env = self.command(t, opts, suite)
        yield Launch(argv, env)

    identifies_images = False  # image_id() answers (verify compares it with the build's record)

    def image_id(self, image: str) -> str | None:
        """The runtime's ID of IMAGE (None: unknown), for "is this the image that was built?"."""
        return None

    def annotate(self, report: dict) -> None:
        """Add this runtime's own facts to the suite's report (the SIF's structure)."""

    def slurm_env(self, t, image: str | None, opts, env: dict) -> None:
        """`verify --slurm`: set T.image and the job's ENVBUILDER_* variables in ENV."""
        t.image = image
        if image:
            env["ENVBUILDER_IMAGE"] = image

    # --- job.sbatch ---------------------------------------------------------------------------
    def job_check_image(self) -> list[str]:
        return [
            'if [ ! -e "$IMAGE" ]; then',
            f'    die "image \'$IMAGE\' not found (set ENVBUILDER_IMAGE or cluster.image_path; {self.hint})"',
            "fi",
        ]

    def job_bind_args(self) -> list[str]:
        """Shell lines that turn binds[] (SRC:DST[:ro]) into runtime_args[]."""
        return []

    def job_launch(self, gpu: bool) -> list[str]:
        """Lines that set launch[]: what srun runs on every rank before the command."""
        raise NotImplementedError(f"{self.name} is not a job.sbatch runtime")

    def job_cleanup(self) -> list[str]:
        """Lines of cleanup() run before the node-local folders go."""
        return []
