"""job.sbatch through the real Apptainer on 2 nodes: the cluster of `tools/minicluster --flavor
apptainer` (ac-ctl, ac-n1, ac-n2: Debian 13, Slurm 24.11 with PMIx 5, Apptainer 1.4.5 from the image
of .ci/install-apptainer.sh), jobs submitted by the non-root user `builder` on the controller, its
login node (this machine's Slurm 22.05 cannot talk to 24.11), ranks started by `srun --mpi=pmix
apptainer exec IMAGE.sif`, one user namespace per rank, as on a site running Apptainer unprivileged.

The image: cpu-torch (torch + Horovod with its MPI and Gloo controllers, Debian's Open MPI 4.1.4
with its PMIx client), written as a .sif by envbuilder (`build --sif`) into the cluster's shared
folder. Covered: `envbuilder verify --slurm` run on the login node (this checkout's package, the
image's venv), 2 nodes x 2 ranks: Horovod over MPI and over Gloo, the placement and the fabric
check (`fabric: tcp`: Open MPI's pml/btl read inside each rank's container); the same .sif through
`singularity` (Debian's package installs the name) with node vetting, a Horovod allreduce across
the 4 ranks, with the time from submission to all ranks up; the --cleanenv/--containall trap
reproduced with Apptainer itself (every rank "rank 0 of 1") and named by job.sbatch before any
rank; a variable the image sets keeping the image's value over the host's, and cluster.env
handed over as APPTAINERENV_* (with CMA forced that way, Open MPI stops naming the ranks' user
namespaces); the node-local folders removed after scancel. The site's
`OMPI_MCA_mpi_yield_when_idle=1` (sites/minicluster-apptainer.yaml) keeps Open MPI's busy-polling
ranks from starving each other on the shared cores. With ENVBUILDER_LONG_BUILDS=1 also
cpu-torch-ddp's smoke suite (torch.distributed) on 2 nodes x 2, the MPICH and Open MPI wheels'
own MPIs (srun --mpi=pmi2, pmix) with an mpi4py allreduce on 2 x 2, and Intel MPI injected as the
site's MPI into the MPICH wheel image's .sif (binds + APPTAINERENV_LD_LIBRARY_PATH), with
`verify --slurm` naming it per node. The ranks run from a node-local copy of the .sif in the
scancel test (ENVBUILDER_STAGE_IMAGE=1)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from apptainer_cluster import (BUILDER_UID, ROOT, SITE, TWO_BY_TWO, chown_tree, job_log, login_runner, sbatch,
                               shared_folder, site_variant)
from conftest import RECIPES, run_envbuilder
from infra import wait_for, base_image, keep_for_run, long_build, on_apptainer_login, wheelhouse

CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"

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


@pytest.fixture(scope="module")
def ac_shared():
    """A folder of the Apptainer cluster's shared file system, the user builder's."""
    yield from shared_folder()


@pytest.fixture(scope="module")
def hvd_sif(ac_shared):
    """cpu-torch built with the cluster's site (the image kept for the run: its module group,
    "cpu-torch", builds it from the build cache) and written as a .sif beside job.sbatch."""
    base_image()
    out = ac_shared / "cpu-torch"
    probe = run_envbuilder("build", str(RECIPES / "cpu-torch-horovod.yaml"), *SITE, "--no-build", "--out", str(out))
    assert probe.code == 0, probe.err
    keep_for_run(json.loads((out / "manifest.json").read_text())["image"]["tag"])
    t0 = time.time()
    r = run_envbuilder("build", str(RECIPES / "cpu-torch-horovod.yaml"), *SITE, "--out", str(out), "--sif",
                       "--ca-bundle", CA_BUNDLE, "--wheelhouse", wheelhouse(), timeout=2400)
    assert r.code == 0, r.err[-3000:]
    print(f"\ncpu-torch: build (cached) + envbuilder's .sif {time.time() - t0:.0f} s")
    sif = out / "cpu-torch-horovod.sif"
    assert sif.is_file() and "(apptainer runtime)" in (out / "job.sbatch").read_text()
    chown_tree(ac_shared, BUILDER_UID)
    return out, sif


@pytest.fixture(scope="module")
def login_envbuilder(ac_shared):
    """envbuilder as builder on the login node: apptainer_cluster.login_runner."""
    return login_runner(ac_shared)


def test_verify_slurm_horovod_mpi_gloo_and_the_fabric_check_on_two_nodes_through_apptainer(hvd_sif, login_envbuilder):
    """`envbuilder verify FOLDER --slurm --nodes 2 --ranks 4` on the cluster's login node: its job.sbatch
    (the site with `fabric: tcp`) runs the smoke suite, 2 nodes x 2 ranks, every rank through
    `apptainer exec`: Horovod over MPI and over Gloo, the placement, and the fabric check, which
    reads Open MPI's pml/btl inside each rank's container."""
    folder, sif = hvd_sif
    site = site_variant(folder.parent, "ac-tcp", "fabric: tcp\n")
    job = build_job(folder.parent / "verify", "--site", str(site))
    report = job / "report.json"
    t0 = time.time()
    p = login_envbuilder(job, "verify", str(job), "--slurm", "--nodes", "2", "--ranks", "4", "--image", str(sif),
                         "--report", str(report))
    wall = time.time() - t0
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    out = p.stdout
    assert re.search(r"^OK: cpu-torch-horovod \(slurm job \d+, apptainer, 4 rank\(s\) on 2 node\(s\)\)", out, re.M), out[-3000:]
    for line in (r"horovod\.init\[mpi\] +PASS +4 ranks, mpi controller",
                 r"horovod\.init\[gloo\] +PASS +4 ranks, gloo controller",
                 r"allreduce\.exact\[mpi\] +PASS", r"allreduce\.exact\[gloo\] +PASS",
                 r"train\.pytorch\[mpi\] +PASS", r"horovod\.operations +PASS +mpi, gloo",
                 r"slurm\.placement +PASS +ac-n1: 2, ac-n2: 2"):
        assert re.search(line, out), (line, out[-4000:])
    checks = {c["name"]: c for c in json.loads(report.read_text())["checks"]}
    assert checks["fabric"]["status"] == "pass" and "fabric tcp: TCP expected" in checks["fabric"]["detail"], checks["fabric"]
    bw = {k: checks[f"perf.allreduce[{k}]"]["detail"].rsplit(";", 1)[-1].strip() for k in ("mpi", "gloo")}
    print(f"apptainer, verify --slurm 2x2 (Horovod MPI + Gloo, fabric tcp: {checks['fabric']['figure']}): "
          f"{wall:.0f} s; 16 MiB allreduce MPI {bw['mpi']}, Gloo {bw['gloo']}")


def test_the_singularity_name_runs_a_horovod_allreduce_across_two_nodes(hvd_sif):
    """Debian's package installs `singularity` beside `apptainer`; job.sbatch for that runtime
    runs the same .sif, with node vetting (cluster.vet_min_nodes: the image's own check on each
    node, through singularity). Each of 4 ranks on 2 nodes sees the world of 4 and the exact sum
    0+1+2+3."""
    folder, sif = hvd_sif
    site = site_variant(folder.parent, "ac-vet", "vet_min_nodes: 1\n")
    job = build_job(folder.parent / "singularity", "--runtime", "singularity", "--site", str(site))
    assert "(singularity runtime)" in (job / "job.sbatch").read_text()
    t0 = time.time()
    code, job_id, log, wall = sbatch(job, *TWO_BY_TWO, "python", "-c", HVD_RECORD, env={"ENVBUILDER_IMAGE": str(sif)})
    assert code == 0, log[-4000:]
    # node vetting (cluster.vet_min_nodes): the image's own check on each node, through singularity
    assert "vetting: 2 of 2 node(s) passed" in log and "left out" not in log, log[-3000:]
    for node in ("ac-n1", "ac-n2"):
        assert re.search(rf"vetting: {node}: compute \d+ Mflop/s, allreduce within the node \d+ MB/s", log), log[-3000:]
    records = [json.loads(p.read_text()) for p in sorted((job / "runs" / job_id).glob("rank-*.json"))]
    assert sorted((r["rank"], r["host"]) for r in records) == [(0, "ac-n1"), (1, "ac-n1"), (2, "ac-n2"), (3, "ac-n2")]
    assert all(r["size"] == 4 and r["sum"] == 6.0 and r["rank"] == r["slurm_rank"] for r in records), records
    up = max(r["up"] for r in records) - t0
    vet_s = re.search(r"passed in (\d+) s", log)
    print(f"singularity 2x2 Horovod/MPI allreduce with node vetting (its step {vet_s.group(1) if vet_s else '?'} s): "
          f"submission to all ranks up {up:.1f} s, job {wall:.1f} s")


def build_job(out: Path, *args: str) -> Path:
    r = run_envbuilder("build", str(RECIPES / "cpu-torch-horovod.yaml"), *SITE, "--no-build", "--out", str(out), *args)
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


VADER = "OMPI_MCA_btl_vader_single_copy_mechanism"
PRINT_ENV = ("import os; print('seen', os.environ.get('%s'), os.environ.get('OMPI_MCA_mpi_yield_when_idle'), "
             "os.environ.get('ODD'), flush=True)" % VADER)


def test_a_variable_the_image_sets_wins_over_the_hosts_unless_handed_over_as_apptainerenv(hvd_sif):
    """Apptainer passes a host variable only where the image does not set it: the image's
    OMPI_MCA_btl_vader_single_copy_mechanism=none stayed none with the host's cma (so a by-hand
    "CMA between the ranks' user namespaces works" was never CMA). job.sbatch hands cluster.env over
    as APPTAINERENV_*: the ranks see the site's value, a `$` in it unexpanded; with cma for real,
    Open MPI 4.1 stops every rank naming the cause (research/apptainer.md, trap 5: each `apptainer
    exec` is its own user namespace, and CMA cannot cross them)."""
    folder, sif = hvd_sif
    raw = on_apptainer_login(["apptainer", "-s", "exec", str(sif), "python", "-c", PRINT_ENV], folder,
                             env={VADER: "cma", "ODD": "x"})
    assert raw.returncode == 0 and raw.stdout.split() == ["seen", "none", "None", "x"], raw.stdout + raw.stderr
    site = site_variant(folder.parent, "ac-cma", "")
    site.write_text(site.read_text().replace('env: {OMPI_MCA_mpi_yield_when_idle: "1"}',
                                             'env: {OMPI_MCA_mpi_yield_when_idle: "1", %s: cma, ODD: "a$HOME"}' % VADER))
    job = build_job(folder.parent / "cma", "--site", str(site))
    image = {"ENVBUILDER_IMAGE": str(sif)}
    code, job_id, log, _ = sbatch(job, "--nodes=1", "--ntasks-per-node=1", "python", "-c", PRINT_ENV, env=image)
    assert code == 0 and "seen cma 1 a$HOME" in log, log[-3000:]
    code, job_id, log, wall = sbatch(job, "--nodes=1", "--ntasks-per-node=2", "python", "-c", PRINT_RANK, env=image)
    words = " ".join(log.split())         # Open MPI's help text is wrapped
    assert code != 0 and "CMA support is not available due to different user namespaces" in words, log[-3000:]
    print(f"{VADER}=cma handed over: Open MPI stopped the ranks naming the user namespaces ({wall:.0f} s)")


def test_scancel_leaves_no_node_local_folder(hvd_sif):
    """A job cancelled while its ranks run: the node Epilog (cluster.local_cleanup: epilog) removes
    its node-local folder (throw-away HOME, bound into every container) on both nodes. Submitted
    with ENVBUILDER_STAGE_IMAGE=1: each node copied the .sif into that folder first, and every rank
    runs from its node's copy (APPTAINER_CONTAINER); the copies go with the folder."""
    folder, sif = hvd_sif
    where = "echo rank $SLURM_PROCID on $(hostname) from $APPTAINER_CONTAINER; sleep 300"
    proc = on_apptainer_login(["sbatch", "--parsable", *TWO_BY_TWO, "job.sbatch", "sh", "-c", where], folder,
                              env={"ENVBUILDER_STAGE_IMAGE": "1"})
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip().split(";")[0]
    local = [ROOT / "local" / n / f"envbuilder.{job_id}" for n in ("ac-n1", "ac-n2")]
    try:
        assert wait_for(lambda: all(p.is_dir() for p in local), 120), job_log(folder, job_id)[-3000:]
        assert wait_for(lambda: rank_started(folder, job_id), 60), job_log(folder, job_id)[-3000:]
        assert wait_for(lambda: job_log(folder, job_id).count(" from /local/") == 4, 60), job_log(folder, job_id)[-3000:]
        log = job_log(folder, job_id)
        for n, node in enumerate(("ac-n1", "ac-n2")):
            assert (local[n] / "image" / sif.name).stat().st_size == sif.stat().st_size
            assert f"staged the image {sif} to {node}:/local/envbuilder.{job_id}/image/{sif.name}" in log, log[-3000:]
        assert sorted(re.findall(r"^rank (\d) on (ac-n\d) from (\S+)$", log, re.M)) == [
            (str(r), f"ac-n{r // 2 + 1}", f"/local/envbuilder.{job_id}/image/{sif.name}") for r in range(4)], log[-3000:]
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


