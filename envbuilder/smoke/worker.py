"""One rank of the smoke suite: Horovod, allreduce, training, timing and GPU checks.

Started N ways by the launcher (through ``rank.py``, which records how it ended). Writes its
progress and results to ``<workdir>/rank-<r>.json`` after every step, so that the launcher can
tell where a rank was when it crashed or hung.

Standard library + the framework + horovod only; Python >= 3.8.
"""

import argparse
import os
import signal
import socket
import sys
import time
import traceback

from .common import (FAIL, FAULT_ENV, PASS, SKIP, bandwidth_result, bandwidth_row, gpu_absent,
                     env_local_rank, env_local_size, env_rank, env_size, fmt_bytes, parse_fault,
                     rank_file, result,
                     threads_per_rank, write_json_atomic)
from .fabric import (check_name as fabric_check, fabric, nccl_debug_setup, rank_result as fabric_result,
                     transport_logging_setup)

# Message sizes (bytes) for the bandwidth measurement, and the allreduce correctness grid.
BANDWIDTH_SIZES = (4 << 10, 256 << 10, 4 << 20, 16 << 20)
GPU_BANDWIDTH_SIZES = (1 << 20, 16 << 20, 128 << 20)
EXACT_COUNTS = (1, 1023, 1 << 18)


def plan(framework, controller, first_run, gpu_expected=False):
    """The check names one run reports, in order (the launcher uses it to name checks that a
    crash or hang kept from running). Imports no framework."""
    if controller == "torch":
        from .dist_torch import plan as torch_plan
        return torch_plan()
    if controller == "tf":
        from .dist_tf import plan as tf_plan
        return tf_plan()
    fw = "pytorch" if framework == "torch" else "tensorflow"
    tag = "[%s]" % controller
    names = ["horovod.init" + tag]
    if first_run:
        names.append("horovod.build")
    if fw == "tensorflow":
        names.append("env.cpu_threads" + tag)
    names += [
        "horovod.binding.%s%s" % (fw, tag),
        "horovod.cpu_ops" + tag,
        "allreduce.exact" + tag,
        "train.%s%s" % (fw, tag),
        "perf.step.%s%s" % (fw, tag),
        "perf.allreduce" + tag,
    ]
    if fabric():
        names.append(fabric_check(tag))
    names += [
        "gpu.devices" + tag,
        "gpu.rank_map" + tag,
        "gpu.nccl_allreduce" + tag,
        "gpu.mixed_precision" + tag,
    ]
    return names


class Progress(object):
    """The rank's file: results so far and what it is doing now."""

    def __init__(self, workdir, rank):
        self.workdir = workdir
        self.rank = rank
        self.state = {
            "rank": rank, "size": env_size(), "local_rank": env_local_rank(),
            "host": socket.gethostname(), "pid": os.getpid(), "started": time.time(),
            "running": None, "seq": 0, "results": [], "done": False,
        }
        self.phases = []
        self.flush()

    def flush(self):
        write_json_atomic(rank_file(self.workdir, self.rank), self.state)

    def begin(self, check):
        self.state["running"] = {"check": check, "phase": "start", "since": time.time()}
        self.state["seq"] += 1
        self.phases = [("start", time.time())]
        self.flush()

    def phase(self, text):
        if self.state["running"] is not None:
            self.state["running"]["phase"] = text
        self.state["seq"] += 1
        self.phases.append((text, time.time()))
        self.flush()

    def phase_times(self, min_s=0.05):
        """{phase: seconds} of the current check's slower phases (where the time went)."""
        out = {}
        marks = self.phases + [("end", time.time())]
        for (text, t0), (_n, t1) in zip(marks, marks[1:]):
            if t1 - t0 >= min_s:
                out[text] = round(out.get(text, 0.0) + t1 - t0, 3)
        return out

    def add(self, res):
        self.state["results"].append(res)
        self.state["running"] = None
        self.flush()

    def finish(self):
        self.state["running"] = None
        self.state["done"] = True
        self.state["finished"] = time.time()
        self.flush()


