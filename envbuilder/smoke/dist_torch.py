"""One rank of the torch.distributed checks (manifest ``expect.distributed.kind == "torch"``).

Started by the launcher through ``rank.py`` like the Horovod worker, from whatever environment
the launcher gives: torchrun's (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), the job
script's srun step (the same variables, exported from SLURM_PROCID/SLURM_LOCALID/SLURM_NTASKS)
or the smoke suite's own local spawner (``spawn.py``). Same progress files, same timeouts.

Checks, in order (``plan()`` lists the names):
  dist.init        init_process_group(env://): world size == ranks asked, rank == launch index
                   (catches "N independent rank-0s"), backend is the manifest's
  dist.collectives all_reduce (sum, max), all_gather, broadcast exact for several dtypes/sizes
  train.ddp        tiny DistributedDataParallel run: loss falls, weights identical on every rank
  perf.allreduce   bus bandwidth per message size
  gpu.*            with a GPU: one device per local rank, NCCL carries an all_reduce, a bf16 step

torch + the standard library only; Python >= 3.8.
"""

import datetime
import gc
import os
import socket
import time

from .fabric import check_name, fabric, rank_result as fabric_result
from .common import FAIL, PASS, SKIP, bandwidth_result, bandwidth_row, fmt_bytes, gpu_absent, result

TAG = "[torch]"
BANDWIDTH_SIZES = (4 << 10, 256 << 10, 4 << 20, 16 << 20)
GPU_BANDWIDTH_SIZES = (1 << 20, 16 << 20, 128 << 20)
COUNTS = (1, 1023, 1 << 18)
DTYPES = ("float32", "float64", "bfloat16", "int32", "int64")
GPU_NAMES = ("gpu.devices", "gpu.rank_map", "gpu.nccl_allreduce", "gpu.bf16_step")
TRAIN_STEPS = 30


def plan():
    return ["dist.init" + TAG, "dist.collectives" + TAG, "train.ddp" + TAG,
            "perf.allreduce" + TAG] + ([check_name(TAG)] if fabric() else []) + [n + TAG for n in GPU_NAMES]


def launch_index():
    """The rank the launcher meant this process to be (independent of what the process group
    says): the smoke suite's spawner, torchrun's role rank, then the srun task id."""
    for name in ("ENVBUILDER_SMOKE_RANK", "ROLE_RANK", "SLURM_PROCID", "RANK"):
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return 0


class TorchDist(object):
    def __init__(self, ctx, threads):
        import torch
        import torch.distributed as dist
        self.torch = torch
        self.dist = dist
        torch.set_num_threads(threads)
        want = ((ctx.expect.get("distributed") or {}).get("backend")) or "gloo"
        self.backend = want
        self.gpu = False
        self.device = torch.device("cpu")

    def gpu_setup(self):
        torch = self.torch
        try:
            ok = torch.cuda.is_available() and torch.cuda.device_count() > 0
        except Exception:  # noqa: BLE001
            ok = False
        if ok:
            local = int(os.environ.get("LOCAL_RANK", "0") or 0)
            torch.cuda.set_device(local % torch.cuda.device_count())
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.gpu = ok
        return ok


# ----------------------------------------------------------------------------- checks

def check_init(ctx):
    name = "dist.init" + TAG
    td = ctx.td
    dist = td.dist
    env = {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                                          "MASTER_ADDR", "MASTER_PORT")}
    missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if not env[k]]
    if missing:
        return [result(name, FAIL, "the launcher set no %s: torch.distributed's env:// cannot "
                       "start (srun mode: the job script exports them inside the step; torchrun "
                       "sets them itself)" % ", ".join(missing), "no environment", {"env": env})]
    backend = td.backend
    if backend == "nccl" and not td.gpu:
        backend_used = "gloo"
    else:
        backend_used = backend
    ctx.phase("init_process_group(%s)" % backend_used)
    t0 = time.time()
    kwargs = {"backend": backend_used, "init_method": "env://",
              "timeout": datetime.timedelta(seconds=max(30, int(ctx.args_timeout)))}
    if td.gpu and backend_used == "nccl":
        kwargs["device_id"] = td.device
    try:
        dist.init_process_group(**kwargs)
    except TypeError:
        kwargs.pop("device_id", None)
        dist.init_process_group(**kwargs)
    took = time.time() - t0
    size, rank = dist.get_world_size(), dist.get_rank()
    info = {"rank": rank, "size": size, "backend": dist.get_backend(), "init_s": round(took, 3),
            "host": socket.gethostname(), "launch_index": launch_index(), "env": env}
    problems = []
    if ctx.ranks and size != ctx.ranks:
        problems.append("world size %d, expected %d ranks%s" % (
            size, ctx.ranks, " (every rank is its own world: the launcher's RANK/WORLD_SIZE did "
            "not reach the process, or something in the image overrides them)" if size == 1 else ""))
    if rank != launch_index():
        problems.append("process group rank %d but the launcher started rank %d" % (rank, launch_index()))
    if dist.get_backend() != backend_used:
        problems.append("backend %s, expected %s" % (dist.get_backend(), backend_used))
    figure = "%d rank%s, %s" % (size, "" if size == 1 else "s", dist.get_backend())
    if problems:
        return [result(name, FAIL, "; ".join(problems), figure, info)]
    note = "" if backend_used == backend else " (manifest asks %s: no GPU, the CPU checks use gloo)" % backend
    return [result(name, PASS, "init_process_group(%s) in %.2f s: rank %d of %d on %s, MASTER %s:%s%s" % (
        backend_used, took, rank, size, info["host"], env["MASTER_ADDR"], env["MASTER_PORT"], note),
        figure, info)]


