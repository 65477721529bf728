"""The definition file executed with buildah (`envbuilder defexec`): a preset's Apptainer.def run
section by section as Apptainer runs it (no Apptainer here), the image it gives verified with 2
ranks, and compared with the Dockerfile's image of the same lock: the same Python and OS packages
(asserted), the files that differ printed.

Here: every preset's file parsed, and the refusals; the shared helper that executes a preset's file
and compares it serves tests/test_defexec_presets.py (cpu-torch), tests/test_intel_tf.py and
tests/test_distributed_tf.py. cpu-torch-ddp's file, executed here with buildah until Apptainer ran
on these machines, is built by the real Apptainer in tests/test_apptainer.py.

Bad input (no definition file, a stage envbuilder cannot run, a %post that fails) is one
message naming the step and the fix, no traceback."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from conftest import RECIPES, run_envbuilder
from infra import base_image, docker_cli, keep_for_run, require_binary, require_docker

CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"


def docker(*args: str, check: bool = False) -> subprocess.CompletedProcess:
    return subprocess.run([docker_cli(), *args], capture_output=True, text=True, check=check)


def needs_engines() -> None:
    require_docker()
    base_image()
    require_binary("buildah", "run .ci/install-system.sh")
    if os.geteuid() != 0:
        pytest.skip("defexec runs buildah as root (buildah mount)")


def locked_and_built(recipe: Path, out: Path, *extra: str) -> tuple[str, float]:
    """A locked output folder of RECIPE and its Dockerfile's image (Docker): (tag, build seconds)."""
    r = run_envbuilder("lock", str(recipe), "--out", str(out), *extra, timeout=900)
    assert r.code == 0, r.err[-2000:]
    probe = run_envbuilder("build", str(recipe), "--no-build", "--out", str(out))
    assert probe.code == 0, probe.err
    tag = json.loads((out / "manifest.json").read_text())["image"]["tag"]
    keep_for_run(tag)
    t0 = time.time()
    r = run_envbuilder("build", str(recipe), "--out", str(out), "--ca-bundle", CA_BUNDLE, *extra, timeout=3600)
    assert r.code == 0, r.err[-3000:]
    return tag, time.time() - t0


def defexec(out: Path, docker_tag: str, *extra: str):
    """`envbuilder defexec OUT --export --compare DOCKER_TAG`: (its result, seconds, defexec.json's
    record or {} when it wrote none)."""
    t0 = time.time()
    r = run_envbuilder("defexec", str(out), "--ca-bundle", CA_BUNDLE, "--export", "--compare", docker_tag, *extra,
                       timeout=3600)
    seconds = time.time() - t0
    record = json.loads((out / "defexec.json").read_text()) if (out / "defexec.json").is_file() else {}
    return r, seconds, record


def remove_def_image(tag: str) -> None:
    docker("rmi", "-f", tag)
    subprocess.run(["buildah", "rmi", "-f", tag], capture_output=True)


