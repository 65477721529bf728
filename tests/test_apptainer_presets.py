"""The definition files of the other presets built by the real Apptainer (unprivileged, with
--fakeroot: tests/apptainer_build.py), their .sifs verified with 2 ranks under Apptainer and compared
with the Dockerfile's images of the same locks (`envbuilder compare`).

Long builds only (ENVBUILDER_LONG_BUILDS=1) since issue 47, for CI's time on a fresh machine:
cpu-torch-horovod (Horovod MPI + Gloo compiled in %post against torch: 403 s warm, 647 s cold, the
same shell as its Dockerfile's RUN steps, which CI builds), cpu-tf-horovod (tensorflow-cpu + Horovod)
and the GPU-from-PyPI DDP preset (5 GB; verified with --no-gpu). CI builds two definition files with
Apptainer, each once: cpu-torch-ddp's (tests/test_apptainer.py: the archive bootstrap, labels, the
runscript) and cpu-tf-multiworker's (tests/test_distributed_tf.py: Bootstrap: docker through the
mirror); cpu-intel-tf-debian's is a long build in tests/test_intel_tf.py.

A module of its own in the worker that builds and converts the cpu-torch image
(tests/conftest.py: WORKER_GROUPS): the Dockerfile's build here gives that tag a new image id."""

from __future__ import annotations

import json
import time

import pytest

from apptainer_build import CA_BUNDLE, built_by_apptainer_verified_and_compared
from conftest import RECIPES, run_envbuilder
from infra import base_image, keep_for_run, long_build, require_docker, wheelhouse


def locked_and_built(recipe, out, *extra: str) -> tuple[str, float]:
    """A locked output folder of RECIPE and its Dockerfile's image (Docker): (tag, build seconds)."""
    require_docker()
    base_image()
    probe = run_envbuilder("build", str(recipe), "--no-build", "--out", str(out))
    assert probe.code == 0, probe.err
    tag = json.loads((out / "manifest.json").read_text())["image"]["tag"]
    keep_for_run(tag)
    t0 = time.time()
    r = run_envbuilder("build", str(recipe), "--out", str(out), "--ca-bundle", CA_BUNDLE, *extra, timeout=3600)
    assert r.code == 0, r.err[-3000:]
    return tag, time.time() - t0


@pytest.mark.parametrize("recipe,verify_extra,build_extra", [
    pytest.param("cpu-torch-horovod.yaml", (), ("wheelhouse",), marks=long_build),
    pytest.param("cpu-tf-horovod.yaml", (), (), marks=long_build),
    pytest.param("torch-ddp-pypi.yaml", ("--no-gpu",), (), marks=long_build),
])
def test_preset_definition_file_built_by_apptainer_verified_and_compared(tmp_path, recipe, verify_extra, build_extra):
    extra = ("--wheelhouse", wheelhouse()) if "wheelhouse" in build_extra else ()
    out = tmp_path / "docker" / recipe.removesuffix(".yaml")
    docker_tag, build_s = locked_and_built(RECIPES / recipe, out, *extra)
    figures = built_by_apptainer_verified_and_compared(RECIPES / recipe, out, docker_tag, tmp_path / "apptainer",
                                                       *extra, verify_extra=verify_extra)
    print(f"{recipe}: Dockerfile build {build_s:.0f} s; {figures}")