def _tensor(torch, dtype, count, fill, device):
    t = torch.arange(count, dtype=torch.float64).remainder(97).add(fill)
    return t.to(dtype=getattr(torch, dtype), device=device)


def _same_sum(torch, got, want, dtype, size):
    """An all_reduce sum is exact, except in bfloat16 (8 significant bits): from 3 ranks on the
    sums pass 256 and every partial sum may round, by at most 2**-8 of its value."""
    if dtype == "bfloat16":
        return bool(torch.allclose(got, want, rtol=size * 2.0 ** -8, atol=0.0))
    return torch.equal(got, want)


def check_collectives(ctx, device=None):
    name = "dist.collectives" + TAG
    td = ctx.td
    torch, dist = td.torch, td.dist
    device = device or td.device
    size, rank = dist.get_world_size(), dist.get_rank()
    failures, cases = [], 0
    for dtype in DTYPES:
        for count in COUNTS:
            ctx.phase("all_reduce sum %s x%d" % (dtype, count))
            t = _tensor(torch, dtype, count, rank + 1, device)
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
            want = _tensor(torch, "float64", count, 0, "cpu").mul(size).add(size * (size + 1) / 2.0)
            cases += 1
            if not _same_sum(torch, t.cpu().to(torch.float64), want, dtype, size):
                failures.append("all_reduce sum %s x%d" % (dtype, count))
            ctx.phase("all_reduce max %s x%d" % (dtype, count))
            t = _tensor(torch, dtype, count, rank, device)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            cases += 1
            if not torch.equal(t.cpu().to(torch.float64), _tensor(torch, "float64", count, size - 1, "cpu")):
                failures.append("all_reduce max %s x%d" % (dtype, count))
            ctx.phase("all_gather %s x%d" % (dtype, count))
            mine = _tensor(torch, dtype, count, rank * 3, device)
            outs = [torch.empty_like(mine) for _ in range(size)]
            dist.all_gather(outs, mine)
            cases += 1
            for r, o in enumerate(outs):
                if not torch.equal(o.cpu(), _tensor(torch, dtype, count, r * 3, "cpu")):
                    failures.append("all_gather %s x%d: slot %d wrong" % (dtype, count, r))
                    break
            ctx.phase("broadcast %s x%d" % (dtype, count))
            root = size - 1
            t = _tensor(torch, dtype, count, 5 if rank == root else 0, device)
            if rank != root:
                t.zero_()
            dist.broadcast(t, src=root)
            cases += 1
            if not torch.equal(t.cpu(), _tensor(torch, dtype, count, 5, "cpu")):
                failures.append("broadcast %s x%d from rank %d" % (dtype, count, root))
    data = {"dtypes": list(DTYPES), "counts": list(COUNTS), "cases": cases, "device": str(device)}
    if failures:
        return [result(name, FAIL, "; ".join(failures[:8]), "%d/%d wrong" % (len(failures), cases), data)]
    return [result(name, PASS, "%d ranks on %s: all_reduce (sum, max), all_gather, broadcast exact for "
                   "%s, %s elements%s" % (size, device, ", ".join(DTYPES), "/".join(str(c) for c in COUNTS),
                                           " (bfloat16 sums within its rounding)" if size > 2 else ""),
                   "%d cases exact" % cases, data)]


def _max_rank_diff(td, params):
    """Largest |difference| of the flattened weights between this rank and any other."""
    torch, dist = td.torch, td.dist
    flat = torch.cat([p.detach().reshape(-1).to(td.device, torch.float64) for p in params])
    outs = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(outs, flat)
    return max(float((o - outs[0]).abs().max()) for o in outs), float(flat.abs().max())


