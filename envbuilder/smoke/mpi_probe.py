"""An MPI allreduce across the step's tasks, for an image whose MPI no Horovod run exercises.

An image with MPI and mpi4py but without Horovod's mpi controller (the PyPI MPI images, an
mpi4py stack) would otherwise pass verify on `mpi.library` alone, which loads libmpi without
MPI_Init. Here every task of the srun step starts one child process (``python -m
envbuilder_smoke.mpi_probe``: the task itself never becomes a second PMI client) that calls
MPI_Init through mpi4py, checks an allreduce's sum, times it at a few sizes and, in a fabric job,
reads which transport its MPI took (fabric.py: Open MPI's selection log, UCX's tables, the
libfabric provider). Each child also records the libmpi mapped into it (/proc/self/maps), which
must be the one ``mpi.library`` demands (the site MPI's when the job names one, else the image's
own: on the MPI-5 standard ABI libmpi_abi.so.1). Each child writes ``probe-<rank>.json``; task 0
merges them into ``mpi.allreduce[mpi4py]``, ``perf.allreduce[mpi4py]`` (bus bandwidth, so that
the site's floors apply) and ``fabric.transport[mpi4py]``.

Standard library + mpi4py; imports nothing else of envbuilder.
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import time

from .common import FAIL, PASS, bandwidth_result, bandwidth_row, pmi_pass_fds, result, write_json_atomic
from .fabric import check_name, fabric, observe, transport_logging_setup
from .mpi_library import mapped_libmpi, wrong_library

TAG = "[mpi4py]"
SIZES = (256 << 10, 4 << 20, 16 << 20)          # bytes of float32 per allreduce (the largest is the figure)
CHECK_COUNT = 1 << 20                             # elements of the checked allreduce


def wanted(expect, runs):
    """Whether the step runs the probe: the image has MPI and mpi4py, and no run uses MPI."""
    if not expect.get("mpi") or any(r.controller == "mpi" for r in runs):
        return False
    try:
        import importlib.util
        return importlib.util.find_spec("mpi4py") is not None
    except (ImportError, ValueError):
        return False


def record_file(workdir, rank):
    return os.path.join(workdir, "probe-%d.json" % rank)


def child(workdir, rank):
    """One rank (a child of the step's task): MPI_Init, the checked sum, the timings."""
    rec = {"rank": rank, "host": socket.gethostname(), "ok": False}
    try:
        if fabric():
            transport_logging_setup(workdir)
        from array import array

        from mpi4py import MPI
        comm = MPI.COMM_WORLD
        rec.update(rank=comm.Get_rank(), size=comm.Get_size())
        send = array("f", [float(comm.Get_rank() + 1)]) * CHECK_COUNT
        recv = array("f", [0.0]) * CHECK_COUNT
        comm.Allreduce([send, MPI.FLOAT], [recv, MPI.FLOAT])
        n = comm.Get_size()
        want = n * (n + 1) / 2.0
        rec["sum"] = {"want": want, "first": recv[0], "last": recv[-1]}
        rows = []
        for nbytes in SIZES:
            count = nbytes // 4
            a = array("f", [1.0]) * count
            b = array("f", [0.0]) * count
            comm.Allreduce([a, MPI.FLOAT], [b, MPI.FLOAT])         # warm-up (connections)
            reps = 3 if nbytes >= (4 << 20) else 10
            comm.Barrier()
            t = time.perf_counter()
            for _ in range(reps):
                comm.Allreduce([a, MPI.FLOAT], [b, MPI.FLOAT])
            secs = (time.perf_counter() - t) / reps
            rows.append(bandwidth_row(nbytes, comm.allreduce(secs, op=MPI.MAX), reps, n))
        rec["sizes"] = rows
        rec["ok"] = recv[0] == want and recv[-1] == want
        if fabric():
            rec["fabric"] = observe("mpi")
        rec["library"] = MPI.Get_library_version().strip().splitlines()[0][:200]
        rec["path"] = mapped_libmpi()
    except Exception as exc:  # noqa: BLE001 - reported as this rank's failure
        rec["error"] = "%s: %s" % (type(exc).__name__, str(exc)[:400])
    write_json_atomic(record_file(workdir, rank), rec)
    return 0 if rec["ok"] else 1


def run_in_task(package, workdir, rank, timeout_s):
    """Start this task's rank and wait for it; (returncode or None when killed, stderr tail)."""
    os.makedirs(workdir, exist_ok=True)
    cmd = [sys.executable, "-m", package + ".mpi_probe", "--workdir", workdir, "--rank", str(rank)]
    env = dict(os.environ)
    try:
        local = int(os.environ.get("SLURM_NTASKS_PER_NODE", "").split("(")[0] or os.environ.get("SLURM_STEP_TASKS_PER_NODE", "1").split("(")[0])
    except ValueError:
        local = 1
    if local >= (os.cpu_count() or 1):
        # as the suite's Horovod ranks (plan.run_env): ranks that outnumber the cores must not busy-poll
        env.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")
    try:
        proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=timeout_s,
                              stdin=subprocess.DEVNULL, pass_fds=pmi_pass_fds(), env=env)
        code, err = proc.returncode, proc.stderr.decode(errors="replace")
    except subprocess.TimeoutExpired as exc:
        code, err = None, (exc.stderr or b"").decode(errors="replace")
    if not os.path.exists(record_file(workdir, rank)):
        # it died before writing its record: what it printed is the report's evidence
        last = [l for l in err.strip().splitlines() if l.strip()][-3:]
        try:
            write_json_atomic(record_file(workdir, rank), {
                "rank": rank, "host": socket.gethostname(), "ok": False,
                "error": "%s: %s" % ("killed after %d s" % timeout_s if code is None else "exit %d" % code,
                                     " | ".join(last)[-400:] or "no output")})
        except OSError:
            pass            # task 0 has reported (and removed the folder): it names this rank as missing
    return code, err[-600:]


