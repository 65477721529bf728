"""envbuilder.lock: one lock pins every part of a stack (base digest, OS packages, source tarballs,
Python packages with sha256 for the image's Python, conda packages), renders byte-identical
recipes, and refuses a lock that is corrupt, edited by hand, or for another spec.

The real resolvers run here: pip against PyPI (and the local torch wheelhouse), apt in a
container of the local Debian base, the base image's ID from the Docker engine."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import RECIPES, ROOT, run_envbuilder
from infra import TORCH_WHEEL, base_image, require_docker, venv_tool, wheelhouse

CONDA_DATA = ROOT / "tests" / "data" / "conda"


@pytest.fixture(scope="module")
def torch_lock(tmp_path_factory):
    """`envbuilder lock` of the cpu-torch preset, resolved for real once for this module."""
    require_docker()
    base_image()
    out = tmp_path_factory.mktemp("lock") / "cpu-torch"
    r = run_envbuilder("lock", str(RECIPES / "cpu-torch-horovod.yaml"), "--out", str(out),
                       "--wheelhouse", wheelhouse(), "--json", timeout=900)
    assert r.code == 0, r.err[-3000:]
    return out / "envbuilder.lock", json.loads(r.out)


def read(path: Path) -> dict:
    return json.loads(path.read_text())


def relock(path: Path, edit) -> None:
    """Change a lock through the model and write it with fresh seals (a consistent lock)."""
    from envbuilder.lock import dump, load

    lock = load(path)
    edit(lock)
    path.write_text(dump(lock))


# --- what the lock holds ------------------------------------------------------------------------

def test_lock_pins_every_kind_with_hashes(torch_lock):
    path, report = torch_lock
    lock = read(path)
    client = require_docker()
    # the public base, through the set-up's Docker Hub mirror: the index digest and the amd64
    # manifest's, which the engine pulled (tests/test_mirror.py reads the mirror itself)
    entry = lock["base"]["devel"]
    assert entry["ref"] == "debian:bookworm-slim" and entry["kind"] == "repo-digest", entry
    assert entry["platform"] == "linux/amd64" and entry["pinned"] == f"debian:bookworm-slim@{entry['manifest_digest']}"
    assert entry["digest"] != entry["manifest_digest"] and lock["base"]["runtime"] == entry
    assert client.images.get(entry["pinned"]).attrs["Architecture"] == "amd64"
    # OS packages: the whole closure of each stage, every one with its version and .deb sha256
    runtime = {e["name"]: e for e in lock["apt"]["runtime"]}
    for name in ("python3", "openmpi-bin", "libopenmpi3", "ca-certificates"):
        assert name in runtime, name
    assert len(lock["apt"]["devel"]) > 50 and all(e["version"] for e in lock["apt"]["devel"])
    assert all(e["sha256"] for e in lock["apt"]["runtime"] if not e.get("in_base"))
    # source tarballs
    hv = next(s for s in lock["sources"] if s["name"] == "horovod")
    assert hv["sha256"] == "92a43f5a94c43907a56805bad15f19700c62ffc83b7ca483f9e104e229f67ef0"
    assert "PyPI" in hv["checked"]
    # Python packages: exact versions and sha256 for cp311 / manylinux, torch from the wheelhouse
    pip = {e["name"].lower(): e for g in lock["pip"].values() for e in g}
    torch = pip["torch"]
    assert torch["version"] == "2.13.0+cpu" and torch["from"] == "wheelhouse"
    assert torch["sha256"] == hashlib.sha256((Path(wheelhouse()) / TORCH_WHEEL).read_bytes()).hexdigest()
    assert {"filelock", "sympy", "networkx", "jinja2"} <= {e["name"].lower() for e in lock["pip"]["framework"]}
    assert {"cloudpickle", "psutil", "pyyaml"} <= set(pip)
    assert pip["pip"]["version"] == "24.0"
    for e in pip.values():
        assert len(e["sha256"]) == 64
        assert e["file"].endswith(".whl") and ("cp311" in e["file"] or "py3" in e["file"] or "abi3" in e["file"])
    # the record: resolver versions and the time
    assert lock["resolved_at"].endswith("Z")
    assert {"pip", "docker", "apt", "envbuilder"} <= set(lock["resolvers"])
    assert report["counts"]["pip"] == len(pip)


def test_build_no_build_renders_from_the_lock_byte_identically(torch_lock, tmp_path):
    path, _ = torch_lock
    copy_dir = tmp_path / "elsewhere" / "deep"
    copy_dir.mkdir(parents=True)
    shutil.copy(RECIPES / "cpu-torch-horovod.yaml", copy_dir / "spec.yaml")
    shutil.copy(path, copy_dir / "my.lock")
    a = run_envbuilder("build", str(RECIPES / "cpu-torch-horovod.yaml"), "--no-build", "--out", str(tmp_path / "a"),
                       "--lock", str(path))
    b = run_envbuilder("build", "spec.yaml", "--no-build", "--out", str(tmp_path / "b"), "--lock", "my.lock",
                       cwd=copy_dir, env={"TZ": "Pacific/Chatham", "LC_ALL": "C", "LANG": "C",
                                          "SOURCE_DATE_EPOCH": "1"})
    assert a.code == 0 and b.code == 0, a.err + b.err
    files_a = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*") if p.is_file())
    files_b = sorted(p.relative_to(tmp_path / "b") for p in (tmp_path / "b").rglob("*") if p.is_file())
    assert files_a == files_b
    for rel in files_a:
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes(), rel
    out = tmp_path / "a"
    assert (out / "envbuilder.lock").read_bytes() == path.read_bytes()
    docker = (out / "Dockerfile").read_text()
    assert docker.count("--require-hashes --no-deps -r /pins/pip-") == 3          # python, framework, horovod
    assert "xargs -a /pins/apt-devel.txt" in docker and "xargs -a /pins/apt-runtime.txt" in docker
    assert "--no-build-isolation --no-deps /tmp/horovod/horovod-0.28.1" in docker
    assert "SOURCE_DATE_EPOCH=" in docker
    assert "COPY pins /pins" not in docker                                     # bind mounts, not layers
    lint = subprocess.run([venv_tool("hadolint"), "--no-color", "--format", "json",
                           str(out / "Dockerfile")], capture_output=True, text=True)
    assert json.loads(lint.stdout or "[]") == []                # with a lock: not even DL3008
    apptainer = (out / "Apptainer.def").read_text()
    assert "pins /pins" in apptainer and "rm -rf /pins" in apptainer
    lock = read(path)
    req = (out / "pins" / "pip-framework.txt").read_text()
    for e in lock["pip"]["framework"]:
        assert f"{e['name']}=={e['version']} --hash=sha256:{e['sha256']}" in req
    assert (out / "pins" / "apt-runtime.txt").read_text().count("\n") == len(lock["apt"]["runtime"])
    manifest = read(out / "manifest.json")
    # the smoke suite's drift check gets every locked Python package, and the OS packages
    locked = {e["name"].lower().replace("_", "-"): e["version"] for g in lock["pip"].values() for e in g}
    assert manifest["expect"]["packages"] == dict(sorted(locked.items()))
    assert manifest["expect"]["apt"]["python3"] == next(e["version"] for e in lock["apt"]["runtime"]
                                                        if e["name"] == "python3")
    assert manifest["lock"]["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert manifest["files"]["envbuilder.lock"] == manifest["lock"]["sha256"]


# --- bad locks: one message naming the entry, exit 2, no traceback ------------------------------

def _no_build(path: Path, tmp_path: Path, spec: Path = RECIPES / "cpu-torch-horovod.yaml"):
    return run_envbuilder("build", str(spec), "--no-build", "--out", str(tmp_path / "o"), "--lock", str(path))


def test_a_lock_that_no_longer_matches_the_spec_is_refused_naming_the_entries(torch_lock, tmp_path):
    path, _ = torch_lock
    spec = tmp_path / "spec.yaml"
    spec.write_text((RECIPES / "cpu-torch-horovod.yaml").read_text().replace(
        "horovod: {version", "packages: {pip: [six==1.16.0], apt: [git]}\nhorovod: {version"))
    r = _no_build(path, tmp_path, spec)
    assert r.code == 2, r.err
    assert "envbuilder.lock: does not match the spec" in r.err
    assert "pip.packages: six==1.16.0 is in the spec, not in the lock" in r.err
    assert "apt.runtime: git is in the spec, not in the lock" in r.err
    assert "envbuilder lock SPEC" in r.err and "Traceback" not in r.err
    assert not (tmp_path / "o").exists()
    # a real build says so too, before it asks any engine for anything
    built = run_envbuilder("build", str(spec), "--out", str(tmp_path / "o"), "--lock", str(path),
                           env={"DOCKER_HOST": f"unix://{tmp_path}/no-such.sock"})
    assert built.code == 2 and "envbuilder.lock: does not match the spec" in built.err, built.err
    assert "Docker engine" not in built.err and not (tmp_path / "o").exists()


def test_a_lock_for_another_spec_is_refused(torch_lock, tmp_path):
    path, _ = torch_lock
    r = _no_build(path, tmp_path, RECIPES / "cpu-tf-horovod.yaml")
    assert r.code == 2
    assert "name: the lock is for 'cpu-torch-horovod', the spec is 'cpu-tf-horovod'" in r.err
    assert "pip.framework: tensorflow-cpu==2.15.1 is in the spec, not in the lock" in r.err


def test_a_corrupt_lock_is_refused(torch_lock, tmp_path):
    path, _ = torch_lock
    bad = tmp_path / "envbuilder.lock"
    bad.write_bytes(path.read_bytes()[:5000])
    r = _no_build(bad, tmp_path)
    assert r.code == 2 and "is not valid JSON" in r.err and "corrupt or truncated" in r.err
    assert "Traceback" not in r.err
    bad.write_bytes(b"\x00\x01\x02\xff")
    r = _no_build(bad, tmp_path)
    assert r.code == 2 and "not UTF-8" in r.err


def test_a_hand_edited_version_is_named(torch_lock, tmp_path):
    path, _ = torch_lock
    data = read(path)
    entry = next(e for e in data["pip"]["framework"] if e["name"] == "sympy")
    edited = path.read_text().replace(f'"name": "sympy", "version": "{entry["version"]}"',
                                      '"name": "sympy", "version": "1.12"')
    bad = tmp_path / "envbuilder.lock"
    bad.write_text(edited)
    r = _no_build(bad, tmp_path)
    assert r.code == 2, r.err
    assert f"pip.framework: sympy: version 1.12 does not match its file {entry['file']}" in r.err
    assert "Traceback" not in r.err


def test_a_hand_edited_hash_is_named_by_its_section(torch_lock, tmp_path):
    path, _ = torch_lock
    data = read(path)
    entry = next(e for e in data["pip"]["horovod"] if e["name"] == "psutil")
    bad = tmp_path / "envbuilder.lock"
    bad.write_text(path.read_text().replace(entry["sha256"], "0" * 64))
    r = _no_build(bad, tmp_path)
    assert r.code == 2
    assert "pip.horovod: was changed by hand or corrupted" in r.err and "restore envbuilder.lock" in r.err
    # an apt version edit, too
    apt = data["apt"]["runtime"][0]
    head, tail = path.read_text().rsplit(f'"name": "{apt["name"]}", "version": "{apt["version"]}"', 1)
    bad.write_text(head + f'"name": "{apt["name"]}", "version": "9.9"' + tail)       # the runtime entry
    r = _no_build(bad, tmp_path)
    assert r.code == 2 and "apt.runtime: was changed by hand" in r.err


# --- lock --update, diff --------------------------------------------------------------------------

def test_update_re_resolves_one_entry_and_keeps_the_rest(torch_lock, tmp_path):
    """A lock holding an older filelock: `--update filelock` moves filelock only."""
    from envbuilder.lock import pip as pip_

    path, _ = torch_lock
    old = tmp_path / "old" / "envbuilder.lock"
    old.parent.mkdir()
    shutil.copy(path, old)

    def older_filelock(lock):
        tgt = pip_.target(lock.inputs["pip"]["python"], lock.inputs["pip"]["glibc"])
        prefer = {e["name"].lower(): e["version"] for e in lock.pip_entries()}
        prefer["filelock"] = "3.13.1"
        lock.pip = pip_.resolve(lock.inputs["pip"]["groups"], tgt, prefer=prefer, find_links=wheelhouse())
    relock(old, older_filelock)
    before = {e["name"]: e["version"] for g in read(old)["pip"].values() for e in g}
    assert before["filelock"] == "3.13.1"
    r = run_envbuilder("lock", str(RECIPES / "cpu-torch-horovod.yaml"), "--lock", str(old), "--update", "filelock",
                       "--wheelhouse", wheelhouse(), "--json", timeout=600)
    assert r.code == 0, r.err[-2000:]
    changes = json.loads(r.out)["changes"]
    assert list(changes["changed"]) == ["pip:filelock"] and not changes["added"] and not changes["removed"]
    after = {e["name"]: e["version"] for g in read(old)["pip"].values() for e in g}
    assert after["filelock"] != "3.13.1"
    assert {k: v for k, v in after.items() if k != "filelock"} == {k: v for k, v in before.items() if k != "filelock"}
    r = run_envbuilder("lock", str(RECIPES / "cpu-torch-horovod.yaml"), "--lock", str(old), "--update", "no-such-thing")
    assert r.code == 2 and "--update: no-such-thing is not an entry of the lock" in r.err


def test_diff_two_locks_as_a_table_and_json(torch_lock, tmp_path):
    path, _ = torch_lock
    other = tmp_path / "other.lock"
    shutil.copy(path, other)

    def change(lock):
        lock.pip["framework"] = [e for e in lock.pip["framework"] if e["name"] != "mpmath"]
        e = next(e for e in lock.pip["horovod"] if e["name"] == "psutil")
        e["version"], e["file"] = "6.0.0", e["file"].replace("5.9.8", "6.0.0")
        lock.apt["runtime"].append({"name": "git", "version": "1:2.39.5-0+deb12u2", "arch": "amd64", "sha256": None})
    relock(other, change)
    r = run_envbuilder("diff", str(path), str(other))
    assert r.code == 0, r.err
    assert "pip:psutil" in r.out and "5.9.8" in r.out and "6.0.0" in r.out
    assert "+  apt.runtime:git" in r.out.replace("  ", "  ") or "apt.runtime:git" in r.out
    assert "1 changed, 1 added, 1 removed" in r.out
    data = json.loads(run_envbuilder("diff", str(path), str(other), "--json").out)
    assert data["changed"] == {"pip:psutil": {"from": "5.9.8", "to": "6.0.0"}}
    assert list(data["added"]) == ["apt.runtime:git"] and list(data["removed"]) == ["pip:mpmath"]
    assert data["a"]["kind"] == data["b"]["kind"] == "lock"


def test_diff_two_manifests_without_an_engine(cli):
    r = cli("diff", str(ROOT / "images" / "cpu-torch-horovod"), str(ROOT / "images" / "cpu-tf-horovod"), "--json")
    assert r.code == 0, r.err
    data = json.loads(r.out)
    assert data["a"]["kind"] == "manifest"
    assert "framework:pytorch" in data["removed"] and "framework:tensorflow-cpu" in data["added"]
    r = cli("diff", "nowhere.lock", str(ROOT / "images" / "cpu-tf-horovod"))
    assert r.code == 2 and "no such file, folder or image" in r.err


# --- pip resolves for the image, not the host ----------------------------------------------------

def test_pip_resolution_follows_the_target_python_markers_and_wheels():
    """pytest 8.0.0 needs tomli and exceptiongroup only below Python 3.11: resolved for the image's
    Python 3.10 they are in, for 3.11 they are not, whatever Python runs envbuilder."""
    from envbuilder.lock import pip as pip_

    groups = {"packages": ["pytest==8.0.0", "PyYAML==6.0.1"]}
    py310 = pip_.resolve(groups, pip_.target("3.10", "2.35"))["packages"]
    py311 = pip_.resolve(groups, pip_.target("3.11", "2.36"))["packages"]
    names310 = {e["name"].lower() for e in py310}
    names311 = {e["name"].lower() for e in py311}
    assert {"tomli", "exceptiongroup"} <= names310
    assert not {"tomli", "exceptiongroup"} & names311
    yaml310 = next(e for e in py310 if e["name"] == "PyYAML")
    assert "cp310-cp310-manylinux" in yaml310["file"] and len(yaml310["sha256"]) == 64


# --- conda: conda-lock's format, a local file channel ---------------------------------------------

def conda_spec(tmp_path: Path) -> Path:
    spec = tmp_path / "conda.yaml"
    spec.write_text((RECIPES / "cpu-torch-horovod.yaml").read_text().replace(
        "horovod: {version", "packages: {conda: [envbuilder-demo-data=1.0, envbuilder-demo-tool==2.1]}\n"
        "horovod: {version"))
    return spec


def conda_lockfile(tmp_path: Path) -> Path:
    out = tmp_path / "conda-lock.yml"
    out.write_text((CONDA_DATA / "conda-lock.yml").read_text().replace("@CHANNEL@", str(CONDA_DATA / "channel")))
    return out


def test_conda_packages_come_from_a_conda_lock_lockfile(torch_lock, tmp_path):
    path, _ = torch_lock
    spec = conda_spec(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    shutil.copy(path, out / "envbuilder.lock")       # the other kinds are kept: only conda is new
    r = run_envbuilder("lock", str(spec), "--out", str(out), "--conda-lockfile", str(conda_lockfile(tmp_path)),
                       "--wheelhouse", wheelhouse(), "--json", timeout=600)
    assert r.code == 0, r.err[-2000:]
    lock = read(out / "envbuilder.lock")
    names = {p["name"]: p for p in lock["conda"]["lockfile"]["package"]}
    assert set(names) == {"envbuilder-demo-data", "envbuilder-demo-tool"}
    assert all(len(p["hash"]["sha256"]) == 64 for p in names.values())
    assert [e["name"] for e in lock["pip"]["build"]] == ["py-rattler"]      # the installer, from PyPI
    r = run_envbuilder("build", str(spec), "--no-build", "--out", str(out))
    assert r.code == 0, r.err
    docker = (out / "Dockerfile").read_text()
    assert "# conda: conda packages (envbuilder-demo-data=1.0, envbuilder-demo-tool==2.1) into /opt/conda" in docker
    assert "--require-hashes --no-deps -r /pins/pip-build.txt" in docker
    assert "pins/conda-install.py /pins/conda-packages.json /conda-pkgs /opt/conda" in docker
    assert "COPY --from=devel /opt/conda /opt/conda" in docker and "micromamba" not in docker
    assert (out / "pins" / "conda-lock.yml").is_file()
    manifest = read(out / "manifest.json")
    assert manifest["expect"]["conda"] == {"envbuilder-demo-data": "1.0", "envbuilder-demo-tool": "2.1"}
    # the packages were fetched into the output folder and match the lock's sha256
    got = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in (out / "conda-pkgs").iterdir()}
    assert got == {p["url"].rsplit("/", 1)[-1]: p["hash"]["sha256"] for p in names.values()}


def test_conda_lockfiles_that_do_not_fit_are_refused(tmp_path):
    from envbuilder.errors import EnvbuilderError
    from envbuilder.lock.conda import load_lockfile

    good = conda_lockfile(tmp_path)
    text = good.read_text()
    bad = tmp_path / "bad.yml"
    bad.write_text(text.replace("9c01530de07e791b2f88f0e465638524d4c01a8b8c67e89e93fcdfc51cd2f2c9", "not-a-hash"))
    with pytest.raises(EnvbuilderError) as exc:
        load_lockfile(str(bad), ["envbuilder-demo-tool==2.1"])
    assert exc.value.field == "conda: envbuilder-demo-tool" and "no sha256" in exc.value.reason
    with pytest.raises(EnvbuilderError) as exc:
        load_lockfile(str(good), ["envbuilder-demo-tool==2.0"])
    assert "has 2.1, the spec asks envbuilder-demo-tool==2.0" in exc.value.reason
    with pytest.raises(EnvbuilderError) as exc:
        load_lockfile(str(good), ["envbuilder-demo-other=1.0"])
    assert exc.value.field == "conda: envbuilder-demo-other" and "not in" in exc.value.reason
    bad.write_text("version: [")
    with pytest.raises(EnvbuilderError) as exc:
        load_lockfile(str(bad), [])
    assert "is not YAML" in exc.value.reason


def test_conda_without_a_lock_renders_a_step_that_says_so(cli, tmp_path):
    r = cli("build", str(conda_spec(tmp_path)), "--no-build", "--out", str(tmp_path / "o"))
    assert r.code == 0, r.err
    text = (tmp_path / "o" / "Dockerfile").read_text()
    assert "conda packages are installed from envbuilder.lock" in text and "exit 1" in text


# --- base images: the registry API (a registry of our own on 127.0.0.1) ---------------------------

def test_a_tag_resolves_to_the_registry_digest_with_an_anonymous_token():
    """The Registry HTTP API v2 flow envbuilder uses when the engine does not hold the image: GET
    the manifest, get 401 + a Bearer challenge, fetch an anonymous token, GET again and read
    Docker-Content-Digest; from a multi-arch index, the spec's platform's manifest digest. A
    minimal registry runs on loopback (the set-up's mirror is tests/test_mirror.py's)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from envbuilder.errors import CheckFailed
    from envbuilder.lock.base import registry_digest, resolve_base, split_reference

    digest = "sha256:" + "ab" * 32
    arm64 = "sha256:" + "cd" * 32
    index = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": [
        {"digest": "sha256:" + "ef" * 32, "platform": {"os": "linux", "architecture": "amd64"}},
        {"digest": arm64, "platform": {"os": "linux", "architecture": "arm64", "variant": "v8"}}]}).encode()
    seen = []

    class Registry(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            if self.path.startswith("/token"):          # the token service
                seen.append(("token", self.path))
                body = json.dumps({"token": "t0k"}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            seen.append(("GET", self.path, self.headers.get("Authorization"), self.headers.get("Accept")))
            if self.headers.get("Authorization") != "Bearer t0k":
                self.send_response(401)
                self.send_header("WWW-Authenticate", f'Bearer realm="http://127.0.0.1:{port}/token",'
                                 'service="registry.test",scope="repository:team/cuda:pull"')
                self.end_headers()
            elif self.path == "/v2/team/cuda/manifests/12.2":
                self.send_response(200)
                self.send_header("Docker-Content-Digest", digest)
                self.send_header("Content-Type", "application/vnd.oci.image.index.v1+json")
                self.send_header("Content-Length", str(len(index)))
                self.end_headers()
                self.wfile.write(index)
            else:
                self.send_response(404)
                self.end_headers()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Registry)
    port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        ref = f"127.0.0.1:{port}/team/cuda:12.2"
        assert split_reference(ref) == (f"127.0.0.1:{port}", "team/cuda", "12.2")
        assert registry_digest(ref) == digest
        assert resolve_base(ref) == {"ref": ref, "digest": digest, "kind": "repo-digest", "pinned": f"{ref}@{digest}"}
        assert resolve_base(ref, platform="linux/arm64") == {
            "ref": ref, "digest": digest, "kind": "repo-digest", "pinned": f"{ref}@{arm64}",
            "manifest_digest": arm64, "platform": "linux/arm64"}
        with pytest.raises(CheckFailed) as exc:
            resolve_base(ref, platform="linux/ppc64le")
        assert "has no linux/ppc64le image (it has: linux/amd64, linux/arm64)" in exc.value.reason
        token = [s for s in seen if s[0] == "token"][0][1]
        assert "scope=repository%3Ateam%2Fcuda%3Apull" in token and "service=registry.test" in token
        assert "manifest.list.v2+json" in seen[0][3]
        with pytest.raises(CheckFailed) as exc:
            registry_digest(f"127.0.0.1:{port}/team/cuda:99.9")
        assert "has no 127.0.0.1" in exc.value.reason and "(404)" in exc.value.reason
    finally:
        server.shutdown()
    with pytest.raises(CheckFailed) as exc:       # nothing listens there any more
        registry_digest(f"127.0.0.1:{port}/team/cuda:12.2", timeout=5)
    assert "cannot reach" in exc.value.reason and "docker pull" in exc.value.fix
    assert split_reference("nvidia/cuda:11.8.0-devel-ubuntu22.04") == (
        "registry-1.docker.io", "nvidia/cuda", "11.8.0-devel-ubuntu22.04")
    assert split_reference("debian") == ("registry-1.docker.io", "library/debian", "latest")
    assert split_reference("nvcr.io/nvidia/tensorflow:24.01-tf2-py3")[:2] == ("nvcr.io", "nvidia/tensorflow")


def test_a_framework_dependency_pinned_in_packages_is_installed_over_and_earlier_layers_stay():
    """Jinja2 needs MarkupSafe; a spec that pins an older MarkupSafe in its packages must not change
    the framework group's pins (its layer and everything after it, e.g. Horovod's compile, stay
    cached): the packages group installs MarkupSafe again over it, and says what it overrides."""
    from envbuilder.lock import pip as pip_
    from envbuilder.lock.model import Lock, LockError, check_entries

    tgt = pip_.target("3.11", "2.36")
    alone = pip_.resolve({"framework": ["Jinja2==3.1.4"]}, tgt)
    both = pip_.resolve({"framework": ["Jinja2==3.1.4"], "packages": ["MarkupSafe==2.1.3", "six==1.16.0"]}, tgt)
    assert both["framework"] == alone["framework"]
    newest = next(e["version"] for e in alone["framework"] if e["name"].lower() == "markupsafe")
    assert newest != "2.1.3"
    packages = {e["name"].lower(): e for e in both["packages"]}
    assert set(packages) == {"markupsafe", "six"}
    assert packages["markupsafe"]["version"] == "2.1.3" and packages["markupsafe"]["overrides"] == newest
    assert packages["markupsafe"]["requested"] and packages["six"]["requested"]
    assert "overrides" not in packages["six"]
    assert "MarkupSafe==2.1.3 --hash=sha256:" in pip_.requirements_text(both["packages"])

    lock = Lock(name="t", inputs={}, pip=both)
    check_entries(lock)
    assert lock.pip_versions()["markupsafe"] == "2.1.3"                 # what the image ends with
    assert sum(e["name"].lower() == "markupsafe" for e in lock.pip_entries()) == 1
    del packages["markupsafe"]["overrides"]                             # a plain duplicate is refused
    with pytest.raises(LockError, match=r"pip.packages: MarkupSafe: is listed twice .*overrides"):
        check_entries(lock)


def test_layering_falls_back_to_the_joint_groups_when_installing_over_cannot_give_them():
    from envbuilder.lock.pip import layered

    def e(name, version):
        return {"name": name, "version": version, "file": f"{name}-{version}-py3-none-any.whl", "sha256": "0" * 64}

    earlier = {"framework": [e("fw", "1"), e("dep", "1"), e("gone", "1")]}
    joint = {"framework": [e("fw", "1"), e("dep", "2")], "packages": [e("pkg", "1")]}
    assert layered(earlier, joint, {"pkg"}) == joint                    # 'gone' would stay behind
    earlier["framework"].pop()
    out = layered(earlier, joint, {"pkg"})
    assert out["framework"] == earlier["framework"]
    assert [(x["name"], x["version"], x.get("overrides")) for x in out["packages"]] == \
        [("dep", "2", "1"), ("pkg", "1", None)]


def test_a_changed_spec_keeps_the_versions_it_did_not_touch(torch_lock, tmp_path):
    """Adding a package to the spec and locking again re-resolves that package; torch's own
    dependencies keep the versions the lock had (here an older filelock than PyPI's newest), so
    the framework's layer stays as it was."""
    path, _ = torch_lock
    lock_file = tmp_path / "envbuilder.lock"
    shutil.copy(path, lock_file)

    def older_filelock(lock):
        entry = next(e for e in lock.pip["framework"] if e["name"].lower() == "filelock")
        assert entry["version"] != "3.12.0"
        entry["version"], entry["file"] = "3.12.0", "filelock-3.12.0-py3-none-any.whl"

    relock(lock_file, older_filelock)
    spec = tmp_path / "spec.yaml"
    spec.write_text((RECIPES / "cpu-torch-horovod.yaml").read_text() + 'packages: {pip: ["six==1.16.0"]}\n')
    r = run_envbuilder("lock", str(spec), "--lock", str(lock_file), "--wheelhouse", wheelhouse(), timeout=900)
    assert r.code == 0, r.err[-2000:]
    lock = read(lock_file)
    filelock = next(e for e in lock["pip"]["framework"] if e["name"].lower() == "filelock")
    assert filelock["version"] == "3.12.0" and filelock["file"] == "filelock-3.12.0-py3-none-any.whl"
    assert [(e["name"], e["version"]) for e in lock["pip"]["packages"]] == [("six", "1.16.0")]
    assert "1 entry changed" in r.out and "+ pip:six: 1.16.0" in r.out and "filelock" not in r.out
