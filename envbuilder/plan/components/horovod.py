"""Horovod, compiled in the devel stage from the hash-checked sdist with exactly the
operations the spec asks, and the catalog's source fixes applied.

Everything envbuilder does for Horovod, in the order a build meets it: its facts are data in
compat/catalog.yaml (`horovod:` releases with the sdist's url and sha256, `patches:`) and its
rules are compat/rules.py's HVD_* (what cannot be built); here: what the lock must pin
(``pip_groups``, ``source_tarballs``), what the devel stage installs (``devel_apt``,
``devel_steps`` with ``build_flags`` and ``patches``) and what the smoke suite expects of it
(``expect``); no runtime environment (the venv carries it)."""

from __future__ import annotations

from ...lock.pins import source
from ...paths import VENV
from ..image import Step
from ...stack import Stack
from ...versions import satisfies
from . import cuda, mpi
from .base import Component, Layer, LockNeeds
from .python import locked_pip, pip, pip_env, python_exe

# Horovod 0.28.1's install_requires, pinned (PyPI, versions that support Python 3.8 - 3.13).
REQUIRES = ["cloudpickle==3.0.0", "packaging==24.0", "psutil==5.9.8", "PyYAML==6.0.1"]
# psutil publishes aarch64 wheels from 6.0.0 on (PyPI's file list of psutil, read 2026-11-28:
# 5.9.8 has x86_64 manylinux wheels and an sdist only; 6.0.0 has cp36-abi3 manylinux2014_aarch64):
# an aarch64 image takes 6.0.0 (Horovod asks psutil without a version), x86_64 images keep 5.9.8.
PSUTIL_AARCH64 = "psutil==6.0.0"


def requirements(stack: Stack) -> list[str]:
    """What Horovod needs at run time. horovod.torch's broadcast_object (used by
    broadcast_optimizer_state) turns tensors into bytes with `.numpy()` on every non-root rank,
    but the torch wheel does not bring numpy: without it rank 1 fails and rank 0 waits for ever
    (seen here with torch 2.13.0+cpu). TensorFlow brings its own numpy."""
    reqs = list(REQUIRES)
    if stack.spec.target_arch == "aarch64":
        reqs = [PSUTIL_AARCH64 if r.startswith("psutil==") else r for r in reqs]
    if stack.spec.framework.family == "pytorch":
        reqs.append("numpy==1.26.4" if tuple(int(p) for p in stack.python.split(".")) <= (3, 12) else "numpy==2.1.3")
    return reqs


def pip_groups(stack: Stack) -> dict[str, list[str]]:
    """The lock's `horovod` pip group (installed in its own layer, after the framework's)."""
    return {"horovod": requirements(stack)} if stack.horovod_sdist else {}


def source_tarballs(stack: Stack) -> list[dict]:
    """The sdist the lock records and the build downloads (hash from the catalog, checked against
    PyPI's when locking)."""
    sdist = stack.horovod_sdist
    if not sdist:
        return []
    return [{"name": "horovod", "version": stack.spec.horovod.version, "url": sdist["url"],
             "file": sdist["url"].rsplit("/", 1)[1], "sha256": sdist["sha256"], "index": "pypi"}]


def expect(stack: Stack) -> dict | None:
    """manifest.json expect.horovod: what the smoke suite checks (version, bindings, controllers,
    operations); None without Horovod."""
    hv = stack.spec.horovod
    if not hv:
        return None
    return {"version": hv.version, "frameworks": [stack.spec.framework.family],
            "controllers": list(hv.controllers), "operations": list(hv.operations)}


def patches(stack: Stack) -> list[tuple[str, dict]]:
    """The catalog's source fixes (`patches:`) this build applies, each as it applies to the
    framework release (a C++ standard at least the torch release's `cxx:`)."""
    hv, fw = stack.spec.horovod, stack.spec.framework
    if not hv or stack.horovod_from_base:
        return []
    out = []
    gcc = (stack.catalog.os(stack.os_name) or {}).get("gcc")      # the base's g++ (None: not in the catalog)
    for name, patch in sorted(stack.catalog.patches().items()):
        applies = patch["applies"]
        if not satisfies(hv.version, applies["horovod"]):
            continue
        if "cuda" in applies and not (stack.spec.cuda and satisfies(stack.spec.cuda.version, applies["cuda"])):
            continue
        if "gcc" in applies and not (gcc and satisfies(gcc, applies["gcc"])):
            continue        # a base the catalog does not know keeps the released sources' build
        families = [k for k in ("pytorch", "tensorflow") if k in applies]
        if families and not (fw.family in applies and satisfies(fw.version, applies[fw.family])):
            continue
        out.append((name, stack.catalog.patch_for(name, fw.family, fw.version)))
    return out


