"""Impossible version mixes are refused with the rule's reason, a fix and the nearest preset."""

from __future__ import annotations

import json

import pytest

from conftest import RECIPES

GPU_TF = """\
name: demo
framework: {name: tensorflow, version: "2.12.1"}
python: "3.10"
cuda: {version: "11.8", cudnn: "8", nccl: "2.15.5"}
mpi: {flavor: openmpi, version: "4.1.5", pmi: pmix}
horovod: {version: "0.28.1", operations: [nccl, mpi, gloo]}
"""


def check(cli, write_spec, text):
    return cli("check", str(write_spec(text)))


@pytest.mark.parametrize("change,needles", [
    # Horovod 0.28.1 with Keras 3
    ({'version: "2.12.1"': 'version: "2.16.1"', '"11.8", cudnn: "8", nccl: "2.15.5"': '"12.3"'},
     ["HVD_TF_KERAS3", "Keras 3", "tensorflow 2.15.1"]),
    # intel-tensorflow stops at 2.14
    ({"name: tensorflow,": "name: intel-tensorflow,", 'version: "2.12.1"': 'version: "2.15.0"',
      "cuda: {version: \"11.8\", cudnn: \"8\", nccl: \"2.15.5\"}\n": "",
      "operations: [nccl, mpi, gloo]": "operations: [mpi, gloo]"},
     ["INTEL_TF_MAX", "2.14.0 is the last release", "tensorflow-cpu"]),
    # NCCL built for another CUDA major
    ({'nccl: "2.15.5"': 'nccl: "2.19.3"'}, ["NCCL_MAJOR", "CUDA 12.x", 'nccl: "2.15.5"']),
    # TF 2.12 wheels are CUDA 11
    ({'"11.8", cudnn: "8", nccl: "2.15.5"': '"12.2"'}, ["TF_CUDA_MAJOR", "CUDA 11.8"]),
    # Open MPI 5 has no PMI-2
    ({'version: "4.1.5", pmi: pmix': 'version: "5.0.0", pmi: pmi2'}, ["MPI_PMI", "pmi: pmix"]),
    # the cluster's driver is too old for CUDA 11.8
    ({'nccl: "2.15.5"': 'nccl: "2.15.5", driver: "418.87"'}, ["DRIVER_MIN", ">= 520.61.05"]),
    # Python outside the framework's wheels
    ({'python: "3.10"': 'python: "3.12"'}, ["FW_PYTHON", "3.8 to 3.11"]),
    # NCCL operations on a CPU stack
    ({"cuda: {version: \"11.8\", cudnn: \"8\", nccl: \"2.15.5\"}\n": "",
      "name: tensorflow,": "name: tensorflow-cpu,"}, ["HVD_NCCL_CPU", "remove nccl"]),
    # Horovod's MPI controller without an MPI
    ({"mpi: {flavor: openmpi, version: \"4.1.5\", pmi: pmix}\n": ""}, ["HVD_MPI_MISSING", "add mpi:"]),
])
def test_impossible_mixes_are_refused(cli, write_spec, change, needles):
    text = GPU_TF
    for old, new in change.items():
        assert old in text
        text = text.replace(old, new)
    r = check(cli, write_spec, text)
    assert r.code == 2, r.out + r.err
    assert "Traceback" not in r.err
    for n in needles:
        assert n in r.err, r.err
    assert "nearest known-good preset: recipes/" in r.err


def test_good_gpu_spec_passes(cli, write_spec):
    r = check(cli, write_spec, GPU_TF)
    assert r.code == 0, r.err
    assert "ok" in r.out


def test_driver_within_minor_version_compat_warns(cli, write_spec):
    r = check(cli, write_spec, GPU_TF.replace('nccl: "2.15.5"', 'nccl: "2.15.5", driver: "470.82.01"'))
    assert r.code == 0, r.err
    assert "minor-version compatibility" in r.err


@pytest.mark.parametrize("torch,standard", [("2.13.0+cpu", 17), ("2.14.0", 20)])
def test_torch_21_gets_the_cxx17_fix(cli, write_spec, tmp_path, torch, standard):
    """Released Horovod builds as C++14; the recipe raises it to the torch release's `cxx:`
    (torch 2.13's headers accept C++17, 2.14's need C++20)."""
    spec = write_spec(f"""\
name: t
framework: {{name: pytorch, version: "{torch}"}}
python: "3.11"
base: local/debian:bookworm-slim
mpi: {{flavor: openmpi, version: "4.1.4"}}
horovod: {{version: "0.28.1", operations: [mpi, gloo]}}
""")
    r = cli("build", str(spec), "--no-build", "--out", str(tmp_path / "o"))
    assert r.code == 0, r.err
    docker = (tmp_path / "o" / "Dockerfile").read_text()
    assert f"sed -i 's/CMAKE_CXX_STANDARD 14/CMAKE_CXX_STANDARD {standard}/'" in docker
    assert f"grep -q 'CMAKE_CXX_STANDARD {standard}' /tmp/horovod/horovod-0.28.1/horovod/torch/CMakeLists.txt" in docker
    assert "horovod/torch/CMakeLists.txt" in docker
    assert "horovod#3996" in docker
    finding = next(f for f in json.loads((tmp_path / "o" / "manifest.json").read_text())["findings"]
                   if f["rule"] == "HVD_TORCH_CXX17")
    assert finding["fix"] == f"applied by the recipe (CMAKE_CXX_STANDARD {standard})"