def definition_file_executed_verified_and_compared(out: Path, docker_tag: str, *extra: str,
                                                    verify_extra: tuple[str, ...] = (),
                                                    compare_json: bool = False) -> str:
    """OUT's Apptainer.def executed with buildah (EXTRA: defexec's options), its image compared with
    the Dockerfile's DOCKER_TAG (the same Python and OS packages) and verified with 2 ranks; the
    image removed after. The presets' tests share this (tests/test_defexec_presets.py,
    tests/test_intel_tf.py, tests/test_distributed_tf.py). Returns a line of figures."""
    r, seconds, record = defexec(out, docker_tag, *extra)
    try:
        print("\n" + r.out)
        assert_same_packages(r, docker_tag)
        assert record["what"] == "definition file executed with buildah"
        if compare_json:
            # --compare-only: the image already made, compared again; --json lists every difference
            j = run_envbuilder("defexec", str(out), "--compare-only", "--compare", docker_tag, "--json", timeout=600)
            assert j.code == 0, j.err[-2000:]
            data = json.loads(j.out)
            diff = data["compare"]
            assert data["ok"] is True and "image" not in data and diff["same_packages"] is True
            assert diff["a"]["ref"] == record["tag"] and diff["b"]["ref"] == docker_tag
            assert {x["path"] for x in diff["files"]["only_a"]} >= {"/.singularity.d", "/environment", "/singularity"}
            print(f"files that differ: {[x['path'] for x in diff['files']['differ']]}")
        t0 = time.time()
        v = run_envbuilder("verify", str(out), "--image", record["tag"], "--runtime", "docker", "--ranks", "2",
                           *verify_extra, timeout=1800)
        assert v.code == 0, v.out[-3000:] + v.err[-3000:]
        return (f"definition file executed with buildah {record['seconds']:.0f} s (with the comparison "
                f"{seconds:.0f} s), {record['size_bytes'] / 1e6:.0f} MB; verify 2 ranks {time.time() - t0:.0f} s")
    finally:
        if record.get("tag"):
            remove_def_image(record["tag"])


def assert_same_packages(r, docker_tag: str) -> None:
    assert r.code == 0, r.out[-3000:] + r.err[-3000:]
    assert "Traceback" not in r.err
    assert re.search(r"^Python packages: the same \(\d+, name==version\)$", r.out, re.M), r.out
    assert re.search(r"^OS packages \(dpkg\): the same \(\d+, name=version\)$", r.out, re.M), r.out
    assert "B (the Dockerfile's image):" in r.out and docker_tag in r.out


# --- every preset's definition file, without an engine ------------------------------------------

@pytest.mark.parametrize("folder", sorted(p.parent.name for p in (RECIPES.parent / "images").glob("*/Apptainer.def")))
def test_every_presets_definition_file_parses_and_its_pip_steps_can_trust_a_proxy(folder):
    """The parser defexec runs takes every generated file; each %post step that downloads reads the
    CA bundle and netrc bound at build time (`apptainer build --bind`), as the Dockerfile's steps
    read BuildKit's secrets: without them %post's pip cannot reach PyPI behind a TLS-intercepting
    proxy (what executing the file here showed)."""
    from envbuilder.defexec.deffile import parse

    text = (RECIPES.parent / "images" / folder / "Apptainer.def").read_text()
    stages = parse(text)
    assert stages[-1].section("environment") and stages[-1].section("runscript") and stages[-1].section("labels")
    for stage in stages:
        post = stage.section("post")
        assert post is not None
        steps = post.body.split("    (\n")[1:]
        downloading = [s for s in steps if "PIP_FIND_LINKS=/wheelhouse" in s]
        for step in downloading:
            assert "if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca CURL_CA_BUNDLE=/run/secrets/ca; fi" in step
            assert "if [ -s /run/secrets/netrc ]; then export NETRC=/run/secrets/netrc; fi" in step
    assert "apptainer build --bind /etc/ssl/certs/ca-certificates.crt:/run/secrets/ca:ro" in text
    # every stage makes the bind points (a build cannot), /wheelhouse unless its %files copies it
    for stage in stages:
        setup = stage.section("setup")
        assert setup is not None and 'touch "${APPTAINER_ROOTFS}"/run/secrets/ca "${APPTAINER_ROOTFS}"/run/secrets/netrc' \
            in setup.body
        copied = any(dst == "/wheelhouse" for _, pairs in stage.files() for _, dst in pairs)
        assert ('"${APPTAINER_ROOTFS}"/wheelhouse' in setup.body) is not copied


# --- bad input --------------------------------------------------------------------------------------

def small_folder(tmp_path: Path, definition: str) -> Path:
    folder = tmp_path / "out"
    folder.mkdir()
    shutil.copy(RECIPES.parent / "images" / "cpu-torch-ddp" / "manifest.json", folder / "manifest.json")
    (folder / "Apptainer.def").write_text(definition)
    return folder


