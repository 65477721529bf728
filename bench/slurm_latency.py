"""How soon the end of a Slurm job is seen, side by side on this machine's Slurm (one run, the
variants alternated, medians):

1. waiting for a job of `sleep S`: `sbatch --wait` (Slurm 22.05 polls at 2, 10 and 42 s, then
   every 32 s) against `sbatch` and polling `scontrol` every 0.5 s (what tests/infra.py's
   sbatch_until_done does);
2. job.sbatch's end: a job script as envbuilder writes it now, running `true` on one node (host
   runtime), against the same script with the node step's earlier waiting loop (`sleep 1 & wait`,
   whose sleep kept the step's output open up to a second after the step ended): from submitting
   to the job's record ended (COMPLETING cleared), polled every 0.1 s.

    .venv/bin/python bench/slurm_latency.py [--tries 3] [--sleeps 3,12]

Needs a running Slurm (.ci/start-slurm.sh) and nothing else using it."""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from envbuilder.verify.slurm import DONE_STATES, job_records

ROOT = Path(__file__).resolve().parent.parent
NEW_LOOP = "while :; do sleep 1 >/dev/null 2>&1 & wait $! || true; done"
OLD_LOOP = "while :; do sleep 1 & wait $! || true; done"


def state(job: str) -> str:
    out = subprocess.run(["scontrol", "show", "job", "-o", job], capture_output=True, text=True).stdout
    records = job_records(out)
    return records[0].get("JobState", "") if records else ""


def submit(*argv: str, cwd: Path | None = None) -> str:
    return subprocess.run(["sbatch", "--parsable", *argv], capture_output=True, text=True, check=True,
                          cwd=cwd).stdout.strip().split(";")[0]


def until_ended(job: str, every: float) -> None:
    while state(job) not in DONE_STATES:
        time.sleep(every)


def wait_with_sbatch(seconds: int) -> float:
    t0 = time.monotonic()
    subprocess.run(["sbatch", "--wait", "--parsable", "--output=/dev/null", "--wrap", f"sleep {seconds}"],
                   capture_output=True, check=True)
    return time.monotonic() - t0


def wait_by_polling(seconds: int) -> float:
    t0 = time.monotonic()
    until_ended(submit("--output=/dev/null", "--wrap", f"sleep {seconds}"), 0.5)
    return time.monotonic() - t0


def job_end(script: Path) -> float:
    t0 = time.monotonic()
    until_ended(submit(str(script), "true", cwd=script.parent), 0.1)
    return time.monotonic() - t0


def job_scripts(folder: Path) -> tuple[Path, Path]:
    spec = folder / "spec.yaml"
    spec.write_text((ROOT / "recipes" / "cpu-torch-ddp.yaml").read_text().replace(
        "  runtime: charliecloud", "  runtime: host"))
    out = folder / "job"
    proc = subprocess.run([sys.executable, "-m", "envbuilder", "build", str(spec), "--no-build", "--out", str(out)],
                          capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        sys.exit(proc.stderr)
    new = out / "job.sbatch"
    text = new.read_text()
    if NEW_LOOP not in text:
        sys.exit("the job script has no node step waiting loop: is this envbuilder's current one?")
    old = out / "old.sbatch"
    old.write_text(text.replace(NEW_LOOP, OLD_LOOP))
    return new, old


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tries", type=int, default=3)
    ap.add_argument("--sleeps", default="3,12", help="job lengths (s) for the sbatch --wait comparison")
    args = ap.parse_args()
    rows = []
    for seconds in (int(s) for s in args.sleeps.split(",")):
        a, b = [], []
        for _ in range(args.tries):
            a.append(wait_with_sbatch(seconds))
            b.append(wait_by_polling(seconds))
        rows.append((f"a job of sleep {seconds}: seen ended", "sbatch --wait", statistics.median(a),
                     "scontrol every 0.5 s", statistics.median(b)))
    with tempfile.TemporaryDirectory(prefix="envbuilder-bench-") as tmp:
        new, old = job_scripts(Path(tmp))
        a, b = [], []
        for _ in range(args.tries):
            a.append(job_end(old))
            b.append(job_end(new))
        rows.append(("job.sbatch running `true`: submit to end", "sleep holding the output", statistics.median(a),
                     "now", statistics.median(b)))
    print(f"{'what':44} {'before':>26} {'s':>6}   {'after':>22} {'s':>6}  after/before")
    for what, x, xs, y, ys in rows:
        print(f"{what:44} {x:>26} {xs:6.1f}   {y:>22} {ys:6.1f}  {ys / xs:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
