"""CUDA, cuDNN and NCCL. From the base image (cuda.source: image): the nvidia/cuda images carry
them; this component pins NCCL when the spec asks for a release other than the image's. From PyPI
(cuda.source: pypi): the framework's nvidia-* wheels carry the libraries (their own pip group and
layer, lock/pip.py); this component adds the toolkit Horovod's NCCL build needs and removes it,
with every header, before the runtime stage copies the venv."""

from __future__ import annotations

from ..image import Copy, Step
from ...quoting import shell_word
from ...stack import Stack
from ...versions import minor
from .base import Component, Layer, LockNeeds
from .python import locked_pip, pip, pip_env, python_exe, site_packages


def _nccl_pin(stack: Stack) -> str | None:
    spec = stack.spec
    if not spec.cuda or stack.ngc or not spec.cuda.nccl:
        return None
    cu = stack.catalog.cuda(spec.cuda.version)
    if cu and cu["nccl"] == spec.cuda.nccl:
        return None
    return f"{spec.cuda.nccl}-1+cuda{minor(spec.cuda.version)}"


def devel_apt(stack: Stack) -> list[str]:
    pin = _nccl_pin(stack)
    return [f"libnccl2={pin}", f"libnccl-dev={pin}"] if pin else []


def runtime_apt(stack: Stack) -> list[str]:
    pin = _nccl_pin(stack)
    return [f"libnccl2={pin}"] if pin else []


# --- CUDA from PyPI (cuda: {source: pypi}) ----------------------------------------------------
# NVIDIA's wheels install into the venv's site-packages/nvidia/: CUDA 13 wheels share one tree,
# nvidia/cu13/{bin,include,lib,nvvm}; NCCL has nvidia/nccl/{include,lib}. The framework's wheels
# bring the libraries; Horovod's NCCL build also needs nvcc, the runtime headers and CCCL (the
# toolkit pip group, devel stage only).
CUDA_HOME = "/usr/local/cuda"


def pip_groups(stack: Stack) -> dict[str, list[str]]:
    """The lock's `toolkit` group: nvcc + headers, devel stage only (cuda: {source: pypi})."""
    return {"toolkit": [stack.cuda_toolkit_requirement]} if stack.cuda_toolkit_requirement else {}


def expect(stack: Stack) -> dict:
    """manifest.json expect's CUDA keys: the versions the suite checks, whether a GPU is due; with
    cuda: {source: pypi} also the source and the architectures the framework's kernels cover."""
    spec = stack.spec
    return {"cuda": spec.cuda.version if spec.cuda else None, "cudnn": stack.cudnn, "nccl": stack.nccl,
            "gpu": spec.cuda is not None}


def expect_pypi(stack: Stack) -> dict:
    """The keys a `source: pypi` stack adds after `packages` (older manifests stay as they were)."""
    if not stack.pypi_cuda:
        return {}
    out = {"cuda_source": "pypi", "cuda_arch": cuda_archs(stack) or []}
    runtime = locked_cuda_runtime(stack)
    if runtime:
        out["cuda_runtime"] = runtime
    return out


def locked_cuda_runtime(stack: Stack) -> str | None:
    """MAJOR.MINOR of the wheel the lock installs for libcudart (catalog `pypi_cuda_runtime_wheel`),
    or None without a lock. The framework may ask for a range: TensorFlow 2.21's `and-cuda` extra
    resolved cudart 12.9.79 on 2026-11-26 for a TensorFlow built with CUDA 12.5.1, so libcudart
    reports 12.9 while the framework's build info says 12.5 (docs/gpu.md)."""
    lock = stack.lock
    wheel = stack.catalog.data.get("pypi_cuda_runtime_wheel", {}).get(str(stack.cuda_major))
    if lock is None or not wheel:
        return None
    version = lock.pip_versions().get(wheel["name"])
    return ".".join(version.split(".")[:2]) if version else None