def collect(workdir, size, wait_s):
    deadline = time.time() + wait_s
    out = {}
    while len(out) < size and time.time() < deadline:
        for r in range(size):
            if r not in out:
                try:
                    with open(record_file(workdir, r)) as fh:
                        out[r] = json.load(fh)
                except (OSError, ValueError):
                    pass
        if len(out) < size:
            time.sleep(0.2)
    return out


def merge(records, size, expect_mpi=None, site_dir=None):
    """mpi.allreduce[mpi4py], perf.allreduce[mpi4py] and (fabric job) fabric.transport[mpi4py].
    EXPECT_MPI (manifest expect.mpi) and SITE_DIR (the job's site MPI folder) say which libmpi
    every rank must have run on, as for mpi.library."""
    problems = []
    for r in range(size):
        rec = records.get(r)
        if rec is None:
            problems.append("rank %d wrote no result (it crashed, or hung past the time limit)" % r)
        elif rec.get("error"):
            problems.append("rank %d on %s: %s" % (r, rec.get("host"), rec["error"]))
        elif not rec.get("ok"):
            s = rec.get("sum") or {}
            problems.append("rank %d on %s: sum %s/%s, expected %s" % (r, rec.get("host"), s.get("first"),
                                                                       s.get("last"), s.get("want")))
        elif not rec.get("path"):
            problems.append("rank %d on %s: no libmpi mapped into it" % (r, rec.get("host")))
        elif wrong_library(rec["path"], expect_mpi, site_dir):
            problems.append("rank %d on %s ran on %s, %s" % (r, rec.get("host"), rec["path"],
                                                            wrong_library(rec["path"], expect_mpi, site_dir)))
    hosts = sorted(set(rec.get("host") for rec in records.values() if rec.get("host")))
    out = []
    name = "mpi.allreduce" + TAG
    if problems:
        out.append(result(name, FAIL, "MPI_Allreduce through mpi4py across %d task(s): %s" % (size, "; ".join(problems))))
        return out
    lib = records[0].get("library", "")
    paths = sorted(set(rec["path"] for rec in records.values()))
    per_node = {h: sorted(set(rec["path"] for rec in records.values() if rec.get("host") == h)) for h in hosts}
    out.append(result(name, PASS, "%d ranks on %s: every rank's sum exact (%s; %s)"
                      % (size, ", ".join(hosts), lib, ", ".join(paths)),
                      "%d ranks, %d node%s" % (size, len(hosts), "" if len(hosts) == 1 else "s"),
                      data={"library": per_node}))
    perf = bandwidth_result("perf.allreduce" + TAG, records[0]["sizes"], "mpi4py Allreduce, bus bandwidth")
    out.append(perf)
    if fabric():
        ranks = {str(r): {"status": PASS, "data": rec.get("fabric") or {}} for r, rec in sorted(records.items())}
        layers = sorted(set("%s: %s" % (k, v.get("transport")) for rec in records.values()
                            for k, v in ((rec.get("fabric") or {}).get("layers") or {}).items()))
        chk = result(check_name(TAG), PASS, "; ".join(layers) or "no layer seen", ", ".join(layers))
        chk["ranks"] = ranks
        out.append(chk)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(prog="envbuilder_smoke.mpi_probe")
    p.add_argument("--workdir", required=True)
    p.add_argument("--rank", type=int, required=True)
    args = p.parse_args(argv)
    return child(args.workdir, args.rank)


if __name__ == "__main__":
    sys.exit(main())
