"""Real images on a real Docker engine: the cpu-torch preset (PyTorch + Horovod) builds from the
local Debian base, the smoke suite inside it passes with 2 ranks, and deliberately broken images
fail verify with the right check named. The CA bundle and the wheelhouse never reach the image.
(TensorFlow + Horovod, the intel-tensorflow preset: tests/test_intel_tf.py.)"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from conftest import RECIPES, run_envbuilder
from infra import base_image, docker_cli, keep_for_run, require_docker, wheelhouse

CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"


def docker(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([docker_cli(), *args], capture_output=True, text=True, check=check)


CA_MARKER = "envbuilder-test-ca-marker-7f3a9c"


@pytest.fixture(scope="module")
def ca_bundle(tmp_path_factory) -> Path:
    """The host's bundle plus a unique comment line (PEM parsers skip text between certificates):
    if the marker shows up anywhere in the image's layers, the bundle leaked."""
    path = tmp_path_factory.mktemp("ca") / "ca.pem"
    host = Path(CA_BUNDLE).read_text() if Path(CA_BUNDLE).is_file() else ""
    path.write_text(host + f"\n# {CA_MARKER}\n")
    return path


def build(recipe: Path, out: Path, ca: Path, *extra: str):
    require_docker()
    base_image()
    probe = run_envbuilder("build", str(recipe), "--no-build", "--out", str(out))
    assert probe.code == 0, probe.err
    keep_for_run(json.loads((out / "manifest.json").read_text())["image"]["tag"])
    args = ["build", str(recipe), "--out", str(out), "--ca-bundle", str(ca)]
    return run_envbuilder(*args, *extra, timeout=2400)


@pytest.fixture(scope="module")
def torch_image(tmp_path_factory, ca_bundle):
    out = tmp_path_factory.mktemp("torch") / "cpu-torch"
    r = build(RECIPES / "cpu-torch-horovod.yaml", out, ca_bundle, "--wheelhouse", wheelhouse())
    assert r.code == 0, r.err[-3000:]
    info = json.loads((out / "image.json").read_text())
    yield out, info, r


def verify(*args: str):
    return run_envbuilder("verify", *args, timeout=900)


def report_checks(report: dict) -> dict:
    return {c["name"]: c for c in report["checks"]}


# --- building -----------------------------------------------------------------------------------

