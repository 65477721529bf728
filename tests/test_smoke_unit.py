"""The smoke suite's own rules, without a framework: version matching, the folder's import
hygiene (it ships into images as `envbuilder_smoke`), merging rank files, naming crashed and
hung ranks, bad-input exit codes."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from envbuilder.smoke import common, merge, plan, report, static, watch
from envbuilder.smoke.common import version_matches

ROOT = Path(__file__).resolve().parent.parent
SMOKE = ROOT / "envbuilder" / "smoke"


# --- versions ------------------------------------------------------------------------------------

@pytest.mark.parametrize("expected,installed,ok", [
    ("3.11", "3.11.2", True),
    ("2.13.0", "2.13.0+cpu", True),
    ("2.13.0", "2.13.1", False),
    ("2.13.0+cpu", "2.13.0+cpu", True),
    ("2.13.0+cpu", "2.13.0+cu121", False),
    ("2.13.0", "2.13.0rc1", False),
    ("2.15.1", "2.15.10", False),
    ("8", "8.9.2", True),
    ("2.15.5", "2.15.5", True),
    (None, "1.0", True),
    ("1.0", None, False),
])
def test_release_prefix_matching(expected, installed, ok):
    assert version_matches(expected, installed) is ok


@pytest.mark.parametrize("text,flavor,version", [
    ("mpirun (Open MPI) 4.1.4\n\nReport bugs to http://www.open-mpi.org/community/help/", "openmpi", "4.1.4"),
    ("Open MPI v4.1.5, package: Open MPI builder, ident: 4.1.5, repo rev: v4.1.5", "openmpi", "4.1.5"),
    ("MPICH Version:\t4.0.2\nMPICH Release date: ...", "mpich", "4.0.2"),
    ("HYDRA build details:\n    Version:                                 4.1.1\n", "mpich", "4.1.1"),
    ("Intel(R) MPI Library 2021.9 for Linux* OS", "intel-mpi", "2021.9"),
    ("nothing useful", None, None),
])
def test_mpi_version_parsing(text, flavor, version):
    assert static.parse_mpi_text(text) == (flavor, version)


def test_nccl_version_codes():
    assert static.nccl_version_from_code(21505) == "2.15.5"
    assert static.nccl_version_from_code(2708) == "2.7.8"
    assert static.nccl_version_from_code(0) is None
    assert static.cudnn_version_from_code(8907) == "8.9.7"
    assert static.cudnn_version_from_code(90100) == "9.1.0"


# --- the folder ships into images: stdlib + framework only, relative imports, Python 3.8 -----------

ALLOWED_TOP = {"torch", "tensorflow", "horovod", "numpy", "mpi4py"}   # mpi4py: only where the image has it (mpi_library.py)


def _stdlib():
    return set(getattr(sys, "stdlib_module_names", ())) or None


@pytest.mark.parametrize("path", sorted(SMOKE.glob("*.py")), ids=lambda p: p.name)
def test_suite_files_are_self_contained_and_python38(path):
    tree = ast.parse(path.read_text(), filename=str(path), feature_version=(3, 8))
    stdlib = _stdlib()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                assert node.level == 1, f"{path.name}: relative import leaves the folder"
                continue
            top = (node.module or "").split(".")[0]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.split(".")[0]
                assert top != "envbuilder", f"{path.name}: imports {alias.name}"
                if stdlib is not None:
                    assert top in stdlib or top in ALLOWED_TOP, f"{path.name}: imports {alias.name}"
            continue
        else:
            continue
        assert top != "envbuilder", f"{path.name}: imports {node.module}"
        if stdlib is not None:
            assert top in stdlib or top in ALLOWED_TOP, f"{path.name}: imports {node.module}"


def _old_pythons():
    """A real Python 3.8 (pyenv shims that only print 'command not found' do not count)."""
    cands = sorted(str(p) for p in Path.home().glob(".pyenv/versions/3.8*/bin/python"))
    cands += [shutil.which("python3.8")]
    for exe in cands:
        if not exe:
            continue
        try:
            out = subprocess.run([exe, "-c", "import sys; print(sys.version_info[:2] == (3, 8))"],
                                 capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            continue
        if out == "True":
            return [exe]
    return [None]


@pytest.mark.parametrize("python", _old_pythons())
def test_suite_runs_on_python38(tmp_path, python):
    if python is None:
        pytest.skip("no Python 3.8 on this machine")
    test_suite_runs_as_envbuilder_smoke_when_copied(tmp_path, python)


def test_suite_runs_as_envbuilder_smoke_when_copied(tmp_path, python=sys.executable):
    """The image layout: the folder copied to <dir>/envbuilder_smoke, run as a top-level package."""
    shutil.copytree(SMOKE, tmp_path / "envbuilder_smoke", ignore=shutil.ignore_patterns("__pycache__"))
    manifest = tmp_path / "manifest.json"
    version = subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True).stdout.strip()
    manifest.write_text(json.dumps({"name": "bare", "expect": {
        "python": version, "framework": None, "horovod": None, "mpi": None,
        "cuda": None, "cudnn": None, "nccl": None, "gpu": False, "packages": {}}}))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["LANG"] = "C.UTF-8"
    proc = subprocess.run([python, "-m", "envbuilder_smoke", "--manifest", str(manifest), "--json"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    body = proc.stdout.split(common.BEGIN_MARKER)[1].split(common.END_MARKER)[0]
    report = json.loads(body)
    assert report["schema"] == common.REPORT_SCHEMA and report["ok"] is True
    names = {c["name"]: c for c in report["checks"]}
    assert names["versions.python"]["status"] == "pass"
    assert names["horovod"]["status"] == "skip"


# --- bad input ------------------------------------------------------------------------------------

def _suite(*args, env=None):
    full = dict(os.environ)
    full["PYTHONPATH"] = str(ROOT)
    full.update(env or {})
    return subprocess.run([sys.executable, "-m", "envbuilder.smoke", *args], capture_output=True,
                          text=True, env=full, timeout=120)


def test_missing_manifest_is_bad_input(tmp_path):
    r = _suite("--manifest", str(tmp_path / "nope.json"))
    assert r.returncode == 2
    assert "cannot read manifest" in r.stderr and "Traceback" not in r.stderr


def test_manifest_without_expect_is_bad_input(tmp_path):
    p = tmp_path / "m.json"
    p.write_text('{"name": "x"}')
    r = _suite("--manifest", str(p))
    assert r.returncode == 2 and "no 'expect' section" in r.stderr


def test_python_mismatch_fails_and_names_both_versions(tmp_path):
    p = tmp_path / "m.json"
    p.write_text(json.dumps({"name": "x", "expect": {"python": "2.7", "horovod": None}}))
    r = _suite("--manifest", str(p), "--json")
    assert r.returncode == 1
    rep = json.loads(r.stdout.split(common.BEGIN_MARKER)[1].split(common.END_MARKER)[0])
    py = next(c for c in rep["checks"] if c["name"] == "versions.python")
    assert py["status"] == "fail" and "manifest expects 2.7" in py["detail"]


# --- merging rank files: crashed and hung ranks are named -----------------------------------------

class _Args:
    timeout = 5.0


def _run(controller="gloo", ranks=2):
    r = plan.Run(controller, "horovodrun", "torch", first=True)
    r.ranks = ranks
    return r


def _state(rank, results, running=None, seq=0, done=False):
    return {"rank": rank, "pid": 0, "results": results, "running": running, "seq": seq, "done": done}


def _res(name, status="pass", figure="f", detail="d"):
    return {"name": name, "status": status, "figure": figure, "detail": detail}


def test_merge_folds_ranks_and_reports_per_rank_data():
    run = _run()
    states = {r: _state(r, [_res("horovod.init[gloo]"), _res("allreduce.exact[gloo]")], done=True)
              for r in range(2)}
    out = {c["name"]: c for c in merge.merge_run(run, states, {}, {})}
    assert out["horovod.init[gloo]"]["status"] == "pass"
    assert set(out["allreduce.exact[gloo]"]["ranks"]) == {"0", "1"}
    # checks the plan names but nobody reported: skipped, not silently dropped
    assert out["train.pytorch[gloo]"]["status"] == "skip"


def test_merge_names_the_rank_that_failed():
    run = _run()
    states = {0: _state(0, [_res("allreduce.exact[gloo]")], done=True),
              1: _state(1, [_res("allreduce.exact[gloo]", "fail", detail="element 3 wrong")], done=True)}
    out = {c["name"]: c for c in merge.merge_run(run, states, {}, {})}
    assert out["allreduce.exact[gloo]"]["status"] == "fail"
    assert out["allreduce.exact[gloo]"]["detail"] == "rank 1: element 3 wrong"


def test_crashed_rank_is_named_with_its_signal():
    run = _run()
    running = {"check": "allreduce.exact[gloo]", "phase": "sum float32 x1", "since": time.time()}
    states = {0: _state(0, [_res("horovod.init[gloo]")], running=running, seq=5),
              1: _state(1, [_res("horovod.init[gloo]")], running=dict(running, phase="boom"), seq=4)}
    exits = {1: {"returncode": -11, "how": "killed by SIGSEGV", "terminated": False, "ended": 1.0},
             0: {"returncode": -15, "how": "killed by SIGTERM", "terminated": True,
                 "signals_received": [15], "ended": 2.0}}
    events = {}
    watch._mark_crashes(run, states, exits, events)
    assert events[1]["kind"] == "crash" and events[0]["kind"] == "killed"
    out = {c["name"]: c for c in merge.merge_run(run, states, exits, events)}
    ar = out["allreduce.exact[gloo]"]
    assert ar["status"] == "fail" and ar["figure"] == "rank 1 crashed"
    assert "rank 1 crashed (killed by SIGSEGV) during 'allreduce.exact[gloo]'" in ar["detail"]
    assert out["train.pytorch[gloo]"]["status"] == "skip"
    assert "rank 1 crashed" in out["train.pytorch[gloo]"]["detail"]


def test_hung_rank_is_the_one_behind():
    run = _run()
    since = time.time() - 30
    states = {0: _state(0, [], running={"check": "allreduce.exact[gloo]", "phase": "sum float32 x1",
                                        "since": since}, seq=9),
              1: _state(1, [], running={"check": "allreduce.exact[gloo]", "phase": "computing",
                                        "since": since}, seq=8)}
    events = {}
    watch._mark_hung(run, states, {}, events, [0, 1], 10.0)
    assert events[1]["kind"] == "hang" and events[0]["kind"] == "waiting"
    out = {c["name"]: c for c in merge.merge_run(run, states, {}, events)}
    assert out["allreduce.exact[gloo]"]["figure"] == "rank 1 hung"


def test_fault_hook_parsing():
    assert common.parse_fault("hang:1") == ("hang", 1, None)
    assert common.parse_fault("crash:0:train") == ("crash", 0, "train")
    assert common.parse_fault("explode:1") is None
    assert common.parse_fault("") is None


def test_operations_check_needs_built_and_used():
    expect = {"horovod": {"operations": ["mpi", "gloo", "nccl"]}}
    build = {"name": "horovod.build", "status": "pass",
             "ranks": {"0": {"data": {"flags": {"mpi_built": True, "gloo_built": True, "nccl_built": 0}}}}}
    checks = [build,
              {"name": "horovod.init[gloo]", "status": "pass"},
              {"name": "horovod.cpu_ops[gloo]", "status": "pass", "ranks": {"0": {"data": {"used": ["gloo"]}}}},
              {"name": "gpu.nccl_allreduce[gloo]", "status": "skip"}]
    res = merge.operations_check(expect, checks)
    assert res["status"] == "fail"
    assert "nccl not built" in res["detail"]
    assert "mpi built; not exercised" in res["detail"] and "gloo built and used" in res["detail"]


def test_operations_are_not_run_when_the_ranks_never_reached_the_build_check():
    # a hang in hvd.init() (e.g. the wrong interface across nodes): "mpi not built" would be false
    expect = {"horovod": {"operations": ["mpi", "gloo"]}}
    checks = [{"name": "horovod.init[mpi]", "status": "fail", "detail": "rank 1 hung"},
              {"name": "horovod.build", "status": "skip", "detail": "not run: rank 1 hung"}]
    res = merge.operations_check(expect, checks)
    assert res["status"] == "skip" and "not built" not in res["detail"]


def test_table_shows_failure_detail():
    text = report.table([_res("a", "pass", "1 ms"), _res("b", "fail", "", "rank 1 crashed")])
    assert "rank 1 crashed" in text and "FAIL" in text


def test_os_package_drift_is_named():
    from envbuilder.smoke.static import check_os_packages

    installed = {"bash": "5.2.15-2+b2", "libopenmpi3": "4.1.4-3+b1"}
    ok = check_os_packages({"apt": {"bash": "5.2.15-2+b2"}}, installed)
    assert ok["status"] == "pass" and ok["name"] == "versions.apt"
    bad = check_os_packages({"apt": {"bash": "5.2.15-2+b2", "libopenmpi3": "4.1.5-1", "curl": "7.88"}}, installed)
    assert bad["status"] == "fail"
    assert "libopenmpi3 4.1.4-3+b1 installed, lock has 4.1.5-1" in bad["detail"]
    assert "curl missing (lock 7.88)" in bad["detail"]
    assert check_os_packages({}, installed)["status"] == "skip"


def test_os_packages_read_from_this_machines_dpkg():
    import shutil

    from envbuilder.smoke.static import check_os_packages, installed_os_packages

    if not shutil.which("dpkg-query"):
        pytest.skip("no dpkg here")
    have = installed_os_packages()
    assert have and "dpkg" in have
    assert check_os_packages({"apt": {"dpkg": have["dpkg"]}})["status"] == "pass"


# --- GPU images without a GPU ----------------------------------------------------------------------

def test_gpu_checks_without_a_gpu_fail_unless_left_out():
    status, why = common.gpu_absent({"gpu": True}, no_gpu=False)
    assert status == common.FAIL and why.startswith("not run: no GPU visible") and "--no-gpu" in why
    status, why = common.gpu_absent({"gpu": True}, no_gpu=True)
    assert status == common.SKIP and "left out (--no-gpu)" in why
    assert common.gpu_absent({"gpu": False}, no_gpu=False)[0] == common.SKIP      # a CPU image


def test_report_says_gpu_checks_were_left_out():
    from envbuilder.verify.report import headline

    left = [common.result("gpu.visible", common.SKIP, common.gpu_absent({"gpu": True}, True)[1])]
    assert report.gpu_checks_state({"gpu": True}, left) == "left out"
    failed = [common.result("gpu.visible", common.FAIL, common.gpu_absent({"gpu": True}, False)[1])]
    assert report.gpu_checks_state({"gpu": True}, failed) == "not run: no GPU visible"
    assert report.gpu_checks_state({"gpu": False}, []) is None
    text = headline({"checks": left, "wall_s": 1.0, "gpu_checks": "left out"}, "img")
    assert text.startswith("OK without GPU checks") and "not verified on a GPU" in text
    assert headline({"checks": failed, "wall_s": 1.0}, "img").startswith("FAILED")


def test_compiled_arch_coverage_follows_binary_compatibility():
    assert static.covers(["7.5", "8.0", "9.0"], "8.6")         # sm_80 code runs on 8.6
    assert not static.covers(["8.0", "9.0"], "7.5")            # nothing for Turing
    assert not static.covers(["8.6"], "8.0")                   # newer minor does not run on older


def test_tf_slurm_resolver_inputs_from_the_step_environment(monkeypatch):
    """What dist_tf hands SlurmClusterResolver: the most tasks on a node from Slurm's compressed
    list, and the GPUs of the node (Slurm's count, else CUDA_VISIBLE_DEVICES)."""
    from envbuilder.smoke.dist_tf import gpus_on_node, max_tasks_per_node

    assert max_tasks_per_node({"SLURM_STEP_TASKS_PER_NODE": "2(x2)"}) == 2
    assert max_tasks_per_node({"SLURM_STEP_TASKS_PER_NODE": "3,1(x2)"}) == 3
    assert max_tasks_per_node({"SLURM_TASKS_PER_NODE": "4"}) == 4
    assert max_tasks_per_node({}) == 1
    assert gpus_on_node({"SLURM_GPUS_ON_NODE": "4", "CUDA_VISIBLE_DEVICES": "0"}) == 4
    assert gpus_on_node({"CUDA_VISIBLE_DEVICES": "0,1"}) == 2
    assert gpus_on_node({"CUDA_VISIBLE_DEVICES": ""}) == 0
    monkeypatch.setenv("PATH", "/nonexistent")
    assert gpus_on_node({}) == 0            # no nvidia-smi: no GPU, no exception


# --- Horovod's gloo controller inside an srun step (gloo_step.py) --------------------------------

@pytest.mark.parametrize("text,counts", [
    ("2(x2)", [2, 2]), ("3,1", [3, 1]), ("2(x2),1", [2, 2, 1]), ("4", [4]), ("1(x3),2", [1, 1, 1, 2]),
])
def test_slurm_tasks_per_node_notation(text, counts):
    from envbuilder.smoke.gloo_step import parse_tasks_per_node
    assert parse_tasks_per_node(text) == counts


def test_slurm_tasks_per_node_notation_rejects_what_it_cannot_read():
    from envbuilder.smoke.gloo_step import parse_tasks_per_node
    with pytest.raises(ValueError, match="2x2"):
        parse_tasks_per_node("2x2")


def _tasks(layout):
    """[(rank, node id, local id)] -> the records the step's tasks publish."""
    return [{"rank": r, "node": n, "local": l, "host": "n%d" % n} for r, n, l in layout]


def test_gloo_slot_plan_block_and_cyclic_distributions():
    """The plan follows what the tasks say (block or cyclic), as Horovod's SlotInfo: local rank and
    size on the node, cross rank and size among the nodes with that local rank."""
    from envbuilder.smoke.gloo_step import slot_plan
    block = slot_plan(_tasks([(0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1)]), 4, [2, 2])
    assert [(s["hostname"], s["local_rank"], s["local_size"], s["cross_rank"], s["cross_size"])
            for s in block] == [("n0", 0, 2, 0, 2), ("n0", 1, 2, 0, 2), ("n1", 0, 2, 1, 2), ("n1", 1, 2, 1, 2)]
    assert all(s["size"] == 4 for s in block) and [s["rank"] for s in block] == [0, 1, 2, 3]
    cyclic = slot_plan(_tasks([(0, 0, 0), (1, 1, 0), (2, 0, 1), (3, 1, 1)]), 4, [2, 2])
    assert [(s["hostname"], s["local_rank"], s["cross_rank"]) for s in cyclic] == \
        [("n0", 0, 0), ("n1", 0, 1), ("n0", 1, 0), ("n1", 1, 1)]
    # 3,1: local rank 1 and 2 exist on the first node only
    uneven = slot_plan(_tasks([(0, 0, 0), (1, 0, 1), (2, 0, 2), (3, 1, 0)]), 4, [3, 1])
    assert [(s["local_size"], s["cross_rank"], s["cross_size"]) for s in uneven] == \
        [(3, 0, 2), (3, 0, 1), (3, 0, 1), (1, 1, 2)]


@pytest.mark.parametrize("layout,size,counts,message", [
    ([(0, 0, 0), (1, 0, 1), (2, 1, 0)], 4, [2, 2], "rank(s) 3 missing"),
    ([(0, 0, 0), (1, 0, 0), (2, 1, 0), (3, 1, 1)], 4, [2, 2], "ranks 0 and 1 both say node 0 local id 0"),
    ([(0, 0, 0), (1, 0, 2), (2, 1, 0), (3, 1, 1)], 4, [2, 2], "local ids [0, 2] are not 0..1"),
    ([(0, 0, 0), (1, 0, 1), (2, 0, 2), (3, 1, 0)], 4, [2, 2], "the tasks say [3, 1] per node"),
])
def test_gloo_slot_plan_names_what_does_not_fit(layout, size, counts, message):
    from envbuilder.smoke.gloo_step import GlooStepError, slot_plan
    with pytest.raises(GlooStepError) as exc:
        slot_plan(_tasks(layout), size, counts)
    assert message in str(exc.value)


def test_gloo_slot_env_is_what_horovodrun_gives_a_rank():
    from envbuilder.smoke.gloo_step import slot_env
    slot = {"hostname": "n1", "rank": 2, "size": 4, "local_rank": 0, "local_size": 2,
            "cross_rank": 1, "cross_size": 2}
    env = slot_env(slot, "n0", 4321, "fab0")
    assert env == {"HOROVOD_GLOO_RENDEZVOUS_ADDR": "n0", "HOROVOD_GLOO_RENDEZVOUS_PORT": "4321",
                   "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo", "HOROVOD_HOSTNAME": "n1",
                   "HOROVOD_RANK": "2", "HOROVOD_SIZE": "4", "HOROVOD_LOCAL_RANK": "0",
                   "HOROVOD_LOCAL_SIZE": "2", "HOROVOD_CROSS_RANK": "1", "HOROVOD_CROSS_SIZE": "2",
                   "HOROVOD_GLOO_IFACE": "fab0"}


def test_gloo_in_step_missing_tasks_end_in_a_named_failure_not_a_hang(tmp_path, monkeypatch):
    """Task 0 waits a bounded time for the other tasks' slot files, then names the missing ranks
    and writes the error where the other tasks look; a task waiting for task 0 names itself."""
    from envbuilder.smoke.gloo_step import GlooStepError, StepRendezvous
    monkeypatch.setenv("SLURM_PROCID", "0")
    monkeypatch.setenv("SLURM_NODEID", "0")
    monkeypatch.setenv("SLURM_LOCALID", "0")
    t0 = time.time()
    with pytest.raises(GlooStepError, match=r"rank\(s\) 1,2 never published their slot .*gloo rendezvous"):
        StepRendezvous(str(tmp_path / "a"), 0, 3, 5).setup(0.5)
    assert time.time() - t0 < 5
    assert "never published" in json.loads((tmp_path / "a" / "rendezvous.json").read_text())["error"]
    monkeypatch.setenv("SLURM_PROCID", "1")
    with pytest.raises(GlooStepError, match=r"rank 1 waited 0 s at 'gloo rendezvous'"):
        StepRendezvous(str(tmp_path / "b"), 1, 3, 5).setup(0.3)
    # a reused workdir: an earlier step's rendezvous is not this step's
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_STEP_ID", "1")
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "rendezvous.json").write_text(json.dumps(
        {"step": "6.0", "addr": "n0", "port": 1, "slots": [{"rank": 0}, {"rank": 1}, {"rank": 2}]}))
    with pytest.raises(GlooStepError, match="waited"):
        StepRendezvous(str(tmp_path / "c"), 1, 3, 5).setup(0.3)
    # task 0's error reaches the others at once
    (tmp_path / "c" / "rendezvous.json").write_text(json.dumps({"step": "7.1", "error": "rank(s) 2 never"}))
    with pytest.raises(GlooStepError, match="task 0 could not start the rendezvous: rank"):
        StepRendezvous(str(tmp_path / "c"), 1, 3, 5).setup(5)


