"""The report of a smoke-suite job, as verify prints it.

The job (job.sbatch with no command) runs the suite on every rank through srun; the suite's
rank 0 writes ``$OUTPUT_DIR/smoke-report.json`` (static checks, every rank's results merged, the
ranks that crashed or hung named). When the job never got that far (a missing bind, an image
that is not there, a time limit), the report says so with the end of the job's output.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..smoke.common import FAIL, REPORT_SCHEMA, result
from . import placement

REPORT_NAME = "smoke-report.json"


def _tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.strip().splitlines()[-lines:])


def collect(output_dir: Path, job: dict) -> dict:
    try:
        report = json.loads((output_dir / REPORT_NAME).read_text())
    except (OSError, ValueError):
        report = None
    if not isinstance(report, dict) or not isinstance(report.get("checks"), list):
        why = f"job {job.get('id')} ended {job.get('state')} without a smoke report"
        if job.get("reason") and job["reason"] != "None":
            why += f" ({job['reason']})"
        tail = _tail(Path(job["log"])) if job.get("log") else ""
        report = {"schema": REPORT_SCHEMA, "ok": False, "wall_s": job.get("wall_s", 0.0),
                  "started": job.get("submitted"),
                  "checks": [result("slurm.job", FAIL, f"{why}\njob output ({job.get('log')}):\n{tail}",
                                    job.get("state", "?"))]}
    else:
        if job.get("ranks"):
            # where the ranks ran, from their progress files (ranks per node)
            where = placement.check(output_dir / "smoke", job["ranks"], job.get("nodes_asked", 1),
                                    launched=bool(report.get("runs")))
            report["checks"].append(where)
            report["ok"] = bool(report.get("ok")) and where["status"] != FAIL
        if job.get("state") not in ("COMPLETED", "FAILED"):
            # the suite reported, then Slurm stopped the job (time limit, cancel): say so
            report["checks"].append(result("slurm.job", FAIL, f"job {job.get('id')} ended {job.get('state')}",
                                           job.get("state", "?")))
            report["ok"] = False
    _hint_init_hang(report, job)
    report["slurm"] = job
    return report


INIT_CHECKS = ("horovod.init", "dist.init", "launch.")


def _hint_init_hang(report: dict, job: dict) -> None:
    """Ranks on several nodes that hang while connecting: most often the interface setting
    names a network the nodes cannot reach each other on (F10): say so where the hang is named."""
    if job.get("nodes_asked", 1) < 2:
        return
    iface = job.get("interface") or "unset"
    for c in report["checks"]:
        detail = c.get("detail", "")
        connecting = "at 'hvd.init()'" in detail or "at 'init_process_group" in detail
        if c["status"] == FAIL and c["name"].startswith(INIT_CHECKS) and "hung" in detail and connecting:
            c["detail"] += (f"\nranks on {job['nodes_asked']} nodes hung while connecting: check the "
                            f"interface setting (NCCL_SOCKET_IFNAME = {iface}; the site profile's "
                            "network_interface names the nodes' fast network)")