def test_build_reports_steps_and_keeps_a_log(torch_image):
    out, info, r = torch_image
    assert "[devel" in r.err and "[runtime" in r.err          # streamed step lines
    assert f"built {info['tag']}" in r.out
    log = (out / "build.log").read_text()
    assert "horovod" in log and "CMAKE_CXX_STANDARD 17" in log
    labels = json.loads(docker("image", "inspect", info["tag"]).stdout)[0]["Config"]["Labels"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert labels["dev.envbuilder.spec-sha256"] == manifest["spec_sha256"]


def test_ca_bundle_and_wheelhouse_stay_out_of_the_image(torch_image):
    _, info, _ = torch_image
    history = docker("history", "--no-trunc", "--format", "{{.CreatedBy}}", info["tag"]).stdout
    assert CA_MARKER not in history
    # every byte of every layer, deleted files included
    save = subprocess.Popen([docker_cli(), "save", info["tag"]], stdout=subprocess.PIPE)
    found = subprocess.run(["grep", "-a", "-c", CA_MARKER], stdin=save.stdout, capture_output=True, text=True)
    save.wait()
    assert save.returncode == 0
    assert found.stdout.strip() == "0", "the CA bundle ended up in a layer"
    probe = docker("run", "--rm", "--entrypoint", "sh", info["tag"], "-c",
                   "ls -d /wheelhouse /run/secrets/ca 2>&1; find / -xdev -name '*.whl' 2>/dev/null; true").stdout
    assert "'/wheelhouse': No such file" in probe and "'/run/secrets/ca': No such file" in probe
    assert ".whl" not in probe


def test_runtime_stage_has_no_compilers(torch_image):
    _, info, _ = torch_image
    probe = docker("run", "--rm", "--entrypoint", "sh", info["tag"], "-c",
                   "command -v g++ cmake gcc || echo none").stdout
    assert probe.strip() == "none"


TRIM_COUNTS = ("echo man=$(find /usr/share/man -type f 2>/dev/null | wc -l);"
               " echo mo=$(find /usr/share/locale -name '*.mo' 2>/dev/null | wc -l);"
               " echo doc=$(find /usr/share/doc -type f ! -name copyright 2>/dev/null | wc -l)")


def test_runtime_stage_leaves_out_documentation_but_keeps_what_a_job_needs(torch_image):
    """The dpkg trim (plan/components/system.py DPKG_TRIM): the runtime stage's packages add no
    manual page, translation or document to the base's own (left as they are), and every
    package's licence, the CA bundle, time zone data and C.UTF-8 are there."""
    _, info, _ = torch_image
    probe = docker("run", "--rm", "--entrypoint", "bash", info["tag"], "-c",
                   "for p in $(dpkg-query -W -f '${Package}\\n'); do"
                   "  [ -e /usr/share/doc/$p/copyright ] || [ -e /usr/share/doc/${p%%:*}/copyright ] || echo nolicence=$p; done;"
                   " test -s /etc/ssl/certs/ca-certificates.crt && echo ca;"
                   " test -e /usr/share/zoneinfo/UTC && echo tz;"
                   " test -s /etc/dpkg/dpkg.cfg.d/envbuilder-trim && echo cfg;"
                   " LC_ALL=C.UTF-8 python -c 'import locale; print(\"loc=\" + locale.setlocale(locale.LC_ALL, \"\"))';"
                   + TRIM_COUNTS).stdout.split()
    base = docker("run", "--rm", "--entrypoint", "bash", base_image(), "-c", TRIM_COUNTS).stdout.split()
    assert not [w for w in probe if w.startswith("nolicence=")], probe
    assert {"ca", "tz", "cfg", "loc=C.UTF-8", *base} <= set(probe), (probe, base)


# --- verify -------------------------------------------------------------------------------------

def test_verify_torch_image_with_two_ranks(torch_image, tmp_path):
    out, _, _ = torch_image
    junit = tmp_path / "junit.xml"
    report = tmp_path / "report.json"
    r = verify(str(out), "--runtime", "docker", "--ranks", "2", "--report", str(report), "--junit", str(junit))
    assert r.code == 0, r.out + r.err[-3000:]
    data = json.loads(report.read_text())
    checks = report_checks(data)
    assert all(c["status"] in ("pass", "skip") for c in checks.values()), checks
    text = r.out
    assert re.search(r"allreduce", text) and re.search(r"train", text)
    assert "<testsuite" in junit.read_text()


# --- broken images: verify must fail and name the check ----------------------------------------

def derive(base_tag: str, tag: str, run: str, tmp_path: Path) -> str:
    (tmp_path / "Dockerfile").write_text(f"FROM {base_tag}\nRUN {run}\n")
    proc = subprocess.run([docker_cli(), "build", "-q", "-t", tag, str(tmp_path)], capture_output=True,
                          text=True, env={"DOCKER_BUILDKIT": "1", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    return tag


@pytest.mark.parametrize("name,run,failing", [
    ("no-torch-binding",
     "rm -f /opt/venv/lib/python3.11/site-packages/horovod/torch/mpi_lib_v2*.so",
     "horovod"),
    ("framework-drift",
     "sed -i 's/\"version\": \"2.13.0+cpu\"/\"version\": \"2.12.0\"/' /opt/envbuilder/manifest.json",
     "versions"),
    ("no-mpi",
     "rm -f /usr/bin/mpirun /usr/bin/mpiexec /usr/bin/orterun /usr/bin/mpirun.openmpi /usr/bin/mpiexec.openmpi",
     "mpi"),
])
def test_verify_fails_broken_images_naming_the_check(torch_image, tmp_path, name, run, failing):
    _, info, _ = torch_image
    tag = derive(info["tag"], f"envbuilder-test/broken:{name}", run, tmp_path)
    try:
        report = tmp_path / "report.json"
        r = verify("--image", tag, "--runtime", "docker", "--ranks", "2", "--report", str(report),
                   "--timeout", "120")
        assert r.code == 1, r.out + r.err[-2000:]
        failed = [c["name"] for c in json.loads(report.read_text())["checks"] if c["status"] == "fail"]
        assert failed and any(failing in n for n in failed), failed
        assert "FAIL" in r.out.upper()
    finally:
        docker("rmi", "-f", tag, check=False)


def test_unresolvable_package_fails_at_the_lock_step_before_anything_is_written(torch_image, tmp_path, ca_bundle):
    """A build locks first, then writes its folder once: a lock that cannot be resolved writes
    nothing (the folder keeps what `build --no-build` wrote there first, and gets no lock)."""
    spec = tmp_path / "bad.yaml"
    text = (RECIPES / "cpu-torch-horovod.yaml").read_text()
    spec.write_text(text.replace("name: cpu-torch-horovod", "name: cpu-torch-broken")
                    + "packages: {pip: [\"envbuilder-no-such-package==9.9.9\"]}\n")
    out = tmp_path / "out"
    r = build(spec, out, ca_bundle, "--wheelhouse", wheelhouse())      # writes the files with --no-build first
    assert r.code == 1, r.err[-2000:]
    assert "error: lock: pip:" in r.err and "envbuilder-no-such-package==9.9.9" in r.err
    assert "fix:" in r.err and "Traceback" not in r.err
    assert (out / "Dockerfile").is_file() and not (out / "envbuilder.lock").exists()
    assert "lock" not in json.loads((out / "manifest.json").read_text())


def test_a_failed_docker_step_is_named_from_the_real_build_log(tmp_path):
    """The engine reads BuildKit's own log to name the step that failed."""
    from envbuilder.engines.docker import _failed_step, buildkit_cli, docker_build_command

    require_docker()
    base = base_image()
    (tmp_path / "Dockerfile").write_text(f"FROM {base}\nRUN echo fine\nRUN echo about to fail && exit 3\n")
    cmd = docker_build_command(buildkit_cli(), tmp_path, "envbuilder-test/fails:1", None)
    proc = subprocess.run(cmd, capture_output=True, text=True, env={"DOCKER_BUILDKIT": "1", "PATH": "/usr/bin:/bin"})
    assert proc.returncode != 0
    step = _failed_step(proc.stdout.splitlines() + proc.stderr.splitlines())
    assert "echo about to fail && exit 3" in step, step
