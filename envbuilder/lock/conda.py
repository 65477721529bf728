"""Conda packages: solved by py-rattler, recorded in conda-lock's lockfile format (v1), every
package with its url, sha256 and md5; installed in the image by py-rattler, offline.

``envbuilder lock`` solves the spec's ``packages.conda`` with ``rattler.solve`` for linux-64 (+
noarch) against the channels the site names (``ENVBUILDER_CONDA_CHANNEL``: comma-separated; a
mirror's ``https://`` URL or a local ``file:///path`` channel; default conda-forge), recorded in the
lock's inputs. A lockfile made elsewhere comes in with
``--conda-lockfile FILE``. Either way the lockfile is checked (every package hashed, the spec's
packages at the asked versions) and kept whole in envbuilder.lock.

Before a build (``fetch``) every locked package is copied or downloaded into the output folder's
``conda-pkgs/`` and its sha256 checked against the lock (a mismatch stops the build, naming the
package). In the image (devel stage) ``pins/conda-install.py`` checks each file's sha256 again,
indexes them as a local channel and installs exactly those records with ``rattler.install`` into
/opt/conda (py-rattler itself comes from PyPI: the lock's pip group ``build``, hash-checked); its
``conda-meta/`` records what was installed; the runtime stage copies /opt/conda.
"""

from __future__ import annotations

import json
import re
import shutil
import ssl
import subprocess
import sys
import urllib.parse
import urllib.request
from pathlib import Path

import yaml

from .. import safewrite
from ..errors import CheckFailed, EnvbuilderError
from ..paths import CONDA_PREFIX
from ..redact import redact
from ..spec.model import CONDA_CHANNEL_FIX, CONDA_RANGE_RE, CONDA_RE, conda_channel_problem
from .pip import file_sha256

PLATFORM = "linux-64"
PREFIX = CONDA_PREFIX
PKGS_DIR = "conda-pkgs"                 # in the output folder and the build context; /conda-pkgs in the build
RATTLER = "py-rattler==0.28.0"          # the installer, from PyPI (the lock's pip group `build`)
DEFAULT_CHANNEL = "conda-forge"
SCRIPT = Path(__file__).with_name("conda_install.py")
SOLVER = Path(__file__).with_name("rattler_solve.py")


def channels(spec_channels: list[str] | tuple[str, ...] = ()) -> list[str]:
    """The channels to solve against: the site's conda_channel (config.py: ENVBUILDER_CONDA_CHANNEL or
    a config file; comma-separated: its
    mirror), else the spec's packages.conda_channels, else conda-forge; each checked (bad input: one
    message, exit 2)."""
    from ..config import env_name, load_config

    cfg = load_config()
    site = cfg.list("conda_channel")
    if site:
        origin = cfg.origin("conda_channel")
        where = env_name("conda_channel") if origin.startswith("environment") else f"conda_channel ({origin})"
        return [check_channel(c, where) for c in site]
    return [check_channel(c, "packages.conda_channels") for c in spec_channels] or [DEFAULT_CHANNEL]


