"""`envbuilder verify --slurm`: submit the smoke suite through the folder's own job.sbatch, wait
for it (polling `scontrol`, with a time limit that cancels the job), collect every rank's
results and hand verify one report, printed like a local verify.

    envbuilder verify images/cpu-torch-horovod --slurm --nodes 1 --ranks 2
    envbuilder verify images/x --slurm --runtime host --python /opt/venv/bin/python
    envbuilder verify images/x --slurm --image /scratch/me/x.sif --partition gpu --nodes 2 --ranks 8
"""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from ..errors import EXIT_CHECK_FAILED, EnvbuilderError
from ..slurm.collect import collect
from ..runtimes import VERIFY_DEFAULT, runtime as runtime_of
from .runner import Outcome, Target, VerifyOptions, resolve_target, total_timeout

HEADER_RE = re.compile(r"^# Slurm job for \S+ \((\w+) runtime\)$", re.M)
DONE_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
               "PREEMPTED", "BOOT_FAIL", "DEADLINE"}
POLL_S = 1.0
CONTROLLER_GRACE_S = 120.0     # how long a controller that does not answer is asked again


@dataclass(frozen=True)
class SlurmRequest:
    """What `verify --slurm` submits (verify/cli.py makes it from the command line)."""

    folder: str | None = None                # the output folder that holds job.sbatch
    manifest: str | None = None
    image: str | None = None
    runtime: str = VERIFY_DEFAULT            # verify's default, i.e. "the job's own"
    nodes: int = 1
    partition: str | None = None
    account: str | None = None
    time_limit: str | None = None
    sbatch_args: tuple[str, ...] = ()


def add_slurm_arguments(parser) -> None:
    g = parser.add_argument_group("Slurm", "--slurm: submit the suite through the folder's job.sbatch "
                                           "(srun, the job's runtime, binds) and collect every rank")
    g.add_argument("--slurm", action="store_true", help="run the suite as a Slurm job (sbatch)")
    g.add_argument("--nodes", type=int, default=1, help="--slurm: nodes (default 1); --ranks spread over them")
    g.add_argument("--partition", help="--slurm: partition (default: the job script's)")
    g.add_argument("--account", help="--slurm: account to charge")
    g.add_argument("--time-limit", metavar="[D-]HH:MM:SS", help="--slurm: the job's --time")
    g.add_argument("--sbatch-arg", action="append", default=[], metavar="ARG",
                   help="--slurm: extra sbatch argument, e.g. --sbatch-arg=--exclusive (repeatable)")


def job_runtime(script: Path) -> str:
    m = HEADER_RE.search(script.read_text(errors="replace"))
    if not m:
        raise EnvbuilderError("job.sbatch", f"{script} was not written by envbuilder",
                              "re-run `envbuilder build SPEC --no-build` to write it")
    return m.group(1)


IFACE_RE = re.compile(r'^export NCCL_SOCKET_IFNAME="\$\{NCCL_SOCKET_IFNAME:-(.*)\}"$', re.M)


def interface(script: Path, env: dict) -> str | None:
    """The interface the job's ranks connect over: the environment's, else the script's."""
    m = IFACE_RE.search(script.read_text(errors="replace"))
    return env.get("NCCL_SOCKET_IFNAME") or (m.group(1) if m else None)


class ControllerAway(Exception):
    """scontrol got no answer about the job (the controller busy or restarting): ask again."""


def _scontrol(job_id: str) -> dict | None:
    """The job's record as `scontrol show job -o` gives it; None when Slurm no longer knows the job
    (its record was purged after MinJobAge); ControllerAway when the controller did not answer."""
    try:
        proc = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True,
                              timeout=30)
    except subprocess.TimeoutExpired as e:
        raise ControllerAway("scontrol gave no answer in 30 s") from e
    if proc.returncode != 0:
        if "invalid job id" in (proc.stderr + proc.stdout).lower():
            return None
        said = (proc.stderr or proc.stdout).strip().splitlines()
        raise ControllerAway(said[-1] if said else f"scontrol exit {proc.returncode}")
    records = job_records(proc.stdout)
    return records[0] if records else {}