class Ctx(object):
    """What every check gets: the adapter (framework binding), expectations, progress."""

    def __init__(self, args, expect, progress):
        self.args = args
        self.expect = expect
        self.progress = progress
        self.hv = expect.get("horovod") or {}
        self.controller = args.controller
        self.tag = "[%s]" % args.controller
        self.fault = parse_fault(os.environ.get(FAULT_ENV, ""))
        self.fw = None   # adapter
        self.hvd = None  # horovod.<framework> module
        self.gpu = False

    def phase(self, text):
        self.progress.phase(text)

    def maybe_fault(self, check):
        """Test hook: hang or crash this rank at the start of the named check."""
        if not self.fault:
            return
        kind, rank, prefix = self.fault
        prefix = prefix or "allreduce.exact"
        if kind == "linger" or rank != self.progress.rank or not check.startswith(prefix):
            return
        # the rank stops before the check's first collective: its progress counter stays
        # behind the other ranks' (that is how the launcher tells the stuck rank)
        self.progress.state["running"]["phase"] = "fault injected: %s" % kind
        self.progress.flush()
        if kind == "hang":
            while True:
                time.sleep(3600)
        else:
            sys.stdout.flush()
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGSEGV)


# ----------------------------------------------------------------------------- checks

def check_init(ctx):
    name = "horovod.init" + ctx.tag
    hvd = ctx.hvd
    ctx.phase("hvd.init()")
    t0 = time.time()
    hvd.init()
    took = time.time() - t0
    size, rank = hvd.size(), hvd.rank()
    info = {"rank": rank, "size": size, "local_rank": hvd.local_rank(),
            "local_size": hvd.local_size(), "mpi_enabled": bool(hvd.mpi_enabled()),
            "gloo_enabled": bool(hvd.gloo_enabled()), "init_s": round(took, 3),
            "host": socket.gethostname(),
            "cpu_operations": os.environ.get("HOROVOD_CPU_OPERATIONS", "")}
    problems = []
    if ctx.args.ranks and size != ctx.args.ranks:
        problems.append("size %d, expected %d ranks" % (size, ctx.args.ranks))
    if rank != ctx.progress.rank:
        problems.append("Horovod rank %d but the launcher started rank %d" % (rank, ctx.progress.rank))
    enabled = {"mpi": info["mpi_enabled"], "gloo": info["gloo_enabled"]}
    if ctx.controller in enabled and not enabled[ctx.controller]:
        problems.append("controller %s requested but not in use (mpi_enabled=%s gloo_enabled=%s)" % (
            ctx.controller, info["mpi_enabled"], info["gloo_enabled"]))
    used = "mpi" if info["mpi_enabled"] else ("gloo" if info["gloo_enabled"] else "?")
    figure = "%d rank%s, %s controller" % (size, "" if size == 1 else "s", used)
    if problems:
        return [result(name, FAIL, "; ".join(problems), figure, info)]
    return [result(name, PASS, "hvd.init() in %.2f s: rank %d of %d (local %d of %d) on %s, "
                   "controller %s" % (took, rank, size, info["local_rank"], info["local_size"],
                                      info["host"], used), figure, info)]


def check_build(ctx):
    hvd = ctx.hvd
    flags = {}
    for fn in ("mpi_built", "gloo_built", "nccl_built", "ddl_built", "ccl_built", "cuda_built",
               "rocm_built"):
        try:
            flags[fn] = getattr(hvd, fn)()
        except Exception as exc:  # noqa: BLE001
            flags[fn] = "error: %s" % exc
    want_ctrl = ctx.hv.get("controllers") or []
    want_ops = ctx.hv.get("operations") or []
    problems = []
    have = []
    for c in sorted(set(list(want_ctrl) + list(want_ops))):
        built = bool(flags.get("%s_built" % c))
        (have if built else problems).append("%s" % c)
    frameworks = {}
    for fw in ctx.hv.get("frameworks") or []:
        mod = "horovod.torch" if fw in ("pytorch", "torch") else "horovod.tensorflow"
        try:
            __import__(mod + ".mpi_ops" if fw not in ("pytorch", "torch") else mod)
            frameworks[fw] = "built"
        except Exception as exc:  # noqa: BLE001
            frameworks[fw] = "missing: %s" % exc
            problems.append("binding %s (%s: %s)" % (fw, mod, exc))
    data = {"flags": flags, "frameworks": frameworks}
    built_list = ", ".join(k.replace("_built", "") for k, v in sorted(flags.items()) if v is True
                           or (isinstance(v, int) and not isinstance(v, bool) and v))
    if problems:
        return [result("horovod.build", FAIL, "requested but not built: %s (built: %s)" % (
            ", ".join(problems), built_list or "nothing"), "missing " + ", ".join(problems), data)]
    return [result("horovod.build", PASS, "requested %s all built (built: %s; frameworks: %s)" % (
        ", ".join(have) or "-", built_list, ", ".join(sorted(frameworks)) or "-"),
        ", ".join(have), data)]


