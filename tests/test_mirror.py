"""The presets' public base through a registry mirror (issue 46): this machine stands in for Docker
Hub with the loopback registry of .ci/start-registry.sh, which .ci/mirror-bases.sh fills with
`library/debian:bookworm-slim` (a multi-arch index: amd64 + arm64) and names as the mirror of
every engine and of envbuilder's site config. What a user sees: the lock pins the index digest and
the platform's manifest digest the registry serves; the recipes name that manifest; Docker pulls it
through its registry-mirrors; an unanswering mirror and a digest the registry no longer serves
are each named, with the fix."""

from __future__ import annotations

import json
import re
import subprocess
import urllib.request
import uuid

import pytest
from dockerfile_parse import DockerfileParser

from conftest import RECIPES, run_envbuilder
from infra import REGISTRY, base_image, docker_cli, require_docker, require_registry, wheelhouse

LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"


def served_index() -> dict:
    """What the mirror serves for debian:bookworm-slim, read without envbuilder: {platform: digest, 'index': digest}."""
    require_registry()
    req = urllib.request.Request(f"http://{REGISTRY}/v2/library/debian/manifests/bookworm-slim",
                                 headers={"Accept": LIST})
    try:
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(req, timeout=10) as resp:
            body, digest = resp.read(), resp.headers["Docker-Content-Digest"]
    except OSError as exc:
        pytest.fail(f"the mirror does not serve library/debian:bookworm-slim ({exc}): run bash .ci/mirror-bases.sh")
    out = {f"{m['platform']['os']}/{m['platform']['architecture']}": m["digest"] for m in json.loads(body)["manifests"]}
    out["index"] = digest
    return out


def mirror_config(tmp_path, mirror: str) -> dict:
    """The environment of a machine whose site config names MIRROR (and this machine's CA bundle)."""
    conf = tmp_path / "site-config.toml"
    conf.write_text(f'registry_mirror = "{mirror}"\nca_bundle = "{CA_BUNDLE}"\n')
    return {"ENVBUILDER_CONFIG": str(conf)}


def test_the_mirror_serves_both_platforms_and_docker_pulls_through_it():
    index = served_index()
    assert {"linux/amd64", "linux/arm64", "index"} <= set(index), index
    require_docker()
    info = subprocess.run([docker_cli(), "info", "--format", "{{json .RegistryConfig.Mirrors}}"],
                          capture_output=True, text=True, check=True)
    assert f"http://{REGISTRY}/" in json.loads(info.stdout), info.stdout
    # the arm64 image by its manifest digest, as a build of an aarch64 preset pulls it
    ref = f"debian:bookworm-slim@{index['linux/arm64']}"
    pull = subprocess.run([docker_cli(), "pull", "-q", ref], capture_output=True, text=True, timeout=300)
    assert pull.returncode == 0, pull.stderr
    arch = subprocess.run([docker_cli(), "image", "inspect", "-f", "{{.Architecture}}", ref],
                          capture_output=True, text=True, check=True)
    assert arch.stdout.strip() == "arm64"


@pytest.fixture(scope="module")
def aarch64_lock(tmp_path_factory):
    """The aarch64 DDP preset locked through the mirror (its apt and pip resolved in the arm64 image)."""
    require_docker()
    index = served_index()
    out = tmp_path_factory.mktemp("mirror") / "cpu-torch-ddp-aarch64"
    r = run_envbuilder("lock", str(RECIPES / "cpu-torch-ddp-aarch64.yaml"), "--out", str(out), timeout=1200)
    assert r.code == 0, r.out[-2000:] + r.err[-2000:]
    return out, index


