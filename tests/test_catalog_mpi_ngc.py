"""The catalog's MPI tarballs and NGC bases (issue 10): every tarball hash-pinned with a known
source, MPICH built into /opt/mpich and copied into the runtime stage, Open MPI 5.0.x selectable,
and the NGC pip constraint file respected by every pip step on a base that has one (and only there)."""

from __future__ import annotations

import copy
import io
import json
import re
import subprocess

import pytest

from infra import venv_tool

from envbuilder.compat.catalog import Catalog, load_catalog
from envbuilder.compat.check import findings
from envbuilder.generate import generate
from envbuilder.needs import needs
from envbuilder.spec.model import load_spec
from envbuilder.versions import cmp

SHA256 = re.compile(r"[0-9a-f]{64}")
CONSTRAINT = "/etc/pip/constraint.txt"

MPICH = """\
name: cpu-torch-mpich
description: PyTorch CPU + Horovod over MPICH
base: local/debian:bookworm-slim
framework: {name: pytorch, version: "2.13.0+cpu"}
python: "3.11"
mpi: {flavor: mpich, version: "VERSION", pmi: pmi2}
horovod: {version: "0.28.1", operations: [mpi, gloo]}
targets: [docker, apptainer]
cluster: {nodes: 1, ntasks_per_node: 2, cpus_per_task: 1, time: "00:10:00"}
"""

OMPI5 = """\
name: cpu-torch-ompi5
description: PyTorch CPU + Horovod over Open MPI 5
base: local/debian:bookworm-slim
framework: {name: pytorch, version: "2.13.0+cpu"}
python: "3.11"
mpi: {flavor: openmpi, version: "5.0.10", pmi: pmix}
horovod: {version: "0.28.1", operations: [mpi, gloo]}
targets: [docker, apptainer]
cluster: {nodes: 1, ntasks_per_node: 2, cpus_per_task: 1, time: "00:10:00"}
"""

NGC_TORCH = """\
name: ngc-torch
description: an NGC PyTorch base plus one package
base: BASE
framework: {name: pytorch, version: "FW"}
python: "PY"
cuda: {version: "CUDA"}
packages:
  pip: ["einops==0.8.1"]
targets: [docker, apptainer]
cluster: {partition: gpu, nodes: 1, gpus_per_node: 4, cpus_per_task: 8, time: "01:00:00"}
"""


def spec_of(tmp_path, text: str, **subs):
    for key, value in subs.items():
        text = text.replace(key, value)
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    return load_spec(path)


def files_of(tmp_path, text: str, **subs) -> dict[str, str]:
    out = generate(spec_of(tmp_path, text, **subs))
    return {name: data.decode() for name, data in out.files.items() if name in
            ("Dockerfile", "Apptainer.def", "manifest.json", "job.sbatch")}


def docker_structure(text: str) -> list[dict]:
    from dockerfile_parse import DockerfileParser

    p = DockerfileParser(fileobj=io.BytesIO())
    p.content = text
    return [i for i in p.structure if i["instruction"] != "COMMENT"]


def stages(text: str) -> dict[str, list[dict]]:
    """FROM ... AS name -> the instructions of that stage."""
    out, name = {}, None
    for ins in docker_structure(text):
        if ins["instruction"] == "FROM":
            name = ins["value"].split()[-1]
            out[name] = []
        elif name:
            out[name].append(ins)
    return out


def hadolint_findings(tmp_path, text: str) -> list[dict]:
    path = tmp_path / "Dockerfile"
    path.write_text(text)
    proc = subprocess.run([venv_tool("hadolint"), "--no-color", "--format", "json", str(path)],
                          capture_output=True, text=True)
    return [f for f in json.loads(proc.stdout or "[]") if f["code"] != "DL3008"]


# --- catalog sanity ------------------------------------------------------------------------------

def test_every_mpi_tarball_is_hash_pinned_with_a_known_source():
    cat = load_catalog()
    for flavor, info in cat.data["mpi"].items():
        assert set(info["pmi_sources"]) <= set(cat.sources), flavor
        for version, tar in info["tarballs"].items():
            where = f"{flavor} {version}"
            assert set(tar) <= {"url", "sha256", "sources", "prerelease"}, where
            assert tar["url"].startswith("https://") and tar["url"].rsplit("/", 1)[1] in (
                f"openmpi-{version}.tar.bz2", f"mpich-{version}.tar.gz"), where
            assert SHA256.fullmatch(tar["sha256"]), where
            assert tar["sources"] and set(tar["sources"]) <= set(cat.sources), where
            assert tar.get("prerelease", False) in (True, False), where
            # a release candidate must be marked so; a release must not be
            assert bool(re.search(r"(rc|a|b)[0-9]+$", version)) == tar.get("prerelease", False), where
            # every major with a tarball says which PMI it can use with srun
            assert str(int(version.split(".")[0])) in info["pmi"], where
    # no hash appears twice (a copy-paste slip would)
    hashes = [t["sha256"] for i in cat.data["mpi"].values() for t in i["tarballs"].values()]
    assert len(hashes) == len(set(hashes))