def test_a_failing_post_names_the_stage_and_the_command_under_sh(tmp_path):
    """%post runs under /bin/sh (dash on Debian), not bash: a bash-only test fails there, as it
    would in `apptainer build`, and the message names the stage and the line."""
    needs_engines()
    folder = small_folder(tmp_path, "Bootstrap: docker-daemon\nFrom: local/debian:bookworm\nStage: only\n\n"
                          "%post\n    echo fine\n    [[ -d /opt ]]\n    echo never\n")
    r = run_envbuilder("defexec", str(folder), "--tag", "localhost/envbuilder-test/defexec:fails", timeout=300)
    assert r.code == 1, r.out + r.err
    assert "error: definition file: %post of stage only: /bin/sh -ex exited 127; the last command: [[ -d /opt ]]" in r.err
    assert f"fix: the full log is {folder / 'defexec.log'}" in r.err and "Traceback" not in r.err
    assert "[[: not found" in (folder / "defexec.log").read_text()
    assert subprocess.run(["buildah", "inspect", "--type", "image", "localhost/envbuilder-test/defexec:fails"],
                          capture_output=True).returncode != 0
    # its own working containers are gone (the other worker may be executing a definition file
    # of its own at this moment: only the names this run's log records are this run's)
    mine = re.findall(r"^\$ buildah from .*--name (envbuilder-defexec-[0-9a-f]+) ", (folder / "defexec.log").read_text(), re.M)
    assert mine, "the log names no working container"
    leftover = subprocess.run(["buildah", "containers", "--format", "{{.ContainerName}}"], capture_output=True, text=True)
    assert not set(mine) & set(leftover.stdout.split()), leftover.stdout


@pytest.mark.parametrize("definition,message", [
    ("Bootstrap: library\nFrom: alpine\n\n%post\n    true\n",
     "stage 1: Bootstrap: library cannot be run here (envbuilder writes docker-daemon or docker)"),
    ("Bootstrap: docker-daemon\n\n%post\n    true\n", "stage 1: Bootstrap: docker-daemon has no From: line"),
    ("Bootstrap: docker-daemon\nFrom: local/debian:bookworm\n\n%startscript\n    true\n",
     "line 4: section %startscript is not one envbuilder writes"),
    ("Bootstrap: docker-daemon\nFrom: local/debian:bookworm\n\n%files from devel\n    /a /a\n",
     "%files from devel: no earlier stage has that name"),
    ("%post\n    true\n", "line 1: %post comes before any Bootstrap: line"),
])
def test_a_definition_file_envbuilder_cannot_run_is_refused(tmp_path, definition, message):
    folder = small_folder(tmp_path, definition)
    r = run_envbuilder("defexec", str(folder))
    assert r.code == 2, r.out + r.err
    assert message in r.err and "fix: write it again from the spec: envbuilder build SPEC --no-build" in r.err
    assert "Traceback" not in r.err


def test_a_folder_without_a_definition_file_is_refused(tmp_path):
    folder = small_folder(tmp_path, "")
    (folder / "Apptainer.def").unlink()
    r = run_envbuilder("defexec", str(folder))
    assert r.code == 2 and f"FOLDER: {folder} has no Apptainer.def" in r.err, r.err
    assert "lists apptainer in targets" in r.err and "Traceback" not in r.err
    r = run_envbuilder("defexec", str(folder), "--compare-only")
    assert r.code == 2 and "--compare-only: there is nothing to compare with" in r.err and "fix: add --compare IMAGE" in r.err
    (folder / "Apptainer.def").write_text("Bootstrap: docker-daemon\nFrom: local/debian:bookworm\n")
    r = run_envbuilder("defexec", str(folder), "--compare-only", "--compare", "envbuilder-test/no-such:image",
                       "--tag", "envbuilder-test/no-such:def")
    assert r.code == 2 and "--compare: image envbuilder-test/no-such:def is neither in buildah's storage nor in " \
        "the Docker engine" in r.err and "fix: execute the definition file first" in r.err, r.err