def test_plan_runs_gloo_in_a_step_only():
    """In an srun step the manifest's controllers each get a pass, mpi first; a suite that starts
    srun itself keeps to mpi."""
    from types import SimpleNamespace
    expect = {"horovod": {"controllers": ["gloo", "mpi"], "frameworks": ["pytorch"]}}
    args = SimpleNamespace(launcher="srun", controllers="")
    assert [(r.controller, r.launcher) for r in plan.plan_runs(expect, args, in_step=True)] == \
        [("mpi", "srun"), ("gloo", "srun")]
    assert [r.controller for r in plan.plan_runs(expect, args)] == ["mpi"]
    only_gloo = {"horovod": {"controllers": ["gloo"], "frameworks": ["pytorch"]}}
    assert [r.controller for r in plan.plan_runs(only_gloo, args, in_step=True)] == ["gloo"]


def test_ranks_are_told_which_omp_num_threads_to_expect(monkeypatch):
    """env.cpu_threads compares each rank's OMP_NUM_THREADS with what the launcher says: the
    suite's split of the cores, --threads, or (a step of job.sbatch) the job's cpus-per-task,
    which the suite then leaves as the job set it."""
    from types import SimpleNamespace

    from envbuilder.smoke.cpu_tf import OMP_EXPECT_ENV, expected_omp

    args = SimpleNamespace(threads=0, timeout=60)
    expect = {"horovod": {"operations": ["mpi"]}}
    run = plan.Run("mpi", "mpirun", "tensorflow", first=True)
    run.ranks = 2
    monkeypatch.delenv("SRUN_CPUS_PER_TASK", raising=False)
    env = plan.run_env(run, args, expect)
    assert env[OMP_EXPECT_ENV] == "%s|the suite: %d cores / 2 ranks" % (env["OMP_NUM_THREADS"], common.cpu_count())
    env = plan.run_env(run, SimpleNamespace(threads=3, timeout=60), expect)
    assert env["OMP_NUM_THREADS"] == "3" and env[OMP_EXPECT_ENV] == "3|verify --threads"
    step = plan.Run("mpi", "srun-step", "tensorflow", first=True)
    step.ranks = 2
    monkeypatch.setenv("SRUN_CPUS_PER_TASK", "16")
    monkeypatch.setenv("OMP_NUM_THREADS", "16")
    env = plan.run_env(step, args, expect)
    assert env["OMP_NUM_THREADS"] == "16"                     # the job's value, not the suite's split
    monkeypatch.setenv(OMP_EXPECT_ENV, env[OMP_EXPECT_ENV])
    assert expected_omp() == ("16", "job.sbatch: cpus-per-task")