def test_catalog_covers_open_mpi_5_and_mpich_4_and_5():
    cat = load_catalog()
    ompi, mpich = cat.mpi("openmpi")["tarballs"], cat.mpi("mpich")["tarballs"]
    assert {f"5.0.{n}" for n in range(11)} <= set(ompi)
    assert cat.mpi("openmpi")["pmi"]["5"] == ["pmix"]          # Open MPI 5 has no PMI-2 (ompi_docs)
    assert {"4.2.3", "4.3.2", "5.0.0", "5.0.1"} <= set(mpich)
    assert all(t["url"].startswith("https://www.mpich.org/static/downloads/") for t in mpich.values())
    assert all(t["url"].startswith("https://download.open-mpi.org/release/open-mpi/v") for t in ompi.values())


def test_ngc_entries_carry_sources_status_and_the_constraint_fact():
    cat = load_catalog()
    for image, entry in cat.data["ngc"].items():
        assert entry["status"] in ("verified", "secondary", "unverified"), image
        assert entry["sources"] and set(entry["sources"]) <= set(cat.sources), image
        if entry["status"] != "verified":
            assert entry.get("note"), f"{image}: a fact not read from a primary source says why"
        assert cat.os(entry["os"]) is not None, image
        tag = image.rsplit(":", 1)[1].split("-")[0]                   # 25.12
        if image.startswith("nvcr.io/nvidia/pytorch:") and cmp(tag, "25.03") >= 0:
            assert entry.get("pip_constraint") == CONSTRAINT, image
        else:
            assert "pip_constraint" not in entry, image
    tags = [i for i in cat.data["ngc"] if i.startswith("nvcr.io/nvidia/pytorch:")]
    assert any(":25." in t for t in tags) and any(":26." in t for t in tags)
    assert "nvcr.io/nvidia/tensorflow:25.02-tf2-py3" in cat.data["ngc"]


# --- MPICH ---------------------------------------------------------------------------------------

def test_mpich_build_step_runtime_copy_and_env(tmp_path):
    files = files_of(tmp_path, MPICH, VERSION="4.3.2")
    docker = files["Dockerfile"]
    st = stages(docker)
    assert list(st) == ["devel", "runtime"]
    runs = [i["value"] for i in st["devel"] if i["instruction"] == "RUN"]
    (build,) = [r for r in runs if "mpich-4.3.2.tar.gz" in r]
    tar = load_catalog().mpi_tarball("mpich", "4.3.2")
    assert f"curl -fsSL --retry 3 -o /tmp/mpich/mpich-4.3.2.tar.gz {tar['url']}" in build
    assert f"echo '{tar['sha256']}  /tmp/mpich/mpich-4.3.2.tar.gz' | sha256sum -c -" in build
    assert "tar -xzf /tmp/mpich/mpich-4.3.2.tar.gz -C /tmp/mpich" in build
    configure = re.search(r"env -C /tmp/mpich/mpich-4\.3\.2 \./configure ([^>]*)>", build).group(1).split()
    assert configure == ["--prefix=/opt/mpich", "--with-device=ch4:ofi", "--with-libfabric=embedded",
                         "--with-hwloc=embedded", "--with-pm=hydra", "--with-pmi=pmi2", "--with-slurm=no",
                         "--disable-fortran", "--enable-shared", "--disable-static"]
    assert "rm -rf /tmp/mpich" in build
    # Horovod finds the MPICH it is built against
    (hvd,) = [r for r in runs if "horovod-0.28.1" in r]
    assert 'export PATH="/opt/mpich/bin:$PATH"' in hvd and "HOROVOD_WITH_MPI=1" in hvd
    # the runtime stage copies the prefix; no compilers, no Open MPI settings
    copies = [i["value"] for i in st["runtime"] if i["instruction"] == "COPY"]
    assert "--from=devel /opt/mpich /opt/mpich" in copies
    env = " ".join(i["value"] for i in st["runtime"] if i["instruction"] == "ENV")
    assert 'PATH="/opt/venv/bin:/opt/mpich/bin:$PATH"' in env
    assert 'LD_LIBRARY_PATH="/opt/mpich/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"' in env
    assert "OMPI_MCA" not in env and "openmpi" not in docker
    assert hadolint_findings(tmp_path, docker) == []
    # Apptainer: the same build, the prefix copied from the devel stage, the same environment
    app = files["Apptainer.def"]
    assert "--with-device=ch4:ofi" in app and "--with-pmi=pmi2 " in app
    assert re.search(r"%files from devel\n\s+/opt/mpich /opt/mpich\n", app)
    assert 'export LD_LIBRARY_PATH="/opt/mpich/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"' in app
    # the manifest and the job script
    manifest = json.loads(files["manifest.json"])
    assert manifest["expect"]["mpi"] == {"flavor": "mpich", "version": "4.3.2"}
    assert manifest["build"]["mpi_source"] == "build"
    assert "--mpi=pmi2" in files["job.sbatch"]


