"""Rules for `distributed` (how the ranks talk): horovod | torch | tf-multiworker | none.

Run by compat/check.py (same Finding shape: rule code, reason, fix, sources).
"""

from __future__ import annotations

from ..spec.model import Spec
from .finding import ERROR, WARN, Context, Finding, rule


@rule
def distributed_kind(spec: Spec, ctx: Context):
    d, fw = spec.distributed, spec.framework
    if d.kind == "horovod" and not spec.horovod:
        yield Finding("DIST_HOROVOD_MISSING", ERROR, "distributed.kind",
                      "distributed.kind is horovod but the spec has no horovod section",
                      'add horovod: {version: "0.28.1", operations: [mpi, gloo]}, or use kind: torch '
                      "(torch.distributed) / tf-multiworker", [])
    if spec.horovod and d.kind != "horovod":
        yield Finding("DIST_HOROVOD_EXTRA", ERROR, "horovod",
                      f"the spec builds Horovod but distributed.kind is {d.kind}: the job script and "
                      "the smoke suite would not use it",
                      f"remove the horovod section (kind {d.kind}), or set distributed: {{kind: horovod}}",
                      [])
    for opt, owner in (("backend", "torch"), ("launcher", "torch"), ("tf_config", "tf-multiworker")):
        if getattr(d, opt) and d.kind != owner:
            yield Finding("DIST_OPTION", ERROR, f"distributed.{opt}",
                          f"{opt} is an option of kind {owner}, not of {d.kind}",
                          f"remove distributed.{opt}, or use kind: {owner}", [])
    if d.kind == "torch" and fw.family != "pytorch":
        yield Finding("DIST_FRAMEWORK", ERROR, "distributed.kind",
                      f"torch.distributed needs PyTorch; the framework is {fw.name}",
                      "use kind: tf-multiworker for TensorFlow (MultiWorkerMirroredStrategy)", [])
    if d.kind == "tf-multiworker" and fw.family != "tensorflow":
        yield Finding("DIST_FRAMEWORK", ERROR, "distributed.kind",
                      f"tf-multiworker (MultiWorkerMirroredStrategy) needs TensorFlow; the framework "
                      f"is {fw.name}", "use kind: torch for PyTorch (torch.distributed)", [])


@rule
def torch_backend(spec: Spec, ctx: Context):
    d = spec.distributed
    if not d.torch or spec.framework.family != "pytorch":
        return
    src = ["torch_dist_docs"]
    if d.backend == "nccl" and not spec.cuda:
        yield Finding("DIST_NCCL_CPU", ERROR, "distributed.backend",
                      "the NCCL backend needs GPUs; the image is a CPU stack (no cuda section)",
                      "use backend: gloo on CPU nodes, or add cuda: {...}", src)
    if d.backend == "mpi":
        yield Finding("DIST_MPI_BACKEND", ERROR, "distributed.backend",
                      "torch's binaries (PyPI, download.pytorch.org) have no MPI backend: "
                      "torch.distributed is_mpi_available() is False unless PyTorch is built from "
                      "source against an MPI",
                      "use backend: nccl (GPUs) or gloo (CPUs); srun still starts one rank per task", src)
    if d.backend == "gloo" and spec.cuda:
        yield Finding("DIST_GLOO_GPU", WARN, "distributed.backend",
                      "gloo on a GPU stack moves every gradient through host memory and TCP",
                      "use backend: nccl for GPU tensors", src)
