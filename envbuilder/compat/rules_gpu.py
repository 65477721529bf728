"""Rules for the hardware a spec targets: CPU architecture (`arch`, site `arch`), the site's GPU
(`cluster.gpu`: a model or a compute capability) and driver (`cluster.driver`).

What is checked: the arch the spec and the site name agree (and agree with a Grace GPU);
what exists per arch (TensorFlow has no aarch64 GPU wheels, pytorch/pytorch images no arm64);
CUDA 13 needs driver >= 580.65.06 and cannot target compute capability < 7.5; Blackwell needs
CUDA >= 12.8; the framework's compiled arch list must cover the GPU; forward compatibility
(cuda-compat) is possible for data-centre GPUs only. Run by compat/check.py.
"""

from __future__ import annotations

import re

from ..spec.model import Spec
from ..versions import cmp, major, minor
from .finding import ERROR, INFO, WARN, Context, Finding, rule

CC_RE = re.compile(r"^[0-9]{1,2}\.[0-9]$")
COMPAT_RE = re.compile(r"^cuda-compat-([0-9]+)-([0-9]+)(=.*)?$")


def site_gpu(spec: Spec, ctx: Context) -> tuple[str | None, dict | None]:
    """(compute capability, catalog entry of the model) of cluster.gpu, or of cuda.compute_capability."""
    gpu = spec.cluster.gpu
    if gpu:
        if CC_RE.match(gpu):
            return gpu, None
        entry = (ctx.catalog.data.get("gpus") or {}).get(gpu)
        return (entry["cc"], entry) if entry else (None, None)
    if spec.cuda and spec.cuda.compute_capability:
        return spec.cuda.compute_capability, None
    return None, None


def arch_list(spec: Spec, ctx: Context) -> tuple[list[str], dict] | None:
    """The compute capabilities the framework's CUDA wheels carry code for (None: unknown)."""
    if not spec.cuda or ctx.ngc:
        return None
    lists = ctx.catalog.data.get("arch_lists") or {}
    fam = spec.framework.family
    entry = (lists.get(fam) or {}).get("any" if fam == "tensorflow" else minor(spec.cuda.version))
    if not entry or spec.target_arch not in entry:
        return None
    return list(entry[spec.target_arch]), entry


def covered(cc: str, archs: list[str], entry: dict) -> bool:
    """A cubin of the same major and lower-or-equal minor runs; newer GPUs JIT the PTX."""
    for a in archs:
        if major(a) == major(cc) and cmp(a, cc) <= 0:
            return True
    ptx = entry.get("ptx_arch") or (archs[-1] if archs else None)
    if entry.get("ptx") and ptx and cmp(cc, ptx) >= 0:
        return entry.get("max_cc") is None or cmp(cc, entry["max_cc"]) < 0 or major(cc) == major(ptx)
    return False


