"""charliecloud: an unpacked image directory run by ch-run (unprivileged), or, for a .sif, its
SquashFS partition mounted by squashfuse (runtimes/sif.py runs that for verify)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

from .. import safewrite
from ..errors import EXIT_CHECK_FAILED, EnvbuilderError
from ..paths import SUITE_MODULE, VERIFY_MANIFEST
from .base import Launch, Runtime, user_env
from .docker import default_tag, docker_cli, docker_image_id, require_image
from .sif import is_sif

# charliecloud with a .sif (envbuilder build --sif): ch-run cannot read a SIF, but its SquashFS
# partition, mounted read-only at its byte offset (squashfuse), is an image directory. The
# offset comes from the SIF's descriptors (layout: envbuilder/sif/layout.py): the used object
# of data type 0x4004 (partition) whose partition type is 2 (primary system).
SIF_MOUNT = [
    "# A .sif: mount its SquashFS partition on this node for the job's length (squashfuse)",
    "sif_partition_offset() {",
    "    local f=$1 doff total i d",
    '    doff=$(od -An -t d8 -j 96 -N 8 "$f" | tr -d " ")',
    '    total=$(od -An -t d8 -j 88 -N 8 "$f" | tr -d " ")',
    "    for ((i = 0; i < total; i++)); do",
    "        d=$((doff + i * 585))",
    '        if [ "$(od -An -t d4 -j "$d" -N 4 "$f" | tr -d " ")" = 16388 ] &&',
    '           [ "$(od -An -t u1 -j $((d + 4)) -N 1 "$f" | tr -d " ")" = 1 ] &&',
    '           [ "$(od -An -t d4 -j $((d + 205)) -N 4 "$f" | tr -d " ")" = 2 ]; then',
    '            od -An -t d8 -j $((d + 17)) -N 8 "$f" | tr -d " "',
    "            return 0",
    "        fi",
    "    done",
    "    return 1",
    "}",
    "sif_mount=",
    'if [ -f "$IMAGE" ] && [ "$(dd if="$IMAGE" bs=1 skip=32 count=9 2>/dev/null)" = SIF_MAGIC ]; then',
    '    if [ "${SLURM_JOB_NUM_NODES:-1}" -gt 1 ]; then',
    '        die "a .sif under charliecloud is mounted on the first node only: use one node, a directory image (ch-convert) or apptainer"',
    "    fi",
    '    sif_offset=$(sif_partition_offset "$IMAGE") || die "$IMAGE has no primary SquashFS partition (rebuild: envbuilder build SPEC --sif)"',
    '    command -v squashfuse >/dev/null || die "squashfuse is not installed (Debian package squashfuse)"',
    '    sif_mount="$JOB_LOCAL/sif-rootfs"',
    '    mkdir -p "$sif_mount"',
    '    squashfuse -o offset="$sif_offset" "$IMAGE" "$sif_mount" || die "squashfuse cannot mount the partition of $IMAGE"',
    '    note "mounted the SquashFS partition of $IMAGE at $sif_mount"',
    '    IMAGE=$sif_mount',
    "fi",
]


def charliecloud_argv(directory: str, suite: list[str], *, python: str = "python",
                      ch_run: str = "ch-run") -> list[str]:
    # bare --set-env: the image's own environment (PATH to its venv, LANG, ...), as docker has it
    return [ch_run, "--set-env", "--set-env=PYTHONNOUSERSITE=1", directory, "--", python, "-m",
            SUITE_MODULE] + suite


def charliecloud_dir(image: str, cache: Path | None = None) -> tuple[str, bool]:
    """A directory image for ch-run: IMAGE itself when it is one, else unpacked from the Docker
    image (cached by image id; docker_to_directory). Returns (directory, owned_by_us)."""
    if os.path.isdir(image):
        return image, False
    docker = docker_cli()
    require_image(docker, image)
    cache = cache or Path(os.environ.get("ENVBUILDER_CH_CACHE", "/var/tmp/envbuilder-charliecloud"))
    cache.mkdir(parents=True, exist_ok=True)
    ident = docker_image_id(docker, image)[:16] or re.sub(r"[^A-Za-z0-9_.-]", "_", image)
    target = cache / ident
    if is_directory_image(target):
        with contextlib.suppress(OSError):       # another user's cache entry: read it as it is
            os.utime(target)     # its last use: trim_cache keeps the most recently used
        return str(target), True
    if target.exists():          # cut short while it was removed (an interrupted run): convert anew
        remove_directory_image(target)
    tmp = cache / f".{ident}.{uuid.uuid4().hex[:6]}"
    try:
        docker_to_directory(docker, image, tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    os.replace(tmp, target)
    trim_cache(cache, keep=cache_keep(), current=target)
    return str(target), True


CACHE_KEEP_ENV = "ENVBUILDER_CH_CACHE_KEEP"
CACHE_KEEP_DEFAULT = 4          # the suite converts 5-6 images a run; a user verifies a few at a time
IN_USE_S = 3600                 # an image used within this time may be running a job: never removed


def cache_keep() -> int:
    raw = os.environ.get(CACHE_KEEP_ENV, "").strip()
    if not raw:
        return CACHE_KEEP_DEFAULT
    if not raw.isdigit() or int(raw) < 1:
        raise EnvbuilderError(CACHE_KEEP_ENV, f"{CACHE_KEEP_ENV}={raw!r} is not a whole number >= 1",
                              f"set {CACHE_KEEP_ENV} to how many directory images to keep (default "
                              f"{CACHE_KEEP_DEFAULT}), or unset it")
    return int(raw)


def is_directory_image(path: Path) -> bool:
    return all((path / d).is_dir() for d in ("dev", "etc", "opt", "usr"))


def trim_cache(cache: Path, keep: int, current: Path, now: float | None = None) -> list[Path]:
    """Each conversion is a whole image (1-6 GB): keep the KEEP most recently used directory
    images in CACHE, and remove older ones unless used within the hour (a job may be running from
    one). Only entries this module made (16-hex image ids with an image tree) are touched."""
    now = time.time() if now is None else now
    entries = [p for p in cache.iterdir()
               if re.fullmatch(r"[0-9a-f]{16}", p.name) and p.is_dir() and not p.is_symlink() and is_directory_image(p)]
    entries.sort(key=lambda p: p.stat().st_mtime, reverse=True)
    removed = []
    for old in entries[keep:]:
        if old == current or now - old.stat().st_mtime < IN_USE_S:
            continue
        remove_directory_image(old)
        removed.append(old)
    return removed


# What ch-run binds over or needs present in an image directory (as `ch-convert` makes them).
MOUNT_DIRS = ("bin", "dev", "etc", "mnt", "proc", "usr", *(f"mnt/{i}" for i in range(10)))
MOUNT_FILES = ("etc/hosts", "etc/resolv.conf")


def docker_to_directory(docker: str, image: str, dest: Path) -> None:
    """IMAGE's file system unpacked into DEST (made here) as `ch-convert -i docker IMAGE DEST`
    leaves it: /dev empty, the image's environment in /ch/environment (ch-run --set-env reads it),
    every directory writable by its owner, ch-run's mount points present. One stream from
    `docker export` into tar: ch-convert writes the export to a file, gzips it, reads it twice more
    (2-4 times slower for a 1 GB image)."""
    made = subprocess.run([docker, "create", "--read-only", image, "/bin/true"], capture_output=True, text=True,
                          timeout=120)
    if made.returncode != 0:
        raise EnvbuilderError("charliecloud image", f"docker create {image} failed: {made.stderr.strip()[-300:]}",
                              "check the image with `docker image inspect`", exit_code=EXIT_CHECK_FAILED)
    cid = made.stdout.strip()
    dest.mkdir()
    try:
        export = subprocess.Popen([docker, "export", cid], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert export.stdout is not None
        untar = subprocess.run(["tar", "-x", "-p", "-C", str(dest), "-f", "-", "--anchored",
                                "--no-wildcards-match-slash", "--exclude=dev/*", "--exclude=./dev/*",
                                "--exclude=/dev/*"], stdin=export.stdout, capture_output=True, text=True)
        export.stdout.close()
        export_err = export.stderr.read().decode(errors="replace") if export.stderr else ""
        export.wait()
    finally:
        subprocess.run([docker, "rm", cid], capture_output=True, timeout=120)
    if export.returncode != 0 or untar.returncode != 0:
        why = export_err.strip() or untar.stderr.strip()
        raise EnvbuilderError("charliecloud image", f"unpacking {image} into {dest.parent} failed: {why[-400:]}",
                              "check the free space there (df -h), or set ENVBUILDER_CH_CACHE to another folder",
                              exit_code=EXIT_CHECK_FAILED)
    env = subprocess.run([docker, "image", "inspect", image, "--format", "{{range .Config.Env}}{{println .}}{{end}}"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    # the image's own tree: a link in it (ch -> /somewhere) is refused, never followed
    safewrite.write_file(dest / "ch" / "environment", env, option="charliecloud image", inside=dest)
    for folder, dirs, _files in os.walk(dest):
        for d in dirs:
            path = os.path.join(folder, d)
            mode = os.lstat(path).st_mode
            if not os.path.islink(path) and mode & 0o700 != 0o700:
                os.chmod(path, mode | 0o700)
    for rel in MOUNT_DIRS:
        if not os.path.lexists(dest / rel):
            (dest / rel).mkdir()
    for rel in MOUNT_FILES:
        if not os.path.lexists(dest / rel):
            safewrite.write_file(dest / rel, b"", option="charliecloud image", replace="never", inside=dest)


def remove_directory_image(path: Path) -> None:
    """Remove a converted directory image so that no reader ever sees half of it: renamed away
    first (one atomic step), then deleted."""
    trash = path.parent / f".removed-{path.name}.{uuid.uuid4().hex[:6]}"
    try:
        os.replace(path, trash)
    except OSError:
        return
    shutil.rmtree(trash, ignore_errors=True)


def require_ch_run() -> None:
    if not shutil.which("ch-run"):
        raise EnvbuilderError("--runtime charliecloud", "ch-run is not on PATH",
                              "install charliecloud (apt-get install charliecloud)")


class Charliecloud(Runtime):
    name = "charliecloud"
    in_job = True
    in_verify = True
    hint = "convert it with: ch-convert -i docker envbuilder/NAME:TAG DIR"
    image_fallback_suffix = ".sif"   # the folder's <name>.sif (build --sif) when there is no <name>/ directory

    def default_image(self, manifest, folder, cwd):
        from .docker import built_tag

        return built_tag(folder) or default_tag(manifest)        # converted from the docker image

    def command(self, t, opts, suite, ch_directory: str | None = None, ch_manifest: bool = False):
        # ch-run binds nothing by default: the folder's manifest is copied into the directory
        # image verify converted (a user's own directory keeps its manifest)
        return charliecloud_argv(ch_directory or t.image, suite(VERIFY_MANIFEST if ch_manifest else None),
                                 python=opts.python or "python"), user_env()

    @contextmanager
    def session(self, t, opts, suite):
        require_ch_run()
        directory, owned = charliecloud_dir(t.image)
        if owned and t.manifest_path:
            dst = Path(directory) / VERIFY_MANIFEST.lstrip("/")
            safewrite.write_file(dst, Path(t.manifest_path).read_bytes(), option="verify", inside=directory)
        argv, env = self.command(t, opts, suite, ch_directory=directory,
                                 ch_manifest=bool(owned and t.manifest_path))
        yield Launch(argv, env)

    def slurm_env(self, t, image, opts, env):
        if is_sif(image):        # the job mounts the SIF's SquashFS partition itself
            t.image = str(Path(image).resolve())
        else:
            t.image, _owned = charliecloud_dir(image or default_tag(t.manifest))
        env["ENVBUILDER_IMAGE"] = t.image

    def job_bind_args(self):
        return SIF_MOUNT + [
            "# ch-run binds only onto folders that exist in the image: make missing mount points",
            "# in a directory image (it belongs to you), or stop with the folder's name (F7);",
            "# ch-run shares the host's /tmp, so a SIF needs no bind for a same-path folder there",
            'for b in "${binds[@]}"; do',
            '    rest=${b#*:}; dst=${rest%%:*}',
            '    case $dst in /tmp/*) if [ -n "$sif_mount" ] && [ "$dst" = "${b%%:*}" ]; then continue; fi ;; esac',
            '    if [ ! -e "$IMAGE$dst" ]; then',
            '        if [ ! -d "$IMAGE" ] || ! mkdir -p "$IMAGE$dst" 2>/dev/null; then',
            '            die "bind destination \'$dst\' does not exist in the image $IMAGE (charliecloud cannot create it)"',
            "        fi",
            '        note "made mount point $dst in the image $IMAGE"',
            "    fi",
            '    case $rest in *:ro) note "charliecloud binds read-write: $b";; esac',
            '    runtime_args+=(-b "${b%:ro}")',
            "done",
        ]

    def job_launch(self, gpu):
        return [
            'if [ -n "$sif_mount" ]; then',
            "    # a SIF is entered as `apptainer exec` enters it: its /.singularity.d/env scripts set",
            "    # the image's environment (it has no /ch/environment for --set-env); sourced by bash,",
            "    # not actions/exec's /bin/sh, which would drop the exported rank_main function",
            "    # shellcheck disable=SC2016  # expanded inside the image, not here",
            '    launch=(ch-run "${runtime_args[@]}" "$IMAGE" -- bash -c \'for s in /.singularity.d/env/*.sh; do . "$s"; done; exec "$@"\' sif-env)',
            "else",
            "    # --set-env: the image's own environment (PATH, its venv); the job's exports pass through",
            '    launch=(ch-run --set-env "${runtime_args[@]}" "$IMAGE" --)',
            "fi",
        ]

    def job_cleanup(self):
        return ['    if [ -n "${sif_mount:-}" ]; then',
                '        fusermount3 -u "$sif_mount" 2>/dev/null || fusermount -u "$sif_mount" 2>/dev/null || true',
                "    fi"]