def wheel_sif(ac_shared: Path, name: str, mpi: str) -> tuple[Path, Path]:
    """The MPI-wheel image of tests/test_mpi_pypi.py (mpi4py, no Horovod) with MPI under NAME (its
    own tag from the same cached layers: the "cluster" group's image of that spec is not rebuilt
    under it), written as a .sif: (spec, .sif)."""
    from test_mpi_pypi import spec_file

    base_image()
    (ac_shared / name).mkdir()
    spec = spec_file(ac_shared / name, name, mpi)
    out = ac_shared / name / "image"
    probe = run_envbuilder("build", str(spec), "--no-build", "--out", str(out))
    assert probe.code == 0, probe.err
    keep_for_run(json.loads((out / "manifest.json").read_text())["image"]["tag"])
    t0 = time.time()
    r = run_envbuilder("build", str(spec), "--out", str(out), "--sif", "--ca-bundle", CA_BUNDLE,
                       "--wheelhouse", wheelhouse(), timeout=2400)
    assert r.code == 0, r.err[-3000:]
    print(f"\n{name}: build + envbuilder's .sif {time.time() - t0:.0f} s")
    chown_tree(ac_shared / name, BUILDER_UID)
    return spec, out / f"{name}.sif"


@pytest.fixture(scope="module")
def mpich_sif(ac_shared):
    from test_mpi_pypi import MPICH

    return wheel_sif(ac_shared, "mpi-mpich-pypi-ac", MPICH)


