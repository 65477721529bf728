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
                     SKIP, result, write_text_atomic)


def summary(checks):
    """{pass: N, fail: N, skip: N}."""
    return {s: sum(1 for c in checks if c.get("status") == s) for s in (PASS, FAIL, SKIP)}


def counts_line(report):
    s = summary(report.get("checks") or [])
    return "%d passed, %d failed, %d skipped in %.1f s" % (s[PASS], s[FAIL], s[SKIP], report.get("wall_s") or 0)


def table(checks, details=True, detail_lines=6):
    """CHECK / RESULT / FIGURE, with the first DETAIL_LINES of the reason under a failed check
    (verify prints the same table, with 8)."""
    rows = [("CHECK", "RESULT", "FIGURE")]
    for c in checks:
        figure = str(c.get("figure") or "")
        if c.get("status") == SKIP and not figure and c.get("detail"):
            figure = "(%s)" % str(c["detail"]).splitlines()[0]
        rows.append((str(c.get("name", "?")), str(c.get("status", "?")).upper(), figure))
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    lines = []
    for i, r in enumerate(rows):
        lines.append(("%s  %s  %s" % (r[0].ljust(w0), r[1].ljust(w1), r[2])).rstrip())
        if i == 0 or not details:
            continue
        c = checks[i - 1]
        if c.get("status") == FAIL and c.get("detail"):
            for dl in str(c["detail"]).splitlines()[:detail_lines]:
                lines.append("%s    %s" % (" " * w0, dl))
    return "\n".join(lines)


def emit(report, args):
    text = json.dumps(report, indent=1, sort_keys=False, default=str)
    if args.report:
        write_text_atomic(args.report, text + "\n")
    summary = counts_line(report)
    if report.get("gpu_checks") == "left out":
        summary += "; " + GPU_LEFT_OUT
    if args.json:
        sys.stdout.write("\n%s\n%s\n%s\n" % (BEGIN_MARKER, text, END_MARKER))
        sys.stdout.flush()
        if not args.quiet:
            sys.stderr.write("[smoke] %s\n" % summary)
    else:
        sys.stdout.write(table(report["checks"]) + "\n" + summary + "\n")
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
    if "distributed" in expect:
        return result("distributed", SKIP, "the manifest asks for no multi-rank framework "
                      "(distributed: none): no multi-rank checks")
    return result("horovod", SKIP, "the manifest asks for no Horovod: no multi-rank checks")


def finish(args, manifest, manifest_path, checks, run_records, t_start, launcher, ranks, workdir):
    counts = summary(checks)
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
        "ok": counts[FAIL] == 0,
        "summary": counts,
        "gpu_checks": gpu_checks_state(manifest["expect"], checks),
        "checks": checks,
    }
    emit(report, args)
    return 0 if report["ok"] else 1
