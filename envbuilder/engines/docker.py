"""Build with the Docker engine. The SDK checks the engine (reachable, version, disk); the
build itself goes through a docker CLI with BuildKit, which secrets and bind mounts need."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from .. import safewrite
from ..errors import CheckFailed, EnvbuilderError
from ..output import write_atomic
from ..render.manifest import image_tag
from .buildlog import certificate_failure, explain_build_failure
from .context import check_inputs, pip_index_conf, platform_of, stage_context
from .options import BuildOptions

MIN_API = (1, 40)            # Docker 19.03: BuildKit secrets and RUN --mount
# free disk a build needs (image + build cache): a CPU stack; CUDA from an nvidia/cuda or NGC base;
# CUDA from NVIDIA's PyPI wheels (measured: torch-horovod-pypi or torch-ddp-pypi from cold add about
# 11 GB of build cache: wheels 2.9 GB, torch 2.0 GB, the two runtime copies 2.9 + 2.1 GB)
MIN_FREE_GB = {"cpu": 8, "cuda": 30, "cuda-pypi": 15}
STEP_RE = re.compile(r"^#\d+ \[([^\]]+)\] (.*)$")


def engine():
    """A Docker SDK client of an engine that answers (CheckFailed, with the fix, when none does)."""
    try:
        import docker
    except ImportError:  # a declared dependency; only a broken install lacks it
        raise CheckFailed("docker engine", "the docker Python SDK is not installed",
                          "pip install docker") from None
    try:
        client = docker.from_env(timeout=60)
        client.ping()
    except Exception as exc:  # the SDK raises several unrelated types for "no engine"
        raise CheckFailed("docker engine", f"no Docker engine answers ({type(exc).__name__})",
                          "start it (e.g. `dockerd &` or `systemctl start docker`) or set DOCKER_HOST; "
                          "--no-build writes the files without an engine") from None
    return client


def _check_engine(client, kind: str) -> None:
    version = client.version()
    api = tuple(int(p) for p in version.get("ApiVersion", "0.0").split(".")[:2])
    if api < MIN_API:
        raise CheckFailed("docker engine", f"engine API {version.get('ApiVersion')} "
                          f"(Docker {version.get('Version')}) is too old for BuildKit secrets",
                          "use Docker >= 19.03")
    root = client.info().get("DockerRootDir") or "/var/lib/docker"
    probe = Path(root) if Path(root).exists() else Path("/")
    free_gb = shutil.disk_usage(probe).free / 1e9
    need = MIN_FREE_GB[kind]
    if free_gb < need:
        raise CheckFailed("docker engine", f"only {free_gb:.1f} GB free under {root}; this build needs "
                          f"about {need} GB", "free disk space (docker system prune) or move Docker's data root")


def docker_cli() -> str:
    """A docker CLI for plain commands (save, inspect): ENVBUILDER_DOCKER_CLI, else PATH's."""
    return os.environ.get("ENVBUILDER_DOCKER_CLI") or shutil.which("docker") or "docker"


def docker_candidates() -> list[str]:
    """Every docker CLI a BuildKit build may use, in the order tried: ENVBUILDER_DOCKER_CLI, then PATH's."""
    candidates = []
    if os.environ.get("ENVBUILDER_DOCKER_CLI"):
        candidates.append(os.environ["ENVBUILDER_DOCKER_CLI"])
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        exe = Path(folder) / "docker"
        if exe.is_file() and os.access(exe, os.X_OK) and str(exe) not in candidates:
            candidates.append(str(exe))
    return candidates


def buildkit_cli() -> list[str]:
    """The command prefix of a docker CLI that can run a BuildKit build."""
    for exe in docker_candidates():
        if subprocess.run([exe, "buildx", "version"], capture_output=True).returncode == 0:
            return [exe, "buildx", "build", "--load"]
        out = subprocess.run([exe, "version", "--format", "{{.Client.Version}}"], capture_output=True, text=True)
        client_version = (out.stdout or "0").strip().split(".")[0]
        if client_version.isdigit() and int(client_version) < 23:
            return [exe, "build"]       # BuildKit built in, enabled by DOCKER_BUILDKIT=1
    raise CheckFailed("docker build", "no docker CLI with BuildKit found (needs the buildx plugin, or a "
                      "docker CLI older than 23 with BuildKit built in)",
                      "install docker-buildx, or set ENVBUILDER_DOCKER_CLI to a CLI that has BuildKit")


def docker_build_command(cli: list[str], context: Path, tag: str, ca_bundle: str | None,
                         netrc: str | None = None, platform: str | None = None, no_cache: bool = False) -> list[str]:
    cmd = list(cli) + ["--progress=plain", "--tag", tag]
    if no_cache:
        cmd.append("--no-cache")
    if platform:
        # an aarch64 image: on an x86_64 machine this needs QEMU binfmt
        cmd += ["--platform", platform]
    if ca_bundle:
        cmd += ["--secret", f"id=ca,src={Path(ca_bundle).resolve()}"]
    if netrc:
        cmd += ["--secret", f"id=netrc,src={Path(netrc).resolve()}"]
    cmd.append(str(context))
    return cmd


def _failed_step(log_lines: list[str]) -> str:
    """The step BuildKit was running when the build failed, as the Dockerfile names it."""
    for line in reversed(log_lines):
        m = re.search(r"failed to solve: .*?process \"(.+?)\" did not complete", line)
        if m:
            return m.group(1)[:200]
    steps = [STEP_RE.match(l) for l in log_lines]
    steps = [m for m in steps if m]
    if steps:
        return f"[{steps[-1].group(1)}] {steps[-1].group(2)[:160]}"
    return "the build"


