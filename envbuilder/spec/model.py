"""The spec: what the user asked for, validated, as typed objects."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import EnvbuilderError, SpecErrors
from .schema import shown, validate
from .yamlsource import SourceDoc, read_spec_file

# full-match patterns (re.fullmatch): a trailing newline is not a valid entry
PIP_PIN_RE = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)(\[[A-Za-z0-9,._-]+\])?==([A-Za-z0-9.+!_-]+)")
APT_RE = re.compile(r"([a-z0-9][a-z0-9+.-]+)(=[A-Za-z0-9.+:~_-]+)?")
CONDA_RE = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)(=|==)([A-Za-z0-9.+_*-]+)")
# a conda channel: a name (conda-forge), an https:// mirror or a local file:/// channel folder (not
# http://: the channel's index and packages would come over plain text, open to anyone between)
CONDA_CHANNEL_RE = re.compile(r"(?:https://[A-Za-z0-9.-]+(?::[0-9]{1,5})?|file://)(?:/[A-Za-z0-9._~%/+=,:-]*)?"
                              r"|[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
CONDA_CHANNEL_FIX = ("write a channel name (conda-forge), an https:// mirror URL or a local file:///path channel "
                     "(a folder holding noarch/repodata.json)")


def conda_channel_problem(channel: str) -> tuple[str, str] | None:
    """(reason, fix) when CHANNEL is no conda channel a spec or a site may name, else None: a name,
    https:// or file:///, no login or token in it (they would reach the lock's package URLs)."""
    from ..redact import credential_in

    what = credential_in(channel)
    if what:
        return (f"is not a conda channel envbuilder keeps: it holds {what}",
                "name the channel without it, and give the token to the conda solver (py-rattler) in its "
                "credentials file RATTLER_AUTH_FILE or a netrc file (NETRC or ~/.netrc), never in a spec or "
                "the config (docs/lock.md)")
    if channel[:7].lower() == "http://":
        return ("is not a conda channel envbuilder uses: http:// (its index and packages would come over "
                "plain text)", "give the channel's https:// URL, or a local file:///path channel")
    if not CONDA_CHANNEL_RE.fullmatch(channel):
        return "is not a conda channel", CONDA_CHANNEL_FIX
    return None
# a conda match spec with a range (the lock solves it): name>=1.2,<2 or name (any version)
CONDA_RANGE_RE = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)((?:[<>!]=?|==|~=)[A-Za-z0-9.+_*-]+"
                            r"(?:,(?:[<>!]=?|==|~=)[A-Za-z0-9.+_*-]+)*)?")
# a VCS requirement's pinned commit: the full 40 (SHA-1) or 64 (SHA-256) hex digits after the last @
VCS_COMMIT_RE = re.compile(r".*@[0-9a-f]{40}(?:[0-9a-f]{24})?(?:#.*)?")


def pip_requirement_problem(entry: str) -> tuple[str, str] | None:
    """(reason, fix) when ``entry`` cannot be a packages.pip requirement, None when it can: a PEP 508
    requirement (name, extras, a version or a range, markers) that `envbuilder lock` pins with its
    hashes, or an https archive / a VCS URL at a pinned commit. Refused: what does not parse, a
    local path or file: URL (not in the image's build context), a VCS URL without a commit."""
    from packaging.requirements import InvalidRequirement, Requirement

    stem = re.split(r"[<>=~!;@\[ ]", entry.strip(), maxsplit=1)[0][:40] or "h5py"
    if entry.startswith(("-e", "--editable", ".", "/", "~")) or entry.startswith("file:"):
        return (f"{shown(entry)} is a local path or an editable install: the image cannot see it",
                "build the project as a wheel (python -m build) and give its name==version with "
                "--wheelhouse DIR, or publish it to an index")
    try:
        req = Requirement(entry)
    except InvalidRequirement:
        return (f"{shown(entry)} is not pinned to one version nor a requirement pip reads",
                f"write it as name==version (e.g. {stem}==1.2.3) or a range (e.g. {stem}>=1.2,<2) "
                "that `envbuilder lock` pins with its hashes")
    if req.url:
        url = req.url
        if url.startswith("file:") or "://" not in url:
            return (f"{shown(entry)} points at a local path: the image cannot see it",
                    "build it as a wheel and give its name==version with --wheelhouse DIR")
        scheme = url.split("://", 1)[0]
        if "+" in scheme and not VCS_COMMIT_RE.fullmatch(url):
            return (f"{shown(entry)} is a VCS URL without a pinned commit: every build could get other code",
                    f"pin the full commit: {req.name} @ {url.split('@')[0] if url.count('@') > 1 else url}@<40-hex "
                    "commit>, or use a released version")
        if not url.startswith(("https://", "git+https://", "hg+https://")):
            return (f"{shown(entry)} is fetched over an unencrypted URL", "use an https:// URL")
    return None