def check_cpu_threads(ctx):
    """Each rank: the oneDNN / OpenMP settings of the image and job.sbatch reached it (cpu_tf.py)."""
    from .cpu_tf import check_rank_env
    return [check_rank_env(ctx.expect, ctx.fw.tf, ctx.tag)]


def check_binding(ctx):
    name = "horovod.binding.%s%s" % (ctx.fw.key, ctx.tag)
    info = ctx.fw.binding_ops(ctx)
    if info.get("problems"):
        return [result(name, FAIL, "; ".join(info["problems"]), "ops failed", info)]
    return [result(name, PASS, "%s: %s" % (ctx.fw.hvd_module, ", ".join(info["ops"])),
                   "%d ops" % len(info["ops"]), info)]


def timeline_activities(path):
    names = set()
    try:
        with open(path) as fh:
            text = fh.read()
    except OSError:
        return names
    import re
    for m in re.finditer(r'"name"\s*:\s*"([A-Z][A-Z0-9_]+)"', text):
        names.add(m.group(1))
    return names


def check_cpu_ops(ctx):
    """Which tensor operation carries a CPU allreduce, from Horovod's own timeline."""
    name = "horovod.cpu_ops" + ctx.tag
    hvd = ctx.hvd
    path = os.path.join(ctx.args.workdir, "timeline-%s-cpu.json" % ctx.controller)
    ctx.phase("start_timeline")
    try:
        hvd.start_timeline(path)
    except ValueError as exc:
        return [result(name, SKIP, "timeline unavailable (%s); HOROVOD_TIMELINE=DYNAMIC not set?" % exc)]
    ctx.phase("allreduce under timeline")
    ok = ctx.fw.allreduce_probe(ctx, "cpu", 3)
    ctx.phase("stop_timeline")
    hvd.stop_timeline()
    if hvd.rank() != 0:
        return [result(name, PASS if ok else FAIL, "allreduce %s; timeline kept by rank 0" %
                       ("ok" if ok else "wrong"))]
    acts = timeline_activities(path)
    ops = sorted(a for a in acts if a.endswith("_ALLREDUCE"))
    data = {"activities": sorted(acts), "timeline": path}
    if not ok:
        return [result(name, FAIL, "allreduce gave a wrong result", "", data)]
    if not ops:
        return [result(name, FAIL, "timeline recorded no *_ALLREDUCE activity (%s)" % sorted(acts),
                       "", data)]
    data["used"] = [o.split("_")[0].lower() for o in ops]
    return [result(name, PASS, "CPU allreduce carried by %s" % ", ".join(ops), ", ".join(ops), data)]


def check_allreduce(ctx):
    name = "allreduce.exact" + ctx.tag
    size = ctx.hvd.size()
    failures = []
    cases = 0
    for dtype in ctx.fw.dtypes:
        for count in EXACT_COUNTS:
            for op in ("sum", "average"):
                if op == "average" and not dtype.startswith(("float", "bfloat")):
                    continue
                ctx.phase("%s %s x%d" % (op, dtype, count))
                err = ctx.fw.exact_allreduce(ctx, dtype, count, op, size)
                cases += 1
                if err:
                    failures.append("%s %s x%d: %s" % (op, dtype, count, err))
    data = {"dtypes": list(ctx.fw.dtypes), "counts": list(EXACT_COUNTS), "cases": cases}
    if failures:
        return [result(name, FAIL, "; ".join(failures[:8]), "%d/%d wrong" % (len(failures), cases), data)]
    return [result(name, PASS, "%d-rank sum and average exact for %s, %s elements" % (
        size, ", ".join(ctx.fw.dtypes), "/".join(str(c) for c in EXACT_COUNTS)),
        "%d cases exact" % cases, data)]


