"""The engine the lock resolves through (lock/engine.py's ImageEngine): Docker (its SDK), podman or
buildah (their command lines, rootless or as root). ``image_engine(name)`` makes the one asked
for -- or, with none named, the first usable of Docker, podman, buildah -- after the checks a
login node needs (engines/rootless.py); when none is usable, one message names what was tried.

The three answer alike for one image: its ID (a docker archive keeps it), and a registry digest
only where the registry serves it (Docker has no RepoDigests for a loaded image; podman and
buildah give every image a digest, so theirs count when the registry confirms it: OciImages._served). The resolution containers run
with the network (Docker's bridge; the host's for podman and buildah, as their builds do).
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys

from ..errors import CheckFailed, EnvbuilderError
from ..lock.base import registry_digest
from .buildah import OciEngine
from .docker import engine as docker_engine
from .rootless import preflight

AUTO_ORDER = ("docker", "podman", "buildah")


class DockerImages:
    """The Docker engine through its SDK client."""

    name = "docker"

    def __init__(self, client):
        self.client = client

    def version(self) -> str:
        return str(self.client.version().get("Version", "unknown"))

    def image(self, ref: str) -> dict | None:
        try:
            img = self.client.images.get(ref)
        except Exception:  # docker.errors.ImageNotFound, APIError
            return None
        return {"id": img.id, "repo_digests": list(img.attrs.get("RepoDigests") or []),
                "architecture": img.attrs.get("Architecture")}

    def pull(self, ref: str) -> None:
        try:
            self.client.images.pull(ref)
        except Exception as exc:  # docker.errors.APIError: unreachable registry, no such image
            raise RuntimeError(f"{type(exc).__name__}: {exc}") from None

    def run(self, image: str, argv: list[str], env: dict[str, str] | None = None, stderr: bool = True) -> str:
        try:
            out = self.client.containers.run(image, argv, remove=True, stdout=True, stderr=stderr,
                                             network_mode="bridge", environment=env)
        except Exception as exc:  # docker.errors.ContainerError, ImageNotFound, APIError
            detail = getattr(exc, "stderr", None)
            raise RuntimeError(detail.decode(errors="replace") if isinstance(detail, bytes) else str(exc)) from None
        return out.decode(errors="replace")


def _repo(name: str) -> str:
    """'localhost/local/debian:bookworm' -> 'localhost/local/debian' (a registry port stays)."""
    name = name.partition("@")[0]
    last = name.rsplit("/", 1)[-1]
    return name.rsplit(":", 1)[0] if ":" in last else name


class OciImages:
    """podman or buildah (engines/buildah.py's OciEngine) as the lock's engine."""

    def __init__(self, oci: OciEngine):
        self.oci = oci
        self.name = oci.name

    def version(self) -> str:
        out = self.oci.run("--version").stdout.split()          # "podman version 4.3.1"
        return out[2] if len(out) > 2 else "unknown"

    def image(self, ref: str) -> dict | None:
        image_id = self.oci.image_id(ref)
        if image_id is None:
            return None
        if self.name == "podman":
            data = json.loads(self.oci.run("image", "inspect", ref).stdout)[0]
            names, digest = data.get("RepoTags") or [], data.get("Digest")
            found = [d for d in data.get("RepoDigests") or [] if not d.startswith("localhost/")]
        else:
            listing = json.loads(self.oci.run("images", "--json", ref).stdout or "[]")
            names = listing[0].get("names") or [] if listing else []
            digest = listing[0].get("digest") if listing else None
            found = []
        found += [f"{_repo(n)}@{digest}" for n in names if digest and not n.startswith("localhost/")]
        arch = data.get("Architecture") if self.name == "podman" else None
        return {"id": image_id, "repo_digests": self._served(ref, found), "architecture": arch}

    @staticmethod
    def _served(ref: str, found: list[str]) -> list[str]:
        """podman and buildah give every image a digest, a loaded archive too (under docker.io/...
        when the archive names it so), and keep no record of where it came from: a digest is a
        registry digest when the registry serves it for REF (Docker's RepoDigests: pulled images
        only). Unreachable registry: none, so the lock names the image ID as Docker's does for a
        loaded image."""
        if not found:
            return []
        try:
            served = registry_digest(ref, timeout=10)
        except EnvbuilderError:
            return []
        return sorted({d for d in found if d.partition("@")[2] == served})

    def pull(self, ref: str) -> None:
        proc = self.oci.run("pull", "--quiet", ref, check=False, timeout=1800)
        if proc.returncode != 0:
            raise RuntimeError((proc.stderr or proc.stdout).strip()[-400:] or f"exit {proc.returncode}")

    def run(self, image: str, argv: list[str], env: dict[str, str] | None = None, stderr: bool = True) -> str:
        envs = [a for k, v in (env or {}).items() for a in ("--env", f"{k}={v}")]
        err = subprocess.STDOUT if stderr else subprocess.PIPE
        limits = _ulimits()
        if self.name == "podman":
            cmd = [self.oci.binary, "run", "--rm", "--pull=never", "--network", "host", *limits,
                   *envs, image, *argv]
            proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=err, text=True, errors="replace")
            if proc.returncode != 0:
                raise RuntimeError((proc.stderr or proc.stdout or f"exit {proc.returncode}")[-600:])
            return proc.stdout
        made = self.oci.run("from", "--pull=never", *limits, image, check=False)
        if made.returncode != 0:
            raise RuntimeError(made.stderr.strip()[-600:] or f"buildah from: exit {made.returncode}")
        container = made.stdout.strip().splitlines()[-1]
        try:
            cmd = [self.oci.binary, "run", "--network", "host", *envs, container, "--", *argv]
            proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=err, text=True, errors="replace")
        finally:
            self.oci.run("rm", container, check=False)
        if proc.returncode != 0:
            raise RuntimeError((proc.stderr or proc.stdout or f"exit {proc.returncode}")[-600:])
        return proc.stdout


def _ulimits() -> list[str]:
    """The container's limits: this process's own open files, at most buildah's usual 32768
    processes. The engines' defaults (1048576 files; podman: the host's processes) are more than
    many machines let a process set (runc: "error setting rlimit ... operation not permitted")."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    procs = resource.getrlimit(resource.RLIMIT_NPROC)[0]
    procs = 32768 if procs in (resource.RLIM_INFINITY, -1) else min(procs, 32768)
    return ["--ulimit", f"nofile={soft}:{hard}", "--ulimit", f"nproc={procs}:{procs}"]


