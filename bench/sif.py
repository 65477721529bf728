"""A local Docker image made into a SIF, two ways, side by side in one run: envbuilder's writer
(`envbuilder sif FOLDER --image TAG`: one tar stream from the saved image into tar2sqfs, then
siftool; envbuilder/sif/build.py) and Apptainer's `apptainer build x.sif docker-daemon://TAG`
(run unprivileged through tools/apptainer-node, as the tests run it). Per image and way: wall
seconds of the command, its CPU seconds (user + system of the command and its children: what
other load on shared cores cannot move much), the SIF's bytes, and what its SquashFS partition
says of itself (inodes, block size, gzip level); then the ratios envbuilder / Apptainer. Each SIF
is then started once with `apptainer exec SIF true` (the writer's SIF must stay one Apptainer runs).

    python bench/sif.py --image envbuilder/cpu-torch-horovod:TAG [--image ...] [--json FILE]

One build at a time, envbuilder's first; Apptainer's gets `--disable-cache` (no layer cache from
an earlier run) and a temporary folder of its own. Everything is written under --workdir (default
a fresh folder under /var/tmp) and removed at the end unless --keep.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from envbuilder.sif import layout  # noqa: E402

NODE = REPO / "tools" / "apptainer-node"
NODE_UID = 1000                        # tools/apptainer-node's user `builder` writes the folder
SQUASHFS_MAGIC = 0x73717368
GZIP = 1                               # compression id (squashfs_fs.h: ZLIB_COMPRESSION)
COMP_OPTIONS = 0x0400                  # super block flag: compressor options follow it
GZIP_DEFAULT_LEVEL = 9                 # no options stored: mksquashfs's and tar2sqfs's default


def squashfs_facts(sif: Path) -> dict:
    """Inodes, block size and gzip level of the SIF's primary partition."""
    _header, descriptors = layout.read(sif)
    part = layout.primary_partition(descriptors)
    if part is None:
        return {}
    with open(sif, "rb") as fh:
        fh.seek(part.offset)
        return super_block_facts(fh.read(96 + 2 + 8))


def super_block_facts(raw: bytes) -> dict:
    """The same from the first bytes of a SquashFS (its 96-byte super block and what follows)."""
    magic, inodes, _mtime, block_size, _frags, comp, _log, flags = struct.unpack_from("<IIIIIHHH", raw)
    if magic != SQUASHFS_MAGIC:
        return {}
    facts = {"inodes": inodes, "block_size": block_size, "compressor": "gzip" if comp == GZIP else f"id {comp}"}
    if comp == GZIP:
        level = GZIP_DEFAULT_LEVEL
        if flags & COMP_OPTIONS:
            # one uncompressed metadata block after the super block: a 16-bit length (bit 15
            # set: stored as is), then gzip's options, the level first as a 32-bit number
            (length,) = struct.unpack_from("<H", raw, 96)
            if length & 0x8000:
                (level,) = struct.unpack_from("<I", raw, 98)
        facts["level"] = level
    return facts


def children_cpu() -> float:
    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    return use.ru_utime + use.ru_stime