def check_train(ctx):
    name = "train.%s%s" % (ctx.fw.key, ctx.tag)
    pname = "perf.step.%s%s" % (ctx.fw.key, ctx.tag)
    info = ctx.fw.train(ctx)
    problems = []
    if not info["loss_after"] < info["loss_before"] * 0.8:
        problems.append("loss did not fall: %.4f -> %.4f" % (info["loss_before"], info["loss_after"]))
    tol = 1e-6 * max(1.0, info["weight_absmax"])
    if info["ranks_maxdiff_end"] > tol:
        problems.append("ranks' weights differ after training (max |diff| %.3g)" %
                        info["ranks_maxdiff_end"])
    if info.get("ranks_maxdiff_after_bcast") not in (None, 0.0):
        problems.append("weights differ right after broadcast (max |diff| %.3g)" %
                        info["ranks_maxdiff_after_bcast"])
    size = ctx.hvd.size()
    want_lr = info["base_lr"] * size
    if abs(info["lrs"][-1] - want_lr) > 1e-6 * want_lr:
        problems.append("final learning rate %.5g, expected base %.5g x %d ranks = %.5g" % (
            info["lrs"][-1], info["base_lr"], size, want_lr))
    if size > 1 and not info["lrs"][0] < info["lrs"][-1]:
        problems.append("no learning-rate warm-up (first %.5g, last %.5g)" % (info["lrs"][0],
                                                                              info["lrs"][-1]))
    figure = "loss %.3f -> %.3f" % (info["loss_before"], info["loss_after"])
    detail = ("%d steps x %d samples/rank on %s: loss %.4f -> %.4f; weights identical on %d ranks "
              "(max |diff| %.2g, before broadcast %.2g); lr %.4g -> %.4g (warm-up %d steps)" % (
                  info["steps"], info["batch"], info["device"], info["loss_before"],
                  info["loss_after"], size, info["ranks_maxdiff_end"],
                  info.get("ranks_maxdiff_initial") or 0.0, info["lrs"][0], info["lrs"][-1],
                  info["warmup"]))
    out = [result(name, FAIL if problems else PASS, "; ".join(problems) + ("; " if problems else "")
                  + detail if problems else detail, figure, info)]
    st = info["step_s"]
    perf = {"step_ms": round(st * 1000, 3), "samples_per_s_per_rank": round(info["batch"] / st, 1),
            "batch_per_rank": info["batch"], "steps_timed": info["steps_timed"]}
    perf["first_step_ms"] = round((info.get("first_step_s") or 0) * 1000, 1)
    out.append(result(pname, PASS, "median of %d steps after %d warm-up, batch %d/rank, %d threads/rank; "
                      "first step (graph build, allocation) %.0f ms"
                      % (info["steps_timed"], info["steps"] - info["steps_timed"], info["batch"],
                         info.get("threads", 0), perf["first_step_ms"]),
                      "%.1f ms/step, %.0f samples/s/rank" % (st * 1000, info["batch"] / st), perf))
    return out


def time_allreduce(ctx, nbytes, device, budget_s=0.25):
    """Seconds per allreduce of NBYTES: 2 warm-up calls, then a rep count chosen by rank 0
    (every rank must run the same number of collectives)."""
    op = ctx.fw.bw_op(nbytes, device)
    t0 = time.perf_counter()
    op()
    op()
    est = max((time.perf_counter() - t0) / 2.0, 1e-6)
    reps = ctx.fw.bcast_int(max(3, min(50, int(budget_s / est))))
    t0 = time.perf_counter()
    for _ in range(reps):
        op()
    return (time.perf_counter() - t0) / reps, reps


def check_bandwidth(ctx, device="cpu", name=None):
    name = name or ("perf.allreduce" + ctx.tag)
    size = ctx.hvd.size()
    rows = []
    for nbytes in (GPU_BANDWIDTH_SIZES if device == "gpu" else BANDWIDTH_SIZES):
        ctx.phase("bandwidth %s %s" % (device, fmt_bytes(nbytes)))
        secs, reps = time_allreduce(ctx, nbytes, device)
        rows.append(bandwidth_row(nbytes, secs, reps, size))
    return [bandwidth_result(name, rows, "bus bandwidth per message size (float32, %d ranks, %s)" % (
        size, device))]


