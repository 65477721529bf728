"""The smoke suite for real on this host: 2 Horovod ranks through the suite's own gloo launch
(Horovod's rendezvous server, horovodrun's slot variables; horovodrun itself with --launcher gloo) and mpirun
under PyTorch, TensorFlow's identity checks, plus the failure paths (version drift, a crashed
rank, a hung rank, a step Slurm stops).

Needs a Python with torch 2.13, tensorflow-cpu 2.15 and Horovod's PyTorch binding:
ENVBUILDER_SMOKE_PYTHON=/path/to/python, or the environment `.ci/setup` makes
(.ci/make-smoke-venv.sh: its Horovod is the cpu-torch image's). Without either these tests are
skipped. Horovod under TensorFlow runs in the intel-tensorflow image (tests/test_build_verify.py).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from infra import smoke_python

ROOT = Path(__file__).resolve().parent.parent
BEGIN = "=====ENVBUILDER-SMOKE-REPORT-BEGIN====="
END = "=====ENVBUILDER-SMOKE-REPORT-END====="
PY = smoke_python()

pytestmark = pytest.mark.skipif(
    not PY, reason="ENVBUILDER_SMOKE_PYTHON is not set (path to a Python with torch, tensorflow-cpu "
                   "and Horovod; e.g. /opt/envbuilder-smoke-venv/bin/python)")


def manifest(framework: str, **over) -> dict:
    fw = {"pytorch": {"name": "pytorch", "module": "torch", "version": "2.13.0"},
          "tensorflow": {"name": "tensorflow-cpu", "module": "tensorflow", "version": "2.15.1"}}[framework]
    expect = {
        "python": "3.11",
        "framework": fw,
        "horovod": {"version": "0.28.1", "frameworks": [framework], "controllers": ["mpi", "gloo"],
                    "operations": ["mpi", "gloo"]},
        "mpi": {"flavor": "openmpi", "version": "4.1.4"},
        "cuda": None, "cudnn": None, "nccl": None, "gpu": False, "packages": {},
    }
    expect.update(over)
    return {"schema": "envbuilder.manifest/1", "name": f"test-{framework}", "expect": expect}


def run_suite(tmp_path: Path, man: dict, *args: str, env: dict | None = None, timeout: int = 300):
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(man))
    full = dict(os.environ)
    full["PYTHONPATH"] = str(ROOT)
    full["LANG"] = "C.UTF-8"
    full.pop("ENVBUILDER_SMOKE_FAULT", None)
    full.update(env or {})
    t0 = time.time()
    proc = subprocess.run([PY, "-m", "envbuilder.smoke", "--manifest", str(path), "--json", *args],
                          capture_output=True, text=True, env=full, timeout=timeout)
    wall = time.time() - t0
    assert BEGIN in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout.split(BEGIN)[1].split(END)[0])
    return proc, report, wall


def by_name(report: dict) -> dict:
    return {c["name"]: c for c in report["checks"]}


def assert_healthy_run(checks: dict, fw: str, ctrl: str):
    tag = f"[{ctrl}]"
    for name in (f"launch.{fw}{tag}", f"horovod.init{tag}", f"horovod.binding.{fw}{tag}",
                 f"horovod.cpu_ops{tag}", f"allreduce.exact{tag}", f"train.{fw}{tag}",
                 f"perf.step.{fw}{tag}", f"perf.allreduce{tag}"):
        assert checks[name]["status"] == "pass", (name, checks[name])
    assert checks[f"horovod.init{tag}"]["figure"] == f"2 ranks, {ctrl} controller"
    assert f"{ctrl.upper()}_ALLREDUCE" in checks[f"horovod.cpu_ops{tag}"]["figure"]
    assert re.match(r"\d+ cases exact", checks[f"allreduce.exact{tag}"]["figure"])
    train = checks[f"train.{fw}{tag}"]
    r0 = train["ranks"]["0"]["data"]
    assert r0["loss_after"] < r0["loss_before"] * 0.8
    assert r0["ranks_maxdiff_end"] == 0.0 or r0["ranks_maxdiff_end"] < 1e-6
    assert r0["ranks_maxdiff_initial"] > 0          # ranks started different: broadcast fixed it
    assert r0["lrs"][0] < r0["lrs"][-1] == pytest.approx(r0["base_lr"] * 2, rel=1e-6)   # warm-up to lr x 2
    assert re.match(r"[\d.]+ ms/step, \d+ samples/s/rank", checks[f"perf.step.{fw}{tag}"]["figure"])
    sizes = checks[f"perf.allreduce{tag}"]["ranks"]["0"]["data"]["sizes"]
    assert [s["bytes"] for s in sizes] == [4096, 262144, 4194304, 16777216]
    assert all(s["busbw_GBps"] > 0 for s in sizes)
    for g in ("gpu.devices", "gpu.rank_map", "gpu.nccl_allreduce", "gpu.mixed_precision"):
        assert checks[g + tag]["status"] == "skip" and checks[g + tag]["detail"].startswith("no GPU")


def test_two_ranks_gloo_and_mpi_pass(tmp_path):
    fw = "pytorch"
    proc, report, wall = run_suite(tmp_path, manifest(fw), "--ranks", "2")
    checks = by_name(report)
    assert proc.returncode == 0, [c for c in report["checks"] if c["status"] == "fail"]
    assert report["ok"] is True and report["summary"]["fail"] == 0
    for name in ("versions.python", "versions.framework", "versions.horovod", "versions.mpi",
                 "env.locale", "env.user_site", "horovod.build", "horovod.operations"):
        assert checks[name]["status"] == "pass", checks[name]
    assert checks["versions.mpi"]["figure"] == "openmpi 4.1.4"
    assert_healthy_run(checks, fw, "mpi")
    assert_healthy_run(checks, fw, "gloo")
    assert [r["launcher"] for r in report["runs"]] == ["mpirun", "gloo-local"]
    print(f"\n{fw}: suite wall {wall:.1f} s; " + "; ".join(
        f"{n}: {checks[n]['figure']}" for n in checks if n.startswith("perf.")))


def test_launcher_gloo_runs_horovodrun_itself_with_the_same_checks(tmp_path):
    """`--launcher gloo`: horovodrun -np 2 --gloo starts the ranks (what the default's own gloo
    launch stands in for, without horovodrun's start); the same checks pass."""
    proc, report, wall = run_suite(tmp_path, manifest("pytorch"), "--ranks", "2", "--launcher", "gloo")
    assert proc.returncode == 0, [c for c in report["checks"] if c["status"] == "fail"]
    assert [r["launcher"] for r in report["runs"]] == ["horovodrun"]
    assert_healthy_run(by_name(report), "pytorch", "gloo")
    print(f"\nhorovodrun --gloo: suite wall {wall:.1f} s")


def test_framework_version_drift_fails_naming_it(tmp_path):
    man = manifest("pytorch", horovod=None)
    man["expect"]["framework"]["version"] = "2.12.0"
    proc, report, _ = run_suite(tmp_path, man)
    assert proc.returncode == 1
    fw = by_name(report)["versions.framework"]
    assert fw["status"] == "fail"
    assert "2.13.0+cpu installed, manifest expects 2.12.0" in fw["detail"]
    assert "torch" in fw["detail"]


CPU_ENV = {"KMP_AFFINITY": "granularity=fine,compact,1,0", "KMP_BLOCKTIME": "0", "KMP_SETTINGS": "0",
           "TF_ENABLE_ONEDNN_OPTS": "1"}


def test_cpu_tensorflow_identity_checks_fail_naming_what_differs(tmp_path):
    """What makes an image intel-tensorflow, checked against this host's tensorflow-cpu 2.15.1:
    a manifest that asks for intel-tensorflow fails framework.distribution naming the real owner;
    TF_ENABLE_ONEDNN_OPTS=0 turns oneDNN off in stock TensorFlow (TensorFlow's own flag says so);
    with the manifest right, both pass. (The intel-tensorflow image passing them all, and a KMP value
    that does not reach its ranks failing env.cpu_threads: tests/test_build_verify.py.)"""
    man = manifest("tensorflow", horovod=None, cpu_env=CPU_ENV)
    man["expect"]["framework"].update(name="intel-tensorflow", version="2.15.1", distribution="intel-tensorflow")
    proc, report, _ = run_suite(tmp_path, man, env={**CPU_ENV, "TF_ENABLE_ONEDNN_OPTS": "0"})
    checks = by_name(report)
    assert proc.returncode == 1
    dist = checks["framework.distribution"]
    assert dist["status"] == "fail" and dist["figure"] == "tensorflow-cpu 2.15.1", dist
    assert "intel-tensorflow does not own" in dist["detail"] and "owned by: tensorflow-cpu 2.15.1" in dist["detail"]
    onednn = checks["framework.onednn"]
    assert onednn["status"] == "fail" and "IsMklEnabled() is False" in onednn["detail"], onednn

    man["expect"]["framework"].update(name="tensorflow-cpu", version="2.15.1", distribution="tensorflow-cpu")
    proc, report, _ = run_suite(tmp_path, man, env=CPU_ENV)
    checks = by_name(report)
    assert checks["framework.distribution"]["status"] == "pass"
    assert checks["framework.onednn"]["status"] == "pass"


def test_crashed_rank_is_named_and_the_suite_ends(tmp_path):
    proc, report, wall = run_suite(tmp_path, manifest("pytorch"), "--launcher", "mpi", "--timeout", "30",
                                   env={"ENVBUILDER_SMOKE_FAULT": "crash:1"})
    assert proc.returncode == 1
    checks = by_name(report)
    ar = checks["allreduce.exact[mpi]"]
    assert ar["status"] == "fail" and ar["figure"] == "rank 1 crashed"
    assert "rank 1 crashed (killed by SIGSEGV)" in ar["detail"]
    assert checks["launch.pytorch[mpi]"]["status"] == "fail"
    assert checks["train.pytorch[mpi]"]["status"] == "skip"
    assert wall < 60          # a crash is noticed at once, not after the timeout


def test_hung_rank_is_named_within_the_timeout(tmp_path):
    t = 8
    proc, report, wall = run_suite(tmp_path, manifest("pytorch"), "--launcher", "gloo",
                                   "--timeout", str(t), env={"ENVBUILDER_SMOKE_FAULT": "hang:1"})
    assert proc.returncode == 1
    ar = by_name(report)["allreduce.exact[gloo]"]
    assert ar["status"] == "fail" and ar["figure"] == "rank 1 hung"
    assert "rank 1 hung: no progress" in ar["detail"] and "rank 0 waiting" in ar["detail"]
    assert wall < 60
    # nothing of the run is left behind
    left = subprocess.run(["pgrep", "-f", rf"^{re.escape(PY)} -m envbuilder\.smoke\.(rank|worker) "],
                          capture_output=True, text=True)
    assert left.stdout.strip() == ""


# --- inside an srun step (the job script's default command) --------------------------------------

def _srun(tmp_path, man, *args, env=None):
    if not shutil.which("srun") or not shutil.which("sinfo"):
        pytest.skip("no Slurm here (srun/sinfo missing)")
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(man))
    full = dict(os.environ)
    full["PYTHONPATH"] = str(ROOT)
    full["LANG"] = "C.UTF-8"
    full.pop("ENVBUILDER_SMOKE_FAULT", None)
    full.update(env or {})
    proc = subprocess.run(["srun", "--immediate=60", "-n", "2", "--mpi=pmix", "--kill-on-bad-exit=1",
                           PY, "-m", "envbuilder.smoke", "--launcher", "srun", "--manifest", str(path),
                           "--json", *args], capture_output=True, text=True, env=full, timeout=400)
    if BEGIN not in proc.stdout and ("Unable to allocate" in proc.stderr or "revoked" in proc.stderr
                                     or "Invalid" in proc.stderr or "Unable to contact" in proc.stderr):
        pytest.skip("Slurm could not run a 2-task step now: " + proc.stderr.strip()[-200:])
    assert proc.stdout.count(BEGIN) == 1, proc.stdout[-2000:] + proc.stderr[-2000:]   # rank 0 alone reports
    return proc, json.loads(proc.stdout.split(BEGIN)[1].split(END)[0])