def job_records(text: str) -> list[dict]:
    """`scontrol show job -o`'s records, one per job (per task of an array). A record is one line
    unless the batch script's arguments hold a newline (`python -c` with a script): scontrol prints
    them as they are, so a line that does not start with JobId= continues the record above it. The
    first value of a key wins (an argument's "x=1" does not replace the job's own field)."""
    records: list[dict] = []
    for line in text.splitlines():
        if line.startswith("JobId=") or not records:
            records.append({})
        for item in line.split():
            key, sep, value = item.partition("=")
            if sep:
                records[-1].setdefault(key, value)
    return records


def _seconds(runtime: str) -> float:
    days, _, rest = runtime.rpartition("-")
    parts = [int(p) for p in rest.split(":") if p.isdigit()]
    while len(parts) < 3:
        parts.insert(0, 0)
    return (int(days) if days else 0) * 86400 + parts[0] * 3600 + parts[1] * 60 + parts[2]


def submit(argv: list[str], env: dict) -> str:
    if not shutil.which("sbatch"):
        raise EnvbuilderError("--slurm", "sbatch is not on PATH",
                              "run verify --slurm on a Slurm login node (or start one: .ci/start-slurm.sh)")
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    if proc.returncode != 0:
        raise EnvbuilderError("sbatch", f"the job was refused: {proc.stderr.strip() or proc.stdout.strip()}",
                              "check --partition/--nodes/--ranks against `sinfo`", exit_code=EXIT_CHECK_FAILED)
    return proc.stdout.strip().split(";")[0]


def _record(job_id: str, echo) -> dict | None:
    """_scontrol, asked again while the controller does not answer (a busy slurmctld can fail a
    query now and then: one such failure once ended a wait as if the job were gone), for up to
    CONTROLLER_GRACE_S; after that ControllerAway says so."""
    t0 = time.time()
    said = False
    while True:
        try:
            return _scontrol(job_id)
        except ControllerAway as e:
            if time.time() - t0 > CONTROLLER_GRACE_S:
                raise ControllerAway(f"the Slurm controller did not answer for {CONTROLLER_GRACE_S:.0f} s: {e}") from e
            if not said:
                echo(f"job {job_id}: the Slurm controller did not answer ({e}); asking again")
                said = True
            time.sleep(POLL_S)


def wait(job_id: str, limit: float, echo) -> tuple[dict, bool]:
    """Poll until the job ends; cancel it after LIMIT seconds. Returns (last record, timed out)."""
    t0 = time.time()
    last: dict = {}
    shown = ""
    while True:
        try:
            rec = _record(job_id, echo)
        except ControllerAway as e:
            return {**last, "JobState": "UNKNOWN", "Reason": str(e)}, False
        if rec is None:
            return last or {"JobState": "UNKNOWN"}, False
        last = rec
        state = rec.get("JobState", "")
        if state != shown:
            echo(f"job {job_id}: {state.lower()}" + (f" on {rec.get('NodeList')}"
                                                     if state == "RUNNING" else ""))
            shown = state
        if state in DONE_STATES:
            return rec, False
        if time.time() - t0 > limit:
            echo(f"job {job_id}: still {state.lower()} after {limit:.0f} s: cancelling it")
            subprocess.run(["scancel", job_id], capture_output=True, timeout=60)
            for _ in range(60):
                try:
                    rec = _record(job_id, echo)
                except ControllerAway:
                    rec = None
                if rec is None or rec.get("JobState") in DONE_STATES:
                    break
                time.sleep(POLL_S)
            return rec or last, True
        time.sleep(POLL_S)


