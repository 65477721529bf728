"""The smoke suite's launcher: static checks here, then the per-rank worker N ways.

    python -m envbuilder_smoke --ranks 2 [--launcher auto|gloo|mpi|srun|none] [--manifest PATH]
                               [--json] [--timeout S]

For every requested Horovod controller (manifest ``expect.horovod.controllers``) and framework
binding it starts N ranks (Horovod's own rendezvous server started by ``gloo_local.py`` for
gloo, or ``horovodrun --gloo`` with ``--launcher gloo``; ``mpirun`` for mpi, ``srun`` when
asked), each through ``rank.py``, watches the per-rank files in a temporary folder, enforces a
timeout on every check (a stuck rank's process group is killed), merges the ranks' results and
names the ranks that crashed or hung. The report goes to stdout as a table, or with --json as
JSON between two marker lines. Exit status: 0 no check failed, 1 a check failed, 2 bad input.

Standard library only here (the framework is imported by the static checks, and only the
manifest's one); Python >= 3.8.
"""

import argparse
import os
import shutil
import sys
import tempfile
import time

from .common import FAIL, SKIP, result
from .static import ManifestError, framework_module, load_manifest, run_static
from .gloo_step import GlooStepError, StepRendezvous
from .launch import (execute_in_step, execute_run, slurm_step, step_workdir, stop_file,
                     wait_for_done)
from .fabric import floor_checks, judge as fabric_check
from .merge import launch_check, launch_name, merge_run, operations_check
from .mpi_library import SITE_ENV as SITE_MPI_ENV
from .mpi_library import collect as collect_mpi, merge as merge_mpi, write_record as write_mpi_record
from . import mpi_probe
from .plan import PACKAGE, log, plan_runs
from .report import finish, no_runs_result
from .watch import ACTIVE, LAST_WORDS, collect, install_signal_handlers, read_ranks, stop_run


DEFAULT_MANIFEST = "/opt/envbuilder/manifest.json"


