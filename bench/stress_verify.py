"""`envbuilder verify` on a busy machine (issue 47): N verify runs of one built folder with CPU
burners beside them, then the same N on the quiet machine, side by side in one run. A correct
image must pass every run in both columns: a failure under load is a false verdict, and the
table names each with its failing checks.

    python bench/stress_verify.py FOLDER                     # 20 runs each, 6 burners, --ranks 2
    python bench/stress_verify.py FOLDER --runs 50 --burners 12 --json out.json

FOLDER is an output folder of `envbuilder build` (e.g. of the cpu-torch-ddp preset). A burner is a
process spinning on one core (`python -c 'while 1: pass'`), so 6 burners on 2 cores give a load
average near 8: what a login node shared with builds looks like.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def envbuilder() -> list[str]:
    return [sys.executable, "-m", "envbuilder"]


def one_verify(folder: Path, ranks: int, report: Path, timeout: int) -> dict:
    t0 = time.monotonic()
    proc = subprocess.run(envbuilder() + ["verify", str(folder), "--ranks", str(ranks), "--report", str(report)],
                          capture_output=True, text=True, timeout=timeout)
    row = {"exit": proc.returncode, "seconds": round(time.monotonic() - t0, 1), "failed": []}
    try:
        data = json.loads(report.read_text())
        row["failed"] = [f"{c['name']}: {c.get('detail', '')[:160]}" for c in data.get("checks", [])
                         if c.get("status") == "FAIL"]
    except (OSError, ValueError):
        row["failed"] = [(proc.stdout + proc.stderr).strip()[-300:]]
    return row


def series(folder: Path, runs: int, ranks: int, burners: int, timeout: int) -> dict:
    procs = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(burners)]
    rows = []
    loads = []
    try:
        with tempfile.TemporaryDirectory(prefix="stress-verify-") as tmp:
            for i in range(runs):
                rows.append(one_verify(folder, ranks, Path(tmp) / f"r{i}.json", timeout))
                loads.append(os.getloadavg()[0])
    finally:
        for p in procs:
            p.kill()
            p.wait()
    failures = [r for r in rows if r["exit"] != 0]
    return {"burners": burners, "runs": runs, "passed": runs - len(failures), "failed": len(failures),
            "mean_s": round(sum(r["seconds"] for r in rows) / max(1, runs), 1),
            "load_1min_max": round(max(loads or [0.0]), 1), "failures": failures}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--burners", type=int, default=6)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=900, help="seconds one verify may take")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if not (args.folder / "manifest.json").is_file():
        ap.error(f"{args.folder}: no manifest.json (an output folder of `envbuilder build`)")
    cols = [series(args.folder, args.runs, args.ranks, args.burners, args.timeout),
            series(args.folder, args.runs, args.ranks, 0, args.timeout)]
    print(f"verify --ranks {args.ranks} of {args.folder}, {args.runs} runs per column")
    print(f"{'burners':>8} {'runs':>5} {'passed':>7} {'failed':>7} {'mean s':>7} {'load max':>9}")
    for c in cols:
        print(f"{c['burners']:>8} {c['runs']:>5} {c['passed']:>7} {c['failed']:>7} {c['mean_s']:>7} {c['load_1min_max']:>9}")
    loaded, quiet = cols
    if quiet["mean_s"]:
        print(f"time per verify, loaded / quiet: {loaded['mean_s'] / quiet['mean_s']:.2f}x")
    for c in cols:
        for f in c["failures"]:
            print(f"  FAILED with {c['burners']} burners: exit {f['exit']}: " + "; ".join(f["failed"])[:600])
    if args.json:
        args.json.write_text(json.dumps(cols, indent=2) + "\n")
    return 0 if all(c["failed"] == 0 for c in cols) else 1


if __name__ == "__main__":
    sys.exit(main())
