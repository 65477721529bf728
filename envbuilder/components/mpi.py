"""MPI: the base OS's Open MPI package, or a pinned release tarball compiled with Slurm/PMI
support into /opt/openmpi, so the container's MPI wires up with the host's srun (hybrid model)."""

from __future__ import annotations

from ..plan import Copy, Step
from ..quoting import shell_word
from ..resolve import Stack

PREFIX = "/opt/openmpi"


def devel_apt(stack: Stack) -> list[str]:
    src = stack.mpi_source
    if src == "distro":
        return ["libopenmpi-dev", "openmpi-bin"]
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
    if src == "build" and stack.spec.mpi.pmi == "pmi2":
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
    folder = fname.split(".tar")[0]
    pmi = "--with-pmix=internal" if mpi.pmi == "pmix" else "--with-pmi=/usr --with-pmi-libdir=/usr/lib/x86_64-linux-gnu"
    return [Step("mpi", f"Open MPI {mpi.version} from the release tarball (sha256 checked), "
                        f"with Slurm and {mpi.pmi} support", [
        "mkdir -p /tmp/openmpi",
        f"curl -fsSL --retry 3 -o /tmp/openmpi/{fname} {shell_word(tar['url'], 'sources.url')}",
        f"echo '{tar['sha256']}  /tmp/openmpi/{fname}' | sha256sum -c -",
        f"tar -xjf /tmp/openmpi/{fname} -C /tmp/openmpi",
        # env -C / make -C instead of `cd`: the step leaves the shell's directory alone (hadolint DL3003)
        f"env -C /tmp/openmpi/{folder} ./configure --prefix={PREFIX} --with-slurm {pmi} --disable-man-pages --enable-shared --disable-static > /tmp/openmpi/configure.log",
        f"make -C /tmp/openmpi/{folder} -j\"$(nproc)\" > /tmp/openmpi/make.log",
        f"make -C /tmp/openmpi/{folder} install > /tmp/openmpi/install.log",
        "rm -rf /tmp/openmpi",
    ], network=True, notes=[f"source: {tar['url']} ({', '.join(tar['sources'])})"])]


def runtime_copies(stack: Stack) -> list[Copy]:
    return [Copy(PREFIX, PREFIX, from_stage="devel")] if stack.mpi_tarball else []


def runtime_env(stack: Stack) -> dict[str, str]:
    if not stack.spec.mpi and not (stack.ngc and stack.ngc.get("mpi")):
        return {}
    env = {}
    if stack.mpi_source == "build":
        env["PATH"] = f"{PREFIX}/bin:$PATH"
        env["LD_LIBRARY_PATH"] = f"{PREFIX}/lib:${{LD_LIBRARY_PATH:-}}"
    # Container MPI tips from Apptainer's MPI guide and slurm.md F1: no CMA single copy inside
    # user namespaces, and PMIx's shared-memory datastore off (ds12 breaks across versions).
    env["OMPI_MCA_btl_vader_single_copy_mechanism"] = "none"
    env["PMIX_MCA_gds"] = "hash"
    return env
