"""job.sbatch submitted to a real Slurm (the one-node cluster of .ci/start-slurm.sh): the smoke
suite through `envbuilder verify --slurm` with the host runtime and with charliecloud (2 ranks,
srun --mpi=pmix, Horovod over MPI), a 3-value sweep as a job array with staged data, and a
missing bind that stops the job before any rank starts."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import RECIPES, run_envbuilder
from infra import (keep_for_run, SMOKE_VENV_PYTHON, base_image, docker_cli, plain_base_image, require_binary,
                   require_docker, require_slurm, sbatch_until_done, small_tmpfs, smoke_python, wheelhouse)

CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
# a Python with torch 2.13 (CPU) + Horovod (MPI): what the host runtime runs on the nodes
HOST_PYTHON = smoke_python() or SMOKE_VENV_PYTHON


@pytest.fixture(autouse=True)
def slurm():
    require_slurm()
    require_binary("srun", "run .ci/install-system.sh and .ci/start-slurm.sh")


def sbatch_wait(script: Path, *args: str, env: dict | None = None, timeout: int = 300):
    """sbatch [OPTIONS] job.sbatch [COMMAND], as a user would, waiting for the job to end
    (infra.sbatch_until_done: sbatch --wait's exit code, polled faster): (exit code, job id,
    seconds, stderr). Arguments starting with -- before the first other one are sbatch options."""
    opts = [a for a in args if a.startswith("--")]
    command = [a for a in args if not a.startswith("--")]
    t0 = time.time()
    code, job_id, err = sbatch_until_done([*opts, str(script), *command], script.parent, env or {}, timeout)
    return code, job_id, time.time() - t0, err


def job_seconds(job_id: str) -> int:
    """How long the job itself ran (Slurm's RunTime), not counting sbatch --wait's polling."""
    from envbuilder.verify.slurm import _scontrol, _seconds

    rec = _scontrol(job_id) or {}
    return _seconds(rec.get("RunTime", "99:99:99"))


def verify_slurm(folder: Path, tmp_path: Path, *args: str):
    """envbuilder verify FOLDER --slurm: (result, JSON report, seconds); the table is in result.out."""
    report_file = tmp_path / f"report-{time.time_ns()}.json"
    t0 = time.time()
    r = run_envbuilder("verify", str(folder), "--slurm", "--ranks", "2", "--report", str(report_file),
                       *args, timeout=900)
    assert report_file.is_file(), r.out[-3000:] + r.err[-3000:]
    return r, json.loads(report_file.read_text()), time.time() - t0


def assert_passed_with_two_mpi_ranks(r, report):
    failed = [(c["name"], c.get("detail", "")[:500]) for c in report["checks"] if c["status"] == "fail"]
    assert r.code == 0 and not failed, failed or r.err[-3000:]
    names = {c["name"]: c for c in report["checks"]}
    assert names["horovod.init[mpi]"]["figure"] == "2 ranks, mpi controller"
    assert names["allreduce.exact[mpi]"]["status"] == "pass"
    assert names["train.pytorch[mpi]"]["status"] == "pass"
    assert set(names["train.pytorch[mpi]"]["ranks"]) == {"0", "1"}
    assert report["slurm"]["state"] == "COMPLETED"


def test_verify_slurm_host_runtime_two_ranks_over_pmix(tmp_path):
    if not os.access(HOST_PYTHON, os.X_OK):
        pytest.skip(f"no Python with torch + Horovod at {HOST_PYTHON} (set ENVBUILDER_SMOKE_PYTHON)")
    folder = tmp_path / "cpu-torch"
    r = run_envbuilder("build", str(RECIPES / "cpu-torch-horovod.yaml"), "--no-build", "--out", str(folder),
                       "--runtime", "host")
    assert r.code == 0, r.err
    r, report, wall = verify_slurm(folder, tmp_path, "--python", HOST_PYTHON, "--junit", str(tmp_path / "j.xml"))
    assert_passed_with_two_mpi_ranks(r, report)
    assert report["verify"]["runtime"] == "host"
    # the table a person reads, as local verify prints it, and JUnit for CI
    assert re.search(r"^OK: cpu-torch-horovod \(slurm job \d+, host, 2 rank\(s\) on 1 node\(s\)\)", r.out, re.M)
    assert re.search(r"^allreduce.exact\[mpi\] +PASS +24 cases exact", r.out, re.M)
    # Horovod's gloo controller in the same srun step (its rendezvous started by task 0), its own pass
    names = {c["name"]: c for c in report["checks"]}
    assert names["horovod.init[gloo]"]["figure"] == "2 ranks, gloo controller"
    assert re.search(r"^allreduce.exact\[gloo\] +PASS +24 cases exact", r.out, re.M)
    assert set(names["train.pytorch[gloo]"]["ranks"]) == {"0", "1"} and names["train.pytorch[gloo]"]["status"] == "pass"
    assert "no run used the gloo controller" not in names["horovod.operations"]["detail"]
    assert [run["controller"] for run in report["runs"]] == ["mpi", "gloo"]
    assert "<testcase" in (tmp_path / "j.xml").read_text()
    # the job left its own copy of the report beside its output
    assert (Path(report["slurm"]["output_dir"]) / "smoke-report.json").is_file()
    print(f"host runtime: verify --slurm {wall:.1f} s, job {report['slurm']['elapsed_s']} s")


# --------------------------------------------------------------------------- charliecloud

@pytest.fixture(scope="module")
def torch_image(tmp_path_factory):
    """The cpu-torch image, built (or brought up to date from the build cache) by envbuilder."""
    require_slurm()
    require_docker()
    base_image()
    require_binary("ch-run", "apt-get install charliecloud")
    out = tmp_path_factory.mktemp("img") / "cpu-torch"
    tag = None
    probe = run_envbuilder("build", str(RECIPES / "cpu-torch-horovod.yaml"), "--no-build", "--out", str(out))
    assert probe.code == 0, probe.err
    tag = json.loads((out / "manifest.json").read_text())["image"]["tag"]
    keep_for_run(tag)
    r = run_envbuilder("build", str(RECIPES / "cpu-torch-horovod.yaml"), "--out", str(out), "--ca-bundle", CA_BUNDLE,
                       "--wheelhouse", wheelhouse(), timeout=2400)
    assert r.code == 0, r.err[-3000:]
    yield out, tag


def test_verify_slurm_charliecloud_two_ranks_over_pmix(torch_image, tmp_path):
    folder, tag = torch_image
    assert "(charliecloud runtime)" in (folder / "job.sbatch").read_text()
    r, report, wall = verify_slurm(folder, tmp_path, "--image", tag)
    assert_passed_with_two_mpi_ranks(r, report)
    assert report["verify"]["runtime"] == "charliecloud"
    print(f"charliecloud: verify --slurm {wall:.1f} s (incl. the conversion), job {report['slurm']['elapsed_s']} s")


def _tree(root: Path) -> list[str]:
    """Every entry under ROOT: type, mode, owner, path and link target (what ch-run sees)."""
    out = subprocess.run(["find", ".", "-printf", "%y %m %u %g %p %l\\n"], cwd=root, capture_output=True, text=True,
                         check=True).stdout
    return sorted(out.splitlines())


def test_a_docker_image_unpacks_as_ch_convert_leaves_it_and_a_full_disk_is_named(tmp_path):
    """charliecloud's directory image comes from one `docker export | tar` stream (not ch-convert's
    export, gzip and two more reads): the same tree, modes, owners, links and /ch/environment as
    `ch-convert -i docker` makes, /dev empty; with no room, one message naming the folder."""
    require_docker()
    require_binary("ch-convert", "apt-get install charliecloud")
    from envbuilder.errors import EnvbuilderError
    from envbuilder.runtimes.charliecloud import docker_to_directory

    image = plain_base_image()
    theirs, ours = tmp_path / "ch-convert", tmp_path / "ours"
    subprocess.run(["ch-convert", "-i", "docker", image, str(theirs)], check=True, capture_output=True)
    docker_to_directory(docker_cli(), image, ours)
    assert _tree(ours) == _tree(theirs)
    assert (ours / "ch" / "environment").read_text() == (theirs / "ch" / "environment").read_text()
    assert "PATH=" in (ours / "ch" / "environment").read_text() and not list((ours / "dev").iterdir())
    with small_tmpfs(tmp_path / "small", "16m") as small:
        with pytest.raises(EnvbuilderError) as exc:
            docker_to_directory(docker_cli(), image, small / "img")
    assert exc.value.exit_code == 1 and f"into {small} failed" in exc.value.reason, exc.value.reason
    assert "No space left on device" in exc.value.reason and "ENVBUILDER_CH_CACHE" in exc.value.fix


def test_charliecloud_binds_paths_with_spaces_and_quotes(torch_image, tmp_path):
    folder, tag = torch_image
    from envbuilder.verify.runner import charliecloud_dir

    directory, _ = charliecloud_dir(tag)
    data = tmp_path / "it's my data"
    data.mkdir()
    (data / "hello.txt").write_text("hello from the host\n")
    spec = tmp_path / "spec.yaml"
    spec.write_text((RECIPES / "cpu-torch-horovod.yaml").read_text().replace(
        "  runtime: charliecloud", f'  runtime: charliecloud\n  binds: ["{data}:/mnt/it\'s data"]'))
    job = tmp_path / "job"
    assert run_envbuilder("build", str(spec), "--no-build", "--out", str(job)).code == 0
    code, job_id, secs, err = sbatch_wait(job / "job.sbatch", "--ntasks=1", "--ntasks-per-node=1",
                                          "cat", "/mnt/it's data/hello.txt",
                                          env={"ENVBUILDER_IMAGE": directory})
    log = (job / f"cpu-torch-horovod-{job_id}.out").read_text()
    assert code == 0, err + log
    assert "hello from the host" in log


# --------------------------------------------------------------------------- sweeps, staging, binds

TRAIN = """\
import json, os, sys
rank = int(os.environ["RANK"])
data = os.environ["ENVBUILDER_DATA"]
record = {"rank": rank, "size": int(os.environ["WORLD_SIZE"]), "lr": os.environ["LR"],
          "data": data, "data_text": open(os.path.join(data, "labels.txt")).read().strip(),
          "home": os.environ["HOME"], "nousersite": os.environ.get("PYTHONNOUSERSITE"),
          "threads": os.environ.get("OMP_NUM_THREADS"),
          "checkpoint_dir": os.environ.get("CHECKPOINT_DIR")}
