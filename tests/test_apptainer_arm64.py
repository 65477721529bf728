"""arm64 images and the real Apptainer (issue 37 item 5), on this x86_64 machine, where Apptainer
runs arm64 programs under QEMU (qemu-user-static through binfmt_misc, which tools/apptainer-node
shows the container as a login node with QEMU shows it; --no-binfmt: a machine without).

- A multi-arch base (the local amd64 and arm64 Debian images under one index in the loopback
  registry) built with the command line envbuilder's Apptainer engine runs for an aarch64 spec:
  the .sif's root file system is arm64 and its programs say aarch64; the same build without
  `--arch` (the command for an x86_64 spec) gives an amd64 .sif, which envbuilder's check of the
  built .sif refuses for the aarch64 spec.
- envbuilder's own SIF writer gives an arm64 image a .sif Apptainer reads as arm64 and runs.
  Without emulation, `envbuilder build --engine apptainer` of an aarch64 spec and `envbuilder
  verify --runtime apptainer` of that .sif stop before Apptainer starts, exit 2, naming the cause
  and the fix.
The whole aarch64 preset built by Apptainer and verified with 2 ranks is a long build
(tests/test_aarch64_build.py)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from apptainer_build import BUILDER_UID, apptainer_build, chown_tree
from conftest import run_envbuilder
from infra import (APPTAINER_NODE, ARM64_BASE, REGISTRY, docker_cli, image_arch, long_build, require_apptainer_node, require_binary,
                   require_registry)

ROOT = Path(__file__).resolve().parents[1]
AMD64_BASE = "local/debian:bookworm"
INDEX = f"{REGISTRY}/envbuilder-test/debian:bookworm-multiarch"
NO_EMULATION = "but this machine is x86_64 and binfmt_misc is not mounted"


def node(*argv: str, mounts: tuple[Path, ...] = (), flags: tuple[str, ...] = (), timeout: int = 600):
    cmd = [str(APPTAINER_NODE), *flags]
    for m in mounts:
        cmd += ["-v", str(m)]
    return subprocess.run([*cmd, "--", *argv], capture_output=True, text=True, timeout=timeout)


def require_arm64_and_emulation() -> None:
    from envbuilder import emulation

    if emulation.machine() != "x86_64":
        pytest.skip("written for an x86_64 machine")
    reason = emulation.why_not_runnable("aarch64")
    if reason:
        pytest.skip(f"no arm64 emulation here ({reason}): .ci/make-base-image.sh --arch arm64 sets it up")
    if image_arch(ARM64_BASE) != "arm64":
        pytest.skip(f"needs {ARM64_BASE}: .ci/make-base-image.sh --arch arm64")
    require_apptainer_node()


def push_multiarch_index() -> str:
    """Both local Debian bases pushed, and one index (a manifest list) naming the two, as a
    multi-arch base on a registry is (nvidia/cuda, debian)."""
    require_registry()
    buildah = require_binary("buildah")
    docker = docker_cli()
    refs = []
    for base, suffix in ((AMD64_BASE, "amd64"), (ARM64_BASE, "arm64")):
        ref = f"{REGISTRY}/envbuilder-test/debian:bookworm-{suffix}"
        subprocess.run([docker, "tag", base, ref], check=True)
        subprocess.run([docker, "push", ref], check=True, capture_output=True)
        refs.append(ref)
    name = "envbuilder-test-multiarch"
    subprocess.run([buildah, "manifest", "rm", name], capture_output=True)
    subprocess.run([buildah, "manifest", "create", name], check=True, capture_output=True)
    try:
        for ref in refs:
            subprocess.run([buildah, "manifest", "add", "--tls-verify=false", name, f"docker://{ref}"],
                           check=True, capture_output=True)
        subprocess.run([buildah, "manifest", "push", "--all", "--tls-verify=false", name, f"docker://{INDEX}"],
                       check=True, capture_output=True)
    finally:
        subprocess.run([buildah, "manifest", "rm", name], capture_output=True)
    return INDEX


def engine_command(arch: str) -> list[str]:
    """The `apptainer build` command line envbuilder's engine runs for a spec of ARCH."""
    from envbuilder.engines.apptainer import apptainer_command
    from envbuilder.engines.options import BuildOptions

    spec = SimpleNamespace(name="probe", target_arch=arch)
    return apptainer_command(SimpleNamespace(stack=SimpleNamespace(spec=spec)), BuildOptions(engine="apptainer"),
                             fakeroot=True)


def test_a_multiarch_base_gives_the_specs_arch_and_the_check_catches_the_other(tmp_path):
    require_arm64_and_emulation()
    from envbuilder.engines.apptainer import check_sif_arch
    from envbuilder.errors import CheckFailed

    index = push_multiarch_index()
    (tmp_path / "probe.def").write_text(
        f"Bootstrap: docker\nFrom: {index}\n\n%post\n    uname -m > /built-on\n\n%test\n    uname -m\n")
    chown_tree(tmp_path, BUILDER_UID)
    arm = engine_command("aarch64")
    assert arm[-2:] == ["probe.sif", "Apptainer.def"] and "--arch" in arm
    assert arm[arm.index("--arch") + 1] == "arm64"
    plain = engine_command("x86_64")
    assert "--arch" not in plain

    def build(cmd: list[str]) -> subprocess.CompletedProcess:
        # the registry on loopback speaks plain HTTP: --no-https, the one flag added here
        argv = [*cmd[:2], "--no-https", *cmd[2:-1], "probe.def"]
        return node("sh", "-c", 'cd "$1" && shift && exec "$@"', "sh", str(tmp_path), *argv,
                    mounts=(tmp_path,), flags=("--host-network",))

    b = build(arm)
    assert b.returncode == 0, b.stdout[-2000:] + b.stderr[-2000:]
    sif = tmp_path / "probe.sif"
    assert check_sif_arch(sif, "aarch64") == "arm64"
    ran = node("apptainer", "exec", str(sif), "cat", "/built-on", mounts=(tmp_path,))
    assert ran.returncode == 0 and ran.stdout.strip() == "aarch64", ran.stderr

    b = build(plain)                    # what Apptainer does without --arch on this machine
    assert b.returncode == 0, b.stdout[-2000:] + b.stderr[-2000:]
    with pytest.raises(CheckFailed) as err:
        check_sif_arch(sif, "aarch64")
    assert "holds an amd64 root file system, but the spec's arch is aarch64 (arm64)" in str(err.value)
    assert "--arch arm64" in err.value.fix


