"""`envbuilder sif --archive FILE`: wall time and peak disk use, as root and as a plain user.

The archive is a `docker save` or OCI image archive (e.g. `docker save -o deb.tar
local/debian:bookworm-slim`). Each run writes into a fresh output folder under /tmp; a sampler adds up
the blocks of everything in that folder but manifest.json (the hidden work folder: decompressed
layers, the SquashFS; then the SIF being assembled) every 20 ms and keeps the peak. It prints a
table: who ran it, wall seconds (best of --runs), peak disk, the SIF's size and the archive's.

    python bench/sif_unpack.py deb.tar                       # as the current user
    python bench/sif_unpack.py deb.tar --user envb-sif       # and as that user (needs root)
    python bench/sif_unpack.py deb.tar --user envb-sif --json sif.json

A plain user runs its own interpreter with envbuilder's dependencies (`--user-python`; default the
venv the tests make for that user, /tmp/envb-USER-venv, else the system python3) with this checkout
on PYTHONPATH; the archive must be readable by that user.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def disk_use(folder: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(folder):
        for name in files:
            if name == "manifest.json" and dirpath == str(folder):
                continue
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
            except OSError:
                pass                           # removed while we looked
    return total


def one_run(archive: Path, user: str | None, user_python: str | None = None) -> dict:
    base = Path(tempfile.mkdtemp(prefix="envb-sif-bench-", dir="/tmp"))
    try:
        os.chmod(base, 0o755)
        out = base / "out"
        out.mkdir()
        (out / "manifest.json").write_text(json.dumps({"name": "bench", "expect": {}}))
        if user:
            entry = pwd.getpwnam(user)
            os.chown(out, entry.pw_uid, entry.pw_gid)
            venv = Path(f"/tmp/envb-{user}-venv/bin/python")
            python = user_python or (str(venv) if venv.exists() else shutil.which("python3", path="/usr/bin:/bin"))
            cmd = ["runuser", "-u", user, "--", python or "python3"]
            env = {"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "HOME": "/tmp"}
        else:
            cmd, env = [sys.executable], dict(os.environ)
        env.update(PYTHONPATH=str(REPO), PYTHONDONTWRITEBYTECODE="1")
        peak, done = [0], threading.Event()

        def sample():
            while not done.is_set():
                peak[0] = max(peak[0], disk_use(out))
                time.sleep(0.02)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        t0 = time.monotonic()
        proc = subprocess.run(cmd + ["-m", "envbuilder", "sif", str(out), "--archive", str(archive)],
                              capture_output=True, text=True, env=env, cwd="/tmp")
        wall = time.monotonic() - t0
        done.set()
        sampler.join()
        if proc.returncode != 0:
            sys.exit(f"envbuilder sif as {user or 'the current user'} failed:\n{proc.stderr[-2000:]}")
        sif = out / "bench.sif"
        return {"wall_s": round(wall, 2), "peak_disk_bytes": peak[0], "sif_bytes": sif.stat().st_size}
    finally:
        shutil.rmtree(base, ignore_errors=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("archive", type=Path, help="`docker save` or OCI image archive")
    p.add_argument("--user", help="also run as this (non-root) user")
    p.add_argument("--user-python", help="that user's interpreter with envbuilder's dependencies")
    p.add_argument("--runs", type=int, default=3, help="runs per user; the best wall time is kept (3)")
    p.add_argument("--json", type=Path, help="also write the rows here")
    args = p.parse_args(argv)
    archive = args.archive.resolve()
    whoami = pwd.getpwuid(os.geteuid()).pw_name
    rows = []
    for user in [None] + ([args.user] if args.user else []):
        runs = [one_run(archive, user) for _ in range(args.runs)]
        best = min(runs, key=lambda r: r["wall_s"])
        rows.append({"user": user or whoami, "uid": pwd.getpwnam(user).pw_uid if user else os.geteuid(),
                     "wall_s": best["wall_s"], "peak_disk_bytes": max(r["peak_disk_bytes"] for r in runs),
                     "sif_bytes": best["sif_bytes"], "archive_bytes": archive.stat().st_size})
    print(f"envbuilder sif --archive {archive.name} ({archive.stat().st_size / 1e6:.1f} MB), "
          f"best of {args.runs}, {os.cpu_count()} cores")
    print(f"{'user':<12} {'uid':>6} {'wall s':>8} {'peak disk MB':>13} {'SIF MB':>8}")
    for r in rows:
        print(f"{r['user']:<12} {r['uid']:>6} {r['wall_s']:>8.2f} {r['peak_disk_bytes'] / 1e6:>13.1f} "
              f"{r['sif_bytes'] / 1e6:>8.1f}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
