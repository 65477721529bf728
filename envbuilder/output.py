"""Write an output folder atomically: all or nothing, and never delete what is already there,
but for files in the folders envbuilder owns (``pins/``, the smoke suite) that this write no
longer makes and that envbuilder itself made (by their names; anything else there is kept and
named). Nothing outside the folder is touched: a symbolic link inside it is refused, not
followed."""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import sys
import tempfile
from pathlib import Path

from . import safewrite
from .errors import EnvbuilderError, escape_controls

EXECUTABLE = {"job.sbatch", "slurm-epilog.sh"}
OWNED = ("pins", "envbuilder_smoke")   # all generated: a file the new write lacks is stale
# the names envbuilder gives files in the folders it owns (lock/pins.py, the smoke suite)
GENERATED = re.compile(r"pins/(?:apt|pip|conda)-[a-z0-9-]+\.(?:txt|yml|json|py)"
                       r"|envbuilder_smoke/(?:[a-z_][a-z0-9_]*\.py|__pycache__/[A-Za-z0-9_.-]+\.pyc)")
# How envbuilder knows a file it is about to replace is its own: the header line of the recipes
# (render/common.py header), the "schema" that opens manifest.json and envbuilder.lock, the text of
# the wheelhouse README (generate.py). A file without its marker is the user's: not replaced
# without --force.
_HEAD = 8192
MARKERS = (
    re.compile(rb"^\{\s*\"schema\": \"envbuilder\.(?:manifest|lock)/"),
    re.compile(rb"(?m)^# Written by envbuilder \S+ from a spec with sha256 [0-9a-f]+\.$"),
    re.compile(rb"^Local wheels for offline or air-gapped builds: put \.whl files here"),
)