VET_LINE = r"envbuilder-vet (\S+) (ok|bad) (\d+) (\d+|-) (.+)"


def test_node_vetting_line_with_numpy_and_torch_and_without_either():
    """envbuilder_smoke.vet run for real: with the smoke venv (numpy, torch) it computes, sums
    across 2 local gloo processes and passes; ENVBUILDER_FABRIC=ib on this machine (no RDMA device)
    makes the node bad with the cause; the system Python (neither) still computes, skips the
    allreduce."""
    import re
    from infra import SMOKE_VENV_PYTHON
    root = str(Path(__file__).resolve().parent.parent)
    env = {k: v for k, v in os.environ.items() if k != "ENVBUILDER_FABRIC"}
    env.update(PYTHONPATH=root, SLURMD_NODENAME="node7")
    cases = [(SMOKE_VENV_PYTHON, {}), (SMOKE_VENV_PYTHON, {"ENVBUILDER_FABRIC": "ib"}), ("/usr/bin/python3", {})]
    lines = []
    for python, extra in cases:
        if not os.path.exists(python):
            pytest.skip(f"{python} is made by .ci/setup")
        proc = subprocess.run([python, "-m", "envbuilder.smoke.vet", "--local-ranks", "2"], env={**env, **extra},
                              capture_output=True, text=True, timeout=180)
        assert proc.returncode == 0, proc.stderr
        m = re.fullmatch(VET_LINE, proc.stdout.strip())
        assert m, proc.stdout
        lines.append(m.groups())
    (n1, v1, r1, a1, why1), (_, v2, _, _, why2), (_, v3, r3, a3, _) = lines
    assert n1 == "node7" and v1 == "ok" and int(r1) > 0 and a1 != "-" and int(a1) > 0 and why1 == "-"
    assert v2 == "bad" and why2 == "fabric ib: no RDMA device in the container (/dev/infiniband, /sys/class/infiniband)"
    assert v3 == "ok" and int(r3) > 0 and a3 == "-"


