"""Run the smoke suite in an image (docker, apptainer, charliecloud) or on the host, and parse
the JSON report it prints between two marker lines."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import EXIT_BAD_INPUT, EXIT_CHECK_FAILED, EnvbuilderError
from ..paths import PREFIX

# Must equal envbuilder/smoke/common.py (verify imports nothing from the suite: the suite runs
# in the image, verify on the host).
BEGIN_MARKER = "=====ENVBUILDER-SMOKE-REPORT-BEGIN====="
END_MARKER = "=====ENVBUILDER-SMOKE-REPORT-END====="
REPORT_SCHEMA = "envbuilder.smoke-report/1"

IMAGE_PREFIX = PREFIX
IMAGE_MANIFEST = f"{IMAGE_PREFIX}/manifest.json"
VERIFY_MANIFEST = f"{IMAGE_PREFIX}/verify-manifest.json"   # the folder's manifest, mounted
SUITE_MODULE = "envbuilder_smoke"
HOST_MODULE = "envbuilder.smoke"
RUNTIMES = ("docker", "apptainer", "charliecloud", "host")


@dataclass
class Target:
    """What to verify: the manifest (what was asked for) and where the image is."""

    runtime: str
    manifest_path: Path | None = None    # on the host, when a folder or --manifest was given
    manifest: dict = field(default_factory=dict)
    image: str | None = None             # docker tag, .sif path, or charliecloud directory
    folder: Path | None = None

    @property
    def name(self) -> str:
        return str(self.manifest.get("name") or self.image or "?")


def read_manifest(path: Path, field_name: str = "FOLDER") -> dict:
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise EnvbuilderError(field_name, f"{path} does not exist",
                              "give the output folder of `envbuilder build` (it holds manifest.json)")
    except OSError as exc:
        raise EnvbuilderError(field_name, f"cannot read {path}: {exc.strerror}")
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise EnvbuilderError(field_name, f"{path} is not valid JSON ({exc})",
                              "re-run `envbuilder build --no-build SPEC` to rewrite it")
    if not isinstance(data, dict) or not isinstance(data.get("expect"), dict):
        raise EnvbuilderError(field_name, f"{path} is not an envbuilder manifest (no 'expect' section)",
                              "give the output folder of `envbuilder build`")
    return data


def default_tag(manifest: dict) -> str:
    image = manifest.get("image")
    if isinstance(image, dict) and image.get("tag"):
        return str(image["tag"])
    return f"envbuilder/{manifest.get('name', 'image')}:latest"


def find_folder(cwd: Path) -> Path | None:
    """No FOLDER and no --image: ./manifest.json, or the only images/<name>/ there is."""
    if (cwd / "manifest.json").is_file():
        return cwd
    found = sorted(p.parent for p in (cwd / "images").glob("*/manifest.json"))
    if len(found) == 1:
        return found[0]
    if found:
        names = ", ".join(str(p.relative_to(cwd)) for p in found)
        raise EnvbuilderError("FOLDER", f"several built folders here ({names}); which one?",
                              "envbuilder verify images/<name>")
    return None


def resolve_target(folder: str | None, image: str | None, runtime: str,
                   manifest: str | None = None, cwd: Path | None = None) -> Target:
    if runtime not in RUNTIMES:
        raise EnvbuilderError("--runtime", f"unknown runtime {runtime!r}", "one of " + ", ".join(RUNTIMES))
    cwd = cwd or Path.cwd()
    t = Target(runtime=runtime, image=image)
    if manifest:
        t.manifest_path = Path(manifest).resolve()
        t.manifest = read_manifest(t.manifest_path, "--manifest")
    if folder:
        f = Path(folder)
        if not f.exists():
            raise EnvbuilderError("FOLDER", f"{folder} does not exist",
                                  "give the output folder of `envbuilder build` (default images/<name>)")
        if f.is_file():
            if f.name.endswith(".json"):
                raise EnvbuilderError("FOLDER", f"{folder} is a file, not a folder",
                                      f"use --manifest {folder}, or give its folder")
            if not image:       # a .sif or other image file given as FOLDER
                t.image = str(f)
                folder = None
        if folder:
            if not (f / "manifest.json").is_file():
                raise EnvbuilderError("FOLDER", f"{folder} has no manifest.json",
                                      "give the output folder of `envbuilder build SPEC` "
                                      "(or run it first)")
            t.folder = f.resolve()
            if not manifest:
                t.manifest_path = t.folder / "manifest.json"
                t.manifest = read_manifest(t.manifest_path)
    elif not image and not manifest:
        found = find_folder(cwd)
        if found is None:
            raise EnvbuilderError("FOLDER", "nothing to verify: no FOLDER, no --image, and no "
                                  "manifest.json or images/<name>/ here",
                                  "envbuilder verify images/<name>  (or --image REF)")
        t.folder = found.resolve()
        t.manifest_path = t.folder / "manifest.json"
        t.manifest = read_manifest(t.manifest_path)
    if runtime == "host":
        if not t.manifest_path:
            raise EnvbuilderError("--runtime host", "the host runtime needs a manifest to compare with",
                                  "give FOLDER (holding manifest.json) or --manifest FILE")
        return t
    if not t.image:
        if runtime == "docker":
            t.image = default_tag(t.manifest)
        elif runtime == "apptainer":
            t.image = str((t.folder or cwd) / f"{t.manifest.get('name', 'image')}.sif")
        elif runtime == "charliecloud":
            t.image = default_tag(t.manifest)   # converted from the docker image
    return t


# ----------------------------------------------------------------------------- command lines

def suite_args(ranks: int, timeout: float, manifest_in_image: str | None, launcher: str = "auto",
               extra: list[str] | None = None) -> list[str]:
    args = ["--json", "--ranks", str(ranks), "--timeout", _num(timeout), "--launcher", launcher]
    if manifest_in_image:
        args += ["--manifest", manifest_in_image]
    return args + list(extra or [])


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def docker_argv(image: str, suite: list[str], *, name: str | None = None,
                manifest_path: Path | None = None, gpus: bool = False,
                docker: str = "docker", python: str = "python") -> list[str]:
    argv = [docker, "run", "--rm", "--shm-size=1g"]
    if name:
        argv += ["--name", name]
    if gpus:
        argv += ["--gpus", "all"]
    if manifest_path:
        argv += ["-v", f"{manifest_path}:{VERIFY_MANIFEST}:ro"]
    return argv + [image, python, "-m", SUITE_MODULE] + suite


def apptainer_argv(image: str, suite: list[str], *, manifest_path: Path | None = None,
                   apptainer: str = "apptainer", python: str = "python") -> list[str]:
    """`apptainer exec --nv IMAGE.sif python -m envbuilder_smoke ...` (what verify runs)."""
    argv = [apptainer, "exec", "--nv"]
    if manifest_path:
        argv += ["--bind", f"{manifest_path}:{VERIFY_MANIFEST}:ro"]
    return argv + [image, python, "-m", SUITE_MODULE] + suite


def charliecloud_argv(directory: str, suite: list[str], *, python: str = "python",
                      ch_run: str = "ch-run") -> list[str]:
    # bare --set-env: the image's own environment (PATH to its venv, LANG, ...), as docker has it
    return [ch_run, "--set-env", "--set-env=PYTHONNOUSERSITE=1", directory, "--", python, "-m",
            SUITE_MODULE] + suite


def host_argv(python: str, suite: list[str]) -> list[str]:
    return [python, "-m", HOST_MODULE] + suite


def host_env() -> dict:
    """The host runtime imports envbuilder.smoke from this checkout, whatever the interpreter."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


