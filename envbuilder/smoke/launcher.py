"""The smoke suite's launcher: static checks here, then the per-rank worker N ways.

    python -m envbuilder_smoke --ranks 2 [--launcher auto|gloo|mpi|srun|none] [--manifest PATH]
                               [--json] [--timeout S]

For every requested Horovod controller (manifest ``expect.horovod.controllers``) and framework
binding it starts N ranks (``horovodrun --gloo`` for gloo, ``mpirun`` for mpi, ``srun`` when
asked), each through ``rank.py``, watches the per-rank files in a temporary folder, enforces a
timeout on every check (a stuck rank's process group is killed), merges the ranks' results and
names the ranks that crashed or hung. The report goes to stdout as a table, or with --json as
JSON between two marker lines. Exit status: 0 no check failed, 1 a check failed, 2 bad input.

Standard library only here (the framework is imported by the static checks, and only the
manifest's one); Python >= 3.8.
"""

import argparse
import json
import os
import platform
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from . import __version__
from .common import (BEGIN_MARKER, END_MARKER, FAIL, FAULT_ENV, GPU_LEFT_OUT, PASS, REPORT_SCHEMA, SKIP,
                     describe_exit, exit_file, format_table, rank_file, read_json, result,
                     signal_name, threads_per_rank, cpu_count, write_text_atomic)
from .static import ManifestError, framework_key, framework_module, load_manifest, run_static

DEFAULT_MANIFEST = "/opt/envbuilder/manifest.json"
POLL_S = 0.2
GRACE_S = 5.0
PACKAGE = __package__ or "envbuilder_smoke"


def log(args, text):
    if not args.quiet:
        sys.stderr.write("[smoke] %s\n" % text)
        sys.stderr.flush()


def package_root():
    """The folder that holds the suite's top-level package (put on the ranks' PYTHONPATH)."""
    here = os.path.dirname(os.path.abspath(__file__))
    depth = len(PACKAGE.split("."))
    for _ in range(depth):
        here = os.path.dirname(here)
    return here


# ----------------------------------------------------------------------------- runs

class Run(object):
    def __init__(self, controller, launcher, framework, first):
        self.controller = controller      # mpi | gloo | single
        self.launcher = launcher          # horovodrun | mpirun | srun | none
        self.framework = framework        # torch | tensorflow
        self.first = first
        self.tag = "[%s]" % controller
        self.command = []
        self.wall_s = 0.0
        self.returncode = None
        self.killed = ""
        self.start_error = ""
        self.log_path = ""
        self.workdir = ""
        self.ranks = 0


def distributed_kind(expect):
    """horovod | torch | tf-multiworker | none (older manifests: horovod when they ask for it)."""
    d = expect.get("distributed") or {}
    return d.get("kind") or ("horovod" if expect.get("horovod") else "none")


def plan_runs(expect, args):
    """(controller, launcher, framework module) for every multi-rank run, in order."""
    if distributed_kind(expect) == "torch":
        # torch.distributed: the suite's own spawner (env:// like srun), or torchrun when asked
        how = "torchrun" if args.launcher == "torchrun" else (
            "none" if args.launcher == "none" else "spawn")
        return [Run("torch", how, "torch", first=True)]
    if distributed_kind(expect) == "tf-multiworker":
        # MultiWorkerMirroredStrategy: the spawner's variables become TF_CONFIG
        return [Run("tf", "none" if args.launcher == "none" else "spawn", "tensorflow", first=True)]
    hv = expect.get("horovod")
    if not hv:
        return []
    mods = []
    for fw in hv.get("frameworks") or [framework_key(framework_module(expect) or "torch")]:
        mod = "torch" if fw in ("pytorch", "torch") else "tensorflow"
        if mod not in mods:
            mods.append(mod)
    if args.controllers:
        ctrls = [c.strip() for c in args.controllers.split(",") if c.strip()]
    else:
        ctrls = list(hv.get("controllers") or ["gloo"])
    launcher = args.launcher
    if launcher == "none":
        pairs = [("single", "none")]
    elif launcher == "gloo":
        pairs = [("gloo", "horovodrun")]
    elif launcher == "mpi":
        pairs = [("mpi", "mpirun")]
    elif launcher == "srun":
        pairs = [("mpi", "srun")]
    else:
        pairs = []
        for c in ctrls:
            if c == "gloo":
                pairs.append(("gloo", "horovodrun"))
            elif c == "mpi":
                pairs.append(("mpi", "mpirun"))
    runs = []
    for mod in mods:
        for ctrl, how in pairs:
            runs.append(Run(ctrl, how, mod, first=not runs))
    return runs


