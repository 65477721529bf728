"""job.sbatch through the real Apptainer on 2 nodes: the cluster of `tools/minicluster --flavor
apptainer` (ac-ctl, ac-n1, ac-n2: Debian 13, Slurm 24.11 with PMIx 5, Apptainer 1.4.5 from the image
of .ci/install-apptainer.sh), jobs submitted by the non-root user `builder` on the controller, its
login node (this machine's Slurm 22.05 cannot talk to 24.11), ranks started by `srun --mpi=pmix
apptainer exec IMAGE.sif`, one user namespace per rank, as on a site running Apptainer unprivileged.

The image: cpu-torch (torch + Horovod with its MPI and Gloo controllers, Debian's Open MPI 4.1.4
with its PMIx client), written as a .sif by envbuilder (`build --sif`) into the cluster's shared
folder. Covered: the smoke suite as job.sbatch runs it with no command, 2 nodes x 2 ranks, Horovod
over MPI and over Gloo; the same .sif through `singularity` (Debian's package installs the name),
a Horovod allreduce across the 4 ranks, with the time from submission to all ranks up; the
--cleanenv/--containall trap reproduced with Apptainer itself (every rank "rank 0 of 1") and named
by job.sbatch before any rank; the node-local folders removed after scancel. With
ENVBUILDER_LONG_BUILDS=1 also cpu-torch-ddp's smoke suite (torch.distributed) on 2 nodes x 2."""

from __future__ import annotations

import json
import os
import re
import shutil
import time
import uuid
from pathlib import Path

import pytest

from conftest import RECIPES, run_envbuilder
from infra import (wait_for, APPTAINER_CLUSTER_ROOT, apptainer_sbatch_until_done, base_image, keep_for_run, long_build,
                   on_apptainer_login, require_apptainer_cluster, wheelhouse)

CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
ROOT = Path(APPTAINER_CLUSTER_ROOT)
SITE = ("--site", "minicluster-apptainer")
BUILDER_UID = 1000          # the user of .ci/install-apptainer.sh's image, who submits
TWO_BY_TWO = ("--nodes=2", "--ntasks-per-node=2")

# One Horovod allreduce across the ranks; each rank records who it is and when it was up
HVD_RECORD = """\
import json, os, socket, time
up = time.time()
import torch, horovod.torch as hvd
hvd.init()
s = hvd.allreduce(torch.tensor([float(hvd.rank())]), op=hvd.Sum).item()
json.dump({"rank": hvd.rank(), "size": hvd.size(), "host": socket.gethostname(), "sum": s, "up": up,
           "slurm_rank": int(os.environ["SLURM_PROCID"])},
          open(os.path.join(os.environ["OUTPUT_DIR"], "rank-%d.json" % hvd.rank()), "w"))
"""


def chown_tree(path: Path, uid: int) -> None:
    for root, dirs, files in os.walk(path):
        for name in [root, *(os.path.join(root, d) for d in dirs), *(os.path.join(root, f) for f in files)]:
            os.lchown(name, uid, uid)


@pytest.fixture(scope="module")
def ac_shared():
    """A folder of the Apptainer cluster's shared file system, the user builder's."""
    require_apptainer_cluster()
    folder = ROOT / "shared" / "tests" / f"{time.strftime('%H%M%S')}-{uuid.uuid4().hex[:6]}"
    folder.mkdir(parents=True)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def hvd_sif(ac_shared):
    """cpu-torch built with the cluster's site (the image kept for the run: its module group,
    "cpu-torch", builds it from the build cache) and written as a .sif beside job.sbatch."""
    base_image()
    out = ac_shared / "cpu-torch"
    probe = run_envbuilder("build", str(RECIPES / "cpu-torch.yaml"), *SITE, "--no-build", "--out", str(out))
    assert probe.code == 0, probe.err
    keep_for_run(json.loads((out / "manifest.json").read_text())["image"]["tag"])
    t0 = time.time()
    r = run_envbuilder("build", str(RECIPES / "cpu-torch.yaml"), *SITE, "--out", str(out), "--sif",
                       "--ca-bundle", CA_BUNDLE, "--wheelhouse", wheelhouse(), timeout=2400)
    assert r.code == 0, r.err[-3000:]
    print(f"\ncpu-torch: build (cached) + envbuilder's .sif {time.time() - t0:.0f} s")
    sif = out / "cpu-torch-horovod.sif"
    assert sif.is_file() and "(apptainer runtime)" in (out / "job.sbatch").read_text()
    chown_tree(ac_shared, BUILDER_UID)
    return out, sif


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