def check_gpu(ctx):
    tag = ctx.tag
    names = ["gpu.devices", "gpu.rank_map", "gpu.nccl_allreduce", "gpu.mixed_precision"]
    if not ctx.gpu:
        status, why = gpu_absent(ctx.expect, ctx.args.no_gpu)
        return [result(n + tag, status, why) for n in names]
    out = []
    ctx.phase("gpu devices")
    dev = ctx.fw.gpu_devices(ctx)
    out.append(result("gpu.devices" + tag, PASS if dev["count"] else FAIL,
                      "%d visible: %s (CUDA_VISIBLE_DEVICES=%s)" % (
                          dev["count"], ", ".join(dev["names"]),
                          os.environ.get("CUDA_VISIBLE_DEVICES", "unset")),
                      "%d x %s" % (dev["count"], dev["names"][0] if dev["names"] else "?"), dev))
    ctx.phase("gpu rank map")
    mapping = ctx.fw.gather_objects(ctx, {"rank": ctx.hvd.rank(), "host": socket.gethostname(),
                                          "local_rank": ctx.hvd.local_rank(), "gpu": dev["mine"]})
    seen = {}
    dup = []
    for m in mapping:
        key = (m["host"], m["gpu"])
        if key in seen:
            dup.append("ranks %d and %d share GPU %s on %s" % (seen[key], m["rank"], m["gpu"], m["host"]))
        seen[key] = m["rank"]
    out.append(result("gpu.rank_map" + tag, FAIL if dup else PASS,
                      "; ".join(dup) if dup else ", ".join("rank %d -> %s:%s" % (
                          m["rank"], m["host"], m["gpu"]) for m in mapping),
                      "%d ranks, %d GPUs" % (len(mapping), len(seen)), {"map": mapping}))
    # NCCL
    want_nccl = "nccl" in (ctx.hv.get("operations") or [])
    nname = "gpu.nccl_allreduce" + tag
    # (the CPU test hook goes down the NCCL path too: it must then fail, NCCL carrying nothing)
    if not (ctx.hvd.nccl_built() or getattr(ctx.fw, "fake_gpu", False)):
        out.append(result(nname, FAIL if want_nccl else SKIP,
                          "Horovod built without NCCL" + (" but the manifest asks for it" if want_nccl
                                                          else "")))
    else:
        path = os.path.join(ctx.args.workdir, "timeline-%s-gpu.json" % ctx.controller)
        ctx.phase("gpu allreduce under timeline")
        ctx.hvd.start_timeline(path)
        ok = ctx.fw.allreduce_probe(ctx, "gpu", 3)
        ctx.hvd.stop_timeline()
        bw = check_bandwidth(ctx, "gpu", name=nname)[0]
        acts = timeline_activities(path) if ctx.hvd.rank() == 0 else set()
        nccl_acts = sorted(a for a in acts if a.startswith("NCCL_"))
        data = dict(bw.get("data") or {}, activities=sorted(acts))
        if not ok:
            out.append(result(nname, FAIL, "GPU allreduce gave a wrong result", "", data))
        elif ctx.hvd.rank() == 0 and not nccl_acts:
            out.append(result(nname, FAIL, "GPU allreduce not carried by NCCL (timeline: %s)" %
                              sorted(acts), "", data))
        else:
            out.append(result(nname, PASS, "carried by %s; %s" % (
                ", ".join(nccl_acts) or "NCCL (timeline on rank 0)", bw["detail"]), bw["figure"], data))
    ctx.phase("mixed precision step")
    mp = ctx.fw.mixed_precision_step(ctx)
    out.append(result("gpu.mixed_precision" + tag, PASS if mp.get("ok") else FAIL, mp.get("detail", ""),
                      mp.get("figure", ""), mp))
    return out


# ----------------------------------------------------------------------------- main

def make_adapter(framework):
    if framework == "torch":
        from .fw_torch import TorchAdapter
        return TorchAdapter()
    from .fw_tf import TFAdapter
    return TFAdapter()


def horovod_is_down(exc):
    """A Horovod error after which no collective can succeed (a peer died, shut down)."""
    text = "%s: %s" % (type(exc).__name__, exc)
    return ("HorovodInternalError" in text or "has been shut down" in text
            or "Connection closed by peer" in text or "Gloo" in text and "closed" in text)


# messages of the GPU stack whose fix the user cannot read from them: (text in the error, what to do)
KNOWN_FAILURES = (
    # NCCL refuses two ranks on one GPU (seen for real: NCCL 2.28.9, 2 ranks on one H100, docs/gpu.md)
    ("Duplicate GPU detected", "more ranks than GPUs on this node: NCCL needs one GPU per rank "
     "(ask Slurm for --gpus-per-task=1, or as many --ntasks-per-node as --gpus-per-node)"),
    ("no kernel image is available", "the GPU is not in the arch list the framework was compiled for "
     "(job.sbatch's GPU preflight names it): use other nodes or a build for this GPU"),
    ("driver version is insufficient", "the node's NVIDIA driver is older than the image's CUDA needs "
     "(job.sbatch's GPU preflight names both): use nodes with a newer driver or an older CUDA"),
)


