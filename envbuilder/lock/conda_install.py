"""Install exactly the locked conda packages into a prefix, offline (run in the image's devel stage
by envbuilder's conda step, with py-rattler from PyPI on PYTHONPATH; shipped as pins/conda-install.py).

    python conda-install.py PACKAGES_JSON PKGS_DIR PREFIX WORK_DIR

PACKAGES_JSON (pins/conda-packages.json) lists the lock's packages: name, version, file, subdir,
sha256. Each file in PKGS_DIR is checked against its sha256 first (nothing is installed when one
differs); the files are then indexed as a local channel in WORK_DIR (rattler's own indexer), the
locked records taken from that index by file name (their sha256 checked once more) and installed
with rattler.install: no solve, no network. PREFIX/conda-meta/ then holds one record per package.
Reads only data (JSON, package archives); stdlib + py-rattler.
"""

import asyncio
import hashlib
import json
import os
import shutil
import sys


def fail(msg):
    sys.stderr.write(f"conda-install: {msg}\n")
    return 1


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main(argv):
    listing, pkgs, prefix, work = argv[1:5]
    with open(listing, encoding="utf-8") as fh:
        wanted = json.load(fh)
    channel = os.path.join(work, "channel")
    for p in wanted:
        path = os.path.join(pkgs, p["file"])
        if not os.path.isfile(path):
            return fail("conda: {} {}: {} is missing from the build context; fix: build with envbuilder build "
                        "(it fetches the locked packages into conda-pkgs/)".format(p["name"], p["version"], p["file"]))
        got = sha256(path)
        if got != p["sha256"]:
            return fail("conda: {} {}: {} has sha256 {}, the lock has {}; fix: delete conda-pkgs/ and build "
                        "again with envbuilder build".format(p["name"], p["version"], p["file"], got, p["sha256"]))
        os.makedirs(os.path.join(channel, p["subdir"]), exist_ok=True)
        shutil.copyfile(path, os.path.join(channel, p["subdir"], p["file"]))
    import rattler
    from rattler.index.index import index_fs

    subdirs = sorted({p["subdir"] for p in wanted} | {"noarch"})
    for subdir in subdirs:
        os.makedirs(os.path.join(channel, subdir), exist_ok=True)
    asyncio.run(index_fs(channel))
    source = rattler.Channel("file://" + channel)
    by_file = {}
    for subdir in subdirs:
        repodata = os.path.join(channel, subdir, "repodata.json")
        if os.path.isfile(repodata):
            for rec in rattler.RepoData.from_path(repodata).into_repo_data(source):
                by_file[rec.file_name] = rec
    records = []
    for p in wanted:
        rec = by_file.get(p["file"])
        if rec is None or rec.sha256 is None or rec.sha256.hex() != p["sha256"]:
            return fail("conda: {} {}: not indexed as locked ({})".format(p["name"], p["version"], p["file"]))
        records.append(rec)
    asyncio.run(rattler.install(records, target_prefix=prefix, cache_dir=os.path.join(work, "cache"),
                                show_progress=False))
    meta = os.path.join(prefix, "conda-meta")
    for rec in records:
        record = os.path.join(meta, f"{rec.name.normalized}-{rec.version}-{rec.build}.json")
        if not os.path.isfile(record):
            return fail(f"conda: {rec.name.normalized}: no {record} after the install")
    names = ", ".join(f"{r.name.normalized}={r.version}" for r in records)
    print(f"conda-install: {len(records)} packages installed into {prefix} (conda-meta/ records each): {names}")
    return 0


if __name__ == "__main__":
    # py-rattler 0.28's runtime threads can crash the interpreter as it exits (SIGSEGV or abort,
    # seen here in about one run of six after a complete install): leave without finalizing
    code = main(sys.argv)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
