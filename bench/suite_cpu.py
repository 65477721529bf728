"""How busy the machine's cores are while each test module runs: where the suite waits (Slurm
job starts, sleeps, a throttled node) rather than computes, and so where running two parts of it
at once could shorten CI on a 2-core machine, and where it could not (image builds, compiles).

Each module runs alone under pytest as CI runs it (`-q`, the environment's ENVBUILDER_* variables
kept); /proc/stat is read every second meanwhile. For each module: wall seconds, the cores' busy
share (user + system + nice + irq over all time but steal), the idle core-seconds that another
process could have used, and the CPU seconds the module's own processes used (from the kernel's
accounting of finished children: the one column no other process on the machine can move).

    .venv/bin/python bench/suite_cpu.py tests/test_multinode.py tests/test_sif.py [-- PYTEST ARGS]

Run it on a machine doing nothing else (the share counts every process, not only the tests)."""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies over all cores, steal left out of both."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    user, nice, system, idle, iowait, irq, softirq = fields[:7]
    busy = user + nice + system + irq + softirq
    return busy, busy + idle + iowait


def run_module(module: str, extra: list[str]) -> dict:
    samples: list[tuple[float, int, int]] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            samples.append((time.monotonic(), *cpu_times()))
            done.wait(1.0)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    t0 = time.monotonic()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", module, *extra], cwd=ROOT,
                          capture_output=True, text=True)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    own = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    done.set()
    thread.join()
    samples.append((time.monotonic(), *cpu_times()))
    busy = samples[-1][1] - samples[0][1]
    total = samples[-1][2] - samples[0][2]
    share = busy / total if total else 0.0
    cores = os.cpu_count() or 1
    last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else f"exit {proc.returncode}"
    return {"module": module, "wall": wall, "share": share, "idle_core_s": wall * cores * (1 - share),
            "own_cpu_s": own, "result": last, "code": proc.returncode}


def main() -> int:
    argv = sys.argv[1:]
    extra: list[str] = []
    if "--" in argv:
        extra = argv[argv.index("--") + 1:]
        argv = argv[:argv.index("--")]
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("modules", nargs="+", help="test modules (paths) to run one after the other")
    args = parser.parse_args(argv)
    rows = [run_module(m, extra) for m in args.modules]
    cores = os.cpu_count() or 1
    print(f"\n{cores} cores; busy share = user+system+nice+irq over all but steal, sampled every 1 s\n")
    print("| module | wall s | cores busy | idle core-s | own CPU s | pytest |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['module']} | {r['wall']:.0f} | {r['share']:.0%} | {r['idle_core_s']:.0f} | {r['own_cpu_s']:.1f} | {r['result']} |")
    wall = sum(r["wall"] for r in rows)
    idle = sum(r["idle_core_s"] for r in rows)
    own = sum(r["own_cpu_s"] for r in rows)
    print(f"| all | {wall:.0f} | {1 - idle / (wall * cores) if wall else 0:.0%} | {idle:.0f} | {own:.1f} | |")
    return 0 if all(r["code"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
