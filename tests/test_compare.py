"""`envbuilder compare A B`: what two images hold, side by side (files, Python and OS packages),
each read from its file tree without running it: a .sif (squashfuse), an image in the Docker engine
(docker export) or in buildah's storage. Here: the Docker engine's images (a .sif against the
Dockerfile's image: tests/test_sif.py; Apptainer's .sif against it: tests/apptainer_build.py, for
every CPU preset in CI), the refusals, and every preset's definition file as Apptainer reads it.

Bad input (no such file or image, a file that is no .sif) is one message naming it and the fix,
exit 2, no traceback; packages that differ are exit 1, each listed."""

from __future__ import annotations

import json
import re
import subprocess
import uuid

import pytest

from conftest import RECIPES, run_envbuilder
from infra import base_image, docker_cli, require_docker

SECTION = re.compile(r"^%(\w+)(?: from (\S+))?", re.M)


def stages_of(text: str) -> list[dict[str, str]]:
    """The definition file's stages (split at each Bootstrap: line), each section's body by name
    ("files from devel" for %files from devel), as Apptainer's parser splits them."""
    stages = []
    for chunk in re.split(r"^(?=Bootstrap:)", text, flags=re.M)[1:]:
        parts = SECTION.split(chunk)
        sections = {}
        for i in range(1, len(parts) - 1, 3):
            name = parts[i] + (f" from {parts[i + 1]}" if parts[i + 1] else "")
            sections[name] = parts[i + 2]
        stages.append(sections)
    return stages


@pytest.mark.parametrize("folder", sorted(p.parent.name for p in (RECIPES.parent / "images").glob("*/Apptainer.def")))
def test_every_presets_definition_file_parses_and_its_pip_steps_can_trust_a_proxy(folder):
    """Each %post step of every generated file that downloads reads the CA bundle and netrc bound
    at build time (`apptainer build --bind`), as the Dockerfile's steps read BuildKit's secrets:
    without them %post's pip cannot reach PyPI behind a TLS-intercepting proxy (the first real
    Apptainer build showed it); every stage's %setup makes the bind points a build cannot."""
    text = (RECIPES.parent / "images" / folder / "Apptainer.def").read_text()
    stages = stages_of(text)
    assert {"environment", "runscript", "labels"} <= set(stages[-1])
    for stage in stages:
        post = stage.get("post")
        assert post is not None
        steps = post.split("    (\n")[1:]
        downloading = [s for s in steps if "PIP_FIND_LINKS=/wheelhouse" in s]
        for step in downloading:
            assert "if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca CURL_CA_BUNDLE=/run/secrets/ca; fi" in step
            assert "if [ -s /run/secrets/netrc ]; then export NETRC=/run/secrets/netrc; fi" in step
    # an aarch64 image's example asks for its architecture (Apptainer takes the machine's otherwise)
    manifest = json.loads((RECIPES.parent / "images" / folder / "manifest.json").read_text())
    arch = "--arch arm64 " if manifest["expect"].get("arch") == "aarch64" else ""
    assert f"apptainer build {arch}--bind /etc/ssl/certs/ca-certificates.crt:/run/secrets/ca:ro" in text
    # every stage makes the bind points (a build cannot), /wheelhouse unless its %files copies it
    for stage in stages:
        setup = stage.get("setup")
        assert setup is not None and 'touch "${APPTAINER_ROOTFS}"/run/secrets/ca "${APPTAINER_ROOTFS}"/run/secrets/netrc' \
            in setup
        copied = any(line.split()[-1:] == ["/wheelhouse"] for key, body in stage.items() if key.startswith("files")
                     for line in body.splitlines())
        assert ('"${APPTAINER_ROOTFS}"/wheelhouse' in setup) is not copied


# --- the Docker engine's images -------------------------------------------------------------------

@pytest.fixture(scope="module")
def base_less_a_package():
    """The local base and a copy whose dpkg status lacks one package (docker commit: seconds)."""
    require_docker()
    base = base_image()
    tag = f"envbuilder-test/compare:{uuid.uuid4().hex[:8]}"
    ctr = f"envbuilder-compare-{uuid.uuid4().hex[:8]}"
    docker = docker_cli()
    subprocess.run([docker, "run", "--name", ctr, base, "sh", "-c",
                    "awk -v RS= -v ORS='\\n\\n' '!/^Package: hostname\\n/' /var/lib/dpkg/status > /tmp/s && "
                    "cat /tmp/s > /var/lib/dpkg/status && rm /tmp/s"], check=True, capture_output=True)
    subprocess.run([docker, "commit", ctr, tag], check=True, capture_output=True)
    subprocess.run([docker, "rm", "-f", ctr], capture_output=True)
    yield base, tag
    subprocess.run([docker, "rmi", "-f", tag], capture_output=True)


def test_an_image_compared_with_itself_is_the_same(base_less_a_package):
    base, _ = base_less_a_package
    r = run_envbuilder("compare", base, base, timeout=300)
    assert r.code == 0, r.out + r.err
    assert re.search(r"^OS packages \(dpkg\): the same \(\d+, name=version\)$", r.out, re.M), r.out
    assert f"A (docker): {base}  [" in r.out and f"B (docker): {base}  [" in r.out, r.out
    assert re.search(r"^files: \d+ the same; 0 only in A, 0 only in B, 0 differ", r.out, re.M), r.out


def test_a_package_only_one_image_holds_fails_naming_it(base_less_a_package):
    base, less = base_less_a_package
    r = run_envbuilder("compare", base, less, timeout=300)
    assert r.code == 1, r.out + r.err
    assert re.search(r"^  A only  hostname=\S+$", r.out, re.M), r.out
    assert re.search(r"^  differ  /var/lib/dpkg/status: size, content$", r.out, re.M), r.out
    assert "error: compare: the two images do not hold the same Python and OS packages (listed above)" in r.err
    assert "Traceback" not in r.err
    j = run_envbuilder("compare", base, less, "--json", timeout=300)
    data = json.loads(j.out)
    assert j.code == 1 and data["ok"] is False and data["compare"]["same_packages"] is False
    assert [p.split("=")[0] for p in data["compare"]["dpkg"]["only_a"]] == ["hostname"]


# --- bad input --------------------------------------------------------------------------------------

@pytest.mark.parametrize("make,message", [
    (lambda tmp: str(tmp / "missing.sif"), "error: IMAGE: {a}: no such .sif file"),
    (lambda tmp: (tmp / "x.sif").write_text("not a sif") and str(tmp / "x.sif"), "error: IMAGE: {a} is too short to be a SIF file"),
    (lambda tmp: "envbuilder-test/no-such:image", "error: IMAGE: image envbuilder-test/no-such:image is neither a "
     ".sif file, nor in buildah's storage, nor in the Docker engine"),
])
def test_an_image_compare_cannot_read_is_named_with_the_fix(tmp_path, make, message):
    a = make(tmp_path)
    r = run_envbuilder("compare", a, "local/debian:bookworm-slim")
    assert r.code == 2, r.out + r.err
    assert message.format(a=a) in r.err and "fix: " in r.err and "Traceback" not in r.err, r.err