# ----------------------------------------------------------------------------- running

@dataclass
class Outcome:
    argv: list[str]
    returncode: int | None
    stdout: str
    wall_s: float
    timed_out: bool = False
    report: dict | None = None
    problem: str = ""


def parse_report(stdout: str) -> dict | None:
    """The JSON between the markers; else the last line that parses as a report."""
    start = stdout.rfind(BEGIN_MARKER)
    if start >= 0:
        end = stdout.find(END_MARKER, start)
        body = stdout[start + len(BEGIN_MARKER):end if end >= 0 else None]
        try:
            data = json.loads(body)
            if isinstance(data, dict) and "checks" in data:
                return data
        except ValueError:
            pass
    for line in reversed(stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                data = json.loads(line)
            except ValueError:
                continue
            if isinstance(data, dict) and "checks" in data:
                return data
    return None


def execute(argv: list[str], *, timeout: float, env: dict | None = None,
            on_timeout=None, echo_stderr: bool = True) -> Outcome:
    """Run ARGV; stderr streams through (progress), stdout is captured and parsed."""
    t0 = time.time()
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                stdin=subprocess.DEVNULL, env=env, start_new_session=True)
    except FileNotFoundError:
        raise EnvbuilderError("verify", f"{argv[0]} not found", "install it or pick another --runtime")
    except OSError as exc:
        raise EnvbuilderError("verify", f"cannot run {argv[0]}: {exc.strerror}")
    # stderr (the suite's progress lines) streams through live and its tail is kept for the
    # message when no report comes; stdout (the report) is collected
    err_tail: deque = deque(maxlen=40)

    def pump_stderr():
        for raw in iter(proc.stderr.readline, b""):
            line = raw.decode("utf-8", "replace")
            err_tail.append(line.rstrip("\n"))
            if echo_stderr:
                sys.stderr.write(line)
                sys.stderr.flush()

    out_chunks: list[bytes] = []

    def pump_stdout():
        for chunk in iter(lambda: proc.stdout.read(65536), b""):
            out_chunks.append(chunk)

    threads = [threading.Thread(target=pump_stderr, daemon=True),
               threading.Thread(target=pump_stdout, daemon=True)]
    for th in threads:
        th.start()
    timed_out = False
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        if on_timeout:
            on_timeout()
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except OSError:
            pass
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            proc.wait()
    for th in threads:
        th.join(timeout=10)
    text = b"".join(out_chunks).decode("utf-8", "replace")
    o = Outcome(argv=argv, returncode=proc.returncode, stdout=text, wall_s=time.time() - t0,
                timed_out=timed_out)
    o.report = parse_report(text)
    if o.report is None:
        tail = "\n".join((text.strip().splitlines() + [l for l in err_tail if l.strip()])[-15:])
        if timed_out:
            o.problem = f"the suite did not finish within {timeout:.0f} s and was stopped"
        else:
            o.problem = f"the suite printed no report (exit code {proc.returncode})"
        if tail:
            o.problem += "; its last output:\n" + tail
    return o


