"""Node vetting (`cluster.vet_min_nodes`): what one task per node runs, from the image itself,
before the job's training step. It prints one line that job.sbatch reads:

    envbuilder-vet NODE ok|bad MFLOPS ALLREDUCE_MBPS REASON...

- compute: a known-answer matrix product (numpy when the image has it, else torch, else plain
  Python), repeated for about a second: a wrong answer makes the node bad; its rate (Mflop/s) is
  what job.sbatch compares across nodes (a node below half the best is named, a throttled or
  overloaded node being the common case);
- an allreduce within the node: LOCAL_RANKS processes (the job's ranks per node, at least 2) sum a
  tensor through torch.distributed's gloo on 127.0.0.1 and check the sum (images without torch
  skip it: "-");
- the transport: when the site's fabric promises RDMA (ENVBUILDER_FABRIC ib, roce, efa or
  slingshot), the device must be visible in the container and the image must hold the provider
  libraries (the same facts verify's `fabric` check reads).

Each part is bounded in time. Standard library only, numpy/torch when present; Python >= 3.8.
"""

import os
import socket
import subprocess
import sys
import time

from .fabric import FABRIC_ENV, rdma_devices, verbs_provider_present
from .spawn import free_port

TAG = "envbuilder-vet"
RDMA_FABRICS = ("ib", "roce", "efa", "slingshot")
N = 96                      # matrix size of the compute check
ALLREDUCE_BYTES = 4 << 20   # 4 MiB per rank
ALLREDUCE_TIMEOUT_S = 60


def compute_rate(seconds=1.0):
    """(Mflop/s, error or ''): A @ B with a known answer, repeated for SECONDS."""
    a = [[float((i * N + j) % 7) for j in range(N)] for i in range(N)]
    ident = [[1.0 if i == j else 0.0 for j in range(N)] for i in range(N)]
    try:
        import numpy as np
        A, B = np.array(a), np.array(ident) * 2.0
        product = lambda: A @ B                                             # noqa: E731
        check = lambda c: bool((c == A * 2.0).all())                        # noqa: E731
    except ImportError:
        try:
            import torch
            A, B = torch.tensor(a, dtype=torch.float64), torch.eye(N, dtype=torch.float64) * 2.0
            product = lambda: A @ B                                         # noqa: E731
            check = lambda c: bool(torch.equal(c, A * 2.0))                 # noqa: E731
        except ImportError:
            B = [[2.0 * x for x in row] for row in ident]

            def product():
                cols = list(zip(*B))
                return [[sum(x * y for x, y in zip(row, col)) for col in cols] for row in a]

            check = lambda c: c == [[2.0 * x for x in row] for row in a]    # noqa: E731
    reps, t0 = 0, time.perf_counter()
    while True:
        c = product()
        reps += 1
        elapsed = time.perf_counter() - t0
        if elapsed >= seconds:
            break
    if not check(c):
        return 0.0, "the compute check's matrix product gave a wrong answer"
    return 2.0 * N ** 3 * reps / elapsed / 1e6, ""


ALLREDUCE_WORKER = r"""
import os, sys, time
import torch, torch.distributed as dist
rank, size = int(sys.argv[1]), int(sys.argv[2])
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%s" % sys.argv[3], rank=rank, world_size=size)
t = torch.ones(int(sys.argv[4]) // 4, dtype=torch.float32)
dist.all_reduce(t)
ok = bool((t == size).all())
t0 = time.perf_counter()
reps = 3
for _ in range(reps):
    dist.all_reduce(t)
secs = (time.perf_counter() - t0) / reps
if rank == 0:
    busbw = int(sys.argv[4]) / secs * 2.0 * (size - 1) / size
    print("%d %.1f" % (int(ok), busbw / 1e6))
dist.destroy_process_group()
"""


def allreduce_within(local_ranks):
    """(MB/s bus bandwidth or None when skipped, error or '')."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return None, ""
    size = max(2, local_ranks)
    port = str(free_port())
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    procs = [subprocess.Popen([sys.executable, "-c", ALLREDUCE_WORKER, str(r), str(size), port, str(ALLREDUCE_BYTES)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, universal_newlines=True)
             for r in range(size)]
    deadline = time.time() + ALLREDUCE_TIMEOUT_S
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=max(1.0, deadline - time.time())))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            return 0.0, "the allreduce within the node did not finish in %d s" % ALLREDUCE_TIMEOUT_S
    bad = [(p.returncode, err) for p, (_, err) in zip(procs, outs) if p.returncode != 0]
    if bad:
        last = (bad[0][1].strip().splitlines() or ["exit %d" % bad[0][0]])[-1]
        return 0.0, "the allreduce within the node failed: %s" % last[:200]
    fields = outs[0][0].split()
    if len(fields) != 2 or fields[0] != "1":
        return 0.0, "the allreduce within the node gave a wrong sum"
    return float(fields[1]), ""


def transport_problem(fabric):
    """Why this node cannot carry the fabric's RDMA traffic, or ''."""
    if fabric not in RDMA_FABRICS:
        return ""
    dev = rdma_devices()
    if fabric == "slingshot":
        if not dev["cxi"]:
            return "fabric slingshot: no /dev/cxi* device in the container"
        return ""
    if fabric == "efa" and not dev["efa"]:
        return "fabric efa: no EFA device in /sys/class/infiniband in the container"
    if not (dev["dev_infiniband"] and dev["ib_devices"]):
        return "fabric %s: no RDMA device in the container (/dev/infiniband, /sys/class/infiniband)" % fabric
    if not verbs_provider_present():
        return "fabric %s: the image has no libibverbs provider (rdma-core's ibverbs-providers)" % fabric
    return ""


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    local_ranks = int(argv[argv.index("--local-ranks") + 1]) if "--local-ranks" in argv else 2
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    reasons = []
    mflops, err = compute_rate()
    if err:
        reasons.append(err)
    mbps, err = allreduce_within(local_ranks)
    if err:
        reasons.append(err)
    err = transport_problem(os.environ.get(FABRIC_ENV, "").strip())
    if err:
        reasons.append(err)
    print("%s %s %s %d %s %s" % (TAG, node, "bad" if reasons else "ok", int(mflops),
                                 "-" if mbps is None else "%d" % mbps, "; ".join(reasons) or "-"))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