TRANSIENT = ("no active session for", "context canceled")


def _transient(lines: list[str]) -> bool:
    tail = "\n".join(lines[-20:])
    return any(marker in tail for marker in TRANSIENT)


def _run_build(cmd: list[str], env: dict, log, quiet: bool, shown_steps: set[str]) -> tuple[int, list[str]]:
    """Run one build, streaming BuildKit's plain log to ``log`` and new step lines to stderr."""
    lines: list[str] = []
    log.write("$ " + " ".join(cmd) + "\n")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, errors="replace")
    for line in proc.stdout:
        log.write(line)
        lines.append(line.rstrip("\n"))
        step = STEP_RE.match(line)
        if not quiet and step and step.group(1) not in shown_steps:
            shown_steps.add(step.group(1))
            print(f"  [{step.group(1)}] {step.group(2)[:120]}", file=sys.stderr, flush=True)
    return proc.wait(), lines


def build(folder: Path, output, opts: BuildOptions) -> dict:
    ca, wheelhouse, netrc = opts.ca_bundle, opts.wheelhouse, opts.netrc
    check_inputs(ca, wheelhouse)
    if netrc and not Path(netrc).is_file():
        raise EnvbuilderError("--netrc", f"no such file: {netrc}",
                              "give a netrc file: machine HOST login USER password TOKEN")
    if not {"docker", "sif"} & set(output.stack.spec.targets):
        raise EnvbuilderError("targets", "the spec does not list docker, so there is no Dockerfile to build",
                              "add docker to targets, or use --engine apptainer")
    client = engine()
    stack = output.stack
    _check_engine(client, "cpu" if stack.spec.cuda is None else "cuda-pypi" if stack.pypi_cuda else "cuda")
    cli = buildkit_cli()
    tag = opts.tag or image_tag(output.stack)
    context = stage_context(folder, output.files, wheelhouse, pip_index_conf(opts.index_url, opts.extra_index_urls),
                            opts.skip_wheels)
    log_path = folder / "build.log"
    cmd = docker_build_command(cli, context, tag, ca, netrc, platform=platform_of(output.stack), no_cache=opts.no_cache)
    quiet = opts.quiet
    env = dict(os.environ, DOCKER_BUILDKIT="1")
    started = time.monotonic()
    shown_steps: set[str] = set()
    try:
        with safewrite.open_new(log_path, option="build log", inside=folder) as log:
            code, lines = _run_build(cmd, env, log, quiet, shown_steps)
            if code != 0 and _transient(lines):
                # BuildKit in Docker 20.10 drops a build's session under heavy load ("no active
                # session", "context canceled"); the same build then passes from the cache.
                log.write("\n# envbuilder: BuildKit lost its session; building once more\n")
                if not quiet:
                    print("  BuildKit lost its session; retrying once (cached steps are kept)", file=sys.stderr)
                code, lines = _run_build(cmd, env, log, quiet, shown_steps)
    finally:
        shutil.rmtree(context, ignore_errors=True)
    seconds = time.monotonic() - started
    if code != 0:
        why = explain_build_failure(lines, output.stack.lock)
        tls = certificate_failure(lines, opts.ca_bundle)
        raise CheckFailed("docker build", f"step failed: {_failed_step(lines)}" + (f"\n  lock: {why}" if why else "")
                          + (f"\n  tls: {tls}" if tls else ""), f"the full log is {log_path}")
    image = client.images.get(tag)
    info = {"engine": "docker", "tag": tag, "id": image.id, "size_bytes": image.attrs.get("Size"),
            "build_seconds": round(seconds, 1), "log": str(log_path)}
    write_atomic(folder / "image.json", json.dumps(info, indent=2) + "\n", option="image.json", inside=folder)
    if not quiet:
        print(f"built {tag} ({image.id[:19]}, {info['size_bytes'] / 1e6:.0f} MB) in {seconds:.0f} s; log {log_path}")
    return info


def push(folder: Path, info: dict, ref: str) -> dict:
    """`docker tag` + `docker push REF`; the registry's manifest digest (from push's own output)
    recorded in FOLDER/image.json as `pushed` {ref, digest, pinned: REPO@sha256:D}."""
    cli = docker_cli()
    tagged = subprocess.run([cli, "tag", info["tag"], ref], capture_output=True, text=True, timeout=120)
    if tagged.returncode != 0:
        raise CheckFailed("docker tag", (tagged.stderr.strip() or f"exit {tagged.returncode}")[-300:], "")
    proc = subprocess.run([cli, "push", ref], capture_output=True, text=True, timeout=7200)
    found = re.search(r"digest: (sha256:[0-9a-f]{64})", proc.stdout)
    if proc.returncode != 0 or not found:
        why = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1][:300]
        raise CheckFailed("docker push", why, f"check that {ref.split('/')[0]} is a registry you can push to "
                          "(Docker needs `insecure-registries` for plain HTTP other than 127.0.0.1)")
    repo = ref.rsplit(":", 1)[0] if ":" in ref.rsplit("/", 1)[-1] else ref
    pushed = {"ref": ref, "digest": found.group(1), "pinned": f"{repo}@{found.group(1)}"}
    record = {**info, "pushed": pushed}
    write_atomic(folder / "image.json", json.dumps(record, indent=2) + "\n", option="image.json", inside=folder)
    print(f"pushed {ref}: {pushed['pinned']}")
    return pushed
