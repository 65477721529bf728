"""TensorFlow side of the worker: horovod.tensorflow(.keras) ops, exact allreduce, the seeds'
Keras MNIST CNN on generated data, GPU checks.

tensorflow (+ the numpy it brings) + horovod + the standard library only. Imported only when
the manifest's framework is TensorFlow.
"""

import os
import statistics
import time

from .common import scaled_base_lr


class TFAdapter(object):
    key = "tensorflow"
    hvd_module = "horovod.tensorflow"
    dtypes = ("float32", "float64", "float16", "int32", "int64")

    def setup(self, ctx, threads):
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
        import numpy as np
        import tensorflow as tf
        import horovod.tensorflow as hvd
        self.np, self.tf, self.hvd = np, tf, hvd
        self.threads = threads
        try:
            tf.config.threading.set_intra_op_parallelism_threads(threads)
            tf.config.threading.set_inter_op_parallelism_threads(max(1, min(2, threads)))
        except RuntimeError:
            pass
        self._name = 0
        self._gpus = []
        try:
            self._gpus = tf.config.list_physical_devices("GPU")
        except Exception:  # noqa: BLE001
            self._gpus = []
        if self._gpus:
            # one GPU per local rank; must happen before TF touches a device
            local = int(os.environ.get("HOROVOD_LOCAL_RANK") or os.environ.get(
                "OMPI_COMM_WORLD_LOCAL_RANK") or os.environ.get("SLURM_LOCALID") or 0)
            mine = self._gpus[local % len(self._gpus)]
            try:
                tf.config.experimental.set_memory_growth(mine, True)
                tf.config.set_visible_devices([mine], "GPU")
            except RuntimeError:
                pass
            self._mine = mine

    def name(self, prefix):
        self._name += 1
        return "%s.%d" % (prefix, self._name)

    def gpu_available(self, ctx):
        return bool(self._gpus)

    def _device(self, kind):
        return "/GPU:0" if kind == "gpu" else "/CPU:0"

    # ---------------------------------------------------------------- ops
    def binding_ops(self, ctx):
        tf, hvd = self.tf, self.hvd
        size, rank = hvd.size(), hvd.rank()
        ops, problems = [], []
        want = size * (size + 1) / 2.0
        ctx.phase("binding allreduce")
        got = float(hvd.allreduce(tf.constant([float(rank + 1)]), op=hvd.Sum,
                                  name=self.name("bind.ar")).numpy()[0])
        (ops if got == want else problems).append(
            "allreduce" if got == want else "allreduce gave %s, expected %s" % (got, want))
        ctx.phase("binding broadcast")
        got = float(hvd.broadcast(tf.constant([float(rank) + 7.0]), 0, name=self.name("bind.bc")).numpy()[0])
        (ops if got == 7.0 else problems).append(
            "broadcast" if got == 7.0 else "broadcast gave %s, expected 7.0" % got)
        ctx.phase("binding allgather")
        got = hvd.allgather(tf.constant([rank], dtype=tf.int64), name=self.name("bind.ag")).numpy().tolist()
        ok = got == list(range(size))
        (ops if ok else problems).append("allgather" if ok else "allgather gave %s" % got)
        ctx.phase("binding keras")
        try:
            import horovod.tensorflow.keras as hvdk  # noqa: F401 - the Keras binding must import
            ops.append("keras")
        except Exception as exc:  # noqa: BLE001
            problems.append("import horovod.tensorflow.keras: %s" % exc)
        return {"ops": ops, "problems": problems}

    def allreduce_probe(self, ctx, kind, reps):
        tf, hvd = self.tf, self.hvd
        size = hvd.size()
        ok = True
        with tf.device(self._device(kind)):
            for _ in range(reps):
                t = tf.fill([1024], float(hvd.rank() + 1))
                got = hvd.allreduce(t, op=hvd.Sum, name=self.name("probe.%s" % kind))
                ok = ok and bool(self.np.all(got.numpy() == size * (size + 1) / 2.0))
        return ok

    def exact_allreduce(self, ctx, dtype, count, op, size):
        np, tf, hvd = self.np, self.tf, self.hvd
        base = (np.arange(count, dtype=np.int64) % 5) + 1
        tri = size * (size + 1) // 2
        t = tf.constant((base * (hvd.rank() + 1)).astype(dtype))
        if op == "sum":
            got = hvd.allreduce(t, op=hvd.Sum, name=self.name("exact"))
            want = (base * tri).astype(dtype)
        else:
            got = hvd.allreduce(t, op=hvd.Average, name=self.name("exact"))
            want = (base.astype(np.float64) * tri / size).astype(dtype)
        got = got.numpy()
        if got.dtype != want.dtype:
            return "result dtype %s, expected %s" % (got.dtype, want.dtype)
        if not np.array_equal(got, want):
            bad = np.nonzero(got != want)[0]
            return "%d of %d elements wrong (element %d: %s, expected %s)" % (
                len(bad), count, bad[0], got[bad[0]], want[bad[0]])
        return ""

    def bw_op(self, nbytes, kind):
        tf, hvd = self.tf, self.hvd
        with tf.device(self._device(kind)):
            t = tf.ones([nbytes // 4], dtype=tf.float32)
        name = self.name("bw%d" % nbytes)

        def op():
            with tf.device(self._device(kind)):
                out = hvd.allreduce(t, op=hvd.Sum, name=name)
            out.numpy()  # wait for the result
        return op

    def bcast_int(self, value):
        t = self.tf.constant([int(value)], dtype=self.tf.int64)
        return int(self.hvd.broadcast(t, 0, name=self.name("bcast_int")).numpy()[0])

    def gather_objects(self, ctx, obj):
        return self.hvd.allgather_object(obj, name=self.name("gather_obj"))

    # ---------------------------------------------------------------- training
    def _data(self, n, seed):
        np = self.np
        templates = np.random.RandomState(1234).randn(10, 28, 28, 1).astype("float32")
        rs = np.random.RandomState(seed)
        y = rs.randint(0, 10, size=n)
        x = templates[y] + 0.8 * rs.randn(n, 28, 28, 1).astype("float32")
        return x.astype("float32"), y.astype("int64")

    def _flat(self, model):
        np = self.np
        return np.concatenate([w.reshape(-1).astype("float64") for w in model.get_weights()])

    def _rank_diff(self, model, label):
        np = self.np
        """Largest |w - w_rank0| over all ranks and weights (every rank gets the same answer)."""
        vec = self._flat(model)
        ref = self.hvd.broadcast(self.tf.constant(vec), 0, name=self.name(label)).numpy()
        mine = self.tf.constant([float(np.max(np.abs(vec - ref)))], dtype=self.tf.float64)
        every = self.hvd.allgather(mine, name=self.name(label + ".max")).numpy()
        return float(np.max(every)), float(np.max(np.abs(vec)))

    def train(self, ctx, steps=12, warmup=4, batch=16, base_lr=None):
        tf, hvd = self.tf, self.hvd
        import horovod.tensorflow.keras as hvdk
        size, rank = hvd.size(), hvd.rank()
        base_lr = base_lr or scaled_base_lr(size)
        keras = tf.keras
        tf.random.set_seed(1000 + rank)  # different initial weights: broadcast must fix them
        model = keras.Sequential([
            keras.layers.Conv2D(32, 3, activation="relu", input_shape=(28, 28, 1)),
            keras.layers.Conv2D(64, 3, activation="relu"),
            keras.layers.MaxPooling2D(2),
            keras.layers.Flatten(),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dense(10),
        ])
        initial_diff, _ = self._rank_diff(model, "train.init")
        try:
            sgd = keras.optimizers.legacy.SGD(learning_rate=base_lr * size, momentum=0.9)
        except AttributeError:
            sgd = keras.optimizers.SGD(learning_rate=base_lr * size, momentum=0.9)
        opt = hvdk.DistributedOptimizer(sgd)
        lossf = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        model.compile(loss=lossf, optimizer=opt)
        x, y = self._data(steps * batch, 100 + rank)
        ex, ey = self._data(128, 999)
        # broadcast first so that the loss before training is rank 0's model on every rank
        ctx.phase("broadcast variables")
        for v in model.variables:
            v.assign(hvd.broadcast(v, 0, name=self.name("bcast." + v.name.replace(":", "_"))))
        after_bcast, _ = self._rank_diff(model, "train.bcast")
        loss_before = float(lossf(ey, model(ex, training=False)).numpy())
        lrs, times = [], []
        epochs = max(2, -(-steps // warmup))

        class Recorder(keras.callbacks.Callback):
            def on_epoch_begin(self, epoch, logs=None):
                self.epoch = epoch

            def on_train_batch_begin(self, b, logs=None):
                ctx.phase("train step %d/%d" % (len(times) + 1, epochs * warmup))
                self.t0 = time.perf_counter()

            def on_train_batch_end(self, b, logs=None):
                times.append(time.perf_counter() - self.t0)
                lrs.append(float(keras.backend.get_value(self.model.optimizer.lr)))

            def on_train_end(self, logs=None):
                ctx.phase("end of fit")

        callbacks = [
            hvdk.callbacks.BroadcastGlobalVariablesCallback(0),
            hvdk.callbacks.MetricAverageCallback(),
            # warm-up over the first epoch (WARMUP steps) from base_lr to base_lr * size
            hvdk.callbacks.LearningRateWarmupCallback(initial_lr=base_lr * size, warmup_epochs=1,
                                                      steps_per_epoch=warmup, verbose=0),
            Recorder(),
        ]
        data = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch).repeat()
        hist = model.fit(data, epochs=epochs, steps_per_epoch=warmup, verbose=0, callbacks=callbacks)
        ctx.phase("loss after")
        loss_after = float(lossf(ey, model(ex, training=False)).numpy())
        ctx.phase("compare weights")
        end_diff, absmax = self._rank_diff(model, "train.end")
        timed = times[2:] if len(times) > 4 else times
        return {"framework": "tensorflow", "device": "/GPU:0" if self._gpus else "/CPU:0",
                "steps": len(times), "warmup": warmup, "batch": batch, "base_lr": base_lr,
                "lrs": lrs, "losses": [round(float(v), 5) for v in hist.history.get("loss", [])],
                "loss_before": loss_before, "loss_after": loss_after,
                "ranks_maxdiff_initial": initial_diff, "ranks_maxdiff_after_bcast": after_bcast,
                "ranks_maxdiff_end": end_diff, "weight_absmax": absmax,
                "step_s": statistics.median(timed), "steps_timed": len(timed), "threads": self.threads,
                "first_step_s": times[0] if times else None}

    # ---------------------------------------------------------------- GPU
    def gpu_devices(self, ctx):
        tf = self.tf
        names = []
        for g in self._gpus:
            try:
                names.append(tf.config.experimental.get_device_details(g).get("device_name", g.name))
            except Exception:  # noqa: BLE001
                names.append(g.name)
        mine = getattr(self, "_mine", None)
        uid = mine.name if mine is not None else "?"
        try:
            details = tf.config.experimental.get_device_details(mine)
            uid = "%s (%s)" % (mine.name, details.get("device_name", ""))
        except Exception:  # noqa: BLE001
            pass
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible:
            uid = "%s CUDA_VISIBLE_DEVICES=%s" % (uid, visible)
        return {"count": len(self._gpus), "names": names, "mine": uid,
                "cuda": tf.sysconfig.get_build_info().get("cuda_version")}

    def mixed_precision_step(self, ctx, kind="gpu"):
        """One Horovod Keras step under the mixed_float16 policy with loss scaling on a GPU
        (mixed_bfloat16 when KIND is 'cpu', which only the tests use)."""
        tf = self.tf
        keras = tf.keras
        import horovod.tensorflow.keras as hvdk
        policy = "mixed_float16" if kind == "gpu" else "mixed_bfloat16"
        old = keras.mixed_precision.global_policy()
        keras.mixed_precision.set_global_policy(policy)
        try:
            with tf.device(self._device(kind)):
                model = keras.Sequential([keras.layers.Dense(256, activation="relu", input_shape=(256,)),
                                          keras.layers.Dense(10),
                                          keras.layers.Activation("linear", dtype="float32")])
                try:
                    inner = keras.optimizers.legacy.SGD(0.01)
                except AttributeError:
                    inner = keras.optimizers.SGD(0.01)
                if policy == "mixed_float16":
                    inner = keras.mixed_precision.LossScaleOptimizer(inner)
                opt = hvdk.DistributedOptimizer(inner)
                model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                              optimizer=opt)
                x = self.np.random.RandomState(0).randn(64, 256).astype("float32")
                y = self.np.random.RandomState(1).randint(0, 10, size=64)
                before = model.get_weights()[0].copy()
                times = []
                loss = None
                for _ in range(3):
                    t0 = time.perf_counter()
                    loss = float(model.train_on_batch(x, y))
                    times.append(time.perf_counter() - t0)
            compute = model.layers[0].compute_dtype
            changed = not self.np.array_equal(before, model.get_weights()[0])
        finally:
            keras.mixed_precision.set_global_policy(old)
        want = "float16" if policy == "mixed_float16" else "bfloat16"
        ok = compute == want and changed and bool(self.np.isfinite(loss))
        return {"ok": bool(ok), "detail": "%s policy%s + Horovod DistributedOptimizer: compute %s, "
                "loss %.4f, weights %s" % (policy, " + LossScaleOptimizer" if want == "float16" else "",
                                           compute, loss, "updated" if changed else "NOT updated"),
                "figure": "%.2f ms/step" % (min(times[1:] or times) * 1000),
                "step_ms": min(times[1:] or times) * 1000}