def test_the_cxx_patch_applies_where_the_catalogs_standards_say():
    """The catalog's `cxx:` facts and the horovod_cxx17 patch agree: the patch applies to exactly
    the torch releases whose headers need a newer standard than released Horovod compiles with."""
    from envbuilder.compat.catalog import load_catalog
    from envbuilder.versions import satisfies

    cat = load_catalog()
    patch = cat.patches()["horovod_cxx17"]
    for hv, entry in cat.data["horovod"].items():
        if not satisfies(hv, patch["applies"]["horovod"]):
            continue
        for release, facts in cat.framework_releases("pytorch").items():
            assert satisfies(release, patch["applies"]["pytorch"]) == (facts["cxx"] > entry["cxx"]), (hv, release)
            assert cat.patch_for("horovod_cxx17", "pytorch", release + ".0")["replace"][1] == \
                f"CMAKE_CXX_STANDARD {max(17, facts['cxx'])}"


def test_python_must_match_the_base_os(cli, write_spec):
    r = check(cli, write_spec, GPU_TF.replace('python: "3.10"', 'python: "3.11"')
              + "base_os: ubuntu22.04\n")
    assert r.code == 2
    assert "PYTHON_BASE" in r.err and "has Python 3.10" in r.err


def test_unknown_base_needs_base_os(cli, write_spec):
    r = check(cli, write_spec, GPU_TF.replace("cuda: {", "base: myregistry/img:1\ncuda: {"))
    assert r.code == 2
    assert "base_os" in r.err


def test_ngc_base_must_agree_with_what_it_ships(cli, write_spec):
    text = """\
name: n
base: nvcr.io/nvidia/tensorflow:24.01-tf2-py3
framework: {name: tensorflow, version: "2.15.0"}
python: "3.10"
cuda: {version: "12.3"}
horovod: {version: "0.28.1", operations: [nccl, gloo]}
"""
    r = check(cli, write_spec, text)
    assert r.code == 2
    assert "NGC_FRAMEWORK" in r.err and "ships tensorflow 2.14.0" in r.err


# --- CUDA from PyPI (cuda: {source: pypi}) -------------------------------------------------------

PYPI_TORCH = """\
name: demo-pypi
framework: {name: pytorch, version: "2.13.0"}
python: "3.11"
cuda: {version: "13.0", source: pypi}
base: local/debian:bookworm-slim
"""


@pytest.mark.parametrize("change,needles", [
    ({'version: "13.0"': 'version: "12.6"'}, ["PYPI_CUDA_MAJOR", "built for CUDA 13.0", 'source: pypi']),
    ({'version: "2.13.0"': 'version: "2.12.0"'}, ["PYPI_CUDA_UNKNOWN", "pytorch 2.13.0", "source: image"]),
    ({"source: pypi}": 'source: pypi, nccl: "2.28.3"}'}, ["PYPI_CUDA_PINS", "2.29.7", "cuda.nccl"]),
    ({"local/debian:bookworm-slim": "nvidia/cuda:13.0.1-cudnn-devel-ubuntu24.04"}, ["PYPI_CUDA_BASE", "plain OS base"]),
    ({"source: pypi}": "source: conda}"}, ["cuda.source", "image", "pypi"]),
])
def test_cuda_from_pypi_refuses_what_the_wheels_cannot_give(cli, write_spec, change, needles):
    text = PYPI_TORCH
    for old, new in change.items():
        assert old in text
        text = text.replace(old, new)
    r = check(cli, write_spec, text)
    assert r.code == 2, r.out + r.err
    for needle in needles:
        assert needle in r.err, (needle, r.err)
    assert "Traceback" not in r.err


def test_cuda_from_pypi_renders_the_wheel_lane(cli, write_spec, tmp_path):
    out = tmp_path / "out"
    r = cli("build", str(write_spec(PYPI_TORCH.replace("base:", "horovod: {version: \"0.28.1\", operations: [nccl, gloo]}\nbase:"))),
            "--no-build", "--out", str(out))
    assert r.code == 0, r.err
    dockerfile = (out / "Dockerfile").read_text()
    assert "FROM local/debian:bookworm-slim AS devel" in dockerfile and "nvidia/cuda" not in dockerfile
    assert "download.pytorch.org" not in dockerfile                      # PyPI's torch is the CUDA build
    assert "'cuda-toolkit[nvcc,cccl,cudart]==13.0.3'" in dockerfile
    assert "HOROVOD_NCCL_LIB=/opt/venv/lib/python3.11/site-packages/nvidia/nccl/lib" in dockerfile
    assert "sed -i 's/CMAKE_CUDA_STANDARD 11/CMAKE_CUDA_STANDARD 17/'" in dockerfile
    devel, runtime = dockerfile.split("AS runtime")
    assert "pip uninstall -y" in devel and "nvidia/*/include" in devel
    assert "nvcc" not in runtime
    expect = __import__("json").loads((out / "manifest.json").read_text())["expect"]
    assert expect["cuda"] == "13.0" and expect["nccl"] == "2.29.7" and expect["cudnn"] == "9.20.0"
    assert expect["gpu"] is True and expect["cuda_source"] == "pypi"
    assert expect["cuda_arch"] == ["7.5", "8.0", "8.6", "9.0", "10.0", "12.0"]
    # make runs one compiler per core, not Horovod's fixed -j8 (about 1 GB per compiler)
    assert 'MAKEFLAGS="-j$(nproc)" \\\n    && export MAKEFLAGS' in devel


