"""Per-rank wrapper: what horovodrun / mpirun / srun start on every rank.

It runs the worker as a child process (which inherits the launcher's environment, PMI/PMIx
variables and, for Slurm's PMI2, the PMI_FD descriptor), forwards termination signals, and
records how the worker ended in ``<workdir>/rank-<r>.exit.json``. That record is how the
launcher can say "rank 1 was killed by SIGSEGV during allreduce.exact[gloo]" even when the MPI
launcher tears the other ranks down.

Standard library only; Python >= 3.8.
"""

import os
import signal
import socket
import subprocess
import sys
import time

from .common import FAULT_ENV, describe_exit, env_rank, exit_file, parse_fault, pmi_pass_fds, write_json_atomic


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    workdir = None
    for i, a in enumerate(argv):
        if a == "--workdir" and i + 1 < len(argv):
            workdir = argv[i + 1]
        elif a.startswith("--workdir="):
            workdir = a.split("=", 1)[1]
    if not workdir:
        sys.stderr.write("rank wrapper: --workdir is required\n")
        return 2
    rank = env_rank()
    pkg = __package__ or "envbuilder_smoke"
    cmd = [sys.executable, "-m", pkg + ".worker"] + argv
    pass_fds = pmi_pass_fds()
    started = time.time()
    record = {"rank": rank, "wrapper_pid": os.getpid(), "started": started,
              "host": socket.gethostname()}
    try:
        child = subprocess.Popen(cmd, pass_fds=pass_fds)
    except OSError as exc:
        record.update({"returncode": 127, "how": "could not start the worker: %s" % exc,
                       "ended": time.time(), "terminated": False})
        write_json_atomic(exit_file(workdir, rank), record)
        return 127
    record["worker_pid"] = child.pid
    received = []

    def forward(signum, _frame):
        received.append(signum)
        try:
            child.send_signal(signum)
        except OSError:
            pass

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        try:
            signal.signal(sig, forward)
        except (ValueError, OSError):
            pass
    while True:
        try:
            code = child.wait()
            break
        except InterruptedError:
            continue
    record.update({"returncode": code, "how": describe_exit(code), "ended": time.time(),
                   "terminated": bool(received),
                   "signals_received": [int(s) for s in received]})
    try:
        write_json_atomic(exit_file(workdir, rank), record)
    except OSError:
        pass
    if parse_fault(os.environ.get(FAULT_ENV, "")) == ("linger", rank, None):
        time.sleep(4.0)         # test hook: more than stop_run's grace, less than GRACE_S
    if code < 0:
        return 128 - code
    return code


if __name__ == "__main__":
    sys.exit(main())
