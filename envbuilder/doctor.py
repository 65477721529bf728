"""`envbuilder doctor`: what this machine can do, before the first build fails on it (docs/doctor.md).

One line per part, each ok / missing / warn with the fix: the container engines, Slurm, MPI, the
package index through the proxy and CA, the registry or its mirror, QEMU for the other
architecture, a GPU, and the configuration in force. Every probe is bounded by a timeout and runs
only this machine's own programs with fixed arguments (``--version`` and the like) or an HTTP GET;
nothing from a spec, a preset or the configuration runs as code.

Exit codes: 0 when nothing needed is missing (without --preset: a configuration that loads and an
engine that builds; with --preset NAME: also what that preset needs), 1 when something needed is
missing, 2 for a configuration that does not load or a preset name that does not exist.
"""

from __future__ import annotations

import difflib
import json
import os
import pwd
import re
import shutil
import socket
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from . import emulation
from .config import Config, load_config
from .engines.docker import docker_candidates
from .errors import EXIT_BAD_INPUT, EXIT_CHECK_FAILED, EnvbuilderError
from .redact import redact_url

PROBE_S = 10            # a local program's --version, sinfo, srun --mpi=list
NET_S = 5               # one HTTP(S) request
DOCKER_HUB = "https://registry-1.docker.io"
MIN_FREE_GB = 8         # a CPU image build (engines/docker.py MIN_FREE_GB["cpu"])
LOGIN_GUIDE = "docs/login-node.md"


@dataclass
class Check:
    name: str
    status: str                 # ok | missing | warn
    detail: str
    fix: str = ""
    facts: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {**self.facts, "name": self.name, "status": self.status, "detail": self.detail, "fix": self.fix}


