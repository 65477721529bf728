"""intel-tensorflow + Horovod for real: the cpu-intel-tf-debian preset built on Docker from the local
Debian base (one Horovod compile against TensorFlow), verified with 2 ranks over MPI and Gloo,
verify proving what makes it intel-tensorflow; a thread setting that does not reach the ranks fails
naming it; and its definition file built by the real Apptainer (unprivileged), its .sif compared
with this image and verified under Apptainer.

A module of its own (its own worker group, tests/conftest.py) so that its two Horovod compiles
(the Dockerfile's and the definition file's) run beside other groups' waits."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from apptainer_build import built_by_apptainer_verified_and_compared
from conftest import RECIPES
from infra import long_build
from test_build_verify import CA_BUNDLE, build, derive, docker, report_checks, verify


@pytest.fixture(scope="module")
def intel_tf_image(tmp_path_factory):
    """The TensorFlow + Horovod image CI builds: intel-tensorflow 2.14 (one Horovod compile, as
    cpu-tf's was). It is the suite's one Horovod under TensorFlow: the host environment has
    Horovod's PyTorch binding only (.ci/make-smoke-venv.sh takes it from the cpu-torch image)."""
    out = tmp_path_factory.mktemp("intel-tf") / "cpu-intel-tf-debian"
    r = build(RECIPES / "intel-tf-cpu-debian.yaml", out, Path(CA_BUNDLE))
    assert r.code == 0, r.err[-3000:]
    info = json.loads((out / "image.json").read_text())
    yield out, info


def test_verify_intel_tf_image_with_two_ranks(intel_tf_image, tmp_path):
    """intel-tensorflow + Horovod, 2 ranks over MPI and Gloo; verify proves it is intel-tensorflow:
    the distribution that owns the imported `tensorflow`, oneDNN on in the process (TensorFlow's
    own flag) and the image's oneDNN/KMP/OMP settings on every rank."""
    out, _ = intel_tf_image
    report = tmp_path / "report.json"
    r = verify(str(out), "--runtime", "docker", "--ranks", "2", "--report", str(report))
    assert r.code == 0, r.out + r.err[-3000:]
    print("\n" + r.out)
    checks = report_checks(json.loads(report.read_text()))
    assert not [c for c in checks.values() if c["status"] == "fail"]
    dist = checks["framework.distribution"]
    assert dist["status"] == "pass" and dist["figure"] == "intel-tensorflow 2.14.0", dist
    assert "no other distribution" in dist["detail"]
    onednn = checks["framework.onednn"]
    assert onednn["status"] == "pass" and "IsMklEnabled() is True" in onednn["detail"], onednn
    manifest = json.loads((out / "manifest.json").read_text())
    want = manifest["expect"]["cpu_env"]
    assert want["TF_ENABLE_ONEDNN_OPTS"] == "1" and want["KMP_BLOCKTIME"] == "0"
    for ctrl in ("mpi", "gloo"):
        env = checks[f"env.cpu_threads[{ctrl}]"]
        assert env["status"] == "pass", env
        for rank in ("0", "1"):
            seen = env["ranks"][rank]["data"]
            assert {k: seen["env"][k] for k in want} == want, seen
            assert seen["env"]["OMP_NUM_THREADS"] == seen["omp_expected"] and seen["onednn"] is True
        assert checks[f"train.tensorflow[{ctrl}]"]["status"] == "pass"
        assert checks[f"horovod.init[{ctrl}]"]["figure"] == f"2 ranks, {ctrl} controller"
        assert f"{ctrl.upper()}_ALLREDUCE" in checks[f"horovod.cpu_ops[{ctrl}]"]["figure"]
        assert re.match(r"\d+ cases exact", checks[f"allreduce.exact[{ctrl}]"]["figure"])
    assert checks["horovod.operations"]["status"] == "pass"


def test_a_thread_setting_that_does_not_reach_the_ranks_fails_naming_it(intel_tf_image, tmp_path):
    """The image's manifest asks KMP_BLOCKTIME=200 while its environment (and job.sbatch) give the
    ranks 0: env.cpu_threads fails on every rank, naming the variable and both values."""
    out, info = intel_tf_image
    tag = derive(info["tag"], "envbuilder-test/broken:kmp-blocktime",
                 "sed -i 's/\"KMP_BLOCKTIME\": \"0\"/\"KMP_BLOCKTIME\": \"200\"/' /opt/envbuilder/manifest.json",
                 tmp_path)
    try:
        report = tmp_path / "report.json"
        r = verify("--image", tag, "--runtime", "docker", "--ranks", "2", "--report", str(report),
                   "--timeout", "120")
        assert r.code == 1, r.out + r.err[-2000:]
        checks = report_checks(json.loads(report.read_text()))
        for ctrl in ("mpi", "gloo"):
            env = checks[f"env.cpu_threads[{ctrl}]"]
            assert env["status"] == "fail", env
            assert "KMP_BLOCKTIME=0, manifest/job.sbatch set 200" in env["detail"], env
        assert checks["framework.onednn"]["status"] == "pass"
    finally:
        docker("rmi", "-f", tag, check=False)


@long_build
def test_definition_file_built_by_apptainer_verified_and_compared(intel_tf_image, tmp_path):
    """The same lock's Apptainer.def (Horovod compiled again, in %post) built by Apptainer: %test
    passes, the same packages as the image above, and verify passes with 2 ranks under Apptainer.
    A long build since issue 46 (521 s, CI's longest test): CI keeps the definition files of
    cpu-torch-ddp (tests/test_apptainer.py) and the TF multi-worker preset
    (tests/test_distributed_tf.py) built by Apptainer, and gave the time to the wheel's install
    test, the mirror and the arm64 base."""
    out, info = intel_tf_image
    figures = built_by_apptainer_verified_and_compared(RECIPES / "intel-tf-cpu-debian.yaml", out, info["tag"], tmp_path)
    print(f"cpu-intel-tf-debian: {figures}")
