"""Figures of the multi-node test cluster (tools/minicluster): how long it takes to start, how long
`envbuilder verify --slurm` takes on 2 nodes x 2 ranks, and the smoke suite's allreduce bus
bandwidth with 4 ranks on one node against 4 ranks on two nodes (Horovod over MPI and over Gloo,
both in one verify of cpu-torch, and torch.distributed over Gloo; host runtime: the smoke
environment the nodes mount).

    python bench/minicluster.py [--repeat 3] [--cold] [--json FILE]

--cold also removes the node image first, so the start includes building it. The machine's load
is printed with the table: every rank, node and daemon shares this machine's cores.
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

ROOT = Path(__file__).resolve().parent.parent
TOOL = ROOT / "tools" / "minicluster"
SHARED = Path("/var/lib/envbuilder-minicluster/shared")
CONF = "/var/lib/envbuilder-minicluster/etc/slurm.conf"
PYTHON = os.environ.get("ENVBUILDER_SMOKE_PYTHON", "/opt/envbuilder-smoke-venv/bin/python")
# verify's name -> (recipe, {figure name: bandwidth check}); cpu-torch's verify runs Horovod's
# mpi and gloo controllers one after the other in the same job
STACKS = {"horovod-mpi+gloo": ("cpu-torch-horovod.yaml", {"horovod-mpi": "perf.allreduce[mpi]",
                                                  "horovod-gloo": "perf.allreduce[gloo]"}),
          "torch-gloo": ("cpu-torch-ddp.yaml", {"torch-gloo": "perf.allreduce[torch]"})}


def run(*argv: str, env: dict | None = None, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}, cwd=ROOT)


def start_seconds(cold: bool) -> tuple[float, float]:
    """(start after stop, start when already up) in seconds."""
    run("bash", str(TOOL), "stop")
    if cold:
        tags = run("docker", "images", "-q", "local/envbuilder-minicluster").stdout.split()
        if tags:
            run("docker", "rmi", "-f", *tags)
    t0 = time.time()
    p = run("bash", str(TOOL), "start", timeout=1800)
    if p.returncode != 0:
        sys.exit(f"tools/minicluster start failed:\n{p.stderr[-2000:]}")
    started = time.time() - t0
    t0 = time.time()
    run("bash", str(TOOL), "start")
    return started, time.time() - t0


def verify(folder: Path, nodes: int, ranks: int, *extra: str) -> tuple[float, dict]:
    report = folder.parent / f"report-{time.time_ns()}.json"
    t0 = time.time()
    p = run(sys.executable, "-m", "envbuilder", "verify", str(folder), "--slurm", "--nodes", str(nodes),
            "--ranks", str(ranks), "--python", PYTHON, "--timeout", "120", "--report", str(report), *extra,
            # charliecloud's directory image where every node sees it (the default cache is this
            # machine's /var/tmp, which the nodes do not mount)
            env={"SLURM_CONF": CONF, "ENVBUILDER_CH_CACHE": os.environ.get("ENVBUILDER_CH_CACHE", str(SHARED / "charliecloud"))})
    wall = time.time() - t0
    if not report.is_file():
        sys.exit(f"verify wrote no report:\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
    data = json.loads(report.read_text())
    if p.returncode != 0:
        failed = [c["name"] for c in data["checks"] if c["status"] == "fail"]
        print(f"warning: verify {folder.name} {nodes}x{ranks} failed: {failed}", file=sys.stderr)
    return wall, data


def bus_bandwidth(report: dict, check: str) -> dict[int, float]:
    """{message bytes: bus bandwidth MB/s} of rank 0."""
    c = {x["name"]: x for x in report["checks"]}[check]
    sizes = c["ranks"]["0"]["data"]["sizes"]
    return {s["bytes"]: s["busbw_GBps"] * 1000 for s in sizes}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--cold", action="store_true", help="rebuild the node image too")
    p.add_argument("--json", type=Path)
    args = p.parse_args()

    start, again = start_seconds(args.cold)
    work = Path(tempfile.mkdtemp(prefix="bench-", dir=SHARED))
    try:
        return measure(args, work, start, again)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def measure(args, work: Path, start: float, again: float) -> int:
    rows, results = [], {"start_s": start, "start_again_s": again, "cold": args.cold}
    rows.append((f"cluster start ({'node image built' if args.cold else 'node image present'})", f"{start:.1f} s"))
    rows.append(("cluster start when already up", f"{again:.1f} s"))
    for name, (recipe, bw_checks) in STACKS.items():
        folder = work / name
        r = run(sys.executable, "-m", "envbuilder", "build", f"recipes/{recipe}", "--site", "minicluster",
                "--runtime", "host", "--no-build", "--out", str(folder))
        if r.returncode != 0:
            sys.exit(r.stderr)
        walls = [verify(folder, 2, 4)[0] for _ in range(args.repeat)]
        results[f"verify_2x2_{name}_s"] = walls
        rows.append((f"verify --slurm 2 nodes x 2 ranks, {name} (median of {len(walls)})",
                     f"{statistics.median(walls):.1f} s (min {min(walls):.1f}, max {max(walls):.1f})"))
        # 4 ranks on one node (shared memory) against 4 ranks on two nodes (TCP over fab0)
        _, one = verify(folder, 1, 4)
        _, two = verify(folder, 2, 4)
        for what, check in bw_checks.items():
            bw1, bw2 = bus_bandwidth(one, check), bus_bandwidth(two, check)
            results[f"busbw_{what}_MBps"] = {"one_node": bw1, "two_nodes": bw2}
            for size in sorted(bw1):
                rows.append((f"allreduce {what} {size // 1024} KiB bus bw: 1 node x 4 / 2 nodes x 2",
                             f"{bw1[size]:.1f} / {bw2.get(size, 0):.1f} MB/s"))
    load = os.getloadavg()
    width = max(len(r[0]) for r in rows)
    print(f"{'figure'.ljust(width)}  value")
    for k, v in rows:
        print(f"{k.ljust(width)}  {v}")
    print(f"(machine: {os.cpu_count()} cores, load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; "
          "ranks, nodes and daemons share them)")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