@pytest.fixture(scope="module")
def ompi_sif(ac_shared):
    from test_mpi_pypi import OMPI

    return wheel_sif(ac_shared, "mpi-ompi-pypi-ac", OMPI)


@pytest.fixture
def impi_on_ac_nodes(tmp_path):
    """Intel MPI (impi-rt, tests/test_mpi_pypi.py impi_folder) as the site's MPI in /local/<name>/lib
    of both nodes of this cluster (node-local, as a site's /opt/intel is): its path on the nodes."""
    from test_mpi_pypi import impi_on_cluster_nodes

    with impi_on_cluster_nodes(tmp_path, root=ROOT, nodes=("ac-n1", "ac-n2")) as path:
        yield path


MPI_RECORD = """\
import json, os, socket
from mpi4py import MPI
c = MPI.COMM_WORLD
s = c.allreduce(c.rank + 1)
json.dump({"rank": c.rank, "size": c.size, "host": socket.gethostname(), "sum": s,
           "lib": MPI.Get_library_version().splitlines()[0], "ld": os.environ.get("LD_LIBRARY_PATH"),
           "path": next((l.split()[-1] for l in open("/proc/self/maps") if "/libmpi" in l), None)},
          open(os.path.join(os.environ["OUTPUT_DIR"], "mpi-%d.json" % c.rank), "w"))
"""