def check_train(ctx):
    name = "train.ddp" + TAG
    td = ctx.td
    torch, dist = td.torch, td.dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    size, rank = dist.get_world_size(), dist.get_rank()
    torch.manual_seed(1234 + rank)            # different start on every rank: DDP must broadcast
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    model = model.to(td.device)
    ctx.phase("DDP wrap (broadcast of rank 0's weights)")
    ddp = DDP(model, device_ids=[td.device.index] if td.device.type == "cuda" else None)
    diff0, _ = _max_rank_diff(td, list(ddp.parameters()))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator().manual_seed(99)
    w_true = torch.randn(16, 1, generator=gen)
    x_all = torch.randn(size * 64, 16, generator=gen)
    y_all = torch.tanh(x_all @ w_true)
    x, y = x_all[rank::size].to(td.device), y_all[rank::size].to(td.device)  # own shard each
    losses, times = [], []
    for step in range(TRAIN_STEPS):
        ctx.phase("step %d" % step)
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
        glob = loss.detach().clone()
        dist.all_reduce(glob)
        losses.append(float(glob) / size)
    diff_end, absmax = _max_rank_diff(td, list(ddp.parameters()))
    problems = []
    if not losses[-1] < losses[0] * 0.5:
        problems.append("loss did not fall: %.4f -> %.4f" % (losses[0], losses[-1]))
    if diff0 != 0.0:
        problems.append("weights differ right after DDP's broadcast (max |diff| %.3g)" % diff0)
    if diff_end > 1e-6 * max(1.0, absmax):
        problems.append("ranks' weights differ after training (max |diff| %.3g)" % diff_end)
    times.sort()
    step_ms = times[len(times) // 2] * 1000
    info = {"steps": TRAIN_STEPS, "loss_before": losses[0], "loss_after": losses[-1],
            "ranks_maxdiff_after_wrap": diff0, "ranks_maxdiff_end": diff_end, "step_ms": round(step_ms, 3)}
    figure = "loss %.3f -> %.3f" % (losses[0], losses[-1])
    detail = ("%d DDP steps, %d ranks, own data shard each: loss %.4f -> %.4f; weights identical on "
              "every rank (max |diff| %.2g); median step %.1f ms" % (
                  TRAIN_STEPS, size, losses[0], losses[-1], diff_end, step_ms))
    if problems:
        return [result(name, FAIL, "; ".join(problems) + "; " + detail, figure, info)]
    return [result(name, PASS, detail, figure, info)]


def check_bandwidth(ctx, device=None, name=None, sizes=BANDWIDTH_SIZES):
    name = name or ("perf.allreduce" + TAG)
    td = ctx.td
    torch, dist = td.torch, td.dist
    device = device or td.device
    size = dist.get_world_size()
    rows = []
    for nbytes in sizes:
        ctx.phase("bandwidth %s %s" % (device, fmt_bytes(nbytes)))
        t = torch.ones(nbytes // 4, dtype=torch.float32, device=device)

        def op():
            dist.all_reduce(t)  # noqa: B023 - called within this iteration
            if device.type == "cuda":
                torch.cuda.synchronize()
        op()
        op()
        t0 = time.perf_counter()
        op()
        est = max(time.perf_counter() - t0, 1e-6)
        reps = torch.tensor([max(3, min(50, int(0.25 / est)))], device=device)
        dist.broadcast(reps, src=0)           # every rank runs the same number of collectives
        reps = int(reps)
        t0 = time.perf_counter()
        for _ in range(reps):
            op()
        rows.append(bandwidth_row(nbytes, (time.perf_counter() - t0) / reps, reps, size))
    return [bandwidth_result(name, rows, "all_reduce bus bandwidth per message size (float32, %d ranks, "
                             "%s, %s)" % (size, device, dist.get_backend()))]


def check_gpu(ctx):
    td = ctx.td
    if not td.gpu:
        # a GPU image fails here unless the user said --no-gpu (the same rule as every GPU check)
        status, why = gpu_absent(ctx.expect, ctx.args.no_gpu)
        return [result(n + TAG, status, why) for n in GPU_NAMES]
    torch, dist = td.torch, td.dist
    out = []
    local = int(os.environ.get("LOCAL_RANK", "0") or 0)
    ctx.phase("gpu devices")
    props = torch.cuda.get_device_properties(td.device)
    uuid = str(getattr(props, "uuid", td.device.index))
    out.append(result("gpu.devices" + TAG, PASS, "%d visible, local rank %d on cuda:%d %s (sm_%d%d)" % (
        torch.cuda.device_count(), local, td.device.index, props.name, props.major, props.minor),
        props.name, {"count": torch.cuda.device_count(), "name": props.name}))
    ctx.phase("gpu rank map")
    mine = {"rank": dist.get_rank(), "host": socket.gethostname(), "local_rank": local, "gpu": uuid}
    mapping = [None] * dist.get_world_size()
    dist.all_gather_object(mapping, mine)
    seen, dup = {}, []
    for m in mapping:
        key = (m["host"], m["gpu"])
        if key in seen:
            dup.append("ranks %d and %d share GPU %s on %s" % (seen[key], m["rank"], m["gpu"], m["host"]))
        seen[key] = m["rank"]
    out.append(result("gpu.rank_map" + TAG, FAIL if dup else PASS,
                      "; ".join(dup) if dup else "one device per local rank: " + ", ".join(
                          "rank %d -> %s:%s" % (m["rank"], m["host"], m["gpu"][:12]) for m in mapping),
                      "%d ranks, %d GPUs" % (len(mapping), len(seen)), {"map": mapping}))
    nname = "gpu.nccl_allreduce" + TAG
    if dist.get_backend() != "nccl":
        out.append(result(nname, FAIL if td.backend == "nccl" else SKIP,
                          "process group backend is %s, not nccl" % dist.get_backend()))
    else:
        ctx.phase("gpu collectives")
        exact = check_collectives(ctx, td.device)[0]
        bw = check_bandwidth(ctx, td.device, nname, GPU_BANDWIDTH_SIZES)[0]
        nccl = ".".join(str(x) for x in torch.cuda.nccl.version())
        if exact["status"] != PASS:
            out.append(result(nname, FAIL, "NCCL collectives wrong: " + exact["detail"]))
        else:
            out.append(result(nname, PASS, "NCCL %s: %s; %s" % (nccl, exact["figure"], bw["detail"]),
                              bw["figure"], bw.get("data")))
    ctx.phase("bf16 step")
    if not torch.cuda.is_bf16_supported():
        out.append(result("gpu.bf16_step" + TAG, SKIP, "%s has no bf16" % props.name))
        return out
    model = torch.nn.Linear(64, 64).to(td.device)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = model(torch.randn(32, 64, device=td.device))
    loss = y.float().pow(2).mean()
    loss.backward()
    ok = y.dtype == torch.bfloat16 and bool(torch.isfinite(loss)) and model.weight.grad is not None
    out.append(result("gpu.bf16_step" + TAG, PASS if ok else FAIL,
                      "autocast bf16 forward/backward on %s: output %s, loss %.4f" % (
                          props.name, y.dtype, float(loss)), "bf16"))
    return out


def run(ctx, run_checks, threads):
    """The worker's main for controller 'torch' (ctx: worker.Ctx with args/progress)."""
    ctx.ranks = ctx.args.ranks
    ctx.args_timeout = float(os.environ.get("ENVBUILDER_SMOKE_TIMEOUT", "120") or 120)

    def setup(c):
        c.phase("import torch")
        c.td = TorchDist(c, threads)
        c.td.gpu_setup()
        return check_init(c)

    if not run_checks(ctx, [("dist.init" + TAG, setup)]):
        return 3
    if ctx.progress.state["results"][-1]["status"] == FAIL:
        # a wrong world: every later number would describe another job than the one asked for
        return 3
    run_checks(ctx, [
        ("dist.collectives" + TAG, check_collectives),
        ("train.ddp" + TAG, check_train),
        ("perf.allreduce" + TAG, check_bandwidth),
    ] + ([(check_name(TAG), lambda c: [fabric_result(TAG, c.td.backend)])] if fabric() else []) + [
        ("gpu.devices" + TAG, check_gpu),
    ])
    end_process_group(ctx.td)
    return 0


def end_process_group(td):
    """Free the process group and every object that holds its work while the interpreter is whole.
    Gloo's worker threads can still hold finished work (tensors with Python references, DDP's
    reducer) when the interpreter finalizes; freeing them then takes the GIL of a dying interpreter
    and the rank aborts (SIGABRT, "terminate called without an active exception") after every check
    passed: pytorch/pytorch#190489, the abandoned fix #179291. Seen here under load (a 2-core
    machine at load 5-15). The worker then leaves without the interpreter's teardown (worker.main)."""
    try:
        if td.dist.is_initialized():
            td.dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - the checks' verdicts are already written
        pass
    gc.collect()
