"""Figures for GPU images built with `cuda: {source: pypi}`: image size against payload, duplicate
NVIDIA libraries, and the layers (largest first within the build order).

    .venv/bin/python bench/gpu_figures.py envbuilder-test/gpu-torch-horovod-pypi [TAG ...]

Payload is bench/payload.py run inside the image (venv, interpreter, MPI plug-ins, the shared
libraries they load). Prints one table per image; exit 1 when an image is missing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

DOCKER = "/usr/bin/docker"
PAYLOAD = Path(__file__).with_name("payload.py")
NVIDIA_LIBS = r"libnccl.so*|libcudnn*.so*|libcublas*.so*|libcudart.so*|libcufft*.so*|libcusparse*.so*"


def run(*args: str, stdin: str | None = None) -> str:
    proc = subprocess.run([DOCKER, *args], input=stdin, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"docker {' '.join(args[:3])}: {proc.stderr.strip()[-300:]}")
    return proc.stdout


def figures(tag: str) -> dict:
    size = json.loads(run("image", "inspect", tag))[0]["Size"]
    payload = json.loads(run("run", "--rm", "-i", "--entrypoint", "python", tag, "-", stdin=PAYLOAD.read_text()))
    names = " -o ".join(f"-name '{n}'" for n in NVIDIA_LIBS.split("|"))
    found = run("run", "--rm", "--entrypoint", "bash", tag, "-c",
                f"find / -xdev \\( {names} \\) -type f -not -path '/proc/*' -printf '%f\\n'").split()
    dups = {n: c for n, c in Counter(found).items() if c > 1}
    history = [json.loads(line) for line in run("history", "--no-trunc", "--format", "{{json .}}", tag).splitlines()]
    layers = [(h["CreatedBy"][:90], h["Size"]) for h in reversed(history) if h["Size"] not in ("0B", "0")]
    return {"tag": tag, "size": size, "payload": payload["total"], "ratio": size / payload["total"],
            "nvidia_files": len(found), "duplicates": dups, "layers": layers}


def main(tags: list[str]) -> int:
    if not tags:
        print(__doc__)
        return 2
    for tag in tags:
        f = figures(tag)
        print(f"\n{f['tag']}")
        print(f"  image size      {f['size'] / 1e9:8.2f} GB")
        print(f"  payload         {f['payload'] / 1e9:8.2f} GB")
        print(f"  size / payload  {f['ratio']:8.3f}   (goal <= 1.10)")
        print(f"  NVIDIA library files {f['nvidia_files']}, duplicates: {f['duplicates'] or 'none'}")
        print("  layers (build order):")
        for created, size in f["layers"]:
            print(f"    {size:>9}  {created}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
