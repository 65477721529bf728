"""The one way envbuilder creates or replaces a file outside a private temporary folder: never
through a symbolic link, never over something that is not a plain file, never over a file the
command may not replace.

- The folder a file goes into is opened once (a file descriptor); everything after happens
  relative to it (``openat``/``renameat``), so a folder swapped for a link after the check
  changes nothing. The user's own path to that folder may pass through links (a home folder
  often does); below ``inside`` (an output folder, an image directory) no component may be one.
- The new content goes to a temporary file created beside the target (``O_CREAT|O_EXCL|
  O_NOFOLLOW``), then is renamed over the target: a reader sees the old file or the new one.
  A rename replaces a link planted at the target, never its target; a link there before the
  check is refused, naming it.
- ``replace`` says what may be replaced: ``"any"`` plain file (reports, image.json: the
  command's own product), ``"never"`` (``init -o``: an existing file is the user's; the file
  is hard-linked into place, so even a file made meanwhile is never replaced), or a function of
  the existing file's first 8 KiB (``output.py``: the files envbuilder wrote). ``force``
  (``--force``) replaces any plain file.

Every refusal is an EnvbuilderError naming the path and the option (exit 2); nothing is
written then. tests/test_safewrite.py plants a link at every writer's destination;
tests/test_architecture.py keeps the list of modules that write files without this module.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Union

from .errors import EnvbuilderError, escape_controls

HEAD = 8192
Replace = Union[str, Callable[[bytes], bool]]
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


class UnsafeTarget(EnvbuilderError):
    """The path a file would go to is a link, not a plain file, or a file not to be replaced."""


def _link_error(option: str, shown: str) -> UnsafeTarget:
    return UnsafeTarget(option, f"{shown} is a symbolic link; envbuilder never writes through a link "
                        "(it could lead to a file elsewhere)",
                        f"remove the link {shown}, or give another path")


def _raced(option: str, shown: str) -> UnsafeTarget:
    return UnsafeTarget(option, f"{shown} appeared while envbuilder was writing it; left as it is",
                        f"see what else writes {shown}, then run the command again")


def _umask_mode() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def _open_folder(path: Path, option: str, made: list[Path] | None, inside: Path | None) -> int:
    """A descriptor of PATH's folder (made when MADE is a list). Below INSIDE no component may be
    a link; above it (the user's own path), links are the user's."""
    if inside is None:
        folder = path.parent if str(path.parent) else Path(".")
        if made is not None:
            with contextlib.suppress(FileExistsError):
                folder.mkdir(parents=True, exist_ok=True)
        try:
            return os.open(folder, _DIR_FLAGS)
        except NotADirectoryError:
            raise UnsafeTarget(option, f"{_shown(folder)} is not a folder, so {_shown(path)} cannot be made in it",
                               "give a path in a folder") from None
    inside = Path(inside)
    rel = path.relative_to(inside)
    fd = os.open(inside, _DIR_FLAGS)
    try:
        here = inside
        for part in rel.parts[:-1]:
            here = here / part
            try:
                nxt = os.open(part, _DIR_FLAGS | _NOFOLLOW, dir_fd=fd)
            except FileNotFoundError:
                if made is None:
                    raise
                os.mkdir(part, 0o755, dir_fd=fd)
                made.append(here)
                nxt = os.open(part, _DIR_FLAGS | _NOFOLLOW, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    if stat.S_ISLNK(os.stat(part, dir_fd=fd, follow_symlinks=False).st_mode):
                        raise _link_error(option, _shown(here)) from None
                    raise UnsafeTarget(option, f"{_shown(here)} is a file where envbuilder needs a folder",
                                       f"move {_shown(here)} away") from None
                raise
            os.close(fd)
            fd = nxt
        return fd
    except BaseException:
        os.close(fd)
        raise


def _lstat(fd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _head(fd: int, name: str) -> bytes:
    f = os.open(name, os.O_RDONLY | _NOFOLLOW | getattr(os, "O_NONBLOCK", 0), dir_fd=fd)
    try:
        return os.read(f, HEAD)
    finally:
        os.close(f)


def check_target(fd: int, name: str, shown: str, option: str, replace: Replace, force: bool) -> bool:
    """Whether NAME exists in the folder FD as a plain file this write may replace (False: nothing
    there); else one refusal naming SHOWN."""
    st = _lstat(fd, name)
    if st is None:
        return False
    if stat.S_ISLNK(st.st_mode):
        raise _link_error(option, shown)
    if not stat.S_ISREG(st.st_mode):
        raise UnsafeTarget(option, f"{shown} is not a plain file (a folder?) where envbuilder writes one",
                           f"move {shown} away, or give another path")
    if force or replace == "any":
        return True
    if replace == "never":
        raise UnsafeTarget(option, f"{shown} exists; replacing it would lose your file",
                           f"give another path with {option}, or --force to replace it")
    assert callable(replace)
    if not replace(_head(fd, name)):
        raise UnsafeTarget(option, f"{shown} was not written by envbuilder (it has no envbuilder header); "
                           "replacing it would lose your file",
                           f"move {shown} away, give another path, or give --force to replace it")
    return True


def stage(fd: int, name: str, data: bytes, mode: int) -> str:
    """DATA in a new file beside NAME in the folder FD (created, never opened through a link);
    its name there."""
    for _ in range(16):
        tmp = f".{name[:100]}.{secrets.token_hex(6)}.tmp"
        try:
            f = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | getattr(os, "O_CLOEXEC", 0),
                        0o600, dir_fd=fd)
            break
        except FileExistsError:
            continue
    else:  # pragma: no cover - 16 collisions of 48 random bits
        raise FileExistsError(errno.EEXIST, "no free temporary name", name)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(f, view):]
        os.fchmod(f, mode)
    except BaseException:
        os.close(f)
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=fd)
        raise
    os.close(f)
    return tmp


def check_folder(fd: int, folder: Path, option: str, inside: Path | None = None) -> None:
    """FOLDER still is the folder FD opened: no link now on the way below INSIDE, not swapped for
    another folder (else a refusal: the file would land in a folder no longer at that path)."""
    folder = Path(folder)
    try:
        if inside is not None:
            here = Path(inside)
            for part in folder.relative_to(inside).parts:
                here = here / part
                if stat.S_ISLNK(os.lstat(here).st_mode):
                    raise _link_error(option, _shown(here))
        st, fst = os.stat(folder), os.fstat(fd)
        same = (st.st_dev, st.st_ino) == (fst.st_dev, fst.st_ino)
    except FileNotFoundError:
        same = False
    if not same:
        raise UnsafeTarget(option, f"{_shown(folder)} was moved or replaced while envbuilder wrote into it; "
                           "nothing was written there", f"see what else changes {_shown(folder)}, then run "
                           "the command again")


def commit(fd: int, tmp: str, name: str, shown: str, option: str, replace: Replace, force: bool) -> None:
    """TMP (in folder FD) becomes NAME: checked once more just before; with ``replace="never"``
    (and no FORCE) by a hard link, which fails on anything there, a link included."""
    try:
        if replace == "never" and not force:
            check_target(fd, name, shown, option, replace, force)
            try:
                os.link(tmp, name, src_dir_fd=fd, dst_dir_fd=fd, follow_symlinks=False)
            except FileExistsError:
                check_target(fd, name, shown, option, replace, force)
                raise _raced(option, shown) from None
            except OSError as exc:
                if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EMLINK):
                    raise
                os.rename(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)     # a file system without hard links
                return
            os.unlink(tmp, dir_fd=fd)
            return
        check_target(fd, name, shown, option, replace, force)
        os.rename(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=fd)
        raise


def _shown(path: Path) -> str:
    """A path as a message shows it: a newline or escape sequence in a name escaped."""
    return escape_controls(str(path))


def write_file(path: str | Path, data: str | bytes, *, option: str, replace: Replace = "any",
               force: bool = False, mode: int | None = None, inside: str | Path | None = None) -> Path:
    """Create or replace the file PATH with DATA, whole (see the module's text). MODE defaults to
    0666 less the umask. INSIDE: a folder PATH lies in, below which no link is followed."""
    path = Path(path)
    data = data.encode() if isinstance(data, str) else data
    mode = _umask_mode() if mode is None else mode
    with _os_errors(option, path):
        fd = _open_folder(path, option, [], Path(inside) if inside is not None else None)
        try:
            check_target(fd, path.name, _shown(path), option, replace, force)
            tmp = stage(fd, path.name, data, mode)
            try:
                check_folder(fd, path.parent if str(path.parent) else Path("."), option,
                             Path(inside) if inside is not None else None)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=fd)
                raise
            commit(fd, tmp, path.name, _shown(path), option, replace, force)
        finally:
            os.close(fd)
    return path


@contextlib.contextmanager
def _os_errors(option: str, path: Path) -> Iterator[None]:
    try:
        yield
    except UnsafeTarget:
        raise
    except OSError as exc:
        raise UnsafeTarget(option, f"cannot write {_shown(path)}: {exc.strerror or exc}",
                           f"give {option} a path in a folder you can write to") from None


def place(source: str | Path, path: str | Path, *, option: str, replace: Replace = "any", force: bool = False,
          inside: str | Path | None = None) -> Path:
    """Rename SOURCE, a file this process made in a folder only it writes (on PATH's file system),
    to PATH, with write_file's checks (a SIF, an image archive)."""
    path = Path(path)
    with _os_errors(option, path):
        _place(Path(source), path, option, replace, force, inside)
    return path


def _place(source: Path, path: Path, option: str, replace: Replace, force: bool, inside) -> None:
    fd = _open_folder(path, option, [], Path(inside) if inside is not None else None)
    try:
        check_target(fd, path.name, _shown(path), option, replace, force)
        if replace == "never" and not force:
            try:
                os.link(source, path.name, dst_dir_fd=fd, follow_symlinks=False)
            except FileExistsError:
                check_target(fd, path.name, _shown(path), option, replace, force)
                raise _raced(option, _shown(path)) from None
            os.unlink(source)
        else:
            os.rename(source, path.name, dst_dir_fd=fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def open_new(path: str | Path, *, option: str, replace: Replace = "any", force: bool = False,
             mode: int = 0o644, inside: str | Path | None = None, text: bool = True) -> Iterator[IO]:
    """PATH opened for writing from its start, as a new file (O_CREAT|O_EXCL|O_NOFOLLOW) after the
    plain file there (if REPLACE allows) is removed: for what is written as it happens (a build
    log someone may follow) or streamed in (a download, to be checked and then renamed)."""
    path = Path(path)
    with _os_errors(option, path):
        f = _create(path, option, replace, force, mode, inside)
    with (open(f, "w", encoding="utf-8") if text else open(f, "wb")) as fh:
        yield fh


def _create(path: Path, option: str, replace: Replace, force: bool, mode: int, inside) -> int:
    fd = _open_folder(path, option, [], Path(inside) if inside is not None else None)
    try:
        if check_target(fd, path.name, _shown(path), option, replace, force):
            with contextlib.suppress(FileNotFoundError):      # removed meanwhile: as good
                os.unlink(path.name, dir_fd=fd)
        try:
            f = os.open(path.name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | getattr(os, "O_CLOEXEC", 0),
                        mode, dir_fd=fd)
        except FileExistsError:
            check_target(fd, path.name, _shown(path), option, replace, force)      # a link planted meanwhile
            raise _raced(option, _shown(path)) from None
    finally:
        os.close(fd)
    return f


def precheck(path: str | Path, *, option: str, replace: Replace = "any", force: bool = False,
             inside: str | Path | None = None) -> None:
    """Before long work whose result goes to PATH (a build, a SIF): the refusal write_file would
    give, now (the write itself checks again)."""
    path = Path(path)
    with _os_errors(option, path):
        try:
            fd = _open_folder(path, option, None, Path(inside) if inside is not None else None)
        except FileNotFoundError:
            return                      # its folder is made when written
        try:
            check_target(fd, path.name, _shown(path), option, replace, force)
        finally:
            os.close(fd)


def open_folder(folder: str | Path, rel_parent: str | Path, option: str, made: list[Path]) -> int:
    """A descriptor of FOLDER/REL_PARENT, missing folders made (and added to MADE), no link
    followed below FOLDER: for writers of many files (output.py)."""
    return _open_folder(Path(folder) / rel_parent / "x", option, made, Path(folder))