def test_envbuilders_arm64_sif_runs_under_apptainer_and_without_emulation_build_and_verify_stop(tmp_path):
    require_arm64_and_emulation()
    out = tmp_path / "out"
    r = run_envbuilder("build", str(ROOT / "recipes/cpu-torch-ddp-aarch64.yaml"), "--no-build", "--out", str(out))
    assert r.code == 0, r.err
    # envbuilder's own SIF writer (no Apptainer) on the arm64 base: Apptainer reads arm64 and runs it
    r = run_envbuilder("sif", str(out), "--image", ARM64_BASE, timeout=300)
    assert r.code == 0, r.err
    sif = out / "cpu-torch-ddp-aarch64.sif"
    chown_tree(tmp_path, BUILDER_UID)
    seen = node("sh", "-c", 'apptainer sif header "$1" && apptainer exec "$1" uname -m', "sh", str(sif),
                mounts=(tmp_path,))
    assert seen.returncode == 0, seen.stderr
    assert "Primary Architecture: arm64" in seen.stdout and seen.stdout.rstrip().endswith("aarch64"), seen.stdout
    # the same .sif where Apptainer's own refusal names neither cause nor fix
    bare = node("apptainer", "exec", str(sif), "true", mounts=(tmp_path,), flags=("--no-binfmt",))
    assert bare.returncode != 0 and "the image's architecture (arm64) could not run on the host's (amd64)" in bare.stderr

    b = node("python", "-m", "envbuilder", "build", str(ROOT / "recipes/cpu-torch-ddp-aarch64.yaml"),
             "--out", str(out), "--engine", "apptainer", mounts=(tmp_path,), flags=("--no-binfmt",))
    assert b.returncode == 2, b.stdout[-2000:] + b.stderr[-2000:]
    assert "Traceback" not in b.stderr
    assert ("arch: apptainer build (aarch64 image: %post and %test) runs aarch64 programs, "
            + NO_EMULATION) in b.stderr, b.stderr
    assert "qemu-user-static and binfmt-support" in b.stderr
    assert not (out / "apptainer-build.log").exists()          # Apptainer never started
    assert sif.is_file()                                         # nothing written before is lost

    v = node("python", "-m", "envbuilder", "verify", str(out), "--image", str(sif),
             "--runtime", "apptainer", "--ranks", "2", mounts=(tmp_path,), flags=("--no-binfmt",))
    assert v.returncode == 2, v.stdout[-2000:] + v.stderr[-2000:]
    assert f"--image: {sif} (arm64) runs aarch64 programs, {NO_EMULATION}" in v.stderr, v.stderr
    assert "Traceback" not in v.stderr


@long_build
def test_the_aarch64_ddp_preset_built_by_apptainer_and_verified_with_two_ranks(tmp_path):
    """cpu-torch-ddp-aarch64 locked, then built by the real Apptainer as the unprivileged user
    (%post and %test under QEMU), its .sif's root file system arm64, verified with 2 ranks under
    Apptainer (docs/aarch64.md has the figures: tens of minutes)."""
    require_arm64_and_emulation()
    lockdir = tmp_path / "lock"
    r = run_envbuilder("lock", str(ROOT / "recipes/cpu-torch-ddp-aarch64.yaml"), "--out", str(lockdir), timeout=900)
    assert r.code == 0, r.err[-3000:]
    out, b, _seconds = apptainer_build(ROOT / "recipes/cpu-torch-ddp-aarch64.yaml", lockdir / "envbuilder.lock",
                                       tmp_path / "work")
    sif = out / "cpu-torch-ddp-aarch64.sif"
    try:
        assert b.returncode == 0, b.stdout[-3000:] + b.stderr[-3000:]
        assert f"built {sif} (" in b.stdout and ", arm64) in " in b.stdout, b.stdout
        assert "(%test: the smoke suite passed)" in b.stdout, b.stdout
        log = (out / "apptainer-build.log").read_text()
        assert " --arch arm64 " in log.splitlines()[0], log.splitlines()[0]
        report = out / "report.json"
        v = node("python", "-m", "envbuilder", "verify", str(out), "--image", str(sif), "--runtime", "apptainer",
                 "--ranks", "2", "--report", str(report), mounts=(tmp_path / "work",), timeout=3600)
        assert v.returncode == 0, v.stdout[-3000:] + v.stderr[-3000:]
        checks = {c["name"]: c for c in json.loads(report.read_text())["checks"]}
        assert checks["versions.arch"]["status"] == "pass" and checks["versions.arch"]["figure"] == "aarch64"
        assert checks["dist.init[torch]"]["status"] == "pass", checks["dist.init[torch]"]
    finally:
        sif.unlink(missing_ok=True)
