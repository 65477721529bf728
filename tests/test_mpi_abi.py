"""The MPI-5 standard ABI (`mpi: {abi: standard}`, issue 21 item 2), for real where an engine is here.

Without engines: the recipe (mpicc_abi probe linking libmpi_abi.so.1, the manifest's library) and
`envbuilder check --site` refusing an ABI mismatch either way. On the 2 nodes of tools/minicluster
(a small stack, no Horovod compile: the MPICH 5.0.2 wheel image built with abi: standard, torch CPU
from the wheelhouse, no mpi4py, whose wheel has no standard-ABI build): a C allreduce compiled with
the MPICH wheel's mpicc_abi runs 2 nodes x 2 ranks under srun --mpi=pmi2 on the image's own
libmpi_abi.so.1, and with Intel MPI's libmpi_abi.so.1 (impi-rt) injected as the site's standard-ABI
MPI; `verify --slurm` names the library per node in `mpi.library` both times.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import zipfile
from pathlib import Path

import pytest

from conftest import run_envbuilder
from envbuilder.generate import generate
from envbuilder.spec import load_spec
from infra import long_build, require_binary
from test_mpi_pypi import MPICH, impi_on_cluster_nodes, site_file, spec_file

ABI = MPICH.replace("source: pypi}", "source: pypi, abi: standard}")
NODES = ("mc-n1", "mc-n2")
PLACED = {0: "mc-n1", 1: "mc-n1", 2: "mc-n2", 3: "mc-n2"}

# every rank adds rank+1 over 4 MiB of floats; each writes rank, size, host, first, last, the libmpi
# mapped into it (/proc/self/maps) and MPI_Get_library_version's first line
ALLREDUCE_C = r"""
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size, len, n = 1 << 20;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
    for (int i = 0; i < n; i++) x[i] = (float)(rank + 1);
    MPI_Allreduce(x, y, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    char lib[MPI_MAX_LIBRARY_VERSION_STRING], host[256], line[4096], path[4096] = "", out[4096];
    MPI_Get_library_version(lib, &len);
    lib[strcspn(lib, "\n")] = 0;
    gethostname(host, sizeof host);
    FILE *maps = fopen("/proc/self/maps", "r");
    while (maps && fgets(line, sizeof line, maps))
        if (strstr(line, "/libmpi")) { char *p = strchr(line, '/'); p[strcspn(p, "\n")] = 0; strcpy(path, p); break; }
    snprintf(out, sizeof out, "%s/abi-%d.txt", getenv("OUTPUT_DIR"), rank);
    FILE *f = fopen(out, "w");
    fprintf(f, "%d\t%d\t%s\t%g\t%g\t%s\t%s\n", rank, size, host, y[0], y[n - 1], path, lib);
    fclose(f);
    MPI_Finalize();
    return 0;
}
"""


# --------------------------------------------------------------------------- no engine needed

def test_the_standard_abi_recipe_links_libmpi_abi_and_the_manifest_says_so(tmp_path):
    files = {k: v.decode() for k, v in generate(load_spec(spec_file(tmp_path, "a", ABI))).files.items()
             if k in ("Dockerfile", "manifest.json")}
    docker = files["Dockerfile"]
    assert "/opt/venv/bin/mpicc_abi /tmp/mpi-probe.c -o /tmp/mpi-probe" in docker
    assert "ldd /tmp/mpi-probe | grep -q 'libmpi_abi.so.1 => /opt/venv/lib/'" in docker
    expect = json.loads(files["manifest.json"])["expect"]["mpi"]
    assert expect["abi"] == "standard" and expect["library"] == "/opt/venv/lib/libmpi_abi.so.1", expect
    hvd = generate(load_spec(spec_file(tmp_path, "h", ABI, 'horovod: {version: "0.28.1", operations: [mpi, gloo]}\n')))
    docker = hvd.files["Dockerfile"].decode()
    assert "exec /opt/venv/bin/mpicxx_abi" in docker and 'export CFLAGS="-DMPI_ABI" CXXFLAGS="-DMPI_ABI"' in docker
    assert "does not link libmpi_abi.so.1" in docker


def test_check_site_refuses_an_abi_mismatch_either_way(tmp_path):
    standard = site_file(tmp_path, "site_mpi: [/opt/site/impi/lib]\nsite_mpi_abi: standard\n")
    ok = run_envbuilder("check", str(spec_file(tmp_path, "a", ABI)), "--site", str(standard))
    assert ok.code == 0, ok.err
    r = run_envbuilder("check", str(spec_file(tmp_path, "m", MPICH)), "--site", str(standard))
    assert r.code == 2 and "SITE_MPI_ABI" in r.err and "the image's mpich code links libmpi.so.12" in r.err, r.err
    (tmp_path / "mpich-site").mkdir()
    mpich = site_file(tmp_path / "mpich-site", "site_mpi: [/opt/site/impi/lib]\nsite_mpi_abi: mpich\n")
    r = run_envbuilder("check", str(spec_file(tmp_path, "a", ABI)), "--site", str(mpich))
    assert r.code == 2 and "SITE_MPI_ABI" in r.err and "cannot replace it" in r.err, r.err
    assert "Traceback" not in r.err
    with_mpi4py = tmp_path / "m4.yaml"
    with_mpi4py.write_text(spec_file(tmp_path, "a", ABI).read_text() + 'packages: {pip: ["mpi4py==4.1.2"]}\n')
    r = run_envbuilder("check", str(with_mpi4py))
    assert r.code == 2 and "MPI_ABI" in r.err and "packages.pip" in r.err, r.err


# --------------------------------------------------------------------------- real: 2 nodes

@pytest.fixture(scope="module")
def abi_program(cluster, shared, tmp_path_factory):
    """ALLREDUCE_C compiled on this (login) node with the MPICH wheel's mpicc_abi, in the shared
    folder. Compiled off the shared folder, so the RUNPATH the wrapper writes names no folder the
    nodes have: the image's LD_LIBRARY_PATH (or the site's in front) decides."""
    require_binary("gcc", "apt-get install gcc")
    tmp = tmp_path_factory.mktemp("mpicc-abi")
    proc = subprocess.run(["pip", "download", "--no-deps", "-d", str(tmp / "wheels"), "mpich==5.0.2"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    prefix = tmp / "mpich"
    with zipfile.ZipFile(next((tmp / "wheels").glob("mpich-*.whl"))) as z:
        for name in z.namelist():
            if ".data/data/" in name and not name.endswith("/"):
                dest = prefix / name.split(".data/data/", 1)[1]
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(z.read(name))
    for w in (prefix / "bin").iterdir():
        w.chmod(0o755)
    (tmp / "allreduce.c").write_text(ALLREDUCE_C)
    proc = subprocess.run([str(prefix / "bin" / "mpicc_abi"), str(tmp / "allreduce.c"), "-o", str(tmp / "allreduce")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ldd = subprocess.run(["ldd", str(tmp / "allreduce")], capture_output=True, text=True).stdout
    assert "libmpi_abi.so.1" in ldd and "libmpi.so.12" not in ldd, ldd
    (shared / "abi-bin").mkdir()
    program = shared / "abi-bin" / "abi-allreduce"          # bound into the container (site binds)
    shutil.copy2(tmp / "allreduce", program)
    return program


@pytest.fixture(scope="module")
def abi_image(cluster, shared):
    from test_mpi_multinode import converted
    return converted(shared, "mpi-mpich-abi", ABI)


@pytest.fixture(scope="module")
def impi_abi_on_nodes(cluster, tmp_path_factory):
    """Intel MPI's standard-ABI library (impi-rt libmpi_abi.so.1) in /local/<name>/lib of both nodes."""
    with impi_on_cluster_nodes(tmp_path_factory.mktemp("impi-abi"), "libmpi_abi.so.1", "impi-abi") as path:
        yield path


