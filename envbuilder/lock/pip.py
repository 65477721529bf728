"""Python packages: exact versions and sha256 for the image's Python and platform, not the host's.

One pip resolution of every requirement the image installs (bootstrap tools, framework, Horovod's
dependencies, the spec's packages) so the versions agree with each other, run as
``pip install --dry-run --ignore-installed --report`` with ``--python-version``, ``--abi`` and the
manylinux platforms of the base OS's glibc. pip evaluates environment markers against the
interpreter that runs it, so the resolver runs pip with the *target's* marker environment
(python_version etc.); the report's ``environment`` proves it. The result is split into the
install groups of the Dockerfile (each group is the dependency closure of its requirements that
an earlier group does not already hold), installed with ``--require-hashes --no-deps``.

Local wheels (``--wheelhouse``, e.g. torch 2.13.0+cpu) take part like an index; their sha256 is
computed from the file.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import ssl
import subprocess
import sys
import tempfile
import urllib.parse
from typing import Any
from pathlib import Path

from ..errors import CheckFailed, EnvbuilderError
from ..redact import redact_url
from .model import DEVEL_ONLY_GROUPS, PIP_GROUPS, canonical_name, pip_by_name

DEFAULT_INDEX = "https://pypi.org/simple"

# Run pip with the target's marker environment (pip has no option for it).
_WRAPPER = """\
import json, os, sys
import pip._vendor.packaging.markers as markers
_target = json.loads(os.environ["ENVBUILDER_MARKER_ENV"])
_orig = markers.default_environment
markers.default_environment = lambda: {**_orig(), **_target}
from pip._internal.cli.main import main
sys.exit(main())
"""


# manylinux's legacy aliases (PEP 600): 2014 = glibc 2.17, 2010 = 2.12, 1 = 2.5; the last two
# were defined for x86 only
LEGACY_TAGS = {"x86_64": ["manylinux2014", "manylinux2010", "manylinux1"], "aarch64": ["manylinux2014"]}


def target(python: str, glibc: str, machine: str = "x86_64") -> dict:
    """The image's interpreter and platform (``machine``: uname -m of the image), as pip options
    and markers."""
    major, minor_ = python.split(".")[:2]
    g_major, g_minor = (int(x) for x in glibc.split(".")[:2])
    platforms = [f"manylinux_{g_major}_{m}_{machine}" for m in range(g_minor, 16, -1)]
    platforms += [f"{tag}_{machine}" for tag in LEGACY_TAGS.get(machine, [])] + [f"linux_{machine}"]
    return {
        "python": f"{major}.{minor_}",
        "implementation": "cp",
        "abi": f"cp{major}{minor_}",
        "glibc": f"{g_major}.{g_minor}",
        "platforms": platforms,
        "markers": {
            "implementation_name": "cpython", "platform_python_implementation": "CPython",
            "python_version": f"{major}.{minor_}", "python_full_version": f"{major}.{minor_}.0",
            "implementation_version": f"{major}.{minor_}.0", "os_name": "posix", "sys_platform": "linux",
            "platform_system": "Linux", "platform_machine": machine,
        },
    }


def pip_version() -> str:
    proc = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True, text=True)
    return proc.stdout.split()[1] if proc.returncode == 0 and proc.stdout else "unknown"


def _cert(ca_bundle: str | None) -> str | None:
    for c in (ca_bundle, os.environ.get("PIP_CERT"),
              os.environ.get("REQUESTS_CA_BUNDLE"), os.environ.get("SSL_CERT_FILE")):
        if c and Path(c).is_file():
            return c
    # none named: the machine's own trust store (pip's vendored certifi ignores it, and the lock
    # reads no pip configuration), so a site CA the OS trusts is trusted here too
    system = ssl.get_default_verify_paths().cafile
    return system if system and Path(system).is_file() else None


def pip_command(reqs: list[str], tgt: dict, report: Path, *, index_url: str, extra_index_urls: list[str],
                find_links: str | None, cert: str | None, constraints: Path | None) -> list[str]:
    cmd = [sys.executable, "-c", _WRAPPER, "install", "--dry-run", "--ignore-installed",
           "--quiet", "--disable-pip-version-check", "--no-input",
           "--target", str(report.parent / "target"), "--report", str(report),
           "--only-binary", ":all:", "--python-version", tgt["python"], "--implementation", tgt["implementation"],
           "--abi", tgt["abi"], "--abi", "abi3", "--abi", "none", "--index-url", index_url]
    if not os.environ.get("PIP_DEFAULT_TIMEOUT"):
        # pip's 15 s socket timeout made a slow index or proxy look like a missing version
        # ("from versions: none"): the lock waits longer unless the user chose a timeout
        cmd += ["--timeout", "60"]
    for p in tgt["platforms"]:
        cmd += ["--platform", p]
    for url in extra_index_urls:
        cmd += ["--extra-index-url", url]
    if find_links:
        cmd += ["--find-links", find_links]
    if cert:
        cmd += ["--cert", cert]
    if constraints:
        cmd += ["--constraint", str(constraints)]
    return cmd + list(reqs)


def file_sha256(path: Path) -> str:
    """sha256 of a file, read in 1 MiB blocks (the lock's local wheels and conda packages, images)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _entry(item: dict) -> dict:
    info = item.get("download_info") or {}
    url = info.get("url", "")
    archive = info.get("archive_info") or {}
    sha = (archive.get("hashes") or {}).get("sha256")
    if not sha and str(archive.get("hash", "")).startswith("sha256="):
        sha = archive["hash"].split("=", 1)[1]
    parsed = urllib.parse.urlparse(url)
    local = parsed.scheme == "file"
    if not sha and local:
        sha = file_sha256(Path(urllib.parse.unquote(parsed.path)))
    if not sha:
        raise CheckFailed(f"lock: pip: {item['metadata']['name']}",
                          f"the index gave no sha256 for {redact_url(url)}", "use an index that publishes hashes (PyPI does)")
    meta = item["metadata"]
    entry = {"name": meta["name"], "version": meta["version"],
             "file": urllib.parse.unquote(url.rsplit("/", 1)[-1]), "sha256": sha}
    entry["from"] = "wheelhouse" if local else "index"
    if not local:
        entry["url"] = redact_url(url)     # a private index's user:password never reaches the lock
    return entry


def _closure(roots: list[str], items: dict, markers: dict) -> list[str]:
    """Canonical names reachable from the requirement strings ``roots`` through Requires-Dist."""
    from packaging.requirements import InvalidRequirement, Requirement

    seen: dict[str, set] = {}
    todo = []
    for r in roots:
        req = Requirement(r)
        todo.append((canonical_name(req.name), set(req.extras)))
    while todo:
        name, extras = todo.pop()
        if name not in items:
            continue
        known = seen.get(name)
        if known is not None and extras <= known:
            continue
        seen[name] = (known or set()) | extras
        for dep in items[name]["metadata"].get("requires_dist") or []:
            try:
                req = Requirement(dep)
            except InvalidRequirement:
                continue
            if req.marker is not None:
                envs = [{**markers, "extra": e} for e in (seen[name] or {""})]
                if not any(req.marker.evaluate(env) for env in envs):
                    continue
            todo.append((canonical_name(req.name), set(req.extras)))
    return sorted(seen)


def is_nvidia_wheel(name: str) -> bool:
    """NVIDIA's CUDA wheels: nvidia-cudnn-cu13, nvidia-nccl-cu12, cuda-toolkit, cuda-bindings..."""
    return canonical_name(name).startswith(("nvidia-", "cuda-"))


def split_groups(groups: dict[str, list[str]], install: list[dict], markers: dict) -> dict[str, list[dict]]:
    """Each install group gets the closure of its requirements minus what earlier groups hold."""
    items = {canonical_name(i["metadata"]["name"]): i for i in install}
    out: dict[str, list[dict]] = {}
    taken: set[str] = set()
    for group in PIP_GROUPS:
        if group not in groups:
            continue
        names = [n for n in _closure(groups[group], items, markers) if n not in taken]
        taken |= set(names)
        out[group] = [_entry(items[n]) for n in names]
    if out.get("framework"):
        # NVIDIA's wheels (nvidia-*, cuda-*) go in a layer of their own before the framework
        nvidia = [e for e in out["framework"] if is_nvidia_wheel(e["name"])]
        if nvidia:
            out["framework"] = [e for e in out["framework"] if not is_nvidia_wheel(e["name"])]
            out["cuda"] = nvidia
            groups = {**groups, "cuda": []}
    rest = sorted(set(items) - taken)
    if rest:       # reached by no closure (a marker pip saw differently): installed with the last group
        last = [g for g in PIP_GROUPS if g in out and g not in DEVEL_ONLY_GROUPS][-1]
        out[last] = sorted(out[last] + [_entry(items[n]) for n in rest], key=lambda e: canonical_name(e["name"]))
    for group in out:
        asked = {_req_name(r) for r in groups[group]}
        for e in out[group]:
            e["requested"] = canonical_name(e["name"]) in asked
    return out


def _pip_error(stderr: str) -> str:
    lines = [l.strip() for l in stderr.splitlines() if l.strip().startswith("ERROR:")]
    return " ".join(lines)[:600] or stderr.strip()[-600:]


_NO_MATCH = re.compile(r"No matching distribution found for ([A-Za-z0-9._-]+)==([^\s;,]+)")


def _refuse_other_arch(stderr: str, tgt: dict, env: dict, report: Path, options: dict) -> None:
    """A failed resolution for a non-x86_64 image whose failing pin exists for x86_64: the pin has
    no build for the image's machine (e.g. intel-openmp, x86_64 wheels only). One message naming
    the package, version and machine, instead of pip's "from versions: none"."""
    machine = tgt["markers"]["platform_machine"]
    m = _NO_MATCH.search(stderr)
    if machine == "x86_64" or not m:
        return
    name, version = m.group(1), m.group(2)
    x86 = target(tgt["python"], tgt["glibc"], "x86_64")
    # the same pip options (pip_command), the x86_64 platforms instead of the image's, the pin alone
    probe = pip_command([f"{name}=={version}"], x86, report, **options) + ["--no-deps"]
    penv = dict(env, ENVBUILDER_MARKER_ENV=json.dumps(x86["markers"]))
    if subprocess.run(probe, capture_output=True, text=True, env=penv).returncode == 0:
        raise EnvbuilderError(f"lock: pip: {name}=={version}",
                          f"{name} {version} has no {machine} build for Python {tgt['python']} / glibc "
                          f"{tgt['glibc']} (the index has it for x86_64 only)",
                          f"drop {name} from the {machine} spec, pin a version that publishes "
                          f"{machine} wheels, or give a local {machine} wheel with --wheelhouse DIR")


def resolve(groups: dict[str, list[str]], tgt: dict, *, prefer: dict[str, str] | None = None,
            prefer_earlier: dict[str, str] | None = None, **options) -> dict[str, list[dict]]:
    """Resolve every group's requirements together for the target; {group: [entries]}.

    ``prefer`` (name -> version) are versions to keep when they fit (the bootstrap tools' usual
    pins; every other entry of a lock during ``--update NAME``); when they do not fit, pip
    resolves without them. When the spec asks packages besides the framework, the groups before
    ``packages`` are resolved a second time without them (``prefer_earlier``: their versions to
    keep) and the two are layered (``layered``)."""
    joint = _resolve_preferring(groups, tgt, prefer, **options)
    earlier_groups = {g: reqs for g, reqs in groups.items() if g != "packages" and reqs}
    if not groups.get("packages") or not earlier_groups:
        return joint
    earlier = _resolve_preferring(earlier_groups, tgt, prefer_earlier if prefer_earlier is not None else prefer,
                                  **options)
    return layered(earlier, joint, {_req_name(r) for r in groups["packages"]})


def changed_names(old: dict[str, list[str]], new: dict[str, list[str]]) -> set[str]:
    """Canonical names of the requirements that differ between two sets of groups."""
    a = {r for reqs in old.values() for r in reqs}
    b = {r for reqs in new.values() for r in reqs}
    return {_req_name(r) for r in a ^ b}


def _req_name(requirement: str) -> str:
    from packaging.requirements import Requirement

    return canonical_name(Requirement(requirement).name)


def _resolve_preferring(groups, tgt, prefer, **options) -> dict[str, list[dict]]:
    if prefer:
        try:
            return _resolve(groups, tgt, constraints=prefer, **options)
        except CheckFailed:
            pass
    return _resolve(groups, tgt, **options)


def layered(earlier: dict[str, list[dict]], joint: dict[str, list[dict]], requested: set[str]) -> dict[str, list[dict]]:
    """The install groups of the image's layers from two resolutions of the same requirements.

    The groups before ``packages`` come from the resolution without the spec's packages, so that
    changing ``packages.pip`` leaves their pins files, and with them the framework's layer and
    Horovod's compile, cached. ``packages`` gets the rest of the joint resolution: what the earlier
    groups lack, and every package whose version the spec's packages move (a framework dependency
    pinned in ``packages.pip``), which is installed again over the earlier version; such an entry
    names the version it replaces (``overrides``). The image ends with exactly the joint
    resolution. When installing over cannot give that (the joint resolution leaves out a package
    an earlier group holds), the joint groups are used as they are. ``requested``: the canonical
    names the spec's packages ask for."""
    final, before = pip_by_name(joint), pip_by_name(earlier)
    if set(before) - set(final):
        return joint
    out = {g: earlier[g] for g in PIP_GROUPS if g in earlier and g != "packages"}
    packages = []
    for name, entry in sorted(final.items()):
        if name not in before:
            packages.append(dict(entry, requested=name in requested))
        elif before[name]["version"] != entry["version"]:
            packages.append(dict(entry, requested=name in requested, overrides=before[name]["version"]))
    if packages:
        out["packages"] = packages
    return out


def _resolve(groups: dict[str, list[str]], tgt: dict, *, index_url: str | None = None,
             extra_index_urls: list[str] | None = None, find_links: str | None = None,
             ca_bundle: str | None = None, constraints: dict[str, str] | None = None) -> dict[str, list[dict]]:
    reqs = [r for g in PIP_GROUPS for r in groups.get(g, [])]
    if not reqs:
        return {}
    with tempfile.TemporaryDirectory(prefix="envbuilder-pip-") as tmp:
        report = Path(tmp) / "report.json"
        cfile = None
        if constraints:
            cfile = Path(tmp) / "constraints.txt"
            cfile.write_text("".join(f"{n}=={v}\n" for n, v in sorted(constraints.items())))
        options: dict[str, Any] = dict(index_url=index_url or DEFAULT_INDEX,
                                       extra_index_urls=extra_index_urls or [], find_links=find_links,
                                       cert=_cert(ca_bundle), constraints=cfile)
        cmd = pip_command(reqs, tgt, report, **options)
        # no pip configuration of this machine (mirrors, constraints, find-links) takes part: the
        # image's pip sees none of it either
        env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
        env["PIP_CONFIG_FILE"] = os.devnull
        env["ENVBUILDER_MARKER_ENV"] = json.dumps(tgt["markers"])
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            _refuse_other_arch(proc.stderr, tgt, env, report, options)
            raise CheckFailed("lock: pip", f"pip could not resolve the Python packages for Python "
                              f"{tgt['python']} / glibc {tgt['glibc']}: {_pip_error(proc.stderr)}",
                              "check the versions in the spec exist as wheels for that Python "
                              "(local wheels: --wheelhouse DIR); the index must be reachable")
        data = json.loads(report.read_text())
    seen_env = data.get("environment", {})
    if seen_env.get("python_version") != tgt["python"]:
        raise EnvbuilderError("lock: pip", f"pip evaluated markers for Python {seen_env.get('python_version')}, "
                              f"not the image's {tgt['python']}", "use pip >= 22.2")
    return split_groups(groups, data.get("install", []), tgt["markers"])


def resolve_in_image(engine, image: str, reqs: list[str], constraint: str | None = None) -> list[dict]:
    """Resolve in the image itself (NGC bases: only what the image lacks gets installed), under
    the image's pip constraint file when it has one (PIP_CONSTRAINT, as the build's pip steps).
    ``engine``: a lock.engine.ImageEngine (Docker, podman or buildah)."""
    env = {"PIP_CONSTRAINT": constraint} if constraint else None
    try:
        out = engine.run(image, ["python", "-m", "pip", "install", "--dry-run", "--quiet",
                                 "--disable-pip-version-check", "--report", "-", *reqs], env=env, stderr=False)
    except RuntimeError as exc:
        raise CheckFailed("lock: pip", f"resolving in {image} with {engine.name} failed: {str(exc).strip()[-400:]}",
                          f"{engine.name} pull {image}, and check the spec's pip packages exist") from None
    data = json.loads(out)
    items = data.get("install", [])
    return [dict(_entry(i), requested=bool(i.get("requested"))) for i in items]


def requirements_text(entries: list[dict]) -> str:
    """A requirements file for ``pip install --require-hashes --no-deps -r``."""
    lines = ["# Generated from envbuilder.lock: exact versions and sha256 (pip --require-hashes --no-deps)."]
    for e in sorted(entries, key=lambda e: canonical_name(e["name"])):
        lines.append(f"{e['name']}=={e['version']} --hash=sha256:{e['sha256']}")
    return "\n".join(lines) + "\n"