def find_horovodrun():
    cand = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    if os.access(cand, os.X_OK):
        return [cand]
    exe = shutil.which("horovodrun")
    if exe:
        return [exe]
    return [sys.executable, "-c", "import sys; from horovod.runner.launch import run_commandline; "
            "sys.argv[0] = 'horovodrun'; run_commandline()"]


def mpi_flavor():
    from .static import mpirun_version
    flavor, _version, _text, exe = mpirun_version()
    return flavor, exe


def build_command(run, args, worker_args):
    n = run.ranks
    py = [sys.executable, "-m", PACKAGE + ".rank"] + worker_args
    if run.launcher == "spawn" or (run.launcher == "none" and run.controller in ("torch", "tf")):
        return [sys.executable, "-m", PACKAGE + ".spawn", "--ranks", str(n), "--"] + py
    if run.launcher == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run"] + torchrun_args(n) + \
            ["--module", PACKAGE + ".rank"] + worker_args
    if run.launcher == "horovodrun":
        # --disable-cache: horovodrun would write ~/.horovod, read-only in many containers
        return find_horovodrun() + ["-np", str(n), "-H", "localhost:%d" % n, "--gloo", "--disable-cache"] + \
            shlex.split(args.horovodrun_args or "") + py
    if run.launcher == "mpirun":
        flavor, exe = mpi_flavor()
        if not exe:
            raise RuntimeError("mpirun not found on PATH (the mpi controller needs it)")
        cmd = [exe, "-np", str(n)]
        if flavor == "openmpi":
            cmd += ["--oversubscribe", "--bind-to", "none", "--map-by", "slot"]
            if hasattr(os, "geteuid") and os.geteuid() == 0:
                cmd.append("--allow-run-as-root")
        return cmd + shlex.split(args.mpirun_args or "") + py
    if run.launcher == "srun":
        exe = shutil.which("srun")
        if not exe:
            raise RuntimeError("srun not found on PATH")
        cmd = [exe, "-n", str(n)]
        if args.srun_mpi:
            cmd.append("--mpi=%s" % args.srun_mpi)
        return cmd + shlex.split(args.srun_args or "") + py
    return py


def torchrun_args(n):
    """torchrun's arguments: inside a Slurm job (the job script's torchrun mode, one task per
    node) the c10d rendezvous on the first node; elsewhere --standalone."""
    env = os.environ
    nodes = int(env.get("SLURM_NNODES") or env.get("SLURM_JOB_NUM_NODES") or "1")
    if env.get("SLURM_JOB_ID") and env.get("MASTER_ADDR") and env.get("MASTER_PORT"):
        per_node = max(1, n // max(1, nodes))
        return ["--nnodes=%d" % nodes, "--nproc_per_node=%d" % per_node, "--rdzv_backend=c10d",
                "--rdzv_endpoint=%s:%s" % (env["MASTER_ADDR"], env["MASTER_PORT"]),
                "--rdzv_id=%s" % env["SLURM_JOB_ID"]]
    return ["--standalone", "--nnodes=1", "--nproc_per_node=%d" % n]


def run_env(run, args, expect):
    env = dict(os.environ)
    root = package_root()
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    env["HOROVOD_TIMELINE"] = "DYNAMIC"
    env["ENVBUILDER_SMOKE_TIMEOUT"] = str(args.timeout)
    if run.controller in ("torch", "tf") and run.launcher in ("spawn", "torchrun", "none"):
        # this process's own rank variables (a surrounding srun or torchrun) must not leak
        # into the ranks it starts
        for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "ROLE_RANK",
                     "ROLE_WORLD_SIZE", "ENVBUILDER_SMOKE_RANK", "ENVBUILDER_SMOKE_SIZE"):
            env.pop(name, None)
        if run.launcher == "torchrun":
            # torchrun's ranks are told apart by its ROLE_RANK; SLURM_PROCID is the node's task
            env.pop("SLURM_PROCID", None)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    if args.threads:
        env["OMP_NUM_THREADS"] = str(args.threads)
    elif run.launcher != "srun":
        # ranks share this node: split its cores (srun: the job script sets cpus-per-task)
        env["OMP_NUM_THREADS"] = str(threads_per_rank(run.ranks))
    ops = [o for o in ((expect.get("horovod") or {}).get("operations") or []) if o in ("mpi", "gloo")]
    if run.controller in ("mpi", "gloo"):
        env["HOROVOD_CONTROLLER"] = run.controller
        if run.controller in ops:
            env["HOROVOD_CPU_OPERATIONS"] = run.controller
        elif ops:
            env["HOROVOD_CPU_OPERATIONS"] = ops[0]
    if run.launcher in ("mpirun", "none", "srun"):
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
            env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        # containers forbid the cross-memory-attach that OpenMPI's shared-memory transport tries
        env.setdefault("OMPI_MCA_btl_vader_single_copy_mechanism", "none")
        if run.ranks >= cpu_count():
            # as many ranks as cores (plus Horovod's background threads): busy-polling MPI
            # would steal the cores the ranks compute on
            env.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")
    if run.launcher == "none":
        env.setdefault("HOROVOD_RANK", "0")
        env.setdefault("HOROVOD_SIZE", "1")
        env.setdefault("HOROVOD_LOCAL_RANK", "0")
        env.setdefault("HOROVOD_LOCAL_SIZE", "1")
    return env


