"""tf-multiworker for real: the cpu-tf-multiworker preset built on Docker, written as a .sif by
envbuilder and run on the 2-node Apptainer cluster (tests/apptainer_cluster.py): `verify --slurm`
with 4 workers of tf.distribute.MultiWorkerMirroredStrategy, each started by `srun apptainer exec`
(exact all_reduce, a data-parallel run whose loss falls with identical weights on every worker),
and job.sbatch's TF_CONFIG driving an unchanged user script across the nodes; and the preset's
definition file built by the real Apptainer (unprivileged), its .sif compared with the Docker
image and verified under Apptainer (its workers' TF_CONFIG from the suite's spawner). The smoke
suite's TF checks under the Docker runtime are left to the other runtimes' tests: the same code
in the image, started by another launcher."""

from __future__ import annotations

import json
import re
import subprocess
import time

import pytest

from apptainer_build import built_by_apptainer_verified_and_compared
from apptainer_cluster import BUILDER_UID, SITE, TWO_BY_TWO, chown_tree, login_runner, sbatch, shared_folder
from conftest import RECIPES, run_envbuilder
from infra import keep_for_run, base_image, docker_cli, require_docker

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


@pytest.fixture(scope="module")
def tf_mw_on_cluster(tf_mw_image):
    """The same preset with the Apptainer cluster's site (its own tag from the cached layers of
    tf_mw_image) written as a .sif by envbuilder into the cluster's shared folder: (folder, .sif,
    run envbuilder on the login node)."""
    for shared in shared_folder():
        out = shared / "cpu-tf-multiworker"
        probe = run_envbuilder("build", str(RECIPE), *SITE, "--no-build", "--out", str(out))
        assert probe.code == 0, probe.err
        keep_for_run(json.loads((out / "manifest.json").read_text())["image"]["tag"])
        t0 = time.time()
        r = run_envbuilder("build", str(RECIPE), *SITE, "--out", str(out), "--sif", "--ca-bundle",
                           "/etc/ssl/certs/ca-certificates.crt", timeout=1200)
        assert r.code == 0, r.err[-3000:]
        print(f"\ncpu-tf-multiworker: build (cached) + envbuilder's .sif {time.time() - t0:.0f} s")
        sif = out / "cpu-tf-multiworker.sif"
        assert "(apptainer runtime)" in (out / "job.sbatch").read_text()
        chown_tree(shared, BUILDER_UID)
        yield out, sif, login_runner(shared)


def test_verify_slurm_trains_with_four_workers_on_two_nodes_through_apptainer(tf_mw_on_cluster):
    """`envbuilder verify --slurm --nodes 2 --ranks 4` on the Apptainer cluster's login node: each of
    4 workers of MultiWorkerMirroredStrategy started by `srun --mpi=pmix apptainer exec` (one user
    namespace each), exact all_reduce, a data-parallel run whose loss falls with identical weights
    on every worker."""
    folder, sif, login = tf_mw_on_cluster
    report = folder / "report.json"
    t0 = time.time()
    p = login(folder, "verify", str(folder), "--slurm", "--nodes", "2", "--ranks", "4", "--image", str(sif),
              "--report", str(report))
    wall = time.time() - t0
    checks = {c["name"]: c for c in json.loads(report.read_text())["checks"]}
    failed = {n: c.get("detail", "")[:300] for n, c in checks.items() if c["status"] == "fail"}
    assert p.returncode == 0 and not failed, failed or (p.stdout + p.stderr)[-4000:]
    assert re.search(r"^OK: cpu-tf-multiworker \(slurm job \d+, apptainer, 4 rank\(s\) on 2 node\(s\)\)",
                     p.stdout, re.M), p.stdout[-3000:]
    assert checks["dist.init[tf]"]["figure"] == "4 workers"
    assert set(checks["dist.init[tf]"]["ranks"]) == {"0", "1", "2", "3"}
    assert checks["dist.collectives[tf]"]["figure"] == "24 cases exact"
    train = checks["train.mwms[tf]"]["ranks"]
    for rank in ("0", "1", "2", "3"):
        d = train[rank]["data"]
        assert d["loss_after"] < d["loss_before"] * 0.5 and d["ranks_maxdiff_end"] == 0.0
    assert checks["slurm.placement"]["figure"] == "ac-n1: 2, ac-n2: 2"
    assert checks["gpu.devices[tf]"]["status"] == "skip"
    print(f"cpu-tf-multiworker: verify --slurm 2x2 through apptainer {wall:.1f} s "
          f"(MWMS allreduce {checks['perf.allreduce[tf]']['figure']})")


