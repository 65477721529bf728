"""mpi4py compiled in the devel stage from its hash-checked sdist against the MPI-5 standard ABI.

With ``mpi: {abi: standard}`` the image's MPI code links ``libmpi_abi.so.1``; mpi4py's PyPI wheel
has builds for the MPICH and Open MPI ABIs only (catalog source mpi4py_wheel_abi), so an mpi4py the
spec lists in ``packages.pip`` is built from its sdist instead, as Horovod's is: the lock pins the
sdist (``source_tarballs``: url and sha256 from the catalog's ``mpi4py.sdists``, checked against
PyPI's when locking) and the build downloads it with ``pip --require-hashes``. mpi4py >= 4.1.0
builds for the standard ABI when asked (catalog ``mpi4py.standard_abi``: MPI4PY_BUILD_MPIABI=1,
and MPI4PY_BUILD_MPICC names the MPI wheel's ``mpicc_abi``, which compiles with -DMPI_ABI and
links -lmpi_abi). Its build requirement Cython (the sdist carries no generated C) is the lock's
``build`` group, installed into a folder of its own that the step removes: the runtime stage,
which copies the venv, gets the built mpi4py only. After the install the step checks with ldd
that the MPI extension links libmpi_abi.so.1 and not the MPICH ABI's libmpi.so.12, and loads it.
"""

from __future__ import annotations

from ...lock.pins import source
from ...paths import VENV
from ..image import Step
from ...stack import Stack
from . import mpi
from .base import Component, Layer, LockNeeds
from .python import locked_pip, pip, pip_env, python_exe

# mpi4py's build requirement beside setuptools (which the venv has): its floor is cython >= 3.0.1
# (conf/requirements-build-cython.txt of the 4.1.2 sdist, source mpi4py_mpiabi_build); this
# release is the one the image builds with, pinned for the recipes written without a lock.
BUILD_REQUIRES = ["Cython==3.2.9"]
GROUP = "build"                         # the lock's pip group of BUILD_REQUIRES (devel stage only)
WORK = "/tmp/mpi4py"
BUILD_DEPS = f"{WORK}/build-deps"       # BUILD_REQUIRES go here (PYTHONPATH), never into the venv


def sdist(stack: Stack) -> dict | None:
    """{version, url, sha256} when the image builds mpi4py from its sdist (Stack.mpi4py_sdist)."""
    return stack.mpi4py_sdist


def pip_groups(stack: Stack) -> dict[str, list[str]]:
    """The lock's `build` group: what compiling the sdist needs (devel stage only)."""
    return {GROUP: list(BUILD_REQUIRES)} if sdist(stack) else {}


def source_tarballs(stack: Stack) -> list[dict]:
    """The sdist the lock records and the build downloads (hash from the catalog, checked against
    PyPI's when locking)."""
    sd = sdist(stack)
    if not sd:
        return []
    return [{"name": "mpi4py", "version": sd["version"], "url": sd["url"], "file": sd["url"].rsplit("/", 1)[1],
             "sha256": sd["sha256"], "index": "pypi"}]


def build_env(stack: Stack) -> dict[str, str]:
    """What the build of the sdist sees: the catalog's opt-in, the ABI wrapper, the build requirements."""
    how = stack.catalog.mpi4py_standard_abi()
    wrapper = mpi.standard_abi(stack)["wrappers"]["mpicc"]
    return {**how["build_env"], how["mpicc_env"]: f"{VENV}/bin/{wrapper}", "PYTHONPATH": BUILD_DEPS}


def devel_steps(stack: Stack) -> list[Step]:
    sd = sdist(stack)
    if not sd:
        return []
    sd = source(stack.lock, "mpi4py") or sd            # the lock's hash is the one the build checks
    version = sd["version"]
    folder = f"{WORK}/mpi4py-{version}"
    abi = mpi.standard_abi(stack)
    wanted, legacy = abi["libmpi"], mpi.pypi(stack)["libmpi"]
    locked, mounts = locked_pip(stack, GROUP, f"{pip(stack)} --target {BUILD_DEPS}")
    platlib = f"$({python_exe(stack)} -c 'import sysconfig; print(sysconfig.get_paths()[\"platlib\"])')"
    cmds = [
        f"mkdir -p {WORK}",
        # (a lock whose build group is empty: the spec's packages, installed before, brought them)
        *(locked or ([] if stack.lock else [f"{pip(stack)} --target {BUILD_DEPS} {' '.join(BUILD_REQUIRES)}"])),
        f"echo 'mpi4py=={version} --hash=sha256:{sd['sha256']}' > {WORK}/requirements.txt",
        # no build isolation: the sdist's metadata is read with the venv's setuptools, so nothing
        # unpinned is fetched for it
        f"{pip(stack).replace(' install ', ' download ')} --no-deps --no-binary :all: --no-build-isolation "
        f"--require-hashes -r {WORK}/requirements.txt -d {WORK}",
        f"tar -xzf {WORK}/mpi4py-{version}.tar.gz -C {WORK}",
        # over any mpi4py wheel an earlier group brought (a package that depends on mpi4py; with a
        # lock the packages stage removes one from /opt/packages: components/packages.py)
        f"{pip(stack)} --no-build-isolation --no-deps --force-reinstall {folder}",
        # Python's CFLAGS carry -g: the extension's DWARF is 10 MB of its 12.5 (source
        # mpi4py_abi_here); symbols stay, as for Horovod's
        f"find \"{platlib}/mpi4py\" -name '*.so' -exec strip --strip-debug {{}} +",
        # the MPI extension links the standard ABI's library, not the MPICH ABI's
        f"for f in \"{platlib}\"/mpi4py/MPI*.so; do "
        f"ldd \"$f\" | grep -q '{wanted} => ' || {{ echo \"$f does not link {wanted}\" >&2; ldd \"$f\" >&2; exit 1; }}; "
        f"if ldd \"$f\" | grep -q '{legacy}'; then echo \"$f links {legacy} (the MPICH ABI)\" >&2; exit 1; fi; done",
        # and it loads (no MPI_Init: MPI_Get_library_version needs none)
        f"{python_exe(stack)} -c 'import mpi4py; mpi4py.rc.initialize = mpi4py.rc.finalize = False; "
        "from mpi4py import MPI; print(MPI.Get_library_version().splitlines()[0])'",
        f"rm -rf {WORK}",
    ]
    how = stack.catalog.mpi4py_standard_abi()
    notes = [f"source: {sd['url']} (sha256 pinned)",
             f"MPI-5 standard ABI: {' '.join(f'{k}={v}' for k, v in sorted(how['build_env'].items()))}, "
             f"{how['mpicc_env']}={VENV}/bin/{abi['wrappers']['mpicc']} (sources: {', '.join(how['sources'])})",
             f"build requirements {', '.join(BUILD_REQUIRES)} in {BUILD_DEPS} (PYTHONPATH), removed with it: the "
             "runtime stage gets the built mpi4py only"]
    return [Step("mpi4py", f"mpi4py {version} from its sdist against the MPI-5 standard ABI ({wanted})",
                 cmds, build_env={**build_env(stack), **pip_env(stack)}, network=True, notes=notes, mounts=mounts)]


class Mpi4py(Component):
    def devel(self, stack: Stack) -> dict[Layer, list[Step]]:
        return {Layer.MPI4PY: devel_steps(stack)}

    def lock_needs(self, stack: Stack) -> LockNeeds:
        return LockNeeds(pip_groups=pip_groups(stack), tarballs=source_tarballs(stack))