def wheel_tree(stack: Stack) -> str:
    return f"{site_packages(stack)}/nvidia/{stack.pypi_cuda.get('cuda_tree', 'cu' + str(stack.cuda_major))}"


def nccl_dir(stack: Stack) -> str:
    return f"{site_packages(stack)}/nvidia/nccl"


def toolkit_steps(stack: Stack) -> list[Step]:
    """nvcc, headers and CCCL from NVIDIA's wheels, laid out as the CUDA_HOME CMake and nvcc expect."""
    req = stack.cuda_toolkit_requirement
    if not req:
        return []
    tree, cmajor = wheel_tree(stack), stack.cuda_major
    target = stack.catalog.arch(stack.spec.target_arch)["cuda_target"]
    locked, mounts = locked_pip(stack, "toolkit")
    cmds = (locked or [f"{pip(stack)} {shell_word(req, 'cuda toolkit')}"]) + [
        f"ln -s lib {tree}/lib64",
        f"mkdir -p {tree}/targets",
        f"ln -s .. {tree}/targets/{target}",
        f"ln -s libcudart.so.{cmajor} {tree}/lib/libcudart.so",
        f"ln -s libnccl.so.2 {nccl_dir(stack)}/lib/libnccl.so",
        f"ln -s {tree} {CUDA_HOME}",
        f"{CUDA_HOME}/bin/nvcc --version",
    ]
    notes = [
        f"{req}: the framework's own cuda-toolkit pin plus nvcc and CCCL (source: PyPI METADATA of cuda-toolkit)",
        f"fix toolkit layout: nvcc.profile looks for include/ under targets/{target} and for lib64/; "
        "the wheels have lib/ only: symlinks make the CUDA_HOME an installer makes (source: nvcc.profile of "
        "nvidia-cuda-nvcc)",
        "fix link names: the wheels ship libcudart.so.N and libnccl.so.2 without the unversioned names "
        "CMake's find_library and -lcudart look for (source: RECORD of nvidia-cuda-runtime and nvidia-nccl-cu13)",
    ]
    hv = stack.spec.horovod
    what = " and ".join(w for w, on in (("Horovod's NCCL operations", bool(hv and "nccl" in hv.operations)),
                                        ("NCCL's network plugin", bool(stack.nccl_plugin_build))) if on)
    return [Step("cuda", f"CUDA toolkit wheels for compiling {what} ({CUDA_HOME} -> {tree})",
                 cmds, network=True, mounts=mounts, notes=notes, build_env=pip_env(stack))]


def toolkit_packages(stack: Stack) -> list[str]:
    """Distribution names of the toolkit group (what is removed again after the build)."""
    lock = stack.lock
    if lock and lock.pip.get("toolkit"):
        return sorted(e["name"] for e in lock.pip["toolkit"])
    return ["nvidia-cuda-cccl", "nvidia-cuda-crt", "nvidia-cuda-nvcc", "nvidia-nvvm"]


def slim_steps(stack: Stack) -> list[Step]:
    """The runtime stage copies the venv: drop nvcc and every header first (libraries stay)."""
    if not stack.pypi_cuda:
        return []
    sp = site_packages(stack)
    cmds = []
    if stack.cuda_toolkit_requirement:
        tree = wheel_tree(stack)
        cmds += [f"{python_exe(stack)} -m pip uninstall -y --disable-pip-version-check "
                 + " ".join(toolkit_packages(stack)),
                 f"rm -f {CUDA_HOME} {tree}/lib64 {tree}/lib/libcudart.so {nccl_dir(stack)}/lib/libnccl.so",
                 f"rm -rf {tree}/targets {tree}/bin {tree}/nvvm"]
    cmds += [f"rm -rf {sp}/nvidia/*/include",
             f"! ls {sp}/nvidia/*/bin/nvcc 2>/dev/null"]
    return [Step("cuda", "the runtime keeps NVIDIA's libraries, not nvcc or headers", cmds,
                 notes=["removed here, in the devel stage, so the venv the runtime stage copies has "
                        "one copy of each library and no toolkit"])]