def test_two_ranks_on_one_gpu_get_the_fix_before_nccls_message():
    """NCCL's refusal of two ranks on one GPU, as NCCL 2.28.9 logged it on an H100
    (tests/data/fabric, tools/device_gpu_smoke.sh): the failed check's detail starts with the fix."""
    from envbuilder.smoke import worker
    log = (Path(__file__).resolve().parent / "data" / "fabric" / "nccl-2.28.9-h100-two-ranks-one-gpu.log").read_text()
    warn = next(line for line in log.splitlines() if "NCCL WARN" in line)
    message = "DistBackendError: NCCL error ... invalid usage\nLast error:\n" + warn.split("NCCL WARN ", 1)[1]
    assert worker.failure_hint(message).startswith("more ranks than GPUs on this node")
    assert "--gpus-per-task=1" in worker.failure_hint(message)
    assert worker.failure_hint("RuntimeError: connection refused") == ""


def test_a_gpu_node_whose_driver_the_runtime_left_out_is_named_with_the_runtime_option():
    """The trap of `apptainer exec` without --nv on a GPU node: /dev/nvidia* are bound, libcuda is
    not, and "no GPU visible, run verify on a GPU node" would send the user to the wrong fix."""
    in_apptainer = {"APPTAINER_CONTAINER": "/scratch/x.sif"}
    why = common.driver_not_brought_in(["nvidia0", "nvidiactl"], False, in_apptainer)
    assert "/dev/nvidia0" in why and "libcuda.so.1" in why and "--nv" in why
    plain = common.driver_not_brought_in(["nvidia0"], False, {})
    assert "--gpus all" in plain and "--nv" in plain
    assert common.driver_not_brought_in(["nvidia0"], True, in_apptainer) is None   # driver there
    assert common.driver_not_brought_in([], False, in_apptainer) is None           # no GPU at all
    # this machine: no NVIDIA device files, so the suite keeps its plain "run on a GPU node" message
    assert common.gpu_device_files() == [] or common.driver_library_loads()
    status, why = common.gpu_absent({"gpu": True}, no_gpu=False)
    assert status == common.FAIL and "run verify on a GPU node" in why


