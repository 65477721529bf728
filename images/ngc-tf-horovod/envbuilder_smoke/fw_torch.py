"""PyTorch side of the worker: horovod.torch ops, exact allreduce, a tiny CNN, GPU checks.

torch + horovod.torch + the standard library only (numpy is not needed).
"""

import os
import statistics
import time

from .common import scaled_base_lr


class TorchAdapter(object):
    key = "pytorch"
    hvd_module = "horovod.torch"
    dtypes = ("float32", "float64", "float16", "int32", "int64")

    def setup(self, ctx, threads):
        import torch
        import horovod.torch as hvd
        self.torch = torch
        self.hvd = hvd
        self.threads = threads
        torch.set_num_threads(threads)
        try:
            torch.set_num_interop_threads(max(1, min(2, threads)))
        except RuntimeError:
            pass
        self._name = 0
        # the first optimizer pulls in torch's lazy modules (~2 s): pay that at start-up,
        # not inside the timed training
        torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)

    def name(self, prefix):
        self._name += 1
        return "%s.%d" % (prefix, self._name)

    # ---------------------------------------------------------------- devices
    def gpu_available(self, ctx):
        torch = self.torch
        # test hook (not a user option): run the GPU checks' logic on the CPU
        self.fake_gpu = os.environ.get("ENVBUILDER_SMOKE_TEST_GPU_ON_CPU") == "1"
        if self.fake_gpu:
            return True
        try:
            ok = torch.cuda.is_available() and torch.cuda.device_count() > 0
        except Exception:  # noqa: BLE001
            ok = False
        if ok:
            torch.cuda.set_device(self.hvd.local_rank() % torch.cuda.device_count())
        return ok

    def device(self, kind):
        if kind == "gpu" and not getattr(self, "fake_gpu", False):
            return self.torch.device("cuda", self.torch.cuda.current_device())
        return self.torch.device("cpu")

    # ---------------------------------------------------------------- ops
    def binding_ops(self, ctx):
        torch, hvd = self.torch, self.hvd
        size, rank = hvd.size(), hvd.rank()
        ops, problems = [], []
        ctx.phase("binding allreduce")
        got = hvd.allreduce(torch.tensor([float(rank + 1)]), op=hvd.Sum, name=self.name("bind.ar"))
        want = size * (size + 1) / 2.0
        (ops if got.item() == want else problems).append(
            "allreduce" if got.item() == want else "allreduce gave %s, expected %s" % (got.item(), want))
        ctx.phase("binding broadcast")
        got = hvd.broadcast(torch.tensor([float(rank) + 7.0]), root_rank=0, name=self.name("bind.bc"))
        (ops if got.item() == 7.0 else problems).append(
            "broadcast" if got.item() == 7.0 else "broadcast gave %s, expected 7.0" % got.item())
        ctx.phase("binding allgather")
        got = hvd.allgather(torch.tensor([rank], dtype=torch.int64), name=self.name("bind.ag"))
        ok = got.tolist() == list(range(size))
        (ops if ok else problems).append("allgather" if ok else "allgather gave %s" % got.tolist())
        ctx.phase("binding grouped allreduce")
        try:
            outs = hvd.grouped_allreduce([torch.ones(3) * (rank + 1), torch.ones(2)], op=hvd.Sum,
                                         name=self.name("bind.gar"))
            ok = outs[0].tolist() == [want] * 3 and outs[1].tolist() == [float(size)] * 2
            (ops if ok else problems).append("grouped_allreduce" if ok else "grouped_allreduce wrong")
        except AttributeError:
            pass
        return {"ops": ops, "problems": problems}

    def allreduce_probe(self, ctx, kind, reps):
        torch, hvd = self.torch, self.hvd
        dev = self.device(kind)
        size = hvd.size()
        ok = True
        for _ in range(reps):
            t = torch.full((1024,), float(hvd.rank() + 1), device=dev)
            got = hvd.allreduce(t, op=hvd.Sum, name=self.name("probe.%s" % kind))
            ok = ok and bool((got == size * (size + 1) / 2.0).all().item())
        return ok

    def _values(self, dtype, count, rank, device):
        torch = self.torch
        base = (torch.arange(count, dtype=torch.int64, device=device) % 5) + 1
        return (base * (rank + 1)).to(getattr(torch, dtype)), base

    def exact_allreduce(self, ctx, dtype, count, op, size):
        torch, hvd = self.torch, self.hvd
        dev = self.device("cpu")
        t, base = self._values(dtype, count, hvd.rank(), dev)
        tri = size * (size + 1) // 2
        if op == "sum":
            got = hvd.allreduce(t, op=hvd.Sum, name=self.name("exact"))
            want = (base * tri).to(getattr(torch, dtype))
        else:
            got = hvd.allreduce(t, op=hvd.Average, name=self.name("exact"))
            want = (base.to(torch.float64) * tri / size).to(getattr(torch, dtype))
        if got.dtype != want.dtype:
            return "result dtype %s, expected %s" % (got.dtype, want.dtype)
        if not torch.equal(got, want):
            bad = (got != want).nonzero()
            i = int(bad[0][0]) if len(bad) else 0
            return "%d of %d elements wrong (element %d: %s, expected %s)" % (
                len(bad), count, i, got[i].item(), want[i].item())
        return ""

    def bw_op(self, nbytes, kind):
        """A callable that runs one float32 allreduce of NBYTES and waits for it."""
        torch, hvd = self.torch, self.hvd
        dev = self.device(kind)
        t = torch.ones(nbytes // 4, dtype=torch.float32, device=dev)
        name = self.name("bw%d" % nbytes)
        sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)

        def op():
            hvd.allreduce(t, op=hvd.Sum, name=name)
            sync()
        return op

    def bcast_int(self, value):
        t = self.torch.tensor([int(value)], dtype=self.torch.int64)
        return int(self.hvd.broadcast(t, 0, name=self.name("bcast_int")).item())

    def gather_objects(self, ctx, obj):
        return self.hvd.allgather_object(obj)

    # ---------------------------------------------------------------- training
    def _model(self):
        nn = self.torch.nn

        class Net(nn.Module):
            """The Keras MNIST example of the seeds: Conv32, Conv64, MaxPool, Dense128, Dense10."""

            def __init__(self):
                super(Net, self).__init__()
                self.conv1 = nn.Conv2d(1, 32, 3)
                self.conv2 = nn.Conv2d(32, 64, 3)
                self.pool = nn.MaxPool2d(2)
                self.fc1 = nn.Linear(64 * 12 * 12, 128)
                self.fc2 = nn.Linear(128, 10)

            def forward(self, x):
                x = self.torch_relu(self.conv1(x))
                x = self.pool(self.torch_relu(self.conv2(x)))
                x = x.flatten(1)
                return self.fc2(self.torch_relu(self.fc1(x)))

        Net.torch_relu = staticmethod(self.torch.relu)
        return Net()

    def _data(self, n, seed, device):
        torch = self.torch
        templates = torch.randn(10, 1, 28, 28, generator=torch.Generator().manual_seed(1234))
        g = torch.Generator().manual_seed(seed)
        y = torch.randint(0, 10, (n,), generator=g)
        x = templates[y] + 0.8 * torch.randn(n, 1, 28, 28, generator=g)
        return x.to(device), y.to(device)

    def _flat(self, model):
        return self.torch.cat([p.detach().reshape(-1).double() for p in model.parameters()])

    def _rank_diff(self, model, label):
        """Largest |w - w_rank0| over all ranks and weights (every rank gets the same answer)."""
        torch = self.torch
        vec = self._flat(model).cpu()   # on the host: works whatever GPU ops Horovod has
        ref = self.hvd.broadcast(vec.clone(), 0, name=self.name(label))
        mine = torch.tensor([float((vec - ref).abs().max().item())], dtype=torch.float64)
        every = self.hvd.allgather(mine, name=self.name(label + ".max"))
        return float(every.max().item()), float(vec.abs().max().item())

    def train(self, ctx, steps=12, warmup=4, batch=16, base_lr=None):
        torch, hvd = self.torch, self.hvd
        size, rank = hvd.size(), hvd.rank()
        base_lr = base_lr or scaled_base_lr(size)
        dev = self.device("gpu" if ctx.gpu else "cpu")
        ctx.phase("build model")
        torch.manual_seed(1000 + rank)  # different initial weights: broadcast must fix them
        model = self._model().to(dev)
        ctx.phase("compare initial weights")
        initial_diff, _ = self._rank_diff(model, "train.init")
        opt = torch.optim.SGD(model.parameters(), lr=base_lr, momentum=0.9)
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), op=hvd.Average)
        ctx.phase("broadcast parameters")
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(opt, root_rank=0)
        ctx.phase("compare weights after broadcast")
        after_bcast, _ = self._rank_diff(model, "train.bcast")
        ctx.phase("generate data, loss before")
        x, y = self._data(steps * batch, 100 + rank, dev)    # each rank its own shard
        ex, ey = self._data(128, 999, dev)                   # the same eval batch everywhere
        lossf = torch.nn.functional.cross_entropy
        with torch.no_grad():
            loss_before = float(lossf(model(ex), ey).item())
        lrs, times, losses = [], [], []
        for k in range(steps):
            ctx.phase("train step %d/%d" % (k + 1, steps))
            # linear warm-up from base_lr to base_lr * size (Goyal et al.)
            lr = base_lr * (1.0 + (size - 1.0) * min(1.0, (k + 1.0) / warmup))
            for group in opt.param_groups:
                group["lr"] = lr
            lrs.append(lr)
            t0 = time.perf_counter()
            opt.zero_grad()
            loss = lossf(model(x[k * batch:(k + 1) * batch]), y[k * batch:(k + 1) * batch])
            loss.backward()
            opt.step()
            if dev.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
            losses.append(float(loss.item()))
        ctx.phase("loss after")
        with torch.no_grad():
            loss_after = float(lossf(model(ex), ey).item())
        ctx.phase("compare weights")
        end_diff, absmax = self._rank_diff(model, "train.end")
        timed = times[2:] if len(times) > 4 else times
        return {"framework": "pytorch", "device": str(dev), "steps": steps, "warmup": warmup,
                "batch": batch, "base_lr": base_lr, "lrs": lrs, "losses": [round(v, 5) for v in losses],
                "loss_before": loss_before, "loss_after": loss_after,
                "ranks_maxdiff_initial": initial_diff, "ranks_maxdiff_after_bcast": after_bcast,
                "ranks_maxdiff_end": end_diff, "weight_absmax": absmax,
                "step_s": statistics.median(timed), "steps_timed": len(timed),
                "first_step_s": times[0] if times else None,
                "threads": self.threads}

    # ---------------------------------------------------------------- GPU
    def gpu_devices(self, ctx):
        torch = self.torch
        if self.fake_gpu:
            return {"count": 1, "names": ["cpu (test hook)"], "mine": "cpu-%d" % self.hvd.local_rank(),
                    "index": 0, "cuda": None, "capability": "-"}
        count = torch.cuda.device_count()
        names = [torch.cuda.get_device_name(i) for i in range(count)]
        cur = torch.cuda.current_device()
        props = torch.cuda.get_device_properties(cur)
        uuid = str(getattr(props, "uuid", "")) or "%s#%d" % (names[cur], cur)
        return {"count": count, "names": names, "mine": uuid, "index": cur,
                "cuda": torch.version.cuda, "capability": "%d.%d" % (props.major, props.minor)}

    def mixed_precision_step(self, ctx, kind="gpu"):
        """One Horovod step under autocast: float16 + GradScaler on a GPU (bfloat16, no scaler,
        when KIND is 'cpu', which only the tests use)."""
        torch = self.torch
        dev = self.device(kind)
        cuda = dev.type == "cuda"
        half = torch.float16 if cuda else torch.bfloat16
        torch.manual_seed(7)
        model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(),
                                    torch.nn.Linear(256, 10)).to(dev)
        opt = self.hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                            named_parameters=model.named_parameters())
        self.hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        scaler = None
        if cuda:
            try:
                scaler = torch.amp.GradScaler("cuda")
            except (AttributeError, TypeError):
                scaler = torch.cuda.amp.GradScaler()
        x = torch.randn(64, 256, device=dev)
        y = torch.randint(0, 10, (64,), device=dev)
        before = model[0].weight.detach().clone()
        times = []
        dtype = None
        loss = None
        for _ in range(3):
            t0 = time.perf_counter()
            opt.zero_grad()
            with torch.autocast(device_type=dev.type, dtype=half):
                out = model(x)
                dtype = out.dtype
                loss = torch.nn.functional.cross_entropy(out.float(), y)
            if scaler is not None:
                scaler.scale(loss).backward()
                opt.synchronize()
                scaler.unscale_(opt)
                with opt.skip_synchronize():
                    scaler.step(opt)
                scaler.update()
                torch.cuda.synchronize()
            else:
                loss.backward()
                opt.step()
            times.append(time.perf_counter() - t0)
        changed = not torch.equal(before, model[0].weight.detach())
        finite = bool(torch.isfinite(loss).item())
        ok = finite and changed and dtype == half
        return {"ok": ok, "detail": "autocast %s%s + Horovod DistributedOptimizer: activations %s, "
                "loss %.4f %s, weights %s" % (str(half).replace("torch.", ""),
                                              " + GradScaler" if scaler is not None else "", dtype,
                                              float(loss.item()), "finite" if finite else "NOT finite",
                                              "updated" if changed else "NOT updated"),
                "figure": "%.2f ms/step" % (min(times) * 1000), "step_ms": min(times) * 1000}
