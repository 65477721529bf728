"""Real builds: the spec's own packages are a runtime layer of their own (/opt/packages, built in
the Dockerfile's `packages` stage on top of devel and copied after the venv), so changing one pin
in packages.pip re-copies that folder and not the framework's venv, and the image still has one
Python environment in which the packages group wins.

The stack: torch 2.13 (CPU) from the wheelhouse, no MPI or Horovod (the build is the torch
install); packages.pip pins six (changed between the two builds), MarkupSafe 2.1.3 (older than the
one torch's Jinja2 brings into the venv: the lock's "overrides") and tqdm (a console script)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from apptainer_build import apptainer_build, in_apptainer_node
from conftest import run_envbuilder
from infra import base_image, docker_cli, long_build, require_docker, wheelhouse

SPEC = """\
name: packages-layer
description: torch 2.13 (CPU) with packages, for the packages-layer test
base: local/debian:bookworm-slim
framework: {{name: pytorch, version: "2.13.0+cpu"}}
python: "3.11"
targets: [docker, apptainer]
packages:
  pip: [six=={six}, MarkupSafe==2.1.3, tqdm==4.66.4]
"""
SITE = "/opt/venv/lib/python3.11/site-packages"
PROBE = r"""
import json, subprocess, sys
from importlib import metadata
import markupsafe, six, jinja2, torch
print(json.dumps({
    "six": [six.__version__, metadata.version("six"), six.__file__],
    "markupsafe": [markupsafe.__version__, metadata.version("MarkupSafe"), markupsafe.__file__],
    "jinja2_escape": str(jinja2.Template("{{ x }}", autoescape=True).render(x="<a>")),
    "torch": torch.__version__,
    "path": sys.path,
    "freeze": subprocess.run([sys.executable, "-m", "pip", "list", "--format=freeze",
                              "--disable-pip-version-check"], capture_output=True, text=True).stdout.split(),
    "tqdm": subprocess.run("command -v tqdm && tqdm --version", shell=True, capture_output=True,
                           text=True).stdout.split(),
}))
"""


def docker(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([docker_cli(), *args], capture_output=True, text=True, check=check)


def layers(tag: str) -> list[str]:
    return json.loads(docker("image", "inspect", "--format", "{{json .RootFS.Layers}}", tag).stdout)


def history(tag: str) -> list[tuple[str, int]]:
    """(created by, bytes) of each step, oldest first."""
    out = docker("history", "--no-trunc", "--human=false", "--format", "{{.CreatedBy}}\t{{.Size}}", tag).stdout
    return [(line.rsplit("\t", 1)[0], int(line.rsplit("\t", 1)[1])) for line in reversed(out.splitlines())]


def build(spec: Path, out: Path, six: str, tag: str) -> None:
    spec.write_text(SPEC.format(six=six))
    r = run_envbuilder("lock", str(spec), "--out", str(out), "--wheelhouse", wheelhouse(), timeout=900)
    assert r.code == 0, r.err[-3000:]
    r = run_envbuilder("build", str(spec), "--out", str(out), "--wheelhouse", wheelhouse(), "--tag", tag,
                       timeout=1800)
    assert r.code == 0, (r.out + r.err)[-3000:]


@pytest.fixture(scope="module")
def two_builds(tmp_path_factory):
    require_docker()
    base = base_image()
    root = tmp_path_factory.mktemp("packages-layer")
    spec, out = root / "spec.yaml", root / "out"
    tags = ("envbuilder-test/packages-layer:six-1.16", "envbuilder-test/packages-layer:six-1.17")
    build(spec, out, "1.16.0", tags[0])
    lock_before = json.loads((out / "envbuilder.lock").read_text())
    build(spec, out, "1.17.0", tags[1])
    yield tags, out, lock_before, len(layers(base))
    docker("rmi", *tags, check=False)


def test_a_changed_pin_in_packages_pip_leaves_the_venv_layer_and_copies_only_the_packages(two_builds):
    (before, after), out, _, n_base = two_builds
    dockerfile = (out / "Dockerfile").read_text()
    assert "pip install --no-cache-dir --disable-pip-version-check --target /opt/packages --require-hashes" in dockerfile
    assert dockerfile.index("COPY --from=devel /opt/venv /opt/venv") < \
        dockerfile.index("COPY --from=packages /opt/packages /opt/packages")
    one, two = layers(before), layers(after)
    # runtime stage: the base's layers, the apt step, the venv's COPY, then the packages' COPY
    venv = n_base + 1
    assert one[:venv + 1] == two[:venv + 1], "the rebuild made a new venv layer"
    assert one[venv + 1] != two[venv + 1], "the packages layer did not change with the pin"
    steps = history(after)
    sizes = {by: size for by, size in steps if by.startswith("COPY /opt/")}
    assert sizes["COPY /opt/venv /opt/venv # buildkit"] > 500e6                  # torch
    assert sizes["COPY /opt/packages /opt/packages # buildkit"] < 5e6             # six, MarkupSafe, tqdm


def test_the_image_has_one_environment_in_which_the_packages_group_wins(two_builds):
    (_, after), out, lock_before, _ = two_builds
    entry = next(e for e in lock_before["pip"]["packages"] if e["name"] == "MarkupSafe")
    assert entry["version"] == "2.1.3" and entry["overrides"] != "2.1.3"      # torch's Jinja2 brings a newer one
    proc = docker("run", "--rm", "-i", "--network", "none", "--entrypoint", "python", after, "-c", PROBE)
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["six"][:2] == ["1.17.0", "1.17.0"] and seen["six"][2].startswith("/opt/packages/")
    assert seen["markupsafe"][:2] == ["2.1.3", "2.1.3"] and seen["markupsafe"][2].startswith("/opt/packages/")
    assert seen["jinja2_escape"] == "&lt;a&gt;" and seen["torch"] == "2.13.0+cpu"
    assert seen["path"].index("/opt/packages") < seen["path"].index(SITE)
    freeze = seen["freeze"]
    for pin in ("six==1.17.0", "MarkupSafe==2.1.3", "tqdm==4.66.4", "torch==2.13.0+cpu"):
        assert pin in freeze, freeze
    assert not [p for p in freeze if p.lower().startswith("markupsafe==") and p != "MarkupSafe==2.1.3"], freeze
    assert seen["tqdm"] == ["/opt/packages/bin/tqdm", "4.66.4"]
    # the smoke suite's drift check compares every locked package inside the image
    report = out / "verify-report.json"
    r = run_envbuilder("verify", str(out), "--image", after, "--runtime", "docker", "--launcher", "none",
                       "--report", str(report), timeout=600)
    checks = {c["name"]: c for c in json.loads(report.read_text())["checks"]}
    assert checks["versions.packages"]["status"] == "pass", checks["versions.packages"]
    assert "markupsafe 2.1.3" in checks["versions.packages"]["detail"] and "six 1.17.0" in checks["versions.packages"]["detail"]
    assert r.code == 0, (r.out + r.err)[-3000:]


def test_compare_reads_the_packages_folder_and_names_the_changed_pin(two_builds):
    """`envbuilder compare` reads /opt/packages beside the site-packages: the two builds differ by
    the six pin only, in that folder."""
    (before, after), _, _, _ = two_builds
    r = run_envbuilder("compare", before, after, "--json", timeout=600)
    data = json.loads(r.out)["compare"]["python"]
    assert (data["only_a"], data["only_b"]) == (["six==1.16.0"], ["six==1.17.0"]), data
    assert data["same"] > 10                                 # torch and its dependencies, tqdm, MarkupSafe


@long_build
def test_apptainer_builds_the_packages_group_into_the_same_environment(two_builds, tmp_path):
    """The definition file folds the packages stage into devel and copies /opt/packages into the
    final stage: the second build's lock built by the real Apptainer (unprivileged), its .sif
    holding the same Python and OS packages as the Docker image (`envbuilder compare`), the
    packages group winning in it as in the Docker image, verify (one rank) passing under Apptainer."""
    (_, after), out, _, _ = two_builds
    work = tmp_path / "work"
    work.mkdir()
    spec = work / "packages-layer.yaml"                  # where the user builder reads it
    spec.write_text((out.parent / "spec.yaml").read_text())
    built, b, seconds = apptainer_build(spec, out / "envbuilder.lock", work, "--wheelhouse", wheelhouse())
    sif = built / "packages-layer.sif"
    try:
        assert b.returncode == 0, b.stdout[-3000:] + b.stderr[-3000:]
        assert "(%test: the smoke suite passed)" in b.stdout, b.stdout
        probe = in_apptainer_node([str(work)], "apptainer", "exec", str(sif), "python", "-c", PROBE)
        assert probe.returncode == 0, probe.stderr[-2000:]
        seen = json.loads(probe.stdout.strip().splitlines()[-1])
        assert seen["six"][:2] == ["1.17.0", "1.17.0"] and seen["six"][2].startswith("/opt/packages/")
        assert seen["markupsafe"][:2] == ["2.1.3", "2.1.3"] and seen["markupsafe"][2].startswith("/opt/packages/")
        assert seen["path"].index("/opt/packages") < seen["path"].index(SITE)
        assert seen["tqdm"] == ["/opt/packages/bin/tqdm", "4.66.4"]
        c = run_envbuilder("compare", str(sif), after, timeout=900)
        assert c.code == 0, c.out[-3000:] + c.err[-3000:]
        assert "Python packages: the same (" in c.out and "OS packages (dpkg): the same (" in c.out, c.out
        print(f"\napptainer build of the packages group: {seconds:.0f} s, {sif.stat().st_size / 1e6:.0f} MB")
    finally:
        sif.unlink(missing_ok=True)
