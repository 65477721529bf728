"""Build-step failures the user can meet without a broken spec: no engine, no Apptainer,
bad --ca-bundle / --wheelhouse. One message, the right exit code, earlier outputs kept."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from conftest import RECIPES, no_config


def test_no_engine_running_writes_no_unlocked_files_and_names_no_build(cli, tmp_path):
    """A build locks first, then writes its folder once: with no engine to lock with, it writes
    nothing (a folder of unpinned files would not be what the build builds) and names --no-build,
    which writes the files alone; an existing folder is left as it was."""
    out = tmp_path / "out"
    r = cli("build", str(RECIPES / "cpu-torch-horovod.yaml"), "--out", str(out),
            env={"DOCKER_HOST": f"unix://{tmp_path}/no-such.sock"})
    assert r.code == 1, r.err
    assert "docker engine: no Docker engine answers" in r.err
    assert "--no-build" in r.err and "Traceback" not in r.err
    assert not out.exists()
    assert cli("build", str(RECIPES / "cpu-torch-horovod.yaml"), "--out", str(out), "--no-build").code == 0
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    r = cli("build", str(RECIPES / "cpu-torch-horovod.yaml"), "--out", str(out),
            env={"DOCKER_HOST": f"unix://{tmp_path}/no-such.sock"})
    assert r.code == 1, r.err
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before


def test_apptainer_engine_names_the_command_it_would_run(cli, tmp_path):
    if shutil.which("apptainer") or shutil.which("singularity"):
        import pytest
        pytest.skip("apptainer is installed: this test is for machines without it")
    out = tmp_path / "out"
    r = cli("build", str(RECIPES / "cpu-torch-horovod.yaml"), "--out", str(out), "--engine", "apptainer",
            "--ca-bundle", "/etc/ssl/certs/ca-certificates.crt",
            env={"DOCKER_HOST": f"unix://{tmp_path}/no-such.sock", **no_config(tmp_path)})
    assert r.code == 1
    assert "neither apptainer nor singularity is installed" in r.err
    fakeroot = "" if os.geteuid() == 0 else " --fakeroot"
    assert (f"cd {out} && apptainer build --force{fakeroot} --bind /etc/ssl/certs/ca-certificates.crt:/run/secrets/ca:ro "
            "cpu-torch-horovod.sif Apptainer.def") in r.err
    assert (out / "Apptainer.def").is_file()


def test_apptainer_command_binds_what_the_header_names(tmp_path):
    """The definition file's header lines, as the engine runs them: each option bound at the path
    the file reads it from, read-only; --fakeroot when not root."""
    from envbuilder.engines.apptainer import apptainer_command
    from envbuilder.engines.options import BuildOptions
    from envbuilder.generate import generate
    from envbuilder.spec.model import load_spec

    output = generate(load_spec(RECIPES / "cpu-torch-horovod.yaml"))
    (tmp_path / "wheels").mkdir()
    opts = BuildOptions(engine="apptainer", wheelhouse=str(tmp_path / "wheels"), ca_bundle="/ca.pem",
                        netrc="/n/netrc")
    cmd = apptainer_command(output, opts, "singularity", fakeroot=True)
    assert cmd == ["singularity", "build", "--force", "--fakeroot", "--bind", f"{tmp_path}/wheels:/wheelhouse:ro",
                   "--bind", "/ca.pem:/run/secrets/ca:ro", "--bind", "/n/netrc:/run/secrets/netrc:ro",
                   "cpu-torch-horovod.sif", "Apptainer.def"]
    header = output.files["Apptainer.def"].decode()
    for line in ("--bind WHEELS_FOLDER:/wheelhouse:ro", "--bind /etc/ssl/certs/ca-certificates.crt:/run/secrets/ca:ro",
                 "--bind NETRC_FILE:/run/secrets/netrc:ro"):
        assert line in header


def test_apptainer_fakeroot_prerequisites_are_named(tmp_path, monkeypatch):
    """Unprivileged, each thing the site must allow is one refusal naming it (exit 2, no traceback):
    user namespaces, a usable /dev/fuse, subordinate ids."""
    import pytest

    from envbuilder.engines import apptainer
    from envbuilder.errors import EnvbuilderError

    off = tmp_path / "max_user_namespaces"
    off.write_text("0\n")
    on = tmp_path / "on"
    on.write_text("1\n")
    fuse = tmp_path / "fuse"
    fuse.write_text("")
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "subuid").write_text("alice:100000:65536\n")
    (etc / "subgid").write_text("alice:100000:65536\n")
    monkeypatch.setattr(apptainer, "FUSE_DEVICE", fuse)

    monkeypatch.setattr(apptainer, "USERNS_FILES", ((off, "user.max_user_namespaces is 0"),))
    with pytest.raises(EnvbuilderError) as e:
        apptainer.check_unprivileged(1000, "alice", etc)
    assert e.value.exit_code == 2 and "no unprivileged user namespaces" in str(e.value)
    assert "user.max_user_namespaces" in str(e.value)

    monkeypatch.setattr(apptainer, "USERNS_FILES", ((on, "user.max_user_namespaces is 0"),))
    monkeypatch.setattr(apptainer, "FUSE_DEVICE", tmp_path / "no-fuse")
    with pytest.raises(EnvbuilderError) as e:
        apptainer.check_unprivileged(1000, "alice", etc)
    assert "/no-fuse does not exist" in str(e.value) and "--device /dev/fuse" in str(e.value)

    monkeypatch.setattr(apptainer, "FUSE_DEVICE", fuse)
    apptainer.check_unprivileged(1000, "alice", etc)          # everything there: no refusal
    with pytest.raises(EnvbuilderError) as e:
        apptainer.check_unprivileged(1001, "bob", etc)
    assert "user bob has no subordinate uids" in str(e.value) and "usermod --add-subuids" in str(e.value)


def test_missing_ca_bundle_and_wheelhouse_are_bad_input(cli, tmp_path):
    r = cli("build", str(RECIPES / "cpu-torch-horovod.yaml"), "--out", str(tmp_path / "o"),
            "--ca-bundle", str(tmp_path / "nope.pem"))
    assert r.code == 2 and "--ca-bundle: no such file" in r.err
    r = cli("build", str(RECIPES / "cpu-torch-horovod.yaml"), "--out", str(tmp_path / "o"),
            "--wheelhouse", str(tmp_path / "nowhere"))
    assert r.code == 2 and "--wheelhouse: no such folder" in r.err


def test_build_command_line_carries_the_secret_not_the_file(tmp_path):
    from envbuilder.engines.docker import docker_build_command

    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    cmd = docker_build_command(["/usr/bin/docker", "build"], tmp_path / "ctx", "t:1", str(ca))
    assert cmd == ["/usr/bin/docker", "build", "--progress=plain", "--tag", "t:1",
                   "--secret", f"id=ca,src={ca}", str(tmp_path / "ctx")]


# --- a CA the host's pip trusts and the build's would not ------------------------------------------

def test_the_ca_bundle_the_hosts_pip_trusts_goes_to_the_build_saying_so(cli, tmp_path):
    """The README's first command on a machine behind a TLS-intercepting proxy: the host's pip trusts
    the proxy's CA (PIP_CERT or pip.conf `cert`), so the lock reaches the index; the build's pip sees
    none of that. The build gets the bundle as --ca-bundle would give it, and says so first."""
    bundle = tmp_path / "proxy-ca.pem"
    bundle.write_text("-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n")
    # no configured ca_bundle (the machine's site config names one; then that one goes to the build)
    dead = {"DOCKER_HOST": f"unix://{tmp_path}/no-such.sock", "PIP_CERT": str(bundle), **no_config(tmp_path)}
    r = cli("build", str(RECIPES / "cpu-torch-horovod.yaml"), "--out", str(tmp_path / "a"), env=dead)
    assert r.code == 1 and "Traceback" not in r.err, r.err
    assert f"note: this machine's pip trusts {bundle} (PIP_CERT): the build gets it as with --ca-bundle" in r.err
    given = cli("build", str(RECIPES / "cpu-torch-horovod.yaml"), "--out", str(tmp_path / "b"),
                "--ca-bundle", "/etc/ssl/certs/ca-certificates.crt", env=dead)
    assert given.code == 1 and "this machine's pip trusts" not in given.err, given.err
    files_only = cli("build", str(RECIPES / "cpu-torch-horovod.yaml"), "--out", str(tmp_path / "c"), "--no-build", env=dead)
    assert files_only.code == 0 and "this machine's pip trusts" not in files_only.err


def test_pips_own_configuration_files_are_read_in_pips_order(tmp_path):
    from envbuilder.engines.context import host_pip_ca_bundle

    home, venv = tmp_path / "home", tmp_path / "venv"
    (home / ".config" / "pip").mkdir(parents=True)
    venv.mkdir()
    user_ca, venv_ca = tmp_path / "user.pem", tmp_path / "venv.pem"
    user_ca.write_text("x")
    venv_ca.write_text("x")
    env = {"HOME": str(home), "XDG_CONFIG_DIRS": str(tmp_path / "none")}
    assert host_pip_ca_bundle(env) in (None, ("/etc/ssl/certs/ca-certificates.crt", "/etc/pip.conf [global] cert"))
    (home / ".config" / "pip" / "pip.conf").write_text(f"[install]\ncert = {user_ca}\n")
    assert host_pip_ca_bundle(env) == (str(user_ca), f"{home}/.config/pip/pip.conf [install] cert")
    (venv / "pip.conf").write_text(f"[global]\ncert = {venv_ca}\n")
    assert host_pip_ca_bundle({**env, "VIRTUAL_ENV": str(venv)})[0] == str(venv_ca)       # the later file wins
    (venv / "pip.conf").write_text(f"[global]\ncert = {tmp_path}/gone.pem\n")
    assert host_pip_ca_bundle({**env, "VIRTUAL_ENV": str(venv)}) is None                # a bundle that is not there
    assert host_pip_ca_bundle({**env, "PIP_CERT": str(user_ca), "VIRTUAL_ENV": str(venv)})[1] == "PIP_CERT"
    (home / ".config" / "pip" / "pip.conf").write_text("[global\ncert = broken")
    assert host_pip_ca_bundle(env) in (None, ("/etc/ssl/certs/ca-certificates.crt", "/etc/pip.conf [global] cert"))


# what pip 23 prints in a build behind a proxy whose CA it does not trust (the README's first command,
# before the CA was handed over)
PIP_TLS_LOG = [
    "#12 3.104 WARNING: Retrying (Retry(total=4, connect=None, read=None, redirect=None, status=None)) after "
    "connection broken by 'SSLError(SSLCertVerificationError(1, '[SSL: CERTIFICATE_VERIFY_FAILED] certificate "
    "verify failed: self-signed certificate in certificate chain (_ssl.c:992)'))': /simple/numpy/",
    "#12 9.871 ERROR: Could not find a version that satisfies the requirement numpy==1.26.4",
]


def test_a_certificate_failure_in_a_build_is_named_with_its_fix():
    from envbuilder.engines.buildlog import certificate_failure

    assert "give --ca-bundle FILE with that CA" in certificate_failure(PIP_TLS_LOG, None)
    assert "the CA bundle handed to it (/x.pem) does not hold the CA" in certificate_failure(PIP_TLS_LOG, "/x.pem")
    assert certificate_failure(PIP_TLS_LOG[1:], None) is None


def test_no_build_with_a_wheelhouse_leaves_the_wheels_where_the_header_says(cli, tmp_path):
    """The headers say local wheels go in ./wheelhouse/, and their build line builds the folder as it
    is: --no-build --wheelhouse W puts W's wheels there (the CPU torch wheel the lock pins), keeps
    a wheel the folder already has, and refuses a wheelhouse that is not there before writing."""
    from infra import TORCH_WHEEL, wheelhouse

    source = wheelhouse()
    out = tmp_path / "out"
    (out / "wheelhouse").mkdir(parents=True)
    (out / "wheelhouse" / "mine-1.0-py3-none-any.whl").write_bytes(b"the user's")
    r = cli("build", str(RECIPES / "cpu-torch-horovod.yaml"), "--out", str(out), "--no-build", "--wheelhouse", source)
    assert r.code == 0, r.err
    got = out / "wheelhouse" / TORCH_WHEEL
    assert got.is_file() and got.stat().st_size == (Path(source) / TORCH_WHEEL).stat().st_size
    assert (out / "wheelhouse" / "mine-1.0-py3-none-any.whl").read_bytes() == b"the user's"
    assert f"{out}/wheelhouse/: " in r.err and f"local wheel(s) from {source}" in r.err
    assert "--mount=type=bind,source=wheelhouse,target=/wheelhouse" in (out / "Dockerfile").read_text()
    bad = cli("build", str(RECIPES / "cpu-torch-horovod.yaml"), "--out", str(tmp_path / "new"), "--no-build",
              "--wheelhouse", str(tmp_path / "missing"))
    assert bad.code == 2 and "--wheelhouse: no such folder" in bad.err and not (tmp_path / "new").exists()


def _spec_reading_bases_from(tmp_path: Path, base_from: str) -> Path:
    spec = tmp_path / "spec.yaml"
    # a site's own image, made where the image is (what archives are for; the presets name public ones)
    spec.write_text((RECIPES / "cpu-torch-ddp.yaml").read_text().replace(
        "base: debian:bookworm-slim", "base: local/debian:bookworm-slim") + f"base_from: {base_from}\n")
    return spec


def test_a_base_archive_the_folder_lacks_is_named_with_the_command_that_writes_it(cli, tmp_path):
    """base_from: docker-archive: `build --engine apptainer` checks the folder holds the archive
    the definition file reads before Apptainer is asked (exit 2, the file and the header's
    command); with the archive written by that command (`docker save`, real), it goes on to
    Apptainer (here: none installed, exit 1)."""
    import subprocess

    from infra import base_image, docker_cli

    out = tmp_path / "out"
    spec = _spec_reading_bases_from(tmp_path, "docker-archive")
    r = cli("build", str(spec), "--out", str(out), "--engine", "apptainer")
    assert r.code == 2, r.out + r.err
    archive = out / "bases" / "local_debian_bookworm-slim.docker.tar"
    assert f"error: base_from: docker-archive: the base local/debian:bookworm-slim is read from {archive}, which is " \
           "missing" in r.err and "Traceback" not in r.err, r.err
    assert f"fix: write it where the image is: docker save local/debian:bookworm-slim -o " \
           f"bases/local_debian_bookworm-slim.docker.tar (in {out})" in r.err, r.err
    assert "#   docker save local/debian:bookworm-slim -o bases/local_debian_bookworm-slim.docker.tar" in \
        (out / "Apptainer.def").read_text()
    if shutil.which("apptainer") or shutil.which("singularity"):
        return
    archive.parent.mkdir()
    subprocess.run([docker_cli(), "save", base_image(), "-o", str(archive)], check=True)
    r = cli("build", str(spec), "--out", str(out), "--engine", "apptainer")
    assert r.code == 1 and "neither apptainer nor singularity is installed" in r.err, r.err


def test_a_base_archive_of_another_image_than_the_locked_one_is_refused(tmp_path):
    """A `docker save` archive holds the image's config under its ID: one that is not the image
    the lock names for that base is refused, both IDs named; the locked one passes."""
    import subprocess
    from dataclasses import replace

    import pytest

    from envbuilder.engines.apptainer import check_base_archives
    from envbuilder.errors import EnvbuilderError
    from envbuilder.generate import generate
    from envbuilder.lock.model import Lock
    from envbuilder.spec.model import load_spec
    from infra import base_image, docker_cli

    stack = generate(load_spec(_spec_reading_bases_from(tmp_path, "docker-archive"))).stack
    (tmp_path / "bases").mkdir()
    subprocess.run([docker_cli(), "save", base_image(), "-o", str(tmp_path / "bases" / "local_debian_bookworm-slim.docker.tar")],
                   check=True)
    image_id = subprocess.run([docker_cli(), "image", "inspect", base_image(), "--format", "{{.Id}}"],
                              capture_output=True, text=True, check=True).stdout.strip()
    entry = {"ref": "local/debian:bookworm-slim", "kind": "image-id", "pinned": "local/debian:bookworm-slim"}
    good = replace(stack, lock=Lock("cpu-torch-ddp", {}, base={"devel": {**entry, "digest": image_id}}))
    check_base_archives(tmp_path, good, "docker-archive")
    bad = replace(stack, lock=Lock("cpu-torch-ddp", {}, base={"devel": {**entry, "digest": "sha256:" + "0" * 64}}))
    with pytest.raises(EnvbuilderError) as err:
        check_base_archives(tmp_path, bad, "docker-archive")
    assert err.value.field == "base_from" and f"holds image {image_id[:19]}; the lock names sha256:000000000000" \
        in str(err.value), str(err.value)
    (tmp_path / "bases" / "local_debian_bookworm-slim.docker.tar").write_text("not a tar")
    with pytest.raises(EnvbuilderError) as err:
        check_base_archives(tmp_path, good, "docker-archive")
    assert "is not a readable docker-archive" in str(err.value)


def test_a_gpu_images_test_is_left_to_a_gpu_node_where_the_build_machine_has_none(tmp_path):
    """%test runs the smoke suite, whose GPU checks fail without a GPU: a GPU preset built where
    no GPU is visible gets --notest (its header says so, and how to run it on a GPU node); a CPU
    preset's build runs its %test, GPU or not."""
    from envbuilder.engines.apptainer import apptainer_command, gpu_visible
    from envbuilder.engines.options import BuildOptions
    from envbuilder.generate import generate
    from envbuilder.spec.model import load_spec

    assert gpu_visible(tmp_path) is False
    (tmp_path / "nvidia0").touch()
    assert gpu_visible(tmp_path) is True
    gpu = generate(load_spec(RECIPES / "torch-horovod-pypi.yaml"))
    cmd = apptainer_command(gpu, BuildOptions(engine="apptainer"), fakeroot=True,
                            notest=gpu.stack.spec.gpu and not gpu_visible(Path("/dev")))
    header = gpu.files["Apptainer.def"].decode().split("\nBootstrap:", 1)[0]
    assert "#   %test checks the GPU: on a machine without one add --notest" in header
    assert "#   apptainer test --nv torch-horovod-pypi.sif" in header
    if not gpu_visible(Path("/dev")):          # this machine: no GPU
        assert cmd == ["apptainer", "build", "--force", "--fakeroot", "--notest", "torch-horovod-pypi.sif",
                       "Apptainer.def"]
    cpu = generate(load_spec(RECIPES / "cpu-torch-ddp.yaml"))
    assert "--notest" not in "".join(cpu.files["Apptainer.def"].decode().split("\nBootstrap:", 1)[0])


