"""One rank (worker) of the tf-multiworker checks (manifest ``expect.distributed.kind ==
"tf-multiworker"``): tf.distribute.MultiWorkerMirroredStrategy from the launcher's environment.

The cluster comes from Slurm inside a job step (SlurmClusterResolver: SLURM_PROCID, the step's
node list and tasks per node, ports from MASTER_PORT) or, under the suite's own spawner, from
RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT (TF_CONFIG with one port per worker). Same progress
files and timeouts as the other workers.

  dist.init         the strategy: replicas in sync == ranks asked, task index == launch index
  dist.collectives  all_reduce (sum, max) exact for several dtypes and sizes
  train.mwms        a tiny data-parallel regression: loss falls, weights identical on every worker
  perf.allreduce    all_reduce time and bus bandwidth per message size

TensorFlow + the standard library only; Python >= 3.8.
"""

import json
import os
import socket
import subprocess
import time

from .common import FAIL, PASS, bandwidth_result, bandwidth_row, fmt_bytes, gpu_absent, result
from .dist_torch import launch_index
from .gloo_step import parse_tasks_per_node

TAG = "[tf]"
COUNTS = (1, 1023, 1 << 18)
DTYPES = ("float32", "float64", "int32", "int64")
SIZES = (4 << 10, 256 << 10, 4 << 20)
STEPS = 30


def plan():
    return ["dist.init" + TAG, "dist.collectives" + TAG, "train.mwms" + TAG, "perf.allreduce" + TAG,
            "gpu.devices" + TAG]


def gpus_on_node(env) -> int:
    """GPUs of this node in the job: Slurm's count (SLURM_GPUS_ON_NODE, set when the job asked
    for GPUs), else CUDA_VISIBLE_DEVICES, else nvidia-smi's list where there is one; 0 otherwise."""
    if env.get("SLURM_GPUS_ON_NODE", "").isdigit():
        return int(env["SLURM_GPUS_ON_NODE"])
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip()])
    try:
        out = subprocess.run(["nvidia-smi", "--list-gpus"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(line.startswith("GPU ") for line in out.stdout.splitlines()) if out.returncode == 0 else 0


def max_tasks_per_node(env) -> int:
    """The most tasks any node of the step runs: SLURM_STEP_TASKS_PER_NODE is e.g. '2(x2)' or '2,1'."""
    try:
        counts = parse_tasks_per_node(env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE"))
    except ValueError:
        counts = []
    return max(counts or [1])


def cluster_from_env():
    """(resolver or None, description): Slurm's step, else TF_CONFIG from the spawner's variables."""
    env = os.environ
    if env.get("SLURM_STEP_ID") and env.get("SLURM_PROCID") and not env.get("ENVBUILDER_SMOKE_RANK"):
        import tensorflow as tf
        port = int(env.get("MASTER_PORT") or 8888)
        # Left to itself the resolver counts GPUs with nvidia-smi, which a CPU node lacks
        # (FileNotFoundError), and with 0 GPUs its cluster_spec() takes range(0, 0, 0) and lists
        # no task (tensorflow/python/distribute/cluster_resolver/slurm_cluster_resolver.py,
        # get_num_gpus and cluster_spec). On a CPU node: one slot per task, CUDA_VISIBLE_DEVICES
        # left alone.
        gpus, tasks = gpus_on_node(env), max_tasks_per_node(env)
        if gpus:
            resolver = tf.distribute.cluster_resolver.SlurmClusterResolver(port_base=port, gpus_per_node=gpus)
        else:
            resolver = tf.distribute.cluster_resolver.SlurmClusterResolver(
                port_base=port, gpus_per_node=tasks, gpus_per_task=1, auto_set_gpu=False)
        return resolver, "SlurmClusterResolver (port base %d, %d GPU(s) per node)" % (port, gpus)
    size = int(env["WORLD_SIZE"])
    rank = int(env["RANK"])
    base = int(env["MASTER_PORT"])
    host = env.get("MASTER_ADDR", "127.0.0.1")
    workers = ["%s:%d" % (host, base + i) for i in range(size)]
    os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": workers},
                                          "task": {"type": "worker", "index": rank}})
    return None, "TF_CONFIG, %d workers from %s:%d" % (size, host, base)


def _per_worker(ctx, fn):
    """Run FN in the one replica of this worker and return its (local) result."""
    st = ctx.strategy
    out = st.run(fn)
    return st.experimental_local_results(out)[0]


def check_init(ctx):
    import tensorflow as tf
    name = "dist.init" + TAG
    resolver, how = cluster_from_env()
    ctx.phase("MultiWorkerMirroredStrategy (%s)" % how)
    t0 = time.time()
    if resolver is not None:
        ctx.strategy = tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver)
        task = resolver.task_id
    else:
        ctx.strategy = tf.distribute.MultiWorkerMirroredStrategy()
        task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    took = time.time() - t0
    size = ctx.strategy.num_replicas_in_sync
    info = {"replicas": size, "task_index": task, "launch_index": launch_index(), "how": how,
            "host": socket.gethostname(), "init_s": round(took, 3)}
    problems = []
    if ctx.ranks and size != ctx.ranks:
        problems.append("%d replicas in sync, expected %d ranks" % (size, ctx.ranks))
    if task != launch_index():
        problems.append("worker index %d but the launcher started rank %d" % (task, launch_index()))
    figure = "%d worker%s" % (size, "" if size == 1 else "s")
    if problems:
        return [result(name, FAIL, "; ".join(problems), figure, info)]
    return [result(name, PASS, "MultiWorkerMirroredStrategy in %.2f s: worker %d of %d on %s (%s)" % (
        took, task, size, info["host"], how), figure, info)]


