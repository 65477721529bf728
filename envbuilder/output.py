"""Write an output folder atomically: all or nothing, and never delete what is already there,
but for files in the folders envbuilder owns (``pins/``, the smoke suite) that this write no
longer makes."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from .errors import EnvbuilderError

EXECUTABLE = {"job.sbatch"}


def _unwritable(folder: Path, exc: OSError) -> EnvbuilderError:
    return EnvbuilderError("--out", f"cannot write to {folder}: {exc.strerror or exc}",
                           "choose a folder you can write to with --out DIR")


def write_folder(folder: Path, files: dict[str, bytes], *, complete: bool = False) -> list[Path]:
    """Write ``files`` under ``folder``. A new folder appears complete or not at all; in an
    existing folder each file is replaced atomically and other files are left alone, but for
    (``complete``: ``files`` is everything a build folder holds) stale files in the folders
    envbuilder owns (``OWNED``)."""
    folder = Path(folder)
    parent = folder.parent
    written = []
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
        # existing folder: stage every file first, then swap each one in
        staged = []
        try:
            for name, data in sorted(files.items()):
                target = folder / name
                target.parent.mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
                staged.append((tmp, target))
                with os.fdopen(fd, "wb") as fh:
                    fh.write(data)
                os.chmod(tmp, 0o755 if name in EXECUTABLE else 0o644)
        except BaseException:
            for tmp, _ in staged:
                Path(tmp).unlink(missing_ok=True)
            raise
        for tmp, target in staged:
            os.replace(tmp, target)
            written.append(target)
        if complete:
            _drop_stale(folder, files)
        return written
    except PermissionError as exc:
        raise _unwritable(folder, exc) from None
    except OSError as exc:
        raise _unwritable(folder, exc) from None


OWNED = ("pins", "envbuilder_smoke")   # all generated: a file the new write lacks is stale


def _drop_stale(folder: Path, files: dict[str, bytes]) -> None:
    """A lock that no longer has a pip group must not leave that group's old pins file behind
    (it would sit in the build context, and mislead whoever reads the folder)."""
    for owned in OWNED:
        base = folder / owned
        if not base.is_dir():
            continue
        for path in sorted(base.rglob("*")):
            if path.is_file() and path.relative_to(folder).as_posix() not in files:
                path.unlink()


def _write_all(root: Path, files: dict[str, bytes]) -> None:
    for name, data in sorted(files.items()):
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        os.chmod(path, 0o755 if name in EXECUTABLE else 0o644)
    os.chmod(root, 0o755)