def test_an_engine_whose_build_file_the_targets_do_not_write_is_refused_first(cli, tmp_path):
    """--engine apptainer builds Apptainer.def, the others the Dockerfile: a spec whose targets do
    not write that file is refused by name before anything is written (Apptainer started anyway
    once, in a test, and failed on `open Apptainer.def: no such file or directory`)."""
    text = "\n".join(line for line in (RECIPES / "cpu-torch-ddp.yaml").read_text().splitlines()
                     if not line.startswith("targets:")) + "\n"
    for targets, engine, said in (
            ("[docker]", "apptainer", "--engine apptainer builds Apptainer.def, which the spec's targets: [docker] "
             "do not write\n  fix: add apptainer to the spec's targets (targets: [docker, apptainer]), or build "
             "with --engine buildah or docker or podman"),
            ("[apptainer]", "podman", "--engine podman builds Dockerfile, which the spec's targets: [apptainer] do "
             "not write\n  fix: add docker to the spec's targets (targets: [apptainer, docker]), or build with "
             "--engine apptainer")):
        spec = tmp_path / f"{engine}.yaml"
        spec.write_text(text + f"targets: {targets}\n")
        out = tmp_path / f"out-{engine}"
        r = cli("build", str(spec), "--out", str(out), "--engine", engine)
        assert r.code == 2 and f"error: targets: {said}" in r.err, r.err
        assert not out.exists() and "Traceback" not in r.err
    # [sif] writes the Dockerfile (the SIF is made from the Docker image): --no-build is never refused
    spec.write_text(text + "targets: [sif]\n")
    assert cli("build", str(spec), "--out", str(tmp_path / "nb"), "--engine", "apptainer", "--no-build").code == 0