def _docker_cli() -> str:
    exe = shutil.which("docker")
    if not exe:
        raise EnvbuilderError("--runtime docker", "the docker CLI is not on PATH",
                              "install docker (apt-get install docker.io) and start the engine, "
                              "or use --runtime host|apptainer|charliecloud")
    return exe


def _docker_image_exists(docker: str, image: str) -> None:
    try:
        proc = subprocess.run([docker, "image", "inspect", "--format", "{{.Id}}", image],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60, text=True)
    except subprocess.TimeoutExpired:
        raise EnvbuilderError("--runtime docker", "the Docker engine did not answer within 60 s",
                              "start it (dockerd) and retry")
    if proc.returncode == 0:
        return
    err = proc.stderr.strip()
    if "Cannot connect" in err or "daemon" in err.lower() and "running" in err.lower():
        raise EnvbuilderError("--runtime docker", f"the Docker engine is not reachable ({err.splitlines()[0]})",
                              "start it (dockerd, or .ci/start-docker.sh) and retry")
    raise EnvbuilderError("--image", f"image {image} not found in the Docker engine",
                          "build it first: envbuilder build SPEC (or give --image REF)")


def docker_image_id(docker: str, image: str) -> str:
    proc = subprocess.run([docker, "image", "inspect", "--format", "{{.Id}}", image],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60, text=True)
    return proc.stdout.strip().split(":")[-1]


def charliecloud_dir(image: str, cache: Path | None = None) -> tuple[str, bool]:
    """A directory image for ch-run: IMAGE itself when it is one, else ch-convert'ed from the
    Docker image (cached by image id). Returns (directory, owned_by_us)."""
    if os.path.isdir(image):
        return image, False
    ch_convert = shutil.which("ch-convert")
    if not ch_convert:
        raise EnvbuilderError("--runtime charliecloud", "ch-convert is not on PATH",
                              "install charliecloud (apt-get install charliecloud) or give "
                              "--image DIR (an unpacked image)")
    docker = _docker_cli()
    _docker_image_exists(docker, image)
    cache = cache or Path(os.environ.get("ENVBUILDER_CH_CACHE", "/var/tmp/envbuilder-charliecloud"))
    cache.mkdir(parents=True, exist_ok=True)
    ident = docker_image_id(docker, image)[:16] or re.sub(r"[^A-Za-z0-9_.-]", "_", image)
    target = cache / ident
    if (target / "opt").is_dir():
        return str(target), True
    tmp = cache / f".{ident}.{uuid.uuid4().hex[:6]}"
    proc = subprocess.run([ch_convert, "-i", "docker", image, str(tmp)], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=1800)
    if proc.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise EnvbuilderError("ch-convert", f"converting {image} failed: "
                              + "\n".join(proc.stdout.strip().splitlines()[-5:]), exit_code=EXIT_CHECK_FAILED)
    os.replace(tmp, target)
    return str(target), True


@dataclass
class VerifyOptions:
    ranks: int = 2
    timeout: float = 120.0
    launcher: str = "auto"
    python: str | None = None       # host: interpreter (default sys.executable); images: "python"
    gpus: bool = False
    require_gpu: bool = False
    no_gpu: bool = False
    total_timeout: float | None = None
    echo_stderr: bool = True


def total_timeout(opts: VerifyOptions) -> float:
    """The outer guard: the suite enforces each check's timeout itself; this only catches a
    launcher that hangs as a whole (the image's Python, a stuck container start)."""
    if opts.total_timeout:
        return opts.total_timeout
    return max(600.0, opts.timeout * 10)