@rule
def arch_rules(spec: Spec, ctx: Context):
    arch, site_arch = spec.arch, spec.cluster.arch
    if arch and site_arch and arch != site_arch:
        yield Finding("ARCH_SITE", ERROR, "arch",
                      f"the spec builds for {arch} but the site's nodes are {site_arch}",
                      f"set arch: {site_arch} (or leave arch out: the site's is used)", [])
    _cc, gpu = site_gpu(spec, ctx)
    if gpu and gpu.get("arch") and gpu["arch"] != spec.target_arch:
        yield Finding("ARCH_GPU", ERROR, "cluster.gpu",
                      f"{spec.cluster.gpu} nodes have {gpu['arch']} CPUs (Grace); the image is "
                      f"{spec.target_arch}", f"set arch: {gpu['arch']}", ctx.catalog.data["gpus_sources"])
    if spec.target_arch != "aarch64":
        return
    fw = spec.framework
    if spec.cuda and fw.family == "tensorflow" and not ctx.ngc:
        yield Finding("ARCH_TF_GPU", ERROR, "arch",
                      "TensorFlow publishes no aarch64 GPU wheels (PyPI's linux_aarch64 tensorflow "
                      "is a CPU build)",
                      "use an NGC TensorFlow base built for arm64, PyTorch, or x86_64 nodes", ["tf_aarch64"])
    base = spec.base or ""
    if base.startswith(("pytorch/pytorch", "docker.io/pytorch/pytorch")):
        yield Finding("ARCH_BASE", ERROR, "base",
                      f"{base} has no arm64 image (the pytorch/pytorch tags are amd64 only)",
                      "leave base out (nvidia/cuda images are multi-arch) or use an NGC base",
                      ["torch_aarch64_index"])
    if fw.family == "pytorch" and not spec.cuda and not fw.index_url and "+cpu" not in fw.version \
            and ctx.catalog.aarch64_pypi_cpu("pytorch", fw.version) is False:
        until = ctx.catalog.data["aarch64_pypi"]["pytorch"]["cpu_until"]
        yield Finding("ARCH_TORCH_CPU", WARN, "framework.version",
                      f"PyPI's aarch64 torch {fw.version} is a CUDA build (torch > {until}); the CPU "
                      f"build comes from {ctx.catalog.framework_index('pytorch', None)}, which the "
                      "lock and the build must reach",
                      f"pin torch {until}.x (PyPI's last CPU-only aarch64 wheel), or set "
                      "framework.index_url to a mirror of the CPU index, or give a local +cpu wheel "
                      "with --wheelhouse", ["torch_pypi_aarch64_2611", "torch_index"])
    if fw.family == "pytorch" and spec.cuda and fw.index_url and "pypi.org" in fw.index_url \
            and ctx.catalog.aarch64_pypi_cpu("pytorch", fw.version) is not False:
        # up to 2.10 PyPI's aarch64 torch is the CPU build; from 2.11 it is the CUDA one
        # (torch_pypi_aarch64_2611), which PyPI may serve
        yield Finding("ARCH_TORCH_INDEX", ERROR, "framework.index_url",
                      f"PyPI's aarch64 torch {fw.version} is a CPU build: CUDA builds of it for "
                      "aarch64 come from download.pytorch.org",
                      "leave index_url out: envbuilder picks download.pytorch.org/whl/cuNNN",
                      ["torch_aarch64_index", "torch_pypi_aarch64_2611"])


@rule
def gpu_rules(spec: Spec, ctx: Context):
    if spec.cluster.gpu and not CC_RE.match(spec.cluster.gpu) and \
            spec.cluster.gpu not in (ctx.catalog.data.get("gpus") or {}):
        known = ", ".join(sorted(ctx.catalog.data.get("gpus") or {}))
        yield Finding("GPU_UNKNOWN", ERROR, "cluster.gpu",
                      f"GPU model {spec.cluster.gpu!r} is not in envbuilder's catalog",
                      f'give its compute capability instead (gpu: "9.0"), or one of {known}',
                      ctx.catalog.data["gpus_sources"])
        return
    if not spec.cuda:
        return
    cc, gpu = site_gpu(spec, ctx)
    cu = ctx.catalog.cuda(spec.cuda.version)
    if cc is None:
        return
    sm = "sm_" + cc.replace(".", "")
    name = f"{spec.cluster.gpu} (compute capability {cc}, {sm})" if gpu else f"compute capability {cc} ({sm})"
    field = "cluster.gpu" if spec.cluster.gpu else "cuda.compute_capability"
    if spec.cluster.gpu and cu and cu.get("min_compute_capability") and \
            cmp(cc, cu["min_compute_capability"]) < 0:
        yield Finding("CUDA_ARCH", ERROR, "cluster.gpu",
                      f"CUDA {spec.cuda.version} cannot compile for {name}: "
                      f"CUDA 13 dropped compute capability < {cu['min_compute_capability']}",
                      "use CUDA 12.x (e.g. torch with cuda 12.6) for Volta/Pascal GPUs",
                      cu["sources"])
    if major(cc) >= 10 and cmp(spec.cuda.version, "12.8") < 0:
        yield Finding("CUDA_BLACKWELL", ERROR, field,
                      f"{name} is a Blackwell GPU; CUDA {spec.cuda.version} "
                      "cannot target it (Blackwell needs CUDA >= 12.8)",
                      "use CUDA 12.8 or newer (e.g. cuda 13.2 with torch 2.15)", ["cuda_blackwell"])
    found = arch_list(spec, ctx)
    if found is None:
        return
    archs, entry = found
    fw = spec.framework
    if fw.family == "tensorflow" and major(cc) >= 10:
        yield Finding("WHEEL_ARCH", ERROR, field,
                      f"TensorFlow's wheels carry sm_60..sm_89 + PTX 9.0; XLA cannot JIT that PTX "
                      f"for {name}",
                      "use PyTorch with CUDA >= 12.8, or a TensorFlow built for Blackwell (NGC)",
                      entry["sources"])
    elif not covered(cc, archs, entry):
        yield Finding("WHEEL_ARCH", ERROR, field,
                      f"{fw.name} {minor(fw.version)} CUDA {minor(spec.cuda.version)} {spec.target_arch} "
                      f"wheels are compiled for sm_{', sm_'.join(a.replace('.', '') for a in archs)}"
                      f"{' + PTX' if entry.get('ptx') else ''}: no code for {name}",
                      "use a CUDA variant whose arch list covers the GPU (CUDA 12.6 builds still "
                      "carry sm_50..sm_70)", entry["sources"])


