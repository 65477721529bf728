"""The site's fabric in the image (cluster.fabric, a site profile's key): the libraries an RDMA
fabric needs in the runtime stage (rdma-core/libibverbs and its providers, UCX, libfabric; Debian
packages, locked and hashed by the apt lock like every other package) and, for a source-built
Open MPI, the headers its `--with-ucx`/`--with-ofi` build needs. The facts per fabric are
compat/catalog.yaml `fabrics` (each with its source); `tcp` or no fabric adds nothing, so those
images are unchanged. The variables go to job.sbatch (render/sbatch.py), not into the image: one
image serves several sites.

Where the OS's libfabric is too old for the fabric (EFA: aws-ofi-nccl's AWS platform build needs
libfabric >= 1.22, Debian 12 has 1.17), the image builds libfabric from its release tarball into
its own prefix (``libfabric_build``), and a CUDA image gets NCCL's libfabric network plugin
(aws-ofi-nccl, ``nccl_plugin_build``) built against it and the CUDA toolkit: both tarballs pinned
with their sha256 in the lock's sources and checked by ``sha256sum -c`` at build, as the MPI
tarballs are (components/mpi.py)."""

from __future__ import annotations

from ...lock.pins import source
from ..image import Copy, Step
from ...quoting import shell_word
from ...stack import Stack
from .base import LD_PATH_TAIL, Component, Layer, LockNeeds
from .cuda import CUDA_HOME


def _builds_open_mpi(stack: Stack) -> bool:
    return bool(stack.spec.mpi) and stack.spec.mpi.flavor == "openmpi" and stack.mpi_source == "build"


def devel_apt(stack: Stack) -> list[str]:
    if not stack.fabric_libraries:
        return []
    pkgs = list(stack.fabric.get("ompi_devel_apt") or []) if _builds_open_mpi(stack) else []
    if stack.libfabric_build:
        pkgs += stack.fabric.get("libfabric_devel_apt") or []
    if stack.nccl_plugin_build:
        pkgs += stack.nccl_plugin_build["devel_apt"]
    return sorted(set(pkgs))


def runtime_apt(stack: Stack) -> list[str]:
    return list(stack.fabric["apt"]) if stack.fabric_libraries else []


def ompi_configure(stack: Stack) -> list[str]:
    """Open MPI's configure options for the fabric (--with-ucx=/usr, --with-ofi=/usr)."""
    if not stack.fabric_libraries or not _builds_open_mpi(stack):
        return []
    return list(stack.fabric.get("ompi_configure") or [])


def libfabric_prefix(stack: Stack) -> str:
    """Where the image's libfabric is: its own build's prefix, else the OS's (/usr)."""
    return stack.libfabric_build["prefix"] if stack.libfabric_build else "/usr"


def source_tarballs(stack: Stack) -> list[dict]:
    """The tarballs the lock records (libfabric's, then the plugin's) and the build checks."""
    out = []
    for name, want in (("libfabric", stack.libfabric_build), ("nccl-plugin", stack.nccl_plugin_build)):
        if want:
            out.append({"name": name, "version": want["version"], "url": want["url"],
                        "file": want["url"].rsplit("/", 1)[1], "sha256": want["sha256"], "index": None})
    return out


def _fetch_and_unpack(stack: Stack, name: str, want: dict, work: str) -> tuple[list[str], str, str]:
    """Commands that download NAME's tarball (the lock's sha256 checked) and unpack it: (commands,
    the unpacked folder, the url)."""
    tar = source(stack.lock, name) or want          # the lock's hash is the one the build checks
    fname = tar["url"].rsplit("/", 1)[1]
    unpack = "-xzf" if fname.endswith(".tar.gz") else "-xjf"
    return ([f"mkdir -p {work}",
             f"curl -fsSL --retry 3 -o {work}/{fname} {shell_word(tar['url'], 'sources.url')}",
             f"echo '{tar['sha256']}  {work}/{fname}' | sha256sum -c -",
             f"tar {unpack} {work}/{fname} -C {work}"], tar["url"], tar.get("sources") or want.get("sources") or [])


