"""docker: `verify`'s default runtime (the image the Docker engine holds). Not a job.sbatch
runtime: a cluster runs images through apptainer, charliecloud or pyxis."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from contextlib import contextmanager
from pathlib import Path

from ..errors import EnvbuilderError
from ..paths import SUITE_MODULE, VERIFY_MANIFEST
from .base import Launch, Runtime


def default_tag(manifest: dict) -> str:
    """The manifest's image.tag, else envbuilder/<name>:latest."""
    image = manifest.get("image")
    if isinstance(image, dict) and image.get("tag"):
        return str(image["tag"])
    return f"envbuilder/{manifest.get('name', 'image')}:latest"


def docker_cli() -> str:
    exe = shutil.which("docker")
    if not exe:
        raise EnvbuilderError("--runtime docker", "the docker CLI is not on PATH",
                              "install docker (apt-get install docker.io) and start the engine, "
                              "or use --runtime host|apptainer|charliecloud")
    return exe


def require_image(docker: str, image: str) -> None:
    try:
        proc = subprocess.run([docker, "image", "inspect", "--format", "{{.Id}}", image],
                              capture_output=True, timeout=60, text=True)
    except subprocess.TimeoutExpired:
        raise EnvbuilderError("--runtime docker", "the Docker engine did not answer within 60 s",
                              "start it (dockerd) and retry") from None
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
                          capture_output=True, timeout=60, text=True)
    return proc.stdout.strip().split(":")[-1]


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


def _container_exists(docker: str, name: str) -> bool:
    try:
        proc = subprocess.run([docker, "container", "inspect", name], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    return proc.returncode == 0


class Docker(Runtime):
    name = "docker"
    in_verify = True

    identifies_images = True

    def default_image(self, manifest, folder, cwd):
        """The image the folder's own build made (its image.json: a build with --tag, or by buildah
        handed to Docker), else the spec's default tag."""
        return built_tag(folder) or default_tag(manifest)

    def image_id(self, image):
        proc = subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}", image],
                              capture_output=True, text=True)
        return proc.stdout.strip() if proc.returncode == 0 else None

    def command(self, t, opts, suite, container_name: str | None = None):
        mounted = t.manifest_path or None             # the folder's manifest is the truth
        return docker_argv(t.image, suite(VERIFY_MANIFEST if mounted else None), name=container_name,
                           manifest_path=mounted, gpus=opts.gpus, docker=shutil.which("docker") or "docker",
                           python=opts.python or "python"), None

    @contextmanager
    def session(self, t, opts, suite):
        docker = docker_cli()
        require_image(docker, t.image)
        name = f"envbuilder-verify-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        argv, env = self.command(t, opts, suite, container_name=name)

        def kill():
            subprocess.run([docker, "rm", "-f", name], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, timeout=60)
        try:
            yield Launch(argv, env, on_timeout=kill)
        finally:
            if _container_exists(docker, name):
                kill()


def built_tag(folder: Path | None) -> str | None:
    """The Docker tag <folder>/image.json records (written by `envbuilder build`), when it is one
    Docker holds: a file of at most 64 KiB holding an image reference; anything else: None."""
    import json

    from ..quoting import IMAGE_REF_RE

    path = folder / "image.json" if folder else None
    if path is None or not path.is_file() or path.is_symlink() or path.stat().st_size > 65536:
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, OSError):
        return None
    tag = data.get("tag") if isinstance(data, dict) else None
    if not isinstance(tag, str) or len(tag) > 512 or not IMAGE_REF_RE.fullmatch(tag):
        return None
    if data.get("engine") != "docker" and not data.get("docker_id"):
        return None         # a buildah/podman image not handed to Docker
    return tag

