"""The build context handed to an engine: the output folder's files plus local wheels.

Assembled in a temporary folder so a wheelhouse never lands in the output folder, and the
CA bundle never lands anywhere but a BuildKit secret.
"""

from __future__ import annotations

import configparser
import os
import re
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

from ..errors import EnvbuilderError
from ..config import DEFAULT_INDEX
from ..render.common import PIP_INDEX_CONF


def check_inputs(ca_bundle: str | None, wheelhouse: str | None) -> None:
    if ca_bundle and not Path(ca_bundle).is_file():
        raise EnvbuilderError("--ca-bundle", f"no such file: {ca_bundle}",
                              "give a PEM bundle, e.g. /etc/ssl/certs/ca-certificates.crt")
    if wheelhouse and not Path(wheelhouse).is_dir():
        raise EnvbuilderError("--wheelhouse", f"no such folder: {wheelhouse}",
                              "give a folder that holds .whl files")


def pip_config_files(env: Mapping[str, str]) -> list[Path]:
    """pip's configuration files, in the order pip reads them (a later one wins): global, user,
    site (the active virtual environment), then PIP_CONFIG_FILE (pip's docs, "Configuration")."""
    home = Path(env.get("HOME") or Path.home())
    dirs = [d for d in (env.get("XDG_CONFIG_DIRS") or "/etc/xdg").split(":") if d]
    files = [Path(d) / "pip" / "pip.conf" for d in reversed(dirs)] + [Path("/etc/pip.conf")]
    files += [home / ".pip" / "pip.conf", Path(env.get("XDG_CONFIG_HOME") or home / ".config") / "pip" / "pip.conf"]
    if env.get("VIRTUAL_ENV"):
        files.append(Path(env["VIRTUAL_ENV"]) / "pip.conf")
    if env.get("PIP_CONFIG_FILE") and env["PIP_CONFIG_FILE"] != os.devnull:
        files.append(Path(env["PIP_CONFIG_FILE"]))
    return files


def host_pip_ca_bundle(env: Mapping[str, str] | None = None) -> tuple[str, str] | None:
    """The CA bundle this machine's pip trusts beyond its own (PIP_CERT, or `cert` in a pip
    configuration file's [global] or [install] section) and where that is set; None when pip
    trusts only its own bundle. A build does not see the host's pip settings: without the bundle
    its pip fails behind the same TLS-intercepting proxy that the host's pip passes."""
    env = os.environ if env is None else env
    if env.get("PIP_CERT"):
        found = (env["PIP_CERT"], "PIP_CERT")
    else:
        found = None
        for path in pip_config_files(env):
            parser = configparser.ConfigParser(interpolation=None)
            try:
                parser.read(path, encoding="utf-8")
            except (configparser.Error, OSError, UnicodeDecodeError):
                continue        # pip itself reports a broken file; it trusts no bundle from it
            for section in ("global", "install"):
                if parser.has_option(section, "cert"):
                    found = (parser.get(section, "cert").strip(), f"{path} [{section}] cert")
    if found and found[0] and Path(found[0]).is_file():
        return found
    return None


def pip_index_conf(index_url: str | None, extra_index_urls: tuple[str, ...] | list[str] = ()) -> str | None:
    """The pip configuration the build's pip reads for the site's index (render/common.py
    network_setup), or None when the index is PyPI's and there is no other."""
    if (not index_url or index_url.rstrip("/") == DEFAULT_INDEX) and not extra_index_urls:
        return None
    lines = ["# written by envbuilder for this build: the index the lock resolved against (docs/config.md)",
             "[global]"]
    if index_url:
        lines.append(f"index-url = {index_url}")
    if extra_index_urls:
        lines.append("extra-index-url = " + " ".join(extra_index_urls))
    return "\n".join(lines) + "\n"


def _project(wheel_name: str) -> str:
    return re.sub(r"[-_.]+", "-", wheel_name.split("-", 1)[0]).lower()


def conflicting_wheels(wheelhouse: Path, locked: list[dict]) -> tuple[str, ...]:
    """The wheelhouse's wheels of a locked package that are not the locked file (a CPU torch beside
    a lock of PyPI's CUDA torch): pip would take them over the index's file (PEP 440 lets
    `torch==2.13.0` match `2.13.0+cpu`) and then fail the lock's hash, so the build leaves them out."""
    files = {_project(e["file"]): e["file"] for e in locked if e.get("file")}
    try:
        found = sorted(p.name for p in wheelhouse.iterdir() if p.suffix == ".whl")
    except OSError:
        return ()
    return tuple(w for w in found if _project(w) in files and w != files[_project(w)])


def stage_context(folder: Path, files: dict[str, bytes], wheelhouse: str | None, pip_conf: str | None = None,
                  skip: tuple[str, ...] = ()) -> Path:
    """``pip_conf``: pip_index_conf's text, written beside the wheels (bound at /wheelhouse, in no
    layer); ``skip``: the wheelhouse's files left out (conflicting_wheels)."""
    root = Path(tempfile.mkdtemp(prefix="envbuilder-context-"))
    for name, data in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    wh = root / "wheelhouse"
    wh.mkdir(exist_ok=True)
    if wheelhouse:
        link_wheels(Path(wheelhouse), wh, skip)
    if pip_conf:
        (wh / PIP_INDEX_CONF).write_text(pip_conf)
    conda = folder / "conda-pkgs"          # the locked conda packages, fetched by the pipeline
    if conda.is_dir() and not conda.is_symlink():
        (root / "conda-pkgs").mkdir(exist_ok=True)
        for pkg in sorted(conda.iterdir()):
            if pkg.is_file() and not pkg.is_symlink() and pkg.name.endswith((".conda", ".tar.bz2")):
                try:
                    os.link(pkg, root / "conda-pkgs" / pkg.name)
                except OSError:
                    shutil.copy2(pkg, root / "conda-pkgs" / pkg.name)
    return root


def link_wheels(wheelhouse: Path, dest: Path, skip: tuple[str, ...] = ()) -> list[str]:
    """The wheelhouse's wheels and source archives into DEST (hard links where the file system
    allows, else copies; links inside the wheelhouse are not followed), leaving a file DEST already
    has; returns the names added."""
    added = []
    for wheel in sorted(wheelhouse.iterdir()):
        target = dest / wheel.name
        if wheel.name in skip or wheel.is_symlink() or not wheel.is_file() or wheel.suffix not in (".whl", ".gz", ".zip") \
                or target.exists() or target.is_symlink():
            continue
        try:
            os.link(wheel, target)
        except OSError:
            shutil.copy2(wheel, target)
        added.append(wheel.name)
    return added


def platform_of(stack) -> str | None:
    """Docker's platform name for a non-x86_64 image (spec/site `arch`; catalog `arches`)."""
    arch = stack.spec.target_arch
    return None if arch == "x86_64" else stack.catalog.arch(arch)["docker"]