def failure_hint(text):
    """What to do about a known GPU-stack error message ('' for any other); the report puts it
    before the message, whose tail the table may cut."""
    for needle, fix in KNOWN_FAILURES:
        if needle in text:
            return fix
    return ""


def run_checks(ctx, checks):
    """Run (name, fn) pairs; an exception fails that check only. Returns False once the
    run cannot go on (Horovod not initialised)."""
    for cname, fn in checks:
        ctx.progress.begin(cname)
        ctx.maybe_fault(cname)
        t0 = time.time()
        try:
            res = fn(ctx)
        except Exception as exc:  # noqa: BLE001 - the failure is the finding
            tb = traceback.format_exc(limit=6)
            text = "%s: %s" % (type(exc).__name__, exc)
            hint = failure_hint(text)
            res = [result(cname, FAIL, (hint + ". " if hint else "") + text, "error", {"traceback": tb})]
            if cname.startswith(("horovod.init", "dist.init")) or horovod_is_down(exc):
                # nothing later can work: stop here (the launcher names what is missing)
                res[0]["data"]["fatal"] = True
                ctx.progress.add(res[0])
                return False
        took = time.time() - t0
        phases = ctx.progress.phase_times()
        for r in res:
            r.setdefault("seconds", round(took, 3))
            if phases and r is res[0]:
                r["phases"] = phases
            ctx.progress.add(r)
    return True


def main(argv=None):
    parser = argparse.ArgumentParser(prog="envbuilder_smoke.worker")
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--manifest", required=True)
    parser.add_argument("--controller", default="gloo")
    parser.add_argument("--framework", required=True, help="torch or tensorflow")
    parser.add_argument("--ranks", type=int, default=0)
    parser.add_argument("--first", action="store_true")
    parser.add_argument("--require-gpu", action="store_true")
    parser.add_argument("--no-gpu", action="store_true")
    args = parser.parse_args(argv)

    import json
    with open(args.manifest) as fh:
        expect = json.load(fh).get("expect") or {}

    rank = env_rank()
    if fabric():
        transport_logging_setup(args.workdir)   # Open MPI's and UCX's own logs name what they chose
    if fabric() and expect.get("gpu"):
        nccl_debug_setup(args.workdir)      # NCCL's init log names the network it chose
    progress = Progress(args.workdir, rank)
    ctx = Ctx(args, expect, progress)
    threads = threads_per_rank(env_local_size())
    if "OMP_NUM_THREADS" in os.environ:
        try:
            threads = max(1, int(os.environ["OMP_NUM_THREADS"]))
        except ValueError:
            pass
    ctx.threads = threads
    if args.controller in ("torch", "tf"):
        # torch.distributed / tf-multiworker (manifest expect.distributed.kind): their own checks
        if args.controller == "torch":
            from .dist_torch import run as run_dist
        else:
            from .dist_tf import run as run_dist
        code = run_dist(ctx, run_checks, threads)
        progress.finish()
        if args.controller == "torch":
            # every verdict is on disk and the group is freed (dist_torch.end_process_group):
            # the interpreter's teardown could only add a false crash (torch#190489)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        sys.stdout.flush()
        return code

    def setup(c):
        c.phase("import %s + horovod" % args.framework)
        c.fw = make_adapter(args.framework)
        c.fw.setup(c, threads)
        c.hvd = c.fw.hvd
        return check_init(c)

    checks = [("horovod.init" + ctx.tag, setup)]
    if not run_checks(ctx, checks):
        progress.finish()
        return 3
    ctx.gpu = ctx.fw.gpu_available(ctx)
    checks = []
    if args.first:
        checks.append(("horovod.build", check_build))
    if ctx.fw.key == "tensorflow":
        checks.append(("env.cpu_threads" + ctx.tag, check_cpu_threads))
    checks += [
        ("horovod.binding.%s%s" % (ctx.fw.key, ctx.tag), check_binding),
        ("horovod.cpu_ops" + ctx.tag, check_cpu_ops),
        ("allreduce.exact" + ctx.tag, check_allreduce),
        ("train.%s%s" % (ctx.fw.key, ctx.tag), check_train),
        ("perf.allreduce" + ctx.tag, check_bandwidth),
    ]
    if fabric():
        checks.append((fabric_check(ctx.tag), lambda c: [fabric_result(c.tag, c.controller)]))
    checks.append(("gpu.devices" + ctx.tag, check_gpu))
    run_checks(ctx, checks)
    try:
        ctx.hvd.shutdown()
    except Exception:  # noqa: BLE001
        pass
    progress.finish()
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
