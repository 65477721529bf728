"""Build with Apptainer (or SingularityCE): from Apptainer.def, or by converting the image the
Docker engine already holds (docker-daemon://). Neither runs on machines without the binary:
then the command it would run is part of the message."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

from ..errors import CheckFailed
from ..render.manifest import image_tag
from .docker import engine
from .options import BuildOptions


def find_binary() -> str | None:
    for name in ("apptainer", "singularity"):
        path = shutil.which(name)
        if path:
            return path
    return None


def apptainer_command(folder: Path, output, binary: str = "apptainer", from_docker: str | None = None) -> list[str]:
    sif = f"{output.stack.spec.name}.sif"
    source = f"docker-daemon://{from_docker}" if from_docker else "Apptainer.def"
    return [binary, "build", "--force", sif, source]


def _docker_has(tag: str) -> bool:
    try:
        engine().images.get(tag)
        return True
    except Exception:  # no engine or no such image: build from the definition file instead
        return False


def build(folder: Path, output, opts: BuildOptions) -> dict:
    tag = opts.tag or image_tag(output.stack)
    from_docker = tag if _docker_has(tag) else None
    binary = find_binary()
    cmd = apptainer_command(folder, output, binary or "apptainer", from_docker)
    shown = f"cd {shlex.quote(str(folder))} && {' '.join(shlex.quote(c) for c in cmd)}"
    if binary is None:
        raise CheckFailed("apptainer build", "neither apptainer nor singularity is installed here",
                          f"on a machine that has it, run: {shown}")
    log_path = folder / "apptainer-build.log"
    with open(log_path, "w", encoding="utf-8") as log:
        code = subprocess.run(cmd, cwd=folder, stdout=log, stderr=subprocess.STDOUT).returncode
    if code != 0:
        raise CheckFailed("apptainer build", f"`{shown}` failed (exit {code})", f"the full log is {log_path}")
    return {"engine": "apptainer", "sif": str(folder / cmd[3]), "log": str(log_path)}
