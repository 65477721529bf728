"""Facts the recipes and the lock use are read from the catalog (compat/catalog.yaml), each with a
source, not written as code: the CPU architecture's names (wheel platform, Docker platform, CUDA's
targets folder), the PyTorch wheel index, the nvidia/cuda runtime flavour, the default glibc."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from envbuilder.compat.catalog import load_catalog
from envbuilder.generate import generate
from envbuilder.needs import needs
from envbuilder.stack import resolve
from envbuilder.spec.model import load_spec

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "envbuilder"


def _stack(preset: str):
    return resolve(load_spec(ROOT / "recipes" / preset))


def test_the_new_facts_name_known_sources():
    cat = load_catalog()
    for section in (cat.data["arches"].values(), [cat.data["default_glibc"]],
                    cat.data["indexes"].values(), [cat.data["cuda_images"]]):
        for entry in section:
            assert entry["sources"] and set(entry["sources"]) <= set(cat.sources), entry


@pytest.mark.parametrize("fact", [
    r"\"https://download\.pytorch\.org/whl/", # the PyTorch index folders
    r"-runtime-",                           # the nvidia/cuda runtime flavour
    r"targets/x86_64-linux",                # CUDA's targets folder
    r"manylinux_\{?[\w.]*\}?_\w*x86_64",    # wheel platform tags
    r"linux/(amd64|arm64)",                 # Docker platforms
    r"\"2\.28\"",                           # the default glibc
])
def test_no_catalog_fact_is_written_as_code(fact):
    """The smoke suite (shipped inside the image, stdlib only) is left out: it reads the manifest."""
    hits = [f"{p.relative_to(ROOT)}:{n}" for p in PKG.rglob("*.py") if "smoke" not in p.parts
            for n, line in enumerate(p.read_text().splitlines(), 1)
            if re.search(fact, line) and not line.lstrip().startswith("#")]
    assert not hits, f"{fact} written in code: {hits}"


def test_the_pytorch_index_comes_from_the_catalog():
    cat = load_catalog()
    gpu = _stack("torch-horovod-gpu.yaml")
    cuda = gpu.spec.cuda.version.split(".")
    assert gpu.framework_index_url == cat.data["indexes"]["pytorch"]["cuda"].format(cuda="".join(cuda[:2]))
    assert gpu.framework_index_url.endswith("/cu" + "".join(cuda[:2]))
    arm = _stack("gpu-torch-ddp-aarch64.yaml")      # CUDA 13.2 on aarch64: only PyTorch's index has it
    assert arm.framework_index_url == cat.framework_index("pytorch", "13.2") == \
        cat.data["indexes"]["pytorch"]["cuda"].format(cuda="132")


def test_the_runtime_stage_of_a_cuda_devel_base_is_its_runtime_flavour():
    cat = load_catalog()
    assert cat.runtime_image("nvidia/cuda:12.4.1-cudnn-devel-ubuntu22.04") == \
        "nvidia/cuda:12.4.1-cudnn-runtime-ubuntu22.04"
    assert cat.runtime_image("local/debian:bookworm") is None
    stack = _stack("tf-horovod-gpu.yaml")
    assert "-devel-" in stack.base and stack.runtime_base == cat.runtime_image(stack.base)


def test_an_aarch64_stack_locks_aarch64_wheels_and_builds_for_arm64():
    from envbuilder.engines.buildah import OciEngine
    from envbuilder.engines.context import platform_of
    from envbuilder.engines.docker import docker_build_command
    from envbuilder.lock import pip as pip_

    arm, x86 = _stack("gpu-torch-ddp-aarch64.yaml"), _stack("gpu-torch-ddp.yaml")
    assert needs(arm)["pip"]["machine"] == "aarch64"
    assert "machine" not in needs(x86)["pip"]          # x86_64 locks keep their inputs
    tgt = pip_.target("3.11", "2.28", needs(arm)["pip"]["machine"])
    assert tgt["markers"]["platform_machine"] == "aarch64"
    assert tgt["platforms"][0] == "manylinux_2_28_aarch64" and "manylinux2014_aarch64" in tgt["platforms"]
    assert not any("x86_64" in p for p in tgt["platforms"])
    assert platform_of(arm) == "linux/arm64" and platform_of(x86) is None
    cmd = docker_build_command(["docker", "build"], Path("ctx"), "t:1", None, platform=platform_of(arm))
    assert cmd[cmd.index("--platform") + 1] == "linux/arm64"
    bcmd = OciEngine("buildah").build_command(Path("ctx"), "t:1", None, 0, platform=platform_of(arm))
    assert bcmd[bcmd.index("--platform") + 1] == "linux/arm64"


def test_an_aarch64_cuda_toolkit_links_cudas_sbsa_targets_folder(tmp_path):
    """Horovod's NCCL build on aarch64 (CUDA from PyPI): nvcc.profile looks under targets/sbsa-linux."""
    text = (ROOT / "recipes" / "torch-horovod-pypi.yaml").read_text() + "\narch: aarch64\n"
    path = tmp_path / "arm.yaml"
    path.write_text(text)
    dockerfile = generate(load_spec(path)).files["Dockerfile"].decode()
    assert "targets/sbsa-linux" in dockerfile and "targets/x86_64-linux" not in dockerfile


def test_real_resolution_for_aarch64_pins_aarch64_wheels():
    """pip, asked for the aarch64 target, pins an aarch64 wheel with its hash (PyPI, for real)."""
    from envbuilder.lock import pip as pip_

    got = pip_.resolve({"packages": ["PyYAML==6.0.2"]}, pip_.target("3.11", "2.36", "aarch64"))["packages"]
    entry = next(e for e in got if e["name"] == "PyYAML")
    assert entry["file"].endswith("_aarch64.whl") and "cp311" in entry["file"] and len(entry["sha256"]) == 64


def test_the_bootstrap_tools_versions_are_written_once():
    from envbuilder.plan.components.python import BOOTSTRAP, bootstrap_prefer

    pins = [re.compile(re.escape(b.split("==")[0]) + r"['\"]?\s*[:=]+\s*['\"]?" + re.escape(b.split("==")[1]))
            for b in BOOTSTRAP]
    hits = {r.pattern: [str(p.relative_to(ROOT)) for p in PKG.rglob("*.py") if r.search(p.read_text())] for r in pins}
    assert all(files == ["envbuilder/plan/components/python.py"] for files in hits.values()), hits
    assert bootstrap_prefer(_stack("cpu-torch-ddp.yaml")) == {"setuptools": "69.5.1", "wheel": "0.43.0"}
