"""The MPI-5 standard ABI (`mpi: {abi: standard}`, issue 21 item 2), for real where an engine is here.

Without engines: the recipe (mpicc_abi probe linking libmpi_abi.so.1, the manifest's library;
mpi4py built from its hash-pinned sdist with MPI4PY_BUILD_MPIABI=1 against mpicc_abi and checked
with ldd, its lock entries), `envbuilder check --site` refusing an ABI mismatch either way, and
the mpi4py releases that cannot be built for the ABI refused. On the 2 nodes of tools/minicluster
(a small stack, no Horovod compile: the MPICH 5.0.2 wheel image built with abi: standard, torch CPU
from the wheelhouse, mpi4py 4.1.2 compiled from its sdist against libmpi_abi.so.1): a C allreduce
compiled with the MPICH wheel's mpicc_abi and an mpi4py allreduce run 2 nodes x 2 ranks under
srun --mpi=pmi2 on the image's own libmpi_abi.so.1, and with Intel MPI's libmpi_abi.so.1 (impi-rt)
injected as the site's standard-ABI MPI; `verify --slurm` names the library per node in
`mpi.library`, and its mpi4py allreduce probe the libmpi_abi.so.1 every rank ran on, both times.
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
from envbuilder.spec.model import load_spec
from infra import docker_cli, long_build, require_binary, venv_tool
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



SDIST = "56860286dc45f20e8821e93cb06669e30462348bf866f685553fa4b712d58d02"   # mpi4py-4.1.2.tar.gz (catalog)


def test_mpi4py_is_built_from_its_pinned_sdist_against_mpicc_abi_and_checked_with_ldd(tmp_path):
    docker = generate(load_spec(spec_file(tmp_path, "a", ABI))).files["Dockerfile"].decode()
    devel, runtime = docker.split("# ---- stage 2: runtime")
    assert f"echo 'mpi4py==4.1.2 --hash=sha256:{SDIST}' > /tmp/mpi4py/requirements.txt" in devel
    assert "pip download --no-cache-dir --disable-pip-version-check --no-deps --no-binary :all: " \
           "--no-build-isolation --require-hashes -r /tmp/mpi4py/requirements.txt" in devel
    assert "export MPI4PY_BUILD_MPIABI=1 MPI4PY_BUILD_MPICC=/opt/venv/bin/mpicc_abi PYTHONPATH=/tmp/mpi4py/build-deps" \
           in devel
    assert "--no-build-isolation --no-deps --force-reinstall /tmp/mpi4py/mpi4py-4.1.2" in devel
    assert "/mpi4py\" -name '*.so' -exec strip --strip-debug {} +" in devel     # 12.5 MB -> 2.3 MB
    # the build requirement goes into a folder the step removes, never into the venv the runtime copies
    assert "--target /tmp/mpi4py/build-deps Cython==" in devel and devel.rstrip().endswith("rm -rf /tmp/mpi4py")
    assert "/mpi4py/MPI*.so; do ldd \"$f\" | grep -q 'libmpi_abi.so.1 => ' || { echo \"$f does not link " \
           "libmpi_abi.so.1\"" in devel
    assert "if ldd \"$f\" | grep -q 'libmpi.so.12'; then echo \"$f links libmpi.so.12 (the MPICH ABI)\"" in devel
    # the wheel is installed by no step (the spec's only package is the one built)
    assert "mpi4py==4.1.2 " not in devel.replace("echo 'mpi4py==4.1.2 --hash", "") and "mpi4py" not in runtime.split(
        "LABEL")[0], docker
    assert devel.index("MPI4PY_BUILD_MPIABI") > devel.index("/opt/venv/bin/mpicc_abi /tmp/mpi-probe.c")
    (tmp_path / "Dockerfile").write_text(docker)
    proc = subprocess.run([venv_tool("hadolint"), "--no-color", "--format", "json", str(tmp_path / "Dockerfile")],
                          capture_output=True, text=True)
    assert not [f for f in json.loads(proc.stdout or "[]") if f["code"] != "DL3008"], proc.stdout


def test_the_lock_pins_the_mpi4py_sdist_and_cython_and_renders_from_them(tmp_path):
    """The lock (written offline as the resolvers write it: tools/fuzz_lock.py sample_lock) records
    the sdist with the catalog's sha256 and Cython in the devel-only `build` group; the recipe built
    from it installs exactly those pins, and the lock (with the MPI wheel's `mpi` group) reads back."""
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
    from fuzz_lock import sample_lock

    from envbuilder.lock.model import dump, loads
    from envbuilder.needs import needs
    from envbuilder.stack import resolve

    spec = spec_file(tmp_path, "a", ABI)
    want = needs(resolve(load_spec(spec)))
    assert want["sources"] == {"mpi4py": "4.1.2"}
    assert "packages" not in want["pip"]["groups"] and want["pip"]["groups"]["build"][0].startswith("Cython==")
    lock = sample_lock(spec)
    assert [(s["name"], s["sha256"]) for s in lock.sources] == [("mpi4py", SDIST)]
    assert set(lock.pip) >= {"mpi", "build"}
    text = dump(lock)
    assert loads(text).pip == lock.pip                  # every group fits the lock's schema
    out = tmp_path / "out"
    out.mkdir()
    (out / "envbuilder.lock").write_text(text)
    r = run_envbuilder("build", str(spec), "--no-build", "--out", str(out))
    assert r.code == 0, r.err
    docker = (out / "Dockerfile").read_text()
    assert "--target /tmp/mpi4py/build-deps --require-hashes --no-deps -r /pins/pip-build.txt" in docker
    assert "Cython==" in (out / "pins" / "pip-build.txt").read_text()
    assert not (out / "pins" / "pip-packages.txt").exists()


@pytest.mark.parametrize("version, words", [
    ("4.0.3", "building against it came in mpi4py 4.1.0 (opt-in MPI4PY_BUILD_MPIABI)"),
    ("4.1.3", "the catalog pins no sdist (url + sha256) of mpi4py 4.1.3"),
])
def test_an_mpi4py_that_cannot_be_built_for_the_abi_is_refused_naming_field_and_fix(tmp_path, version, words):
    spec = tmp_path / "m4.yaml"
    spec.write_text(spec_file(tmp_path, "a", ABI).read_text().replace("mpi4py==4.1.2", f"mpi4py=={version}"))
    r = run_envbuilder("check", str(spec))
    assert r.code == 2 and "[MPI_ABI]" in r.err and "packages.pip" in r.err and words in r.err, r.err
    assert "fix: use mpi4py==4.1.2" in r.err or "fix: use one of mpi4py==4.1.0, ==4.1.1, ==4.1.2" in r.err, r.err
    assert "Traceback" not in r.err and r.err.count("error:") == 1, r.err


def test_the_mpi4py_probe_names_the_libmpi_every_rank_ran_on_and_fails_a_wrong_one():
    from envbuilder.smoke.common import bandwidth_row
    from envbuilder.smoke.mpi_probe import merge

    expect = {"abi": "standard", "library": "/opt/venv/lib/libmpi_abi.so.1"}
    row = bandwidth_row(16 << 20, 0.01, 3, 2)
    rec = {"ok": True, "host": "n1", "library": "MPICH Version: 5.0.2", "path": expect["library"], "sizes": [row]}
    good = merge({0: rec, 1: dict(rec, host="n2")}, 2, expect)[0]
    assert good["status"] == "pass" and good["data"]["library"] == {"n1": [expect["library"]],
                                                                    "n2": [expect["library"]]}, good
    assert "(MPICH Version: 5.0.2; /opt/venv/lib/libmpi_abi.so.1)" in good["detail"], good
    legacy = merge({0: rec, 1: dict(rec, host="n2", path="/opt/venv/lib/libmpi.so.12")}, 2, expect)[0]
    assert legacy["status"] == "fail" and "rank 1 on n2 ran on /opt/venv/lib/libmpi.so.12, not the image's own " \
        "/opt/venv/lib/libmpi_abi.so.1" in legacy["detail"], legacy
    own = merge({0: rec, 1: rec}, 2, expect, site_dir="/local/impi/lib")[0]
    assert own["status"] == "fail" and "not the site MPI under /local/impi/lib" in own["detail"], own


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


def library_per_node(cluster, folder: Path, directory: str, library: str) -> dict:
    """`verify --slurm` on 2 nodes x 4 ranks: `mpi.library` per node, and the suite's mpi4py
    allreduce probe (the image's mpi4py is the one built against the standard ABI) passed with every
    rank on LIBRARY. Returns mpi.library."""
    from test_mpi_multinode import verify
    lib = verify(cluster, folder, directory)
    assert lib["status"] == "pass" and sorted(lib["data"]["library"]) == list(NODES), lib
    report = json.loads((folder / "report.json").read_text())
    probe = next(c for c in report["checks"] if c["name"] == "mpi.allreduce[mpi4py]")
    assert probe["data"]["library"] == {n: [library] for n in NODES} and f"; {library})" in probe["detail"], probe
    print(f"verify: {probe['detail']}")
    return lib


@long_build   # an image of its own + its charliecloud conversion: ~5 min of CI on 2 cores (2026-11-25)
def test_the_standard_abi_image_runs_its_own_libmpi_abi_on_two_nodes(cluster, shared, abi_image, abi_program):
    from test_mpi_multinode import job, site
    spec, directory = abi_image
    folder = job(spec, shared / "job-abi", site(shared, "mc-abi", "pmi2", f"binds: [{abi_program.parent}]\n"))
    recs = run_program(cluster, folder, directory, abi_program)
    assert all(r[5] == "/opt/venv/lib/libmpi_abi.so.1" and r[6].startswith("MPICH Version:") for r in recs), recs
    lib = library_per_node(cluster, folder, directory, "/opt/venv/lib/libmpi_abi.so.1")
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
    lib = library_per_node(cluster, folder, directory, f"{impi_abi_on_nodes}/libmpi_abi.so.1")
    assert f"the site MPI under {impi_abi_on_nodes}" in lib["detail"], lib
    assert all(v["flavor"] == "intel-mpi" and v["path"] == f"{impi_abi_on_nodes}/libmpi_abi.so.1"
               for v in lib["data"]["library"].values()), lib



def mpi4py_links(tag: str) -> str:
    """`ldd` of mpi4py's MPI extension inside the image."""
    proc = subprocess.run([docker_cli(), "run", "--rm", "--entrypoint", "sh", tag, "-c",
                           "f=$(find /opt/venv -path '*/mpi4py/MPI*.so' | head -n1); echo \"$f\"; stat -c 'size %s' \"$f\"; "
                           "ldd \"$f\""],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@long_build
def test_mpi4py_built_for_the_standard_abi_runs_on_two_nodes_then_on_intel_mpi(cluster, shared, abi_image,
                                                                               impi_abi_on_nodes):
    """The image's mpi4py (from its sdist, MPI4PY_BUILD_MPIABI=1, mpicc_abi): an allreduce of 16 MiB
    across 2 nodes x 2 ranks on the image's libmpi_abi.so.1, then on Intel MPI's put in front as the
    site's standard-ABI MPI; no rank maps the MPICH ABI's libmpi.so.12."""
    from test_mpi_multinode import allreduce, job, site
    spec, directory = abi_image
    tag = json.loads((spec.parent / "img-mpi-mpich-abi" / "manifest.json").read_text())["image"]["tag"]
    links = mpi4py_links(tag)
    assert "libmpi_abi.so.1 => /opt/venv/lib/libmpi_abi.so.1" in links and "libmpi.so.12" not in links, links
    size = int(links.split("size ", 1)[1].split()[0])
    assert size < 4_000_000, links          # its DWARF stripped (12.5 MB with it, 2.3 MB without: 2026-11-25)
    print(f"mpi4py's MPI extension in the image: {size / 1e6:.1f} MB, links libmpi_abi.so.1")
    folder = job(spec, shared / "job-abi-mpi4py", site(shared, "mc-abi-mpi4py", "pmi2"))
    recs, _log, wall = allreduce(cluster, folder, directory)
    assert all(r["path"] == "/opt/venv/lib/libmpi_abi.so.1" and r["lib"].startswith("MPICH Version:")
               for r in recs), recs
    print(f"mpi4py on the standard ABI (image's libmpi_abi), 2 nodes x 2 ranks: 16 MiB allreduce "
          f"{recs[0]['ms']} ms; job {wall:.1f} s")
    profile = site(shared, "mc-abi-mpi4py-impi", "pmi2", f"site_mpi: [{impi_abi_on_nodes}]\n"
                                                         "site_mpi_abi: standard\nsite_mpi_env: {FI_PROVIDER: tcp}\n")
    folder = job(spec, shared / "job-abi-mpi4py-impi", profile)
    recs, _log, wall = allreduce(cluster, folder, directory)
    assert all(r["path"] == f"{impi_abi_on_nodes}/libmpi_abi.so.1" and r["lib"].startswith("Intel(R) MPI Library 2021.19")
               for r in recs), recs
    print(f"mpi4py on the standard ABI with Intel MPI's libmpi_abi injected, 2 nodes x 2 ranks: 16 MiB allreduce "
          f"{recs[0]['ms']} ms; job {wall:.1f} s")
