"""What a login node must give podman or buildah before envbuilder starts any work with them: each
missing piece is a named refusal (EnvbuilderError, exit 2) with what to ask for, or a warning.

Rootless (not root):
- subordinate ids: at least 65,536 uids and gids for the user in /etc/subuid and /etc/subgid
  (the images' files belong to uids up to 65534), and newuidmap/newgidmap (uidmap);
- a runtime folder: $XDG_RUNTIME_DIR, a folder the user owns and can write; unset, podman takes
  /run/user/UID when that is writable, else $TMPDIR/podman-run-UID (buildah: $TMPDIR/containers-user-UID);
- storage: overlay (a kernel >= 5.13 mounts it unprivileged, else fuse-overlayfs); without either
  containers/storage falls back to vfs, which copies every layer in full: a warning with the disk;
Root and rootless: room on the file system of the storage's graphroot (engines/buildah.check_disk).
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import tempfile
from pathlib import Path

from ..errors import EnvbuilderError
from .buildah import MIN_FREE_GB, check_disk, storage_driver

MIN_SUBIDS = 65536
OVERLAY_KERNEL = (5, 13)        # unprivileged overlay mounts in a user namespace (Linux 5.13)
GUIDE = "docs/login-node.md"


def subid_count(path: Path, user: str, uid: int) -> int:
    """How many subordinate ids ``path`` (/etc/subuid or /etc/subgid) gives the user (name or uid)."""
    try:
        text = path.read_text()
    except OSError:
        return 0
    total = 0
    for line in text.splitlines():
        bits = line.strip().split(":")
        if len(bits) == 3 and bits[0] in (user, str(uid)) and bits[2].isdigit():
            total += int(bits[2])
    return total


def check_subids(engine: str, user: str, uid: int, etc: Path = Path("/etc")) -> None:
    for kind in ("uid", "gid"):
        have = subid_count(etc / f"sub{kind}", user, uid)
        if have < MIN_SUBIDS:
            raise EnvbuilderError(
                f"{engine} rootless", f"user {user} has {have or 'no'} subordinate {kind}s in {etc / f'sub{kind}'} "
                f"(a rootless {engine} needs {MIN_SUBIDS}: the image's files belong to uids up to 65534)",
                f"ask the admins: usermod --add-subuids 100000-165535 --add-subgids 100000-165535 {user} "
                f"(LDAP users: the site's subid set-up); see {GUIDE}")
    for tool in ("newuidmap", "newgidmap"):
        if shutil.which(tool) is None and not Path("/usr/bin", tool).exists():
            raise EnvbuilderError(f"{engine} rootless", f"{tool} is not installed",
                                  f"ask the admins for the uidmap package (setuid {tool}); see {GUIDE}")


def _writable_folder(path: Path, uid: int) -> str | None:
    """None when ``path`` is a folder ``uid`` owns and can write; else why not."""
    try:
        st = path.stat()
    except OSError:
        return "does not exist"
    if not path.is_dir():
        return "is not a folder"
    if st.st_uid != uid:
        return f"belongs to uid {st.st_uid}, not to you ({uid})"
    if not os.access(path, os.W_OK | os.X_OK):
        return "is not writable"
    return None


def check_runtime_dir(engine: str, uid: int, env=None) -> str:
    """The runtime folder the engine will use (or refuse): $XDG_RUNTIME_DIR, /run/user/UID, $TMPDIR."""
    env = os.environ if env is None else env
    given = env.get("XDG_RUNTIME_DIR")
    if given:
        why = _writable_folder(Path(given), uid)
        if why:
            raise EnvbuilderError(
                f"{engine} rootless", f"XDG_RUNTIME_DIR={given} {why}; {engine} keeps its runtime state there",
                "log in afresh (systemd-logind makes /run/user/UID), or point it at a folder of your own: "
                f"export XDG_RUNTIME_DIR=$(mktemp -d /tmp/run-$(id -u)-XXXX); see {GUIDE}")
        return given
    run_user = Path("/run/user") / str(uid)
    if _writable_folder(run_user, uid) is None:
        return str(run_user)
    tmp = Path(env.get("TMPDIR") or tempfile.gettempdir())
    if os.access(tmp, os.W_OK | os.X_OK):
        return str(tmp / f"{engine}-run-{uid}")           # the engines' own fallback
    raise EnvbuilderError(
        f"{engine} rootless", f"no runtime folder: XDG_RUNTIME_DIR is unset, {run_user} is not yours and "
        f"{tmp} is not writable", f"export XDG_RUNTIME_DIR to a folder you own (mode 700); see {GUIDE}")


def kernel_version(release: str | None = None) -> tuple[int, int]:
    m = re.match(r"(\d+)\.(\d+)", release or os.uname().release)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def storage_warning(engine: str, driver: str, graph_root: Path, *, kernel: tuple[int, int],
                    fuse_overlayfs: str | None, image_gb: float) -> str | None:
    """A warning when the storage is vfs (every layer a full copy), with its cause and cost."""
    if driver != "vfs":
        return None
    if kernel < OVERLAY_KERNEL and not fuse_overlayfs:
        cause = (f"no fuse-overlayfs and kernel {kernel[0]}.{kernel[1]} (< {OVERLAY_KERNEL[0]}.{OVERLAY_KERNEL[1]} "
                 "cannot mount overlay without root)")
    else:
        cause = "the storage configuration asks for vfs"
    return (f"{engine} storage is vfs: {cause}. vfs copies every layer in full: this build needs about "
            f"{image_gb * 3:.0f} GB under {graph_root} instead of about {image_gb:.0f} GB, and is slower "
            f"(fix: install fuse-overlayfs and set driver = \"overlay\" in ~/.config/containers/storage.conf; "
            f"see {GUIDE})")


def preflight(engine, gpu: bool) -> list[str]:
    """Before the lock or the build with podman/buildah (engines/buildah.OciEngine): refuse what
    a login node lacks; return warnings to print."""
    warnings = []
    uid = os.geteuid()
    if uid != 0:
        user = pwd.getpwuid(uid).pw_name if _has_passwd(uid) else str(uid)
        check_subids(engine.name, user, uid)
        check_runtime_dir(engine.name, uid)
    driver = storage_driver(engine)
    warning = storage_warning(engine.name, driver, engine.graph_root(), kernel=kernel_version(),
                              fuse_overlayfs=shutil.which("fuse-overlayfs"), image_gb=MIN_FREE_GB[gpu])
    if warning:
        warnings.append(warning)
    check_disk(engine, gpu, vfs=driver == "vfs")
    return warnings


def _has_passwd(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True