def test_an_unchanged_multiworker_script_trains_on_two_nodes_with_job_sbatchs_tf_config(tf_mw_on_cluster):
    """job.sbatch with the apptainer runtime: TF_CONFIG, set by job.sbatch in each task on the host,
    reaches the worker inside its container (Apptainer passes a host variable the image does not
    set), and a script using nothing but the default resolver trains across the 2 nodes with the
    same weights on all 4 workers."""
    from test_tf_config import USER_SCRIPT

    folder, sif, _ = tf_mw_on_cluster
    (folder / "train.py").write_text(USER_SCRIPT)
    results = folder / "results"
    results.mkdir()
    chown_tree(folder, BUILDER_UID)
    code, job_id, log, wall = sbatch(folder, *TWO_BY_TWO, "python", "train.py", str(results),
                                     env={"ENVBUILDER_IMAGE": str(sif)})
    assert code == 0, log[-4000:]
    assert "envbuilder: TF_CONFIG: set in every task from the step's nodes" in log, log[-3000:]
    assert re.search(rf"job {job_id}: 4 rank\(s\) on 2 node\(s\), apptainer", log), log[-3000:]
    ranks = [json.loads((results / f"tf-rank-{i}.json").read_text()) for i in range(4)]
    port = 20000 + int(job_id) % 20000
    workers = ranks[0]["workers"]
    assert workers == [f"ac-n{n}:{port + i}" for n in (1, 2) for i in range(2)], workers
    for i, r in enumerate(ranks):
        assert r["procid"] == r["index"] == i and r["workers"] == workers and r["host"] == f"ac-n{i // 2 + 1}"
        assert json.loads(r["tf_config"])["task"] == {"type": "worker", "index": i}
    assert len({r["weights"] for r in ranks}) == 1, ranks
    print(f"cpu-tf-multiworker: unchanged script 2x2 through apptainer, job {wall:.1f} s, "
          f"loss {ranks[0]['loss']:.4f}")


def test_definition_file_built_by_apptainer_verified_and_compared(tf_mw_image, tmp_path):
    """The same lock's Apptainer.def built by Apptainer: %test passes, the same packages as the
    Dockerfile's image above, and verify passes with 2 workers under Apptainer."""
    tag = json.loads((tf_mw_image / "manifest.json").read_text())["image"]["tag"]
    print(f"\ncpu-tf-multiworker: {built_by_apptainer_verified_and_compared(RECIPE, tf_mw_image, tag, tmp_path)}")


# one worker's MultiWorkerMirroredStrategy, built as an unchanged script builds it: the coordination
# config TensorFlow then runs with (its heartbeat timeout; 0 is TensorFlow's own 10 s)
HEARTBEAT_PROBE = """
import json, os, sys
os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": ["localhost:23456"]},
                                      "task": {"type": "worker", "index": 0}})
import tensorflow as tf
from tensorflow.python.eager import context
if sys.argv[1:] == ["own"]:
    from tensorflow.tsl.protobuf import coordination_config_pb2 as pb
    context.context().configure_coordination_service(
        "standalone", "/job:worker/replica:0/task:0", heartbeat_timeout_in_ms=7000,
        coordinated_jobs=[pb.CoordinatedJob(name="worker", num_tasks=1)])
tf.distribute.MultiWorkerMirroredStrategy()
print("heartbeat_ms", context.context().coordination_service.heartbeat_timeout_in_ms)
"""


@pytest.mark.parametrize("env, arg, expect", [
    ({"ENVBUILDER_TF_HEARTBEAT_S": "45"}, "", 45000),   # what job.sbatch asks for
    ({}, "", 0),                                        # nothing asked: TensorFlow's default
    ({"ENVBUILDER_TF_HEARTBEAT_S": "45"}, "own", 7000),  # a script's own timeout is kept
], ids=["asked", "not-asked", "script-own"])
def test_the_images_start_up_hook_sets_tfs_heartbeat_timeout_only_when_asked(tf_mw_image, env, arg, expect):
    """The TF image's envbuilder.pth gives MultiWorkerMirroredStrategy the coordination heartbeat
    timeout job.sbatch exports (a loaded node must not end the job by TF's 10 s default)."""
    tag = json.loads((tf_mw_image / "manifest.json").read_text())["image"]["tag"]
    env_args = [a for k, v in env.items() for a in ("-e", f"{k}={v}")]
    proc = subprocess.run([docker_cli(), "run", "--rm", "--network", "none", *env_args, tag, "python", "-c",
                           HEARTBEAT_PROBE, *([arg] if arg else [])], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"heartbeat_ms {expect}" in proc.stdout.splitlines(), proc.stdout + proc.stderr[-2000:]
    job = (tf_mw_image / "job.sbatch").read_text()
    assert "export ENVBUILDER_TF_HEARTBEAT_S=${ENVBUILDER_TF_HEARTBEAT_S:-60}" in job