def test_verify_reports_the_machine_architecture_against_the_images():
    ok = static.check_arch({"arch": "x86_64"}, "x86_64")
    assert ok["status"] == common.PASS and ok["figure"] == "x86_64"
    assert static.check_arch({"arch": "aarch64"}, "arm64")["status"] == common.PASS   # macOS/BSD name
    bad = static.check_arch({"arch": "aarch64"}, "x86_64")
    assert bad["status"] == common.FAIL and bad["figure"] == "x86_64 != aarch64"
    assert "built for aarch64 but runs on a x86_64 machine" in bad["detail"]
    assert static.check_arch({}, "x86_64")["status"] == common.PASS      # an older manifest names none
    assert static.check_arch({"arch": "x86_64"})["figure"] == os.uname().machine


# --- horovod.cuda_arch: Horovod's GPU kernels read from its library's .nv_fatbin, no GPU -----------

def _fatbin(entries: list[tuple[int, int]]) -> bytes:
    """A fat binary as nvcc lays it out (fatbinary.h's header; then per entry a 64-byte header:
    kind 1 PTX / 2 cubin, header size, payload size, the SM number at byte 28) with small payloads.
    The layout is checked against a real Horovod library in tests/test_aarch64_build.py and
    tests/test_gpu_pypi.py (long builds)."""
    import struct

    body = b""
    for kind, sm in entries:
        payload = b"\0" * 24
        header = struct.pack("<HHIQIIII", kind, 0x101, 64, len(payload), 0, 0, 0, sm)   # sm at byte 28
        body += header.ljust(64, b"\0") + payload
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body