def ours(image: str, folder: Path) -> dict:
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text(json.dumps({"name": "ours", "expect": {}}))
    cpu0, t0 = children_cpu(), time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "envbuilder", "sif", str(folder), "--image", image, "--json"],
                          cwd=REPO, capture_output=True, text=True)
    seconds, cpu = time.monotonic() - t0, children_cpu() - cpu0
    if proc.returncode != 0:
        sys.exit(f"envbuilder sif failed for {image}:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    sif = folder / "ours.sif"
    return {"seconds": seconds, "cpu_s": cpu, "bytes": sif.stat().st_size, "sif": str(sif)}


def apptainers(image: str, folder: Path) -> dict:
    """`apptainer build` in the Apptainer container; bash's `time` there gives the command's own
    wall and CPU seconds (the container's start is not counted; it is not Apptainer's)."""
    folder.mkdir(parents=True)
    (folder / "tmp").mkdir()
    for path in (folder, folder / "tmp"):
        if os.geteuid() == 0:
            os.chown(path, NODE_UID, NODE_UID)
        else:
            path.chmod(0o777)
    script = ("export APPTAINER_TMPDIR=\"$1/tmp\"; TIMEFORMAT='%R %U %S'; "
              "{ time apptainer build --disable-cache \"$1/apptainer.sif\" \"docker-daemon://$2\" "
              ">\"$1/build.log\" 2>&1; } 2>\"$1/time.txt\"")
    proc = subprocess.run([str(NODE), "-v", str(folder), "--", "bash", "-c", script, "bash", str(folder), image],
                          capture_output=True, text=True)
    sif = folder / "apptainer.sif"
    if proc.returncode != 0 or not sif.exists():
        log = (folder / "build.log").read_text()[-2000:] if (folder / "build.log").exists() else ""
        sys.exit(f"apptainer build failed for {image}:\n{proc.stderr[-2000:]}{log}")
    wall, user, system = (float(x) for x in (folder / "time.txt").read_text().split()[-3:])
    return {"seconds": wall, "cpu_s": user + system, "bytes": sif.stat().st_size, "sif": str(sif)}


def runs(sif: str) -> bool:
    folder = str(Path(sif).parent)
    proc = subprocess.run([str(NODE), "-v", folder, "--", "apptainer", "exec", sif, "true"],
                          capture_output=True, text=True)
    return proc.returncode == 0


def load() -> float:
    return os.getloadavg()[0]


def table(rows: list[dict]) -> list[str]:
    """One row per image: each way's seconds, CPU seconds and MB, and envbuilder / Apptainer."""
    lines = ["| image | image MB | way | seconds | CPU s | SIF MB | inodes | block | gzip level | runs |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        for way, label in (("envbuilder", "envbuilder `sif`"), ("apptainer", "`apptainer build`")):
            w = r[way]
            block = f"{w['block_size'] >> 10} KiB" if w.get("block_size") else "?"
            lines.append(f"| {r['image']} | {r['image_bytes'] / 1e6:.0f} | {label} | {w['seconds']:.1f} | "
                         f"{w['cpu_s']:.1f} | {w['bytes'] / 1e6:.1f} | {w.get('inodes', '?')} | {block} | "
                         f"{w.get('level', '?')} | {'yes' if w.get('runs') else 'NO'} |")
        o, a = r["envbuilder"], r["apptainer"]
        lines.append(f"| {r['image']} | | **envbuilder / Apptainer** | **{o['seconds'] / a['seconds']:.2f}** | "
                     f"**{o['cpu_s'] / a['cpu_s']:.2f}** | **{o['bytes'] / a['bytes']:.3f}** | | | | |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--image", action="append", required=True, help="a local Docker tag (repeatable)")
    ap.add_argument("--workdir", help="where the SIFs are written (default: a new folder under /var/tmp)")
    ap.add_argument("--keep", action="store_true", help="keep the SIFs and logs")
    ap.add_argument("--json", help="write every figure here too")
    a = ap.parse_args()
    if not NODE.exists() or shutil.which("docker") is None:
        sys.exit("needs Docker and tools/apptainer-node's image (bash .ci/install-apptainer.sh)")
    work = Path(a.workdir or tempfile.mkdtemp(prefix="bench-sif-", dir="/var/tmp"))
    work.mkdir(parents=True, exist_ok=True)
    work.chmod(0o755)
    rows = []
    try:
        for n, image in enumerate(a.image):
            size = subprocess.run(["docker", "image", "inspect", "--format", "{{.Size}}", image],
                                  capture_output=True, text=True, check=True).stdout.strip()
            row: dict = {"image": image, "image_bytes": int(size), "load_before": load()}
            for way, make in (("envbuilder", ours), ("apptainer", apptainers)):
                figures = make(image, work / f"{n}-{way}")
                figures.update(squashfs_facts(Path(figures["sif"])))
                figures["runs"] = runs(figures["sif"])
                row[way] = figures
                print(f"  {image}: {way} {figures['seconds']:.1f} s, {figures['bytes'] / 1e6:.1f} MB",
                      file=sys.stderr)
            row["load_after"] = load()
            rows.append(row)
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    print("\nDocker image -> SIF, envbuilder's writer and Apptainer's build, one run each, one after the other\n")
    print("\n".join(table(rows)))
    print("\nload average (1 min) before / after: "
          + ", ".join(f"{r['load_before']:.1f} / {r['load_after']:.1f}" for r in rows))
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
