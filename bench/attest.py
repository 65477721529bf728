"""The cost of the attestation (docs/attestation.md) on a real SIF and its statement, each step
timed REPEAT times (the median printed): `envbuilder attest sign` (cosign sign-blob, bundle
beside the statement), `envbuilder attest check` (sha256 of the whole SIF + cosign verify-blob +
the predicate), and the two halves of job.sbatch's gate separately: `cosign verify-blob` of the
statement and `sha256sum` of the SIF (what the batch step pays once per job), plus a plain `cat
SIF > /dev/null` (reading the bytes once, the floor of any hash).

    python bench/attest.py --sif images/cpu-torch-horovod/cpu-torch-horovod.sif \
        --statement images/cpu-torch-horovod/cpu-torch-horovod.sif.att.json [--repeat 5] [--json FILE]

The statement must be the SIF's (`envbuilder verify x.sif --attest x.sif.att.json`). A cosign key
pair is made by cosign in a temporary folder for the run (COSIGN_PASSWORD empty) and removed at the
end; the statement is copied there, so nothing beside the SIF is written.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "COSIGN_PASSWORD": "", "PYTHONPATH": str(REPO)}


def timed(argv: list[str], repeat: int, cwd: Path | None = None) -> float:
    runs = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        proc = subprocess.run(argv, capture_output=True, text=True, env=ENV, cwd=cwd)
        runs.append(time.perf_counter() - t0)
        if proc.returncode != 0:
            raise SystemExit(f"bench/attest.py: {' '.join(argv[:4])} failed: {proc.stderr.strip()[-500:]}")
    return statistics.median(runs)


def measure(sif: Path, statement: Path, repeat: int) -> list[tuple[str, float]]:
    if not shutil.which("cosign"):
        raise SystemExit("bench/attest.py: no cosign on PATH (bash .ci/install-cosign.sh)")
    py = [sys.executable, "-m", "envbuilder"]
    with tempfile.TemporaryDirectory(prefix="bench-attest-") as tmp:
        work = Path(tmp)
        subprocess.run(["cosign", "generate-key-pair"], cwd=work, env=ENV, check=True, capture_output=True)
        att = work / "x.att.json"
        shutil.copy(statement, att)
        bundle = Path(f"{att}.bundle")
        rows = [("envbuilder attest sign (cosign bundle)",
                 timed([*py, "attest", "sign", str(att), "--key", str(work / "cosign.key"), "--image", str(sif),
                        "--format", "cosign"], repeat))]
        rows.append(("envbuilder attest check (hash + cosign + predicate)",
                     timed([*py, "attest", "check", "--image", str(sif), "--key", str(work / "cosign.pub"),
                            "--attestation", str(att), "--format", "cosign"], repeat)))
        rows.append(("gate: cosign verify-blob of the statement",
                     timed(["cosign", "verify-blob", "--key", str(work / "cosign.pub"), "--bundle", str(bundle),
                            "--insecure-ignore-tlog=true", str(att)], repeat)))
        rows.append(("gate: sha256sum of the SIF", timed(["sha256sum", str(sif)], repeat)))
        rows.append(("read the SIF once (cat > /dev/null)", timed(["sh", "-c", f'cat "{sif}" > /dev/null'], repeat)))
    return rows


def table(sif: Path, size: int, rows: list[tuple[str, float]], repeat: int) -> str:
    lines = [f"SIF {sif} ({size / 1e6:.0f} MB), median of {repeat}", "",
             "| step | seconds |", "|---|---|"]
    lines += [f"| {name} | {sec:.2f} |" for name, sec in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sif", required=True, type=Path)
    ap.add_argument("--statement", required=True, type=Path)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    rows = measure(args.sif, args.statement, args.repeat)
    size = args.sif.stat().st_size
    print(table(args.sif, size, rows, args.repeat))
    if args.json:
        args.json.write_text(json.dumps({"sif": str(args.sif), "bytes": size, "repeat": args.repeat,
                                         "seconds": dict(rows)}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
