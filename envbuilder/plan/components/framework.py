"""The deep-learning framework, from PyPI (or the index the spec names, or a wheelhouse)."""

from __future__ import annotations

from ..image import Step
from ...quoting import shell_word
from ...stack import Stack
from .base import Component, Layer, LockNeeds
from .python import locked_pip, pip, pip_env


def devel_steps(stack: Stack) -> list[Step]:
    fw = stack.spec.framework
    if stack.framework_from_base:
        return []
    index = stack.framework_index_url
    extra = f" --extra-index-url {shell_word(index, 'framework.index_url')}" if index else ""
    locked, mounts = locked_pip(stack, "framework", f"{pip(stack)}{extra}")
    return [Step("framework", f"{fw.name} {fw.version}", locked or [
        f"{pip(stack)}{extra} " + " ".join(shell_word(r, "framework") for r in pip_groups(stack)["framework"]),
    ], network=True, mounts=mounts, build_env=pip_env(stack))]


def pip_groups(stack: Stack) -> dict[str, list[str]]:
    """The lock's `framework` group (none when the base image brings the framework)."""
    if stack.framework_from_base:
        return {}
    reqs = [stack.framework_requirement]
    fw = stack.spec.framework
    cap = (stack.catalog.framework_release(fw.name, fw.version) or {}).get("numpy")
    if cap:
        # a NumPy bound the wheel's metadata lacks (catalog, e.g. intel-tensorflow 2.14: numpy<2)
        reqs.append(f"numpy{cap}")
    return {"framework": reqs}


def expect(stack: Stack) -> dict:
    """manifest.json expect.framework: what the smoke suite imports and compares."""
    fw = stack.spec.framework
    out = {"name": fw.name, "module": fw.module, "version": fw.version}
    if not stack.framework_from_base:
        # the PyPI distribution that must own the module's files (intel-tensorflow, tensorflow-cpu
        # and tensorflow all install `tensorflow`): the smoke suite's framework.distribution
        out["distribution"] = stack.catalog.framework(fw.name)["pip"]
    return out


def cpu_env(stack: Stack) -> dict[str, str]:
    """The oneDNN / OpenMP variables the image and job.sbatch set for CPU TensorFlow (manifest
    expect.cpu_env: the smoke suite checks each rank sees them, and oneDNN is on)."""
    return {k: v for k, v in sorted(runtime_env(stack).items()) if k.startswith(("KMP_", "TF_ENABLE"))}


def runtime_env(stack: Stack) -> dict[str, str]:
    if not stack.cpu_threads_env:
        return {"TF_CPP_MIN_LOG_LEVEL": "1"} if stack.spec.framework.family == "tensorflow" else {}
    # CPU TensorFlow threading from the seeds (Intel's TF-on-CPU guidance): threads do not spin
    # after parallel regions, bind compactly to cores. OMP_NUM_THREADS comes from the job script
    # (cores per rank).
    return {
        "TF_CPP_MIN_LOG_LEVEL": "1",
        "TF_ENABLE_ONEDNN_OPTS": "1",
        "KMP_BLOCKTIME": "0",
        "KMP_AFFINITY": "granularity=fine,compact,1,0",
        "KMP_SETTINGS": "0",
    }


class Framework(Component):
    def devel(self, stack: Stack) -> dict[Layer, list[Step]]:
        return {Layer.FRAMEWORK: devel_steps(stack)}

    def env(self, stack: Stack) -> dict[str, str]:
        return runtime_env(stack)

    def lock_needs(self, stack: Stack) -> LockNeeds:
        return LockNeeds(pip_groups=pip_groups(stack))

    def expect(self, stack: Stack) -> dict:
        out: dict = {"framework": expect(stack)}
        if stack.cpu_threads_env:
            out["cpu_env"] = cpu_env(stack)
        dist = stack.spec.canonical().get("distributed")
        if dist:
            # how the ranks talk (torch.distributed: its backend and launcher); absent for specs
            # that only name horovod, whose manifests stay as they were
            out["distributed"] = {"kind": dist["kind"], "backend": stack.spec.torch_backend,
                                  "launcher": dist.get("launcher")}
        return out
