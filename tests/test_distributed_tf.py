"""tf-multiworker for real: the cpu-tf-multiworker preset built on Docker, and 2 workers of
tf.distribute.MultiWorkerMirroredStrategy in the container (TF_CONFIG from the suite's spawner):
exact all_reduce, a data-parallel run whose loss falls with identical weights on both workers; and
the preset's definition file built by the real Apptainer (unprivileged), its .sif compared with
that image and verified under Apptainer (its workers' TF_CONFIG included)."""

from __future__ import annotations

import json
import time

import pytest

from apptainer_build import built_by_apptainer_verified_and_compared
from conftest import RECIPES, run_envbuilder
from infra import keep_for_run, base_image, require_docker

RECIPE = RECIPES / "cpu-tf-multiworker.yaml"


@pytest.fixture(scope="module")
def tf_mw_image(tmp_path_factory):
    require_docker()
    base_image()
    out = tmp_path_factory.mktemp("tfmw") / "cpu-tf-multiworker"
    probe = run_envbuilder("build", str(RECIPE), "--no-build", "--out", str(out))
    assert probe.code == 0, probe.err
    tag = json.loads((out / "manifest.json").read_text())["image"]["tag"]
    keep_for_run(tag)
    r = run_envbuilder("build", str(RECIPE), "--out", str(out), "--ca-bundle",
                       "/etc/ssl/certs/ca-certificates.crt", timeout=2400)
    assert r.code == 0, r.err[-3000:]
    yield out


def test_two_workers_of_multiworker_mirrored_strategy(tf_mw_image, tmp_path):
    report = tmp_path / "report.json"
    t0 = time.time()
    r = run_envbuilder("verify", str(tf_mw_image), "--runtime", "docker", "--ranks", "2", "--report",
                       str(report), timeout=900)
    wall = time.time() - t0
    checks = {c["name"]: c for c in json.loads(report.read_text())["checks"]}
    failed = {n: c.get("detail", "")[:300] for n, c in checks.items() if c["status"] == "fail"}
    assert r.code == 0 and not failed, failed or r.err[-3000:]
    assert checks["dist.init[tf]"]["figure"] == "2 workers"
    assert set(checks["dist.init[tf]"]["ranks"]) == {"0", "1"}
    assert checks["dist.collectives[tf]"]["figure"] == "24 cases exact"
    train = checks["train.mwms[tf]"]["ranks"]
    for rank in ("0", "1"):
        d = train[rank]["data"]
        assert d["loss_after"] < d["loss_before"] * 0.5 and d["ranks_maxdiff_end"] == 0.0
    assert checks["gpu.devices[tf]"]["status"] == "skip"
    print(f"cpu-tf-multiworker: verify 2 workers (docker) {wall:.1f} s")


def test_definition_file_built_by_apptainer_verified_and_compared(tf_mw_image, tmp_path):
    """The same lock's Apptainer.def built by Apptainer: %test passes, the same packages as the
    Dockerfile's image above, and verify passes with 2 workers under Apptainer."""
    tag = json.loads((tf_mw_image / "manifest.json").read_text())["image"]["tag"]
    print(f"\ncpu-tf-multiworker: {built_by_apptainer_verified_and_compared(RECIPE, tf_mw_image, tag, tmp_path)}")
