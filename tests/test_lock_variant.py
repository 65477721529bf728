"""A GPU spec never locks a CPU build of its framework, nor a CPU spec a CUDA build: the lock
refuses with one message naming the wheel, where it came from and the fix, before anything is
built (issue 23's defect: torch-horovod-pypi with a wheelhouse holding torch 2.13.0+cpu locked the
CPU wheel and failed 50 s into the build, in the toolkit step)."""

from __future__ import annotations

import pytest

from conftest import RECIPES, run_envbuilder
from envbuilder.errors import EnvbuilderError
from envbuilder.lock.variant import check_framework_build
from infra import TORCH_WHEEL, base_image, require_docker, wheelhouse


def entry(name: str, version: str, frm: str = "index") -> dict:
    return {"name": name, "version": version, "file": f"{name}-{version}-cp311-cp311-linux_x86_64.whl",
            "sha256": "0" * 64, "from": frm}


NVIDIA = [entry("nvidia-nccl-cu13", "2.29.7"), entry("nvidia-cublas", "13.1.0.3")]


def refusal(groups, package="torch", **kw):
    args = {"gpu": True, "cuda_from_pypi": True, "spec_version": "2.13.0", **kw}
    with pytest.raises(EnvbuilderError) as exc:
        check_framework_build(groups, package, **args)
    return exc.value


def test_gpu_spec_with_the_cpu_wheel_from_a_wheelhouse_is_refused_naming_wheel_origin_and_fix():
    err = refusal({"framework": [entry("torch", "2.13.0+cpu", "wheelhouse")]})
    assert err.exit_code == 2
    assert err.field == "lock: pip: torch"
    assert "torch-2.13.0+cpu-cp311" in err.reason and "the wheelhouse" in err.reason and "CPU build" in err.reason
    assert "remove the CPU wheel from the wheelhouse" in err.fix and '"2.13.0+cpu"' in err.fix


def test_gpu_spec_from_pypi_whose_framework_brought_no_nvidia_wheel_is_refused():
    err = refusal({"framework": [entry("tensorflow", "2.15.1")]}, "tensorflow", spec_version="2.15.1")
    assert "no NVIDIA wheel beside it" in err.reason


def test_cpu_spec_that_resolved_a_cuda_build_is_refused_naming_the_nvidia_wheels():
    err = refusal({"cuda": NVIDIA, "framework": [entry("torch", "2.13.0")]}, gpu=False, cuda_from_pypi=False)
    assert "no `cuda:`" in err.reason and "nvidia-cublas" in err.reason
    assert "https://download.pytorch.org/whl/cpu" in err.fix
    err = refusal({"framework": [entry("torch", "2.13.0+cu121")]}, gpu=False, cuda_from_pypi=False)
    assert "accelerator build" in err.reason


@pytest.mark.parametrize("groups,package,kw", [
    ({"cuda": NVIDIA, "framework": [entry("torch", "2.13.0")]}, "torch", {}),
    ({"framework": [entry("torch", "2.13.0+cpu", "wheelhouse")]}, "torch", {"gpu": False, "cuda_from_pypi": False}),
    # CUDA from the base image: a +cuNNN wheel from PyTorch's index, no NVIDIA wheels
    ({"framework": [entry("torch", "2.5.1+cu121")]}, "torch", {"cuda_from_pypi": False}),
    ({"framework": [entry("tensorflow", "2.12.0")]}, "tensorflow", {"cuda_from_pypi": False}),
    # a CPU spec whose own packages bring an NVIDIA wheel: not the framework's build
    ({"framework": [entry("torch", "2.13.0+cpu")], "packages": [entry("nvidia-ml-py", "12.0")]}, "torch",
     {"gpu": False, "cuda_from_pypi": False}),
    ({"framework": [entry("intel-tensorflow", "2.14.0")]}, "intel-tensorflow", {"gpu": False, "cuda_from_pypi": False}),
])
def test_the_right_build_passes(groups, package, kw):
    check_framework_build(groups, package, **{"gpu": True, "cuda_from_pypi": True, "spec_version": "2.13.0", **kw})


def test_build_of_a_gpu_preset_with_a_cpu_wheelhouse_stops_at_the_lock_before_the_engine(tmp_path):
    """The defect as a user met it, with the real resolver: exit 2 and no lock, no image."""
    require_docker()
    base_image()
    out = tmp_path / "out"
    r = run_envbuilder("build", str(RECIPES / "torch-ddp-pypi.yaml"), "--out", str(out),
                       "--wheelhouse", wheelhouse(), "--ca-bundle", "/etc/ssl/certs/ca-certificates.crt",
                       timeout=900)
    assert r.code == 2, r.out + r.err[-3000:]
    assert TORCH_WHEEL in r.err and "from the wheelhouse" in r.err and "Traceback" not in r.err
    assert "lock: pip: torch" in r.err
    assert not (out / "envbuilder.lock").exists() and not (out / "image.json").exists()


@pytest.mark.parametrize("preset,runtime_wheel,built,expected", [
    # TensorFlow 2.21's and-cuda extra resolved nvidia-cuda-runtime-cu12 12.9.79 (2026-11-26) for a
    # TensorFlow built with CUDA 12.5.1: verify read libcudart 12.9 and failed against the spec's 12.5
    ("tf-pypi-debian", ("nvidia-cuda-runtime-cu12", "12.9.79"), "12.5", "12.9"),
    ("torch-horovod-pypi", ("nvidia-cuda-runtime", "13.0.96"), "13.0", "13.0"),
])
def test_the_manifest_expects_the_cuda_runtime_the_lock_installs(preset, runtime_wheel, built, expected):
    from envbuilder.lock.model import Lock
    from envbuilder.plan.components import expect as manifest_expect
    from envbuilder.stack import resolve
    from envbuilder.spec.model import load_spec

    spec = load_spec(RECIPES / f"{preset}.yaml")
    assert "cuda_runtime" not in manifest_expect(resolve(spec))            # no lock: the spec's CUDA only
    lock = Lock(name=preset, inputs={}, pip={"framework": [entry(*runtime_wheel), *NVIDIA]})
    expect = manifest_expect(resolve(spec, lock))
    assert (expect["cuda"], expect["cuda_runtime"]) == (built, expected)