def mpi_job(ac_shared: Path, spec: Path, name: str, extra: str, sif: Path,
            pmi: str = "pmi2") -> tuple[list[dict], Path, float]:
    """job.sbatch of SPEC with the site plus EXTRA (srun --mpi=PMI: pmi2 for the MPICH wheel) running
    MPI_RECORD on 2 nodes x 2 ranks: (the ranks' records in rank order, the job folder, seconds)."""
    site = site_variant(ac_shared, name, extra)
    site.write_text(site.read_text().replace("pmi: pmix", f"pmi: {pmi}"))
    job = ac_shared / f"job-{name}"
    r = run_envbuilder("build", str(spec), "--site", str(site), "--no-build", "--out", str(job))
    assert r.code == 0, r.err
    (job / "mpi_record.py").write_text(MPI_RECORD)
    chown_tree(job, BUILDER_UID)
    code, job_id, log, wall = sbatch(job, *TWO_BY_TWO, "python", "mpi_record.py", env={"ENVBUILDER_IMAGE": str(sif)})
    assert code == 0, log[-4000:]
    recs = [json.loads(p.read_text()) for p in sorted((job / "runs" / job_id).glob("mpi-*.json"))]
    assert [(r["rank"], r["host"]) for r in recs] == [(0, "ac-n1"), (1, "ac-n1"), (2, "ac-n2"), (3, "ac-n2")], recs
    assert all(r["size"] == 4 and r["sum"] == 10 for r in recs), recs
    return recs, job, wall


