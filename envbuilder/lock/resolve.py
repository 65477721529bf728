"""Resolve a stack into a Lock (kind by kind), and tell whether a lock still matches a spec.

``want`` (envbuilder/needs.py: what the stack needs, per kind) is handed in; a lock records the
inputs it was resolved from. A kind whose inputs did not change keeps its entries when the lock is refreshed;
``--update NAME`` re-resolves one entry and keeps every other one where it still fits.
"""

from __future__ import annotations

import datetime
import os

from .. import __version__
from ..errors import CheckFailed, EnvbuilderError
from . import apt as apt_
from . import base as base_
from . import conda as conda_
from . import pip as pip_
from . import sources as sources_
from .engine import ENGINE_NAMES
from .model import PIP_GROUPS, Lock, LockError, canonical_name, pip_by_name



def differences(lock: Lock, stack, want: dict) -> list[str]:
    """What the stack needs (``want``) that the lock was not resolved for (empty: the lock matches)."""
    have = lock.inputs
    out = []
    if lock.name != stack.spec.name:
        out.append(f"name: the lock is for {lock.name!r}, the spec is {stack.spec.name!r}")
    for stage in sorted(set(want["base"]) | set(have.get("base", {}))):
        a, b = want["base"].get(stage), have.get("base", {}).get(stage)
        if a != b:
            out.append(f"base.{stage}: the spec asks {a or 'none'}, the lock has {b or 'none'}")
    for stage in sorted(set(want["apt"]) | set(have.get("apt", {}))):
        a, b = set(want["apt"].get(stage, [])), set(have.get("apt", {}).get(stage, []))
        out += [f"apt.{stage}: {p} is in the spec, not in the lock" for p in sorted(a - b)]
        out += [f"apt.{stage}: {p} is in the lock, no longer in the spec" for p in sorted(b - a)]
    ws, hs = want["sources"], have.get("sources", {})
    for name in sorted(set(ws) | set(hs)):
        if ws.get(name) != hs.get(name):
            out.append(f"sources: {name} {ws.get(name) or 'none'} in the spec, {hs.get(name) or 'none'} in the lock")
    wp, hp = want["pip"], have.get("pip", {})
    for key in ("python", "glibc", "extra_index_urls", "in_image", "constraint"):
        if wp.get(key) != hp.get(key):
            out.append(f"pip.{key}: {wp.get(key)!r} for the spec, {hp.get(key)!r} in the lock")
    if wp.get("machine", "x86_64") != hp.get("machine", "x86_64"):
        out.append(f"pip.machine: {wp.get('machine', 'x86_64')} wheels for the spec, "
                   f"{hp.get('machine', 'x86_64')} in the lock")
    for group in PIP_GROUPS:
        a, b = set(wp["groups"].get(group, [])), set(hp.get("groups", {}).get(group, []))
        out += [f"pip.{group}: {r} is in the spec, not in the lock" for r in sorted(a - b)]
        out += [f"pip.{group}: {r} is in the lock, no longer in the spec" for r in sorted(b - a)]
    wc, hc = want["conda"] or {}, have.get("conda") or {}
    a, b = set(wc.get("packages", [])), set(hc.get("packages", []))
    out += [f"conda: {r} is in the spec, not in the lock" for r in sorted(a - b)]
    out += [f"conda: {r} is in the lock, no longer in the spec" for r in sorted(b - a)]
    return out


def check_matches(lock: Lock, stack, want: dict) -> None:
    diffs = differences(lock, stack, want)
    if diffs:
        shown = "; ".join(diffs[:8]) + (f"; and {len(diffs) - 8} more" if len(diffs) > 8 else "")
        raise LockError("envbuilder.lock", f"does not match the spec: {shown}",
                        "re-resolve what changed: envbuilder lock SPEC (then build again)", source=lock.path)


# --- resolution -----------------------------------------------------------------------------

def _targets(update: list[str], lock: Lock | None) -> dict[str, set]:
    """--update NAMEs sorted by kind; an unknown name is bad input."""
    out = {"base": set(), "apt": set(), "pip": set(), "sources": set(), "conda": set()}
    for name in update:
        if name == "base" or name.startswith("base."):
            out["base"].add(name.partition(".")[2] or "*")
            continue
        if lock is None:
            raise EnvbuilderError("--update", f"there is no lock to update {name} in",
                                  "run envbuilder lock SPEC first")
        found = False
        if any(e["name"] == name for entries in lock.apt.values() for e in entries):
            out["apt"].add(name)
            found = True
        if canonical_name(name) in lock.pip_versions():
            out["pip"].add(canonical_name(name))
            found = True
        if any(e["name"] == name for e in lock.sources):
            out["sources"].add(name)
            found = True
        if any(p["name"] == name for p in lock.conda_packages()):
            out["conda"].add(name)
            found = True
        if not found:
            raise EnvbuilderError("--update", f"{name} is not an entry of the lock",
                                  "name a package in it (envbuilder diff shows them), or base")
    return out


