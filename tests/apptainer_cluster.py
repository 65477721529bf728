"""Jobs on the Apptainer test cluster (`tools/minicluster --flavor apptainer`: ac-ctl, ac-n1,
ac-n2; Debian 13, Slurm 24.11 with PMIx 5, Apptainer 1.4.5 run by the unprivileged user builder),
shared by the test modules that submit there: tests/test_apptainer_jobs.py (cpu-torch and the MPI
wheels) and tests/test_distributed_tf.py (TF multi-worker). Jobs are submitted as builder on the
controller, the cluster's login node (this machine's Slurm 22.05 cannot talk to 24.11)."""

from __future__ import annotations

import shutil
import time
import uuid
from pathlib import Path

from apptainer_build import BUILDER_UID, chown_tree
from infra import APPTAINER_CLUSTER_ROOT, apptainer_sbatch_until_done, on_apptainer_login, require_apptainer_cluster

ROOT = Path(APPTAINER_CLUSTER_ROOT)
SITE = ("--site", "minicluster-apptainer")
SITE_FILE = Path(__file__).resolve().parent.parent / "sites" / "minicluster-apptainer.yaml"
TWO_BY_TWO = ("--nodes=2", "--ntasks-per-node=2")

__all__ = ["BUILDER_UID", "ROOT", "SITE", "SITE_FILE", "TWO_BY_TWO", "chown_tree", "job_log", "login_runner",
           "sbatch", "shared_folder", "site_variant"]


def shared_folder():
    """A new folder of the cluster's shared file system (a generator: removed after)."""
    require_apptainer_cluster()
    folder = ROOT / "shared" / "tests" / f"{time.strftime('%H%M%S')}-{uuid.uuid4().hex[:6]}"
    folder.mkdir(parents=True)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def job_log(folder: Path, job_id: str) -> str:
    return "".join(p.read_text() for p in sorted(folder.glob(f"*-{job_id}*.out")))


def sbatch(folder: Path, *args: str, env: dict | None = None, timeout: int = 400) -> tuple[int, str, str, float]:
    """sbatch [--OPTIONS] job.sbatch [COMMAND...] as builder, waiting for the end: (exit, job id,
    the job's log, seconds from submission to the end)."""
    opts = [a for a in args if a.startswith("--")]
    command = [a for a in args if not a.startswith("--")]
    t0 = time.time()
    code, job_id, err = apptainer_sbatch_until_done([*opts, "job.sbatch", *command], folder, env, timeout)
    return code, job_id, err + job_log(folder, job_id), time.time() - t0


def site_variant(folder: Path, name: str, extra: str) -> Path:
    """sites/minicluster-apptainer.yaml under another name with EXTRA lines, in FOLDER."""
    text = SITE_FILE.read_text().replace("name: minicluster-apptainer", f"name: {name}")
    path = folder / f"{name}.yaml"
    path.write_text(text + extra)
    return path


def login_runner(shared: Path):
    """envbuilder as builder on the login node (ac-ctl): this checkout's package copied into the
    shared folder SHARED, run by the Apptainer image's Python 3.13 venv, which has envbuilder's
    dependencies (.ci/install-apptainer.sh). Returns run(folder, *args, timeout)."""
    src = shared / "src"
    shutil.copytree(Path(__file__).resolve().parent.parent / "envbuilder", src / "envbuilder",
                    ignore=shutil.ignore_patterns("__pycache__"))
    chown_tree(src, BUILDER_UID)

    def run(folder: Path, *args: str, timeout: int = 900):
        return on_apptainer_login(["env", f"PYTHONPATH={src}", "/opt/envbuilder-venv/bin/python", "-m", "envbuilder",
                                   *args], folder, timeout=timeout)
    return run