def test_smoke_suite_horovod_mpi_and_gloo_on_two_nodes_through_apptainer(hvd_sif):
    folder, sif = hvd_sif
    code, job_id, log, wall = sbatch(folder, *TWO_BY_TWO, timeout=600)
    assert code == 0, log[-4000:]
    assert f"job {job_id}: 4 rank(s) on 2 node(s), apptainer" in log
    summary = re.search(r"^(\d+) passed, (\d+) failed, (\d+) skipped in ([\d.]+) s$", log, re.M)
    assert summary and summary.group(2) == "0", log[-4000:]
    for line in (r"horovod\.init\[mpi\] +PASS +4 ranks, mpi controller",
                 r"horovod\.init\[gloo\] +PASS +4 ranks, gloo controller",
                 r"allreduce\.exact\[mpi\] +PASS", r"allreduce\.exact\[gloo\] +PASS",
                 r"train\.pytorch\[mpi\] +PASS", r"horovod\.operations +PASS +mpi, gloo"):
        assert re.search(line, log), (line, log[-4000:])
    # Gloo's rendezvous names where each rank ran: 2 per node
    assert "ac-n1: rank 0,1, ac-n2: rank 2,3" in log, log[-4000:]
    report = json.loads((folder / "runs" / job_id / "smoke-report.json").read_text())
    assert report["ok"] is True
    print(f"apptainer, smoke suite 2x2 (Horovod MPI + Gloo): {summary.group(1)} passed in "
          f"{summary.group(4)} s, job {wall:.0f} s from submission to its end")


def test_the_singularity_name_runs_a_horovod_allreduce_across_two_nodes(hvd_sif):
    """Debian's package installs `singularity` beside `apptainer`; job.sbatch for that runtime
    runs the same .sif. Each of 4 ranks on 2 nodes sees the world of 4 and the exact sum 0+1+2+3."""
    folder, sif = hvd_sif
    job = build_job(folder.parent / "singularity", "--runtime", "singularity")
    assert "(singularity runtime)" in (job / "job.sbatch").read_text()
    t0 = time.time()
    code, job_id, log, wall = sbatch(job, *TWO_BY_TWO, "python", "-c", HVD_RECORD, env={"ENVBUILDER_IMAGE": str(sif)})
    assert code == 0, log[-4000:]
    records = [json.loads(p.read_text()) for p in sorted((job / "runs" / job_id).glob("rank-*.json"))]
    assert sorted((r["rank"], r["host"]) for r in records) == [(0, "ac-n1"), (1, "ac-n1"), (2, "ac-n2"), (3, "ac-n2")]
    assert all(r["size"] == 4 and r["sum"] == 6.0 and r["rank"] == r["slurm_rank"] for r in records), records
    up = max(r["up"] for r in records) - t0
    print(f"singularity 2x2 Horovod/MPI allreduce: submission to all ranks up {up:.1f} s, job {wall:.1f} s")


def build_job(out: Path, *args: str) -> Path:
    r = run_envbuilder("build", str(RECIPES / "cpu-torch.yaml"), *SITE, "--no-build", "--out", str(out), *args)
    assert r.code == 0, r.err
    chown_tree(out, BUILDER_UID)
    return out


PRINT_RANK = ("import horovod.torch as hvd, socket; hvd.init(); "
              "print('rank', hvd.rank(), 'of', hvd.size(), socket.gethostname(), flush=True)")


def test_cleanenv_makes_every_rank_rank_0_and_job_sbatch_names_it_before_any_rank(hvd_sif):
    """The trap for real: `srun --mpi=pmix apptainer exec --cleanenv` drops srun's SLURM_*/PMIX_*
    variables, and each of the 4 Horovod ranks is rank 0 of 1 (research/apptainer.md, trap 4).
    A site module or ~/.bashrc sets the same with APPTAINER_CLEANENV=1 or APPTAINER_CONTAINALL=1:
    job.sbatch then stops before any rank (exit 2), naming the variable and the fix; before, its
    ranks ended with 'rank_main: command not found' (exit 127)."""
    folder, sif = hvd_sif
    # Open MPI on the fabric interface, as job.sbatch sets it (the management network drops
    # node-to-node traffic here, and a rank trying it would hang)
    ompi = {"OMPI_MCA_btl_tcp_if_include": "fab0", "OMPI_MCA_oob_tcp_if_include": "fab0"}
    seen = {}
    for flag in ("", "--cleanenv"):
        p = on_apptainer_login(["srun", *TWO_BY_TWO, "--mpi=pmix", "apptainer", "-s", "exec", *filter(None, [flag]),
                                str(sif), "python", "-c", PRINT_RANK], folder, timeout=180, env=ompi)
        assert p.returncode == 0, p.stderr[-3000:]
        seen[flag] = sorted(re.findall(r"^rank (\d+) of (\d+) (ac-n\d)$", p.stdout, re.M))
    assert seen[""] == [("0", "4", "ac-n1"), ("1", "4", "ac-n1"), ("2", "4", "ac-n2"), ("3", "4", "ac-n2")], seen
    assert seen["--cleanenv"] == [("0", "1", "ac-n1")] * 2 + [("0", "1", "ac-n2")] * 2, seen

    for var, what in (("APPTAINER_CLEANENV", "--cleanenv drops"), ("APPTAINER_CONTAINALL", "--containall (also a private /tmp and /dev/shm per rank) drops")):
        code, job_id, log, _ = sbatch(folder, *TWO_BY_TWO, "python", "-c", "print('a rank ran')", env={var: "1"})
        assert code == 2, log[-3000:]
        assert (f"envbuilder: error: apptainer: {var}=1 is set: {what} the SLURM_* and PMIX_* variables of srun in "
                "every container, so each rank starts alone as rank 0 of 1") in log, log[-3000:]
        assert f"unset it for this job: env -u {var} sbatch job.sbatch" in log
        assert "a rank ran" not in log and "command not found" not in log, log[-3000:]