def resolve_lock(stack, want: dict, *, client, previous: Lock | None = None, update: list[str] | None = None,
                 wheelhouse: str | None = None, ca_bundle: str | None = None,
                 conda_lockfile: str | None = None, progress=None,
                 sources: list[dict] | None = None, prefer: dict[str, str] | None = None,
                 index_url: str | None = None, extra_index_urls: list[str] | None = None) -> Lock:
    """A complete lock for ``stack`` needing ``want``; kinds unchanged since ``previous`` keep their
    entries. ``client(why)`` gives a container engine (lock/engine.py: Docker, podman or buildah),
    called only when a kind needs one; the lock records which one (``resolvers.engine``);
    ``sources``: the source tarballs the components want (needs.source_tarballs); ``prefer``: versions
    pip keeps when they fit (the bootstrap tools' usual pins, needs.bootstrap_prefer); ``index_url``,
    ``extra_index_urls``: the site's pip index and more (config.py; None: PyPI), before the spec's."""
    say = progress or (lambda msg: None)
    make_client = client
    targets = _targets(update or [], previous)
    old = previous.inputs if previous else {}

    def keep(kind: str) -> bool:
        return previous is not None and old.get(kind) == want[kind] and not targets[kind]

    lock = Lock(name=stack.spec.name, inputs=want, generated_by=f"envbuilder {__version__}")
    lock.resolvers = dict(previous.resolvers) if previous else {}
    lock.resolvers["envbuilder"] = __version__
    client = None

    # base images
    if keep("base") and not targets["base"]:
        lock.base = previous.base
    else:
        client = client or make_client("base images and OS packages")
        for stage, ref in want["base"].items():
            if previous and stage in previous.base and previous.base[stage]["ref"] == ref \
                    and not ({"*", stage} & targets["base"]):
                lock.base[stage] = previous.base[stage]
            else:
                say(f"base.{stage}: {ref}")
                platform = stack.catalog.arch(stack.spec.target_arch)["docker"]
                base_.check_architecture(ref, client, platform.split("/")[-1])
                lock.base[stage] = base_.resolve_base(ref, client, platform)
        _record_engine(lock, client)

    # OS packages, in each stage's locked base image
    base_changed = previous is None or lock.base != previous.base
    if keep("apt") and not base_changed:
        lock.apt = previous.apt
    elif want["apt"]:
        client = client or make_client("OS packages")
        by_image: dict[str, dict[str, list[str]]] = {}
        for stage, pkgs in want["apt"].items():
            b = lock.base[stage]
            image = b["digest"] if b["kind"] == "image-id" else b["pinned"]
            requested = list(pkgs)
            if targets["apt"] and previous and stage in previous.apt:
                pinned = {e["name"]: e["version"] for e in previous.apt[stage] if e["name"] not in targets["apt"]}
                requested = sorted({p.split("=")[0] for p in pkgs} | set(pinned) | (targets["apt"] & {
                    e["name"] for e in previous.apt[stage]}))
                requested = [f"{n}={pinned[n]}" if n in pinned else n for n in requested]
            by_image.setdefault(image, {})[stage] = requested
        for image, stages in by_image.items():
            say(f"apt: {', '.join(stages)} in {image[:19]}")
            if ":" in image and not image.startswith("sha256:"):
                _ensure_image(client, image)
            found, meta = apt_.resolve(client, image, stages)
            _record_engine(lock, client)
            lock.apt.update(found)
            lock.resolvers["apt"] = meta["apt"] or lock.resolvers.get("apt")
            lock.resolvers["apt-index"] = dict(sorted(meta["index"].items()))

    # source tarballs
    if keep("sources"):
        lock.sources = previous.sources
    else:
        say("sources")
        lock.sources = sources_.resolve(sources or [], ca_bundle)

    # Python packages
    if keep("pip"):
        lock.pip = previous.pip
    else:
        wp = want["pip"]
        if wp["in_image"]:
            client = client or make_client("Python packages on an NGC base")
            reqs = wp["groups"].get("packages", [])
            say(f"pip: resolving {len(reqs)} requirements inside {stack.base}")
            lock.pip = {"packages": pip_.resolve_in_image(client, lock.base["devel"]["pinned"], reqs,
                                                          wp.get("constraint"))} if reqs else {}
            if reqs:
                _record_engine(lock, client)
        else:
            prefer, prefer_earlier = dict(prefer or {}), None
            if previous and previous.pip:
                # keep every version the change does not touch: --update NAME re-resolves NAME; a
                # changed spec re-resolves the packages whose requirements changed (new pins,
                # additions, removals). pip drops the preferences that no longer fit.
                moved = targets["pip"] or pip_.changed_names(old.get("pip", {}).get("groups", {}), wp["groups"])
                prefer = {canonical_name(e["name"]): e["version"] for e in previous.pip_entries()
                          if canonical_name(e["name"]) not in moved}
                # the layers before the spec's packages keep their own versions (not the overrides)
                earlier = pip_by_name({g: es for g, es in previous.pip.items() if g != "packages"})
                prefer_earlier = {n: e["version"] for n, e in earlier.items() if n not in moved}
            tgt = pip_.target(wp["python"], wp["glibc"], wp.get("machine", "x86_64"))
            say(f"pip: {sum(len(g) for g in wp['groups'].values())} requirements for Python {tgt['python']}, "
                f"glibc {tgt['glibc']}, {tgt['markers']['platform_machine']}")
            lock.pip = pip_.resolve(wp["groups"], tgt, prefer=prefer, prefer_earlier=prefer_earlier,
                                    index_url=index_url,
                                    extra_index_urls=list(extra_index_urls or []) + [
                                        u for u in wp["extra_index_urls"] if u not in (extra_index_urls or [])],
                                    find_links=wheelhouse, ca_bundle=ca_bundle)
            _refuse_cuda_torch_on_cpu(stack, lock.pip)
        lock.resolvers["pip"] = pip_.pip_version()

    # conda packages (py-rattler's solve, recorded in conda-lock's format)
    if want["conda"] is None:
        lock.conda = None
    elif conda_lockfile:
        lock.conda = {"lockfile": conda_.load_lockfile(conda_lockfile, list(want["conda"]["packages"])),
                      "from": os.path.basename(conda_lockfile)}
        lock.resolvers["conda"] = "lockfile " + os.path.basename(conda_lockfile)
    elif keep("conda"):
        lock.conda = previous.conda
    else:
        chans = list(want["conda"].get("channels") or conda_.channels())
        say(f"conda: py-rattler against {', '.join(chans)}")
        lockfile, version = conda_.resolve(list(want["conda"]["packages"]), chans)
        lock.conda = {"lockfile": lockfile, "from": "py-rattler"}
        lock.resolvers["conda"] = f"py-rattler {version}"
    lock.resolvers.pop("conda-lock", None)          # the resolver before py-rattler
    if lock.conda is None:
        lock.resolvers.pop("conda", None)

    lock.resolved_at = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return lock


