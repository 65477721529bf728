"""Build the .sif with Apptainer (or SingularityCE) from the folder's Apptainer.def, with the
command line its header prints: `apptainer build [--fakeroot] [--bind ...] NAME.sif Apptainer.def`.

Unprivileged (as most HPC users build), with --fakeroot; before any work, each thing the machine
must allow for that is checked and a missing one refused by name (user namespaces, /dev/fuse,
subordinate ids). --ca-bundle, --netrc and --wheelhouse are bound for %post and %test at the paths
the file reads them from (its %setup makes those bind points), never copied into the image.
Without the binary, the command it would run is part of the message.

Another architecture's image (arch: aarch64 on an x86_64 machine): `--arch arm64` (Apptainer
otherwise takes the machine's own image of a multi-arch base: run here, a `Bootstrap: docker` base
with amd64 and arm64 images gave an amd64 .sif without it), %post and %test under QEMU (checked
first: emulation.py), and the .sif's root file system read back: its architecture must be the
spec's."""

from __future__ import annotations

import json
import os
import pwd
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from .. import emulation, safewrite
from ..errors import CheckFailed, EnvbuilderError
from ..sif import layout
from ..render.apptainer import ARCHIVES, archive_commands, archive_name
from ..render.common import CA_SECRET, NETRC_SECRET, WHEELHOUSE
from .context import check_inputs, pip_index_conf
from .options import BuildOptions
from .rootless import check_subids

USERNS_FILES = (
    # (file, what a 0 there means): Linux's limit, and Debian/Ubuntu's switch for unprivileged users
    (Path("/proc/sys/user/max_user_namespaces"), "user.max_user_namespaces is 0"),
    (Path("/proc/sys/kernel/unprivileged_userns_clone"), "kernel.unprivileged_userns_clone is 0"),
)
FUSE_DEVICE = Path("/dev/fuse")
LOG_NAME = "apptainer-build.log"


def find_binary() -> str | None:
    for name in ("apptainer", "singularity"):
        path = shutil.which(name)
        if path:
            return path
    return None


def gpu_visible(dev: Path = Path("/dev")) -> bool:
    """An NVIDIA GPU this machine's processes can open (its device files: /dev/nvidia0, ...)."""
    return any(dev.glob("nvidia[0-9]*"))


def apptainer_command(output, opts: BuildOptions, binary: str = "apptainer", fakeroot: bool = False,
                      notest: bool = False) -> list[str]:
    """The header's command line, with the binds the options ask for (sources made absolute);
    --notest where %test cannot pass here (a GPU image built on a machine without a GPU)."""
    cmd = [binary, "build", "--force"] + (["--fakeroot"] if fakeroot else []) + (["--notest"] if notest else [])
    arch = output.stack.spec.target_arch
    if arch != emulation.machine():
        cmd += ["--arch", emulation.OCI_NAME.get(arch, arch)]
    for source, target in ((opts.wheelhouse, WHEELHOUSE), (opts.ca_bundle, CA_SECRET), (opts.netrc, NETRC_SECRET)):
        if source:
            cmd += ["--bind", f"{Path(source).resolve()}:{target}:ro"]
    return cmd + [f"{output.stack.spec.name}.sif", "Apptainer.def"]


def check_unprivileged(uid: int, user: str, etc: Path = Path("/etc")) -> None:
    """What `apptainer build --fakeroot` needs from the machine, each refused by name (exit 2)."""
    for path, why in USERNS_FILES:
        try:
            value = path.read_text().strip()
        except OSError:
            continue              # this kernel has no such switch
        if value == "0":
            raise EnvbuilderError("apptainer build --fakeroot",
                                  f"this machine allows no unprivileged user namespaces ({why})",
                                  f"ask the admins to allow them (sysctl {why.split()[0]}=... above 0; "
                                  "Apptainer's admin guide, 'User namespace requirements'), or build as root")
    if not os.access(FUSE_DEVICE, os.R_OK | os.W_OK):
        reason = "does not exist" if not FUSE_DEVICE.exists() else "is not readable and writable by you"
        raise EnvbuilderError("apptainer build --fakeroot", f"{FUSE_DEVICE} {reason} (Apptainer mounts the "
                              "image's SquashFS with squashfuse and overlays with fuse-overlayfs, as you)",
                              "ask the admins for a usable /dev/fuse (module fuse loaded, mode 0666; in a "
                              "container: --device /dev/fuse)")
    check_subids("apptainer --fakeroot", user, uid, etc)