@rule
def site_driver(spec: Spec, ctx: Context):
    drv = spec.cluster.driver
    if not drv or not spec.cuda:
        return
    cu = ctx.catalog.cuda(spec.cuda.version) if not ctx.ngc else None
    need_floor = (cu or {}).get("compat_driver") or (ctx.ngc or {}).get("min_driver")
    need_full = (cu or {}).get("min_driver") or need_floor
    if not need_floor:
        return
    srcs = (cu or {}).get("sources", []) + ["cuda_minor_compat"]
    _cc, gpu = site_gpu(spec, ctx)
    compat = [m for m in (COMPAT_RE.match(p) for p in spec.packages.apt) if m]
    if cmp(drv, need_floor) >= 0:
        if cmp(drv, need_full) < 0:
            yield Finding("DRIVER_MINOR_COMPAT", WARN, "cluster.driver",
                          f"driver {drv} is older than CUDA {spec.cuda.version}'s {need_full}; it runs "
                          f"through minor-version compatibility (CUDA {major(spec.cuda.version)}.x "
                          f"needs >= {need_floor}; no PTX JIT of newer code)", "", srcs)
        if compat:
            yield Finding("FWD_COMPAT_UNNEEDED", WARN, "packages.apt",
                          f"driver {drv} runs CUDA {spec.cuda.version} without cuda-compat",
                          "remove cuda-compat: the job script uses it only on an older driver anyway",
                          ["cuda_fwd_compat"])
        return
    datacenter = bool(gpu and gpu.get("datacenter"))
    if compat and datacenter:
        yield Finding("DRIVER_FORWARD_COMPAT", INFO, "cluster.driver",
                      f"driver {drv} is older than CUDA {spec.cuda.version} needs (>= {need_floor}); "
                      f"{spec.cluster.gpu} is a data-centre GPU, so the image's cuda-compat runs it "
                      "(the job script puts it on LD_LIBRARY_PATH only on nodes with an older driver)",
                      "", ["cuda_fwd_compat"])
        return
    if compat:
        yield Finding("FWD_COMPAT_GPU", ERROR, "packages.apt",
                      "forward compatibility (cuda-compat) works on data-centre GPUs only; "
                      + (f"{spec.cluster.gpu} is not one" if gpu else "the site names no GPU model"),
                      f"ask the site for driver >= {need_floor}, or use an older CUDA; name the "
                      "GPU model in the site profile (gpu: h100)", ["cuda_fwd_compat"])
        return
    fix = f"use a CUDA release the driver supports, or ask the site for driver >= {need_floor}"
    if datacenter:
        fix += (f"; or add cuda-compat-{major(spec.cuda.version)}-{minor(spec.cuda.version).split('.')[1]} "
                "to packages.apt (forward compatibility, data-centre GPUs only)")
    yield Finding("DRIVER_MIN", ERROR, "cluster.driver",
                  f"the site's driver {drv} is older than CUDA {spec.cuda.version} needs (>= {need_floor})",
                  fix, srcs)
