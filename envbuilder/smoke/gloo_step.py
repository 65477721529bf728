"""Horovod's gloo controller inside an srun step: what ``horovodrun --gloo`` does, without ssh.

horovodrun starts Horovod's HTTP rendezvous server (horovod.runner.http.http_server's
RendezvousServer) with the slot plan (one SlotInfo per rank: rank/size, local_rank/local_size
on its host, cross_rank/cross_size among the hosts' same local rank), then starts every rank
over ssh with HOROVOD_GLOO_RENDEZVOUS_ADDR/PORT, HOROVOD_CONTROLLER=gloo,
HOROVOD_CPU_OPERATIONS=gloo, HOROVOD_GLOO_IFACE, HOROVOD_HOSTNAME and the slot's
HOROVOD_RANK/SIZE/LOCAL_RANK/LOCAL_SIZE/CROSS_RANK/CROSS_SIZE. Inside an srun step Slurm has
already started one task per rank on its node, so here:

  every task     writes ``task-<rank>.json`` (SLURM_PROCID, SLURM_NODEID, SLURM_LOCALID, node
                 name) into the run's folder in the step's shared workdir;
  task 0         waits for all of them, builds the slot plan from what the tasks say (not from
                 an assumed block distribution), checks it against SLURM_STEP_TASKS_PER_NODE,
                 starts the RendezvousServer with that plan and writes ``rendezvous.json``
                 (address, port, interface, plan; or the error) atomically;
  the other tasks wait for ``rendezvous.json``;
then every task starts its rank with the HOROVOD_* variables of its slot. Every wait is bounded;
a missing file ends in a failure that names the ranks and the phase.

Standard library only, except that task 0 imports Horovod's own rendezvous server (the framework
under test) when it starts it.
"""

import os
import re
import socket
import time

from .common import read_json, write_json_atomic

RENDEZVOUS = "rendezvous.json"
POLL_S = 0.2


class GlooStepError(Exception):
    """A named failure of the in-step rendezvous (the message says which ranks and what phase)."""


def parse_tasks_per_node(text):
    """Slurm's tasks-per-node notation ("2(x2)", "3,1", "2(x2),1") -> [2, 2] / [3, 1] / [2, 2, 1]."""
    counts = []
    for part in (text or "").split(","):
        part = part.strip()
        if not part:
            continue
        m = re.match(r"^(\d+)(?:\(x(\d+)\))?$", part)
        if not m:
            raise ValueError("cannot read tasks per node %r (part %r)" % (text, part))
        counts.extend([int(m.group(1))] * int(m.group(2) or 1))
    return counts


def own_task():
    """This task as Slurm describes it: rank, node id, local id and node name."""
    env = os.environ
    return {"rank": int(env.get("SLURM_PROCID", "0")),
            "node": int(env.get("SLURM_NODEID", "0")),
            "local": int(env.get("SLURM_LOCALID", "0")),
            "host": env.get("SLURMD_NODENAME") or socket.gethostname(), "step": step_id()}


