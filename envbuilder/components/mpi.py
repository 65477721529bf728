"""MPI: the base OS's Open MPI package, or a pinned release tarball compiled with Slurm/PMI
support into its prefix (Open MPI: /opt/openmpi; MPICH: /opt/mpich), so the container's MPI wires
up with the host's srun (hybrid model).

MPICH is built as Spack builds it by default (compat/catalog.yaml source spack_mpich): device
ch4:ofi with the libfabric bundled in MPICH's tarball (``--with-libfabric=embedded``: the release's
own tested libfabric, no OS package at run time, the same on every base OS; its tcp/shm providers
run anywhere), embedded hwloc, Hydra (mpiexec/mpirun), the PMI-2 client srun --mpi=pmi2 talks to,
no Fortran. On Cray sites the MPICH-ABI library (libmpi.so.12) is what the site swaps its
cray-mpich into; there the host's MPI and libfabric carry the traffic."""

from __future__ import annotations

from ..plan import Copy, Step
from ..quoting import shell_word
from ..resolve import Stack
from ..versions import satisfies
from . import fabric

PREFIXES = {"openmpi": "/opt/openmpi", "mpich": "/opt/mpich"}   # where a built MPI goes, per flavor
PREFIX = PREFIXES["openmpi"]


def prefix(stack: Stack) -> str:
    return PREFIXES[stack.spec.mpi.flavor]


def devel_apt(stack: Stack) -> list[str]:
    src = stack.mpi_source
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
        return {"flavor": stack.spec.mpi.flavor, "version": stack.spec.mpi.version}
    return None


def devel_steps(stack: Stack) -> list[Step]:
    from ..lock.render import source

    tar = stack.mpi_tarball
    if not tar:
        return []
    mpi = stack.spec.mpi
    tar = source(stack, mpi.flavor) or tar          # the lock's hash is the one the build checks
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


def runtime_copies(stack: Stack) -> list[Copy]:
    return [Copy(prefix(stack), prefix(stack), from_stage="devel")] if stack.mpi_tarball else []


def runtime_env(stack: Stack) -> dict[str, str]:
    if not stack.spec.mpi and not (stack.ngc and stack.ngc.get("mpi")):
        return {}
    env = {}
    if stack.mpi_source == "build":
        env["PATH"] = f"{prefix(stack)}/bin:$PATH"
        env["LD_LIBRARY_PATH"] = f"{prefix(stack)}/lib:${{LD_LIBRARY_PATH:-}}"
    if stack.spec.mpi and stack.spec.mpi.flavor == "mpich" and stack.mpi_source != "image":
        return env
    # Container MPI tips from Apptainer's MPI guide and slurm.md F1: no CMA single copy inside
    # user namespaces, and PMIx's shared-memory datastore off (ds12 breaks across versions).
    env["OMPI_MCA_btl_vader_single_copy_mechanism"] = "none"
    env["PMIX_MCA_gds"] = "hash"
    return env
