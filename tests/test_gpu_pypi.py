"""GPU images built for real, with CUDA, cuDNN and NCCL from NVIDIA's PyPI wheels on the local
Debian base (`cuda: {source: pypi}`): the PyTorch + Horovod (NCCL, MPI, Gloo) preset and the
PyTorch DDP preset. There is no GPU here: the images are verified with 2 ranks and `--no-gpu`
(every device-free check runs: versions read from the libraries themselves, Horovod's NCCL build,
the compiled GPU architectures, CPU collectives and training), and the GPU checks must then say
they were left out; without `--no-gpu` the same verify fails. A GPU image with libnccl removed
fails verify naming the check. The images are removed at the end (the engine's build cache keeps
the layers for the next run).

CI's budget: every test here runs with ENVBUILDER_LONG_BUILDS=1. The DDP image builds in about 2-4
minutes from cold (3 GB of NVIDIA wheels downloaded and unpacked, a 5 GB image), the Horovod image
compiles Horovod's CUDA/NCCL code besides (about 4 more minutes alone on 2 idle cores): together
more than a fresh machine's CI can spend for them (issue 23: under 60 minutes in all). What CI
keeps of the GPU path runs without an image: the rendering and rules (tests/test_render.py,
tests/test_compat_rules.py) and the lock's variant check (tests/test_lock_variant.py)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import RECIPES, ROOT, run_envbuilder
from infra import base_image, docker_cli, long_build, require_docker

CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
SITE = "/opt/venv/lib/python3.11/site-packages"


def docker(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([docker_cli(), *args], capture_output=True, text=True, check=check)


def _build(recipe: str, out: Path):
    require_docker()
    base_image()
    tag = f"envbuilder-test/gpu-{recipe}"
    r = run_envbuilder("build", str(RECIPES / f"{recipe}.yaml"), "--out", str(out), "--ca-bundle", CA_BUNDLE,
                       "--tag", tag, timeout=3600)
    assert r.code == 0, r.err[-4000:]
    return json.loads((out / "image.json").read_text())


@pytest.fixture(scope="module")
def horovod_image(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu") / "torch-horovod-pypi"
    info = _build("torch-horovod-pypi", out)
    yield out, info
    docker("rmi", "-f", info["tag"], check=False)


@pytest.fixture(scope="module")
def ddp_image(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu") / "torch-ddp-pypi"
    info = _build("torch-ddp-pypi", out)
    yield out, info
    docker("rmi", "-f", info["tag"], check=False)


def verify(*args: str):
    return run_envbuilder("verify", *args, timeout=1200)


def checks_of(report: Path) -> dict:
    return {c["name"]: c for c in json.loads(report.read_text())["checks"]}


def in_image(tag: str, script: str) -> str:
    proc = docker("run", "--rm", "--entrypoint", "bash", tag, "-c", script, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def venv_layers(tag: str) -> list[str]:
    """What the image's venv layers copy, in build order (docker history)."""
    history = [json.loads(line) for line in docker("history", "--no-trunc", "--format", "{{json .}}",
                                                   tag).stdout.splitlines()]
    return [h["CreatedBy"].split()[1] for h in reversed(history) if h["CreatedBy"].startswith("COPY /opt/venv")]


# --- the lock and the recipe ----------------------------------------------------------------------