def _library_with_fatbin(tmp_path: Path, name: str, blob: bytes | None) -> Path:
    """A real shared object built by the system's C compiler, with BLOB in its .nv_fatbin section."""
    if not shutil.which("cc"):
        pytest.skip("needs a C compiler (.ci/install-system.sh installs g++)")
    src = tmp_path / (name + ".c")
    lines = ["int envbuilder_probe(void) { return 1; }"]
    if blob is not None:
        data = ", ".join(str(b) for b in blob)
        lines.append('__attribute__((used, section(".nv_fatbin"), aligned(8))) '
                     "static const unsigned char fatbin[] = {%s};" % data)
    src.write_text("\n".join(lines) + "\n")
    lib = tmp_path / (name + ".so")
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True, capture_output=True)
    return lib


def test_fatbin_kernels_are_read_from_a_real_elf_section(tmp_path):
    from envbuilder.smoke import fatbin

    lib = _library_with_fatbin(tmp_path, "withkernels", _fatbin([(2, 90), (2, 100), (2, 120), (1, 120)]))
    assert fatbin.kernels(lib) == {"cubin": [90, 100, 120], "ptx": [120]}
    plain = _library_with_fatbin(tmp_path, "plain", None)
    assert fatbin.kernels(plain) is None                          # no device code
    assert fatbin.kernels(tmp_path / "plain.c") is None           # not an ELF file
    assert fatbin.kernels(tmp_path / "absent.so") is None


