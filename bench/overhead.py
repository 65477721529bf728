"""Container overhead on the wire (issue 22 item 6): the smoke suite's allreduce bus bandwidth in
the container (charliecloud, the image envbuilder built) against the host (the smoke environment the
nodes mount, same torch and Horovod), on the same ranks of the multi-node test cluster: 4 ranks on
one node (shared memory) and 2 nodes x 2 ranks (TCP over the fabric network), Horovod over MPI and
over Gloo (cpu-torch) and torch.distributed over Gloo (cpu-torch-ddp).

    python bench/overhead.py [--pairs 2] [--stacks torch-gloo,horovod-mpi+gloo] [--json FILE]

Each figure is the median over PAIRS of container/host ratios at the largest message, run back to
back in ABBA order (container then host, host then container), which cancels load that drifts
during the pairs. Needs the images built (`envbuilder build recipes/cpu-torch-horovod.yaml`, ...) and the
cluster up (tools/minicluster start); every rank, node and daemon shares this machine's cores.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from minicluster import SHARED, STACKS, bus_bandwidth, run, verify  # noqa: E402


def build_folder(recipe: str, out: Path, runtime: str) -> Path:
    r = run(sys.executable, "-m", "envbuilder", "build", f"recipes/{recipe}", "--site", "minicluster",
            "--runtime", runtime, "--no-build", "--out", str(out))
    if r.returncode != 0:
        sys.exit(r.stderr)
    return out


def largest(report: dict, check: str) -> tuple[int, float]:
    bw = bus_bandwidth(report, check)
    size = max(bw)
    return size, bw[size]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=2, help="ABBA pairs per figure (default 2)")
    p.add_argument("--stacks", default=",".join(STACKS), help="comma-separated: " + ", ".join(STACKS))
    p.add_argument("--json", type=Path)
    p.add_argument("--busy-poll", action="store_true",
                   help="leave Open MPI's busy polling on (default: OMPI_MCA_mpi_yield_when_idle=1, both sides)")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="overhead-", dir=SHARED))
    cache = work / "charliecloud"
    os.environ["ENVBUILDER_CH_CACHE"] = str(cache)        # verify converts each image once, here
    # The test cluster's nodes declare 4 CPUs on this machine's 2 cores: 4 MPI ranks busy-polling
    # against each other measure the oversubscription, not the container (Horovod/MPI in the image
    # 144 MB/s at 16 MiB on one node without this, 864 MB/s with it; host 275). Both sides yield.
    if not args.busy_poll:
        os.environ["OMPI_MCA_mpi_yield_when_idle"] = "1"
    rows, results = [], {}
    try:
        for name in args.stacks.split(","):
            recipe, bw_checks = STACKS[name]
            host = build_folder(recipe, work / f"{name}-host", "host")
            cont = build_folder(recipe, work / f"{name}-ch", "charliecloud")
            for nodes in (1, 2):
                ratios: dict[str, list[float]] = {w: [] for w in bw_checks}
                sides: dict[str, dict[str, list[float]]] = {w: {"container": [], "host": []} for w in bw_checks}
                for i in range(args.pairs):
                    order = (cont, host) if i % 2 == 0 else (host, cont)
                    got = {}
                    for folder in order:
                        extra = ("--runtime", "charliecloud") if folder is cont else ()
                        got[folder] = verify(folder, nodes, 4, *extra)[1]
                    for what, check in bw_checks.items():
                        size, c = largest(got[cont], check)
                        _, h = largest(got[host], check)
                        sides[what]["container"].append(c)
                        sides[what]["host"].append(h)
                        ratios[what].append(c / h if h else 0.0)
                for what in bw_checks:
                    key = f"{what} {nodes} node{'s' if nodes > 1 else ''} x {4 // nodes}"
                    med = statistics.median(ratios[what])
                    c, h = (statistics.median(sides[what][s]) for s in ("container", "host"))
                    results[key] = {"ratios": ratios[what], "container_MBps": sides[what]["container"],
                                    "host_MBps": sides[what]["host"], "bytes": size}
                    rows.append((key, f"{c:.1f}", f"{h:.1f}", f"{med:.3f}",
                                 " ".join(f"{r:.3f}" for r in ratios[what])))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    head = ("allreduce (largest message)", "container MB/s", "host MB/s", "container/host", "pairs")
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
    for r in [head] + rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)))
    load = os.getloadavg()
    print(f"(machine: {os.cpu_count()} cores, load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; medians of "
          f"{args.pairs} ABBA pair(s); the image sets OMPI_MCA_btl_vader_single_copy_mechanism=none; "
          f"OMPI_MCA_mpi_yield_when_idle={os.environ.get('OMPI_MCA_mpi_yield_when_idle', 'unset')})")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
