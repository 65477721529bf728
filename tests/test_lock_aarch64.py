"""The lock for an aarch64 image (issue 37): wheels for the image's machine, not the host's, and a
pin without an aarch64 build refused by name. Reaches PyPI (pip --dry-run --report, no download)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from envbuilder.errors import EXIT_BAD_INPUT, EnvbuilderError
from envbuilder.lock import pip as pip_
from infra import ARM64_BASE, image_arch

AARCH64 = pip_.target("3.11", "2.36", "aarch64")   # Debian 12's Python and glibc


def test_aarch64_target_asks_aarch64_platforms_only():
    assert AARCH64["markers"]["platform_machine"] == "aarch64"
    assert AARCH64["platforms"][0] == "manylinux_2_36_aarch64"
    assert "manylinux_2_17_aarch64" in AARCH64["platforms"] and "manylinux2014_aarch64" in AARCH64["platforms"]
    assert not [p for p in AARCH64["platforms"] if "x86_64" in p]


def test_aarch64_lock_picks_aarch64_wheels():
    got = pip_.resolve({"packages": ["numpy==2.1.3"]}, AARCH64)
    (entry,) = got["packages"]
    assert entry["file"] == "numpy-2.1.3-cp311-cp311-manylinux_2_17_aarch64.manylinux2014_aarch64.whl"
    # PyPI's sha256 of that file (the x86_64 wheel's differs)
    assert entry["sha256"] == "762479be47a4863e261a840e8e01608d124ee1361e48b96916f38b119cfda04a"


def test_pin_without_aarch64_build_is_refused_by_name():
    # intel-openmp publishes x86_64 (and Windows) wheels only
    with pytest.raises(EnvbuilderError) as err:
        pip_.resolve({"packages": ["intel-openmp==2024.2.1"]}, AARCH64)
    assert err.value.exit_code == EXIT_BAD_INPUT == 2
    text = str(err.value)
    assert "intel-openmp 2024.2.1 has no aarch64 build" in text and "--wheelhouse" in text


# --- the whole lock of an `arch: aarch64` spec, in the engine (docker) -------------------------

SPEC = """\
name: {name}
base: {base}
arch: aarch64
framework: {{name: tensorflow, version: "2.16.2"}}
python: "3.11"
packages:
  pip: ["numpy==1.26.4"]