@dataclass(frozen=True)
class Framework:
    name: str
    version: str
    index_url: str | None = None

    @property
    def family(self) -> str:
        """tensorflow or pytorch: what Horovod and the smoke suite care about."""
        return "pytorch" if self.name == "pytorch" else "tensorflow"

    @property
    def module(self) -> str:
        return "torch" if self.name == "pytorch" else "tensorflow"


@dataclass(frozen=True)
class Cuda:
    version: str
    cudnn: str | None = None
    nccl: str | None = None
    driver: str | None = None
    compute_capability: str | None = None
    source: str = "image"          # image: nvidia/cuda or NGC base; pypi: NVIDIA's wheels on a plain OS base

    @property
    def from_pypi(self) -> bool:
        return self.source == "pypi"


@dataclass(frozen=True)
class Mpi:
    flavor: str
    version: str
    pmi: str = "pmix"
    source: str | None = None
    abi: str | None = None           # None = native; "standard": built against libmpi_abi.so.1


@dataclass(frozen=True)
class Horovod:
    version: str
    operations: tuple[str, ...] = ("mpi", "gloo")

    @property
    def controllers(self) -> tuple[str, ...]:
        return tuple(op for op in ("mpi", "gloo") if op in self.operations)


@dataclass(frozen=True)
class Distributed:
    """How the ranks talk: horovod | torch | tf-multiworker | none (+ torch's options)."""
    kind: str = "none"
    backend: str | None = None      # torch: nccl | gloo | mpi
    launcher: str | None = None     # torch: srun | torchrun
    tf_config: str | None = None    # tf-multiworker: keep (default) | replace a TF_CONFIG given to the job

    @property
    def torch(self) -> bool:
        return self.kind == "torch"


@dataclass(frozen=True)
class Packages:
    pip: tuple[str, ...] = ()
    apt: tuple[str, ...] = ()
    conda: tuple[str, ...] = ()
    conda_channels: tuple[str, ...] = ()

    def pip_pin(self, name: str) -> tuple[str, str] | None:
        """(the requirement, its version) of pip package NAME (PEP 503 names compared), None
        when packages.pip has none."""
        for req in self.pip:
            m = PIP_PIN_RE.fullmatch(req)
            if m and re.sub(r"[-_.]+", "-", m.group(1)).lower() == name:
                return req, m.group(3)
        return None


@dataclass(frozen=True)
class Cluster:
    partition: str | None = None
    account: str | None = None
    nodes: int = 1
    gpus_per_node: int | None = None
    ntasks_per_node: int | None = None
    cpus_per_task: int | None = None
    mem_per_cpu: str | None = None
    time: str | None = None
    binds: tuple[str, ...] = ()
    network_interface: str | None = None
    runtime: str = "apptainer"
    image_path: str | None = None
    command: str | None = None
    pmi: str | None = None
    venv: str | None = None
    modules: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    stage: str | None = None
    local_scratch: str | None = None
    local_cleanup: str | None = None
    sweep: tuple[str, ...] = ()
    monitor: tuple[str, ...] = ()
    arch: str | None = None
    gpu: str | None = None
    driver: str | None = None
    site_mpi: tuple[str, ...] = ()
    site_mpi_abi: str | None = None
    site_mpi_env: tuple[tuple[str, str], ...] = ()
    fabric: str | None = None
    bandwidth_floor: tuple[tuple[str, str], ...] = ()
    vet_min_nodes: int | None = None
    attestation: str | None = None
    attestation_keys: tuple[str, ...] = ()

    # keys added after the first release: left out of the spec hash while unset, so that
    # existing specs keep their hash (and their image tags)
    LATER_KEYS = ("pmi", "venv", "modules", "env", "stage", "local_scratch", "sweep", "monitor",
                  "arch", "gpu", "driver", "local_cleanup", "site_mpi", "site_mpi_abi", "site_mpi_env", "fabric",
                  "bandwidth_floor", "vet_min_nodes", "attestation", "attestation_keys")

    def canonical(self) -> dict:
        out = {}
        for k, v in vars(self).items():
            if k in self.LATER_KEYS and v in (None, ()):
                continue
            out[k] = [list(x) if isinstance(x, tuple) else x for x in v] if isinstance(v, tuple) else v
        return out