def _refuse_cuda_torch_on_cpu(stack, pip: dict) -> None:
    """A CPU aarch64 torch spec whose torch PyPI publishes as a CUDA build for aarch64 (catalog
    aarch64_pypi) gets the CPU index as an extra index; when pip did not reach it, PyPI's CUDA
    build (and its CUDA wheels) would fill the lock of a CPU image: refused, exit 2."""
    fw, spec = stack.spec.framework, stack.spec
    if fw.name != "pytorch" or spec.target_arch != "aarch64" or spec.cuda or fw.index_url:
        return
    cpu_index = stack.catalog.framework_index("pytorch", None)
    if stack.framework_index_url != cpu_index:
        return
    torch = pip_by_name(pip).get("torch")
    if torch is None or "+cpu" in torch["version"]:
        return
    until = stack.catalog.data["aarch64_pypi"]["pytorch"]["cpu_until"]
    raise EnvbuilderError("lock: pip", f"torch {torch['version']} resolved to PyPI's aarch64 wheel, a CUDA build "
                          f"({torch['file']}), not the CPU build: the CPU index {cpu_index} was not reached "
                          "(or has no such version)",
                          f"pin torch {until}.x (PyPI's last CPU-only aarch64 wheel), set framework.index_url "
                          "to a reachable mirror of the CPU index, or give the +cpu wheel with --wheelhouse")


def _record_engine(lock: Lock, engine) -> None:
    """``resolvers.engine``: which engine resolved the lock; its version under its own name (one
    engine's entry only: a lock re-resolved with podman no longer names the Docker it was made with)."""
    for name in ENGINE_NAMES:
        lock.resolvers.pop(name, None)
    lock.resolvers["engine"] = engine.name
    lock.resolvers[engine.name] = engine.version()


def _ensure_image(engine, ref: str) -> None:
    if engine.image(ref) is not None:
        return
    try:
        engine.pull(ref)
    except RuntimeError as exc:  # unreachable registry, no such image
        raise CheckFailed("lock: apt", f"cannot pull {ref} to resolve its OS packages ({str(exc).strip()[-300:]})",
                          f"{engine.name} pull {ref} where the registry is reachable, then lock again") from None