def written_by_envbuilder(path: Path, new: bytes | None = None) -> bool:
    """Whether the file at PATH is one envbuilder wrote (or holds exactly what it would write)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(_HEAD)
    except OSError:
        return False
    return _ours(new)(head)


def _unwritable(folder: Path, exc: OSError, name: str | None = None) -> EnvbuilderError:
    where = f"{folder / name}" if name else f"{folder}"
    return EnvbuilderError("--out", f"cannot write {where}: {exc.strerror or exc}",
                           "choose a folder you can write to with --out DIR" if not name else
                           f"remove or rename {where}, or choose another folder with --out DIR")


def check_replaceable(path: Path, option: str, force: bool = False) -> None:
    """Before work whose result goes to PATH (`lock --lock FILE`): refuse a link, anything but a
    plain file, and a file envbuilder did not write unless FORCE."""
    safewrite.precheck(path, option=option, replace=_ours(None), force=force)


def _check_paths(folder: Path, files: dict[str, bytes], force: bool = False) -> None:
    """Before anything is written: no link inside the folder (it would lead out of it), every
    target a file or nothing (not a folder), and (unless FORCE) every file replaced one that
    envbuilder wrote."""
    seen = set()
    for name in sorted(files):
        parts = Path(name).parts
        if Path(name).is_absolute() or ".." in parts:
            raise EnvbuilderError("--out", f"{name} is not a path inside the output folder",
                                  "this is a bug in envbuilder: report it")
        for n in range(1, len(parts) + 1):
            rel = "/".join(parts[:n])
            if rel in seen:
                continue
            seen.add(rel)
            path = folder / rel
            if path.is_symlink():
                raise EnvbuilderError("--out", f"{path} is a symbolic link; envbuilder never writes "
                                      "through a link (it could lead out of the output folder)",
                                      f"remove the link {path}, or choose another folder with --out DIR")
            if n < len(parts) and path.exists() and not path.is_dir():
                raise EnvbuilderError("--out", f"{path} is a file where envbuilder needs a folder",
                                      f"move {path} away, or choose another folder with --out DIR")
            if n == len(parts) and path.exists() and not path.is_file():
                raise EnvbuilderError("--out", f"{path} is not a plain file (a folder?) where envbuilder "
                                      "writes one", f"move {path} away, or choose another folder with --out DIR")
            if n == len(parts) and path.is_file() and not force and parts[0] not in OWNED \
                    and not written_by_envbuilder(path, files[name]):
                raise EnvbuilderError("--out", f"{path} was not written by envbuilder (it has no envbuilder "
                                      "header); replacing it would lose your file",
                                      f"move {path} away, choose another folder with --out DIR, or give "
                                      "--force to replace it")
    for owned in OWNED:
        if (folder / owned).is_symlink():
            raise EnvbuilderError("--out", f"{folder / owned} is a symbolic link; envbuilder never follows "
                                  "a link out of the output folder",
                                  f"remove the link {folder / owned}, or choose another folder with --out DIR")


# folders the operating system owns: the file system's root, every folder directly under it, the
# folders directly under /var and /run (/var/lib, /run/user, ...: their subfolders belong to
# whoever made them), and everything below the trees the package manager and the kernel own
SYSTEM_TREES = ("bin", "boot", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc", "sbin", "sys", "usr")
SHARED_ROOTS = ("var", "run")


def system_folder(folder: Path) -> str | None:
    """Why FOLDER (as it resolves, links followed) belongs to the system, or None."""
    real = Path(os.path.realpath(Path(folder).expanduser()))
    leads = f"it leads to {real}: " if real != Path(folder).absolute() else ""
    parts = real.parts[1:]
    if not parts:
        return f"{leads}the file system's root"
    if len(parts) == 1:
        return f"{leads}a folder directly under /"
    if parts[0] in SYSTEM_TREES:
        return f"{leads}inside /{parts[0]}"
    if len(parts) == 2 and parts[0] in SHARED_ROOTS:
        return f"{leads}a folder directly under /{parts[0]}"
    return None


def check_output_folder(folder: Path, option: str) -> None:
    """Before anything is written: an output folder is never one the system owns (as root, `--out /`
    would put a Dockerfile and a job script into /)."""
    why = system_folder(folder)
    if why:
        raise EnvbuilderError(option, f"{folder} is a system folder ({why}): envbuilder writes only into "
                              "a folder of its own", f"give a folder of yours with {option} (by default "
                              "images/<name> under the current folder)")


def write_folder(folder: Path, files: dict[str, bytes], *, complete: bool = False, note=None,
                 force: bool = False) -> list[Path]:
    """Write ``files`` under ``folder``. A new folder appears complete or not at all; in an
    existing folder every file is staged first, then swapped in; a failure puts the old files
    back and names the file. Other files are left alone, but for (``complete``: ``files`` is
    everything a build folder holds) stale generated files in the folders envbuilder owns. A
    file envbuilder did not write is not replaced unless ``force`` (--force)."""
    folder = Path(folder)
    check_output_folder(folder, "--out")
    parent = folder.parent
    try:
        if not folder.exists():
            parent.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=parent))
            try:
                _write_all(staging, files)
                os.rename(staging, folder)
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True)
                raise
            return [folder / name for name in sorted(files)]
        if not folder.is_dir():
            raise EnvbuilderError("--out", f"{folder} exists and is not a folder",
                                  "choose another path with --out DIR")
    except OSError as exc:
        raise _unwritable(folder, exc) from None
    _check_paths(folder, files, force)
    return _update(folder, files, complete, note or _note, force)


def _note(text: str) -> None:
    print(f"note: {escape_controls(text, keep_lines=True)}", file=sys.stderr)


def _update(folder: Path, files: dict[str, bytes], complete: bool, note, force: bool = False) -> list[Path]:
    """Every file staged beside its target first (each folder opened once, no link below FOLDER
    followed: safewrite.py), then swapped in, each target checked again just before; a failure
    puts the old files back."""
    staged: list[tuple[int, str, Path, str]] = []    # (folder fd, tmp name, target, name)
    made_dirs: list[Path] = []
    fds: dict[str, int] = {}
    swapped: list[tuple[int, Path, str | None]] = []  # (folder fd, target, backup or None when it was new)
    current = None
    try:
        for name, data in sorted(files.items()):
            current = name
            target = folder / name
            rel_parent = str(Path(name).parent)
            if rel_parent not in fds:
                fds[rel_parent] = safewrite.open_folder(folder, rel_parent, "--out", made_dirs)
            fd = fds[rel_parent]
            tmp = safewrite.stage(fd, target.name, data, 0o755 if name in EXECUTABLE else 0o644)
            staged.append((fd, tmp, target, name))
        for fd, tmp, target, name in staged:
            current = name
            ours = None if force or name.split("/")[0] in OWNED else _ours(files[name])
            shown = escape_controls(str(target))
            safewrite.check_folder(fd, target.parent, "--out", folder)
            exists = safewrite.check_target(fd, target.name, shown, "--out", ours or "any", force)
            backup = None
            if exists:
                backup = f".{target.name}.old.{os.getpid()}.{secrets.token_hex(4)}"
                os.link(target.name, backup, src_dir_fd=fd, dst_dir_fd=fd, follow_symlinks=False)
            swapped.append((fd, target, backup))
            safewrite.commit(fd, tmp, target.name, shown, "--out", ours or "any", force)
    except (OSError, EnvbuilderError) as exc:
        for fd, target, backup in reversed(swapped):
            try:
                if backup:
                    os.replace(backup, target.name, src_dir_fd=fd, dst_dir_fd=fd)
                else:
                    os.unlink(target.name, dir_fd=fd)
            except OSError:
                pass
        for fd, tmp, _, _ in staged:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=fd)
        for d in reversed(made_dirs):
            shutil.rmtree(d, ignore_errors=True)
        for fd in fds.values():
            os.close(fd)
        if isinstance(exc, EnvbuilderError):
            raise
        raise _unwritable(folder, exc, current) from None
    except BaseException:
        for fd, tmp, _, _ in staged:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=fd)
        for fd in fds.values():
            os.close(fd)
        raise
    for fd, _, backup in swapped:
        if backup:
            with contextlib.suppress(OSError):
                os.unlink(backup, dir_fd=fd)
    for fd in fds.values():
        os.close(fd)
    if complete:
        _drop_stale(folder, files, note)
    return [target for _, _, target, _ in staged]


def _ours(new: bytes | None):
    """safewrite's test of an existing file's head: envbuilder's marker, or exactly NEW."""
    def test(head: bytes) -> bool:
        return (new is not None and len(head) < _HEAD and head == new) or any(m.search(head) for m in MARKERS)
    return test


