"""Watching a run: the per-rank state files, the per-check timeout, stopping a stuck or crashed
run's process group, and the signals that stop the launcher. Standard library only."""

import os
import signal
import socket
import subprocess
import sys
import time

from .common import describe_exit, exit_file, rank_file, read_json, signal_name


POLL_S = 0.2


GRACE_S = 5.0


ACTIVE = []   # (Popen, workdir, ranks) of runs in flight: stopped if the launcher is told to stop

LAST_WORDS = []   # callables(signal name) run once the ranks are down: a report of what ran so far

_STOPPING = []


def _on_terminate(signum, _frame):
    """The launcher is being stopped (verify's timeout, Ctrl-C, srun tearing the step down):
    take the ranks down with it instead of leaving them orphaned, then say what ran (LAST_WORDS:
    the in-step rank 0 writes its report, so a step Slurm cancels still tells where it was)."""
    if _STOPPING:        # a second signal while the first is handled
        return
    _STOPPING.append(signum)
    for proc, workdir, ranks in list(ACTIVE):
        if proc.poll() is None:
            states, exits = read_ranks(workdir, ranks)
            stop_run(proc, states, exits, grace=1.0)
    for words in list(LAST_WORDS):
        try:
            words(signal_name(signum))
        except Exception as exc:   # the exit below must happen whatever the report does
            sys.stderr.write("[smoke] no report on %s: %s\n" % (signal_name(signum), exc))
    sys.stderr.write("[smoke] stopped by %s\n" % signal_name(signum))
    sys.stderr.flush()
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
    for st in states.values():
        if st.get("host") == here:      # a pid means nothing on another node
            pids.add(st.get("pid"))
    for ex in exits.values():
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