ACTIVE = []   # (Popen, workdir, ranks) of runs in flight: stopped if the launcher is told to stop


def _on_terminate(signum, _frame):
    """The launcher is being stopped (verify's timeout, Ctrl-C, srun tearing the step down):
    take the ranks down with it instead of leaving them orphaned."""
    for proc, workdir, ranks in list(ACTIVE):
        if proc.poll() is None:
            states, exits = read_ranks(workdir, ranks)
            stop_run(proc, states, exits, grace=1.0)
    sys.stderr.write("[smoke] stopped by %s\n" % signal_name(signum))
    os._exit(128 + signum)


def install_signal_handlers():
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        try:
            signal.signal(sig, _on_terminate)
        except (ValueError, OSError):
            pass


def _kill(pid, sig):
    try:
        os.kill(pid, sig)
    except (OSError, TypeError):
        pass


def _killpg(pgid, sig):
    try:
        os.killpg(pgid, sig)
    except OSError:
        pass


def read_ranks(workdir, n):
    states = {}
    exits = {}
    for r in range(n):
        st = read_json(rank_file(workdir, r))
        if st is not None:
            states[r] = st
        ex = read_json(exit_file(workdir, r))
        if ex is not None:
            exits[r] = ex
    return states, exits


def stop_run(proc, states, exits, grace=3.0):
    """SIGTERM the run's process group and every rank we know of, then SIGKILL."""
    here = socket.gethostname()
    pids = set()
    for r, st in states.items():
        if st.get("host") == here:      # a pid means nothing on another node
            pids.add(st.get("pid"))
    for r, ex in exits.items():
        if ex.get("host") == here:
            pids.add(ex.get("worker_pid"))
            pids.add(ex.get("wrapper_pid"))
    pids.discard(None)
    pids.add(proc.pid)
    _killpg(proc.pid, signal.SIGTERM)
    for pid in pids:
        _kill(pid, signal.SIGTERM)
    deadline = time.time() + grace
    while time.time() < deadline and proc.poll() is None:
        time.sleep(0.1)
    _killpg(proc.pid, signal.SIGKILL)
    for pid in pids:
        _kill(pid, signal.SIGKILL)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def worker_args_for(run, args, manifest_path, workdir):
    wa = ["--workdir", workdir, "--manifest", manifest_path, "--controller", run.controller,
          "--framework", run.framework, "--ranks", str(run.ranks)]
    if run.first:
        wa.append("--first")
    if args.require_gpu:
        wa.append("--require-gpu")
    if args.no_gpu:
        wa.append("--no-gpu")
    return wa