@dataclass(frozen=True)
class Spec:
    name: str
    framework: Framework
    python: str
    description: str | None = None
    cuda: Cuda | None = None
    mpi: Mpi | None = None
    horovod: Horovod | None = None
    distributed: Distributed = field(default_factory=Distributed)
    arch: str | None = None
    packages: Packages = field(default_factory=Packages)
    base: str | None = None
    runtime_base: str | None = None
    base_os: str | None = None
    base_from: str = "auto"
    targets: tuple[str, ...] = ("docker", "apptainer")
    env: tuple[tuple[str, str], ...] = ()
    cluster: Cluster = field(default_factory=Cluster)
    # where it came from: for messages that point at a line
    doc: SourceDoc | None = field(default=None, compare=False, repr=False)

    @property
    def gpu(self) -> bool:
        return self.cuda is not None

    @property
    def target_arch(self) -> str:
        """The image's CPU architecture: the spec's, else the site's (cluster.arch), else x86_64."""
        return self.arch or self.cluster.arch or "x86_64"

    @property
    def torch_backend(self) -> str | None:
        """torch.distributed's backend (nccl on GPU stacks, gloo on CPU unless the spec says)."""
        if not self.distributed.torch:
            return None
        return self.distributed.backend or ("nccl" if self.cuda else "gloo")

    def line_of(self, dotted: str) -> int | None:
        return self.doc.line_of(dotted) if self.doc else None

    def error(self, dotted: str, reason: str, fix: str = "", **kw) -> EnvbuilderError:
        return EnvbuilderError(dotted, reason, fix, line=self.line_of(dotted),
                               source=self.doc.path if self.doc else None, **kw)

    def canonical(self) -> dict:
        """The spec as normalised data (defaults filled in): what the manifest records."""
        out = {
            "name": self.name,
            "description": self.description,
            "framework": _drop_none(vars(self.framework)),
            "python": self.python,
            "cuda": _cuda_dict(self.cuda) if self.cuda else None,
            "mpi": _drop_none(vars(self.mpi)) if self.mpi else None,
            "horovod": {"version": self.horovod.version, "operations": list(self.horovod.operations)}
            if self.horovod else None,
            "packages": {**{k: list(getattr(self.packages, k)) for k in ("pip", "apt", "conda")},
                         **({"conda_channels": list(self.packages.conda_channels)}
                            if self.packages.conda_channels else {})},
            **self._later_keys(),
            "base": self.base,
            "runtime_base": self.runtime_base,
            "base_os": self.base_os,
            "targets": list(self.targets),
            "env": dict(self.env),
            "cluster": self.cluster.canonical(),
        }
        return out

    def _later_keys(self) -> dict:
        """distributed, arch and base_from: in the canonical form only when the spec says more than the
        defaults, so that existing specs keep their hash (and their image tags)."""
        out = {}
        d = self.distributed
        if d != Distributed(kind="horovod" if self.horovod else "none"):
            out["distributed"] = _drop_none(vars(d))
        if self.arch:
            out["arch"] = self.arch
        if self.base_from != "auto":
            out["base_from"] = self.base_from
        return out

    def sha256(self) -> str:
        text = json.dumps(self.canonical(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()


def _cuda_dict(cuda: Cuda) -> dict:
    """The default source (the base image) is left out: specs written before `source` existed
    keep their canonical form and hash."""
    out = _drop_none(vars(cuda))
    if out.get("source") == "image":
        del out["source"]
    return out


def _drop_none(d: dict) -> dict:
    return {k: v for k, v in d.items() if v is not None}


def _check_packages(data: dict, doc: SourceDoc) -> list[EnvbuilderError]:
    errors = []
    pk = data.get("packages") or {}
    for n, entry in enumerate(pk.get("pip") or []):
        problem = pip_requirement_problem(entry) if entry is not None else None
        if problem:
            errors.append(EnvbuilderError(f"packages.pip[{n}]", problem[0], problem[1],
                                          line=doc.line_of(f"packages.pip[{n}]"), source=doc.path))
    for n, entry in enumerate(pk.get("apt") or []):
        if entry is not None and not APT_RE.fullmatch(entry):
            errors.append(EnvbuilderError(
                f"packages.apt[{n}]", f"{shown(entry)} is not a Debian package name",
                "write name or name=version (e.g. git=1:2.39.5-0+deb12u1)",
                line=doc.line_of(f"packages.apt[{n}]"), source=doc.path))
    for n, entry in enumerate(pk.get("conda") or []):
        if entry is not None and not (CONDA_RE.fullmatch(entry) or CONDA_RANGE_RE.fullmatch(entry)):
            errors.append(EnvbuilderError(
                f"packages.conda[{n}]", f"{shown(entry)} is not a conda package with a version or a range",
                "write it as name=version (e.g. numpy=1.26.4) or name>=1.26,<2 (the lock pins it)",
                line=doc.line_of(f"packages.conda[{n}]"), source=doc.path))
    for n, entry in enumerate(pk.get("conda_channels") or []):
        problem = conda_channel_problem(entry) if isinstance(entry, str) else None
        if problem:
            errors.append(EnvbuilderError(
                f"packages.conda_channels[{n}]", f"{shown(entry)} {problem[0]}", problem[1],
                line=doc.line_of(f"packages.conda_channels[{n}]"), source=doc.path))
    hv = data.get("horovod") or {}
    ops = hv.get("operations") or []
    if hv and not ops:
        errors.append(EnvbuilderError("horovod.operations", "is empty",
                                      "list at least one of nccl, mpi, gloo",
                                      line=doc.line_of("horovod.operations"), source=doc.path))
    if len(set(ops)) != len(ops):
        errors.append(EnvbuilderError("horovod.operations", "lists an operation twice",
                                      "name each operation once", line=doc.line_of("horovod.operations"),
                                      source=doc.path))
    return errors


def spec_from_doc(doc: SourceDoc) -> Spec:
    data = validate(doc)
    errors = _check_packages(data, doc)
    if errors:
        raise SpecErrors(errors)
    fw = data["framework"]
    cl = data.get("cluster") or {}
    pk = data.get("packages") or {}
    hv = data.get("horovod")
    dist = data.get("distributed") or {}
    return Spec(
        name=data["name"],
        description=data.get("description"),
        framework=Framework(fw["name"], fw["version"], fw.get("index_url")),
        python=data["python"],
        cuda=Cuda(**data["cuda"]) if data.get("cuda") else None,
        mpi=Mpi(**data["mpi"]) if data.get("mpi") else None,
        horovod=Horovod(hv["version"], tuple(hv.get("operations") or ("mpi", "gloo"))) if hv else None,
        distributed=_distributed(dist, bool(hv)),
        arch=data.get("arch"),
        packages=Packages(tuple(pk.get("pip") or ()), tuple(pk.get("apt") or ()), tuple(pk.get("conda") or ()),
                          tuple(pk.get("conda_channels") or ())),
        base=data.get("base"),
        runtime_base=data.get("runtime_base"),
        base_os=data.get("base_os"),
        base_from=data.get("base_from") or "auto",
        targets=tuple(data.get("targets") or ("docker", "apptainer")),
        env=tuple(sorted((data.get("env") or {}).items())),
        cluster=cluster_from_data(cl),
        doc=doc,
    )


def _distributed(dist: dict, has_horovod: bool) -> Distributed:
    kind = dist.get("kind") or ("horovod" if has_horovod else "none")
    # backend/launcher are torch's options; given with another kind they are refused (DIST_OPTION)
    launcher = dist.get("launcher") or ("srun" if kind == "torch" else None)
    return Distributed(kind, dist.get("backend"), launcher, dist.get("tf_config"))


def cluster_from_data(cl: dict | None) -> Cluster:
    """The checked `cluster` mapping (or a site profile) as a Cluster: lists become tuples,
    the env map sorted pairs."""
    out = {}
    for k, v in (cl or {}).items():
        if v is None:
            continue
        if isinstance(v, dict):
            v = tuple(sorted(v.items()))
        elif isinstance(v, list):
            v = tuple(v)
        out[k] = v
    return Cluster(**out)


def load_spec(path: str | Path) -> Spec:
    return spec_from_doc(read_spec_file(path))