@long_build
def test_lock_pins_every_nvidia_wheel_with_its_hash(horovod_image):
    out, _ = horovod_image
    lock = json.loads((out / "envbuilder.lock").read_text())
    groups = lock["pip"]["groups"] if "groups" in lock["pip"] else lock["pip"]
    cuda = {e["name"].lower().replace("_", "-"): e for e in groups["cuda"]}
    assert cuda["nvidia-nccl-cu13"]["version"] == "2.29.7"
    assert cuda["nvidia-cudnn-cu13"]["version"] == "9.20.0.48"
    assert all(len(e["sha256"]) == 64 and e["url"].startswith("https://") for e in cuda.values())
    assert not any(n.startswith(("nvidia-", "cuda-")) for n in
                   (e["name"].lower() for e in groups["framework"]))          # NVIDIA's layer comes first
    toolkit = {e["name"].lower() for e in groups["toolkit"]}
    assert {"nvidia-cuda-nvcc", "nvidia-cuda-cccl"} <= toolkit
    # the toolkit is devel-only: the manifest's drift check does not expect it in the image
    expect = json.loads((out / "manifest.json").read_text())["expect"]
    assert "nvidia-cuda-nvcc" not in expect["packages"] and "nvidia-nccl-cu13" in expect["packages"]
    dockerfile = (out / "Dockerfile").read_text()
    assert dockerfile.index("pins/pip-cuda.txt") < dockerfile.index("pins/pip-framework.txt") \
        < dockerfile.index("pins/pip-toolkit.txt") < dockerfile.index("pins/pip-horovod.txt")
    for fix in ("fix toolkit layout", "fix link names", "fix horovod_cuda_cxx17", "fix horovod_cxx17"):
        assert fix in dockerfile, fix


@long_build
def test_runtime_stage_keeps_libraries_not_nvcc_or_headers(horovod_image):
    _, info = horovod_image
    # torch's own C++ API headers (torch/include/.../nccl.h) and the copy of cuda_runtime.h triton's
    # JIT compiles its launchers with belong to the framework's wheels and stay; NVIDIA's toolkit goes
    found = in_image(info["tag"], f"find / -xdev \\( -path {SITE}/torch -o -path {SITE}/triton -o -path /proc \\) "
                                  f"-prune -o \\( -name nvcc -o -name 'cuda_runtime.h' -o -name nccl.h "
                                  f"-o -name 'libnccl.so*' -o -name 'libcudnn.so*' -o -name 'libcudart.so*' \\) "
                                  f"-print | sort")
    names = [Path(p).name for p in found.split()]
    assert "nvcc" not in names and "cuda_runtime.h" not in names and "nccl.h" not in names, found
    assert names.count("libnccl.so.2") == 1 and names.count("libcudnn.so.9") == 1, found   # one copy each
    assert names.count("libcudart.so.13") == 1, found
    assert in_image(info["tag"], "command -v g++ cmake || true").strip() == ""
    assert venv_layers(info["tag"]) == [f"{SITE}/nvidia", "/opt/venv"]


# --- verify without a GPU -------------------------------------------------------------------------

@long_build
def test_horovod_image_verifies_with_two_ranks_without_gpu(horovod_image, tmp_path):
    out, info = horovod_image
    report = tmp_path / "report.json"
    r = verify(str(out), "--image", info["tag"], "--runtime", "docker", "--ranks", "2", "--no-gpu",
               "--report", str(report))
    assert r.code == 0, r.out + r.err[-3000:]
    checks = checks_of(report)
    assert checks["versions.cuda_runtime"]["status"] == "pass" and checks["versions.cuda_runtime"]["figure"] == "13.0"
    assert checks["versions.cuda"]["status"] == "pass"                      # torch.version.cuda
    assert checks["versions.cudnn_library"]["figure"].startswith("9.20.0")
    assert checks["versions.nccl_library"]["figure"] == "2.29.7"
    assert checks["versions.nccl"]["status"] == "pass"                       # the libnccl Horovod loads
    assert checks["versions.cuda_arch"]["status"] == "pass", checks["versions.cuda_arch"]
    kernels = checks["horovod.cuda_arch"]                                    # read from Horovod's .nv_fatbin
    assert kernels["status"] == "pass" and kernels["figure"].startswith("8.0 8.6 9.0 10.0 12.0"), kernels
    ops = checks["horovod.operations"]
    assert ops["status"] == "pass" and "nccl built" in ops["detail"], ops    # hvd.nccl_built()
    assert checks["allreduce.exact[mpi]"]["status"] == "pass"
    assert any(n.startswith("train.") and c["status"] == "pass" for n, c in checks.items())
    assert checks["gpu.visible"]["status"] == "skip"
    assert "not run: no GPU visible" in checks["gpu.visible"]["detail"]
    assert "GPU checks left out" in r.out + r.err
    assert "OK without GPU checks" in r.out + r.err
    assert json.loads(report.read_text())["gpu_checks"] == "left out"


