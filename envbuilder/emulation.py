"""Can this machine run programs built for another CPU architecture? An aarch64 image built or
run on an x86_64 machine runs each program under QEMU's user-mode emulator, which the kernel
starts through binfmt_misc: Debian's qemu-user-static (with binfmt-support) registers one
handler per architecture (qemu-aarch64) in /proc/sys/fs/binfmt_misc.

A handler serves a container only with the F flag ("fix binary"): the kernel then opens the
interpreter once, at registration, instead of looking for it in the container's file system at
each exec (Linux's Documentation/admin-guide/binfmt-misc.rst). Apptainer reads the same table
before it runs a foreign image and refuses one it finds no handler for ("the image's architecture
(arm64) could not run on the host's (amd64)", Apptainer 1.4.5, run here: docs/aarch64.md).
"""

from __future__ import annotations

import platform
import re
import subprocess
from pathlib import Path

from .errors import EnvbuilderError

BINFMT = Path("/proc/sys/fs/binfmt_misc")
# e_machine of each architecture's ELF executables (the ELF specification's EM_* numbers): the byte
# a binfmt_misc magic matches at offset 18 (EM_AARCH64 183, EM_X86_64 62)
ELF_MACHINE = {"aarch64": 0xB7, "x86_64": 0x3E}
# the names the kernel (uname -m), Go/OCI (Apptainer --arch, SIF headers) and Docker give each one
OCI_NAME = {"aarch64": "arm64", "x86_64": "amd64"}
UNAME_OF = {"arm64": "aarch64", "amd64": "x86_64", "aarch64": "aarch64", "x86_64": "x86_64"}
FIX = ("on Debian or Ubuntu install qemu-user-static and binfmt-support (they register qemu-aarch64 "
       "with the F flag; first `mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc` where it is "
       "not mounted; torch >= 2.15's aarch64 wheel needs a QEMU newer than Debian 12's 7.2: "
       "docs/aarch64.md), or do this on an aarch64 machine (a login or compute node of the aarch64 partition)")


def machine() -> str:
    """This machine's architecture as uname -m names it (x86_64, aarch64)."""
    found = platform.machine()
    return UNAME_OF.get(found.lower(), found)


def _entry(path: Path) -> dict:
    fields: dict = {"name": path.name, "enabled": False, "flags": "", "magic": "", "interpreter": ""}
    for line in path.read_text(errors="replace").splitlines():
        key, _, value = line.partition(" ")
        if key == "enabled":
            fields["enabled"] = True
        elif key in ("flags:", "magic", "interpreter", "offset"):
            fields[key.rstrip(":")] = value.strip()
    return fields


def handler(arch: str, root: Path = BINFMT) -> dict | None:
    """The binfmt_misc entry whose magic matches 64-bit little-endian ELF executables of ARCH: the
    enabled one where there are several (.ci/install-qemu.sh disables Debian's when it registers a
    newer QEMU), else the first by name."""
    want = ELF_MACHINE.get(arch)
    try:
        paths = sorted(p for p in root.iterdir() if p.name not in ("register", "status"))
    except OSError:
        return None
    found = []
    for path in paths:
        try:
            entry = _entry(path)
        except OSError:
            continue
        magic = entry["magic"]
        if entry.get("offset", "0") != "0" or len(magic) < 40 or not magic.startswith("7f454c4602"):
            continue
        try:
            if int(magic[36:38], 16) == want:
                found.append(entry)
        except ValueError:
            continue
    return next((e for e in found if e["enabled"]), found[0] if found else None)


def qemu_version(arch: str, root: Path = BINFMT) -> str | None:
    """The version the ARCH handler's QEMU prints ("7.2.22"), None where there is no handler or
    it does not say (the interpreter is run with --version only: it is the machine's own file,
    registered by root, not anything an input names)."""
    entry = handler(arch, root)
    if entry is None or not entry["interpreter"]:
        return None
    try:
        out = subprocess.run([entry["interpreter"], "--version"], capture_output=True, text=True,
                             timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"version (\d+\.\d+(?:\.\d+)?)", out)
    return match.group(1) if match else None


def why_not_runnable(arch: str, root: Path = BINFMT) -> str | None:
    """None when this machine runs ARCH programs (natively, or through a binfmt_misc handler that
    containers can use); else what is missing, in words."""
    if arch == machine():
        return None
    status = root / "status"
    try:
        state = status.read_text().strip()
    except OSError:
        return f"binfmt_misc is not mounted ({status} does not exist)"
    if state != "enabled":
        return f"binfmt_misc is {state} ({status})"
    entry = handler(arch, root)
    if entry is None:
        return f"no binfmt_misc handler in {root} runs {arch} programs"
    if not entry["enabled"]:
        return f"the {arch} handler {root / entry['name']} is disabled"
    if "F" not in entry["flags"]:
        return (f"the {arch} handler {root / entry['name']} lacks the F flag (flags: {entry['flags'] or 'none'}): "
                f"a container, whose files lack {entry['interpreter'] or 'its interpreter'}, cannot use it")
    return None


def require_runnable(arch: str, where: str, doing: str, root: Path = BINFMT) -> None:
    """EnvbuilderError (exit 2) naming WHERE when this machine cannot run ARCH programs for DOING."""
    reason = why_not_runnable(arch, root)
    if reason:
        raise EnvbuilderError(where, f"{doing} runs {arch} programs, but this machine is {machine()} and "
                              f"{reason}", FIX)
