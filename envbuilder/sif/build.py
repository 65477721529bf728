"""`envbuilder build SPEC --sif` (or `targets: [sif]`): after the image is built, write
`<folder>/<name>.sif` from it, the way `apptainer build x.sif docker-daemon://TAG` would:

    1. the image's layers -> one tree in memory (rootfs.py, layers.py: headers only, nothing
       extracted), /.singularity.d added to it (metadata.py)
    2. that tree as one tar stream -> tar2sqfs -> the SquashFS, owners as in the image, every
       time fixed (Apptainer: assemblers/sif.go, gzip); no root needed
    3. siftool new/add -> the SIF: Def.FILE, JSON.Labels, JSON.Generic (envbuilder manifest,
       oci-config.json), SBOM (CycloneDX), FS (SquashFS, *System, the image's arch); group 1
    4. the header's launch script, UUID and times fixed (layout.py), then renamed into place

Bit-identical for one lock: all times come from SOURCE_DATE_EPOCH when set, else from the lock's
resolution time (`manifest.lock.resolved_at`), else 0. Work happens in a hidden folder inside the
output folder; a failure removes it and leaves no .sif behind (an existing one is kept).
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from .. import __version__, safewrite
from ..errors import CheckFailed, EnvbuilderError
from ..paths import MANIFEST_IN_IMAGE, SMOKE_DIR
from . import layers, layout, metadata, rootfs

SUITE_MODULE = SMOKE_DIR
IMAGE_MANIFEST = MANIFEST_IN_IMAGE
TOOLS = {"tar2sqfs": "squashfs-tools-ng", "siftool": "siftool"}
ROOM_FACTOR = 2.0        # the saved archive and the SquashFS, side by side
FILE_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")     # a plain file name


# The SquashFS's compression. Apptainer (1.4.5, internal/pkg/build/assemblers/sif.go) runs
# `mksquashfs ROOTFS DEST -noappend -all-root` and so gets mksquashfs's defaults: gzip level 9,
# 128 KiB blocks (`mksquashfs -help`: "-Xcompression-level ... (default 9)"; `unsquashfs -s` of
# its SIF's partition shows gzip, block size 131072 and no compressor options, i.e. the default).
# Measured with tar2sqfs on the cpu-torch-horovod image's tree (1.21 GB of files; docs/benchmarks.md):
#   level 1, 128 KiB: 407.0 MB, 15 s CPU (what envbuilder wrote before: 13 % over Apptainer's 360.2)
#   level 6, 128 KiB: 362.6 MB, 46 s     level 9, 128 KiB: 360.1 MB, 140 s
#   level 6, 256 KiB: 358.8 MB, 46 s     <- this: smaller than Apptainer's at a third of level 9's CPU
# Both SIFs hold the same files (35,339 inodes, 1,207.9 MB); the whole gap was the level. A
# 256 KiB block lets deflate find matches over twice the data before it starts again; a read
# decompresses at most one block, so random reads cost a little more (the kernel and squashfuse
# read blocks up to 1 MiB).
GZIP_LEVEL = 6
BLOCK_SIZE = 256 << 10


def jobs() -> int:
    """Compressor threads: the CPUs this process may use, as mksquashfs (Apptainer's) takes them
    all. tar2sqfs writes the blocks in order whatever the thread count (measured: -j 1 and -j 2
    gave the same sha256 for the 359 MB SquashFS above), so the SIF stays bit-identical."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:                         # not Linux
        return max(1, os.cpu_count() or 1)


def require_tools(names=("tar2sqfs", "siftool")) -> dict[str, str]:
    found = {}
    for name in names:
        path = shutil.which(name)
        if not path:
            raise CheckFailed("sif", f"{name} is not installed (Debian package {TOOLS[name]})",
                              f"apt-get install {TOOLS[name]}  (or run .ci/install-system.sh)")
        found[name] = path
    return found


def source_date_epoch(manifest: dict) -> int:
    env = os.environ.get("SOURCE_DATE_EPOCH")
    if env:
        if not env.strip().isdigit():
            raise EnvbuilderError("SOURCE_DATE_EPOCH", f"{env!r} is not a number of seconds",
                                  "set it to a Unix time, e.g. SOURCE_DATE_EPOCH=$(git log -1 --format=%ct)")
        return int(env)
    resolved = ((manifest.get("lock") or {}).get("resolved_at")) or ""
    try:
        return int(datetime.strptime(resolved, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp())
    except ValueError:
        return 0


def cyclonedx(manifest: dict) -> bytes:
    """A small SBOM from what the lock pinned (Python and OS packages); no scanner needed."""
    expect = manifest.get("expect") or {}
    comps = [{"type": "library", "name": n, "version": v, "purl": f"pkg:pypi/{n}@{v}"}
             for n, v in sorted((expect.get("packages") or {}).items())]
    comps += [{"type": "library", "name": n, "version": v, "purl": f"pkg:deb/debian/{n}@{v}"}
              for n, v in sorted((expect.get("apt") or {}).items())]
    doc = {"bomFormat": "CycloneDX", "specVersion": "1.5", "version": 1,
           "metadata": {"component": {"type": "container", "name": manifest.get("name", "image")},
                        "tools": [{"name": "envbuilder", "version": __version__}]},
           "components": comps}
    return (json.dumps(doc, indent=2) + "\n").encode()


def _run(cmd: list[str], step: str) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        err = (proc.stderr or proc.stdout).strip()
        if "No space left" in err:
            raise _no_room(Path(cmd[-1]).parent, step)
        raise CheckFailed(f"sif: {step}", f"`{' '.join(cmd[:3])} ...` failed (exit {proc.returncode}): "
                          + err[-600:], "see the message above")


def _no_room(where: Path, step: str) -> CheckFailed:
    return CheckFailed(f"sif: {step}", f"no room left on the device under {where}",
                       "free disk space there, or write the folder elsewhere with --out DIR")


def _image_size(docker: str, tag: str) -> int:
    proc = subprocess.run([docker, "image", "inspect", "--format", "{{.Size}}", tag],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise rootfs.broken(f"image {tag} is not in the Docker engine ({proc.stderr.strip()[-200:]})",
                            "build it first: envbuilder build SPEC (without --no-build)")
    return int(proc.stdout.strip() or 0)


def check_room(folder: Path, need: int) -> None:
    free = shutil.disk_usage(folder).free
    if free < need:
        raise CheckFailed("sif", f"no room: {free / 1e9:.1f} GB free under {folder}, making the SIF needs "
                          f"about {need / 1e9:.1f} GB", "free disk space there, or use --out DIR elsewhere")


def squashfs(tar2sqfs: str, tree: layers.Tree, layer_file, dest: Path, epoch: int) -> None:
    """TREE -> DEST through tar2sqfs (squashfs-tools-ng), fed one tar stream on its stdin.
    gzip, as Apptainer's SIFs (readable by every kernel and squashfuse); level and block size as
    GZIP_LEVEL and BLOCK_SIZE say; compressor jobs: JOBS. Every time is EPOCH (the stream's and
    --defaults' mtime, which is also the super block's), owners and modes from the stream, xattrs
    dropped (as mksquashfs -no-xattrs did); --no-skip: a record tar2sqfs cannot read is an error,
    not a missing file."""
    cmd = [tar2sqfs, "--quiet", "--no-skip", "--no-xattr", "--compressor", "gzip",
           "--comp-extra", f"level={GZIP_LEVEL}", "--block-size", str(BLOCK_SIZE),
           "--num-jobs", str(jobs()), "--defaults", f"uid=0,gid=0,mode=0755,mtime={epoch}", str(dest)]
    errfile = tempfile.TemporaryFile()
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=errfile)
    try:
        try:
            layers.emit(tree, proc.stdin, layer_file, epoch)
            proc.stdin.close()
        except BrokenPipeError:
            pass                                   # tar2sqfs stopped: its message follows
        code = proc.wait()
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    finally:
        if proc.stdin and not proc.stdin.closed:
            try:
                proc.stdin.close()
            except BrokenPipeError:
                pass
    errfile.seek(0)
    err = errfile.read().decode("utf-8", "replace").strip()
    errfile.close()
    if code != 0:
        if "No space left" in err:
            raise _no_room(dest.parent, "tar2sqfs")
        raise CheckFailed("sif: tar2sqfs", f"tar2sqfs failed (exit {code}): " + (err[-600:] or "no message"),
                          "see the message above")


def assemble(siftool: str, dest: Path, *, deffile: bytes, labels: dict, manifest: dict,
             oci_config: dict, sbom: bytes, partition: Path, arch: str, work: Path) -> None:
    """siftool new + add, in Apptainer's order (definition, metadata, then the partition)."""
    if arch not in layout.PART_ARCH:
        raise rootfs.broken(f"the image's architecture {arch!r} has no SIF partition type",
                            "build for one of " + ", ".join(layout.PART_ARCH))
    _run([siftool, "new", str(dest)], "siftool new")
    objects = [("1", "definition", deffile, []),
               ("3", "labels.json", (json.dumps(labels, indent="\t")).encode(), []),
               ("6", "envbuilder-manifest.json", (json.dumps(manifest, indent=2) + "\n").encode(), []),
               ("6", "oci-config.json", json.dumps(oci_config, sort_keys=True).encode(), []),
               ("9", "sbom.cdx.json", sbom, ["--sbomformat", "cyclonedx-json"])]
    for datatype, name, data, extra in objects:
        path = work / name
        path.write_bytes(data)
        _run([siftool, "add", "--datatype", datatype, "--groupid", "1", "--filename", name, *extra,
              str(dest), str(path)], f"siftool add {name}")
    _run([siftool, "add", "--datatype", "4", "--parttype", str(layout.PART_PRIMSYS), "--partfs",
          str(layout.FS_SQUASH), "--partarch", str(layout.PART_ARCH[arch]), "--groupid", "1",
          "--filename", "rootfs.squashfs", str(dest), str(partition)], "siftool add rootfs")


def sif_name(manifest: dict) -> str:
    """The manifest's `name`, which becomes a file name: a plain one (no folder, no /)."""
    name = manifest.get("name") or "image"
    if not isinstance(name, str) or not FILE_NAME_RE.fullmatch(name) or name in (".", ".."):
        raise EnvbuilderError("manifest.json: name", f"{str(name)[:80]!r} is not a plain file name",
                              "use letters, digits, '.', '_' or '-' (as `envbuilder build` writes it)")
    return name


def make_sif(folder: Path, tag: str, *, docker: str = "docker", archive: Path | None = None,
             quiet: bool = False, max_unpacked: int = layers.DEFAULT_MAX_UNPACKED) -> dict:
    """Write FOLDER/<name>.sif from the Docker image TAG (or an OCI/docker ARCHIVE)."""
    tools = require_tools()
    folder = Path(folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    if not isinstance(manifest, dict):
        raise EnvbuilderError("manifest.json", "is not a JSON object", "rebuild the folder: envbuilder build SPEC")
    name = sif_name(manifest)
    epoch = source_date_epoch(manifest)
    dest = folder / f"{name}.sif"
    safewrite.precheck(dest, option="sif", inside=folder)
    if archive is None:
        check_room(folder, int(_image_size(docker, tag) * ROOM_FACTOR))
    else:
        metadata.definition("oci-archive", archive.name)       # a name that cannot go in Def.FILE
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix=f".{name}.sif-work.", dir=folder))
    tmp_sif = work / f"{name}.sif"        # in the folder only this process writes; safewrite.place moves it
    try:
        from_engine = archive is None
        if from_engine:
            archive = work / "image.tar"
            rootfs.save_docker_image(docker, tag, archive)
        with rootfs.Layers(archive, work, max_unpacked) as image:
            tree, config = image.flatten()
            # the SquashFS is never bigger than what it holds (plus its tables)
            check_room(folder, layers.total_size(tree) + (8 << 20))
            # the source as Apptainer names it: docker-daemon:TAG, or the archive's format and file
            bootstrap, source = ("docker-daemon", tag) if from_engine else (config.archive_format, archive.name)
            deffile = metadata.definition(bootstrap, source)
            label_map = metadata.labels(config, bootstrap, source, epoch,
                                        f"envbuilder {__version__} (siftool, tar2sqfs)")
            metadata.insert(tree, config, deffile=deffile, label_map=label_map, suite_module=SUITE_MODULE,
                            manifest=IMAGE_MANIFEST)
            part = work / "rootfs.squashfs"
            squashfs(tools["tar2sqfs"], tree, image.layer, part, epoch)
        del tree
        if from_engine:
            archive.unlink()
        assemble(tools["siftool"], tmp_sif, deffile=deffile, labels=label_map,
                 manifest=manifest, oci_config=config.raw, sbom=cyclonedx(manifest), partition=part,
                 arch=config.architecture, work=work)
        layout.make_deterministic(tmp_sif, launch=layout.LAUNCH)
        with open(tmp_sif, "rb+") as fh:
            os.fsync(fh.fileno())
        os.chmod(tmp_sif, 0o755)            # Apptainer's SIFs are executable (the launch line)
        safewrite.place(tmp_sif, dest, option="sif", inside=folder)
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise _no_room(folder, "writing the SIF") from None
        raise CheckFailed("sif", f"{exc.strerror or exc}: {exc.filename or ''}", "see the message") from None
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if tmp_sif.exists():
            tmp_sif.unlink()
    seconds = time.monotonic() - started
    info = {"sif": str(dest), "bytes": dest.stat().st_size, "source_date_epoch": epoch,
            "seconds": round(seconds, 1)}
    if not quiet:
        print(f"wrote {dest} ({info['bytes'] / 1e6:.0f} MB) in {seconds:.0f} s")
    return info