@long_build
def test_gpu_image_without_no_gpu_fails_verify(ddp_image, tmp_path):
    out, info = ddp_image
    report = tmp_path / "report.json"
    r = verify(str(out), "--image", info["tag"], "--runtime", "docker", "--ranks", "2", "--report", str(report))
    assert r.code == 1, r.out + r.err[-3000:]
    checks = checks_of(report)
    for name in ("gpu.visible", "gpu.devices[torch]"):      # the static check and the ranks' own
        gpu = checks[name]
        assert gpu["status"] == "fail" and "not run: no GPU visible" in gpu["detail"] and "--no-gpu" in gpu["detail"]


@long_build
def test_ddp_image_verifies_without_gpu(ddp_image, tmp_path):
    out, info = ddp_image
    report = tmp_path / "report.json"
    r = verify(str(out), "--image", info["tag"], "--runtime", "docker", "--ranks", "2", "--no-gpu",
               "--report", str(report))
    assert r.code == 0, r.out + r.err[-3000:]
    checks = checks_of(report)
    for name in ("versions.cuda", "versions.cuda_runtime", "versions.cudnn_library", "versions.nccl_library",
                 "versions.cuda_arch", "versions.packages",
                 # torch.distributed with 2 ranks (the manifest asks nccl: without a GPU, over gloo)
                 "dist.init[torch]", "dist.collectives[torch]", "train.ddp[torch]"):
        assert checks[name]["status"] == "pass", checks[name]
    assert "no GPU, the CPU checks use gloo" in checks["dist.init[torch]"]["detail"]
    for name in ("gpu.devices[torch]", "gpu.nccl_allreduce[torch]"):
        assert checks[name]["status"] == "skip" and "left out (--no-gpu)" in checks[name]["detail"], checks[name]
    assert "GPU checks left out" in r.out + r.err and "OK without GPU checks" in r.out + r.err
    # no toolkit was installed for an image without Horovod, and no header reached the runtime stage
    assert "pins/pip-toolkit.txt" not in (out / "Dockerfile").read_text()
    assert in_image(info["tag"], f"ls -d {SITE}/nvidia/*/include 2>/dev/null || true").strip() == ""
    # NVIDIA's libraries are a layer of their own, before the rest of the venv (they change least)
    assert venv_layers(info["tag"]) == [f"{SITE}/nvidia", "/opt/venv"]


