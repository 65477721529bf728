"""The definition files of the other presets executed with buildah (`envbuilder defexec`), their
images verified with 2 ranks and compared with the Dockerfile's images of the same locks.

CI: cpu-torch (Horovod MPI + Gloo compiled in %post against torch). Two other CPU presets' run in
CI beside the test module that builds its Dockerfile's image: cpu-intel-tf-debian's in
tests/test_intel_tf.py, cpu-tf-multiworker's in tests/test_distributed_tf.py. cpu-torch-ddp's
definition file is built by the real Apptainer instead (tests/test_apptainer.py). With ENVBUILDER_LONG_BUILDS=1 also cpu-tf (tensorflow-cpu +
Horovod: the same %post as intel-tensorflow's but for the wheel, and a third TensorFlow Horovod
compile CI has no time for) and the GPU-from-PyPI DDP preset (5 GB).

A module of its own in the worker that builds and converts the cpu-torch image
(tests/conftest.py: WORKER_GROUPS): the Dockerfile's build here gives that tag a new image id."""

from __future__ import annotations

import pytest

from conftest import RECIPES
from infra import long_build, wheelhouse
from test_defexec import definition_file_executed_verified_and_compared, locked_and_built, needs_engines


@pytest.mark.parametrize("recipe,verify_extra,build_extra", [
    ("cpu-torch.yaml", (), ("wheelhouse",)),
    pytest.param("cpu-tf.yaml", (), (), marks=long_build),
    pytest.param("torch-ddp-pypi.yaml", ("--no-gpu",), (), marks=long_build),
])
def test_preset_definition_file_executed_verified_and_compared(tmp_path, recipe, verify_extra, build_extra):
    needs_engines()
    extra = ("--wheelhouse", wheelhouse()) if "wheelhouse" in build_extra else ()
    out = tmp_path / recipe.removesuffix(".yaml")
    docker_tag, build_s = locked_and_built(RECIPES / recipe, out, *extra)
    figures = definition_file_executed_verified_and_compared(out, docker_tag, *extra, verify_extra=verify_extra,
                                                             compare_json=True)
    print(f"{recipe}: Dockerfile build {build_s:.0f} s; {figures}")
