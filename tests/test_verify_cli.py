"""`envbuilder verify`: bad input (exit 2, one message), the command lines per runtime, report
parsing, JUnit XML, and real host runs of the suite (table, --json, --junit, exit codes)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from conftest import run_envbuilder
from envbuilder.errors import EnvbuilderError
from envbuilder.verify import report as rep
from envbuilder.verify import runner
from envbuilder.runtimes.apptainer import apptainer_argv
from envbuilder.verify.runner import (BEGIN_MARKER, END_MARKER, VERIFY_MANIFEST, VerifyOptions,
                                      build_argv, parse_report, resolve_target)
from infra import smoke_python

SMOKE_PY = smoke_python()
needs_smoke_python = pytest.mark.skipif(
    not SMOKE_PY, reason="ENVBUILDER_SMOKE_PYTHON is not set (a Python with torch + Horovod)")


def write_manifest(folder: Path, expect: dict | None = None, name: str = "t", image: dict | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    data = {"schema": "envbuilder.manifest/1", "name": name, "expect": expect or {
        "python": "%d.%d" % sys.version_info[:2], "framework": None, "horovod": None, "mpi": None,
        "cuda": None, "cudnn": None, "nccl": None, "gpu": False, "packages": {}}}
    if image:
        data["image"] = image
    (folder / "manifest.json").write_text(json.dumps(data))
    return folder


def torch_expect(**over) -> dict:
    e = {"python": "3.11", "framework": {"name": "pytorch", "module": "torch", "version": "2.13.0"},
         "horovod": {"version": "0.28.1", "frameworks": ["pytorch"], "controllers": ["mpi", "gloo"],
                     "operations": ["mpi", "gloo"]},
         "mpi": {"flavor": "openmpi", "version": "4.1.4"}, "cuda": None, "cudnn": None, "nccl": None,
         "gpu": False, "packages": {}}
    e.update(over)
    return e


# --- bad input: exit 2, one message, no traceback ---------------------------------------------------

def test_missing_folder_is_bad_input(tmp_path):
    r = run_envbuilder("verify", str(tmp_path / "nope"), "--runtime", "host")
    assert r.code == 2
    assert "does not exist" in r.err and "Traceback" not in r.err


def test_folder_without_manifest_is_bad_input(tmp_path):
    (tmp_path / "out").mkdir()
    r = run_envbuilder("verify", str(tmp_path / "out"))
    assert r.code == 2
    assert "has no manifest.json" in r.err and "envbuilder build" in r.err
    assert "Traceback" not in r.err and r.err.count("\n") <= 3


def test_broken_manifest_is_bad_input(tmp_path):
    (tmp_path / "manifest.json").write_text("{not json")
    r = run_envbuilder("verify", str(tmp_path), "--runtime", "host")
    assert r.code == 2 and "not valid JSON" in r.err and "Traceback" not in r.err


def test_nothing_to_verify_here(tmp_path):
    r = run_envbuilder("verify", cwd=tmp_path)
    assert r.code == 2 and "nothing to verify" in r.err


def test_bad_ranks(tmp_path):
    write_manifest(tmp_path)
    r = run_envbuilder("verify", str(tmp_path), "--runtime", "host", "--ranks", "0")
    assert r.code == 2 and "--ranks" in r.err


def test_apptainer_not_installed_names_the_command(tmp_path):
    if shutil.which("apptainer") or shutil.which("singularity"):
        pytest.skip("apptainer is installed here")
    write_manifest(tmp_path, name="demo")
    r = run_envbuilder("verify", str(tmp_path), "--runtime", "apptainer", "--ranks", "2")
    assert r.code == 2, r.out + r.err
    assert "apptainer (or singularity) is not installed" in r.err
    assert f"apptainer exec --nv --bind {tmp_path}/manifest.json:{VERIFY_MANIFEST}:ro " \
           f"{tmp_path}/demo.sif python -m envbuilder_smoke --json --ranks 2" in r.err
    assert "Traceback" not in r.err


# --- command lines ----------------------------------------------------------------------------------

def test_apptainer_argv():
    argv = apptainer_argv("/images/x.sif", ["--json", "--ranks", "4"])
    assert argv == ["apptainer", "exec", "--nv", "/images/x.sif", "python", "-m", "envbuilder_smoke",
                    "--json", "--ranks", "4"]


def test_docker_argv_and_default_tags(tmp_path):
    folder = write_manifest(tmp_path / "a", name="cpu-x", image={"tag": "envbuilder/cpu-x:abc123"})
    t = resolve_target(str(folder), None, "docker")
    assert t.image == "envbuilder/cpu-x:abc123"
    argv, env = build_argv(t, VerifyOptions(ranks=3, timeout=50), container_name="c1")
    assert env is None
    assert argv[1:5] == ["run", "--rm", "--shm-size=1g", "--name"]
    i = argv.index("envbuilder/cpu-x:abc123")
    assert argv[i + 1:i + 4] == ["python", "-m", "envbuilder_smoke"]
    assert ["--ranks", "3"] == argv[argv.index("--ranks"):argv.index("--ranks") + 2]
    assert ["--timeout", "50"] == argv[argv.index("--timeout"):argv.index("--timeout") + 2]
    assert f"{folder}/manifest.json:{VERIFY_MANIFEST}:ro" in argv            # folder's manifest is the truth
    assert argv[argv.index("--manifest") + 1] == VERIFY_MANIFEST
    # without image.tag: envbuilder/<name>:latest
    folder = write_manifest(tmp_path / "b", name="plain")
    assert resolve_target(str(folder), None, "docker").image == "envbuilder/plain:latest"
    # --image alone: the image's own manifest
    t = resolve_target(None, "some/image:1", "docker")
    argv, _ = build_argv(t, VerifyOptions())
    assert "--manifest" not in argv and "-v" not in argv


def test_charliecloud_and_host_argv(tmp_path):
    folder = write_manifest(tmp_path, name="cc")
    t = resolve_target(str(folder), "/var/tmp/img", "charliecloud")
    argv, env = build_argv(t, VerifyOptions(ranks=2), ch_directory="/var/tmp/img", ch_manifest=True)
    assert argv[:5] == ["ch-run", "--set-env", "--set-env=PYTHONNOUSERSITE=1", "/var/tmp/img", "--"]
    assert argv[5:8] == ["python", "-m", "envbuilder_smoke"] and "USER" in env
    assert argv[argv.index("--manifest") + 1] == VERIFY_MANIFEST
    t = resolve_target(str(folder), None, "host")
    argv, env = build_argv(t, VerifyOptions(python="/x/python"))
    assert argv[:3] == ["/x/python", "-m", "envbuilder.smoke"]
    assert argv[argv.index("--manifest") + 1] == str(folder / "manifest.json")
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(Path(runner.__file__).resolve().parents[2])


def test_host_runtime_needs_a_manifest():
    with pytest.raises(EnvbuilderError) as exc:
        resolve_target(None, "img:1", "host")
    assert exc.value.exit_code == 2 and "needs a manifest" in exc.value.reason


# --- report parsing and outputs --------------------------------------------------------------------------

REPORT = {"schema": "envbuilder.smoke-report/1", "ok": False, "wall_s": 3.5, "host": "h",
          "checks": [
              {"name": "versions.framework", "status": "fail", "figure": "2.13.0 != 2.12.0",
               "detail": "torch 2.13.0+cpu installed, manifest expects 2.12.0", "seconds": 1.2},
              {"name": "allreduce.exact[gloo]", "status": "pass", "figure": "24 cases exact", "detail": "ok"},
              {"name": "gpu.devices[gloo]", "status": "skip", "figure": "", "detail": "no GPU"}]}


def test_parse_report_survives_framework_noise():
    noisy = ("2026 I tensorflow/core/... oneDNN custom operations are on\nWARNING: something {odd}\n"
             f"{BEGIN_MARKER}\n{json.dumps(REPORT, indent=1)}\n{END_MARKER}\n[1]<stdout>: late noise\n")
    assert parse_report(noisy)["checks"][0]["name"] == "versions.framework"
    assert parse_report("noise\n" + json.dumps(REPORT) + "\n")["ok"] is False      # last-line JSON
    assert parse_report("no report at all") is None


def test_table_and_junit():
    text = rep.table(REPORT)
    lines = text.splitlines()
    assert lines[0].split() == ["CHECK", "RESULT", "FIGURE"]
    assert any(l.startswith("versions.framework") and "FAIL" in l for l in lines)
    assert "manifest expects 2.12.0" in text and "(no GPU)" in text
    root = ET.fromstring(rep.junit_xml(REPORT, suite_name="envbuilder.verify.t", properties={"runtime": "host"}))
    suite = root.find("testsuite")
    assert suite.get("tests") == "3" and suite.get("failures") == "1" and suite.get("skipped") == "1"
    cases = suite.findall("testcase")
    assert [c.get("name") for c in cases] == ["versions.framework", "allreduce.exact[gloo]", "gpu.devices[gloo]"]
    fail = cases[0].find("failure")
    assert fail.get("message") == "torch 2.13.0+cpu installed, manifest expects 2.12.0"
    assert cases[0].get("classname") == "envbuilder.smoke.versions" and cases[0].get("time") == "1.200"
    assert cases[1].find("failure") is None and cases[2].find("skipped").get("message") == "no GPU"


def test_a_hung_suite_is_stopped_by_the_outer_timeout(tmp_path):
    o = runner.execute([sys.executable, "-c", "import time; print('started', flush=True); time.sleep(60)"],
                       timeout=1.5, echo_stderr=False)
    assert o.timed_out and o.report is None
    assert "did not finish within 2 s" in o.problem and "started" in o.problem
    assert o.wall_s < 15


def test_a_suite_hung_after_a_qemu_crash_is_stopped_early(monkeypatch):
    # torch 2.15's aarch64 wheel under qemu-user 7.2: the crash line, then the process hangs
    # (docs/aarch64.md); verify stops it after the grace period, not the whole timeout
    monkeypatch.setattr(runner, "EMULATION_CRASH_GRACE_S", 1.0)
    code = ("import sys, time; sys.stderr.write('qemu: uncaught target signal 11 (Segmentation fault) "
            "- core dumped\\n'); sys.stderr.flush(); time.sleep(60)")
    o = runner.execute([sys.executable, "-c", code], timeout=120, echo_stderr=False)
    assert o.report is None and not o.timed_out and o.wall_s < 15
    assert re.search(r"crashed under emulation( under qemu-aarch64 [\d.]+)? \(qemu: uncaught target signal 11",
                     o.problem), o.problem
    assert "a machine of the image's architecture" in o.problem and ".ci/install-qemu.sh" in o.problem


def test_suite_failure_without_python_framework_gives_exit_1_and_json(tmp_path):
    """Runs on any machine: a manifest asking for another Python fails versions.python."""
    folder = write_manifest(tmp_path / "m", expect={"python": "2.7", "framework": None, "horovod": None})
    report = tmp_path / "r.json"
    junit = tmp_path / "j.xml"
    r = run_envbuilder("verify", str(folder), "--runtime", "host", "--json", "--report", str(report),
                       "--junit", str(junit), env={"LANG": "C.UTF-8"})
    assert r.code == 1, r.out + r.err
    data = json.loads(r.out)
    assert data == json.loads(report.read_text())
    failed = [c for c in data["checks"] if c["status"] == "fail"]
    assert [c["name"] for c in failed] == ["versions.python"]
    assert data["verify"]["runtime"] == "host" and data["verify"]["exit_code"] == 1
    assert ET.parse(junit).getroot().find("testsuite").get("failures") == "1"


# --- real runs on the host (the dev venv) ---------------------------------------------------------------

@needs_smoke_python
def test_host_verify_two_ranks_table_junit_report(tmp_path):
    folder = write_manifest(tmp_path / "cpu-torch", name="cpu-torch", expect=torch_expect())
    junit, report = tmp_path / "junit.xml", tmp_path / "report.json"
    r = run_envbuilder("verify", str(folder), "--runtime", "host", "--python", SMOKE_PY, "--ranks", "2",
                       "--launcher", "gloo", "--junit", str(junit), "--report", str(report),
                       env={"LANG": "C.UTF-8"}, timeout=300)
    assert r.code == 0, r.out + r.err[-3000:]
    lines = r.out.splitlines()
    assert lines[0].split() == ["CHECK", "RESULT", "FIGURE"]
    rows = {l.split()[0]: l for l in lines[1:] if l and not l.startswith(" ")}
    assert "PASS" in rows["allreduce.exact[gloo]"] and "cases exact" in rows["allreduce.exact[gloo]"]
    assert "ms/step" in rows["perf.step.pytorch[gloo]"] and "B/s @ 16 MiB" in rows["perf.allreduce[gloo]"]
    assert "loss" in rows["train.pytorch[gloo]"]
    assert lines[-1].startswith("OK: cpu-torch (host): ")
    data = json.loads(report.read_text())
    assert data["ok"] and data["verify"]["argv"][:3] == [SMOKE_PY, "-m", "envbuilder.smoke"]
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite.get("failures") == "0" and int(suite.get("tests")) == len(data["checks"])
    names = [c.get("name") for c in suite.findall("testcase")]
    assert "train.pytorch[gloo]" in names and "versions.framework" in names


@needs_smoke_python
def test_host_verify_framework_drift_exit_1(tmp_path):
    expect = torch_expect(horovod=None)
    expect["framework"]["version"] = "2.12.0"
    folder = write_manifest(tmp_path / "drift", name="drift", expect=expect)
    r = run_envbuilder("verify", str(folder), "--runtime", "host", "--python", SMOKE_PY,
                       env={"LANG": "C.UTF-8"}, timeout=300)
    assert r.code == 1
    row = next(l for l in r.out.splitlines() if l.startswith("versions.framework"))
    assert "FAIL" in row
    assert "2.13.0+cpu installed, manifest expects 2.12.0" in r.out
    assert r.out.splitlines()[-1].startswith("FAILED: drift (host)")


# --- docker (engine needed; the image-based runs are in test_build_verify.py) ------------------------------

def _docker_up() -> bool:
    exe = shutil.which("docker")
    if not exe:
        return False
    return subprocess.run([exe, "version"], capture_output=True, timeout=30).returncode == 0


@pytest.mark.skipif(not _docker_up(), reason="no Docker engine answering")
def test_docker_missing_image_is_bad_input(tmp_path):
    folder = write_manifest(tmp_path, name="never-built", image={"tag": "envbuilder-test/never-built:none"})
    r = run_envbuilder("verify", str(folder), "--runtime", "docker")
    assert r.code == 2
    assert "image envbuilder-test/never-built:none not found" in r.err and "Traceback" not in r.err


def test_no_report_is_a_failed_check_with_the_suites_last_words(tmp_path):
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'some framework noise'\necho 'ImportError: no module named horovod' >&2\nexit 3\n")
    fake.chmod(0o755)
    folder = write_manifest(tmp_path / "m")
    junit = tmp_path / "j.xml"
    r = run_envbuilder("verify", str(folder), "--runtime", "host", "--python", str(fake), "--junit", str(junit))
    assert r.code == 1
    assert "the suite printed no report (exit code 3)" in r.out
    assert "ImportError: no module named horovod" in r.out and "some framework noise" in r.out
    fail = ET.parse(junit).getroot().find("testsuite/testcase/failure")
    assert fail is not None and "no report" in fail.get("message")


def test_a_sif_gets_the_same_suite_arguments_as_every_runtime(tmp_path):
    """verify x.sif --no-gpu: the SIF runtime (runtimes/sif.py) hands the suite --no-gpu like
    docker/apptainer/charliecloud do (before the runtime classes it dropped it)."""
    from envbuilder.runtimes.sif import SifCharliecloud
    from envbuilder.verify.runner import suite_for

    argv = SifCharliecloud("/x.sif").argv(tmp_path, VerifyOptions(ranks=3, no_gpu=True), suite_for(
        VerifyOptions(ranks=3, no_gpu=True)), "/tmp/m.json")
    assert argv[:6] == ["ch-run", "--set-env=PYTHONNOUSERSITE=1", str(tmp_path), "--",
                        "/.singularity.d/actions/exec", "python"]
    assert "--no-gpu" in argv and argv[argv.index("--manifest") + 1] == "/tmp/m.json"
    assert argv[argv.index("--ranks") + 1] == "3"
