"""Horovod's gloo controller on this machine: what ``horovodrun -np N -H localhost:N --gloo`` does
for one host, without horovodrun's own start (its command-line machinery, the interface probe,
a shell per rank).

    python -m envbuilder_smoke.gloo_local --ranks N -- COMMAND...

It starts Horovod's HTTP rendezvous server (horovod.runner.http.http_server.RendezvousServer,
the framework under test) with the one-host slot plan horovodrun makes (rank = local rank, one
cross rank), then N copies of COMMAND with the variables horovodrun gives each slot
(gloo_step.slot_env: rendezvous address and port on the loopback, HOROVOD_CONTROLLER=gloo,
HOROVOD_CPU_OPERATIONS=gloo, the slot's ranks and sizes), forwards termination signals, and
exits with the first non-zero status of a rank. ``--launcher gloo`` still runs horovodrun itself.

Python >= 3.8; imports Horovod's runner only for its rendezvous server.
"""

import os
import subprocess
import sys

from .gloo_step import slot_env
from .spawn import wait_forwarding

HOST = "localhost"
ADDR = "127.0.0.1"
IFACE = "lo"


def local_slots(n):
    """horovodrun's slot plan for -H localhost:N (get_host_assignments on one host)."""
    return [{"hostname": HOST, "rank": r, "size": n, "local_rank": r, "local_size": n,
             "cross_rank": 0, "cross_size": 1} for r in range(n)]


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 4 or argv[0] != "--ranks" or "--" not in argv:
        sys.stderr.write("usage: python -m envbuilder_smoke.gloo_local --ranks N -- COMMAND...\n")
        return 2
    try:
        n = int(argv[1])
    except ValueError:
        sys.stderr.write("gloo_local: --ranks must be a number\n")
        return 2
    cmd = argv[argv.index("--") + 1:]
    try:
        from horovod.runner.common.util.hosts import SlotInfo
        from horovod.runner.http.http_server import RendezvousServer
    except ImportError as exc:
        sys.stderr.write("gloo_local: Horovod's rendezvous server cannot be imported: %s\n" % exc)
        return 1
    slots = local_slots(n)
    server = RendezvousServer(verbose=0)
    port = server.start()
    server.init([SlotInfo(**s) for s in slots])
    procs = []
    try:
        for slot in slots:
            env = dict(os.environ)
            env.update(slot_env(slot, ADDR, port, IFACE))
            env["NCCL_SOCKET_IFNAME"] = IFACE          # as horovodrun sets it beside HOROVOD_GLOO_IFACE
            procs.append(subprocess.Popen(cmd, env=env))

        return wait_forwarding(procs)
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