def build_argv(t: Target, opts: VerifyOptions, *, container_name: str | None = None,
               ch_directory: str | None = None, ch_manifest: bool = False
               ) -> tuple[list[str], dict | None]:
    """The command line verify runs for TARGET (and the environment, None = inherit)."""
    extra = ["--no-gpu"] if opts.no_gpu else []
    if t.runtime == "host":
        suite = suite_args(opts.ranks, opts.timeout, str(t.manifest_path), opts.launcher, extra)
        return host_argv(opts.python or sys.executable, suite), host_env()
    mounted = t.manifest_path if t.manifest_path else None
    in_image = VERIFY_MANIFEST if mounted else None
    py = opts.python or "python"
    if t.runtime == "docker":
        suite = suite_args(opts.ranks, opts.timeout, in_image, opts.launcher, extra)
        return docker_argv(t.image, suite, name=container_name, manifest_path=mounted, gpus=opts.gpus,
                           docker=shutil.which("docker") or "docker", python=py), None
    if t.runtime == "apptainer":
        suite = suite_args(opts.ranks, opts.timeout, in_image, opts.launcher, extra)
        exe = shutil.which("apptainer") or shutil.which("singularity") or "apptainer"
        return apptainer_argv(t.image, suite, manifest_path=mounted, apptainer=exe, python=py), None
    if t.runtime == "charliecloud":
        directory = ch_directory or t.image
        # ch-run binds nothing by default: the folder's manifest is copied into the directory
        # image verify converted (a user's own directory keeps its manifest)
        manifest_arg = VERIFY_MANIFEST if ch_manifest else None
        suite = suite_args(opts.ranks, opts.timeout, manifest_arg, opts.launcher, extra)
        env = dict(os.environ)
        env.setdefault("USER", "root" if os.geteuid() == 0 else str(os.geteuid()))
        return charliecloud_argv(directory, suite, python=py), env
    raise EnvbuilderError("--runtime", f"unknown runtime {t.runtime!r}")


def run_suite(t: Target, opts: VerifyOptions) -> Outcome:
    """Run the suite for TARGET; raise EnvbuilderError (exit 2) when it cannot start at all."""
    limit = total_timeout(opts)
    if t.runtime == "host":
        argv, env = build_argv(t, opts)
        if not (os.path.isfile(argv[0]) or shutil.which(argv[0])):
            raise EnvbuilderError("--python", f"{argv[0]} not found", "give an existing interpreter")
        return execute(argv, timeout=limit, env=env, echo_stderr=opts.echo_stderr)
    if t.runtime == "docker":
        docker = _docker_cli()
        _docker_image_exists(docker, t.image)
        name = f"envbuilder-verify-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        argv, env = build_argv(t, opts, container_name=name)

        def kill():
            subprocess.run([docker, "rm", "-f", name], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, timeout=60)
        try:
            return execute(argv, timeout=limit, env=env, on_timeout=kill, echo_stderr=opts.echo_stderr)
        finally:
            if _container_exists(docker, name):
                kill()
    if t.runtime == "apptainer":
        argv, env = build_argv(t, opts)
        if not (shutil.which("apptainer") or shutil.which("singularity")):
            raise EnvbuilderError("--runtime apptainer", "apptainer (or singularity) is not installed "
                                  "on this machine; on one that has it, verify runs:\n  "
                                  + " ".join(shlex.quote(a) for a in argv),
                                  "run that command on a cluster node, or use --runtime docker|host")
        if not os.path.exists(t.image):
            raise EnvbuilderError("--image", f"{t.image} does not exist",
                                  "build it: apptainer build IMAGE.sif Apptainer.def (or give --image)")
        return execute(argv, timeout=limit, env=env, echo_stderr=opts.echo_stderr)
    if t.runtime == "charliecloud":
        if not shutil.which("ch-run"):
            raise EnvbuilderError("--runtime charliecloud", "ch-run is not on PATH",
                                  "install charliecloud (apt-get install charliecloud)")
        directory, owned = charliecloud_dir(t.image)
        if owned and t.manifest_path:
            dst = Path(directory) / VERIFY_MANIFEST.lstrip("/")
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(t.manifest_path, dst)
        argv, env = build_argv(t, opts, ch_directory=directory,
                               ch_manifest=bool(owned and t.manifest_path))
        return execute(argv, timeout=limit, env=env, echo_stderr=opts.echo_stderr)
    raise EnvbuilderError("--runtime", f"unknown runtime {t.runtime!r}")


def _container_exists(docker: str, name: str) -> bool:
    try:
        proc = subprocess.run([docker, "container", "inspect", name], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    return proc.returncode == 0


__all__ = ["Target", "VerifyOptions", "Outcome", "resolve_target", "build_argv", "run_suite",
           "parse_report", "docker_argv", "apptainer_argv", "charliecloud_argv", "host_argv",
           "default_tag", "EXIT_BAD_INPUT", "EXIT_CHECK_FAILED"]