def watch(run, workdir, timeout, launcher_alive, t0, events, crash_grace=GRACE_S):
    """Poll the rank files until every rank ended, a rank crashed, or a check ran past TIMEOUT.
    Returns the reason to stop the run ('' when it ended by itself)."""
    crash_seen_at = None
    while True:
        time.sleep(POLL_S)
        states, exits = read_ranks(workdir, run.ranks)
        now = time.time()
        if not launcher_alive():
            return ""
        if len(exits) == run.ranks:
            return "all ranks ended"
        crashed = [r for r, ex in exits.items() if ex.get("returncode") and not ex.get("terminated")]
        if crashed and crash_seen_at is None:
            crash_seen_at = now
        if crash_seen_at is not None and now - crash_seen_at >= crash_grace:
            return "rank %s crashed" % ",".join(str(r) for r in crashed)
        stuck = []
        for r in range(run.ranks):
            st = states.get(r)
            if r in exits:
                continue
            if st is None:
                if now - t0 > timeout:
                    events[r] = {"kind": "never", "text": "rank %d never started (no report "
                                 "after %.0f s)" % (r, now - t0)}
                    stuck.append(r)
                continue
            running = st.get("running")
            if running and now - running.get("since", now) > timeout:
                stuck.append(r)
        if stuck:
            _mark_hung(run, states, exits, events, stuck, timeout)
            return "timeout"


def collect(run, workdir, events, wait=2.0):
    """The wrappers write their exit records as they go down: wait a little for them."""
    deadline = time.time() + wait
    while time.time() < deadline:
        states, exits = read_ranks(workdir, run.ranks)
        if all(r in exits or (states.get(r) or {}).get("done") for r in range(run.ranks)):
            break
        time.sleep(0.1)
    states, exits = read_ranks(workdir, run.ranks)
    _mark_crashes(run, states, exits, events)
    return states, exits, events


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
        if reason == "all ranks ended":
            # give the launcher a moment to exit by itself
            try:
                proc.wait(timeout=GRACE_S)
                reason = ""
            except subprocess.TimeoutExpired:
                reason = "launcher did not exit after all ranks ended"
        run.wall_s = time.time() - t0
        if proc.poll() is None:
            run.killed = reason
            stop_run(proc, *read_ranks(workdir, run.ranks))
        run.returncode = proc.returncode
        ACTIVE.remove((proc, workdir, run.ranks))
    return collect(run, workdir, events)


# ----------------------------------------------------------------------------- inside srun

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


def execute_in_step(run, args, expect, manifest_path, workdir, rank):
    """Every srun task starts its own rank; rank 0 watches them all through the shared folder
    and, on a crash or a hang, writes ABORT, which every task obeys."""
    run.workdir = workdir
    os.makedirs(workdir, exist_ok=True)
    events = {}
    run.command = [sys.executable, "-m", PACKAGE + ".rank"] + worker_args_for(run, args, manifest_path,
                                                                             workdir)
    env = run_env(run, args, expect)
    pass_fds = tuple(int(os.environ[v]) for v in ("PMI_FD", "PMI_CMD_FD")
                     if os.environ.get(v, "").isdigit())
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
            if reason.endswith("crashed"):
                run.killed = reason
                run.wall_s = time.time() - t0
                # this rank is stopped after the report is out (it stays in ACTIVE)
                out = collect(run, workdir, events, wait=0.0)
                for name in (abort_file(workdir), done_file(workdir)):
                    with open(name, "w") as fh:
                        fh.write(reason + "\n")
                return out
            if reason and reason != "all ranks ended":
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
        # stay until rank 0 has read everything: a task that ends early can make srun/mpirun
        # tear the step down under rank 0
        deadline = time.time() + args.timeout + 60
        while time.time() < deadline and os.path.isdir(workdir) and \
                not os.path.exists(done_file(workdir)):
            time.sleep(POLL_S)
        return {}, {}, events
    if run.killed:
        # the other tasks see ABORT within a poll interval; their wrappers then record the end
        deadline = time.time() + GRACE_S
        while time.time() < deadline and len(read_ranks(workdir, run.ranks)[1]) < run.ranks:
            time.sleep(0.2)
    out = collect(run, workdir, events)
    with open(done_file(workdir), "w") as fh:
        fh.write("merged\n")
    return out