def _archive_image_id(path: Path, kind: str) -> str | None:
    """The image ID (its config's digest) of the one image a `docker save` or OCI archive holds;
    None when the archive names none it can be read from."""
    with tarfile.open(path) as tar:
        def member_json(name: str):
            try:
                fh = tar.extractfile(name)
            except KeyError:
                return None
            return json.load(fh) if fh else None

        if kind == "docker-archive":
            manifest = member_json("manifest.json")
            config = manifest[0].get("Config", "") if isinstance(manifest, list) and manifest else ""
            hexid = config.removeprefix("blobs/sha256/").removesuffix(".json")
        else:
            index = member_json("index.json")
            digests = [m.get("digest", "") for m in (index or {}).get("manifests", []) if isinstance(m, dict)]
            manifest = member_json("blobs/sha256/" + digests[0].removeprefix("sha256:")) if digests else None
            hexid = ((manifest or {}).get("config") or {}).get("digest", "").removeprefix("sha256:")
    return f"sha256:{hexid}" if len(hexid) == 64 else None


def check_base_archives(folder: Path, stack, base_from: str) -> None:
    """base_from docker-archive / oci-archive: each base's archive is in the folder before Apptainer
    is started; a `docker save` archive must hold the image the lock names (a local base's image
    ID: its config's digest). An OCI archive's config is written anew by the tool that wrote it
    (`buildah push` of the same image gave another digest here), so there is no ID to compare."""
    if base_from not in ARCHIVES:
        return
    entries = (stack.lock.base if stack.lock else {}) or {}
    locked = {e.get("ref"): e for e in entries.values() if isinstance(e, dict)}
    for ref in dict.fromkeys((stack.base, stack.runtime_base)):
        path = folder / archive_name(ref, base_from)
        if not path.is_file():
            raise EnvbuilderError("base_from", f"{base_from}: the base {ref} is read from {path}, which is missing",
                                  f"write it where the image is: {archive_commands(ref, base_from)} (in {folder})")
        try:
            found = _archive_image_id(path, base_from)
        except (tarfile.TarError, OSError, ValueError, AttributeError) as exc:
            raise EnvbuilderError("base_from", f"{path} is not a readable {base_from}: {exc}",
                                  f"write it again: {archive_commands(ref, base_from)}") from None
        entry = locked.get(ref)
        if base_from == "docker-archive" and entry and entry.get("kind") == "image-id" and found != entry.get("digest"):
            raise EnvbuilderError("base_from", f"{path} holds image {(found or 'none')[:19]}; the lock names "
                                  f"{str(entry.get('digest'))[:19]} for {ref}",
                                  f"write it again from the locked image: {archive_commands(ref, base_from)}, or "
                                  "re-lock: envbuilder lock SPEC --update base")


def _shown(folder: Path, cmd: list[str]) -> str:
    return f"cd {shlex.quote(str(folder))} && {' '.join(shlex.quote(c) for c in cmd)}"


def _last_lines(path: Path, count: int = 8) -> str:
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    return "\n    ".join(lines[-count:])