def cuda_cc_list(stack: Stack) -> str | None:
    """'50,60,70,...' from the catalog's arch list of the PyTorch CUDA wheels (None: unknown)."""
    if stack.spec.framework.family != "pytorch" or not stack.spec.cuda:
        return None
    from ...compat.finding import context_for
    from ...compat.rules_gpu import arch_list

    found = arch_list(stack.spec, context_for(stack.spec, stack.catalog))
    return ",".join(a.replace(".", "") for a in found[0]) if found else None


def build_flags(stack: Stack) -> dict[str, str]:
    hv, fw = stack.spec.horovod, stack.spec.framework
    flags = {
        "HOROVOD_WITH_TENSORFLOW" if fw.family == "tensorflow" else "HOROVOD_WITHOUT_TENSORFLOW": "1",
        "HOROVOD_WITH_PYTORCH" if fw.family == "pytorch" else "HOROVOD_WITHOUT_PYTORCH": "1",
        "HOROVOD_WITHOUT_MXNET": "1",
        "HOROVOD_WITH_MPI" if "mpi" in hv.operations else "HOROVOD_WITHOUT_MPI": "1",
        "HOROVOD_WITH_GLOO" if "gloo" in hv.operations else "HOROVOD_WITHOUT_GLOO": "1",
    }
    if "nccl" in hv.operations:
        flags.update({"HOROVOD_GPU_OPERATIONS": "NCCL", "HOROVOD_CUDA_HOME": "/usr/local/cuda",
                      "HOROVOD_NCCL_LINK": "SHARED"})
        if stack.pypi_cuda:
            flags.update(cuda.horovod_flags(stack))
        archs = cuda_cc_list(stack)
        if archs and "HOROVOD_BUILD_CUDA_CC_LIST" not in flags:
            # Horovod's CUDA kernels for the arches the framework itself carries (by default it
            # builds every arch `nvcc --help` lists: cmake/build_utils.py get_nvcc_flags)
            flags["HOROVOD_BUILD_CUDA_CC_LIST"] = archs
    else:
        flags["HOROVOD_CPU_OPERATIONS"] = "MPI" if "mpi" in hv.operations else "GLOO"
    return dict(sorted(flags.items()))


def devel_apt(stack: Stack) -> list[str]:
    if not stack.horovod_sdist:
        return []
    return ["cmake", "g++", "make"]


