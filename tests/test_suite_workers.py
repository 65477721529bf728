"""The suite's two workers (`pytest -n 2`, the README's test command): which modules share one, and
the run's record of what it made (infra.run_record), kept until the whole run ends."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

from conftest import LONGEST_FIRST, WORKER_GROUPS, worker_group
from infra import base_image, docker_cli

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent

# what makes a module a user of the multi-node test cluster
CLUSTER_USE = re.compile(r"def \w+\([^)]*\b(cluster|shared)\b|require_minicluster|MINICLUSTER_ROOT|charliecloud_for_run")


def test_every_module_of_the_test_cluster_runs_in_the_cluster_worker():
    """A module that runs jobs on tools/minicluster or converts into its shared folder runs in the
    "cluster" group: node vetting measures the nodes' speed, and two workers' conversions into one
    cache would remove each other's directories."""
    users = sorted(p.stem for p in TESTS.glob("test_*.py")
                   if p.stem != "test_suite_workers" and CLUSTER_USE.search(p.read_text()))
    assert "test_multinode" in users and "test_mpi_multinode" in users, users
    assert [m for m in users if worker_group(m) != "cluster"] == []


def test_the_groups_name_modules_that_exist():
    modules = {p.stem for p in TESTS.glob("test_*.py")}
    named = [m for group in WORKER_GROUPS.values() for m in group]
    assert sorted(set(named) - modules) == []
    assert len(named) == len(set(named)), "a module in two groups"
    assert sorted(set(LONGEST_FIRST) - modules - set(WORKER_GROUPS)) == []


TAGGER = """
import os, subprocess, time
from pathlib import Path
from infra import docker_cli, keep_for_run

OUT = Path(os.environ["RECORD_TEST_OUT"])
TAG = os.environ["RECORD_TEST_TAG"]

def test_{name}():
    (OUT / "{name}").write_text(os.environ["PYTEST_XDIST_WORKER"])
    {body}
"""
KEEP = ("keep_for_run(TAG)\n    subprocess.run([docker_cli(), 'tag', os.environ['RECORD_TEST_BASE'], TAG], check=True)")
# waits for the other worker to end its session (the plugin below marks it), then needs the image
WAIT = ("me = os.environ['PYTEST_XDIST_WORKER']\n"
        "    deadline = time.monotonic() + 90\n"
        "    while not [p for p in OUT.glob('ended-*') if p.name != 'ended-' + me]:\n"
        "        assert time.monotonic() < deadline, 'the other worker never ended'\n"
        "        time.sleep(0.2)\n"
        "    keep_for_run(TAG)\n"
        "    assert subprocess.run([docker_cli(), 'image', 'inspect', TAG], capture_output=True).returncode == 0, "
        "'the image went when the other worker ended'")
ENDED = """
import os
from pathlib import Path

def pytest_unconfigure(config):       # after the session's end (conftest's pytest_sessionfinish)
    worker = getattr(config, "workerinput", {}).get("workerid")
    if worker:
        (Path(os.environ["RECORD_TEST_OUT"]) / f"ended-{worker}").write_text("")
"""


def test_an_image_kept_for_the_run_outlives_the_worker_that_made_it(tmp_path):
    """A real `pytest -n 2` with this suite's conftest and infra: two modules of the "cluster" group
    run in one worker, the first tagging an image kept for the run; a module of its own runs in the
    other worker, waits until the first worker has ended its session, and still finds the image.
    When the run ends the image is gone (it was not there before) and so is the run's record."""
    base = base_image()
    suite, out = tmp_path / "suite", tmp_path / "out"
    suite.mkdir()
    out.mkdir()
    for name in ("conftest.py", "infra.py"):
        (suite / name).write_text((TESTS / name).read_text())
    (suite / "test_multinode.py").write_text(TAGGER.format(name="test_multinode", body=KEEP))
    (suite / "test_apptainer.py").write_text(TAGGER.format(name="test_apptainer", body="keep_for_run(TAG)"))
    (suite / "test_lock.py").write_text(TAGGER.format(name="test_lock", body=WAIT))
    (suite / "ended_plugin.py").write_text(ENDED)
    (suite / "pytest.ini").write_text("[pytest]\n")
    tag = f"envbuilder-test/run-record:{uuid.uuid4().hex[:8]}"
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", "PYTHONPATH": f"{ROOT}:{suite}",
           "RECORD_TEST_OUT": str(out), "RECORD_TEST_TAG": tag, "RECORD_TEST_BASE": base}
    records_before = set(Path("/tmp").glob("envbuilder-test-run-*"))
    try:
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "-p", "ended_plugin", "-p",
                               "no:cacheprovider", str(suite)], cwd=suite, env=env, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
        assert "3 passed" in proc.stdout, proc.stdout[-2000:]
        workers = {name: (out / name).read_text() for name in ("test_multinode", "test_apptainer", "test_lock")}
        assert workers["test_multinode"] == workers["test_apptainer"] != workers["test_lock"], workers
        gone = subprocess.run([docker_cli(), "image", "inspect", tag], capture_output=True)
        assert gone.returncode != 0, "the image kept for the run is still there after it"
        assert set(Path("/tmp").glob("envbuilder-test-run-*")) <= records_before, "the run's record was left"
    finally:
        subprocess.run([docker_cli(), "rmi", "-f", tag], capture_output=True)


def test_the_record_lists_what_every_process_kept(tmp_path, monkeypatch):
    """Two processes keep images in one record (as the two workers do): both tags are listed, each
    with whether it was in the engine before; the record is a JSON file any process can read."""
    import infra

    base = base_image()
    record = tmp_path / "record.json"
    monkeypatch.setattr(infra, "RUN_RECORD", record)
    absent = f"envbuilder-test/never-built:{uuid.uuid4().hex[:8]}"
    script = textwrap.dedent(f"""
        import sys; sys.path[:0] = [{str(TESTS)!r}, {str(ROOT)!r}]
        from pathlib import Path
        import infra
        infra.RUN_RECORD = Path({str(record)!r})
        infra.keep_for_run(sys.argv[1])
        """)
    for tag in (base, absent):
        subprocess.run([sys.executable, "-c", script, tag], check=True, timeout=60)
    assert json.loads(record.read_text())["images"] == {base: True, absent: False}
    assert infra.built_once(absent) is False and infra.built_once(absent) is False    # not there: build it
    assert infra.built_once(base) is False and infra.built_once(base) is True