def _usable(name: str, gpu: bool, quiet: bool):
    if name == "docker":
        return DockerImages(docker_engine())
    oci = OciEngine(name)
    for warning in preflight(oci, gpu):
        if not quiet:
            print(f"warning: {warning}", flush=True, file=sys.stderr)
    return OciImages(oci)


def image_engine(name: str | None, required_for: str, *, gpu: bool = False, quiet: bool = False):
    """The engine the lock resolves with: ``name`` (docker, podman, buildah: its own error when it
    is not usable, as the build would give), or with none named the first usable of Docker,
    podman, buildah (EnvbuilderError, exit 2, naming every engine tried and why not)."""
    if name:
        try:
            return _usable(name, gpu, quiet)
        except CheckFailed as exc:
            raise CheckFailed(exc.field, f"{exc.reason} (needed to lock {required_for})", exc.fix) from None
    tried = []
    for each in AUTO_ORDER:
        try:
            return _usable(each, gpu, quiet)
        except EnvbuilderError as exc:
            tried.append(f"{each}: {exc.reason}")
    raise EnvbuilderError(
        "lock: engine", f"no container engine to lock {required_for} with; tried " + "; ".join(tried),
        "start Docker (or set DOCKER_HOST), or install podman or buildah and pass --engine podman|buildah "
        "(rootless, on a login node: docs/login-node.md); or lock elsewhere and bring the lock (--lock FILE)")