def _mark_hung(run, states, exits, events, stuck, timeout):
    """Name the ranks that stopped making progress: the ones behind the others."""
    seqs = {r: (states.get(r) or {}).get("seq", -1) for r in stuck if states.get(r)}
    low = min(seqs.values()) if seqs else None
    high = max(seqs.values()) if seqs else None
    for r in stuck:
        st = states.get(r)
        if st is None:
            continue
        running = st.get("running") or {}
        where = "'%s' at '%s'" % (running.get("check"), running.get("phase"))
        if low is not None and low != high and seqs.get(r) != low:
            events[r] = {"kind": "waiting", "text": "rank %d waiting in %s for the stuck rank(s)" % (
                r, where)}
        else:
            events[r] = {"kind": "hang", "text": "rank %d hung: no progress for %.0f s in %s "
                         "(timeout %.0f s)" % (r, time.time() - running.get("since", time.time()),
                                               where, timeout)}
    # ranks that are done or not stuck but still running are victims of the stop
    for r in range(run.ranks):
        if r not in events and not (states.get(r) or {}).get("done") and r not in exits:
            st = states.get(r) or {}
            running = st.get("running") or {}
            if running:
                events[r] = {"kind": "waiting", "text": "rank %d stopped in '%s' at '%s' when the "
                             "run was killed" % (r, running.get("check"), running.get("phase"))}


def _mark_crashes(run, states, exits, events):
    for r in range(run.ranks):
        if r in events:
            continue
        st = states.get(r)
        ex = exits.get(r)
        if st and st.get("done"):
            continue
        running = (st or {}).get("running") or {}
        where = ("during '%s' at '%s'" % (running.get("check"), running.get("phase"))) if running \
            else "before reporting"
        if ex and ex.get("returncode") and not ex.get("terminated"):
            events[r] = {"kind": "crash", "text": "rank %d crashed (%s) %s" % (r, ex.get("how"), where),
                         "at": ex.get("ended")}
        elif ex and ex.get("terminated"):
            events[r] = {"kind": "killed", "text": "rank %d was stopped by the launcher (%s) %s" % (
                r, ", ".join(signal_name(s) for s in ex.get("signals_received") or []), where)}
        elif st is None:
            events[r] = {"kind": "never", "text": "rank %d never started" % r}
        elif run.killed and running:
            events[r] = {"kind": "waiting", "text": "rank %d was still %s when the run was stopped "
                         "(%s)" % (r, where, run.killed)}
        else:
            events[r] = {"kind": "lost", "text": "rank %d ended without a report (%s) %s" % (
                r, "run " + (run.killed or describe_exit(run.returncode)), where)}


# ----------------------------------------------------------------------------- merging

def merge_run(run, states, exits, events):
    """One list of checks for this run, every rank's result folded in."""
    from .worker import plan
    names = list(plan(run.framework, run.controller, run.first))
    per_name = {}
    for r in range(run.ranks):
        for res in (states.get(r) or {}).get("results", []):
            per_name.setdefault(res["name"], {})[r] = res
            if res["name"] not in names:
                names.append(res["name"])
    failures = [e for e in events.values() if e["kind"] in ("crash", "hang", "never")] or \
        [e for e in events.values() if e["kind"] in ("lost", "killed", "waiting")]
    first_failure = sorted(failures, key=lambda e: e.get("at") or 0)[0]["text"] if failures else ""
    out = []
    for name in names:
        got = per_name.get(name, {})
        missing = [r for r in range(run.ranks) if r not in got]
        if not missing:
            out.append(_fold(name, got))
            continue
        culprits = []
        figure = []
        order = {"crash": 0, "hang": 0, "never": 0, "lost": 1}
        missing.sort(key=lambda r: (order.get(events.get(r, {}).get("kind"), 2), r))
        for r in missing:
            st = states.get(r) or {}
            running = (st.get("running") or {}).get("check")
            if running and (running == name or _same_step(running, name)):
                ev = events.get(r, {})
                culprits.append(ev.get("text") or "rank %d stopped in this check" % r)
                word = {"hang": "hung", "crash": "crashed", "never": "never started"}.get(ev.get("kind"))
                if word:
                    figure.append("rank %d %s" % (r, word))
        if culprits:
            detail = "; ".join(culprits)
            res = result(name, FAIL, detail, ", ".join(figure) or "rank %s stopped" % ",".join(
                str(r) for r in missing))
        elif got and not first_failure:
            res = _fold(name, got)
            res["status"] = FAIL
            res["detail"] = "rank %s did not report (run ended early)" % ",".join(str(r) for r in missing)
        elif got:
            # the other ranks went on after a peer died: their errors are consequences
            res = result(name, SKIP, "not run on rank %s: %s" % (
                ",".join(str(r) for r in missing), first_failure))
        else:
            why = first_failure or run.start_error
            if not why:
                parent = _parent_failure(name, out) or _fatal_failure(out)
                why = ("%s failed" % parent) if parent else "the run ended early"
            res = result(name, SKIP, "not run: %s" % why)
        res["ranks"] = {str(r): _brief(got[r]) for r in sorted(got)}
        out.append(res)
    return out