def slot_plan(tasks, size, tasks_per_node=None):
    """The Horovod slot plan from the tasks' own (rank, node, local, host) records.

    Returns one dict per rank (ordered by rank) with hostname, rank, size, local_rank,
    local_size, cross_rank, cross_size, as horovod.runner.common.util.hosts.SlotInfo. Raises
    GlooStepError naming what does not fit: a missing or doubled rank, a node whose local ids are
    not 0..n-1, two node ids under one name, counts per node that differ from Slurm's
    SLURM_STEP_TASKS_PER_NODE (a list of counts in node-id order, when given)."""
    by_rank = {}
    for t in tasks:
        if t["rank"] in by_rank:
            raise GlooStepError("rank %d published twice" % t["rank"])
        by_rank[t["rank"]] = t
    missing = [r for r in range(size) if r not in by_rank]
    extra = sorted(r for r in by_rank if r < 0 or r >= size)
    if missing or extra:
        raise GlooStepError("slot plan: rank(s) %s missing%s" % (
            ",".join(map(str, missing)) or "none",
            "; rank(s) %s outside 0..%d" % (",".join(map(str, extra)), size - 1) if extra else ""))
    nodes = {}       # node id -> {local id: rank}
    names = {}       # node id -> host name
    for r in range(size):
        t = by_rank[r]
        locals_ = nodes.setdefault(t["node"], {})
        if t["local"] in locals_:
            raise GlooStepError("ranks %d and %d both say node %d local id %d"
                                % (locals_[t["local"]], r, t["node"], t["local"]))
        locals_[t["local"]] = r
        if names.setdefault(t["node"], t["host"]) != t["host"]:
            raise GlooStepError("node id %d is %s for rank %d but %s for another rank"
                                % (t["node"], t["host"], r, names[t["node"]]))
    seen = {}
    for node, host in names.items():
        if host in seen:
            raise GlooStepError("node name %s has node ids %d and %d" % (host, seen[host], node))
        seen[host] = node
    order = sorted(nodes)
    for node in order:
        ids = sorted(nodes[node])
        if ids != list(range(len(ids))):
            raise GlooStepError("node %d (%s): local ids %s are not 0..%d"
                                % (node, names[node], ids, len(ids) - 1))
    if tasks_per_node is not None:
        have = [len(nodes[n]) for n in order]
        if have != list(tasks_per_node):
            raise GlooStepError("the tasks say %s per node (node ids %s) but Slurm's step says %s"
                                % (have, order, list(tasks_per_node)))
    slots = []
    for r in range(size):
        t = by_rank[r]
        local = t["local"]
        same_local = [n for n in order if local in nodes[n]]   # the hosts with this local rank
        slots.append({"hostname": names[t["node"]], "rank": r, "size": size,
                      "local_rank": local, "local_size": len(nodes[t["node"]]),
                      "cross_rank": same_local.index(t["node"]), "cross_size": len(same_local)})
    return slots


def slot_env(slot, addr, port, iface):
    """The variables horovodrun gives the rank of this slot (gloo_run.create_run_env_vars and
    create_slot_env_vars)."""
    env = {"HOROVOD_GLOO_RENDEZVOUS_ADDR": str(addr), "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port),
           "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo",
           "HOROVOD_HOSTNAME": slot["hostname"]}
    for key in ("rank", "size", "local_rank", "local_size", "cross_rank", "cross_size"):
        env["HOROVOD_" + key.upper()] = str(slot[key])
    if iface:
        env["HOROVOD_GLOO_IFACE"] = iface
    return env