with open(os.path.join(os.environ["OUTPUT_DIR"], "rank-%d.json" % rank), "w") as fh:
    json.dump(record, fh)
if os.environ.get("CHECKPOINT_DIR"):          # rank 0 alone has it
    with open(os.path.join(os.environ["OUTPUT_DIR"], "report.json"), "w") as fh:
        json.dump({"lr": os.environ["LR"], "ok": True}, fh)
"""


def test_a_sweep_of_three_values_runs_as_an_array_and_leaves_three_reports(tmp_path):
    dataset = tmp_path / "dataset dir"
    dataset.mkdir()
    (dataset / "labels.txt").write_text("cat dog\n")
    (tmp_path / "train.py").write_text(TRAIN)
    spec = tmp_path / "sweep.yaml"
    spec.write_text(f"""\
name: sweep-test
framework: {{name: pytorch, version: "2.13.0+cpu"}}
python: "3.11"
base: local/debian:bookworm-slim
cluster:
  ntasks_per_node: 2
  cpus_per_task: 1
  time: "00:05:00"
  runtime: host
  stage: "{dataset}"
  command: {sys.executable} {tmp_path}/train.py
""")
    job = tmp_path / "job"
    r = run_envbuilder("build", str(spec), "--no-build", "--out", str(job), "--sweep", "lr=0.1,0.01,0.001")
    assert r.code == 0, r.err
    text = (job / "job.sbatch").read_text()
    assert "#SBATCH --array=0-2" in text
    code, job_id, secs, err = sbatch_wait(job / "job.sbatch")
    logs = "".join(p.read_text() for p in sorted(job.glob("*.out")))
    assert code == 0, err + logs
    tasks = sorted((job / "runs" / job_id).iterdir())
    assert [t.name for t in tasks] == ["task-0", "task-1", "task-2"]
    seen = []
    for task in tasks:
        report = json.loads((task / "report.json").read_text())
        seen.append(report["lr"])
        assert (task / "sweep.env").read_text() == f"LR={report['lr']}\n"
        ranks = [json.loads((task / f"rank-{i}.json").read_text()) for i in (0, 1)]
        assert [x["size"] for x in ranks] == [2, 2]
        assert ranks[0]["checkpoint_dir"] == str(task / "checkpoints") and ranks[1]["checkpoint_dir"] is None
        for x in ranks:
            assert x["data_text"] == "cat dog" and x["data"].endswith("/data/dataset dir")
            assert not x["data"].startswith(str(tmp_path))         # a node-local copy
            assert x["home"].endswith("/home") and x["nousersite"] == "1" and x["threads"] == "1"
            assert not Path(x["data"]).exists()                      # removed when the job ended
    assert seen == ["0.1", "0.01", "0.001"]
    assert "staged" in logs
    print(f"sweep: 3 array tasks x 2 ranks, sbatch --wait {secs:.1f} s, "
          f"tasks {[job_seconds(f'{job_id}_{i}') for i in range(3)]} s")


def test_a_missing_bind_stops_the_job_at_once_naming_it(tmp_path):
    spec = tmp_path / "spec.yaml"
    missing = tmp_path / "no such 'data'"
    spec.write_text((RECIPES / "cpu-torch-horovod.yaml").read_text().replace(
        "  runtime: charliecloud", f'  runtime: host\n  binds: ["{tmp_path}", "{missing}:/data:ro"]'))
    job = tmp_path / "job"
    assert run_envbuilder("build", str(spec), "--no-build", "--out", str(job)).code == 0
    code, job_id, secs, err = sbatch_wait(job / "job.sbatch", "true")
    log = (job / f"cpu-torch-horovod-{job_id}.out").read_text()
    assert code == 2, log
    assert f"envbuilder: error: bind source '{missing}' does not exist on" in log
    assert "rank(s) on" not in log           # no rank was started
    assert job_seconds(job_id) <= 5
    # verify --slurm says the same in its table
    r, report, _ = verify_slurm(job, tmp_path, "--python", sys.executable)
    assert r.code == 1
    failed = [c for c in report["checks"] if c["status"] == "fail"]
    assert failed[0]["name"] == "slurm.job" and str(missing) in failed[0]["detail"]


# --------------------------------------------------------------------------- tf-multiworker

def test_tf_multiworker_inside_a_job_step_uses_slurms_cluster_resolver(tmp_path):
    """MultiWorkerMirroredStrategy from the Slurm environment: 2 tasks of one srun step meet through
    tf.distribute's SlurmClusterResolver (on a CPU node too: the resolver alone calls nvidia-smi
    and lists no task without GPUs), exact collectives, identical weights."""
    if not os.access(HOST_PYTHON, os.X_OK):
        pytest.skip(f"no Python with TensorFlow at {HOST_PYTHON} (set ENVBUILDER_SMOKE_PYTHON)")
    folder = tmp_path / "cpu-tf-multiworker"
    r = run_envbuilder("build", str(RECIPES / "cpu-tf-multiworker.yaml"), "--no-build", "--out", str(folder),
                       "--runtime", "host")
    assert r.code == 0, r.err
    r, report, wall = verify_slurm(folder, tmp_path, "--python", HOST_PYTHON)
    checks = {c["name"]: c for c in report["checks"]}
    failed = {n: c.get("detail", "")[:500] for n, c in checks.items() if c["status"] == "fail"}
    assert r.code == 0 and not failed, failed or r.err[-3000:]
    init = checks["dist.init[tf]"]
    assert init["figure"] == "2 workers" and set(init["ranks"]) == {"0", "1"}
    assert all(d["data"]["how"].startswith("SlurmClusterResolver") for d in init["ranks"].values())
    assert checks["dist.collectives[tf]"]["figure"] == "24 cases exact"
    for rank in ("0", "1"):
        d = checks["train.mwms[tf]"]["ranks"][rank]["data"]
        assert d["loss_after"] < d["loss_before"] * 0.5 and d["ranks_maxdiff_end"] == 0.0
    assert report["slurm"]["state"] == "COMPLETED"
    print(f"tf-multiworker: verify --slurm {wall:.1f} s, job {report['slurm']['elapsed_s']} s")


# --------------------------------------------------------------------------- the controller away

def _away_conf(tmp_path: Path) -> Path:
    """This Slurm's configuration with the controller's port where nothing listens (and a 2 s
    message timeout): scontrol really fails with 'Unable to contact slurm controller'."""
    real = Path(os.environ.get("SLURM_CONF", "/etc/slurm/slurm.conf"))
    kept = [line for line in real.read_text().splitlines() if not line.startswith(("SlurmctldPort=", "MessageTimeout="))]
    conf = tmp_path / "away.conf"
    conf.write_text("\n".join(kept + ["SlurmctldPort=1", "MessageTimeout=2"]) + "\n")
    return conf


def test_verify_waits_through_a_controller_that_does_not_answer_and_names_one_that_never_does(tmp_path, monkeypatch):
    """verify --slurm's wait for the job (envbuilder/verify/slurm.py): scontrol failing because the
    controller does not answer is asked again, not taken for the job's end (a busy controller once
    ended a wait that way: 'job 668 ended RUNNING without a smoke report'); a controller that stays
    away past the grace is named; a job Slurm no longer knows ends the wait at once."""
    from envbuilder.verify import slurm as vs

    real = os.environ.get("SLURM_CONF", "/etc/slurm/slurm.conf")
    away = _away_conf(tmp_path)
    job = subprocess.run(["sbatch", "--parsable", "--output=/dev/null", "--wrap", "sleep 3"], capture_output=True,
                         text=True, check=True).stdout.strip().split(";")[0]
    said: list[str] = []
    monkeypatch.setenv("SLURM_CONF", str(away))
    back = threading.Timer(5.0, lambda: os.environ.__setitem__("SLURM_CONF", real))
    back.start()
    try:
        rec, timed_out = vs.wait(job, 120, said.append)
    finally:
        back.cancel()
    assert rec["JobState"] == "COMPLETED" and not timed_out, (rec, said)
    assert any("the Slurm controller did not answer" in s and "asking again" in s for s in said), said

    monkeypatch.setenv("SLURM_CONF", str(away))
    monkeypatch.setattr(vs, "CONTROLLER_GRACE_S", 3.0)
    said.clear()
    rec, timed_out = vs.wait(job, 120, said.append)
    assert rec["JobState"] == "UNKNOWN" and not timed_out
    assert "the Slurm controller did not answer for 3 s" in rec["Reason"], rec
    assert "Unable to contact slurm controller" in rec["Reason"], rec

    monkeypatch.setenv("SLURM_CONF", real)
    t0 = time.time()
    rec, _ = vs.wait("999999", 120, said.append)
    assert rec == {"JobState": "UNKNOWN"} and time.time() - t0 < 10


def test_the_suites_wait_reads_a_job_whose_arguments_hold_newlines(tmp_path):
    """The suite's own wait (infra.sbatch_until_done, reading records with envbuilder.verify.slurm.job_records) against the real scontrol: a batch script's
    arguments with newlines (the `python -c SCRIPT` the MPI tests pass) come out of `scontrol show job
    -o` on lines of their own, with key=value text in them; the job's state and exit code are still
    read from its record (a wait that took such a line for a record never ended: CI lost 4 x 300 s)."""
    script = tmp_path / "args.sh"
    script.write_text('#!/bin/bash\nprintf "%s\\n" "$@"\nexit 3\n')
    code, job_id, secs, err = sbatch_wait(script, f"--output={tmp_path}/out", "python", "-c",
                                          "import os\nJobState=RUNNING ExitCode=0:0 x=1\n", timeout=60)
    assert code == 3, err
    assert "JobState=RUNNING ExitCode=0:0 x=1" in (tmp_path / "out").read_text()
    assert secs < 30