def _fatal_failure(merged):
    """The failed check after which the ranks stopped (Horovod never started, or went down)."""
    for c in merged:
        if c["status"] != FAIL:
            continue
        fatal = any(((r.get("data") or {}).get("fatal")) for r in (c.get("ranks") or {}).values())
        if fatal or c["name"].startswith("horovod.init"):
            return c["name"]
    return None


def _parent_failure(name, merged):
    """A check that reports several results ran under its first name: if that one failed
    with an error, the others never came."""
    tag = name.split("[")[-1]
    for c in merged:
        if c["status"] == FAIL and c["name"].split("[")[-1] == tag and _same_step(c["name"], name):
            return c["name"]
    return None


def _same_step(running, name):
    """A check that reports several results runs under its first name."""
    if running.startswith("train.") and name.startswith("perf.step."):
        return running.split("[")[-1] == name.split("[")[-1]
    if running.startswith("gpu.devices") and name.startswith("gpu."):
        return running.split("[")[-1] == name.split("[")[-1]
    return False


def _brief(res):
    out = {"status": res.get("status"), "figure": res.get("figure", "")}
    if res.get("data") is not None:
        out["data"] = res["data"]
    if res.get("phases"):
        out["phases"] = res["phases"]
    if res.get("status") == FAIL:
        out["detail"] = res.get("detail", "")
    return out


def _fold(name, got):
    ranks = sorted(got)
    r0 = got[ranks[0]]
    statuses = [got[r]["status"] for r in ranks]
    if FAIL in statuses:
        status = FAIL
        bad = [r for r in ranks if got[r]["status"] == FAIL]
        details = set(got[r].get("detail", "") for r in bad)
        if len(details) == 1 and len(bad) == len(ranks):
            detail = "all ranks: %s" % details.pop()
        else:
            detail = "; ".join("rank %d: %s" % (r, got[r].get("detail", "")) for r in bad)
    elif PASS in statuses:
        status = PASS
        detail = r0.get("detail", "")
    else:
        status = SKIP
        detail = r0.get("detail", "")
    res = result(name, status, detail, r0.get("figure", ""))
    secs = [got[r].get("seconds") for r in ranks if got[r].get("seconds") is not None]
    if secs:
        res["seconds"] = max(secs)
    res["ranks"] = {str(r): _brief(got[r]) for r in ranks}
    return res


def launch_check(run, events, log_tail=True):
    name = "launch.%s%s" % (framework_key(run.framework), run.tag)
    cmd = " ".join(shlex.quote(c) for c in run.command)
    if run.start_error:
        return result(name, FAIL, run.start_error, "not started")
    figure = "%.1f s wall, %d rank%s" % (run.wall_s, run.ranks, "" if run.ranks == 1 else "s")
    data = {"command": run.command, "returncode": run.returncode, "wall_s": round(run.wall_s, 2),
            "killed": run.killed, "log": run.log_path}
    bad = [e["text"] for e in events.values() if e["kind"] in ("crash", "hang", "never", "lost")]
    if bad or run.killed or run.returncode not in (0, None):
        tail = _log_tail(run.log_path) if log_tail else "(see %s)" % run.log_path
        why = "; ".join(bad) or run.killed or ("launcher %s" % describe_exit(run.returncode))
        data["log_tail"] = tail
        return result(name, FAIL, "%s\ncommand: %s\nlog tail:\n%s" % (why, cmd, tail), figure, data)
    return result(name, PASS, cmd, figure, data)


