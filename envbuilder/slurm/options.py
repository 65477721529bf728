"""Job options from the command line and site profiles, applied to a spec's `cluster` section."""

from __future__ import annotations

from dataclasses import replace

from ..errors import EnvbuilderError
from ..spec.schema import RUNTIMES
from ..spec.model import Spec
from . import sites, sweeps


def apply_job_options(spec: Spec, *, site: str | None = None, runtime: str | None = None,
                      sweep: list[str] | None = None) -> Spec:
    """The spec with a site profile, a runtime and sweep entries applied (in that order:
    the command line wins over the site, the site over the spec)."""
    cl = spec.cluster
    if site:
        cl = sites.merge(cl, sites.load_site(site))
    if runtime:
        if runtime not in RUNTIMES:
            raise EnvbuilderError("--runtime", f"{runtime!r} is not one of {', '.join(RUNTIMES)}",
                                  f"use one of {', '.join(RUNTIMES)}")
        cl = replace(cl, runtime=runtime)
    if sweep:
        cl = replace(cl, sweep=sweeps.with_overrides(cl.sweep, sweep))
    if cl is spec.cluster:
        return spec
    return replace(spec, cluster=cl)
