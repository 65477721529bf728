"""Job start through the real Apptainer against charliecloud, and Open MPI's allreduce on the
Apptainer cluster with and without yielding idle cores: the cpu-torch image (torch + Horovod,
Debian's Open MPI 4.1.4), 2 nodes x 2 ranks, through envbuilder's job.sbatch.

    python bench/apptainer_jobs.py [--repeat 3] [--json FILE]

- job start: from `sbatch` to the last of the 4 ranks' Python running (its first line) and to the
  last rank past `hvd.init()`, and to the job's end (a Horovod allreduce on every rank): apptainer
  (`tools/minicluster --flavor apptainer`, envbuilder's .sif, submitted as builder on its login
  node) against charliecloud (`tools/minicluster`, the same image as a directory, submitted here).
  The two clusters differ in more than the runtime (Debian 13 + Slurm 24.11 against Debian 12 +
  Slurm 22.05), both on this machine's cores: read the figures as "same order or not".
- Open MPI's 16 MiB and 4 KiB allreduce (Horovod, MPI controller) on the Apptainer cluster, the
  site's `OMPI_MCA_mpi_yield_when_idle=1` (sites/minicluster-apptainer.yaml) against without it:
  its ranks busy-poll, and 4 ranks on 2 shared cores starve each other without it.

Runs take turns (--repeat N: medians); both clusters must be up (.ci/setup starts them). The image
is built from the build cache (or built; a build gives a new image id, hence a new charliecloud
directory); what the script makes in the shared folders, that directory included, goes at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
TOOL = ROOT / "tools" / "minicluster"
AC = Path("/var/lib/envbuilder-apptainer-cluster")
MC = Path("/var/lib/envbuilder-minicluster")
MC_CONF = str(MC / "etc" / "slurm.conf")
CA = "/etc/ssl/certs/ca-certificates.crt"
BUILDER_UID = 1000

RECORD = """\
import json, os, socket, sys, time
up = time.time()
import torch, horovod.torch as hvd
hvd.init()
init = time.time()
def timed(n, reps):
    x = torch.ones(n // 4)
    hvd.allreduce(x, op=hvd.Sum, name="w%d" % n)
    t = time.perf_counter()
    for i in range(reps):
        y = hvd.allreduce(x, op=hvd.Sum, name="a%d" % n)
    assert y[0].item() == hvd.size()
    return (time.perf_counter() - t) / reps
big, small = timed(16 << 20, 5), timed(4096, 20)
json.dump({"rank": hvd.rank(), "host": socket.gethostname(), "up": up, "init": init, "big_s": big, "small_s": small},
          open(os.path.join(os.environ["OUTPUT_DIR"], "rank-%d.json" % hvd.rank()), "w"))
"""
SIZE = 4
BIG = 16 << 20


def run(*argv: str, env: dict | None = None, timeout: int = 2400, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


def envbuilder(*args: str) -> None:
    p = run(sys.executable, "-m", "envbuilder", *args)
    if p.returncode != 0:
        sys.exit(f"envbuilder {' '.join(args[:2])} failed:\n{p.stderr[-3000:]}")


def chown_tree(path: Path) -> None:
    for root, dirs, files in os.walk(path):
        for name in [root, *(os.path.join(root, d) for d in dirs), *(os.path.join(root, f) for f in files)]:
            os.lchown(name, BUILDER_UID, BUILDER_UID)


def job_id_of(stdout: str) -> str:
    return stdout.strip().split(";")[0]


def wait_done(show) -> None:
    from envbuilder.verify.slurm import DONE_STATES, job_records

    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        records = job_records(show().stdout)
        if records and all(r.get("JobState") in DONE_STATES for r in records):
            return
        time.sleep(0.5)
    sys.exit("a job did not end within 600 s")


def submit(folder: Path, image: str, apptainer: bool) -> tuple[str, float, float]:
    """One 2 x 2 job of RECORD: (job id, submission time, end time as seen by polling)."""
    # the program as an argument: ch-run starts in / and binds only the job's own folders
    argv = ["sbatch", "--parsable", "--nodes=2", "--ntasks-per-node=2", "job.sbatch", "python", "-c", RECORD]
    t0 = time.time()
    if apptainer:
        p = run("bash", str(TOOL), "--flavor", "apptainer", "exec", "-w", str(folder), "env",
                f"ENVBUILDER_IMAGE={image}", *argv)
    else:
        # ch-run wants $USER (ENVIRONMENT.md), which a job started without a login may lack
        p = run(*argv, env={"SLURM_CONF": MC_CONF, "ENVBUILDER_IMAGE": image,
                            "USER": os.environ.get("USER") or "root"}, cwd=folder)
    job = job_id_of(p.stdout)
    if p.returncode != 0 or not job:
        sys.exit(f"sbatch failed: {p.stderr[-2000:]}")
    if apptainer:
        wait_done(lambda: run("bash", str(TOOL), "--flavor", "apptainer", "exec", "-w", str(folder),
                              "scontrol", "show", "job", "-o", job))
    else:
        wait_done(lambda: run("scontrol", "show", "job", "-o", job, env={"SLURM_CONF": MC_CONF}))
    return job, t0, time.time()


def records(folder: Path, job: str) -> list[dict]:
    recs = [json.loads(p.read_text()) for p in sorted((folder / "runs" / job).glob("rank-*.json"))]
    if len(recs) != SIZE:
        log = "".join(p.read_text() for p in folder.glob(f"*-{job}.out"))
        sys.exit(f"job {job} in {folder}: {len(recs)} of {SIZE} ranks reported:\n{log[-3000:]}")
    return recs


def busbw(seconds: float, nbytes: int) -> float:
    return nbytes / seconds * 2 * (SIZE - 1) / SIZE / 1e6


def med(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} (min {min(values):.1f}, max {max(values):.1f})"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    for flavor in ("apptainer", "charliecloud"):
        s = run("bash", str(TOOL), "--flavor", flavor, "status")
        if s.returncode != 0:
            sys.exit(f"the {flavor} cluster is not up: tools/minicluster --flavor {flavor} start\n{s.stderr}")
    tag = f"bench-{uuid.uuid4().hex[:6]}"
    ac_work, mc_work = AC / "shared" / tag, MC / "shared" / tag
    made: list[Path] = []
    try:
        return measure(args, ac_work, mc_work, made)
    finally:
        from envbuilder.runtimes.charliecloud import remove_directory_image

        shutil.rmtree(ac_work, ignore_errors=True)
        shutil.rmtree(mc_work, ignore_errors=True)
        for directory in made:
            remove_directory_image(directory)


def measure(args, ac_work: Path, mc_work: Path, made: list[Path]) -> int:
    from envbuilder.runtimes.charliecloud import charliecloud_dir

    wheels = "/opt/wheels"
    t0 = time.time()
    img = ac_work / "cpu-torch"
    envbuilder("build", "recipes/cpu-torch-horovod.yaml", "--site", "minicluster-apptainer", "--out", str(img), "--sif",
               "--ca-bundle", CA, "--wheelhouse", wheels)
    sif = str(img / "cpu-torch-horovod.sif")
    image_tag = json.loads((img / "manifest.json").read_text())["image"]["tag"]
    setup_ac = time.time() - t0
    # the site without its yield setting: the same job script otherwise
    site = ac_work / "ac-busy.yaml"
    site.write_text(re.sub(r"(?m)^env: \{OMPI_MCA_mpi_yield_when_idle: \"1\"\}\n", "",
                           (ROOT / "sites" / "minicluster-apptainer.yaml").read_text())
                    .replace("name: minicluster-apptainer", "name: ac-busy"))
    busy = ac_work / "busy"
    envbuilder("build", "recipes/cpu-torch-horovod.yaml", "--site", str(site), "--no-build", "--out", str(busy))
    chown_tree(ac_work)
    t0 = time.time()
    mc = mc_work / "cpu-torch"
    envbuilder("build", "recipes/cpu-torch-horovod.yaml", "--site", "minicluster", "--no-build", "--out", str(mc))
    cache = MC / "shared" / "charliecloud"
    cache.mkdir(parents=True, exist_ok=True)
    before = set(cache.iterdir())
    directory, _ = charliecloud_dir(image_tag, cache)
    made.extend(set(cache.iterdir()) - before)       # removed at the end (main)
    setup_mc = time.time() - t0

    kinds = {"apptainer": (img, sif, True), "charliecloud": (mc, directory, False),
             "apptainer, no yield": (busy, sif, True)}
    seen: dict[str, dict[str, list[float]]] = {k: {"up": [], "init": [], "end": [], "big": [], "small": []}
                                               for k in kinds}
    for _ in range(args.repeat):
        for kind, (folder, image, apptainer) in kinds.items():
            job, t_submit, t_end = submit(folder, image, apptainer)
            recs = records(folder, job)
            s = seen[kind]
            s["up"].append(max(r["up"] for r in recs) - t_submit)
            s["init"].append(max(r["init"] for r in recs) - t_submit)
            s["end"].append(t_end - t_submit)
            s["big"].append(busbw(max(r["big_s"] for r in recs), BIG))
            s["small"].append(max(r["small_s"] for r in recs) * 1e3)

    rows = [("set-up: cached build + envbuilder's .sif (apptainer)", f"{setup_ac:.0f} s"),
            ("set-up: job folder + charliecloud directory", f"{setup_mc:.0f} s")]
    for kind in ("apptainer", "charliecloud"):
        s = seen[kind]
        rows += [(f"{kind}: submission -> all 4 ranks' Python up, s", med(s["up"])),
                 (f"{kind}: submission -> all 4 ranks past hvd.init(), s", med(s["init"])),
                 (f"{kind}: submission -> job ended (seen by polling), s", med(s["end"]))]
    for kind in ("apptainer", "apptainer, no yield", "charliecloud"):
        s = seen[kind]
        rows += [(f"{kind}: Horovod/MPI 16 MiB allreduce bus bw, MB/s", med(s["big"])),
                 (f"{kind}: Horovod/MPI 4 KiB allreduce, ms", med(s["small"]))]
    load = os.getloadavg()
    width = max(len(r[0]) for r in rows)
    print(f"{'figure (2 nodes x 2 ranks, median of ' + str(args.repeat) + ')'.ljust(width)}  value")
    for k, v in rows:
        print(f"{k.ljust(width)}  {v}")
    print(f"(machine: {os.cpu_count()} cores, load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; both clusters' "
          "nodes and daemons share them; charliecloud's site has no yield setting)")
    if args.json:
        args.json.write_text(json.dumps({"setup_s": {"apptainer": setup_ac, "charliecloud": setup_mc},
                                         "runs": seen, "repeat": args.repeat}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