def _log_tail(path, lines=10):
    try:
        with open(path, "rb") as fh:
            fh.seek(0, 2)
            fh.seek(max(0, fh.tell() - 16384))
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def operations_check(expect, checks):
    """Every requested tensor operation is built and was used (timeline evidence)."""
    hv = expect.get("horovod") or {}
    want = hv.get("operations") or []
    if not want:
        return None
    build = next((c for c in checks if c["name"] == "horovod.build"), None)
    flags = ((((build or {}).get("ranks") or {}).get("0") or {}).get("data") or {}).get("flags") or {}
    used = set()
    for c in checks:
        if c["name"].startswith("horovod.cpu_ops") and c["status"] == PASS:
            used.update(((((c.get("ranks") or {}).get("0") or {}).get("data") or {}).get("used")) or [])
        if c["name"].startswith("gpu.nccl_allreduce") and c["status"] == PASS:
            used.add("nccl")
    gpu_skipped = any(c["name"].startswith("gpu.nccl_allreduce") and c["status"] == SKIP for c in checks)
    ran = set(c["name"].split("[")[-1].rstrip("]") for c in checks
              if c["name"].startswith("horovod.init[") and c["status"] == PASS)
    problems, notes = [], []
    for op in want:
        built = flags.get("%s_built" % op)
        if not build:
            problems.append("%s: build flags unknown (horovod.build did not run)" % op)
        elif not built:
            problems.append("%s not built" % op)
        elif op in used:
            notes.append("%s built and used" % op)
        elif op == "nccl" and gpu_skipped:
            notes.append("nccl built; not exercised: no GPU")
        elif op in ("mpi", "gloo") and op not in ran:
            notes.append("%s built; not exercised: no run used the %s controller" % (op, op))
        else:
            problems.append("%s built but no allreduce was carried by it" % op)
    if problems:
        return result("horovod.operations", FAIL, "; ".join(problems + notes), "%d problem(s)" % len(problems))
    return result("horovod.operations", PASS, "; ".join(notes), ", ".join(want))


# ----------------------------------------------------------------------------- main