def test_scancel_leaves_no_node_local_folder(hvd_sif):
    """A job cancelled while its ranks run: the node Epilog (cluster.local_cleanup: epilog) removes
    its node-local folder (throw-away HOME, bound into every container) on both nodes."""
    folder, sif = hvd_sif
    proc = on_apptainer_login(["sbatch", "--parsable", *TWO_BY_TWO, "job.sbatch", "sleep", "300"], folder)
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip().split(";")[0]
    local = [ROOT / "local" / n / f"envbuilder.{job_id}" for n in ("ac-n1", "ac-n2")]
    try:
        assert wait_for(lambda: all(p.is_dir() for p in local), 120), job_log(folder, job_id)[-3000:]
        assert wait_for(lambda: rank_started(folder, job_id), 60), job_log(folder, job_id)[-3000:]
    finally:
        assert on_apptainer_login(["scancel", job_id], folder).returncode == 0
    t0 = time.time()
    assert wait_for(lambda: not any(p.exists() for p in local), 60), [str(p) for p in local if p.exists()]
    print(f"scancel: both node-local folders gone {time.time() - t0:.1f} s after it")


def rank_started(folder: Path, job_id: str) -> bool:
    show = on_apptainer_login(["squeue", "-h", "-s", "-j", job_id, "-o", "%i"], folder).stdout
    return f"{job_id}.1" in show      # step 0: the node set-up; step 1: the ranks



@pytest.fixture(scope="module")
def ddp_sif(ac_shared):
    """cpu-torch-ddp (torch.distributed, no MPI) built with the cluster's site (its own tag: the
    "cluster" group's image of the preset is not rebuilt) and written as a .sif."""
    base_image()
    out = ac_shared / "cpu-torch-ddp"
    probe = run_envbuilder("build", str(RECIPES / "cpu-torch-ddp.yaml"), *SITE, "--no-build", "--out", str(out))
    assert probe.code == 0, probe.err
    keep_for_run(json.loads((out / "manifest.json").read_text())["image"]["tag"])
    r = run_envbuilder("build", str(RECIPES / "cpu-torch-ddp.yaml"), *SITE, "--out", str(out), "--sif",
                       "--ca-bundle", CA_BUNDLE, "--wheelhouse", wheelhouse(), timeout=2400)
    assert r.code == 0, r.err[-3000:]
    chown_tree(out, BUILDER_UID)
    return out


@long_build
def test_torch_distributed_smoke_suite_on_two_nodes_through_apptainer(ddp_sif):
    """DDP across 2 nodes x 2 ranks under Apptainer (Gloo, rendezvous at the first node's fabric
    address). Outside CI's budget (another .sif and job, about 100 s): ENVBUILDER_LONG_BUILDS=1."""
    code, job_id, log, wall = sbatch(ddp_sif, *TWO_BY_TWO, timeout=600)
    assert code == 0, log[-4000:]
    summary = re.search(r"^(\d+) passed, (\d+) failed, (\d+) skipped in ([\d.]+) s$", log, re.M)
    assert summary and summary.group(2) == "0", log[-4000:]
    for line in (r"dist\.init\[torch\] +PASS +4 ranks, gloo", r"dist\.collectives\[torch\] +PASS +\d+ cases exact",
                 r"train\.ddp\[torch\] +PASS +loss"):
        assert re.search(line, log), (line, log[-4000:])
    print(f"apptainer, smoke suite 2x2 (torch.distributed): {summary.group(1)} passed in {summary.group(4)} s, "
          f"job {wall:.0f} s from submission to its end")
