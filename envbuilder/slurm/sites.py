"""Site profiles: one YAML file per cluster (partition, GPUs per node, PMI, interface, binds,
runtime...), so that one spec serves several clusters (`envbuilder build --site NAME`).

A profile holds the same keys as a spec's `cluster` section (minus what belongs to one
experiment: command, sweep, stage) plus `name` and `description`. Its values override the
spec's; its `binds`, `modules`, `env` and `bandwidth_floor` are added to the spec's.

    # sites/mycluster.yaml
    name: mycluster
    partition: gpu
    gpus_per_node: 4
    cpus_per_task: 16
    pmi: pmix
    network_interface: ib0
    binds: [/scratch, /projects]
    runtime: apptainer
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

from ..errors import EnvbuilderError, SpecErrors
from ..spec.schema import SPEC_FIELDS, Field, check_object
from ..spec.model import Cluster, cluster_from_data
from ..spec.yamlsource import read_spec_file

PROFILE_ONLY = {
    "name": Field("string", "The site's name (what --site takes)."),
    "description": Field("string", "One line about the cluster."),
}
# what belongs to one experiment, not to a cluster
NOT_IN_PROFILES = ("command", "sweep", "stage", "monitor")
SITE_FIELDS = {**PROFILE_ONLY, **{k: f for k, f in SPEC_FIELDS["cluster"].children.items()
                                 if k not in NOT_IN_PROFILES}}
ADDED = ("binds", "modules")          # lists: the spec's entries, then the site's
MAP_KEYS = ("env", "bandwidth_floor")  # maps: the site's values win


def bundled_sites_dir() -> Path:
    """envbuilder's own profiles: the installed package's sites/ folder (setup.py ships the
    repository's sites/ there), or the checkout's sites/."""
    package = Path(__file__).resolve().parent.parent
    shipped = package / "sites"
    return shipped if shipped.is_dir() else package.parent / "sites"


def site_dirs() -> list[Path]:
    """Where --site NAME looks: $ENVBUILDER_SITES (':'-separated), ./sites, the bundled sites/."""
    dirs = [Path(p) for p in os.environ.get("ENVBUILDER_SITES", "").split(os.pathsep) if p]
    dirs.append(Path("sites"))
    dirs.append(bundled_sites_dir())
    return dirs


def find_site(name_or_file: str) -> Path:
    p = Path(name_or_file)
    if p.suffix in (".yaml", ".yml") or os.sep in name_or_file:
        if not p.is_file():
            raise EnvbuilderError("--site", f"no such site profile: {name_or_file}",
                                  "give a site name (sites/NAME.yaml) or the path of a profile")
        return p
    seen = []
    for d in site_dirs():
        for suffix in (".yaml", ".yml"):
            cand = d / f"{name_or_file}{suffix}"
            if cand.is_file():
                return cand
        if d.is_dir():
            seen += sorted(x.stem for x in d.glob("*.y*ml"))
    known = ", ".join(sorted(set(seen))) or "none"
    raise EnvbuilderError("--site", f"no site profile named {name_or_file!r}",
                          f"known sites: {known}; or give a file path, or add a folder to ENVBUILDER_SITES")


@dataclass(frozen=True)
class Site:
    name: str
    path: str
    settings: Cluster          # the profile's values (unset keys at Cluster's defaults)
    keys: frozenset[str]       # the keys the profile sets
    description: str = ""


def load_site(name_or_file: str) -> Site:
    """A site profile, by name (sites/NAME.yaml) or file, checked like a spec."""
    path = find_site(name_or_file)
    doc = read_spec_file(path)
    if not isinstance(doc.data, dict):
        raise EnvbuilderError("site", "a site profile is a mapping of keys (partition:, runtime: ...)",
                              "see sites/example-gpu.yaml", line=1, source=doc.path)
    errors: list[EnvbuilderError] = []
    data = check_object("", SITE_FIELDS, doc.data, doc, errors, doc.path)
    if errors:
        raise SpecErrors(errors)
    name = data.pop("name") or path.stem
    description = data.pop("description", None) or ""
    # keep only what the profile sets: defaults must not override the spec
    given = {k: v for k, v in data.items() if k in doc.data and v is not None}
    return Site(name, str(path), cluster_from_data(given), frozenset(given), description)


def merge(spec_cluster: Cluster, site: Site) -> Cluster:
    """The spec's cluster section with the site's keys applied."""
    changes = {}
    for key in sorted(site.keys):
        value = getattr(site.settings, key)
        if key in ADDED:
            value = tuple(dict.fromkeys(getattr(spec_cluster, key) + value))
        elif key in MAP_KEYS:
            value = tuple(sorted({**dict(getattr(spec_cluster, key)), **dict(value)}.items()))
        changes[key] = value
    return replace(spec_cluster, **changes)

