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
  RUN launch            each launcher's run (mpirun; gloo-local, the suite's own gloo launch): its
                        wall time, then
    init                  horovod.init / dist.init: the ranks' start, imports and rendezvous
    checks                every other check of that run (exact allreduce, training, bandwidth)
    rest                  the launch less both (process start and teardown, the launcher itself)
  probe: ...            in one `docker run` of the image: its start, `python -c pass`, and the
                        imports timed by the interpreter itself
--compare-horovodrun also runs `verify --launcher gloo` (horovodrun --gloo itself, the suite's gloo
launch before issue 38) beside each verify, the two in ABBA order, and adds its run's rows: the two
gloo launches side by side.
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


def one_verify(image: str, manifest: str, ranks: int, *extra: str) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        wall, proc = timed([sys.executable, "-m", "envbuilder", "verify", "--image", image, "--runtime", "docker",
                            "--manifest", manifest, "--ranks", str(ranks), "--report", str(report), *extra])
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
        rows[f"  {run['launcher']}: init"] = init
        rows[f"  {run['launcher']}: checks"] = rest
        rows[f"  {run['launcher']}: rest"] = run["wall_s"] - init - rest
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
    ap.add_argument("--compare-horovodrun", action="store_true",
                    help="also verify with --launcher gloo (horovodrun) beside each run, ABBA")
    args = ap.parse_args()
    load = Path("/proc/loadavg").read_text().split()[0]
    runs = []
    for i in range(args.repeat):
        if not args.compare_horovodrun:
            runs.append(one_verify(args.image, args.manifest, args.ranks))
            continue
        order = ("auto", "gloo") if i % 2 == 0 else ("gloo", "auto")
        got = {how: one_verify(args.image, args.manifest, args.ranks, "--launcher", how) for how in order}
        row = got["auto"]
        row.update({k: v for k, v in got["gloo"].items() if k.startswith(("horovodrun", "  horovodrun"))})
        runs.append(row)
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
