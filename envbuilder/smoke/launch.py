"""Starting a run: as child processes of this launcher (horovodrun, mpirun, torchrun, srun), or as
one task of an srun step that already started every rank (the step protocol: files in a shared
folder). Standard library only."""

import os
import subprocess
import sys
import tempfile
import time

from .common import pmi_pass_fds, rank_file, read_json
from .plan import PACKAGE, build_command, run_env, worker_args_for
from .watch import ACTIVE, GRACE_S, POLL_S, collect, read_ranks, stop_run, watch


def execute_run(run, args, expect, manifest_path, workdir):
    """Start the run, watch it, stop it on a timeout or crash. Returns (states, exits, events)."""
    run.workdir = workdir
    os.makedirs(workdir, exist_ok=True)
    events = {}   # rank -> {"kind": crash|hang|never|killed|waiting|lost, "text": ...}
    try:
        run.command = build_command(run, args, worker_args_for(run, args, manifest_path, workdir))
    except RuntimeError as exc:
        run.start_error = str(exc)
        return {}, {}, events
    env = run_env(run, args, expect)
    run.log_path = os.path.join(workdir, "run.log")
    t0 = time.time()
    with open(run.log_path, "wb") as logf:
        try:
            proc = subprocess.Popen(run.command, stdout=logf, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        except OSError as exc:
            run.start_error = "cannot start %s: %s" % (run.command[0], exc)
            return {}, {}, events
        ACTIVE.append((proc, workdir, run.ranks))
        reason = watch(run, workdir, args.timeout, lambda: proc.poll() is None, t0, events)
        reason = _let_it_exit(proc, reason)
        run.wall_s = time.time() - t0
        if proc.poll() is None:
            run.killed = reason
            stop_run(proc, *read_ranks(workdir, run.ranks))
        run.returncode = proc.returncode
        ACTIVE.remove((proc, workdir, run.ranks))
    return collect(run, workdir, events)


def _let_it_exit(proc, reason):
    """After watch() said every rank ended: give the launched process a moment to exit by itself.
    Returns the reason to stop it ('' when it exited)."""
    if reason != "all ranks ended":
        return reason
    try:
        proc.wait(timeout=GRACE_S)
        return ""
    except subprocess.TimeoutExpired:
        return "launcher did not exit after all ranks ended"


def slurm_step():
    """(rank, size) when this process is one task of a multi-task srun step, else None."""
    env = os.environ
    if "SLURM_STEP_ID" not in env or "SLURM_PROCID" not in env:
        return None
    try:
        size = int(env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS") or "1")
        rank = int(env["SLURM_PROCID"])
    except ValueError:
        return None
    return (rank, size) if size > 1 else None


def step_workdir(args):
    """A folder every task of the step computes alike (must be shared when the step spans nodes)."""
    if args.workdir:
        return args.workdir
    env = os.environ
    tag = "envbuilder-smoke-%s.%s" % (env.get("SLURM_JOB_ID", "0"), env.get("SLURM_STEP_ID", "0"))
    base = env.get("ENVBUILDER_SMOKE_WORKDIR") or env.get("OUTPUT_DIR") or tempfile.gettempdir()
    return os.path.join(base, tag)


def abort_file(workdir):
    return os.path.join(workdir, "ABORT")


def done_file(workdir):
    return os.path.join(workdir, "DONE")


def stop_file(base):
    """In the step's workdir: no later run in this step (named after the step: a reused --workdir
    holds no stale one)."""
    env = os.environ
    return os.path.join(base, "STOP-%s.%s" % (env.get("SLURM_JOB_ID", "0"), env.get("SLURM_STEP_ID", "0")))


def _stop_later_runs(workdir, reason):
    # a killed or crashed rank that had joined Slurm's PMIx (Horovod's mpi controller) makes
    # Slurm cancel the whole step soon after: rank 0 reports now instead of starting another run
    with open(stop_file(os.path.dirname(workdir)), "w") as fh:
        fh.write(reason + "\n")


def wait_for_done(workdir, wait_s):
    """A task other than 0 stays until rank 0 has read everything (bounded): a task that ends
    early can make srun/mpirun tear the step down under rank 0."""
    deadline = time.time() + wait_s
    while time.time() < deadline and os.path.isdir(workdir) and \
            not os.path.exists(done_file(workdir)):
        time.sleep(POLL_S)


def execute_in_step(run, args, expect, manifest_path, workdir, rank, extra_env=None):
    """Every srun task starts its own rank; rank 0 watches them all through the shared folder
    and, on a crash or a hang, writes ABORT, which every task obeys. extra_env: variables for
    this task's rank on top of run_env's (the gloo controller's slot, gloo_step.py)."""
    run.workdir = workdir
    os.makedirs(workdir, exist_ok=True)
    events = run.events = {}     # a report made on SIGTERM (launcher._report_on_stop) reads it too
    run.command = [sys.executable, "-m", PACKAGE + ".rank"] + worker_args_for(run, args, manifest_path,
                                                                             workdir)
    env = run_env(run, args, expect)
    env.update(extra_env or {})
    pass_fds = pmi_pass_fds()
    run.log_path = os.path.join(workdir, "rank-%d.log" % rank)
    t0 = time.time()
    with open(run.log_path, "wb") as logf:
        try:
            # same process group as this task: whatever srun does to the task reaches the rank
            proc = subprocess.Popen(run.command, stdout=logf, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=env, pass_fds=pass_fds)
        except OSError as exc:
            run.start_error = "cannot start %s: %s" % (run.command[0], exc)
            return {}, {}, events
        ACTIVE.append((proc, workdir, run.ranks))
        if rank == 0:
            # Slurm's PMIx plugin cancels the whole step about a second after a rank dies:
            # report a crash at once, before that SIGKILL arrives
            reason = watch(run, workdir, args.timeout, lambda: True, t0, events, crash_grace=0.0)
            # every rank wrote its exit record: this task's own rank may still be exiting (a
            # loaded node, the interpreter's shutdown); stopping it now would fail a run that passed
            reason = _let_it_exit(proc, reason)
            if reason.endswith("crashed"):
                run.killed = reason
                run.wall_s = time.time() - t0
                # this rank is stopped after the report is out (it stays in ACTIVE)
                out = collect(run, workdir, events, wait=0.0)
                _stop_later_runs(workdir, reason)
                for name in (abort_file(workdir), done_file(workdir)):
                    with open(name, "w") as fh:
                        fh.write(reason + "\n")
                return out
            if reason:
                run.killed = reason
                with open(abort_file(workdir), "w") as fh:
                    fh.write(reason + "\n")
        else:
            own_since = None
            while proc.poll() is None:
                time.sleep(POLL_S)
                if os.path.exists(abort_file(workdir)):
                    break
                st = read_json(rank_file(workdir, rank)) or {}
                running = st.get("running") or {}
                own_since = running.get("since")
                # rank 0 may be gone: do not wait for it forever
                if own_since and time.time() - own_since > args.timeout + 30:
                    break
        if proc.poll() is None:
            states, exits = read_ranks(workdir, run.ranks)
            stop_run(proc, {rank: states[rank]} if rank in states else {},
                     {rank: exits[rank]} if rank in exits else {})
        run.returncode = proc.returncode
        run.wall_s = time.time() - t0
        ACTIVE.remove((proc, workdir, run.ranks))
    if rank != 0:
        wait_for_done(workdir, args.timeout + 60)
        return {}, {}, events
    if run.killed:
        # the other tasks see ABORT within a poll interval; their wrappers then record the end
        deadline = time.time() + GRACE_S
        while time.time() < deadline and len(read_ranks(workdir, run.ranks)[1]) < run.ranks:
            time.sleep(0.2)
    out = collect(run, workdir, events)
    if run.killed:
        _stop_later_runs(workdir, run.killed)
    with open(done_file(workdir), "w") as fh:
        fh.write("merged\n")
    return out