def test_horovod_cuda_arch_reads_the_loaded_binding_and_names_what_is_missing(tmp_path):
    import ctypes

    # the check reads the Horovod library this process has loaded (/proc/self/maps), as in an image
    lib = _library_with_fatbin(tmp_path, "mpi_lib_envbuilder_probe", _fatbin([(2, 90), (2, 100), (1, 100)]))
    ctypes.CDLL(str(lib))
    base = {"gpu": True, "framework": {"name": "pytorch"},
            "horovod": {"version": "0.28.1", "operations": ["nccl", "mpi"]}}
    (ok,) = static.check_horovod_cuda_arch(dict(base, cuda_arch=["9.0", "10.0", "12.0"]), binding=object())
    assert ok["status"] == "pass", ok                             # 12.0 by PTX 10.0, JIT-compiled
    assert ok["figure"] == "9.0 10.0 +PTX 10.0" and "mpi_lib_envbuilder_probe.so" in ok["detail"]
    (bad,) = static.check_horovod_cuda_arch(dict(base, cuda_arch=["8.0", "9.0"]), binding=object())
    assert bad["status"] == "fail" and bad["detail"].startswith("no Horovod kernels for 8.0 in"), bad
    assert "HOROVOD_BUILD_CUDA_CC_LIST" in bad["detail"]
    (gone,) = static.check_horovod_cuda_arch(dict(base, cuda_arch=["9.0"]), binding=None)
    assert gone["status"] == "fail" and "did not load" in gone["detail"]
    # not asked: a CPU image, no NCCL operations, no arch list
    assert static.check_horovod_cuda_arch(dict(base, gpu=False, cuda_arch=["9.0"]), object()) == []
    assert static.check_horovod_cuda_arch(dict(base, horovod={"operations": ["mpi"]}, cuda_arch=["9.0"]), object()) == []
    assert static.check_horovod_cuda_arch(base, object()) == []