def check_collectives(ctx):
    import tensorflow as tf
    name = "dist.collectives" + TAG
    size = ctx.strategy.num_replicas_in_sync
    rank = launch_index()
    failures, cases = [], 0
    for dtype in DTYPES:
        for count in COUNTS:
            base = tf.math.floormod(tf.range(count, dtype=tf.float64), 97.0)
            # all_reduce SUM, and all_gather (every worker's slot in order; ReduceOp has no MAX)
            ctx.phase("all_reduce sum %s x%d" % (dtype, count))

            def fn_sum(base=base, dtype=dtype):
                t = tf.cast(base + rank + 1, dtype)
                return tf.distribute.get_replica_context().all_reduce("SUM", t)
            got = _per_worker(ctx, fn_sum)
            cases += 1
            if not bool(tf.reduce_all(tf.equal(tf.cast(got, tf.float64), base * size + size * (size + 1) / 2.0))):
                failures.append("all_reduce sum %s x%d" % (dtype, count))
            ctx.phase("all_gather %s x%d" % (dtype, count))

            def fn_gather(base=base, dtype=dtype):
                t = tf.cast(base + 3 * rank, dtype)
                return tf.distribute.get_replica_context().all_gather(t, axis=0)
            got = tf.cast(_per_worker(ctx, fn_gather), tf.float64)
            want = tf.concat([base + 3 * r for r in range(size)], 0)
            cases += 1
            if not bool(tf.reduce_all(tf.equal(got, want))):
                failures.append("all_gather %s x%d" % (dtype, count))
    data = {"dtypes": list(DTYPES), "counts": list(COUNTS), "cases": cases}
    if failures:
        return [result(name, FAIL, "; ".join(failures[:8]), "%d/%d wrong" % (len(failures), cases), data)]
    return [result(name, PASS, "%d workers: all_reduce (sum) and all_gather exact for %s, %s elements" % (
        size, ", ".join(DTYPES), "/".join(str(c) for c in COUNTS)), "%d cases exact" % cases, data)]


