"""Build-step failures the user can meet without a broken spec: no engine, no Apptainer,
bad --ca-bundle / --wheelhouse. One message, the right exit code, earlier outputs kept."""

from __future__ import annotations

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
            env={"DOCKER_HOST": f"unix://{tmp_path}/no-such.sock"})
    assert r.code == 1
    assert "neither apptainer nor singularity is installed" in r.err
    assert f"cd {out} && apptainer build --force cpu-torch-horovod.sif Apptainer.def" in r.err
    assert (out / "Apptainer.def").is_file()


def test_apptainer_converts_a_docker_image_when_the_engine_has_it(tmp_path):
    from envbuilder.engines.apptainer import apptainer_command
    from envbuilder.generate import generate
    from envbuilder.spec.model import load_spec

    output = generate(load_spec(RECIPES / "cpu-torch.yaml"))
    cmd = apptainer_command(tmp_path, output, "singularity", from_docker="envbuilder/cpu-torch-horovod:abc")
    assert cmd == ["singularity", "build", "--force", "cpu-torch-horovod.sif",
                   "docker-daemon://envbuilder/cpu-torch-horovod:abc"]


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