def interface():
    """The interface the job script names for the ranks' traffic (None: Horovod's default)."""
    env = os.environ
    for name in ("HOROVOD_GLOO_IFACE", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        value = (env.get(name) or "").split(",")[0].strip()
        if value and not value.startswith("^"):
            return value
    return None


def server_address(host):
    """How the other nodes reach task 0's node: MASTER_ADDR (job.sbatch: the job's first node)
    when that is this node, else this node's name."""
    master = os.environ.get("MASTER_ADDR") or ""
    if master and master in (host, socket.gethostname(), socket.gethostname().split(".")[0]):
        return master
    return host


def step_id():
    """This srun step (files of an earlier step in a reused workdir are not this step's)."""
    env = os.environ
    return "%s.%s" % (env.get("SLURM_JOB_ID", "0"), env.get("SLURM_STEP_ID", "0"))


def _current(path):
    """The JSON in PATH when it was written by this step, else None."""
    data = read_json(path)
    return data if data and data.get("step") == step_id() else None


def _wait_for(paths_fn, deadline):
    while True:
        missing = paths_fn()
        if not missing or time.time() >= deadline:
            return missing
        time.sleep(POLL_S)


class StepRendezvous(object):
    """One gloo run's rendezvous inside the step; ``env`` is what this task's rank gets."""

    def __init__(self, workdir, rank, size, timeout):
        self.workdir = workdir
        self.rank = rank
        self.size = size
        self.timeout = timeout
        self.server = None
        self.env = {}
        self.info = {}

    def task_file(self, r):
        return os.path.join(self.workdir, "task-%d.json" % r)

    def setup(self, wait_s):
        """Publish this task, then (task 0) start the server or (others) wait for it. Raises
        GlooStepError; task 0 then also writes the error where the others look."""
        os.makedirs(self.workdir, exist_ok=True)
        me = own_task()
        if me["rank"] != self.rank:
            raise GlooStepError("rank %d: SLURM_PROCID says %d" % (self.rank, me["rank"]))
        write_json_atomic(self.task_file(self.rank), me)
        path = os.path.join(self.workdir, RENDEZVOUS)
        if self.rank == 0:
            try:
                self._serve(me, wait_s)
            except Exception as exc:     # named in the report; the others stop waiting
                err = exc if isinstance(exc, GlooStepError) else GlooStepError(
                    "starting Horovod's rendezvous server: %s: %s" % (type(exc).__name__, exc))
                write_json_atomic(path, {"error": str(err), "step": step_id()})
                self.stop()
                raise err from None
            return self.env
        missing = _wait_for(lambda: [] if _current(path) else [path], time.time() + wait_s)
        if missing:
            raise GlooStepError("rank %d waited %.0f s at 'gloo rendezvous' for task 0 to publish "
                                "the rendezvous server (%s); none came" % (self.rank, wait_s, path))
        info = _current(path) or {}
        if info.get("error"):
            raise GlooStepError("task 0 could not start the rendezvous: %s" % info["error"])
        slot = (info.get("slots") or [None] * self.size)[self.rank]
        if not slot or slot.get("rank") != self.rank:
            raise GlooStepError("rank %d: no slot for this rank in %s" % (self.rank, path))
        self.info = info
        self.env = slot_env(slot, info["addr"], info["port"], info.get("iface"))
        return self.env

    def _serve(self, me, wait_s):
        missing = _wait_for(lambda: [r for r in range(self.size) if not _current(self.task_file(r))],
                            time.time() + wait_s)
        if missing:
            raise GlooStepError("rank(s) %s never published their slot within %.0f s (phase 'gloo "
                                "rendezvous': task 0 waits for every task's node and local id)"
                                % (",".join(map(str, missing)), wait_s))
        tasks = [_current(self.task_file(r)) for r in range(self.size)]
        bad = [r for r, t in enumerate(tasks) if not t]
        if bad:
            raise GlooStepError("unreadable slot file of rank(s) %s" % ",".join(map(str, bad)))
        per_node = os.environ.get("SLURM_STEP_TASKS_PER_NODE") or os.environ.get("SLURM_TASKS_PER_NODE")
        try:
            counts = parse_tasks_per_node(per_node) if per_node else None
        except ValueError as exc:
            raise GlooStepError(str(exc)) from None
        slots = slot_plan(tasks, self.size, counts)
        nodes = int(os.environ.get("SLURM_STEP_NUM_NODES") or os.environ.get("SLURM_NNODES") or 0)
        used = len(set(s["hostname"] for s in slots))
        if nodes and nodes != used:
            raise GlooStepError("SLURM_STEP_NUM_NODES is %d but the tasks are on %d node(s)" % (nodes, used))
        from horovod.runner.common.util.hosts import SlotInfo
        from horovod.runner.http.http_server import RendezvousServer
        self.server = RendezvousServer(verbose=0)
        port = self.server.start()
        self.server.init([SlotInfo(**s) for s in slots])
        addr = server_address(me["host"])
        iface = interface()
        self.info = {"addr": addr, "port": port, "iface": iface, "slots": slots,
                     "started": time.time(), "step": step_id()}
        write_json_atomic(os.path.join(self.workdir, RENDEZVOUS), self.info)
        self.env = slot_env(slots[0], addr, port, iface)

    def describe(self):
        if not self.info.get("slots"):
            return ""
        per = {}
        for s in self.info["slots"]:
            per.setdefault(s["hostname"], []).append(s["rank"])
        return "rendezvous %s:%s%s; %s" % (
            self.info.get("addr"), self.info.get("port"),
            " (iface %s)" % self.info["iface"] if self.info.get("iface") else "",
            ", ".join("%s: rank %s" % (h, ",".join(map(str, rs))) for h, rs in per.items()))

    def stop(self):
        if self.server is not None:
            try:
                self.server.stop()
            except Exception:
                pass
            try:
                self.server._httpd.server_close()
            except Exception:
                pass
            self.server = None
