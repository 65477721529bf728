"""verify's outputs: the table people read, JUnit XML for CI, the JSON report. The report format
(schema, statuses, counts, table) is the smoke suite's own (smoke/common.py, smoke/report.py):
verify reads what the suite writes and prints it the same way."""

from __future__ import annotations

import json
import socket
import time
import xml.etree.ElementTree as ET

from ..smoke import report as smoke_report
from ..smoke.common import FAIL, REPORT_SCHEMA, SKIP



def summary(report: dict) -> dict:
    return smoke_report.summary(report.get("checks") or [])


def table(report: dict, *, details: bool = True) -> str:
    """The suite's own table (smoke/report.py), with up to 8 lines of a failed check's reason."""
    return smoke_report.table(report.get("checks") or [], details=details, detail_lines=8)


def headline(report: dict, where: str) -> str:
    s = summary(report)
    verdict = "OK" if s[FAIL] == 0 else "FAILED"
    if s[FAIL] == 0 and report.get("gpu_checks") == "left out":
        verdict = "OK without GPU checks"
    text = f"{verdict}: {where}: {smoke_report.counts_line(report)}"
    if report.get("gpu_checks") == "left out":
        text += "; GPU checks left out (--no-gpu): not verified on a GPU"
    return text


def junit_xml(report: dict, *, suite_name: str, properties: dict | None = None) -> str:
    """One <testcase> per check; failures carry the detail as message and text."""
    checks = report.get("checks") or []
    s = summary(report)
    total_time = float(report.get("wall_s") or 0.0)
    root = ET.Element("testsuites", name="envbuilder verify", tests=str(len(checks)),
                      failures=str(s[FAIL]), errors="0", skipped=str(s[SKIP]), time=f"{total_time:.3f}")
    suite = ET.SubElement(root, "testsuite", name=suite_name, tests=str(len(checks)),
                          failures=str(s[FAIL]), errors="0", skipped=str(s[SKIP]),
                          time=f"{total_time:.3f}",
                          timestamp=time.strftime("%Y-%m-%dT%H:%M:%S",
                                                  time.gmtime(report.get("started") or time.time())),
                          hostname=str(report.get("host") or socket.gethostname()))
    props = ET.SubElement(suite, "properties")
    for k, v in sorted((properties or {}).items()):
        ET.SubElement(props, "property", name=str(k), value=str(v))
    for c in checks:
        name = str(c.get("name", "?"))
        group = name.split(".", 1)[0].split("[", 1)[0]
        case = ET.SubElement(suite, "testcase", classname=f"envbuilder.smoke.{group}", name=name,
                             time=f"{float(c.get('seconds') or 0.0):.3f}")
        detail = str(c.get("detail") or "")
        first = detail.splitlines()[0] if detail else ""
        if c.get("status") == FAIL:
            el = ET.SubElement(case, "failure", message=first[:500] or "failed", type="CheckFailed")
            el.text = detail
        elif c.get("status") == SKIP:
            ET.SubElement(case, "skipped", message=first[:500])
        out = []
        if c.get("figure"):
            out.append(f"figure: {c['figure']}")
        if detail and c.get("status") != FAIL:
            out.append(detail)
        if out:
            ET.SubElement(case, "system-out").text = "\n".join(out)
    if hasattr(ET, "indent"):  # Python >= 3.9
        ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def failure_report(problem: str, *, argv: list[str], wall_s: float, runtime: str) -> dict:
    """A report for a suite that produced none (it crashed, or verify had to stop it)."""
    return {
        "schema": REPORT_SCHEMA,
        "ok": False,
        "wall_s": round(wall_s, 2),
        "started": time.time() - wall_s,
        "checks": [{"name": "suite", "status": FAIL, "detail": problem,
                    "figure": "no report", "seconds": round(wall_s, 2)}],
        "verify": {"runtime": runtime, "argv": argv},
    }


def dumps(report: dict) -> str:
    return json.dumps(report, indent=2, default=str) + "\n"
