"""Rules for the site's fabric (cluster.fabric): NCCL's libfabric plugin (aws-ofi-nccl) x NCCL x
libfabric combinations known to hang or fall back, and cuda-compat in an image on a fabric job.
Facts: compat/catalog.yaml `fabrics` and `nccl_plugins` (each with its source). Run by
compat/check.py."""

from __future__ import annotations

from ..spec.model import Spec
from ..versions import satisfies
from .finding import ERROR, WARN, Context, Finding, rule
from .rules_gpu import COMPAT_RE


def _nccl(spec: Spec, ctx: Context) -> str | None:
    if spec.cuda.nccl:
        return spec.cuda.nccl
    pypi = ctx.catalog.pypi_cuda(spec.framework.name, spec.framework.version) if spec.cuda.source == "pypi" else None
    if pypi:
        return pypi.get("nccl")
    if ctx.ngc:
        return ctx.ngc.get("nccl")
    cu = ctx.catalog.cuda(spec.cuda.version)
    return (cu or {}).get("nccl")


@rule
def fabric_rules(spec: Spec, ctx: Context):
    kind = spec.cluster.fabric
    if not kind or not spec.cuda:
        return
    fab = ctx.catalog.fabric(kind)
    if not fab.get("rdma"):
        return
    if any(COMPAT_RE.match(p) for p in spec.packages.apt):
        yield Finding("FABRIC_CUDA_COMPAT", WARN, "packages.apt",
                      f"a cuda-compat library in an image on a fabric job ({kind}) hangs multi-node NCCL over "
                      "the libfabric plugin (aws-ofi-nccl #970)",
                      "leave cuda-compat out and run on nodes whose driver supports the image's CUDA "
                      "(cluster.driver)", ["aws_ofi_nccl_970"])
    name = fab.get("nccl_plugin")
    if not name or fab.get("plugin_from") != "image":
        return
    plugin = ctx.catalog.nccl_plugin(name)
    version = plugin.get("version") or max(plugin["tarballs"], key=lambda v: [int(x) for x in v.split(".")])
    # the libfabric the plugin builds and runs against: the image's own build, else the OS's package
    built = (fab.get("libfabric_build") or {}).get("version")
    have = {"plugin": version, "nccl": _nccl(spec, ctx), "cuda": spec.cuda.version,
            "libfabric": built or (fab.get("libfabric") or {}).get(ctx.os_name or "")}
    for bad in plugin["known_bad"]:
        keys = [k for k in ("plugin", "nccl", "libfabric", "cuda") if k in bad]
        if all(have[k] and satisfies(have[k], bad[k]) for k in keys):
            what = ", ".join(f"{k} {have[k]}" for k in keys)
            yield Finding("FABRIC_PLUGIN_TRIPLE", ERROR, "cluster.fabric",
                          f"{name} {version} on {kind} with {what}: {bad['why']}",
                          "take the plugin and libfabric from the host (a site profile whose fabric has "
                          "plugin_from: host, the centre's hook or module), or a base image whose libfabric "
                          "and NCCL the plugin supports", list(bad["sources"]))