def write_atomic(path: str | Path, data: str | bytes, mode: int | None = None, *, option: str = "write",
                 replace: safewrite.Replace = "any", force: bool = False, inside: str | Path | None = None) -> None:
    """One file that a reader sees whole or not at all (a report, image.json, a bundle, init -o):
    safewrite.write_file (never through a link; REPLACE: what may be replaced). MODE defaults to
    0666 less the umask (a report is for sharing). The one atomic file writer outside the image
    (the smoke suite inside it is stdlib-only and has its own: smoke/common.py write_text_atomic)."""
    safewrite.write_file(path, data, option=option, replace=replace, force=force, mode=mode, inside=inside)


def _drop_stale(folder: Path, files: dict[str, bytes], note) -> None:
    """A lock that no longer has a pip group must not leave that group's old pins file behind
    (it would sit in the build context, and mislead whoever reads the folder). A file there
    that envbuilder did not make is kept, and named."""
    for owned in OWNED:
        base = folder / owned
        if base.is_symlink() or not base.is_dir():
            continue
        for path in sorted(base.rglob("*")):
            rel = path.relative_to(folder).as_posix()
            if path.is_symlink() or not path.is_file() or rel in files:
                continue
            if GENERATED.fullmatch(rel):
                path.unlink()
            else:
                note(f"kept {path}: envbuilder did not write it, but {owned}/ is envbuilder's "
                     "(it goes into the build context); move it elsewhere")


def _write_all(root: Path, files: dict[str, bytes]) -> None:
    for name, data in sorted(files.items()):
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        os.chmod(path, 0o755 if name in EXECUTABLE else 0o644)
    os.chmod(root, 0o755)