def build_parser():
    p = argparse.ArgumentParser(prog="python -m envbuilder_smoke",
                                description="envbuilder's in-image smoke suite")
    p.add_argument("--ranks", type=int, default=2, help="Horovod ranks per run (default 2)")
    p.add_argument("--launcher", default="auto",
                   choices=("auto", "gloo", "mpi", "srun", "torchrun", "none"),
                   help="auto: horovodrun --gloo for the gloo controller and mpirun for mpi; "
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


def emit(report, args):
    text = json.dumps(report, indent=1, sort_keys=False, default=str)
    if args.report:
        write_text_atomic(args.report, text + "\n")
    table = format_table(report["checks"])
    summary = "%d passed, %d failed, %d skipped in %.1f s" % (
        report["summary"]["pass"], report["summary"]["fail"], report["summary"]["skip"], report["wall_s"])
    if report.get("gpu_checks") == "left out":
        summary += "; " + GPU_LEFT_OUT
    if args.json:
        sys.stdout.write("\n%s\n%s\n%s\n" % (BEGIN_MARKER, text, END_MARKER))
        sys.stdout.flush()
        if not args.quiet:
            sys.stderr.write("[smoke] %s\n" % summary)
    else:
        sys.stdout.write(table + "\n" + summary + "\n")
    sys.stdout.flush()


def main_in_step(args, manifest, manifest_path, step, t_start):
    """One task of `srun -n N ... python -m envbuilder_smoke`: be one rank; rank 0 reports."""
    rank, size = step
    expect = manifest["expect"]
    if rank != 0:
        args.quiet = True
    checks = []
    if rank == 0 and not args.skip_static:
        log(args, "static checks (imports %s)" % (framework_module(expect) or "no framework"))
        checks.extend(run_static(expect, args.no_gpu))
    args.launcher = "srun"
    runs = plan_runs(expect, args)
    base = step_workdir(args)
    run_records = []
    if not runs:
        checks.append(no_runs_result(expect))
    hv = expect.get("horovod") or {}
    if runs and runs[0].controller not in ("torch", "tf") and "mpi" not in (hv.get("controllers") or ["mpi"]):
        checks.append(result("launch", FAIL, "inside srun the ranks need Horovod's mpi controller; "
                             "the manifest builds only %s" % ", ".join(hv.get("controllers") or [])))
        runs = []
    for i, run in enumerate(runs):
        run.ranks = size
        run.launcher = "srun-step"
        wd = os.path.join(base, "run%d-%s-%s" % (i, run.framework, run.controller))
        log(args, "run %d/%d: %s, rank %d of %d in this srun step" % (i + 1, len(runs), run.framework,
                                                                     rank, size))
        states, exits, events = execute_in_step(run, args, expect, manifest_path, wd, rank)
        if rank == 0:
            checks.append(launch_check(run, events, log_tail=not run.killed.endswith("crashed")))
            checks.extend(merge_run(run, states, exits, events))
            run_records.append({"framework": run.framework, "controller": run.controller,
                                "launcher": run.launcher, "ranks": run.ranks, "workdir": wd,
                                "wall_s": round(run.wall_s, 2), "returncode": run.returncode,
                                "killed": run.killed,
                                "events": {str(k): v for k, v in events.items()}})
            if run.killed.endswith("crashed"):
                # the step is being torn down: report now, try nothing more
                code = finish(args, manifest, manifest_path, checks, run_records, t_start,
                              launcher="srun (in step, %d tasks)" % size, ranks=size, workdir=wd)
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
    if not args.keep and not args.workdir:
        shutil.rmtree(base, ignore_errors=True)
    return finish(args, manifest, manifest_path, checks, run_records, t_start,
                  launcher="srun (in step, %d tasks)" % size, ranks=size, workdir=base)


def gpu_checks_state(expect, checks):
    """'ran', 'left out' (--no-gpu without a GPU), 'failed: no GPU', or None for a CPU image."""
    if not expect.get("gpu"):
        return None
    gpu = [c for c in checks if c["name"].startswith("gpu.")]
    if any(c["status"] == PASS for c in gpu):
        return "ran"
    if any("left out (--no-gpu)" in c.get("detail", "") for c in gpu):
        return "left out"
    return "not run: no GPU visible"


def no_runs_result(expect):
    kind = distributed_kind(expect)
    if "distributed" in expect:
        return result("distributed", SKIP, "the manifest asks for no multi-rank framework "
                      "(distributed: none): no multi-rank checks")
    return result("horovod", SKIP, "the manifest asks for no Horovod: no multi-rank checks")


def finish(args, manifest, manifest_path, checks, run_records, t_start, launcher, ranks, workdir):
    summary = {s: sum(1 for c in checks if c["status"] == s) for s in (PASS, FAIL, SKIP)}
    report = {
        "schema": REPORT_SCHEMA,
        "suite_version": __version__,
        "manifest": {"path": manifest_path, "name": manifest.get("name")},
        "host": socket.gethostname(),
        "python": sys.executable,
        "platform": platform.platform(),
        "ranks": ranks,
        "launcher": launcher,
        "fault": os.environ.get(FAULT_ENV) or None,
        "workdir": workdir,
        "runs": run_records,
        "started": t_start,
        "wall_s": round(time.time() - t_start, 2),
        "ok": summary[FAIL] == 0,
        "summary": summary,
        "gpu_checks": gpu_checks_state(manifest["expect"], checks),
        "checks": checks,
    }
    emit(report, args)
    return 0 if report["ok"] else 1


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
        if args.launcher == "torchrun" and os.environ.get("SLURM_NODEID", "0") not in ("", "0"):
            # torchrun mode, one task per node: the first node's launcher reports for all ranks
            return 0 if all(r["returncode"] in (0, None) for r in run_records) else 1
    finally:
        if own_workdir and not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    return finish(args, manifest, manifest_path, checks, run_records, t_start, launcher=args.launcher,
                  ranks=args.ranks, workdir=base if (args.keep or not own_workdir) else None)