def horovod_flags(stack: Stack) -> dict[str, str]:
    """Where Horovod's CMake finds CUDA and NCCL when they come from the wheels."""
    flags = {"HOROVOD_CUDA_HOME": CUDA_HOME, "CUDA_HOME": CUDA_HOME,
             "HOROVOD_NCCL_INCLUDE": f"{nccl_dir(stack)}/include", "HOROVOD_NCCL_LIB": f"{nccl_dir(stack)}/lib"}
    archs = cuda_archs(stack)
    if archs:
        flags["HOROVOD_BUILD_CUDA_CC_LIST"] = ",".join(a.replace(".", "") for a in archs)
    return flags


def cuda_archs(stack: Stack) -> list[str] | None:
    """The GPU architectures the image must run on: from the spec's oldest compute capability up,
    within what the framework's wheels are built for; else all of those."""
    wheels = stack.pypi_cuda or {}
    known = list(wheels.get("arch") or [])
    if stack.spec.target_arch != "x86_64":
        # pypi_cuda's `arch` is the x86_64 wheel's list; another machine's wheels carry their own
        # (catalog arch_lists: torch's aarch64 CUDA 13 builds have sm_80..sm_120 with 11.0, no 7.5/8.6)
        from ...compat.finding import context_for
        from ...compat.rules_gpu import arch_list

        found = arch_list(stack.spec, context_for(stack.spec, stack.catalog))
        known = list(found[0]) if found else []
    cc = stack.spec.cuda.compute_capability if stack.spec.cuda else None
    if not known:
        return [cc] if cc else None
    if cc:
        from ...versions import cmp, major

        # the cubin a GPU of this cc runs: the newest of its major at or below it (sm_80 for an
        # 8.6 GPU on aarch64, whose wheels carry no sm_86), then every newer one
        serving = [a for a in known if major(a) == major(cc) and cmp(a, cc) <= 0]
        start = serving[-1] if serving else cc
        return [a for a in known if cmp(a, start) >= 0] or [cc]
    return known


def wheel_steps(stack: Stack) -> list[Step]:
    """The NVIDIA wheels the framework depends on, in a layer before the framework's own: they change
    least. Only with a lock (its cuda group); without one the framework step installs them."""
    locked, mounts = locked_pip(stack, "cuda")
    if not locked:
        return []
    n = len(stack.lock.pip["cuda"])
    return [Step("cuda", f"NVIDIA's CUDA wheels the framework depends on ({n} wheels: CUDA runtime, cuDNN, "
                         f"NCCL, ...)", locked, network=True, mounts=mounts, build_env=pip_env(stack),
                 notes=["their own layer before the framework's: a framework or package change leaves it cached"])]


class Cuda(Component):
    def devel(self, stack: Stack) -> dict[Layer, list[Step]]:
        return {Layer.CUDA_WHEELS: wheel_steps(stack), Layer.CUDA_TOOLKIT: toolkit_steps(stack),
                Layer.CUDA_SLIM: slim_steps(stack)}

    def runtime(self, stack: Stack) -> list[Copy]:
        """NVIDIA's libraries (site-packages/nvidia, ~3.5 GB for CUDA 13) as a runtime layer of their
        own, before the rest of the venv: they change least, so a change of the framework or of
        packages.pip re-copies only the rest (BuildKit caches a COPY by the content it copies)."""
        if not stack.pypi_cuda or stack.ngc is not None:
            return []
        tree = f"{site_packages(stack)}/nvidia"
        return [Copy(tree, tree, from_stage="devel")]

    def lock_needs(self, stack: Stack) -> LockNeeds:
        return LockNeeds(apt={"devel": devel_apt(stack), "runtime": runtime_apt(stack)},
                         pip_groups=pip_groups(stack))

    def expect(self, stack: Stack) -> dict:
        return {**expect(stack), **expect_pypi(stack)}