targets: [docker]
"""


def _lock(tmp_path: Path, base: str) -> subprocess.CompletedProcess:
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.format(name="cpu-tf-aarch64", base=base))
    root = Path(__file__).resolve().parents[1]
    return subprocess.run([sys.executable, "-m", "envbuilder", "lock", str(spec)], cwd=tmp_path,
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(root)})


def test_aarch64_spec_on_an_amd64_base_is_refused(tmp_path):
    if image_arch("local/debian:bookworm") != "amd64":
        pytest.skip("needs docker and local/debian:bookworm (.ci/make-base-image.sh)")
    proc = _lock(tmp_path, "local/debian:bookworm")
    assert proc.returncode == 2, proc.stderr
    assert "local/debian:bookworm is an amd64 image; the spec's arch needs arm64" in proc.stderr
    assert "fix: name a multi-arch base from a registry (e.g. debian:bookworm-slim)" in proc.stderr
    assert not (tmp_path / "images").exists()


# --- which torch a CPU aarch64 spec gets (catalog aarch64_pypi, torch_pypi_aarch64_2611) -------

def _stack(version: str, **extra):
    from envbuilder.spec.model import spec_from_doc
    from envbuilder.spec.yamlsource import SourceDoc
    from envbuilder.stack import resolve

    doc = {"name": "t", "base": ARM64_BASE, "arch": "aarch64", "python": "3.11",
           "framework": {"name": "pytorch", "version": version},
           **({} if "horovod" in extra else {"distributed": {"kind": "torch", "backend": "gloo", "launcher": "srun"}}),
           **extra}
    return resolve(spec_from_doc(SourceDoc(data=doc, path="spec.yaml")))


def test_cpu_aarch64_torch_up_to_2_10_comes_from_pypi():
    # PyPI's aarch64 torch 2.10.0 is a CPU build (its CUDA Requires-Dist are x86_64-only)
    assert _stack("2.10.0").framework_index_url is None
    assert _stack("2.9.1").framework_index_url is None
    assert not [f for f in _stack("2.10.0").findings if f.rule == "ARCH_TORCH_CPU"]


def test_cpu_aarch64_torch_from_2_11_needs_the_cpu_index_and_says_so():
    st = _stack("2.13.0")
    assert st.framework_index_url == "https://download.pytorch.org/whl/cpu"
    (f,) = [f for f in st.findings if f.rule == "ARCH_TORCH_CPU"]
    assert "PyPI's aarch64 torch 2.13.0 is a CUDA build" in f.reason and "2.10" in f.fix
    # a local +cpu wheel or the spec's own index: no index chosen for it, no warning
    assert _stack("2.13.0+cpu").framework_index_url is None
    assert not [f for f in _stack("2.13.0+cpu").findings if f.rule == "ARCH_TORCH_CPU"]


def test_aarch64_torch_with_cuda_from_pypi_takes_pypis_own_cuda_build():
    # from 2.11 PyPI's aarch64 torch is the CUDA build: a spec with CUDA from PyPI takes it from
    # PyPI (not the CPU index), and naming PyPI as its index is no error for such a version
    st = _stack("2.15.0", cuda={"version": "13.2", "source": "pypi"})
    assert st.framework_index_url is None
    assert not [f for f in st.findings if f.rule in ("ARCH_TORCH_CPU", "ARCH_TORCH_INDEX")]


def test_lock_refuses_pypis_cuda_torch_for_a_cpu_aarch64_spec():
    # the CPU index not reached: pip falls back to PyPI's aarch64 CUDA build; the lock refuses it
    from envbuilder.lock.resolve import _refuse_cuda_torch_on_cpu

    cuda = {"framework": [{"name": "torch", "version": "2.13.0",
                           "file": "torch-2.13.0-cp311-cp311-manylinux_2_28_aarch64.whl"}]}
    with pytest.raises(EnvbuilderError) as err:
        _refuse_cuda_torch_on_cpu(_stack("2.13.0"), cuda)
    assert err.value.exit_code == 2
    assert "CUDA build" in str(err.value) and "download.pytorch.org/whl/cpu was not reached" in str(err.value)
    cpu = {"framework": [{"name": "torch", "version": "2.13.0+cpu", "file": "torch-2.13.0+cpu-x.whl"}]}
    _refuse_cuda_torch_on_cpu(_stack("2.13.0"), cpu)                  # the CPU build: fine
    _refuse_cuda_torch_on_cpu(_stack("2.10.0"), {"framework": [{"name": "torch", "version": "2.10.0",
                                                                "file": "torch-2.10.0.whl"}]})


def test_horovod_requirements_take_a_psutil_with_aarch64_wheels():
    # psutil 5.9.8 (x86_64 images' pin) has no aarch64 wheel; 6.0.0 is the first with one
    from envbuilder.plan.components import horovod

    hv = {"mpi": {"flavor": "openmpi", "version": "4.1.4", "pmi": "pmix"},
          "horovod": {"version": "0.28.1", "operations": ["mpi", "gloo"]}}
    st = _stack("2.10.0", **hv)
    assert "psutil==6.0.0" in horovod.requirements(st) and "psutil==5.9.8" not in horovod.requirements(st)
    got = pip_.resolve({"packages": ["psutil==6.0.0"]}, AARCH64)
    assert got["packages"][0]["file"].endswith("manylinux2014_aarch64.whl")


# --- the GH200 preset (torch215-ddp-pypi-aarch64): PyPI's CUDA build for aarch64 ---------------

def test_aarch64_cuda_torch_locks_aarch64_wheels_only():
    # about 60 s: torch 2.15.0 and its 20-odd NVIDIA wheels for aarch64 (the sbsa builds), no x86_64
    got = pip_.resolve({"packages": ["torch==2.15.0"]}, AARCH64)
    files = [e["file"] for e in got["packages"]]
    binary = [f for f in files if not f.endswith("-none-any.whl")]
    assert binary and all("aarch64" in f for f in binary), files
    assert "torch-2.15.0-cp311-cp311-manylinux_2_28_aarch64.whl" in files
    assert "nvidia_nccl_cu13-2.30.7-py3-none-manylinux_2_18_aarch64.whl" in files
    assert "nvidia_cudnn_cu13-9.26.0.51-py3-none-manylinux_2_27_aarch64.whl" in files


def test_aarch64_cuda_arch_list_is_the_aarch64_wheels_own():
    # the manifest's cuda_arch (verify's versions.cuda_arch, Horovod's CC list) came from pypi_cuda's
    # x86_64 list (sm_75..120, no sm_110); the aarch64 wheels carry sm_80, 90, 100, 110, 120 + PTX
    from envbuilder.plan.components.cuda import cuda_archs

    def archs(cc: str) -> list[str] | None:
        return cuda_archs(_stack("2.15.0", cuda={"version": "13.2", "source": "pypi", "compute_capability": cc}))

    assert archs("9.0") == ["9.0", "10.0", "11.0", "12.0"]                  # GH200
    assert archs("10.0") == ["10.0", "11.0", "12.0"]                       # GB200
    assert archs("8.6") == ["8.0", "9.0", "10.0", "11.0", "12.0"]          # sm_80's cubin serves 8.6


def test_gh200_preset_manifest_and_job_carry_the_aarch64_arch_list():
    root = Path(__file__).resolve().parents[1] / "images" / "torch215-ddp-pypi-aarch64"
    expect = json.loads((root / "manifest.json").read_text())["expect"]
    assert expect["arch"] == "aarch64" and expect["cuda_arch"] == ["9.0", "10.0", "11.0", "12.0"]
    assert expect["cuda"] == "13.2" and expect["nccl"] == "2.30.7"
    assert "local archs='8.0 9.0 10.0 11.0 12.0' ptx=12.0" in (root / "job.sbatch").read_text()


def test_gh200_facts_name_their_sources():
    from envbuilder.compat.catalog import load_catalog

    cat = load_catalog()
    gh200 = cat.data["gpus"]["gh200"]
    assert gh200["cc"] == "9.0" and gh200["arch"] == "aarch64"
    assert gh200["sources"] and set(gh200["sources"]) <= set(cat.sources)


def test_gh200_horovod_preset_compiles_its_nccl_kernels_for_the_aarch64_arch_list():
    # torch215-horovod-pypi-aarch64: Horovod's CUDA kernels built with the aarch64 (sbsa) nvcc for
    # the arches the aarch64 torch wheel carries from sm_90 up, on the arm64 base, in the devel stage
    import io

    from dockerfile_parse import DockerfileParser

    root = Path(__file__).resolve().parents[1] / "images" / "torch215-horovod-pypi-aarch64"
    parser = DockerfileParser(fileobj=io.BytesIO())
    parser.content = (root / "Dockerfile").read_text()
    froms = [i["value"] for i in parser.structure if i["instruction"] == "FROM"]
    bases = {f.split()[-3] for f in froms} - {"devel"}                 # a stage built on another
    assert bases == {"debian:bookworm-slim"}, froms                     # its arm64 image:
    assert all(f.startswith("--platform=linux/arm64 ") for f in froms if not f.startswith("devel ")), froms
    runs = [i["value"] for i in parser.structure if i["instruction"] == "RUN"]
    build = [r for r in runs if "pip install" in r and "horovod" in r and "HOROVOD_GPU_OPERATIONS=NCCL" in r]
    assert len(build) == 1, runs
    assert "HOROVOD_BUILD_CUDA_CC_LIST=90,100,110,120 " in build[0]
    assert "targets/sbsa-linux" in "\n".join(runs) and "targets/x86_64-linux" not in "\n".join(runs)
    expect = json.loads((root / "manifest.json").read_text())["expect"]
    assert expect["arch"] == "aarch64" and expect["cuda_arch"] == ["9.0", "10.0", "11.0", "12.0"]
    assert expect["horovod"]["operations"] == ["nccl", "mpi", "gloo"]