def test_mpich_before_4_2_uses_the_older_pmi2_option(tmp_path):
    docker = files_of(tmp_path, MPICH, VERSION="4.1.2")["Dockerfile"]
    assert "--with-pmi=pmi2/simple" in docker
    docker = files_of(tmp_path, MPICH, VERSION="5.0.1")["Dockerfile"]
    assert "--with-pmi=pmi2 " in docker and "mpich-5.0.1.tar.gz" in docker


def test_mpich_lock_needs_the_tarball(tmp_path):
    from envbuilder.stack import resolve

    stack = resolve(spec_of(tmp_path, MPICH, VERSION="5.0.1"))
    assert needs(stack)["sources"] == {"horovod": "0.28.1", "mpich": "5.0.1"}


def test_mpich_without_a_tarball_is_refused_naming_the_known_versions(tmp_path):
    found = findings(spec_of(tmp_path, MPICH, VERSION="4.3.9"))
    (f,) = [f for f in found if f.rule == "MPI_TARBALL"]
    assert f.level == "error" and "mpich 4.3.9" in f.reason
    assert "4.3.2" in f.fix and "5.0.1" in f.fix and "source: distro" not in f.fix


def test_mpich_with_pmix_is_refused(tmp_path):
    found = findings(spec_of(tmp_path, MPICH.replace("pmi: pmi2", "pmi: pmix"), VERSION="4.3.2"))
    assert [f.rule for f in found if f.level == "error"] == ["MPICH_PMI"]


# --- Open MPI 5.0.x --------------------------------------------------------------------------------

def test_open_mpi_5_0_10_is_built_from_its_pinned_tarball(tmp_path):
    files = files_of(tmp_path, OMPI5)
    docker = files["Dockerfile"]
    tar = load_catalog().mpi_tarball("openmpi", "5.0.10")
    assert tar["url"] == "https://download.open-mpi.org/release/open-mpi/v5.0/openmpi-5.0.10.tar.bz2"
    assert f"echo '{tar['sha256']}  /tmp/openmpi/openmpi-5.0.10.tar.bz2' | sha256sum -c -" in docker
    assert "./configure --prefix=/opt/openmpi --with-slurm --with-pmix=internal" in docker
    assert "COPY --from=devel /opt/openmpi /opt/openmpi" in docker
    assert 'export PATH="/opt/openmpi/bin:$PATH"' in docker            # Horovod's build finds mpicc
    assert [f.rule for f in findings(spec_of(tmp_path, OMPI5)) if f.level != "info"] == []
    assert hadolint_findings(tmp_path, docker) == []
    # Open MPI 5 has no PMI-2
    bad = findings(spec_of(tmp_path, OMPI5.replace("pmi: pmix", "pmi: pmi2")))
    assert [f.rule for f in bad if f.level == "error"] == ["MPI_PMI"]


