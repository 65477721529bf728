"""Figures for GPU images built with `cuda: {source: pypi}`: image size against payload, duplicate
NVIDIA libraries, the layers in build order, and (with --recipe) the build time and what a one-pin
change in packages.pip rebuilds.

    .venv/bin/python bench/gpu_figures.py envbuilder-test/gpu-torch-horovod-pypi [TAG ...]
    .venv/bin/python bench/gpu_figures.py --recipe recipes/torch-ddp-pypi.yaml [--cold] [--keep]

Payload is bench/payload.py run inside the image (venv, interpreter, MPI plug-ins, the shared
libraries they load). --recipe: the recipe plus `packages: {pip: [six==1.16.0]}` is locked,
rendered and built (`docker build`, the command envbuilder runs; --cold adds --no-cache), then
the pin becomes six==1.17.0 and the image is built again on that cache: a table of every step
(seconds, or "cached") for both builds, then the figures of the second image. Images are tagged
envbuilder-bench/gpu-NAME:a and :b and removed at the end unless --keep. Exit 1 when an image
is missing or a build fails.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import bench as cpu_bench     # bench/bench.py: the BuildKit command envbuilder runs, its log reading

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


def print_figures(tag: str) -> None:
    f = figures(tag)
    print(f"\n{f['tag']}")
    print(f"  image size      {f['size'] / 1e9:8.2f} GB")
    print(f"  payload         {f['payload'] / 1e9:8.2f} GB")
    print(f"  size / payload  {f['ratio']:8.3f}   (goal <= 1.10)")
    print(f"  NVIDIA library files {f['nvidia_files']}, duplicates: {f['duplicates'] or 'none'}")
    print("  layers (build order):")
    for created, size in f["layers"]:
        print(f"    {size:>9}  {created}")


# --- build time and the one-pin rebuild ---------------------------------------------------------

PINS = ("six==1.16.0", "six==1.17.0")


def steps(log: str, stages: list[str] = ()) -> list[tuple[str, str]]:
    """(step, seconds or 'cached') for every Dockerfile step of a BuildKit plain-progress log, in
    the order of STAGES (the Dockerfile's; BuildKit numbers steps as it starts them)."""
    heads = {n: h for n, h in re.findall(r"^#(\d+) (\[[^\]]+\] .*|exporting to image)$", log, flags=re.M)}
    ends = {}
    for n, how in re.findall(r"^#(\d+) (CACHED|DONE [\d.]+s)$", log, flags=re.M):
        ends[n] = "cached" if how == "CACHED" else how.split()[1]
    rows = []
    for n, head in heads.items():
        if head.startswith("[internal]") or head.split("] ", 1)[-1].startswith("FROM "):
            continue
        rows.append((re.sub(r"\s+", " ", head)[:100], ends.get(n, "?")))
    order = {name: i for i, name in enumerate(stages)}

    def key(row):
        m = re.match(r"\[([\w.-]+) (\d+)/\d+\]", row[0])
        return (0, order.get(m.group(1), len(order)), int(m.group(2))) if m else (1, 0, 0)
    return sorted(rows, key=key)


def build(recipe: Path, pin: str, work: Path, tag: str, ca: str | None, cold: bool) -> dict:
    """Lock and render RECIPE + PIN, then build it; seconds of each part and the steps."""
    spec = work / f"spec-{pin}.yaml"
    text = recipe.read_text()
    if "\npackages:" in text:
        raise SystemExit(f"{recipe}: has packages already; pick a recipe without")
    spec.write_text(text.rstrip("\n") + f'\npackages: {{pip: ["{pin}"]}}\n')
    lock, ctx, log = work / "envbuilder.lock", work / f"ctx-{pin}", work / "bench.log"
    py = sys.executable
    ca_args = ["--ca-bundle", ca] if ca else []
    lock_s, _ = cpu_bench.run([py, "-m", "envbuilder", "lock", str(spec), "--lock", str(lock), *ca_args], log)
    cpu_bench.run([py, "-m", "envbuilder", "build", str(spec), "--lock", str(lock), "--out", str(ctx),
                   "--no-build"], log)
    cmd = cpu_bench.engine().docker_build_command(cpu_bench.docker_cli(), ctx, tag, ca)
    if cold:
        cmd.insert(-1, "--no-cache")
    env = dict(__import__("os").environ, DOCKER_BUILDKIT="1")
    build_s, out = cpu_bench.run(cmd, log, env=env)
    stages = re.findall(r"^FROM \S+ AS (\S+)$", (ctx / "Dockerfile").read_text(), flags=re.M)
    return {"lock_s": lock_s, "build_s": build_s, "steps": steps(out, stages)}


def rebuild_table(recipe: Path, ca: str | None, cold: bool, keep: bool) -> int:
    name = recipe.stem
    work = Path(tempfile.mkdtemp(prefix=f"gpu-bench-{name}-"))
    tags = [f"envbuilder-bench/gpu-{name}:a", f"envbuilder-bench/gpu-{name}:b"]
    print(f"{recipe}  (work folder {work}; started {time.strftime('%H:%M:%S')}, "
          f"load {cpu_bench.load()})", flush=True)
    try:
        first = build(recipe, PINS[0], work, tags[0], ca, cold)
        second = build(recipe, PINS[1], work, tags[1], ca, False)
        print(f"\n  {'':<12}{'lock s':>9}{'build s':>10}  steps run / cached")
        for label, b in ((("cold " if cold else "first ") + PINS[0], first), ("one pin: " + PINS[1], second)):
            ran = sum(1 for _, t in b["steps"] if t != "cached")
            print(f"  {label:<24}{b['lock_s']:>7.1f}{b['build_s']:>10.1f}  {ran} / {len(b['steps']) - ran}")
        print(f"\n  {'step':<100} {'first':>8} {'one pin':>8}")
        second_by = dict(second["steps"])
        for step, t in first["steps"]:
            print(f"  {step:<100} {t:>8} {second_by.get(step, '-'):>8}")
        print_figures(tags[1])
    finally:
        if not keep:
            for tag in tags:
                subprocess.run([DOCKER, "rmi", "-f", tag], capture_output=True)
    return 0


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("tags", nargs="*", help="images already built")
    p.add_argument("--recipe", type=Path, help="build it twice: first, then after a one-pin change")
    p.add_argument("--cold", action="store_true", help="the first build with --no-cache")
    p.add_argument("--keep", action="store_true", help="keep the two bench images")
    p.add_argument("--ca-bundle", default="/etc/ssl/certs/ca-certificates.crt")
    args = p.parse_args(argv)
    if not args.tags and not args.recipe:
        print(__doc__)
        return 2
    ca = args.ca_bundle if args.ca_bundle and Path(args.ca_bundle).is_file() else None
    if args.recipe:
        rebuild_table(args.recipe, ca, args.cold, args.keep)
    for tag in args.tags:
        print_figures(tag)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
