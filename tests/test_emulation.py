"""emulation.py: which binfmt_misc table lets this machine run another architecture's programs,
and what it says when one does not. The tables here are folders written as the kernel shows
/proc/sys/fs/binfmt_misc (Debian's qemu-user-static entry, flags as registered); the last test
reads this machine's own."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from envbuilder import emulation
from envbuilder.errors import EnvbuilderError

QEMU_AARCH64 = """enabled
interpreter /usr/libexec/qemu-binfmt/aarch64-binfmt-P
flags: {flags}
offset 0
magic 7f454c460201010000000000000000000200b700
mask ffffffffffffff00fffffffffffffffffeffffff
"""
QEMU_RISCV64 = QEMU_AARCH64.replace("aarch64", "riscv64").replace("0200b700", "0200f300")


def table(tmp_path: Path, status: str = "enabled", **entries: str) -> Path:
    root = tmp_path / "binfmt_misc"
    root.mkdir(parents=True)
    (root / "status").write_text(status + "\n")
    (root / "register").write_text("")
    for name, text in entries.items():
        (root / name.replace("_", "-")).write_text(text)
    return root


@pytest.fixture(autouse=True)
def on_x86_64(monkeypatch):
    monkeypatch.setattr(emulation.platform, "machine", lambda: "x86_64")


def test_a_registered_fix_binary_handler_runs_aarch64(tmp_path):
    root = table(tmp_path, qemu_aarch64=QEMU_AARCH64.format(flags="PF"))
    assert emulation.why_not_runnable("aarch64", root) is None
    assert emulation.handler("aarch64", root)["name"] == "qemu-aarch64"
    assert emulation.why_not_runnable("x86_64", tmp_path / "nothing") is None     # the machine's own


def test_each_missing_piece_is_named(tmp_path):
    assert emulation.why_not_runnable("aarch64", tmp_path / "absent") == \
        f"binfmt_misc is not mounted ({tmp_path / 'absent' / 'status'} does not exist)"
    cases = {
        "off": (dict(status="disabled", qemu_aarch64=QEMU_AARCH64.format(flags="PF")), "binfmt_misc is disabled"),
        "other": (dict(qemu_riscv64=QEMU_RISCV64.format(flags="PF")), "no binfmt_misc handler in"),
        "noF": (dict(qemu_aarch64=QEMU_AARCH64.format(flags="P")), "lacks the F flag (flags: P): a container, "
                "whose files lack /usr/libexec/qemu-binfmt/aarch64-binfmt-P, cannot use it"),
        "disabled": (dict(qemu_aarch64=QEMU_AARCH64.format(flags="PF").replace("enabled\n", "disabled\n")),
                     "handler"),
    }
    for name, (entries, said) in cases.items():
        root = table(tmp_path / name, **entries)
        reason = emulation.why_not_runnable("aarch64", root)
        assert reason and said in reason, (name, reason)
    assert emulation.why_not_runnable("aarch64", table(tmp_path / "d2", qemu_aarch64=QEMU_AARCH64.format(
        flags="PF").replace("enabled\n", "disabled\n"))).endswith("qemu-aarch64 is disabled")


def test_the_refusal_names_the_field_the_machine_and_the_fix(tmp_path):
    with pytest.raises(EnvbuilderError) as err:
        emulation.require_runnable("aarch64", "arch", "apptainer build (aarch64 image)", tmp_path / "absent")
    assert err.value.field == "arch" and err.value.exit_code == 2
    assert err.value.reason.startswith("apptainer build (aarch64 image) runs aarch64 programs, but this machine is "
                                     "x86_64 and binfmt_misc is not mounted")
    assert "qemu-user-static and binfmt-support" in err.value.fix


def test_machine_names_follow_uname(monkeypatch):
    for found, said in (("arm64", "aarch64"), ("AMD64", "x86_64"), ("aarch64", "aarch64"), ("ppc64le", "ppc64le")):
        monkeypatch.setattr(emulation.platform, "machine", lambda f=found: f)
        assert emulation.machine() == said


def test_the_oci_names_are_the_catalogs_docker_platforms():
    # emulation sits below compat (compat's rules import runtimes, which import emulation), so it
    # keeps its own table of OCI names; this holds it to the catalog's `arches.*.docker`
    from envbuilder.compat.catalog import load_catalog
    arches = load_catalog().data["arches"]
    assert set(emulation.OCI_NAME) == set(arches)
    for name, arch in arches.items():
        assert arch["docker"] == "linux/" + emulation.OCI_NAME[name]
        assert emulation.UNAME_OF[emulation.OCI_NAME[name]] == name


def test_the_enabled_handler_is_the_one_that_serves(tmp_path):
    """.ci/install-qemu.sh registers a newer QEMU and disables Debian's entry: both stay listed."""
    root = table(tmp_path / "t", qemu_aarch64=QEMU_AARCH64.format(flags="PF").replace("enabled\n", "disabled\n"))
    (root / "envbuilder-qemu-aarch64").write_text(QEMU_AARCH64.format(flags="PF").replace(
        "/usr/libexec/qemu-binfmt/aarch64-binfmt-P", "/opt/envbuilder/qemu-11.1.3/aarch64-binfmt-P"))
    entry = emulation.handler("aarch64", root)
    assert entry["name"] == "envbuilder-qemu-aarch64" and entry["enabled"]
    assert entry["interpreter"] == "/opt/envbuilder/qemu-11.1.3/aarch64-binfmt-P"
    assert emulation.why_not_runnable("aarch64", root) is None
    (root / "envbuilder-qemu-aarch64").unlink()
    assert emulation.why_not_runnable("aarch64", root).endswith("qemu-aarch64 is disabled")


def test_this_machines_table(monkeypatch):
    monkeypatch.undo()
    if emulation.machine() != "x86_64" or emulation.handler("aarch64") is None:
        pytest.skip("no aarch64 handler registered here (.ci/install-qemu.sh registers one)")
    assert emulation.why_not_runnable("aarch64") is None
    # the interpreter the kernel runs answers --version (Debian 12's 7.2.x or .ci/install-qemu.sh's 11.x)
    assert re.fullmatch(r"\d+\.\d+(\.\d+)?", emulation.qemu_version("aarch64") or ""), emulation.handler("aarch64")


def test_apptainer_build_asks_for_the_specs_arch_where_it_is_not_the_machines(monkeypatch):
    from types import SimpleNamespace

    from envbuilder.engines.apptainer import apptainer_command
    from envbuilder.engines.options import BuildOptions

    def command(arch: str) -> list[str]:
        output = SimpleNamespace(stack=SimpleNamespace(spec=SimpleNamespace(name="n", target_arch=arch)))
        return apptainer_command(output, BuildOptions(engine="apptainer"), fakeroot=True)

    assert command("aarch64") == ["apptainer", "build", "--force", "--fakeroot", "--arch", "arm64",
                                  "n.sif", "Apptainer.def"]
    assert "--arch" not in command("x86_64")
    monkeypatch.setattr(emulation.platform, "machine", lambda: "aarch64")   # an aarch64 login node
    assert "--arch" not in command("aarch64")
    assert command("x86_64")[4:6] == ["--arch", "amd64"]
