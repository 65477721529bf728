"""A minimal local launcher for torch.distributed ranks (what srun does on one node, and what
torchrun does with --standalone, without needing either): starts N copies of a command with
RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT (a free port) set,
forwards termination signals, and exits with the first non-zero status of a rank.

    python -m envbuilder_smoke.spawn --ranks N -- COMMAND...

Standard library only; Python >= 3.8.
"""

import os
import signal
import socket
import subprocess
import sys
import time


def free_port():
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 4 or argv[0] != "--ranks" or "--" not in argv:
        sys.stderr.write("usage: python -m envbuilder_smoke.spawn --ranks N -- COMMAND...\n")
        return 2
    try:
        n = int(argv[1])
    except ValueError:
        sys.stderr.write("spawn: --ranks must be a number\n")
        return 2
    cmd = argv[argv.index("--") + 1:]
    port = str(free_port())
    procs = []
    for r in range(n):
        env = dict(os.environ)
        env.update({"RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": str(n),
                    "LOCAL_WORLD_SIZE": str(n), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
                    "ENVBUILDER_SMOKE_RANK": str(r), "ENVBUILDER_SMOKE_SIZE": str(n)})
        procs.append(subprocess.Popen(cmd, env=env))
    return wait_forwarding(procs)


def wait_forwarding(procs):
    """Forward termination signals to the ranks PROCS until all have ended; the first non-zero
    status of a rank (a signal: 128 + its number), else 0. gloo_local.py uses it too."""

    def forward(signum, _frame):
        for p in procs:
            if p.poll() is None:
                try:
                    p.send_signal(signum)
                except OSError:
                    pass

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        try:
            signal.signal(sig, forward)
        except (ValueError, OSError):
            pass
    code = 0
    while any(p.poll() is None for p in procs):
        time.sleep(0.1)
    for p in procs:
        if p.returncode and not code:
            code = p.returncode if p.returncode > 0 else 128 - p.returncode
    return code


if __name__ == "__main__":
    sys.exit(main())
