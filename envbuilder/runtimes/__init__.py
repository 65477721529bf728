"""Container runtimes: one class per runtime, one file each, created by name here (the registry).

    apptainer.py     apptainer, singularity   job.sbatch + verify (apptainer)
    charliecloud.py  charliecloud (ch-run)    job.sbatch + verify (a directory image)
    sif.py           a .sif under ch-run      verify (chosen when the image is a SIF)
    pyxis.py         pyxis (srun + enroot)    job.sbatch
    host.py          the nodes' own Python    job.sbatch + verify
    docker.py        docker                   verify

A class answers both job.sbatch's questions (slurm/job.py puts them in the JobPlan: check the
image, binds, the launch prefix, cleanup) and verify's (verify/runner.py: the default image, the suite's command line,
the checks and preparation around it; verify/slurm.py: what the job gets). A new runtime: a file
here, one line in REGISTRY; the spec's enum and the --runtime choices follow from it.
"""

from __future__ import annotations

from .apptainer import Apptainer, Singularity
from .base import Launch, Runtime
from .charliecloud import Charliecloud
from .docker import Docker
from .host import Host
from .pyxis import Pyxis
from .sif import SifCharliecloud, is_sif

# the order is the order users see (schema enum, --runtime choices)
REGISTRY: dict[str, type[Runtime]] = {
    "docker": Docker, "apptainer": Apptainer, "singularity": Singularity,
    "charliecloud": Charliecloud, "pyxis": Pyxis, "host": Host,
}
VERIFY_DEFAULT = "docker"        # verify's --runtime when none is given
JOB_RUNTIMES = tuple(name for name, cls in REGISTRY.items() if cls.in_job)       # cluster.runtime
VERIFY_RUNTIMES = tuple(name for name, cls in REGISTRY.items() if cls.in_verify)  # verify --runtime


def runtime(name: str) -> Runtime:
    """The runtime called NAME (KeyError for an unknown name: the schema and argparse refuse
    those before anything gets here)."""
    return REGISTRY[name]()


def for_target(name: str, image: str | None) -> Runtime:
    """verify's runtime for NAME and IMAGE: a SIF under docker's or charliecloud's name is run by
    charliecloud from its SquashFS partition (no Apptainer needed)."""
    if name in ("docker", "charliecloud") and is_sif(image):
        return SifCharliecloud(image)
    return runtime(name)


__all__ = ["REGISTRY", "VERIFY_DEFAULT", "JOB_RUNTIMES", "VERIFY_RUNTIMES", "Runtime", "Launch", "runtime", "for_target"]
