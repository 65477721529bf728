"""The launcher's plan: which runs (framework x controller x launcher) the manifest asks for, and
each run's command line and environment. Standard library only (see launcher.py)."""

import os
import shlex
import shutil
import sys

from .common import threads_per_rank, cpu_count
from .cpu_tf import OMP_EXPECT_ENV
from .static import framework_key, framework_module
from .tf_coordination import DEFAULT_S as HEARTBEAT_DEFAULT_S, ENV as HEARTBEAT_ENV


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


class Run(object):
    def __init__(self, controller, launcher, framework, first):
        self.controller = controller      # mpi | gloo | single
        self.launcher = launcher          # gloo-local | horovodrun | mpirun | srun | none
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
        self.events = {}                  # rank -> what happened to it (crash, hang, ...), in a step


def distributed_kind(expect):
    """horovod | torch | tf-multiworker | none (older manifests: horovod when they ask for it)."""
    d = expect.get("distributed") or {}
    return d.get("kind") or ("horovod" if expect.get("horovod") else "none")


def plan_runs(expect, args, in_step=False):
    """(controller, launcher, framework module) for every multi-rank run, in order. in_step: this
    process is one task of an srun step (launcher.main_in_step), where Horovod's gloo controller
    runs too (gloo_step.py does horovodrun's rendezvous); a suite that starts srun itself runs
    the mpi controller only."""
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
        # mpi first, then gloo (each its own pass), as the manifest builds them
        pairs = [(c, "srun") for c in ("mpi", "gloo") if c in ctrls and (c == "mpi" or in_step)]
        pairs = pairs or [("mpi", "srun")]
    else:
        pairs = []
        for c in ctrls:
            if c == "gloo":
                # horovodrun's rendezvous and slot variables without horovodrun's own start
                # (gloo_local.py); --launcher gloo runs horovodrun itself
                pairs.append(("gloo", "gloo-local"))
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
    if run.launcher == "gloo-local":
        return [sys.executable, "-m", PACKAGE + ".gloo_local", "--ranks", str(n), "--"] + py
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
    if run.controller == "tf":
        # a loaded node must not end the run by TF's 10 s heartbeat (tf_coordination.py)
        env.setdefault(HEARTBEAT_ENV, str(HEARTBEAT_DEFAULT_S))
    if args.threads:
        env["OMP_NUM_THREADS"] = str(args.threads)
        env[OMP_EXPECT_ENV] = "%s|verify --threads" % args.threads
    elif run.launcher in ("srun", "srun-step") and os.environ.get("SRUN_CPUS_PER_TASK"):
        # a step of job.sbatch, which exports SRUN_CPUS_PER_TASK and sets OMP_NUM_THREADS from
        # cpus-per-task: the job's value must reach the ranks unchanged (env.cpu_threads)
        env[OMP_EXPECT_ENV] = "%s|job.sbatch: cpus-per-task" % os.environ["SRUN_CPUS_PER_TASK"]
    elif run.launcher != "srun":
        # ranks share this node: split its cores
        env["OMP_NUM_THREADS"] = str(threads_per_rank(run.ranks))
        env[OMP_EXPECT_ENV] = "%s|the suite: %d cores / %d ranks" % (env["OMP_NUM_THREADS"], cpu_count(),
                                                                      run.ranks)
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
