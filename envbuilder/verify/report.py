"""verify's outputs: the table people read, JUnit XML for CI, the JSON report."""

from __future__ import annotations

import json
import socket
import time
import xml.etree.ElementTree as ET

PASS, FAIL, SKIP = "pass", "fail", "skip"


def summary(report: dict) -> dict:
    checks = report.get("checks") or []
    return {s: sum(1 for c in checks if c.get("status") == s) for s in (PASS, FAIL, SKIP)}


def table(report: dict, *, details: bool = True) -> str:
    """CHECK / RESULT / FIGURE, with the reason under every failed check."""
    checks = report.get("checks") or []
    rows = [("CHECK", "RESULT", "FIGURE")]
    for c in checks:
        figure = str(c.get("figure") or "")
        if c.get("status") == SKIP and not figure and c.get("detail"):
            figure = "(" + str(c["detail"]).splitlines()[0] + ")"
        rows.append((str(c.get("name", "?")), str(c.get("status", "?")).upper(), figure))
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    lines = []
    for i, (a, b, c) in enumerate(rows):
        lines.append(f"{a:<{w0}}  {b:<{w1}}  {c}".rstrip())
        if i and details and checks[i - 1].get("status") == FAIL and checks[i - 1].get("detail"):
            for dl in str(checks[i - 1]["detail"]).splitlines()[:8]:
                lines.append(" " * (w0 + 4) + dl)
    return "\n".join(lines)


def headline(report: dict, where: str) -> str:
    s = summary(report)
    verdict = "OK" if s[FAIL] == 0 else "FAILED"
    if s[FAIL] == 0 and report.get("gpu_checks") == "left out":
        verdict = "OK without GPU checks"
    text = (f"{verdict}: {where}: {s[PASS]} passed, {s[FAIL]} failed, {s[SKIP]} skipped "
            f"in {report.get('wall_s', 0):.1f} s")
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
        "schema": "envbuilder.smoke-report/1",
        "ok": False,
        "wall_s": round(wall_s, 2),
        "started": time.time() - wall_s,
        "checks": [{"name": "suite", "status": FAIL, "detail": problem,
                    "figure": "no report", "seconds": round(wall_s, 2)}],
        "verify": {"runtime": runtime, "argv": argv},
    }


def dumps(report: dict) -> str:
    return json.dumps(report, indent=2, default=str) + "\n"
