"""Wall time of `envbuilder verify` for the torch.distributed preset (recipes/cpu-torch-ddp.yaml):
2 ranks in the container, with the suite's own env:// spawner and with torchrun, --repeat runs
each; prints a table (min, median, max) and the machine's load, which these figures depend on.

    python bench/ddp_verify.py [--repeat 3] [--ranks 2]

Builds the image first through `envbuilder build` (cached layers are reused), with the wheelhouse
and CA bundle the tests use (ENVBUILDER_WHEELHOUSE / the pip find-links folder, the host bundle).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "recipes" / "cpu-torch-ddp.yaml"
CA = "/etc/ssl/certs/ca-certificates.crt"


def envbuilder(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "envbuilder", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--ranks", type=int, default=2)
    args = p.parse_args()
    sys.path.insert(0, str(ROOT / "tests"))
    from infra import wheelhouse  # the tests' lookup of the torch +cpu wheel folder

    out = Path(tempfile.mkdtemp(prefix="ddp-bench-")) / "cpu-torch-ddp"
    t0 = time.time()
    r = envbuilder("build", str(RECIPE), "--out", str(out), "--ca-bundle", CA, "--wheelhouse", wheelhouse())
    if r.returncode != 0:
        print(r.stderr[-2000:], file=sys.stderr)
        return 1
    build_s = time.time() - t0
    rows = []
    for launcher in ("auto", "torchrun"):
        times, suite = [], []
        for _ in range(args.repeat):
            report = out.parent / "report.json"
            t0 = time.time()
            r = envbuilder("verify", str(out), "--runtime", "docker", "--ranks", str(args.ranks),
                           "--launcher", launcher, "--report", str(report))
            times.append(time.time() - t0)
            if r.returncode != 0:
                print(r.stdout[-2000:] + r.stderr[-2000:], file=sys.stderr)
                return 1
            suite.append(json.loads(report.read_text())["wall_s"])
        rows.append((launcher if launcher != "auto" else "spawn (env://)", times, suite))
    load = os.getloadavg()[0]
    print(f"cpu-torch-ddp, {args.ranks} ranks, docker runtime; build (cached) {build_s:.0f} s; "
          f"load average {load:.1f} on {os.cpu_count()} cores")
    print(f"{'launcher':<16} {'verify min':>10} {'median':>8} {'max':>8} {'suite median':>13}")
    for name, times, suite in rows:
        print(f"{name:<16} {min(times):>9.1f}s {statistics.median(times):>7.1f}s {max(times):>7.1f}s "
              f"{statistics.median(suite):>12.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
