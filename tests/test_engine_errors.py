"""Build-step failures the user can meet without a broken spec: no engine, no Apptainer,
bad --ca-bundle / --wheelhouse. One message, the right exit code, earlier outputs kept."""

from __future__ import annotations

import os
import shutil

from conftest import RECIPES


def test_no_engine_running_writes_no_unlocked_files_and_names_no_build(cli, tmp_path):
    """A build locks first, then writes its folder once: with no engine to lock with, it writes
    nothing (a folder of unpinned files would not be what the build builds) and names --no-build,
    which writes the files alone; an existing folder is left as it was."""
    out = tmp_path / "out"
    r = cli("build", str(RECIPES / "cpu-torch.yaml"), "--out", str(out),
            env={"DOCKER_HOST": f"unix://{tmp_path}/no-such.sock"})
    assert r.code == 1, r.err
    assert "docker engine: no Docker engine answers" in r.err
    assert "--no-build" in r.err and "Traceback" not in r.err
    assert not out.exists()
    assert cli("build", str(RECIPES / "cpu-torch.yaml"), "--out", str(out), "--no-build").code == 0
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    r = cli("build", str(RECIPES / "cpu-torch.yaml"), "--out", str(out),
            env={"DOCKER_HOST": f"unix://{tmp_path}/no-such.sock"})
    assert r.code == 1, r.err
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before


def test_apptainer_engine_names_the_command_it_would_run(cli, tmp_path):
    if shutil.which("apptainer") or shutil.which("singularity"):
        import pytest
        pytest.skip("apptainer is installed: this test is for machines without it")
    out = tmp_path / "out"
    r = cli("build", str(RECIPES / "cpu-torch.yaml"), "--out", str(out), "--engine", "apptainer",
            "--ca-bundle", "/etc/ssl/certs/ca-certificates.crt",
            env={"DOCKER_HOST": f"unix://{tmp_path}/no-such.sock"})
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
    from envbuilder.spec import load_spec

    output = generate(load_spec(RECIPES / "cpu-torch.yaml"))
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
    r = cli("build", str(RECIPES / "cpu-torch.yaml"), "--out", str(tmp_path / "o"),
            "--ca-bundle", str(tmp_path / "nope.pem"))
    assert r.code == 2 and "--ca-bundle: no such file" in r.err
    r = cli("build", str(RECIPES / "cpu-torch.yaml"), "--out", str(tmp_path / "o"),
            "--wheelhouse", str(tmp_path / "nowhere"))
    assert r.code == 2 and "--wheelhouse: no such folder" in r.err


def test_build_command_line_carries_the_secret_not_the_file(tmp_path):
    from envbuilder.engines.docker import docker_build_command

    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    cmd = docker_build_command(["/usr/bin/docker", "build"], tmp_path / "ctx", "t:1", str(ca))
    assert cmd == ["/usr/bin/docker", "build", "--progress=plain", "--tag", "t:1",
                   "--secret", f"id=ca,src={ca}", str(tmp_path / "ctx")]