def build_parser():
    p = argparse.ArgumentParser(prog="python -m envbuilder_smoke",
                                description="envbuilder's in-image smoke suite")
    p.add_argument("--ranks", type=int, default=2, help="Horovod ranks per run (default 2)")
    p.add_argument("--launcher", default="auto",
                   choices=("auto", "gloo", "mpi", "srun", "torchrun", "none"),
                   help="auto: Horovod's gloo rendezvous started by the suite (gloo_local) for the gloo controller and mpirun for mpi; gloo: horovodrun --gloo; "
                        "torch.distributed: the suite's own spawner (env://); torchrun: torchrun "
                        "(c10d rendezvous on the first node inside a Slurm job); "
                        "none: one process, no launcher")
    p.add_argument("--controllers", default="",
                   help="comma list overriding the manifest's horovod.controllers (auto launcher)")
    p.add_argument("--manifest", default=None, help="manifest.json (default %s)" % DEFAULT_MANIFEST)
    p.add_argument("--json", action="store_true", help="print the JSON report between marker lines")
    p.add_argument("--report", default=None, help="also write the JSON report to this file")
    p.add_argument("--timeout", type=float, default=120.0,
                   help="seconds any one check may take on any rank (default 120)")
    p.add_argument("--threads", type=int, default=0, help="threads per rank (default cores/ranks)")
    p.add_argument("--workdir", default=None, help="folder for the ranks' files (default: temporary)")
    p.add_argument("--keep", action="store_true", help="keep the ranks' files and logs")
    p.add_argument("--require-gpu", action="store_true", help=argparse.SUPPRESS)   # the default now
    p.add_argument("--no-gpu", action="store_true",
                   help="leave the GPU checks out when no GPU is visible (the report says so); "
                        "without it they fail on a GPU image")
    p.add_argument("--skip-static", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--mpirun-args", default="", help="extra mpirun arguments")
    p.add_argument("--horovodrun-args", default="", help="extra horovodrun arguments")
    p.add_argument("--srun-args", default="", help="extra srun arguments")
    p.add_argument("--srun-mpi", default="pmix", help="srun --mpi= plugin (default pmix; '' for none)")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    return p


def main_in_step(args, manifest, manifest_path, step, t_start):
    """One task of `srun -n N ... python -m envbuilder_smoke`: be one rank; rank 0 reports.

    Horovod's mpi controller needs nothing more than the step (PMI/PMIx). For its gloo
    controller this task does what horovodrun --gloo does without ssh (gloo_step.py): task 0
    starts Horovod's rendezvous server with the slot plan the tasks publish in the shared
    workdir, every task gives its rank that slot's HOROVOD_* variables, task 0 stops the server
    when the run ends."""
    rank, size = step
    expect = manifest["expect"]
    if rank != 0:
        args.quiet = True
    checks = []
    if rank == 0 and not args.skip_static:
        log(args, "static checks (imports %s)" % (framework_module(expect) or "no framework"))
        checks.extend(run_static(expect, args.no_gpu))
    args.launcher = "srun"
    runs = plan_runs(expect, args, in_step=True)
    base = step_workdir(args)
    if expect.get("mpi"):
        # every task: which libmpi its process loads (mpi_library.py); rank 0 merges them
        mwd = os.path.join(base, "mpi-library")
        write_mpi_record(mwd, rank, expect["mpi"])
        if rank == 0:
            records = collect_mpi(mwd, size, wait_s=args.timeout)
            checks.append(merge_mpi(records, size, expect["mpi"], os.environ.get(SITE_MPI_ENV) or None))
    if mpi_probe.wanted(expect, runs):
        # no run here initialises MPI: an mpi4py allreduce across the tasks does (mpi_probe.py)
        pwd = os.path.join(base, "mpi-probe")
        if rank == 0:
            log(args, "MPI allreduce through mpi4py across the %d tasks" % size)
        mpi_probe.run_in_task(PACKAGE, pwd, rank, args.timeout)
        if rank == 0:
            checks.extend(mpi_probe.merge(mpi_probe.collect(pwd, size, wait_s=args.timeout), size, expect["mpi"],
                                          os.environ.get(SITE_MPI_ENV) or None))
    run_records = []
    current = {"run": None, "t0": 0.0, "next": 0, "reported": False}
    if rank == 0:
        LAST_WORDS.append(lambda signame: _report_on_stop(signame, args, manifest, manifest_path, checks,
                                                          run_records, runs, current, t_start, size, base))
    if not runs:
        checks.append(no_runs_result(expect))
    hv = expect.get("horovod") or {}
    built = hv.get("controllers") or ["mpi"]
    if runs and runs[0].controller not in ("torch", "tf") and not ({"mpi", "gloo"} & set(built)):
        checks.append(result("launch", FAIL, "inside srun the ranks need Horovod's mpi or gloo "
                             "controller; the manifest builds only %s" % ", ".join(built)))
        runs = []
    for i, run in enumerate(runs):
        current["next"] = i + 1
        run.ranks = size
        run.launcher = "srun-step"
        wd = os.path.join(base, "run%d-%s-%s" % (i, run.framework, run.controller))
        if os.path.exists(stop_file(base)):
            # an earlier run in this step was killed: Slurm may cancel the step any moment
            if rank == 0:
                checks.append(result(launch_name(run), SKIP,
                                     "not run: an earlier run in this srun step was stopped (%s); "
                                     "Slurm's PMIx cancels a step after a killed MPI rank"
                                     % open(stop_file(base)).read().strip()))
            continue
        log(args, "run %d/%d: %s, rank %d of %d in this srun step" % (i + 1, len(runs), run.framework,
                                                                     rank, size))
        rdv = None
        try:
            extra = None
            if run.controller == "gloo":
                rdv = StepRendezvous(os.path.join(wd, "gloo"), rank, size, args.timeout)
                # the first run's task 0 does the static checks (imports) before it gets here
                wait_s = args.timeout + 60 + (2 * args.timeout if run.first else 0)
                try:
                    extra = rdv.setup(wait_s)
                    if rank == 0:
                        log(args, "gloo in the step: %s" % rdv.describe())
                except GlooStepError as exc:
                    run.start_error = "gloo rendezvous in the srun step: %s" % exc
            if run.start_error:
                states, exits, events = {}, {}, {}
                if rank != 0:
                    if "task 0 could not" not in run.start_error:
                        wait_for_done(wd, args.timeout + 60)   # rank 0 names this rank as never started
                    continue
            else:
                current.update(run=run, t0=time.time())
                states, exits, events = execute_in_step(run, args, expect, manifest_path, wd, rank,
                                                        extra_env=extra)
        finally:
            if rdv is not None:
                rdv.stop()
        if rank == 0:
            checks.extend([launch_check(run, events, log_tail=not run.killed.endswith("crashed"))]
                          + merge_run(run, states, exits, events))
            current["run"] = None
            run_records.append(_run_record(run, wd, events))
            if rdv is not None and rdv.info.get("slots"):
                run_records[-1]["rendezvous"] = rdv.describe()
            if run.killed.endswith("crashed"):
                # the step is being torn down: report now, try nothing more
                code = finish(args, manifest, manifest_path, checks, run_records, t_start,
                              launcher="srun (in step, %d tasks)" % size, ranks=size, workdir=wd)
                current["reported"] = True
                for proc, pwd, _n in list(ACTIVE):
                    if proc.poll() is None:
                        st, ex = read_ranks(pwd, size)
                        stop_run(proc, {0: st[0]} if 0 in st else {}, {}, grace=1.0)
                if not args.keep and not args.workdir:
                    shutil.rmtree(base, ignore_errors=True)
                return code
    if rank != 0:
        return 0
    ops = operations_check(expect, checks)
    if ops is not None:
        checks.append(ops)
    add_fabric_checks(checks)
    if not args.keep and not args.workdir:
        shutil.rmtree(base, ignore_errors=True)
    code = finish(args, manifest, manifest_path, checks, run_records, t_start,
                  launcher="srun (in step, %d tasks)" % size, ranks=size, workdir=base)
    current["reported"] = True
    return code


def _report_on_stop(signame, args, manifest, manifest_path, checks, run_records, runs, current, t_start,
                    size, base):
    """Rank 0 of an srun step told to stop (Slurm cancels a step soon after a killed MPI rank; the
    job's time limit; scancel): the report of what ran so far, the run in flight named as stopped
    where its ranks were, the runs not started skipped. Without it verify could only say that the
    job ended without a report."""
    if current["reported"]:
        return
    current["reported"] = True
    why = "the srun step was stopped by %s (Slurm stops a step after a killed MPI rank, at the " \
          "job's time limit, or on scancel)" % signame
    out = list(checks)
    run = current["run"]
    if run is not None and not any(c["name"] == launch_name(run) for c in out):
        run.killed = run.killed or why
        run.wall_s = run.wall_s or (time.time() - current["t0"])
        states, exits, events = collect(run, run.workdir, dict(run.events), wait=0.0)
        out.append(launch_check(run, events, log_tail=False))
        out.extend(merge_run(run, states, exits, events))
        run_records.append(_run_record(run, run.workdir, events))
    for later in runs[current["next"]:]:
        out.append(result(launch_name(later), SKIP, "not run: %s" % why))
    finish(args, manifest, manifest_path, out, run_records, t_start,
           launcher="srun (in step, %d tasks)" % size, ranks=size, workdir=base)


def _run_record(run, workdir, events):
    """A run of an srun step as the report's `runs` lists it."""
    return {"framework": run.framework, "controller": run.controller, "launcher": run.launcher,
            "ranks": run.ranks, "workdir": workdir, "wall_s": round(run.wall_s, 2),
            "returncode": run.returncode, "killed": run.killed,
            "events": {str(k): v for k, v in events.items()}}


def add_fabric_checks(checks):
    """The site's promises (job.sbatch's ENVBUILDER_FABRIC, ENVBUILDER_BANDWIDTH_FLOOR): the
    `fabric` check and a `perf.floor[...]` per measured allreduce that has a floor."""
    fab = fabric_check(checks)
    floors = floor_checks(checks)
    if fab is not None:
        checks.append(fab)
    checks.extend(floors)


def main(argv=None):
    args = build_parser().parse_args(argv)
    t_start = time.time()
    install_signal_handlers()
    manifest_path = args.manifest or (DEFAULT_MANIFEST if os.path.exists(DEFAULT_MANIFEST) else None)
    try:
        manifest = load_manifest(manifest_path)
    except ManifestError as exc:
        sys.stderr.write("envbuilder smoke: %s\n" % exc)
        return 2
    if args.ranks < 1:
        sys.stderr.write("envbuilder smoke: --ranks must be >= 1\n")
        return 2
    manifest_path = os.path.abspath(manifest_path)
    expect = manifest["expect"]
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # TensorFlow's INFO lines are noise here
    step = slurm_step() if args.launcher in ("srun", "auto") else None
    if step:
        return main_in_step(args, manifest, manifest_path, step, t_start)
    checks = []
    if not args.skip_static:
        log(args, "static checks (imports %s)" % (framework_module(expect) or "no framework"))
        checks.extend(run_static(expect, args.no_gpu))
    runs = plan_runs(expect, args)
    if not runs:
        checks.append(no_runs_result(expect))
    own_workdir = args.workdir is None
    base = args.workdir or tempfile.mkdtemp(prefix="envbuilder-smoke-")
    run_records = []
    try:
        for i, run in enumerate(runs):
            run.ranks = 1 if run.launcher == "none" else args.ranks
            wd = os.path.join(base, "run%d-%s-%s" % (i, run.framework, run.controller))
            log(args, "run %d/%d: %s, %d rank(s) via %s" % (i + 1, len(runs), run.framework, run.ranks,
                                                             run.launcher))
            states, exits, events = execute_run(run, args, expect, manifest_path, wd)
            checks.append(launch_check(run, events))
            checks.extend(merge_run(run, states, exits, events))
            run_records.append({"framework": run.framework, "controller": run.controller,
                                "launcher": run.launcher, "ranks": run.ranks,
                                "command": run.command, "wall_s": round(run.wall_s, 2),
                                "returncode": run.returncode, "killed": run.killed,
                                "events": {str(k): v for k, v in events.items()}})
            log(args, "run %d/%d done in %.1f s" % (i + 1, len(runs), run.wall_s))
        ops = operations_check(expect, checks)
        if ops is not None:
            checks.append(ops)
        add_fabric_checks(checks)
        if args.launcher == "torchrun" and os.environ.get("SLURM_NODEID", "0") not in ("", "0"):
            # torchrun mode, one task per node: the first node's launcher reports for all ranks
            return 0 if all(r["returncode"] in (0, None) for r in run_records) else 1
    finally:
        if own_workdir and not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    return finish(args, manifest, manifest_path, checks, run_records, t_start, launcher=args.launcher,
                  ranks=args.ranks, workdir=base if (args.keep or not own_workdir) else None)