def test_inside_srun_step_every_task_is_a_rank(tmp_path):
    proc, report = _srun(tmp_path, manifest("pytorch"))
    assert proc.returncode == 0, [c for c in report["checks"] if c["status"] == "fail"]
    checks = by_name(report)
    assert report["launcher"] == "srun (in step, 2 tasks)"
    assert checks["horovod.init[mpi]"]["figure"] == "2 ranks, mpi controller"
    assert checks["train.pytorch[mpi]"]["status"] == "pass"
    # gloo runs in the step too, through the rendezvous the suite starts itself (smoke/gloo_step.py)
    assert checks["horovod.init[gloo]"]["figure"] == "2 ranks, gloo controller"
    assert checks["allreduce.exact[gloo]"]["status"] == "pass"


def test_inside_srun_step_rank_0_waits_for_its_own_rank_to_exit_after_the_run_ended(tmp_path):
    # CI, stop 29: on a loaded node rank 0's wrapper was still exiting after writing its exit
    # record; task 0 stopped it with SIGTERM and failed a run that had passed ("launcher killed
    # by SIGTERM"). The linger fault keeps that wrapper 4 s after its record.
    proc, report = _srun(tmp_path, manifest("pytorch"), "--skip-static", "--timeout", "60",
                         env={"ENVBUILDER_SMOKE_FAULT": "linger:0"})
    failed = {c["name"]: c.get("detail", "")[:300] for c in report["checks"] if c["status"] == "fail"}
    assert proc.returncode == 0 and not failed, failed
    assert report["fault"] == "linger:0"
    assert by_name(report)["allreduce.exact[mpi]"]["status"] == "pass"