def run_program(cluster, folder: Path, directory: str, program: Path) -> list[list[str]]:
    from test_multinode import sbatch_wait
    t0 = time.time()
    code, job_id, log = sbatch_wait({**cluster, "ENVBUILDER_IMAGE": directory}, folder / "job.sbatch",
                                    "--nodes=2", "--ntasks-per-node=2", str(program))
    assert code == 0, log[-4000:]
    recs = [p.read_text().rstrip("\n").split("\t") for p in sorted((folder / "runs" / job_id).glob("abi-*.txt"))]
    assert {int(r[0]): r[2] for r in recs} == PLACED, recs
    assert all(r[1] == "4" and r[3] == r[4] == "10" for r in recs), recs
    print(f"{recs[0][6]}: C allreduce built with mpicc_abi, 2 nodes x 2 ranks, job {time.time() - t0:.1f} s")
    return recs


def library_per_node(cluster, folder: Path, directory: str) -> dict:
    from test_multinode import checks
    report = folder / "report.json"
    r = run_envbuilder("verify", str(folder), "--slurm", "--nodes", "2", "--ranks", "4", "--image", directory,
                       "--report", str(report), env=cluster, timeout=900)
    assert report.is_file(), r.out[-3000:] + r.err[-3000:]
    lib = checks(json.loads(report.read_text()))["mpi.library"]
    assert r.code == 0 and lib["status"] == "pass", (lib, r.out[-3000:])
    assert sorted(lib["data"]["library"]) == list(NODES), lib
    return lib


@long_build   # an image of its own + its charliecloud conversion: ~5 min of CI on 2 cores (2026-11-25)
def test_the_standard_abi_image_runs_its_own_libmpi_abi_on_two_nodes(cluster, shared, abi_image, abi_program):
    from test_mpi_multinode import job, site
    spec, directory = abi_image
    folder = job(spec, shared / "job-abi", site(shared, "mc-abi", "pmi2", f"binds: [{abi_program.parent}]\n"))
    recs = run_program(cluster, folder, directory, abi_program)
    assert all(r[5] == "/opt/venv/lib/libmpi_abi.so.1" and r[6].startswith("MPICH Version:") for r in recs), recs
    lib = library_per_node(cluster, folder, directory)
    assert all(v["flavor"] == "mpich" and v["path"] == "/opt/venv/lib/libmpi_abi.so.1"
               for v in lib["data"]["library"].values()), lib


@long_build
def test_intel_mpi_standard_abi_library_injected_on_both_nodes(cluster, shared, abi_image, abi_program,
                                                               impi_abi_on_nodes):
    from test_mpi_multinode import job, site
    spec, directory = abi_image
    profile = site(shared, "mc-abi-impi", "pmi2", f"site_mpi: [{impi_abi_on_nodes}]\nsite_mpi_abi: standard\n"
                                                  "site_mpi_env: {FI_PROVIDER: tcp}\n"
                                                  f"binds: [{abi_program.parent}]\n")
    folder = job(spec, shared / "job-abi-impi", profile)
    recs = run_program(cluster, folder, directory, abi_program)
    assert all(r[5] == f"{impi_abi_on_nodes}/libmpi_abi.so.1" and r[6].startswith("Intel(R) MPI Library 2021.19")
               for r in recs), recs
    lib = library_per_node(cluster, folder, directory)
    assert f"the site MPI under {impi_abi_on_nodes}" in lib["detail"], lib
    assert all(v["flavor"] == "intel-mpi" and v["path"] == f"{impi_abi_on_nodes}/libmpi_abi.so.1"
               for v in lib["data"]["library"].values()), lib

