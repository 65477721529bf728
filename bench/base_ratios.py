"""Image / payload of every x86_64 CPU preset on the full and on the slim Debian base, side by side in
one run (issue 38: "image/payload at 1.10 on every preset").

Per preset: recipes/PRESET.yaml as it is (base local/debian:bookworm-slim, made like Docker Hub's
debian:bookworm-slim by .ci/make-base-image.sh --slim) and the same spec with the full
local/debian:bookworm, each locked and built by `envbuilder build` on Docker (BuildKit; the cache is
used, so run it twice for a warm figure); then the image's size as Docker reports it (uncompressed,
base included) and the payload measured inside the image by bench/payload.py (the venv, the
interpreter and its standard library, Open MPI's plugins, the shared libraries they load), as
bench/bench.py measures both. The GPU presets are left out: 5-6 GB of NVIDIA wheels make their
ratio about 1.0 on either base, and each takes 12-16 minutes to build here.

    python bench/base_ratios.py                                   # the five CPU presets, ~20 min cold
    python bench/base_ratios.py --presets cpu-torch-ddp --bases slim --json out.json
    python bench/base_ratios.py --table out.json                  # print a saved run's table

Images are tagged localhost/envbuilder-bench/ratio-PRESET:full|slim and removed at the end
(--keep-images keeps them).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench"
PRESETS = ["cpu-torch-horovod", "cpu-torch-ddp", "cpu-tf-horovod", "cpu-tf-multiworker", "intel-tf-cpu-debian"]
BASES = {"full": "local/debian:bookworm", "slim": "local/debian:bookworm-slim"}
GOAL = 1.10


def docker_cli() -> str:
    return "/usr/bin/docker" if Path("/usr/bin/docker").exists() else "docker"


def measure(preset: str, label: str, base: str, work: Path, wheelhouse: str) -> dict:
    text = (REPO / "recipes" / f"{preset}.yaml").read_text()
    found = re.search(r"^base: (\S+)\s*$", text, flags=re.M)
    if not found:
        raise SystemExit(f"base_ratios: recipes/{preset}.yaml names no base")
    spec = work / f"{preset}-{label}.yaml"
    spec.write_text(text.replace(found.group(0), f"base: {base}", 1))
    out = work / f"{preset}-{label}"
    tag = f"localhost/envbuilder-bench/ratio-{preset}:{label}"
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "envbuilder", "build", str(spec), "--out", str(out),
                           "--tag", tag, "--wheelhouse", wheelhouse], capture_output=True, text=True, cwd=REPO)
    seconds = time.monotonic() - t0
    if proc.returncode != 0:
        raise SystemExit(f"base_ratios: {preset} on {base}: envbuilder build failed ({proc.returncode}):\n"
                         + proc.stderr[-3000:])
    size = int(subprocess.run([docker_cli(), "image", "inspect", "--format", "{{.Size}}", tag],
                              capture_output=True, text=True, check=True).stdout)
    run = subprocess.run([docker_cli(), "run", "--rm", "-i", "--network", "none", "--entrypoint", "python3", tag,
                          "-"], input=(BENCH / "payload.py").read_text(), capture_output=True, text=True, check=True)
    payload = json.loads(run.stdout.strip().splitlines()[-1])
    return {"preset": preset, "base": label, "base_ref": base, "tag": tag, "build_s": round(seconds, 1),
            "size_bytes": size, "payload_bytes": payload["total"], "payload_parts": payload["bytes"],
            "ratio": round(size / payload["total"], 3)}


def table(rows: list[dict]) -> str:
    lines = ["| preset | base | image MB | payload MB | ratio | build s |", "|---|---|---:|---:|---:|---:|"]
    for r in rows:
        mark = "" if r["ratio"] <= GOAL else " (over 1.10)"
        lines.append(f"| {r['preset']} | {r['base']} | {r['size_bytes'] / 1e6:.0f} | {r['payload_bytes'] / 1e6:.0f} "
                     f"| {r['ratio']:.3f}{mark} | {r['build_s']:.0f} |")
    by = {(r["preset"], r["base"]): r for r in rows}
    lines += ["", "| preset | image MB full -> slim | ratio full -> slim |", "|---|---:|---:|"]
    for preset in dict.fromkeys(r["preset"] for r in rows):
        full, slim = by.get((preset, "full")), by.get((preset, "slim"))
        if full and slim:
            lines.append(f"| {preset} | {full['size_bytes'] / 1e6:.0f} -> {slim['size_bytes'] / 1e6:.0f} "
                         f"| {full['ratio']:.3f} -> {slim['ratio']:.3f} |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--presets", default=",".join(PRESETS))
    p.add_argument("--json", help="write the measurements here")
    p.add_argument("--table", help="print the table of a saved run and stop")
    p.add_argument("--wheelhouse", default=os.environ.get("ENVBUILDER_WHEELHOUSE", "/opt/wheels"))
    p.add_argument("--bases", default=",".join(BASES), help="full,slim (default both) or one of them")
    p.add_argument("--keep-images", action="store_true")
    args = p.parse_args()
    if args.table:
        print(table(json.loads(Path(args.table).read_text())["rows"]))
        return 0
    rows = []
    with tempfile.TemporaryDirectory(prefix="envbuilder-base-ratios-") as tmp:
        try:
            for preset in [x for x in args.presets.split(",") if x]:
                for label, base in BASES.items():
                    if label not in args.bases.split(","):
                        continue
                    print(f"[{time.strftime('%H:%M:%S')}] {preset} on {base}", file=sys.stderr, flush=True)
                    rows.append(measure(preset, label, base, Path(tmp), args.wheelhouse))
        finally:
            if not args.keep_images:
                for r in rows:
                    subprocess.run([docker_cli(), "rmi", r["tag"]], capture_output=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "date": time.strftime("%Y-%m-%d")}, indent=1) + "\n")
    print(table(rows))
    over = [f"{r['preset']} ({r['ratio']:.3f})" for r in rows if r["base"] == "slim" and r["ratio"] > GOAL]
    print("\nslim base: every preset at or under 1.10" if not over else "\nslim base, over 1.10: " + ", ".join(over))
    return 0


if __name__ == "__main__":
    sys.exit(main())
