"""A Docker image made into charliecloud's directory image, two ways, side by side: `ch-convert -i
docker IMAGE DIR` (Charliecloud's own: it writes `docker export` to a file, gzips it, reads it back
twice) and envbuilder's `docker_to_directory` (one `docker export | tar -x` stream, the same tree;
envbuilder/runtimes/charliecloud.py). Per image and way: the median wall time of N tries and the
size of the tree; the trees are compared entry by entry (type, mode, owner, path, link target).

    python bench/charliecloud_unpack.py [--image TAG ...] [--tries 3] [--json FILE]

Default images: the local base (local/debian:bookworm-plain) and every envbuilder/* image the
engine holds (the test suite's keep them until its end). Folders are made under /var/tmp and
removed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from envbuilder.runtimes.charliecloud import docker_to_directory  # noqa: E402
from envbuilder.runtimes.docker import docker_cli  # noqa: E402


def tree(root: Path) -> list[str]:
    out = subprocess.run(["find", ".", "-printf", "%y %m %u %g %p %l\\n"], cwd=root, capture_output=True,
                         text=True, check=True).stdout
    return sorted(out.splitlines())


def size_mb(root: Path) -> float:
    out = subprocess.run(["du", "-s", "--block-size=1M", str(root)], capture_output=True, text=True, check=True).stdout
    return float(out.split()[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--image", action="append", help="a Docker tag (repeatable)")
    ap.add_argument("--tries", type=int, default=3)
    ap.add_argument("--json", help="write the figures here too")
    a = ap.parse_args()
    docker = docker_cli()
    if shutil.which("ch-convert") is None:
        sys.exit("ch-convert is not installed (apt-get install charliecloud)")
    images = a.image or ["local/debian:bookworm-plain"] + sorted(
        line for line in subprocess.run([docker, "images", "--format", "{{.Repository}}:{{.Tag}}"],
                                        capture_output=True, text=True, check=True).stdout.split()
        if line.startswith("envbuilder/"))
    rows = []
    work = Path(tempfile.mkdtemp(prefix="bench-ch-", dir="/var/tmp"))
    try:
        for image in images:
            times: dict[str, list[float]] = {"ch-convert": [], "envbuilder": []}
            trees = {}
            for i in range(a.tries):
                for way in times:          # alternate, so a busy minute hits both alike
                    dest = work / f"{way}-{i}"
                    t0 = time.monotonic()
                    if way == "ch-convert":
                        subprocess.run(["ch-convert", "-i", "docker", image, str(dest)], check=True,
                                       capture_output=True)
                    else:
                        docker_to_directory(docker, image, dest)
                    times[way].append(time.monotonic() - t0)
                    if i == 0:
                        trees[way] = (tree(dest), size_mb(dest))
                    shutil.rmtree(dest)
            same = trees["ch-convert"][0] == trees["envbuilder"][0]
            row = {"image": image, "size_mb": trees["envbuilder"][1], "same_tree": same,
                   "ch_convert_s": statistics.median(times["ch-convert"]),
                   "envbuilder_s": statistics.median(times["envbuilder"])}
            rows.append(row)
            print(f"  {image}: ch-convert {row['ch_convert_s']:.1f} s, envbuilder {row['envbuilder_s']:.1f} s, "
                  f"same tree: {same}", file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nDocker image -> charliecloud directory, median of {a.tries} tries each, alternating\n")
    print("| image | tree | ch-convert | envbuilder (one stream) | envbuilder / ch-convert | same tree |")
    print("|---|---:|---:|---:|---:|---|")
    for r in rows:
        print(f"| {r['image']} | {r['size_mb']:.0f} MB | {r['ch_convert_s']:.1f} s | {r['envbuilder_s']:.1f} s | "
              f"{r['envbuilder_s'] / r['ch_convert_s']:.2f} | {'yes' if r['same_tree'] else 'NO'} |")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