def run_slurm(req: SlurmRequest, opts: VerifyOptions) -> tuple[Target, Outcome, str]:
    """verify --slurm: (target, outcome, where) for verify's own reporting; the target's runtime
    is the job script's."""
    if req.nodes < 1:
        raise EnvbuilderError("--nodes", f"must be at least 1, got {req.nodes}")
    if opts.ranks < req.nodes:
        raise EnvbuilderError("--ranks", f"{opts.ranks} rank(s) cannot fill {req.nodes} nodes",
                              "give at least one rank per node")
    t = resolve_target(req.folder, None, "host", manifest=req.manifest)
    if t.folder is None or not (t.folder / "job.sbatch").is_file():
        raise EnvbuilderError("FOLDER", "verify --slurm needs the output folder of `envbuilder build` "
                              "(it holds job.sbatch)", "envbuilder verify images/<name> --slurm")
    script = t.folder / "job.sbatch"
    runtime = job_runtime(script)
    if req.runtime not in (VERIFY_DEFAULT, runtime):   # verify's default, i.e. not asked
        raise EnvbuilderError("--runtime", f"{script} runs the {runtime} runtime, not {req.runtime}",
                              f"rewrite it: envbuilder build SPEC --no-build --runtime {req.runtime}")
    t.runtime = runtime             # what verify's report and headline name

    env = dict(os.environ)
    env.setdefault("USER", "root" if os.geteuid() == 0 else str(os.geteuid()))
    for var in ("OUTPUT_DIR", "ENVBUILDER_IMAGE", "ENVBUILDER_VENV", "SLURM_JOB_ID"):
        env.pop(var, None)
    env["ENVBUILDER_DIR"] = str(t.folder)
    runtime_of(runtime).slurm_env(t, req.image, opts, env)     # runtimes/: the image and its variables

    runs = t.folder / "runs"
    out_dir = runs / f"verify-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    out_dir.mkdir(parents=True)
    env["OUTPUT_DIR"] = str(out_dir)
    env["ENVBUILDER_SMOKE_TIMEOUT"] = f"{opts.timeout:g}"
    per_node = math.ceil(opts.ranks / req.nodes)
    tasks, tasks_per_node = opts.ranks, per_node
    if "RANKS_PER_NODE=" in script.read_text():
        # torchrun mode: one Slurm task per node; torchrun starts the node's ranks
        env["ENVBUILDER_RANKS_PER_NODE"] = str(per_node)
        tasks, tasks_per_node = req.nodes, 1
    argv = ["sbatch", "--parsable", f"--chdir={t.folder}", f"--output={out_dir}/slurm-%j.out",
            f"--job-name={t.name}-verify", f"--nodes={req.nodes}", f"--ntasks={tasks}",
            f"--ntasks-per-node={tasks_per_node}"]
    for opt, value in (("partition", req.partition), ("account", req.account), ("time", req.time_limit)):
        if value:
            argv.append(f"--{opt}={value}")
    argv += list(req.sbatch_args) + [str(script)]

    def echo(text):
        if opts.echo_stderr:
            print(f"[slurm] {text}", file=sys.stderr, flush=True)

    t0 = time.time()
    job_id = submit(argv, env)
    echo(f"submitted job {job_id}: {opts.ranks} rank(s) on {req.nodes} node(s), {runtime} runtime, "
         f"output in {out_dir}")
    rec, timed_out = wait(job_id, total_timeout(opts), echo)
    wall = time.time() - t0
    state = rec.get("JobState", "UNKNOWN")
    log = out_dir / f"slurm-{job_id}.out"
    job = {"id": job_id, "state": state, "exit_code": rec.get("ExitCode"), "reason": rec.get("Reason"),
           "nodes": rec.get("NodeList"), "elapsed_s": _seconds(rec.get("RunTime", "0:0:0")),
           "wall_s": round(wall, 2), "submitted": t0, "output_dir": str(out_dir), "log": str(log),
           "timed_out": timed_out, "ranks": opts.ranks, "nodes_asked": req.nodes,
           "interface": interface(script, env)}
    echo(f"job {job_id} {state.lower()} in {job['elapsed_s']:.0f} s (wall {wall:.0f} s)")
    report = collect(out_dir, job)
    exit_code = int(str(rec.get("ExitCode", "1:0")).split(":")[0] or 1)
    outcome = Outcome(argv=argv, returncode=exit_code, stdout="", wall_s=wall, timed_out=timed_out,
                      report=report)
    where = f"{t.name} (slurm job {job_id}, {runtime}, {opts.ranks} rank(s) on {req.nodes} node(s))"
    return t, outcome, where