def _run(argv: list[str], timeout: float = PROBE_S) -> tuple[int, str]:
    """A program of this machine with fixed arguments: (exit code, stdout + stderr); 127 when it
    cannot start, 124 when it ran past ``timeout``."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                              errors="replace")
    except FileNotFoundError:
        return 127, ""
    except subprocess.TimeoutExpired:
        return 124, f"no answer within {timeout:.0f} s"
    except OSError as exc:
        return 126, str(exc)
    return proc.returncode, (proc.stdout + proc.stderr).strip()


def _version(text: str) -> str:
    found = re.search(r"(\d+\.\d+(?:\.\d+)?(?:[-+~][\w.+~-]+)?)", text)
    return found.group(1) if found else (text.splitlines() or ["?"])[0][:60]


def _user() -> tuple[str, int]:
    uid = os.geteuid()
    try:
        return pwd.getpwuid(uid).pw_name, uid
    except KeyError:
        return os.environ.get("USER") or str(uid), uid


def _free_gb(path: Path) -> float:
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free / 1e9


# --- engines ------------------------------------------------------------------------------------

def _buildkit_cli(clis: list[str]) -> tuple[str | None, list[str]]:
    """The CLI that runs a BuildKit build (as engines/docker.py buildkit_cli picks it, bounded),
    and what each other CLI lacks."""
    notes: list[str] = []
    for exe in clis:
        if _run([exe, "buildx", "version"])[0] == 0:
            return f"{exe} buildx build", notes
        code, out = _run([exe, "--version"])
        version = _version(out) if code == 0 else ""
        major = version.split(".")[0]
        if major.isdigit() and int(major) < 23:
            return f"{exe} build (BuildKit built in, Docker {version})", notes
        notes.append(f"{exe} (Docker {version or '?'}) has no buildx plugin")
    return None, notes


def check_docker() -> Check:
    clis = docker_candidates()
    try:
        import docker
        client = docker.from_env(timeout=PROBE_S)
        version = client.version()
        info = client.info()
    except Exception as exc:       # the SDK raises several unrelated types for "no engine"
        if not clis:
            return Check("docker", "missing", "no docker CLI on PATH and no engine answers",
                         "install Docker (Debian: apt-get install docker.io) and start dockerd, or use "
                         f"podman/buildah without a daemon ({LOGIN_GUIDE})")
        return Check("docker", "missing", f"the docker CLI is there ({clis[0]}) but no engine answers "
                     f"({type(exc).__name__})", "start it (`dockerd &` or `systemctl start docker`) or set DOCKER_HOST")
    server = version.get("Version", "?")
    rootless = any("rootless" in str(o) for o in info.get("SecurityOptions") or [])
    cli, notes = _buildkit_cli(clis)
    root = info.get("DockerRootDir") or "/var/lib/docker"
    free = _free_gb(Path(root))
    facts = {"version": server, "api": version.get("ApiVersion"), "rootless": rootless,
             "buildkit_cli": cli, "storage": root, "free_gb": round(free, 1)}
    detail = (f"Docker {server} (API {version.get('ApiVersion')}): the daemon answers; "
              f"{'rootless' if rootless else 'rootful'}; {free:.0f} GB free under {root}; BuildKit: "
              + (cli or "none") + (f"; {'; '.join(notes)}" if notes and cli else ""))
    if cli is None:
        return Check("docker", "missing", detail + f" ({'; '.join(notes)})",
                     "install docker-buildx, or set ENVBUILDER_DOCKER_CLI to a CLI that has BuildKit", facts)
    if free < MIN_FREE_GB:
        return Check("docker", "warn", detail, f"free disk space under {root} (a CPU build needs about "
                     f"{MIN_FREE_GB} GB; docker system prune)", facts)
    return Check("docker", "ok", detail, "", facts)


def _subids(user: str, uid: int) -> str | None:
    from .engines.rootless import MIN_SUBIDS, subid_count

    short = [f"/etc/sub{k}" for k in ("uid", "gid") if subid_count(Path(f"/etc/sub{k}"), user, uid) < MIN_SUBIDS]
    return (f"user {user} has fewer than {MIN_SUBIDS} subordinate ids in {' and '.join(short)}") if short else None


def check_oci(name: str) -> Check:
    path = shutil.which(name)
    if path is None:
        return Check(name, "missing", "not installed",
                     f"apt-get install {name} (builds without a daemon, rootless too: {LOGIN_GUIDE})")
    code, out = _run([path, "--version"])
    if code != 0:
        return Check(name, "missing", f"{path} --version failed: {out[-200:]}", f"reinstall {name}")
    version = _version(out)
    user, uid = _user()
    storage = Path("/var/lib/containers/storage") if uid == 0 else \
        Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local/share") / "containers/storage"
    free = _free_gb(storage)
    facts = {"version": version, "rootless": uid != 0, "storage": str(storage), "free_gb": round(free, 1)}
    detail = f"{name} {version} ({'rootless' if uid else 'as root'}); {free:.0f} GB free under {storage}"
    if uid != 0:
        short = _subids(user, uid)
        if short:
            return Check(name, "missing", f"{detail}; {short}", "ask the admins: usermod --add-subuids "
                         f"100000-165535 --add-subgids 100000-165535 {user} ({LOGIN_GUIDE})", facts)
        detail += "; subordinate ids there"
    if free < MIN_FREE_GB:
        return Check(name, "warn", detail, f"free disk space under {storage} (about {MIN_FREE_GB} GB per CPU build)", facts)
    return Check(name, "ok", detail, "", facts)


def check_apptainer() -> Check:
    from .engines.apptainer import FUSE_DEVICE, USERNS_FILES, find_binary

    binary = find_binary()
    if binary is None:
        return Check("apptainer", "missing", "neither apptainer nor singularity is on PATH",
                     "install Apptainer (apptainer.org; Debian's unstable suite has it) or ask the admins "
                     "for its module; `envbuilder sif` writes a .sif without it")
    code, out = _run([binary, "--version"])
    version = _version(out) if code == 0 else "?"
    problems = []
    if not FUSE_DEVICE.exists():
        problems.append(f"{FUSE_DEVICE} does not exist")
    elif not os.access(FUSE_DEVICE, os.R_OK | os.W_OK):
        problems.append(f"{FUSE_DEVICE} is not usable by this user")
    for path, why in USERNS_FILES:
        try:
            if path.read_text().strip() == "0":
                problems.append(why)
        except OSError:
            continue
    user, uid = _user()
    if uid != 0:
        short = _subids(user, uid)
        if short:
            problems.append(short + " (build --fakeroot)")
    facts = {"version": version, "binary": binary}
    detail = f"{Path(binary).name} {version} ({binary})"
    if problems:
        return Check("apptainer", "warn", detail + "; " + "; ".join(problems),
                     "/dev/fuse for the user (a container: --device /dev/fuse), user namespaces on "
                     "(sysctl user.max_user_namespaces=15000), subordinate ids (usermod --add-subuids)", facts)
    return Check("apptainer", "ok", detail + f"; {FUSE_DEVICE} usable; user namespaces on", "", facts)


# --- Slurm and MPI ------------------------------------------------------------------------------

def check_slurm() -> Check:
    sbatch = shutil.which("sbatch")
    if sbatch is None:
        return Check("slurm", "missing", "sbatch is not on PATH",
                     "run on a login node of the cluster, or `module load slurm`; envbuilder verify runs without it")
    code, out = _run(["sinfo", "--version"])
    version = _version(out) if code == 0 else "?"
    code, out = _run(["srun", "--mpi=list"])
    plugins = sorted(set(re.findall(r"\b(pmix(?:_v\d+)?|pmi2|cray_shasta|none)\b", out))) if code == 0 else []
    facts: dict = {"version": version, "mpi_plugins": plugins}
    pmix = any(p.startswith("pmix") for p in plugins)
    code, out = _run(["sinfo", "-h", "-o", "%P %a %D %t"])
    answers = code == 0
    facts["controller"] = answers
    detail = (f"Slurm {version}; srun --mpi: {', '.join(plugins) or 'none listed'}; controller "
              + ("answers (" + "; ".join(out.splitlines()[:3]) + ")" if answers else "does not answer"))
    if not answers:
        return Check("slurm", "missing", detail + (f": {out.splitlines()[-1][:200]}" if out else ""),
                     "start slurmctld (or ask the admins); check SLURM_CONF and munge", facts)
    if not pmix:
        return Check("slurm", "warn", detail, "the hybrid model's job.sbatch runs `srun --mpi=pmix`: ask for "
                     "Slurm built with PMIx, or set the site profile's pmi (docs/mpi.md)", facts)
    return Check("slurm", "ok", detail, "", facts)


def check_mpi() -> Check:
    for tool, argv, kind in (("ompi_info", ["ompi_info", "--version"], "Open MPI"),
                             ("mpichversion", ["mpichversion"], "MPICH"),
                             ("mpirun", ["mpirun", "--version"], "MPI")):
        if shutil.which(tool):
            code, out = _run(argv)
            version = _version(out) if code == 0 else "?"
            mpirun = shutil.which("mpirun") or "no mpirun"
            return Check("mpi", "ok", f"{kind} {version} ({mpirun})", "", {"flavor": kind, "version": version})
    return Check("mpi", "warn", "no mpirun, ompi_info or mpichversion on PATH",
                 "only the site-MPI mode needs the host's MPI (docs/mpi.md): `module load openmpi`, or "
                 "apt-get install openmpi-bin")


# --- network: the index through the proxy and CA, the registry ----------------------------------

def _get(url: str, cafile: str | None = None, *, verify: bool = True) -> tuple[int | None, str]:
    """(HTTP status, or None; what went wrong) of one GET, bounded by NET_S."""
    if url.startswith("https://"):
        ctx = ssl.create_default_context(cafile=cafile) if cafile else ssl.create_default_context()
    else:
        ctx = None
    req = urllib.request.Request(url, headers={"User-Agent": "envbuilder-doctor"})
    try:
        with urllib.request.urlopen(req, timeout=NET_S, context=ctx) as resp:   # noqa: S310 (http(s) only)
            return resp.status, ""
    except urllib.error.HTTPError as exc:
        return exc.code, ""
    except urllib.error.URLError as exc:
        reason = exc.reason
        if isinstance(reason, ssl.SSLCertVerificationError):
            return None, f"certificate not trusted ({reason.verify_message})"
        return None, str(reason)[:200]
    except (socket.timeout, TimeoutError):
        return None, f"no answer within {NET_S} s"
    except (OSError, ValueError, ssl.SSLError) as exc:
        return None, str(exc)[:200]


def check_index(cfg: Config | None) -> Check:
    url = (cfg.get("pip_index_url") if cfg else None) or "https://pypi.org/simple"
    origin = cfg.origin("pip_index_url") if cfg else "default"
    bundle = cfg.get("ca_bundle") if cfg else None
    probe = url.rstrip("/") + "/pip/"
    plain, why_plain = _get(probe)
    facts: dict = {"url": url, "without_ca_bundle": plain or why_plain}
    proxy = next((os.environ[v] for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")
                  if os.environ.get(v)), None)
    facts["proxy"] = redact_url(proxy) if proxy else None
    if proxy:
        url_shown = f"{url} via the proxy {redact_url(proxy)}"
    else:
        url_shown = url
    shown_plain = f"without it: {plain}" if plain else f"without it: {why_plain}"
    if bundle:
        if not Path(bundle).is_file():
            return Check("index", "missing", f"the ca_bundle {bundle} ({cfg.origin('ca_bundle') if cfg else ''}) "
                         "does not exist", "give a PEM bundle, e.g. /etc/ssl/certs/ca-certificates.crt", facts)
        with_ca, why_ca = _get(probe, bundle)
        facts["with_ca_bundle"] = with_ca or why_ca
        if with_ca and with_ca < 500:
            extra = f"; {shown_plain}" + ("" if plain else " (a TLS-intercepting proxy: keep ca_bundle)")
            return Check("index", "ok", f"{url_shown} ({origin}) answers over TLS with the ca_bundle {bundle}{extra}",
                         "", facts)
        return Check("index", "missing", f"{url_shown} ({origin}): with the ca_bundle {bundle}: {why_ca or with_ca}; "
                     f"without: {why_plain or plain}", "check the proxy (HTTPS_PROXY) and that ca_bundle holds "
                     "the CA that signs the index's certificate (docs/config.md)", facts)
    if plain and plain < 500:
        return Check("index", "ok", f"{url_shown} ({origin}) answers over TLS with the system's trust store", "", facts)
    fix = ("set ca_bundle (docs/config.md) to the bundle that holds your proxy's CA"
           if "certificate" in why_plain else "check the network or proxy (HTTPS_PROXY), or set pip_index_url to "
           "the site's mirror and wheelhouse for offline wheels (docs/config.md)")
    return Check("index", "missing", f"{url_shown} ({origin}): {why_plain or plain}", fix, facts)


def check_registry(cfg: Config | None) -> Check:
    mirror = cfg.get("registry_mirror") if cfg else None
    bundle = cfg.get("ca_bundle") if cfg else None
    target = mirror or DOCKER_HUB
    status, why = _get(target + "/v2/", bundle if bundle and Path(bundle).is_file() else None)
    where = f"the mirror {mirror} ({cfg.origin('registry_mirror')})" if mirror and cfg else f"Docker Hub ({DOCKER_HUB})"
    facts = {"url": target, "mirror": bool(mirror), "http_status": status}
    if status in (200, 401):
        return Check("registry", "ok", f"{where} answers: GET /v2/ gave {status}", "", facts)
    detail = f"{where} does not answer: GET {target}/v2/: {why or status}"
    if mirror:
        return Check("registry", "missing", detail, "start the mirror or fix registry_mirror (docs/config.md); "
                     "the engines must point at it too (dockerd registry-mirrors, registries.conf)", facts)
    return Check("registry", "missing", detail, "set registry_mirror to the site's pull-through mirror "
                 "(docs/config.md), or pull the preset's base where the registry is reachable", facts)


def check_qemu() -> Check:
    here = emulation.machine()
    other = "aarch64" if here == "x86_64" else "x86_64"
    why = emulation.why_not_runnable(other)
    facts: dict = {"machine": here, "other": other}
    if why:
        return Check("qemu", "missing", f"this {here} machine cannot run {other} programs: {why}", emulation.FIX, facts)
    version = emulation.qemu_version(other)
    facts["qemu"] = version
    return Check("qemu", "ok", f"{other} programs run here (binfmt_misc qemu-{other}"
                 + (f", QEMU {version})" if version else ")"), "", facts)


def check_gpu() -> Check:
    from .engines.apptainer import gpu_visible

    if gpu_visible():
        code, out = _run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"])
        return Check("gpu", "ok", "NVIDIA GPU: " + (out.splitlines()[0] if code == 0 and out else "/dev/nvidia0"))
    return Check("gpu", "warn", "no NVIDIA GPU here (/dev/nvidia*): GPU images build and render, their GPU "
                 "checks run on a GPU node", "verify GPU images with `envbuilder verify` on a GPU node")


def check_config() -> tuple[Check, Config | None, EnvbuilderError | None]:
    try:
        cfg = load_config()
    except EnvbuilderError as exc:
        return Check("config", "missing", exc.message().replace("\n  fix: ", " -- fix: "), exc.fix), None, exc
    read = [str(f.path) for f in cfg.files if f.read]
    set_ = [f"{k}={v}" for k, v, o in cfg.items() if o != "default"]
    return Check("config", "ok", (f"read {', '.join(read)}" if read else "no config file")
                 + (f"; set: {', '.join(set_)}" if set_ else ""), "",
                 {"files": [f.as_dict() for f in cfg.files]}), cfg, None


# --- presets ------------------------------------------------------------------------------------

def preset_spec(name: str):
    """The preset NAME (a recipe's file name without .yaml), loaded; unknown: exit 2 naming the
    close ones."""
    from .spec.model import load_spec
    from .spec.presets import preset_paths

    paths = {p.stem: p for p in preset_paths()}
    if name not in paths:
        close = difflib.get_close_matches(name, list(paths), n=3)
        raise EnvbuilderError("--preset", f"no preset named {name!r}",
                              (f"did you mean {', '.join(close)}? " if close else "")
                              + "`envbuilder presets` lists them")
    return load_spec(paths[name])


def preset_needs(name: str) -> tuple[dict[str, str], str]:
    """What preset NAME needs of this machine: {check name: why}, and a one-line description."""
    from .stack import resolve

    stack = resolve(preset_spec(name))
    spec = stack.spec
    needs: dict[str, str] = {"engine": "an engine to build its image (docker with BuildKit, podman, buildah or apptainer)",
                             "index": "its lock and build fetch Python packages from the pip index"}
    if spec.target_arch != emulation.machine():
        needs["qemu"] = f"its image is {spec.target_arch}: building and verifying it here needs QEMU"
    bases = sorted(str(b) for b in {stack.base, getattr(stack, "runtime_base", None)} if b)
    if any(not b.startswith("local/") for b in bases):
        needs["registry"] = f"its base {', '.join(bases)} comes from a registry"
    if spec.cuda is not None:
        needs["gpu"] = "a GPU image (nothing GPU is needed to build it; its GPU checks need one)"
    return needs, f"{name}: {spec.framework.name} {spec.framework.version}, {spec.target_arch}, base {stack.base}"


# --- the report ---------------------------------------------------------------------------------

def run_checks() -> tuple[list[Check], EnvbuilderError | None]:
    config, cfg, error = check_config()
    checks = [check_docker(), check_oci("podman"), check_oci("buildah"), check_apptainer(), check_slurm(),
              check_mpi(), check_index(cfg), check_registry(cfg), check_qemu(), check_gpu(), config]
    return checks, error


def engine_check(checks: list[Check]) -> Check:
    usable = [c.name for c in checks if c.name in ("docker", "podman", "buildah", "apptainer") and c.status != "missing"]
    if usable:
        return Check("engine", "ok", f"builds with {', '.join(usable)}")
    return Check("engine", "missing", "no engine that builds: docker, podman, buildah, apptainer all missing",
                 f"install one (docs/engines.md; without root: {LOGIN_GUIDE}); --no-build writes the files without one")


def run(preset: str | None = None, as_json: bool = False) -> int:
    needs, about = (preset_needs(preset) if preset else ({}, ""))
    checks, config_error = run_checks()
    engine = engine_check(checks)
    needed = {"engine", "config", *needs}
    failed = []
    for c in [*checks, engine]:
        if c.name in needed and c.status == "missing":
            failed.append(c.name)
    # a GPU preset needs nothing GPU to build: absent, it is a warning
    code = EXIT_BAD_INPUT if config_error else EXIT_CHECK_FAILED if failed else 0
    if as_json:
        print(json.dumps({"ok": code == 0, "exit": code, "preset": preset, "needs": needs,
                          "missing_needed": failed, "checks": [c.as_dict() for c in [*checks, engine]],
                          **({"error": config_error.as_dict()} if config_error else {})}, indent=2))
        return code
    width = max(len(c.name) for c in checks)
    for c in [*checks, engine]:
        mark = c.status + ("*" if c.name in needs else "")
        line = f"{mark:<8} {c.name:<{width}}  {c.detail}"
        if c.fix and c.status != "ok":
            line += f"\n{'':<8} {'':<{width}}  fix: {c.fix}"
        print(line)
    if preset:
        print(f"\n{about}\n* needed by this preset: " + "; ".join(f"{k}: {v}" for k, v in needs.items()))
    if config_error:
        print(f"error: {config_error.message()}", file=sys.stderr)
    elif failed:
        print(f"missing: {', '.join(failed)}" + (f" (needed by {preset})" if preset else ""), file=sys.stderr)
    return code