def build(folder: Path, output, opts: BuildOptions) -> dict:
    check_inputs(opts.ca_bundle, opts.wheelhouse)
    if opts.netrc and not Path(opts.netrc).is_file():
        raise EnvbuilderError("--netrc", f"no such file: {opts.netrc}",
                              "give a netrc file: machine HOST login USER password TOKEN")
    check_base_archives(folder, output.stack, output.stack.spec.base_from)
    if pip_index_conf(opts.index_url, opts.extra_index_urls) and not opts.quiet:
        print("warning: the configured pip index (pip_index_url / extra_index_url) is not handed to "
              "`apptainer build` yet: its %post installs from PyPI and the wheelhouse (docs/config.md)",
              file=sys.stderr)
    uid = os.geteuid()
    binary = find_binary()
    # a GPU image's %test runs the smoke suite's GPU checks, which fail without a GPU: most login
    # nodes, where images are built, have none; it is run on a GPU node instead (the message says how)
    notest = output.stack.spec.gpu and not gpu_visible()
    cmd = apptainer_command(output, opts, binary or "apptainer", fakeroot=uid != 0, notest=notest)
    if binary is None:
        raise CheckFailed("apptainer build", "neither apptainer nor singularity is installed here",
                          f"on a machine that has it, run: {_shown(folder, cmd)}")
    if uid != 0:
        check_unprivileged(uid, pwd.getpwuid(uid).pw_name)
    arch = output.stack.spec.target_arch
    emulation.require_runnable(arch, "arch", f"apptainer build ({arch} image: %post and %test)")
    log_path = folder / LOG_NAME
    sif = folder / cmd[-2]
    safewrite.precheck(sif, option="apptainer build", inside=folder)
    started = time.monotonic()
    # apptainer writes the .sif into a folder only this process writes; safewrite.place moves it
    # (never through a link planted at NAME.sif)
    private = Path(tempfile.mkdtemp(prefix=f".{sif.name}.", dir=folder))
    try:
        with safewrite.open_new(log_path, option="build log", inside=folder) as log:
            log.write(f"$ {_shown(folder, cmd)}\n")
            log.write(f"# (run with {sif.name} in {private.name}/, then moved to {sif.name}: never through a link)\n")
            log.flush()
            code = subprocess.run(cmd[:-2] + [str(private / sif.name), cmd[-1]], cwd=folder, stdout=log,
                                  stderr=subprocess.STDOUT).returncode
        if code != 0:
            raise CheckFailed("apptainer build", f"`{_shown(folder, cmd)}` failed (exit {code}); its last lines:\n    "
                              + _last_lines(log_path), f"the full log is {log_path}")
        safewrite.place(private / sif.name, sif, option="apptainer build", inside=folder)
    finally:
        shutil.rmtree(private, ignore_errors=True)
    size, seconds = sif.stat().st_size, time.monotonic() - started
    built_arch = check_sif_arch(sif, arch)
    if not opts.quiet:
        tested = ("%test: not run, no GPU here; on a GPU node: apptainer test " + sif.name) if notest else \
            "%test: the smoke suite passed"
        print(f"built {sif} ({size / 1e6:.0f} MB, {built_arch}) in {seconds:.0f} s ({tested}); log {log_path}")
    return {"engine": "apptainer", "sif": str(sif), "size_bytes": size, "build_seconds": round(seconds, 1),
            "arch": built_arch, "log": str(log_path)}


def check_sif_arch(sif: Path, arch: str) -> str:
    """The .sif just built holds an ARCH root file system (its Go name returned); else CheckFailed."""
    want = emulation.OCI_NAME.get(arch, arch)
    try:
        found = layout.root_arch(sif)
    except (OSError, layout.NotSif) as err:
        raise CheckFailed("apptainer build", f"the .sif it wrote cannot be read back: {err}",
                          f"build it again; the log is {sif.parent / LOG_NAME}") from None
    if found != want:
        raise CheckFailed("apptainer build", f"{sif} holds an {found} root file system, but the spec's arch is "
                          f"{arch} ({want}): the base gave Apptainer its {found} image",
                          f"give a base that has a {want} image (a multi-arch one, or one built for {want}) "
                          f"and build with --arch {want}")
    return found
