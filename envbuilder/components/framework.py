"""The deep-learning framework, from PyPI (or the index the spec names, or a wheelhouse)."""

from __future__ import annotations

from ..plan import Step
from ..quoting import shell_word
from ..resolve import Stack
from .python import pip, pip_env


def devel_steps(stack: Stack) -> list[Step]:
    fw = stack.spec.framework
    if stack.framework_from_base:
        return []
    from ..lock.render import pip_group

    index = stack.framework_index_url
    extra = f" --extra-index-url {shell_word(index, 'framework.index_url')}" if index else ""
    locked, mounts = pip_group(stack, "framework", f"{pip(stack)}{extra}")
    return [Step("framework", f"{fw.name} {fw.version}", locked or [
        f"{pip(stack)}{extra} {shell_word(stack.framework_requirement, 'framework')}",
    ], network=True, mounts=mounts, build_env=pip_env(stack))]


def pip_groups(stack: Stack) -> dict[str, list[str]]:
    """The lock's `framework` group (none when the base image brings the framework)."""
    return {} if stack.framework_from_base else {"framework": [stack.framework_requirement]}


def expect(stack: Stack) -> dict:
    """manifest.json expect.framework: what the smoke suite imports and compares."""
    fw = stack.spec.framework
    return {"name": fw.name, "module": fw.module, "version": fw.version}


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
