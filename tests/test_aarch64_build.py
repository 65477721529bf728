"""aarch64 images (CPU, and the GH200 GPU presets verified with --no-gpu) built for real on this x86_64 machine (issue 37 item 2): the arm64 Debian
base (.ci/make-base-image.sh --arch arm64), every RUN step under qemu-user (binfmt_misc), then
`envbuilder verify` with 2 ranks in the image, also under emulation. What the user sees is
asserted: the exit codes, the image's Architecture (arm64) as the engine records it, the verify
report's versions.arch (aarch64, as uname -m reads it inside the image) and the lock's aarch64
wheels. The SIF written from the arm64 image names arm64 in its partition descriptor.

Budget (docs/aarch64.md has the figures): the DDP preset builds in minutes under emulation, its
verify takes longer than x86_64's; the Horovod preset compiles Horovod's C++ under qemu, far
outside CI's budget. Both run with ENVBUILDER_LONG_BUILDS=1 unless the figures below say the DDP
one fits CI."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from envbuilder import emulation
from conftest import RECIPES, run_envbuilder
from infra import ARM64_BASE, _unavailable, docker_cli, image_arch, long_build, require_docker

def docker(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([docker_cli(), *args], capture_output=True, text=True, check=check)


def require_arm64() -> None:
    require_docker()
    if image_arch(ARM64_BASE) != "arm64":
        _unavailable(f"arm64 base image {ARM64_BASE}", "not in the engine", ".ci/make-base-image.sh --arch arm64")
    reason = emulation.why_not_runnable("aarch64")
    if reason:
        _unavailable("qemu-user for aarch64", reason, "bash .ci/install-qemu.sh")


def build(recipe: str, out: Path) -> dict:
    require_arm64()
    tag = f"envbuilder-test/{recipe}"
    r = run_envbuilder("build", str(RECIPES / f"{recipe}.yaml"), "--out", str(out), "--tag", tag, timeout=7200)
    assert r.code == 0, r.err[-4000:]
    return json.loads((out / "image.json").read_text())


@contextlib.contextmanager
def built(tmp_path_factory, recipe: str):
    """RECIPE built into a fresh folder (an arm64 image, as the engine records it); removed after."""
    out = tmp_path_factory.mktemp("aarch64") / recipe
    info = build(recipe, out)
    try:
        assert image_arch(info["tag"]) == "arm64"
        yield out, info
    finally:
        docker("rmi", "-f", info["tag"], check=False)


def verify_two_ranks(out: Path, tag: str, report: Path):
    return run_envbuilder("verify", str(out), "--image", tag, "--runtime", "docker", "--ranks", "2",
                          "--report", str(report), timeout=3600)


def checks_of(report: Path) -> dict:
    return {c["name"]: c for c in json.loads(report.read_text())["checks"]}


def aarch64_wheels_only(out: Path) -> list[str]:
    """The lock's wheel files, every binary one aarch64 (a binary x86_64 wheel would not run)."""
    lock = json.loads((out / "envbuilder.lock").read_text())
    files = [e["file"] for group in lock["pip"].values() for e in group]
    binary = [f for f in files if not f.endswith("-none-any.whl")]
    assert binary and all("aarch64" in f for f in binary), files
    return files


def assert_aarch64_image(out: Path, info: dict, tmp_path: Path) -> dict:
    # the engine's record of the image: built for arm64
    assert image_arch(info["tag"]) == "arm64"
    files = aarch64_wheels_only(out)
    assert "torch-2.10.0-cp311-cp311-manylinux_2_28_aarch64.whl" in files       # PyPI's CPU build
    assert not [f for f in files if f.startswith(("nvidia_", "cuda_"))], files
    # verify: 2 ranks under emulation, the machine as the image sees it
    report = tmp_path / "report.json"
    r = verify_two_ranks(out, info["tag"], report)
    assert r.code == 0, r.out[-3000:] + r.err[-3000:]
    checks = checks_of(report)
    assert checks["versions.arch"]["status"] == "pass"
    assert checks["versions.arch"]["figure"] == "aarch64", checks["versions.arch"]
    return checks


@pytest.fixture(scope="module")
def ddp_image(tmp_path_factory):
    out = tmp_path_factory.mktemp("aarch64") / "cpu-torch-ddp-aarch64"
    info = build("cpu-torch-ddp-aarch64", out)
    yield out, info
    docker("rmi", "-f", info["tag"], check=False)


@long_build
def test_ddp_preset_builds_and_verifies_with_two_ranks_under_emulation(ddp_image, tmp_path):
    out, info = ddp_image
    checks = assert_aarch64_image(out, info, tmp_path)
    assert checks["dist.init[torch]"]["status"] == "pass"
    assert checks["versions.framework"]["status"] == "pass"


