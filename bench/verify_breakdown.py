"""Where `envbuilder verify`'s seconds go, for one built image (issue 38: verify is what users wait
for after every build): the whole run as a user starts it, split by the suite's own report, and
probes in the same image for what each launch pays before any check (container start,
interpreter start, the framework's and Horovod's imports).

    .venv/bin/python bench/verify_breakdown.py --image envbuilder/cpu-torch-horovod:TAG \\
        --manifest images/cpu-torch-horovod/manifest.json [--repeat 3] [--json OUT]

Rows (median of --repeat; each verify is `envbuilder verify --image TAG --runtime docker --ranks 2`):
  verify, whole         the command's wall time
  outside the suite     the command less the suite's own wall (container start, envbuilder's side)
  static checks         the checks before the first launch (the framework's import is most of it)
  RUN launch            each launcher's run (mpirun, horovodrun --gloo): its wall time, then
    init                  horovod.init / dist.init: the ranks' start, imports and rendezvous
    checks                every other check of that run (exact allreduce, training, bandwidth)
    rest                  the launch less both (process start and teardown, the launcher itself)
  probe: ...            in one `docker run` of the image: its start, `python -c pass`, and the
                        imports timed by the interpreter itself
Figures are seconds; share is of the whole verify. Run it on an otherwise idle machine."""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PROBE = r"""
import json, time
t = {}
t0 = time.perf_counter()
import torch
t["import torch"] = time.perf_counter() - t0
t0 = time.perf_counter()
try:
    import horovod.torch
    t["import horovod.torch"] = time.perf_counter() - t0
except ImportError:
    pass
t0 = time.perf_counter()
import torch.distributed as dist, tempfile, os
store = dist.FileStore(os.path.join(tempfile.mkdtemp(), "s"), 1)
dist.init_process_group("gloo", store=store, rank=0, world_size=1)
t["gloo init, 1 rank"] = time.perf_counter() - t0
print(json.dumps(t))
"""


def timed(cmd: list[str]) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    return time.monotonic() - t0, proc


def one_verify(image: str, manifest: str, ranks: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        wall, proc = timed([sys.executable, "-m", "envbuilder", "verify", "--image", image, "--runtime", "docker",
                            "--manifest", manifest, "--ranks", str(ranks), "--report", str(report)])
        if not report.exists():
            sys.exit(f"verify wrote no report (exit {proc.returncode}): {proc.stderr[-2000:]}")
        data = json.loads(report.read_text())
    if not data.get("ok"):
        sys.exit("verify failed: the breakdown of a failing run says nothing about speed")
    rows = {"verify, whole": wall, "outside the suite": wall - data["wall_s"]}
    checks = data["checks"]
    first = next((i for i, c in enumerate(checks) if c["name"].startswith("launch.")), len(checks))
    rows["static checks"] = sum(c.get("seconds") or 0 for c in checks[:first])
    for run in data["runs"]:
        tag = f"[{run['controller']}]"
        mine = [c for c in checks if c["name"].endswith(tag) and not c["name"].startswith("launch.")]
        init = sum(c.get("seconds") or 0 for c in mine if c["name"].split("[")[0] in ("horovod.init", "dist.init"))
        # perf.step reports the training check's own time again: counted once
        rest = sum(c.get("seconds") or 0 for c in mine
                   if c["name"].split("[")[0] not in ("horovod.init", "dist.init", "perf.step.pytorch",
                                                      "perf.step.tensorflow"))
        name = f"{run['launcher']} ({run['controller']}) launch"
        rows[name] = run["wall_s"]
        rows[f"  {run['controller']}: init"] = init
        rows[f"  {run['controller']}: checks"] = rest
        rows[f"  {run['controller']}: rest"] = run["wall_s"] - init - rest
    return rows


def probe(image: str) -> dict[str, float]:
    start, p = timed(["docker", "run", "--rm", "--entrypoint", "true", image])
    py, _ = timed(["docker", "run", "--rm", image, "python", "-c", "pass"])
    _, p = timed(["docker", "run", "--rm", image, "python", "-c", PROBE])
    inner = json.loads(p.stdout.strip().splitlines()[-1]) if p.returncode == 0 else {}
    out = {"probe: container start (true)": start, "probe: + python -c pass": py - start}
    out.update({f"probe: {k}": v for k, v in inner.items()})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--image", required=True)
    ap.add_argument("--manifest", required=True, help="the image's manifest.json")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--json", help="also write the raw figures here")
    args = ap.parse_args()
    load = Path("/proc/loadavg").read_text().split()[0]
    runs = [one_verify(args.image, args.manifest, args.ranks) for _ in range(args.repeat)]
    probes = [probe(args.image) for _ in range(args.repeat)]
    rows = {k: statistics.median(r[k] for r in runs if k in r) for k in runs[0]}
    rows.update({k: statistics.median(p[k] for p in probes if k in p) for k in probes[0]})
    whole = rows["verify, whole"]
    print(f"verify of {args.image}, {args.ranks} ranks, median of {args.repeat} (load average {load} at start)")
    print(f"| {'phase':<34} | {'seconds':>7} | {'share':>6} |")
    print(f"|{'-' * 36}|{'-' * 9}|{'-' * 8}|")
    for k, v in rows.items():
        print(f"| {k:<34} | {v:7.2f} | {v / whole:6.1%} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"image": args.image, "load": load, "runs": runs,
                                               "probes": probes, "median": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
