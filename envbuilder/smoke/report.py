"""The suite's report: the JSON document (schema envbuilder.smoke-report/1) and its table; the
same functions verify prints with (envbuilder/verify/report.py). Standard library only."""

import json
import os
import platform
import socket
import sys
import time

from . import __version__
from .common import (BEGIN_MARKER, END_MARKER, FAIL, FAULT_ENV, GPU_LEFT_OUT, PASS, REPORT_SCHEMA,
                     SKIP, format_table, result, write_text_atomic)
from .plan import distributed_kind


def emit(report, args):
    text = json.dumps(report, indent=1, sort_keys=False, default=str)
    if args.report:
        write_text_atomic(args.report, text + "\n")
    table = format_table(report["checks"])
    summary = "%d passed, %d failed, %d skipped in %.1f s" % (
        report["summary"]["pass"], report["summary"]["fail"], report["summary"]["skip"], report["wall_s"])
    if report.get("gpu_checks") == "left out":
        summary += "; " + GPU_LEFT_OUT
    if args.json:
        sys.stdout.write("\n%s\n%s\n%s\n" % (BEGIN_MARKER, text, END_MARKER))
        sys.stdout.flush()
        if not args.quiet:
            sys.stderr.write("[smoke] %s\n" % summary)
    else:
        sys.stdout.write(table + "\n" + summary + "\n")
    sys.stdout.flush()


def gpu_checks_state(expect, checks):
    """'ran', 'left out' (--no-gpu without a GPU), 'failed: no GPU', or None for a CPU image."""
    if not expect.get("gpu"):
        return None
    gpu = [c for c in checks if c["name"].startswith("gpu.")]
    if any(c["status"] == PASS for c in gpu):
        return "ran"
    if any("left out (--no-gpu)" in c.get("detail", "") for c in gpu):
        return "left out"
    return "not run: no GPU visible"


def no_runs_result(expect):
    kind = distributed_kind(expect)
    if "distributed" in expect:
        return result("distributed", SKIP, "the manifest asks for no multi-rank framework "
                      "(distributed: none): no multi-rank checks")
    return result("horovod", SKIP, "the manifest asks for no Horovod: no multi-rank checks")


def finish(args, manifest, manifest_path, checks, run_records, t_start, launcher, ranks, workdir):
    summary = {s: sum(1 for c in checks if c["status"] == s) for s in (PASS, FAIL, SKIP)}
    report = {
        "schema": REPORT_SCHEMA,
        "suite_version": __version__,
        "manifest": {"path": manifest_path, "name": manifest.get("name")},
        "host": socket.gethostname(),
        "python": sys.executable,
        "platform": platform.platform(),
        "ranks": ranks,
        "launcher": launcher,
        "fault": os.environ.get(FAULT_ENV) or None,
        "workdir": workdir,
        "runs": run_records,
        "started": t_start,
        "wall_s": round(time.time() - t_start, 2),
        "ok": summary[FAIL] == 0,
        "summary": summary,
        "gpu_checks": gpu_checks_state(manifest["expect"], checks),
        "checks": checks,
    }
    emit(report, args)
    return 0 if report["ok"] else 1
