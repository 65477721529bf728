"""Which MPI each rank really runs: ``mpi.library``.

Every task of the srun step loads the MPI library the way the image's MPI code does (by soname,
through the dynamic loader and LD_LIBRARY_PATH, so a site MPI bound in front of the image's own
wins exactly as it would for Horovod or mpi4py), asks it MPI_Get_library_version (callable
before MPI_Init, so no second PMI/PMIx client starts in the step) and reads the path of the
libmpi mapped into its own process from /proc/self/maps. Each writes ``mpi-<rank>.json`` in the
step's shared folder; rank 0 merges them into one check with the library per node, and fails,
naming node and rank, when ranks disagree, when the job names a site MPI
(ENVBUILDER_SITE_MPI_DIR, set by job.sbatch) and a rank loaded the image's own, or the reverse.

Standard library only (mpi4py when the image has it); imports nothing else of envbuilder.
"""

import ctypes
import json
import os
import socket
import time

from .common import FAIL, PASS, result, write_json_atomic
from .static import library_version_text, loaded_libraries, parse_mpi_text

SITE_ENV = "ENVBUILDER_SITE_MPI_DIR"      # job.sbatch: the site MPI's library folder in the container
SONAMES = ("libmpi.so.12", "libmpi.so.40", "libmpi_abi.so.1", "libmpi.so")


def _via_mpi4py():
    try:
        import mpi4py
        mpi4py.rc.initialize = False     # no MPI_Init: the version call needs none
        mpi4py.rc.finalize = False
        from mpi4py import MPI
        return MPI.Get_library_version(), "mpi4py"
    except Exception:  # noqa: BLE001 - no mpi4py, or one that cannot load
        return None, None


def _via_ctypes(expect_mpi):
    names = []
    lib = (expect_mpi or {}).get("library")
    if lib:
        names.append(os.path.basename(lib))
    names += [n for n in SONAMES if n not in names]
    for name in names:
        text = library_version_text(name, mode=ctypes.RTLD_GLOBAL)
        if text is not None:
            return text, "ctypes " + name
    return None, None


def mapped_libmpi():
    """The path of the libmpi (libmpi.so.*, libmpi_abi.so.*) mapped into this process, or None."""
    paths = loaded_libraries(r"^libmpi(_abi)?\.so")
    return os.path.realpath(paths[0]) if paths else None


def probe(expect_mpi, rank, host=None):
    """This process's MPI: {rank, host, text, flavor, version, path, via}."""
    text, via = _via_mpi4py()
    if text is None:
        text, via = _via_ctypes(expect_mpi)
    flavor, version = parse_mpi_text(text or "")
    return {"rank": rank, "host": host or socket.gethostname(), "flavor": flavor, "version": version,
            "text": (text or "").strip().splitlines()[0][:200] if text else "",
            "path": mapped_libmpi(), "via": via}


def record_file(workdir, rank):
    return os.path.join(workdir, "mpi-%d.json" % rank)


def write_record(workdir, rank, expect_mpi):
    os.makedirs(workdir, exist_ok=True)
    rec = probe(expect_mpi, rank)
    write_json_atomic(record_file(workdir, rank), rec)
    return rec


def collect(workdir, size, wait_s=60.0):
    """rank -> record, waiting up to wait_s for every task's file."""
    deadline = time.time() + wait_s
    out = {}
    while True:
        for r in range(size):
            if r in out:
                continue
            try:
                with open(record_file(workdir, r)) as fh:
                    out[r] = json.load(fh)
            except (OSError, ValueError):
                pass
        if len(out) == size or time.time() > deadline:
            return out
        time.sleep(0.2)


def _under(path, folder):
    if not path or not folder:
        return False
    folder = os.path.realpath(folder).rstrip("/") + "/"
    return path.startswith(folder) or os.path.realpath(path).startswith(folder)


def _label(rec):
    return "%s %s" % (rec.get("flavor") or "?", rec.get("version") or "?")


def wrong_library(path, expect_mpi, site_dir=None):
    """Why a rank's libmpi PATH is not the one it must run (the site MPI's, when the job names one;
    else the image's own, manifest expect.mpi.library), or None when it is."""
    if site_dir and not _under(path, site_dir):
        return "not the site MPI under %s" % site_dir
    own = (expect_mpi or {}).get("library")
    if not site_dir and own and os.path.realpath(path) != os.path.realpath(own):
        return "not the image's own %s" % own
    return None


def merge(records, size, expect_mpi, site_dir=None):
    """The ``mpi.library`` check from every rank's record."""
    expect_mpi = expect_mpi or {}
    problems = []
    missing = [r for r in range(size) if r not in records]
    if missing:
        problems.append("no MPI record from rank %s" % ", ".join(str(r) for r in missing))
    per_node = {}
    for r in sorted(records):
        rec = records[r]
        per_node.setdefault(rec.get("host") or "?", []).append(r)
        where = "node %s rank %d" % (rec.get("host") or "?", r)
        if not rec.get("path"):
            problems.append("%s: no libmpi could be loaded" % where)
            continue
        wrong = wrong_library(rec["path"], expect_mpi, site_dir)
        if wrong:
            problems.append("%s loaded %s (%s), %s" % (where, rec["path"], _label(rec), wrong))
    kinds = {}
    for r, rec in records.items():
        kinds.setdefault((rec.get("path"), rec.get("text")), []).append(r)
    if len(kinds) > 1:
        parts = ["%s on node %s rank %s" % (_label(records[rs[0]]), records[rs[0]].get("host"),
                                             ",".join(str(x) for x in sorted(rs)))
                 for _k, rs in sorted(kinds.items(), key=lambda kv: min(kv[1]))]
        problems.append("ranks disagree: " + "; ".join(parts))
    library = {}
    for host, ranks in per_node.items():
        rec = records[ranks[0]]
        library[host] = {"text": rec.get("text"), "flavor": rec.get("flavor"), "version": rec.get("version"),
                         "path": rec.get("path"), "ranks": ranks, "via": rec.get("via")}
    data = {"library": library, "site": site_dir or None}
    summary = "; ".join("%s: %s (%s)" % (h, v["text"] or "?", v["path"]) for h, v in sorted(library.items()))
    figure = ", ".join(sorted({_label(v) for v in library.values()})) or "-"
    if problems:
        return result("mpi.library", FAIL, "; ".join(problems) + ("; per node: " + summary if summary else ""),
                      figure=figure, data=data)
    source = "the site MPI under %s" % site_dir if site_dir else "the image's own MPI"
    return result("mpi.library", PASS, "%d rank(s) loaded %s: %s" % (len(records), source, summary),
                  figure=figure, data=data)