@long_build
def test_gpu_image_without_libnccl_fails_verify_naming_the_check(ddp_image, tmp_path):
    _, info = ddp_image
    tag = "envbuilder-test/gpu-broken:no-libnccl"
    (tmp_path / "Dockerfile").write_text(f"FROM {info['tag']}\nRUN rm -f {SITE}/nvidia/nccl/lib/libnccl.so.2\n")
    proc = subprocess.run([docker_cli(), "build", "-q", "-t", tag, str(tmp_path)], capture_output=True, text=True,
                          env={"DOCKER_BUILDKIT": "1", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    try:
        report = tmp_path / "report.json"
        r = verify("--image", tag, "--runtime", "docker", "--ranks", "2", "--no-gpu", "--report", str(report),
                   "--timeout", "120")
        assert r.code == 1, r.out + r.err[-2000:]
        checks = checks_of(report)
        assert checks["versions.nccl_library"]["status"] == "fail", checks["versions.nccl_library"]
        assert "FAIL" in r.out.upper()
    finally:
        docker("rmi", "-f", tag, check=False)


# --- TensorFlow 2.15.1 GPU + Horovod (MPI, Gloo) with CUDA 12.2 from PyPI ---------------------------
# tensorflow[and-cuda] 2.15.1 pins CUDA 12.2, cuDNN 8.9.4.25 and NCCL 2.16.5; its nvcc wheel holds
# ptxas only, so Horovod is built without NCCL operations (rule PYPI_CUDA_NO_NVCC refuses them).

@pytest.fixture(scope="module")
def tf_horovod_image(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu") / "tf-horovod-pypi"
    info = _build("tf-horovod-pypi", out)
    yield out, info
    docker("rmi", "-f", info["tag"], check=False)


@long_build
def test_tf_lock_pins_the_wheels_tensorflow_2151_names(tf_horovod_image):
    out, _ = tf_horovod_image
    lock = json.loads((out / "envbuilder.lock").read_text())
    groups = lock["pip"]["groups"] if "groups" in lock["pip"] else lock["pip"]
    cuda = {e["name"].lower().replace("_", "-"): e for e in groups["cuda"]}
    assert cuda["nvidia-cuda-runtime-cu12"]["version"] == "12.2.140"
    assert cuda["nvidia-cudnn-cu12"]["version"] == "8.9.4.25"
    assert cuda["nvidia-nccl-cu12"]["version"] == "2.16.5"
    assert all(len(e["sha256"]) == 64 for e in cuda.values())
    assert "toolkit" not in groups                           # no Horovod NCCL build: no toolkit


@long_build
def test_tf_runtime_stage_has_one_copy_of_each_library_and_no_nvcc(tf_horovod_image):
    _, info = tf_horovod_image
    found = in_image(info["tag"], f"find / -xdev \\( -path {SITE}/tensorflow -o -path /proc \\) -prune -o "
                                  f"\\( -name nvcc -o -name 'cuda_runtime.h' -o -name nccl.h -o -name 'libnccl.so*' "
                                  f"-o -name 'libcudnn.so*' -o -name 'libcudart.so*' -o -name 'libcublas.so*' \\) "
                                  f"-print | sort")
    names = [Path(p).name for p in found.split()]
    assert "nvcc" not in names and "cuda_runtime.h" not in names and "nccl.h" not in names, found
    for lib in ("libnccl.so.2", "libcudnn.so.8", "libcudart.so.12", "libcublas.so.12"):
        assert names.count(lib) == 1, (lib, found)
    assert in_image(info["tag"], "command -v g++ cmake || true").strip() == ""
    assert venv_layers(info["tag"]) == [f"{SITE}/nvidia", "/opt/venv"]


@long_build
def test_tf_horovod_image_verifies_with_two_ranks_without_gpu(tf_horovod_image, tmp_path):
    out, info = tf_horovod_image
    report = tmp_path / "report.json"
    r = verify(str(out), "--image", info["tag"], "--runtime", "docker", "--ranks", "2", "--no-gpu",
               "--report", str(report))
    assert r.code == 0, r.out + r.err[-3000:]
    checks = checks_of(report)
    assert checks["versions.cuda_runtime"]["figure"] == "12.2", checks["versions.cuda_runtime"]
    assert checks["versions.cudnn_library"]["figure"] == "8.9.4", checks["versions.cudnn_library"]
    assert checks["versions.nccl_library"]["figure"] == "2.16.5", checks["versions.nccl_library"]
    # TensorFlow names no NCCL version of its own: the check says which one reads the library
    assert checks["versions.nccl"]["status"] == "skip" and "versions.nccl_library" in checks["versions.nccl"]["detail"]
    ops = checks["horovod.operations"]
    assert ops["status"] == "pass" and "nccl built" not in ops["detail"], ops
    assert checks["allreduce.exact[mpi]"]["status"] == "pass"
    assert any(n.startswith("train.") and c["status"] == "pass" for n, c in checks.items())
    assert "OK without GPU checks" in r.out + r.err
    assert json.loads(report.read_text())["gpu_checks"] == "left out"


def gpu_figures(tag: str) -> dict:
    """bench/gpu_figures.py's figures (size, payload, duplicate NVIDIA libraries) of an image."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        spec = importlib.util.spec_from_file_location("envbuilder_gpu_figures", ROOT / "bench" / "gpu_figures.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(ROOT / "bench"))
    return module.figures(tag)


@long_build
def test_tf_size_is_within_ten_percent_of_its_payload(tf_horovod_image):
    _, info = tf_horovod_image
    figures = gpu_figures(info["tag"])
    assert figures["ratio"] <= 1.10, figures
    assert figures["duplicates"] == {}, figures