def test_cuda_from_pypi_copies_the_nvidia_wheels_as_a_runtime_layer_of_their_own(cli, write_spec, tmp_path):
    """The NVIDIA libraries (~3.5 GB) change least: the runtime stage copies them first, then the
    venv without them (from a stage that deletes them), so no file is copied twice and a change of
    packages.pip leaves their layer cached. The SIF has no layers: Apptainer copies the venv once."""
    out = tmp_path / "out"
    r = cli("build", str(write_spec(PYPI_TORCH)), "--no-build", "--out", str(out))
    assert r.code == 0, r.err
    nvidia = "/opt/venv/lib/python3.11/site-packages/nvidia"
    stages = {}
    for block in (out / "Dockerfile").read_text().split("\nFROM ")[1:]:
        head, _, body = block.partition("\n")
        stages[head.split(" AS ")[1]] = (head.split(" AS ")[0], body)
    assert list(stages) == ["devel", "devel-rest", "runtime"]
    assert stages["devel-rest"][0] == "devel" and f"RUN rm -rf {nvidia}\n" in stages["devel-rest"][1]
    copies = [line for line in stages["runtime"][1].splitlines() if line.startswith("COPY --from")]
    assert copies == [f"COPY --from=devel {nvidia} {nvidia}", "COPY --from=devel-rest /opt/venv /opt/venv"]
    apptainer = (out / "Apptainer.def").read_text()
    assert apptainer.count("/opt/venv /opt/venv") == 1 and f"{nvidia} {nvidia}" not in apptainer
    # a CPU stack copies its venv in one piece, from the devel stage itself
    cpu = tmp_path / "cpu"
    assert cli("build", str(RECIPES / "cpu-torch-horovod.yaml"), "--no-build", "--out", str(cpu)).code == 0
    docker = (cpu / "Dockerfile").read_text()
    assert "COPY --from=devel /opt/venv /opt/venv" in docker and "-rest" not in docker


def test_tensorflow_gpu_from_pypi_is_the_cuda12_lane(cli, write_spec):
    text = (RECIPES / "tf-pypi.yaml").read_text()
    assert cli("check", str(RECIPES / "tf-pypi.yaml")).code == 0
    r = cli("check", str(write_spec(text.replace('version: "12.5"', 'version: "13.0"'))))
    assert r.code == 2 and "PYPI_CUDA_MAJOR" in r.err and "CUDA 12" in r.err, r.err


def test_horovod_on_a_gcc13_base_gets_the_include_fix_and_bookworm_keeps_its_cached_build(cli, tmp_path):
    """Horovod 0.28.1 does not compile with GCC 13 (std::string, std::logic_error used without
    their headers: seen with g++ 13.3 of Ubuntu 24.04 on a lent GPU machine, docs/gpu.md). On a base
    whose catalog g++ is 13 or newer, the Horovod step adds the headers through CXXFLAGS (kept
    after any CXXFLAGS of its own), in the Dockerfile and the definition file alike; on Debian 12
    (g++ 12.2) the step is unchanged, so its build cache still holds."""
    text = (RECIPES / "cpu-torch-horovod.yaml").read_text()
    for old, new in (("base: debian:bookworm-slim", "base: ubuntu:24.04"), ('python: "3.11"', 'python: "3.12"'),
                     ('version: "4.1.4", pmi', 'version: "4.1.6", pmi')):
        assert old in text
        text = text.replace(old, new)
    spec = tmp_path / "u24.yaml"
    spec.write_text(text)
    flags = 'export CXXFLAGS="${CXXFLAGS:-} -include string -include cstdint -include stdexcept'
    for path, out, applied in ((spec, tmp_path / "u24", True), (RECIPES / "cpu-torch-horovod.yaml", tmp_path / "bookworm", False)):
        r = cli("build", str(path), "--no-build", "--out", str(out))
        assert r.code == 0, r.err
        dockerfile = (out / "Dockerfile").read_text()
        definition = (out / "Apptainer.def").read_text()
        assert (flags in dockerfile) is applied and (flags in definition) is applied
        assert ("fix horovod_gcc13: released Horovod uses std::string" in dockerfile) is applied
        if applied:
            step = dockerfile[dockerfile.index(flags):]
            assert step.index(flags) < step.index("--no-build-isolation")
