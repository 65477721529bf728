"""The definition files of the other presets executed with buildah (`envbuilder defexec`), their
images verified with 2 ranks and compared with the Dockerfile's images of the same locks.

CI: cpu-tf-multiworker (TensorFlow, no Horovod; the Dockerfile's image comes from the build cache,
tests/test_distributed_tf.py builds it). With ENVBUILDER_LONG_BUILDS=1 also the presets whose
%post compiles Horovod, cpu-torch and cpu-intel-tf-debian, and the GPU-from-PyPI DDP preset (5 GB).
In CI, cpu-torch's took 797 s beside the other worker (288 s alone: docs/engines.md) and put a
fresh machine's CI at an estimated 57 minutes; cpu-intel-tf-debian's compile is longer still
(434 s of %post alone). The intel-tensorflow image itself is built and verified in CI
(tests/test_build_verify.py), and cpu-torch-ddp's definition file runs in CI (tests/test_defexec.py).

A module of its own so that it runs in the worker that builds and converts the cpu-torch image
(tests/conftest.py: WORKER_GROUPS): the Dockerfile's build here gives that tag a new image id."""

from __future__ import annotations

import json
import time

import pytest

from conftest import RECIPES, run_envbuilder
from infra import long_build, wheelhouse
from test_defexec import assert_same_packages, defexec, locked_and_built, needs_engines, remove_def_image


@pytest.mark.parametrize("recipe,verify_extra,build_extra", [
    ("cpu-tf-multiworker.yaml", (), ()),
    pytest.param("cpu-torch.yaml", (), ("wheelhouse",), marks=long_build),
    pytest.param("cpu-intel-tf-debian.yaml", (), (), marks=long_build),
    pytest.param("torch-ddp-pypi.yaml", ("--no-gpu",), (), marks=long_build),
])
def test_preset_definition_file_executed_verified_and_compared(tmp_path, recipe, verify_extra, build_extra):
    needs_engines()
    extra = ("--wheelhouse", wheelhouse()) if "wheelhouse" in build_extra else ()
    out = tmp_path / recipe.removesuffix(".yaml")
    docker_tag, build_s = locked_and_built(RECIPES / recipe, out, *extra)
    r, seconds = defexec(out, docker_tag, *extra)
    record = json.loads((out / "defexec.json").read_text()) if (out / "defexec.json").is_file() else {}
    try:
        print("\n" + r.out)
        assert_same_packages(r, docker_tag)
        t0 = time.time()
        v = run_envbuilder("verify", str(out), "--image", record["tag"], "--runtime", "docker", "--ranks", "2",
                           *verify_extra, timeout=1800)
        assert v.code == 0, v.out[-3000:] + v.err[-3000:]
        print(f"{recipe}: Dockerfile build {build_s:.0f} s; definition file executed with buildah {record['seconds']:.0f} s "
              f"(with the comparison {seconds:.0f} s), {record['size_bytes'] / 1e6:.0f} MB; verify 2 ranks "
              f"{time.time() - t0:.0f} s")
    finally:
        if record.get("tag"):
            remove_def_image(record["tag"])