def test_a_release_candidate_warns_and_is_never_suggested(tmp_path):
    """No 6.0.0rc tarball has a sourced hash yet; the rule is shown on a catalog that has one."""
    data = copy.deepcopy(load_catalog().data)
    data["mpi"]["openmpi"]["pmi"]["6"] = ["pmix"]
    data["mpi"]["openmpi"]["tarballs"]["6.0.0rc1"] = {
        "url": "https://download.open-mpi.org/release/open-mpi/v6.0/openmpi-6.0.0rc1.tar.bz2",
        "sha256": "0" * 64, "prerelease": True, "sources": ["ompi_6rc"]}
    cat = Catalog(data)
    found = findings(spec_of(tmp_path, OMPI5.replace('"5.0.10"', '"6.0.0rc1"')), cat)
    (f,) = [f for f in found if f.rule == "MPI_PRERELEASE"]
    assert f.level == "warning" and "release candidate" in f.reason and "5.0.10" in f.fix
    assert not [f for f in found if f.level == "error"]
    missing = findings(spec_of(tmp_path, OMPI5.replace('"5.0.10"', '"6.0.0rc2"')), cat)
    (f,) = [f for f in missing if f.rule == "MPI_TARBALL"]
    assert "rc" not in f.fix.split("use one of ", 1)[1].split(",", 1)[0] and "6.0.0rc1" not in f.fix


# --- NGC pip constraint ----------------------------------------------------------------------------

NGC_2512 = dict(BASE="nvcr.io/nvidia/pytorch:25.12-py3", FW="2.10.0a0+b4e4ee81d3", PY="3.12", CUDA="13.1")
NGC_2405 = dict(BASE="nvcr.io/nvidia/pytorch:24.05-py3", FW="2.4.0a0", PY="3.10", CUDA="12.4")


def test_pip_steps_on_an_ngc_25_base_install_under_its_constraint_file(tmp_path):
    files = files_of(tmp_path, NGC_TORCH, **NGC_2512)
    st = stages(files["Dockerfile"])
    assert list(st) == ["image"]
    pip_runs = [i["value"] for i in st["image"] if i["instruction"] == "RUN" and "pip install" in i["value"]]
    assert pip_runs and all(f"export PIP_CONSTRAINT={CONSTRAINT} " in r for r in pip_runs)
    app = files["Apptainer.def"]
    post = re.split(r"^%post\b", app, maxsplit=1, flags=re.M)[1].split("\n%", 1)[0]   # the section, not a comment
    assert post.index(f"export PIP_CONSTRAINT={CONSTRAINT}") < post.index("pip install")
    manifest = json.loads(files["manifest.json"])
    assert manifest["build"]["pip_constraint"] == CONSTRAINT
    assert hadolint_findings(tmp_path, files["Dockerfile"]) == []
    from envbuilder.stack import resolve

    assert needs(resolve(spec_of(tmp_path, NGC_TORCH, **NGC_2512)))["pip"]["constraint"] == CONSTRAINT


def test_no_constraint_on_a_24_base_or_a_plain_os_base(tmp_path):
    files = files_of(tmp_path, NGC_TORCH, **NGC_2405)
    assert "PIP_CONSTRAINT" not in files["Dockerfile"] and "PIP_CONSTRAINT" not in files["Apptainer.def"]
    assert "pip_constraint" not in json.loads(files["manifest.json"])["build"]
    files = files_of(tmp_path, MPICH, VERSION="4.3.2")
    assert "PIP_CONSTRAINT" not in files["Dockerfile"]


@pytest.mark.parametrize("image", [i for i in load_catalog().data["ngc"] if i.startswith("nvcr.io/nvidia/pytorch:")])
def test_every_ngc_pytorch_base_renders(tmp_path, image):
    entry = load_catalog().ngc(image)
    files = files_of(tmp_path, NGC_TORCH, BASE=image, FW=entry["framework"]["version"], PY=entry["python"],
                     CUDA=entry["cuda"])
    assert ("PIP_CONSTRAINT" in files["Dockerfile"]) == bool(entry.get("pip_constraint"))
    assert json.loads(files["manifest.json"])["expect"]["mpi"] == entry["mpi"]


@pytest.mark.parametrize("arch,libdir", [("x86_64", "x86_64-linux-gnu"), ("aarch64", "aarch64-linux-gnu")])
def test_open_mpi_4_with_pmi2_links_slurms_libpmi2_from_the_arch_s_multiarch_folder(tmp_path, arch, libdir):
    text = OMPI5.replace('"5.0.10", pmi: pmix', '"4.1.8", pmi: pmi2') + f"arch: {arch}\n"
    docker = files_of(tmp_path, text)["Dockerfile"]
    assert f"--with-pmi=/usr --with-pmi-libdir=/usr/lib/{libdir} " in docker
    assert "openmpi-4.1.8.tar.bz2" in docker and "libpmi2-0-dev" in docker