def test_inside_srun_step_a_crash_is_reported_before_slurm_cancels_the_step(tmp_path):
    proc, report = _srun(tmp_path, manifest("pytorch"), "--skip-static", "--timeout", "30",
                         env={"ENVBUILDER_SMOKE_FAULT": "crash:1"})
    assert proc.returncode != 0
    ar = by_name(report)["allreduce.exact[mpi]"]
    assert ar["status"] == "fail" and ar["figure"] == "rank 1 crashed"


def test_inside_srun_step_a_step_slurm_stops_still_reports_where_each_rank_was(tmp_path):
    # Slurm stops a step with SIGTERM (after a killed MPI rank, at the time limit, on scancel):
    # rank 0 still writes the report: the run in flight named where its ranks were, the runs
    # after it skipped with the reason; verify then prints these, not "ended without a report"
    if not shutil.which("srun") or not shutil.which("scancel"):
        pytest.skip("no Slurm here (srun/scancel missing)")
    name = f"envbuilder-test-stop-{os.getpid()}"
    (tmp_path / "manifest.json").write_text(json.dumps(manifest("pytorch")))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LANG": "C.UTF-8", "ENVBUILDER_SMOKE_FAULT": "hang:1"}
    report_file = tmp_path / "report.json"
    work = tmp_path / "work"
    proc = subprocess.Popen(["srun", "--immediate=60", f"--job-name={name}", "-n", "2", "--mpi=pmix",
                             PY, "-m", "envbuilder.smoke", "--launcher", "srun", "--skip-static",
                             "--manifest", str(tmp_path / "manifest.json"), "--timeout", "300",
                             "--workdir", str(work), "--report", str(report_file)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.time() + 120
        hung = list(work.glob("run0-*/rank-1.json"))
        while time.time() < deadline and not (hung and "fault injected" in hung[0].read_text()):
            time.sleep(0.5)
            hung = list(work.glob("run0-*/rank-1.json"))
        assert hung and "fault injected" in hung[0].read_text(), proc.poll()
        t0 = time.time()
        subprocess.run(["scancel", "--signal=TERM", f"--name={name}"], check=True, timeout=30)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            subprocess.run(["scancel", f"--name={name}"], timeout=30)
            proc.kill()
    assert time.time() - t0 < 30                    # not the suite's 300 s timeout
    assert report_file.is_file(), err[-3000:]
    report = json.loads(report_file.read_text())
    assert report["ok"] is False
    c = by_name(report)
    launch = c["launch.pytorch[mpi]"]
    assert launch["status"] == "fail" and "the srun step was stopped by SIGTERM" in launch["detail"], launch
    ar = c["allreduce.exact[mpi]"]
    assert ar["status"] == "fail", ar
    assert "rank 1 " in ar["detail"] and "fault injected: hang" in ar["detail"], ar
    assert c["horovod.init[mpi]"]["status"] == "pass"          # what ran before the stop is kept
    gloo = c["launch.pytorch[gloo]"]
    assert gloo["status"] == "skip" and gloo["detail"].startswith("not run: the srun step was stopped"), gloo


def test_gpu_checks_logic_runs_on_cpu_through_the_test_hook(tmp_path):
    """No GPU here: a test hook makes the PyTorch side treat the CPU as the GPU, so the GPU
    checks' own logic (device list, rank->GPU map, NCCL evidence, mixed precision) runs. NCCL
    carries nothing then, and the NCCL check must say so."""
    proc, report, _ = run_suite(tmp_path, manifest("pytorch"), "--launcher", "gloo", "--skip-static",
                                env={"ENVBUILDER_SMOKE_TEST_GPU_ON_CPU": "1"})
    checks = by_name(report)
    assert checks["gpu.devices[gloo]"]["status"] == "pass"
    assert checks["gpu.rank_map[gloo]"]["status"] == "pass"
    assert checks["gpu.rank_map[gloo]"]["figure"] == "2 ranks, 2 GPUs"
    nccl = checks["gpu.nccl_allreduce[gloo]"]
    assert nccl["status"] == "fail" and "not carried by NCCL" in nccl["detail"]
    assert "GLOO_ALLREDUCE" in nccl["detail"]
    mp = checks["gpu.mixed_precision[gloo]"]
    assert mp["status"] == "pass" and "weights updated" in mp["detail"]
    assert proc.returncode == 1