@long_build
def test_sif_of_the_arm64_image_names_arm64(ddp_image, tmp_path):
    from envbuilder.sif import layout

    if not (shutil.which("siftool") or os.environ.get("ENVBUILDER_SIFTOOL")) or not shutil.which("mksquashfs"):
        pytest.skip("needs siftool and mksquashfs (.ci/install-apptainer.sh)")
    out, info = ddp_image
    r = run_envbuilder("sif", str(out), "--image", info["tag"], timeout=1800)
    assert r.code == 0, r.err[-3000:]
    (sif,) = out.glob("*.sif")
    header, descriptors = layout.read(sif)
    parts = [d for d in descriptors if d.datatype == layout.DATA_PARTITION]
    assert [layout.arch_name(d.arch) for d in parts] == ["arm64"]
    assert layout.arch_name(header.arch.rstrip(b"\0").decode()) == "arm64"     # the file's own header


@long_build
def test_horovod_preset_builds_and_verifies_with_two_ranks_under_emulation(tmp_path_factory, tmp_path):
    with built(tmp_path_factory, "cpu-torch-horovod-aarch64") as (out, info):
        checks = assert_aarch64_image(out, info, tmp_path)
        assert checks["versions.horovod"]["status"] == "pass"


# --- the GPU preset for Grace Hopper (GH200): CUDA 13.2 from PyPI's aarch64 wheels ------------------

def verify_without_gpu(out: Path, info: dict, tmp_path: Path) -> dict:
    """`verify --no-gpu --ranks 2` of a GPU image under emulation: exit 0; its checks by name."""
    report = tmp_path / "report.json"
    r = run_envbuilder("verify", str(out), "--image", info["tag"], "--runtime", "docker", "--ranks", "2",
                       "--no-gpu", "--report", str(report), timeout=3600)
    assert r.code == 0, r.out[-3000:] + r.err[-3000:]
    return checks_of(report)


@long_build
def test_gh200_preset_builds_and_verifies_without_gpu_under_emulation(tmp_path_factory, tmp_path):
    # about 30-40 minutes here (docs/aarch64.md): 3 GB of NVIDIA wheels unpacked under qemu
    with built(tmp_path_factory, "torch215-ddp-pypi-aarch64") as (out, info):
        files = aarch64_wheels_only(out)             # NVIDIA's sbsa builds among them
        assert "torch-2.15.0-cp311-cp311-manylinux_2_28_aarch64.whl" in files    # PyPI's CUDA build
        assert "nvidia_nccl_cu13-2.30.7-py3-none-manylinux_2_18_aarch64.whl" in files
        assert "nvidia_cudnn_cu13-9.26.0.51-py3-none-manylinux_2_27_aarch64.whl" in files
        # verify without a GPU, 2 ranks over Gloo, all under emulation
        checks = verify_without_gpu(out, info, tmp_path)
        assert checks["versions.arch"]["status"] == "pass" and checks["versions.arch"]["figure"] == "aarch64"
        # the CUDA stack read from the aarch64 libraries themselves
        assert checks["versions.cuda_runtime"]["figure"] == "13.2", checks["versions.cuda_runtime"]
        assert checks["versions.cudnn_library"]["figure"].startswith("9.26.0"), checks["versions.cudnn_library"]
        assert checks["versions.nccl_library"]["figure"] == "2.30.7", checks["versions.nccl_library"]
        assert checks["versions.cuda_arch"]["status"] == "pass", checks["versions.cuda_arch"]   # sm_90 for GH200
        assert checks["dist.init[torch]"]["status"] == "pass"
        assert checks["gpu.visible"]["status"] == "skip"
        assert json.loads((tmp_path / "report.json").read_text())["gpu_checks"] == "left out"


@long_build
def test_gh200_horovod_preset_builds_its_nccl_operations_and_verifies_without_gpu(tmp_path_factory, tmp_path):
    # Horovod 0.28.1's NCCL operations compiled with the aarch64 nvcc for sm_90+ under qemu 11: 1,589 s
    # from cold here, Horovod's compile 1,098 s of it (docs/aarch64.md, "Horovod for GH200")
    with built(tmp_path_factory, "torch215-horovod-pypi-aarch64") as (out, info):
        aarch64_wheels_only(out)
        checks = verify_without_gpu(out, info, tmp_path)
        assert checks["versions.arch"]["figure"] == "aarch64"
        assert checks["versions.cuda_arch"]["status"] == "pass", checks["versions.cuda_arch"]
        hvd_build = checks["horovod.build"]
        assert hvd_build["status"] == "pass", hvd_build
        flags = hvd_build["ranks"]["0"]["data"]["flags"]
        assert flags["nccl_built"] == 23007 and flags["mpi_built"] and flags["cuda_built"], flags   # NCCL 2.30.7
        # Horovod's own kernels, read from its library: the sm_90 cubin GH200 runs, and newer
        kernels = checks["horovod.cuda_arch"]
        assert kernels["status"] == "pass" and kernels["figure"] == "9.0 10.0 11.0 12.0 +PTX 12.0", kernels
        assert checks["versions.horovod"]["status"] == "pass"