@long_build
def test_intel_mpi_injected_as_the_site_mpi_through_apptainer_on_two_nodes(ac_shared, mpich_sif, impi_on_ac_nodes,
                                                                             login_envbuilder):
    """The MPICH 5.0.2 wheel's own MPI through Apptainer under srun --mpi=pmi2 first (2 x 2, every
    rank on the image's /opt/venv/lib/libmpi.so.12); then
    cluster.site_mpi with Apptainer's own mechanism: the site's folder bound (--bind) and put
    first by APPTAINERENV_LD_LIBRARY_PATH ahead of the image's own path (/opt/venv/lib, which the
    image's ENV sets), site_mpi_env handed over as APPTAINERENV_*. Every rank of 2 nodes x 2 runs
    Intel MPI 2021.19 in the MPICH image under srun --mpi=pmi2, and `verify --slurm` (on the login
    node) names it per node in mpi.library. Outside CI's budget (another image and .sif, about
    2 minutes): ENVBUILDER_LONG_BUILDS=1."""
    spec, sif = mpich_sif
    own, _, own_s = mpi_job(ac_shared, spec, "ac-mpich", "", sif)
    assert all(r["lib"].startswith("MPICH Version:") and r["path"] == "/opt/venv/lib/libmpi.so.12" for r in own), own
    recs, job, wall = mpi_job(ac_shared, spec, "ac-impi", f"site_mpi: [{impi_on_ac_nodes}]\nsite_mpi_abi: mpich\n"
                                                         "site_mpi_env: {FI_PROVIDER: tcp}\n", sif)
    text = (job / "job.sbatch").read_text()
    assert "export APPTAINERENV_LD_LIBRARY_PATH" in text and 'add_bind "$p" cluster.site_mpi' in text
    assert all(r["lib"].startswith("Intel(R) MPI Library 2021.19") and r["path"] == f"{impi_on_ac_nodes}/libmpi.so.12"
               for r in recs), recs
    # the site's folder first, once; the image's own path after it
    assert all(r["ld"].startswith(f"{impi_on_ac_nodes}:/opt/venv/lib:") and r["ld"].count(impi_on_ac_nodes) == 1
               for r in recs), [r["ld"] for r in recs]
    report = job / "report.json"
    p = login_envbuilder(job, "verify", str(job), "--slurm", "--nodes", "2", "--ranks", "4", "--image", str(sif),
                         "--report", str(report))
    assert report.is_file(), (p.stdout + p.stderr)[-4000:]
    lib = {c["name"]: c for c in json.loads(report.read_text())["checks"]}["mpi.library"]
    assert lib["status"] == "pass" and f"the site MPI under {impi_on_ac_nodes}" in lib["detail"], lib
    assert sorted(lib["data"]["library"]) == ["ac-n1", "ac-n2"], lib
    assert all(v["flavor"] == "intel-mpi" for v in lib["data"]["library"].values()), lib
    assert p.returncode == 0, p.stdout[-4000:]
    print(f"MPICH wheel through Apptainer, 2 x 2 (pmi2): job {own_s:.0f} s; Intel MPI injected into its .sif: job "
          f"{wall:.0f} s; verify --slurm passed")


@long_build
def test_open_mpi_wheel_allreduce_through_apptainer_under_pmix_on_two_nodes(ac_shared, ompi_sif):
    """The Open MPI 5.0.11 wheel (its PMIx 5 client against Slurm 24.11's PMIx 5 server) through
    Apptainer, srun --mpi=pmix, 2 nodes x 2 ranks: every rank on the image's libmpi.so.40, the sum
    exact. Outside CI's budget (another image and .sif): ENVBUILDER_LONG_BUILDS=1."""
    spec, sif = ompi_sif
    recs, _, wall = mpi_job(ac_shared, spec, "ac-ompi", "", sif, pmi="pmix")
    assert all(r["lib"].startswith("Open MPI v5.0.11") and r["path"] == "/opt/venv/lib/libmpi.so.40" for r in recs), recs
    print(f"Open MPI 5.0.11 wheel through Apptainer, 2 x 2 (pmix): job {wall:.0f} s")
