"""Conda packages through conda-lock: its lockfile format (v1), every package with md5 and sha256.

``envbuilder lock`` writes an environment file from the spec (``packages.conda`` plus
``micromamba``, the installer the image uses) and runs ``conda-lock lock -p linux-64`` on it
(needs ``pip install 'envbuilder[conda]'`` and channel access; the channel is conda-forge, or
``ENVBUILDER_CONDA_CHANNEL``, e.g. a local ``file://`` channel). A lockfile made elsewhere comes
in with ``--conda-lockfile FILE``. Either way the lockfile is checked (every package hashed, the
spec's packages at the asked versions) and kept whole in envbuilder.lock.

In the image (devel stage) every package is downloaded by URL, checked with ``sha256sum -c``,
and installed offline by the locked micromamba into /opt/conda; the runtime stage copies it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from ..errors import CheckFailed, EnvbuilderError
from ..paths import CONDA_PREFIX
from ..spec.model import CONDA_RANGE_RE, CONDA_RE

PLATFORM = "linux-64"
INSTALLER = "micromamba"
PREFIX = CONDA_PREFIX
PKGS = "/tmp/conda/pkgs"


def channels() -> list[str]:
    return [os.environ.get("ENVBUILDER_CONDA_CHANNEL", "conda-forge")]


def environment_yaml(packages: list[str], chans: list[str]) -> str:
    deps = sorted(set(packages) | {INSTALLER}) if not any(
        CONDA_RE.fullmatch(p) and CONDA_RE.fullmatch(p).group(1) == INSTALLER for p in packages) else sorted(packages)
    return yaml.safe_dump({"channels": chans, "dependencies": deps, "platforms": [PLATFORM]}, sort_keys=True)


def _bad(where: str, reason: str, fix: str = "") -> EnvbuilderError:
    return EnvbuilderError(where, reason, fix or "make the lockfile with conda-lock (`conda-lock lock -p linux-64`)")


def check_lockfile(data, spec_packages: list[str], source: str) -> dict:
    """A conda-lock v1 lockfile (parsed YAML) checked against the spec; returns it."""
    if not isinstance(data, dict) or data.get("version") != 1 or not isinstance(data.get("package"), list):
        raise _bad(f"conda ({source})", "is not a conda-lock lockfile (version: 1, package: [...])")
    if PLATFORM not in ((data.get("metadata") or {}).get("platforms") or []):
        raise _bad(f"conda ({source})", f"has no {PLATFORM} packages", "lock it with -p linux-64")
    pkgs = [p for p in data["package"] if isinstance(p, dict) and p.get("manager", "conda") == "conda"
            and p.get("platform") == PLATFORM]
    by_name = {}
    for p in pkgs:
        h = p.get("hash") or {}
        where = f"conda: {p.get('name')}"
        if not re.fullmatch(r"[0-9a-f]{64}", str(h.get("sha256", ""))):
            raise _bad(where, f"has no sha256 in {source}", "use conda-lock >= 1.0, which records md5 and sha256")
        if h.get("md5") is not None and not re.fullmatch(r"[0-9a-f]{32}", str(h["md5"])):
            raise _bad(where, f"md5 {h['md5']!r} in {source} is not 32 hex digits")
        url = str(p.get("url", ""))
        if not url.endswith((".conda", ".tar.bz2")) or f"-{p.get('version')}-" not in url.rsplit("/", 1)[-1]:
            raise _bad(where, f"url {url!r} is not a conda package of version {p.get('version')}")
        by_name[p["name"]] = p
    for req in spec_packages + [INSTALLER]:
        m = CONDA_RE.fullmatch(req)
        r = CONDA_RANGE_RE.fullmatch(req)
        name, op, version = (m.group(1), m.group(2), m.group(3)) if m else (r.group(1) if r else req, "", "")
        got = by_name.get(name)
        if got is None:
            what = "the installer envbuilder uses in the image" if name == INSTALLER else "asked by the spec"
            raise _bad(f"conda: {name}", f"is {what} but not in {source}",
                       f"add {name} to the environment you lock")
        if op == "==" and got["version"] != version or op == "=" and not (
                got["version"] == version or got["version"].startswith(version.rstrip("*").rstrip(".") + ".")):
            raise _bad(f"conda: {name}", f"{source} has {got['version']}, the spec asks {req}",
                       "lock again after changing the spec")
    return {"version": 1, "metadata": data.get("metadata") or {},
            "package": sorted(pkgs, key=lambda p: p["name"])}


def load_lockfile(path: str, spec_packages: list[str]) -> dict:
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise EnvbuilderError("--conda-lockfile", f"cannot read {path}: {exc.strerror or exc}",
                              "give a conda-lock lockfile (conda-lock.yml)") from None
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise EnvbuilderError("--conda-lockfile", f"{path} is not YAML: {str(exc).splitlines()[0]}",
                              "give a conda-lock lockfile (conda-lock.yml)") from None
    return check_lockfile(data, spec_packages, path)


def conda_lock_version() -> str | None:
    exe = shutil.which("conda-lock")
    cmd = [exe] if exe else [sys.executable, "-m", "conda_lock"]
    try:
        proc = subprocess.run(cmd + ["--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip().split()[-1] if proc.returncode == 0 and proc.stdout.strip() else None


def resolve(spec_packages: list[str]) -> tuple[dict, str]:
    """Run conda-lock for linux-64; (checked lockfile, conda-lock version)."""
    version = conda_lock_version()
    if not version:
        raise CheckFailed("lock: conda", "conda-lock is not installed",
                          "pip install 'envbuilder[conda]' on a machine that reaches the conda channels, "
                          "or bring a lockfile made elsewhere: --conda-lockfile conda-lock.yml")
    exe = shutil.which("conda-lock")
    cmd = [exe] if exe else [sys.executable, "-m", "conda_lock"]
    with tempfile.TemporaryDirectory(prefix="envbuilder-conda-") as tmp:
        env_file = Path(tmp) / "environment.yml"
        env_file.write_text(environment_yaml(spec_packages, channels()))
        out = Path(tmp) / "conda-lock.yml"
        proc = subprocess.run(cmd + ["lock", "--file", str(env_file), "-p", PLATFORM, "--lockfile", str(out)],
                              capture_output=True, text=True, cwd=tmp)
        if proc.returncode != 0 or not out.is_file():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            raise CheckFailed("lock: conda", f"conda-lock failed: {tail[0][:300]}",
                              "conda-lock needs conda, mamba or micromamba and the channels "
                              f"({', '.join(channels())}); or use --conda-lockfile FILE")
        data = yaml.safe_load(out.read_text())
    return check_lockfile(data, spec_packages, "conda-lock's output"), version


# --- rendering ------------------------------------------------------------------------------

def _file(p: dict) -> str:
    return p["url"].rsplit("/", 1)[-1]


def pins_files(lockfile: dict) -> dict[str, bytes]:
    """pins/ files: the lockfile itself, download list, sha256 list, explicit install list."""
    pkgs = lockfile["package"]
    return {
        "pins/conda-lock.yml": yaml.safe_dump(lockfile, sort_keys=True).encode(),
        "pins/conda-urls.txt": "".join(f"{p['url']}\n" for p in pkgs).encode(),
        "pins/conda-sha256.txt": "".join(f"{p['hash']['sha256']}  {_file(p)}\n" for p in pkgs).encode(),
        "pins/conda-explicit.txt": ("# micromamba create --offline --file: the locked packages, local copies\n"
                                    f"# platform: {PLATFORM}\n@EXPLICIT\n" + "".join(
                                        f"file://{PKGS}/{_file(p)}" + (f"#{p['hash']['md5']}" if p["hash"].get("md5")
                                                                        else "") + "\n" for p in pkgs)).encode(),
    }


def install_commands(lockfile: dict) -> list[str]:
    installer = next(p for p in lockfile["package"] if p["name"] == INSTALLER)
    fname = _file(installer)
    if fname.endswith(".tar.bz2"):
        unpack = f"tar -xjf {PKGS}/{fname} -C /tmp/conda bin/micromamba"
    else:   # .conda: a zip holding pkg-*.tar.zst
        unpack = (f"unzip -q -o {PKGS}/{fname} 'pkg-*.tar.zst' -d /tmp/conda/x && "
                  "zstd -dc /tmp/conda/x/pkg-*.tar.zst | tar -x -C /tmp/conda bin/micromamba")
    return [
        f"mkdir -p {PKGS}",
        f"cd {PKGS}",
        "xargs -a /pins/conda-urls.txt -n 1 curl -fsSLO --retry 3",
        "sha256sum -c --quiet /pins/conda-sha256.txt",
        unpack,
        f"/tmp/conda/bin/micromamba create --yes --offline --root-prefix /tmp/conda/root --prefix {PREFIX} "
        "--file /pins/conda-explicit.txt",
        "cd /",
        "rm -rf /tmp/conda",
    ]