def check_train(ctx):
    import tensorflow as tf
    name = "train.mwms" + TAG
    st = ctx.strategy
    size, rank = st.num_replicas_in_sync, launch_index()
    gen = tf.random.Generator.from_seed(99)
    w_true = gen.normal((8, 1))
    x_all = gen.normal((size * 64, 8))
    y_all = tf.tanh(x_all @ w_true)
    x, y = x_all[rank::size], y_all[rank::size]
    with st.scope():
        # MEAN aggregation: each worker's update is averaged across workers (data parallel SGD)
        w = tf.Variable(tf.zeros((8, 1)), aggregation=tf.VariableAggregation.MEAN)
        b = tf.Variable(tf.zeros((1,)), aggregation=tf.VariableAggregation.MEAN)

    def step():
        def replica():
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(tf.tanh(x @ w + b) - y))
            gw, gb = tape.gradient(loss, [w, b])
            w.assign_sub(0.5 * gw)
            b.assign_sub(0.5 * gb)
            return tf.distribute.get_replica_context().all_reduce("MEAN", loss)
        return st.run(replica)

    losses = []
    for i in range(STEPS):
        ctx.phase("step %d" % i)
        losses.append(float(st.experimental_local_results(step())[0]))

    def gather():
        flat = tf.concat([tf.reshape(w, [-1]), b], 0)
        return tf.distribute.get_replica_context().all_gather(tf.expand_dims(flat, 0), axis=0)
    every = _per_worker(ctx, gather)                    # one row per worker
    diff = float(tf.reduce_max(tf.reduce_max(every, 0) - tf.reduce_min(every, 0)))
    problems = []
    if not losses[-1] < losses[0] * 0.5:
        problems.append("loss did not fall: %.4f -> %.4f" % (losses[0], losses[-1]))
    if diff != 0.0:
        problems.append("workers' weights differ (max |diff| %.3g)" % diff)
    info = {"steps": STEPS, "loss_before": losses[0], "loss_after": losses[-1], "ranks_maxdiff_end": diff}
    detail = "%d steps, %d workers, own data shard each: loss %.4f -> %.4f; weights identical (max |diff| %.2g)" % (
        STEPS, size, losses[0], losses[-1], diff)
    figure = "loss %.3f -> %.3f" % (losses[0], losses[-1])
    return [result(name, FAIL if problems else PASS, ("; ".join(problems) + "; " if problems else "") + detail,
                   figure, info)]


def check_bandwidth(ctx):
    import tensorflow as tf
    name = "perf.allreduce" + TAG
    size = ctx.strategy.num_replicas_in_sync
    rows = []
    for nbytes in SIZES:
        ctx.phase("bandwidth %s" % fmt_bytes(nbytes))
        t = tf.ones((nbytes // 4,), tf.float32)

        def op(t=t):
            return ctx.strategy.run(lambda: tf.distribute.get_replica_context().all_reduce("SUM", t))
        op()
        reps = 5
        t0 = time.perf_counter()
        for _ in range(reps):
            op()
        rows.append(bandwidth_row(nbytes, (time.perf_counter() - t0) / reps, reps, size))
    return [bandwidth_result(name, rows, "all_reduce bus bandwidth per message size (float32, %d workers)"
                             % size)]


def check_gpu(ctx):
    import tensorflow as tf
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        status, why = gpu_absent(ctx.expect, ctx.args.no_gpu)
        return [result("gpu.devices" + TAG, status, why)]
    return [result("gpu.devices" + TAG, PASS, "%d visible: %s" % (len(gpus), ", ".join(g.name for g in gpus)),
                   "%d GPU(s)" % len(gpus))]


def run(ctx, run_checks, threads):
    ctx.ranks = ctx.args.ranks
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

    def setup(c):
        c.phase("import tensorflow")
        import tensorflow as tf
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        return check_init(c)

    if not run_checks(ctx, [("dist.init" + TAG, setup)]):
        return 3
    if ctx.progress.state["results"][-1]["status"] == FAIL:
        return 3
    run_checks(ctx, [("dist.collectives" + TAG, check_collectives), ("train.mwms" + TAG, check_train),
                     ("perf.allreduce" + TAG, check_bandwidth), ("gpu.devices" + TAG, check_gpu)])
    return 0