# ------------------------------------------------------------------ TF's coordination heartbeat hook

def test_the_tf_heartbeat_hook_reads_only_whole_seconds_and_keeps_a_timeout_the_caller_gave():
    """envbuilder_smoke/tf_coordination.py (the TF image's .pth calls install()): the timeout comes
    from ENVBUILDER_TF_HEARTBEAT_S in whole seconds; anything else leaves TensorFlow's default; a
    caller's own timeout, by keyword or by position, is kept. (The real TensorFlow path:
    tests/test_distributed_tf.py, in the image.)"""
    from envbuilder.smoke import tf_coordination as tc

    assert tc.heartbeat_ms({"ENVBUILDER_TF_HEARTBEAT_S": "45"}) == 45000
    for raw in ("", "0", "-5", "4.5", "soon", "9" * 40, "1e3"):
        assert tc.heartbeat_ms({"ENVBUILDER_TF_HEARTBEAT_S": raw}) == 0, raw
    assert tc.install({}) is False     # nothing asked: no finder added

    seen = []

    class Context:   # the signature of TensorFlow's Context.configure_coordination_service
        def configure_coordination_service(self, service_type, service_leader="", enable_health_check=True,
                                           cluster_register_timeout_in_ms=0, heartbeat_timeout_in_ms=0):
            seen.append(heartbeat_timeout_in_ms)

    module = type(sys)("context")
    module.Context = Context
    assert tc.patch(module, 45000) is True
    assert tc.patch(module, 45000) is False          # once
    ctx = Context()
    ctx.configure_coordination_service("standalone", service_leader="/job:worker/replica:0/task:0")
    ctx.configure_coordination_service("standalone", heartbeat_timeout_in_ms=7000)
    ctx.configure_coordination_service("standalone", "leader", True, 0, 8000)
    ctx.configure_coordination_service("standalone", "leader", True, 0, 0)
    assert seen == [45000, 7000, 8000, 45000]
    assert tc.PTH_LINE.startswith("import ") and "install()" in tc.PTH_LINE
