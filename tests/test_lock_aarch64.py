"""The lock for an aarch64 image (issue 37): wheels for the image's machine, not the host's, and a
pin without an aarch64 build refused by name. Reaches PyPI (pip --dry-run --report, no download)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from envbuilder.errors import EXIT_BAD_INPUT, EnvbuilderError
from envbuilder.lock import pip as pip_

AARCH64 = pip_.target("3.11", "2.36", "aarch64")   # Debian 12's Python and glibc


def test_aarch64_target_asks_aarch64_platforms_only():
    assert AARCH64["markers"]["platform_machine"] == "aarch64"
    assert AARCH64["platforms"][0] == "manylinux_2_36_aarch64"
    assert "manylinux_2_17_aarch64" in AARCH64["platforms"] and "manylinux2014_aarch64" in AARCH64["platforms"]
    assert not [p for p in AARCH64["platforms"] if "x86_64" in p]


def test_aarch64_lock_picks_aarch64_wheels():
    got = pip_.resolve({"packages": ["numpy==2.1.3"]}, AARCH64)
    (entry,) = got["packages"]
    assert entry["file"] == "numpy-2.1.3-cp311-cp311-manylinux_2_17_aarch64.manylinux2014_aarch64.whl"
    # PyPI's sha256 of that file (the x86_64 wheel's differs)
    assert entry["sha256"] == "762479be47a4863e261a840e8e01608d124ee1361e48b96916f38b119cfda04a"


def test_pin_without_aarch64_build_is_refused_by_name():
    # intel-openmp publishes x86_64 (and Windows) wheels only
    with pytest.raises(EnvbuilderError) as err:
        pip_.resolve({"packages": ["intel-openmp==2024.2.1"]}, AARCH64)
    assert err.value.exit_code == EXIT_BAD_INPUT == 2
    text = str(err.value)
    assert "intel-openmp 2024.2.1 has no aarch64 build" in text and "--wheelhouse" in text


# --- the whole lock of an `arch: aarch64` spec, in the engine (docker) -------------------------

ARM64_BASE = "local/debian:bookworm-arm64"     # .ci/make-base-image.sh --arch arm64
SPEC = """\
name: {name}
base: {base}
arch: aarch64
framework: {{name: tensorflow, version: "2.16.2"}}
python: "3.11"
packages:
  pip: ["numpy==1.26.4"]
targets: [docker]
"""


def _image_arch(ref: str) -> str | None:
    if not shutil.which("docker"):
        return None
    proc = subprocess.run(["docker", "image", "inspect", "--format", "{{.Architecture}}", ref],
                          capture_output=True, text=True)
    return proc.stdout.strip() if proc.returncode == 0 else None


def _lock(tmp_path: Path, base: str) -> subprocess.CompletedProcess:
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.format(name="cpu-tf-aarch64", base=base))
    root = Path(__file__).resolve().parents[1]
    return subprocess.run([sys.executable, "-m", "envbuilder", "lock", str(spec)], cwd=tmp_path,
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(root)})


def test_aarch64_spec_on_an_amd64_base_is_refused(tmp_path):
    if _image_arch("local/debian:bookworm") != "amd64":
        pytest.skip("needs docker and local/debian:bookworm (.ci/make-base-image.sh)")
    proc = _lock(tmp_path, "local/debian:bookworm")
    assert proc.returncode == 2, proc.stderr
    assert "local/debian:bookworm is an amd64 image; the spec's arch needs arm64" in proc.stderr
    assert "--arch arm64" in proc.stderr
    assert not (tmp_path / "images").exists()


def test_aarch64_lock_on_the_arm64_base(tmp_path):
    # about 60 s here: apt's simulation runs under qemu
    if _image_arch(ARM64_BASE) != "arm64":
        pytest.skip(f"needs {ARM64_BASE}: .ci/make-base-image.sh --arch arm64")
    proc = _lock(tmp_path, ARM64_BASE)
    assert proc.returncode == 0, proc.stderr
    lock = json.loads((tmp_path / "images/cpu-tf-aarch64/envbuilder.lock").read_text())
    arm64_id = subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}", ARM64_BASE],
                              capture_output=True, text=True).stdout.strip()
    assert {b["digest"] for b in lock["base"].values()} == {arm64_id}
    apt_arches = {e["arch"] for entries in lock["apt"].values() for e in entries}
    assert apt_arches <= {"arm64", "all"} and "arm64" in apt_arches
    files = [e["file"] for group in lock["pip"].values() for e in group]
    binary = [f for f in files if not f.endswith("-none-any.whl")]
    assert binary and all("aarch64" in f for f in binary), files
    assert "tensorflow-2.16.2-cp311-cp311-manylinux_2_17_aarch64.manylinux2014_aarch64.whl" in files