def check_channel(channel: str, where: str) -> str:
    """CHANNEL as the solver takes it, or one message: a name, https:// or file:///, no login or token
    (spec/model.conda_channel_problem: the spec's check, the site's variable and config file alike)."""
    problem = conda_channel_problem(channel)
    if problem or "@" in channel.split("//", 1)[-1].split("/", 1)[0]:
        reason, fix = problem or ("is not a conda channel", CONDA_CHANNEL_FIX)
        raise EnvbuilderError(where, f"{redact(channel[:200])!r} {reason}", fix)
    return channel


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
    for req in spec_packages:
        m = CONDA_RE.fullmatch(req)
        r = CONDA_RANGE_RE.fullmatch(req)
        name, op, version = (m.group(1), m.group(2), m.group(3)) if m else (r.group(1) if r else req, "", "")
        got = by_name.get(name)
        if got is None:
            raise _bad(f"conda: {name}", f"is asked by the spec but not in {source}",
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


def rattler_version() -> str | None:
    try:
        from importlib.metadata import PackageNotFoundError, version
        return version("py-rattler")
    except PackageNotFoundError:
        return None


def resolve(spec_packages: list[str], chans: list[str]) -> tuple[dict, str]:
    """Solve SPEC_PACKAGES for linux-64 with py-rattler (in a process of its own: rattler_solve.py);
    (checked lockfile in conda-lock's v1 format, the py-rattler version)."""
    version = rattler_version()
    if not version:
        raise CheckFailed("lock: conda", "py-rattler is not installed",
                          "pip install 'envbuilder[conda]' (py-rattler, from PyPI), or bring a lockfile "
                          "made elsewhere: --conda-lockfile conda-lock.yml")
    for c in chans:
        check_channel(c, "conda channel")
    args = {"specs": [_match_spec(p) for p in spec_packages], "channels": chans, "platforms": [PLATFORM, "noarch"]}
    fix = ("check the package names and versions, and that the channels are reachable "
           "(a site mirror: ENVBUILDER_CONDA_CHANNEL=URL; docs/lock.md)")
    try:
        proc = subprocess.run([sys.executable, str(SOLVER), json.dumps(args)], capture_output=True, text=True,
                              timeout=900)
        result = json.loads(proc.stdout or "{}")
    except (OSError, subprocess.TimeoutExpired, ValueError) as exc:
        raise CheckFailed("lock: conda", f"py-rattler's solve did not finish: {exc}", fix) from None
    if not isinstance(result, dict) or not result.get("ok"):
        error = str(result.get("error") if isinstance(result, dict) else "") or \
            (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1][:300]
        raise CheckFailed("lock: conda", f"py-rattler could not solve {', '.join(spec_packages)} "
                          f"against {', '.join(chans)}: {error}", fix)
    data = {"version": 1,
            "metadata": {"channels": [{"url": c, "used_env_vars": []} for c in chans], "platforms": [PLATFORM],
                         "sources": ["envbuilder spec: packages.conda"]},
            "package": result["records"]}
    return check_lockfile(data, spec_packages, "py-rattler's solution"), version


def _match_spec(req: str) -> str:
    """The spec's conda requirement as conda's match spec: name=1.2 and name==1.2 are conda's own,
    a range name>=1.2,<2 becomes "name >=1.2,<2"."""
    m = CONDA_RANGE_RE.fullmatch(req)
    if m and not CONDA_RE.fullmatch(req):
        rest = req[len(m.group(1)):].strip()
        return f"{m.group(1)} {rest}" if rest else m.group(1)
    return req


# --- the package files: fetched into the output folder, sha256 checked ---------------------------

def _file(p: dict) -> str:
    return p["url"].rsplit("/", 1)[-1]


def _subdir(p: dict) -> str:
    parts = p["url"].rstrip("/").rsplit("/", 2)
    return parts[-2] if len(parts) == 3 and parts[-2] in (PLATFORM, "noarch") else "noarch"


def _download(url: str, fh, ca_bundle: str | None) -> None:
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme == "file":
        with open(urllib.parse.unquote(parsed.path), "rb") as src:
            shutil.copyfileobj(src, fh)
        return
    if parsed.scheme not in ("http", "https"):
        raise OSError(f"unsupported URL scheme {parsed.scheme!r}")
    ctx = ssl.create_default_context(cafile=ca_bundle) if ca_bundle else ssl.create_default_context()
    with urllib.request.urlopen(url, timeout=120, context=ctx) as resp:  # noqa: S310 - http(s) only
        shutil.copyfileobj(resp, fh)


def fetch(packages: list[dict], folder: Path, ca_bundle: str | None = None) -> list[str]:
    """Every locked package into FOLDER/conda-pkgs/ (a file already there with the locked sha256 is
    kept; any other file is removed), each checked against the lock's sha256: a mismatch raises
    CheckFailed naming the package, its url and the fix. Returns the files fetched now."""
    dest = folder / PKGS_DIR
    if dest.is_symlink():
        raise EnvbuilderError(str(dest), "is a symbolic link; envbuilder never writes or removes through a link",
                              f"remove the link {dest} (envbuilder fetches the packages again)")
    dest.mkdir(parents=True, exist_ok=True)
    wanted = {_file(p): p for p in packages}
    for old in dest.iterdir():
        if old.name not in wanted or old.is_symlink() or not old.is_file():
            if old.is_dir() and not old.is_symlink():
                shutil.rmtree(old)
            else:
                old.unlink()
    fetched = []
    for name, p in sorted(wanted.items()):
        target = dest / name
        want = p["hash"]["sha256"]
        if target.is_file() and file_sha256(target) == want:
            continue
        part = dest / f".{name}.part"
        try:
            with safewrite.open_new(part, option=f"conda: {p['name']}", inside=folder, text=False) as fh:
                _download(p["url"], fh, ca_bundle)
        except OSError as exc:
            part.unlink(missing_ok=True)
            raise CheckFailed(f"conda: {p['name']}", f"cannot fetch {p['url']}: {exc}",
                              "make the channel reachable (a site mirror: ENVBUILDER_CONDA_CHANNEL=URL, then lock again), "
                              "or put the file into " + str(dest)) from None
        got = file_sha256(part)
        if got != want:
            part.unlink(missing_ok=True)
            raise CheckFailed(f"conda: {p['name']} {p['version']}",
                              f"{p['url']} has sha256 {got}, the lock has {want}: the file is not the one locked",
                              f"if the channel rebuilt it on purpose, re-lock it (envbuilder lock SPEC --update "
                              f"{p['name']}); otherwise restore the channel's file, then build again")
        safewrite.place(part, target, option=f"conda: {p['name']}", inside=folder)
        fetched.append(name)
    return fetched


# --- rendering ------------------------------------------------------------------------------

def pins_files(lockfile: dict) -> dict[str, bytes]:
    """pins/ files: the lockfile itself, the sha256 list, the install list and its installer."""
    pkgs = lockfile["package"]
    listing = [{"name": p["name"], "version": p["version"], "file": _file(p), "subdir": _subdir(p),
                "sha256": p["hash"]["sha256"]} for p in pkgs]
    return {
        "pins/conda-lock.yml": yaml.safe_dump(lockfile, sort_keys=True).encode(),
        "pins/conda-sha256.txt": "".join(f"{p['hash']['sha256']}  {_file(p)}\n" for p in pkgs).encode(),
        "pins/conda-packages.json": (json.dumps(listing, indent=1, sort_keys=True) + "\n").encode(),
        "pins/conda-install.py": SCRIPT.read_bytes(),
    }


WORK = "/tmp/conda"
MOUNTS = ["pins/conda-packages.json", "pins/conda-install.py", PKGS_DIR]


def install_commands(python: str, pip_install: list[str]) -> list[str]:
    """The devel stage's conda step: py-rattler from PyPI into a folder of its own (PIP_INSTALL: the
    locked pip command), then conda-install.py: every file's sha256 checked against the lock, the
    locked packages installed offline."""
    return [
        *pip_install,
        f"PYTHONPATH={WORK}/rattler {python} -B /pins/conda-install.py /pins/conda-packages.json /{PKGS_DIR} "
        f"{PREFIX} {WORK}",
        f"rm -rf {WORK}",
    ]