def test_the_lock_pins_the_index_and_the_platform_manifest_the_registry_serves(aarch64_lock):
    out, index = aarch64_lock
    lock = json.loads((out / "envbuilder.lock").read_text())
    for stage in ("devel", "runtime"):
        assert lock["base"][stage] == {
            "ref": "debian:bookworm-slim", "kind": "repo-digest", "digest": index["index"],
            "manifest_digest": index["linux/arm64"], "platform": "linux/arm64",
            "pinned": f"debian:bookworm-slim@{index['linux/arm64']}"}, lock["base"][stage]
    # apt ran in that arm64 image (under QEMU) and pip took aarch64 wheels only
    apt_arches = {e["arch"] for entries in lock["apt"].values() for e in entries}
    assert apt_arches <= {"arm64", "all"} and "arm64" in apt_arches, apt_arches
    files = [e["file"] for group in lock["pip"].values() for e in group]
    binary = [f for f in files if not f.endswith("-none-any.whl")]
    assert binary and all("aarch64" in f for f in binary), files
    assert any(f.startswith("torch-2.10.0-") for f in files), files
    # the recipes written from that lock name exactly that image, for that platform
    r = run_envbuilder("build", str(RECIPES / "cpu-torch-ddp-aarch64.yaml"), "--out", str(out), "--no-build")
    assert r.code == 0, r.err
    parser = DockerfileParser(path=str(out / "Dockerfile"))
    froms = [i["value"] for i in parser.structure if i["instruction"] == "FROM"]
    assert froms == [f"--platform=linux/arm64 debian:bookworm-slim@{index['linux/arm64']} AS devel",
                     f"--platform=linux/arm64 debian:bookworm-slim@{index['linux/arm64']} AS runtime"], froms
    definition = (out / "Apptainer.def").read_text()
    assert re.findall(r"^Bootstrap: (\S+)\nFrom: (\S+)$", definition, re.M) == \
        [("docker", f"debian:bookworm-slim@{index['linux/arm64']}")] * 2
    assert "apptainer build --arch arm64 " in definition


def test_a_mirror_that_does_not_answer_is_named(tmp_path, write_spec):
    """A base the engine does not hold, through a mirror nothing answers on: exit 1, the mirror named."""
    require_docker()
    spec = write_spec((RECIPES / "cpu-torch-ddp.yaml").read_text().replace(
        "base: debian:bookworm-slim", "base: debian:forky-slim\nbase_os: debian-bookworm"))
    r = run_envbuilder("lock", str(spec), "--out", str(tmp_path / "out"), env=mirror_config(tmp_path, "http://127.0.0.1:9"),
                       timeout=300)
    assert r.code == 1, r.out + r.err
    assert "error: lock: base: cannot reach the registry mirror http://127.0.0.1:9 to resolve debian:forky-slim" in r.err, r.err
    assert "fix: " in r.err and "Traceback" not in r.err
    assert not (tmp_path / "out" / "envbuilder.lock").exists()


def test_a_digest_the_registry_no_longer_serves_is_named_with_lock_update_base(tmp_path, write_spec):
    """A base locked through the mirror, then deleted from the registry (a tag rebuilt upstream and
    the old manifest gone): the build stops before the engine builds anything, naming the locked
    digest and `envbuilder lock SPEC --update base`."""
    require_docker()
    require_registry()
    tag = f"doomed-{uuid.uuid4().hex[:12]}"
    pushed = f"{REGISTRY}/library/debian:{tag}"
    (tmp_path / "ctx").mkdir()
    (tmp_path / "ctx" / "Dockerfile").write_text(f"FROM {base_image()}\nLABEL envbuilder.test={tag}\n")
    subprocess.run([docker_cli(), "build", "-q", "-t", pushed, str(tmp_path / "ctx")], check=True, capture_output=True)
    subprocess.run([docker_cli(), "push", "-q", pushed], check=True, capture_output=True)
    subprocess.run([docker_cli(), "rmi", pushed], check=True, capture_output=True)
    out = tmp_path / "out"
    spec = write_spec((RECIPES / "cpu-torch-ddp.yaml").read_text().replace(
        "base: debian:bookworm-slim", f"base: debian:{tag}\nbase_os: debian-bookworm"))
    r = run_envbuilder("lock", str(spec), "--out", str(out), "--wheelhouse", wheelhouse(), timeout=900)
    assert r.code == 0, r.err[-2000:]
    pinned = json.loads((out / "envbuilder.lock").read_text())["base"]["devel"]["pinned"]
    digest = pinned.partition("@")[2]
    assert pinned.startswith(f"debian:{tag}@sha256:")
    # the engine forgets it, the registry deletes it
    subprocess.run([docker_cli(), "rmi", "-f", pinned], capture_output=True)
    images = subprocess.run([docker_cli(), "images", "-q", "--filter", f"label=envbuilder.test={tag}"],
                            capture_output=True, text=True, check=True).stdout.split()
    if images:
        subprocess.run([docker_cli(), "rmi", "-f", *images], check=True, capture_output=True)
    delete = urllib.request.Request(f"http://{REGISTRY}/v2/library/debian/manifests/{digest}", method="DELETE")
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(delete, timeout=10) as resp:
        assert resp.status == 202
    r = run_envbuilder("build", str(spec), "--out", str(out), "--wheelhouse", wheelhouse(), timeout=600)
    assert r.code == 1, r.out + r.err
    assert f"error: base: cannot pull the locked base {pinned}" in r.err, r.err
    assert "envbuilder lock SPEC --update base" in r.err and "Traceback" not in r.err
    assert not (out / "image.json").exists()