def _configure_make_install(work: str, folder: str, options: str, built: str) -> list[str]:
    """An autotools build in FOLDER (logs in WORK), checked by the file it must install, WORK removed."""
    return [f"env -C {folder} ./configure {options} > {work}/configure.log",
            f"make -C {folder} -j\"$(nproc)\" > {work}/make.log",
            f"make -C {folder} install > {work}/install.log",
            f"test -e {built}",
            f"rm -rf {work}"]


def libfabric_steps(stack: Stack) -> list[Step]:
    """libfabric from its release tarball into its prefix, with the fabric's providers required
    (configure's --enable-<p>=yes stops the build when one cannot be built)."""
    want = stack.libfabric_build
    if not want:
        return []
    work = "/tmp/libfabric"
    cmds, url, sources = _fetch_and_unpack(stack, "libfabric", want, work)
    folder = f"{work}/libfabric-{want['version']}"
    enable = " ".join(f"--enable-{p}=yes" for p in want["providers"])
    cmds += _configure_make_install(work, folder, f"--prefix={want['prefix']} {enable} --disable-static",
                                    f"{want['prefix']}/lib/libfabric.so.1")
    return [Step("fabric", f"libfabric {want['version']} from the release tarball (sha256 checked) into "
                           f"{want['prefix']}, providers {', '.join(want['providers'])}",
                 cmds, network=True,
                 notes=[f"source: {url} ({', '.join(sources)})",
                        f"why: the {stack.spec.cluster.fabric} fabric needs a newer libfabric than the OS's "
                        "(compat/catalog.yaml fabrics)"])]


def plugin_steps(stack: Stack) -> list[Step]:
    """NCCL's libfabric network plugin against the image's libfabric and CUDA toolkit."""
    want = stack.nccl_plugin_build
    if not want:
        return []
    work = "/tmp/nccl-plugin"
    cmds, url, sources = _fetch_and_unpack(stack, "nccl-plugin", want, work)
    folder = f"{work}/{want['name']}-{want['version']}"
    options = " ".join(shell_word(o, "nccl_plugins.configure") for o in want["configure"])
    cmds += [f"env -C {folder} ./autogen.sh > {work}/autogen.log 2>&1"]
    cmds += _configure_make_install(work, folder, f"--prefix={want['prefix']} --with-libfabric={libfabric_prefix(stack)} "
                                                  f"--with-cuda={CUDA_HOME} {options}",
                                    f"{want['prefix']}/lib/libnccl-net-ofi.so")
    return [Step("fabric", f"{want['name']} {want['version']} (NCCL's libfabric network plugin) from its "
                           f"tarball (sha256 checked) into {want['prefix']}",
                 cmds, network=True,
                 notes=[f"source: {url} ({', '.join(sources)})",
                        "NCCL dlopens libnccl-net.so (the plugin's symlink) from LD_LIBRARY_PATH when "
                        "NCCL_NET_PLUGIN is unset (aws_ofi_nccl_platform)"])]


class Fabric(Component):
    def devel(self, stack: Stack) -> dict[Layer, list[Step]]:
        return {Layer.LIBFABRIC: libfabric_steps(stack), Layer.NCCL_PLUGIN: plugin_steps(stack)}

    def runtime(self, stack: Stack) -> list[Copy]:
        return [Copy(w["prefix"], w["prefix"], from_stage="devel")
                for w in (stack.libfabric_build, stack.nccl_plugin_build) if w]

    def env(self, stack: Stack) -> dict[str, str]:
        libs = [f"{w['prefix']}/lib" for w in (stack.nccl_plugin_build, stack.libfabric_build) if w]
        if not libs:
            return {}
        return {"LD_LIBRARY_PATH": ":".join(libs) + LD_PATH_TAIL}

    def lock_needs(self, stack: Stack) -> LockNeeds:
        return LockNeeds(apt={"devel": devel_apt(stack), "runtime": runtime_apt(stack)},
                         tarballs=source_tarballs(stack))