def devel_steps(stack: Stack) -> list[Step]:
    hv = stack.spec.horovod
    sdist = stack.horovod_sdist
    if not sdist:
        return []
    sdist = source(stack.lock, "horovod") or sdist       # the lock's hash is the one the build checks
    folder = f"/tmp/horovod/horovod-{hv.version}"
    cmds = [
        "mkdir -p /tmp/horovod",
        f"echo 'horovod=={hv.version} --hash=sha256:{sdist['sha256']}' > /tmp/horovod/requirements.txt",
        f"{pip(stack).replace(' install ', ' download ')} --no-deps --no-binary :all: --require-hashes "
        "-r /tmp/horovod/requirements.txt -d /tmp/horovod",
        f"tar -xzf /tmp/horovod/horovod-{hv.version}.tar.gz -C /tmp/horovod",
    ]
    notes = [f"source: {sdist['url']} (sha256 pinned)"]
    if "mpi" in hv.operations and stack.mpi_tarball:
        # the MPI built into its prefix is not on the devel stage's PATH: Horovod's CMake finds
        # MPI through the mpicc on PATH (HOROVOD_WITH_MPI=1 fails the build without one)
        cmds[:0] = [f'export PATH="{mpi.prefix(stack)}/bin:$PATH"']
        notes.append(f"MPI: {stack.spec.mpi.flavor} {stack.spec.mpi.version} from {mpi.prefix(stack)} (mpicc on PATH)")
    elif "mpi" in hv.operations and stack.mpi_source == "pypi":
        # the wheel's mpicc is in the venv's bin/, which the devel stage's PATH does not hold
        cmds[:0] = [f'export PATH="{VENV}/bin:$PATH"']
        notes.append(f"MPI: {stack.spec.mpi.flavor} {stack.spec.mpi.version} from PyPI ({VENV}/bin/mpicc on PATH)")
        if mpi.standard_abi(stack):
            # the MPI-5 standard ABI: FindMPI must find the *_abi wrappers and Horovod's sources the
            # ABI's define (source cmake_findmpi_abi); the install is checked below with ldd
            cmds[1:1] = mpi.abi_wrapper_cmds(stack) + [f'export PATH="{mpi.ABI_BIN}:$PATH"'] + mpi.abi_flags_cmd(stack)
            notes.append(f"MPI-5 standard ABI: {mpi.ABI_BIN}/mpicc, mpicxx run the wheel's mpicc_abi, mpicxx_abi "
                         "(with mpiexec beside them, where CMake's FindMPI looks first); CFLAGS/CXXFLAGS "
                         "-DMPI_ABI (Horovod's CMake does not take the wrapper's define)")
    if "nccl" in hv.operations:
        # Horovod's setup.py runs `make -j8` unless MAKEFLAGS is set (setup.py of horovod 0.28.1,
        # build_extensions): eight compilers at about 1 GB each (cc1plus: 0.9 GB seen here) on any builder.
        cmds[:0] = ['MAKEFLAGS="-j$(nproc)"', "export MAKEFLAGS"]
        notes.append("parallel make: one compiler per core, not the fixed -j8 Horovod's setup.py passes "
                     "without MAKEFLAGS (source: setup.py of horovod 0.28.1; nvcc and the torch extension "
                     "take about 1 GB each)")
    for name, patch in patches(stack):
        if "cxxflags" in patch:
            # a fix by compiler flags (CXXFLAGS reaches Horovod's CMake as CMAKE_CXX_FLAGS)
            cmds.append(f'export CXXFLAGS="${{CXXFLAGS:-}} {patch["cxxflags"]}"')
            notes.append(f"fix {name}: {patch['reason']}")
            continue
        old, new = patch["replace"]
        files = " ".join(f"{folder}/{f}" for f in patch["files"])
        cmds.append(f"sed -i 's/{old}/{new}/' {files}")
        cmds += [f"grep -q '{new}' {folder}/{f}" for f in patch["files"]]
        notes.append(f"fix {name}: {patch['reason']}")
    locked, mounts = locked_pip(stack, "horovod")
    if stack.lock:
        cmds += locked + [f"{pip(stack)} --no-build-isolation --no-deps {folder}"]
    else:
        cmds += [f"{pip(stack)} {' '.join(requirements(stack))}", f"{pip(stack)} --no-build-isolation {folder}"]
    # Released Horovod's setup.py compiles RelWithDebInfo: ~60 MB of DWARF in the torch extension
    # (67 MB -> 2 MB stripped). The catalog's horovod_release_build fix compiles it without -g;
    # the strip stays for the releases it does not cover. Symbols stay: backtraces name functions.
    cmds.append(f"find \"$({python_exe(stack)} -c 'import sysconfig; print(sysconfig.get_paths()[\"platlib\"])')/horovod\" "
                "-name '*.so' -exec strip --strip-debug {} +")
    if stack.mpi_source == "pypi" and "mpi" in hv.operations:
        # Horovod's MPI code must link the library the image promises (manifest expect.mpi.library)
        wanted = mpi.expect(stack)["library"].rsplit("/", 1)[1]
        cmds.append(f"for f in \"$({python_exe(stack)} -c 'import sysconfig; print(sysconfig.get_paths()[\"platlib\"])')"
                    f"\"/horovod/*/mpi_lib*.so; do ldd \"$f\" | grep -q '{wanted} => ' || "
                    f"{{ echo \"$f does not link {wanted}\" >&2; ldd \"$f\" >&2; exit 1; }}; done")
        if mpi.standard_abi(stack):
            cmds.append(f"rm -rf {mpi.ABI_BIN.rsplit('/', 1)[0]}")
    cmds.append("rm -rf /tmp/horovod")
    ops = ", ".join(hv.operations)
    return [Step("horovod", f"Horovod {hv.version} with {ops}, built against "
                            f"{stack.spec.framework.name} {stack.spec.framework.version}",
                 cmds, build_env={**build_flags(stack), **pip_env(stack)}, network=True, notes=notes,
                 mounts=mounts)]


class Horovod(Component):
    def devel(self, stack: Stack) -> dict[Layer, list[Step]]:
        return {Layer.HOROVOD: devel_steps(stack)}

    def lock_needs(self, stack: Stack) -> LockNeeds:
        return LockNeeds(apt={"devel": devel_apt(stack)}, pip_groups=pip_groups(stack),
                         tarballs=source_tarballs(stack))

    def expect(self, stack: Stack) -> dict:
        return {"horovod": expect(stack)}
