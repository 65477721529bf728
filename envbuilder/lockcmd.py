"""`envbuilder lock` and `envbuilder diff`, and the lock's part in `envbuilder build` (the CLI layer:
the lock package below resolves and records; this module decides when, and writes the files).

Where the lock lives: ``<output folder>/envbuilder.lock`` (default ``images/<name>/``), beside
the recipes it pins, so the folder is a complete, reproducible build context. ``--lock FILE``
reads and writes it elsewhere (e.g. beside the spec in your own repository); `build` then copies
it into the output folder too.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from .engines.context import check_inputs
from .errors import EnvbuilderError
from .engines.docker import engine
from .engines import ENGINES
from .engines.images import AUTO_ORDER, image_engine
from .engines.options import BuildOptions
from .lock.base import check_engine_base
from .lock.diff import compare, identity_line, image_identity, load_any, table
from .lock.model import LOCK_NAME, Lock, LockError, dump, load
from .lock.resolve import resolve_lock
from .lock.variant import check_framework_build
from .needs import bootstrap_prefer, needs, source_tarballs
from .output import check_output_folder, check_replaceable, write_folder
from .stack import Stack, resolve
from .spec.presets import load_spec_arg


def lock_path(spec, lock: str | None = None, out: str | None = None) -> Path:
    """--lock FILE, else <--out or images/<name>>/envbuilder.lock."""
    if lock:
        return Path(lock)
    folder = Path(out) if out else Path("images") / spec.name
    return folder / LOCK_NAME


def add_lock_option(p) -> None:
    p.add_argument("--lock", metavar="FILE", help=f"the lock file (default: <output folder>/{LOCK_NAME})")


def build_options(args) -> BuildOptions:
    """The options object engines and the lock step take, from `build`'s or `lock`'s arguments
    over the configuration (config.py: the ENVBUILDER_* variables, the user's and the site's
    config.toml): the one place argparse meets them. A file or folder named anywhere must exist
    (the message says where it was set)."""
    from .config import load_config, require_path

    cfg = load_config({k: getattr(args, k, None) for k in ("wheelhouse", "ca_bundle", "netrc")})
    return BuildOptions(
        engine=getattr(args, "engine", None) or "docker", tag=getattr(args, "tag", None),
        ca_bundle=require_path(cfg, "ca_bundle"), netrc=require_path(cfg, "netrc"),
        wheelhouse=require_path(cfg, "wheelhouse"), wheelhouse_origin=cfg.origin("wheelhouse"),
        index_url=cfg.get("pip_index_url"), extra_index_urls=tuple(cfg.list("extra_index_url")),
        exports=tuple(getattr(args, "export", None) or ()),
        check_reproducible=bool(getattr(args, "check_reproducible", False)),
        no_cache=bool(getattr(args, "no_cache", False)),
        conda_lockfile=getattr(args, "conda_lockfile", None), quiet=bool(getattr(args, "json", False)),
        force=bool(getattr(args, "force", False)), push=getattr(args, "push", None))


def _resolver_options(opts: BuildOptions) -> dict:
    return {"wheelhouse": opts.wheelhouse, "ca_bundle": opts.ca_bundle, "conda_lockfile": opts.conda_lockfile,
            "index_url": opts.index_url, "extra_index_urls": list(opts.extra_index_urls)}


def _say(quiet: bool):
    return (lambda m: None) if quiet else (lambda m: print(f"  resolving {m}", file=sys.stderr, flush=True))


def _engines(name: str | None, stack, quiet: bool):
    """``client(why)`` for the lock's resolvers: the engine ``name`` (docker, podman, buildah; None:
    the first usable), made on first use and then kept (handed to them: the lock imports no engine)."""
    made: list = []

    def client(required_for: str):
        if not made:
            made.append(image_engine(name, required_for, gpu=stack.spec.cuda is not None, quiet=quiet))
        return made[0]
    return client


# --- build ----------------------------------------------------------------------------------

def existing_lock(path: Path) -> Lock | None:
    """The lock `build` must use, checked against the spec by generate(); None when there is none."""
    return load(path) if path.is_file() else None


def ensure_locked(opts: BuildOptions, stack: Stack) -> Lock | None:
    """Before a real build, the lock it builds from: the stack's own, or (none yet) one resolved now
    with an engine and the network (the caller writes it with the rest of the output folder).
    None only with an engine that resolves no lock (a warning says how to get one). Also checks
    that a daemon's local base image is still the one the lock names."""
    engine = ENGINES[opts.engine]
    lock = stack.lock
    if not engine.resolves_lock:
        if lock is None:
            print("warning: no envbuilder.lock: building with the spec's pins only (`envbuilder lock` "
                  "resolves one with Docker, podman or buildah: docs/login-node.md)", file=sys.stderr)
        return lock
    quiet = opts.quiet
    # the engine first: on a login node every refusal (subordinate ids, runtime folder, storage)
    # comes before any work
    client = _engines(opts.engine, stack, quiet)
    resolver = client("the build")
    if lock is None:
        started = time.monotonic()
        check_inputs(opts.ca_bundle, opts.wheelhouse)
        lock = _resolve_checked(stack, opts, client=client, progress=_say(quiet),
                                sources=source_tarballs(stack), prefer=bootstrap_prefer(stack))
        if not quiet:
            print(f"locked {stack.spec.name} with {resolver.name} in {time.monotonic() - started:.0f} s: "
                  f"{summary(lock)}")
    if engine.needs_daemon:        # a daemonless engine checks (or copies in) the base in its own storage
        for entry in lock.base.values():
            check_engine_base(entry, resolver)
    return lock


def _resolve_checked(stack, opts: BuildOptions, **kwargs) -> Lock:
    """resolve_lock, then the framework build check. A wheelhouse from the configuration (a site's
    or user's, not --wheelhouse) is a source of wheels, not a demand: when the framework wheel the
    lock took from it is the wrong build for this spec (the site's CPU torch for a GPU spec), the
    lock is resolved again without it, saying so; given on the command line, it is refused."""
    lock = resolve_lock(stack, needs(stack), **kwargs, **_resolver_options(opts))
    try:
        check_framework(stack, lock)
    except EnvbuilderError as exc:
        configured = opts.wheelhouse and not opts.wheelhouse_origin.startswith("command line")
        if not configured or "from the wheelhouse" not in exc.reason:
            raise
        if not opts.quiet:
            print(f"note: the wheelhouse {opts.wheelhouse} ({opts.wheelhouse_origin}) holds the wrong build "
                  f"of {stack.spec.framework.name} for this spec: locking without it", file=sys.stderr)
        # the Python packages again, without the wheelhouse; base, OS packages and sources kept
        again = dict(kwargs, previous=lock, update=[stack.catalog.framework(stack.spec.framework.name)["pip"]])
        lock = resolve_lock(stack, needs(stack), **again, **dict(_resolver_options(opts), wheelhouse=None))
        check_framework(stack, lock)
    return lock


def check_framework(stack, lock) -> None:
    """Before the lock is written: its framework wheel is the build the spec asks for (GPU or CPU)."""
    if stack.ngc:
        return          # the NGC image brings its own framework build
    fw = stack.spec.framework
    cuda = stack.spec.cuda
    check_framework_build(lock.pip, stack.catalog.framework(fw.name)["pip"], gpu=bool(cuda),
                          cuda_from_pypi=bool(cuda and cuda.from_pypi), spec_version=fw.version)


def summary(lock) -> str:
    return (f"base {len(lock.base)}, apt {sum(len(v) for v in lock.apt.values())}, sources {len(lock.sources)}, "
            f"pip {len(lock.pip_entries())}, conda {len(lock.conda_packages())}")


# --- lock -----------------------------------------------------------------------------------

def lock_args(p) -> None:
    p.add_argument("spec", metavar="SPEC|PRESET", help="the YAML spec, or a preset's name (a file of that name "
                   "here wins)")
    p.add_argument("--out", help="output folder whose envbuilder.lock to write (default: images/<name>)")
    add_lock_option(p)
    p.add_argument("--update", action="append", default=[], metavar="NAME",
                   help="re-resolve one entry (a package name, or base); repeatable")
    p.add_argument("--wheelhouse", help="folder of local wheels (as for build; e.g. torch +cpu)")
    p.add_argument("--ca-bundle", help="CA bundle for reaching the index (TLS-intercepting proxies)")
    p.add_argument("--conda-lockfile", metavar="FILE",
                   help="use this conda-lock lockfile for the spec's conda packages (made where channels are reachable)")
    p.add_argument("--engine", choices=list(AUTO_ORDER),
                   help="the container engine that resolves the base image and the OS packages (default: the "
                        "first usable of docker, podman, buildah; rootless podman/buildah: docs/login-node.md)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    add_force_option(p)


def add_force_option(p) -> None:
    p.add_argument("--force", action="store_true",
                   help="replace files in the output folder that envbuilder did not write (by default "
                        "such a file is named and nothing is written)")


def cmd_lock(args) -> int:

    spec = load_spec_arg(args.spec, quiet=bool(getattr(args, "json", False)))
    stack = resolve(spec)
    path = lock_path(spec, args.lock, args.out)
    check_output_folder(path.parent, "--lock" if args.lock else "--out")
    check_replaceable(path, "--lock" if args.lock else "--out", bool(args.force))
    previous = None
    if path.is_file():
        try:
            previous = load(path)
        except LockError as exc:
            if args.update:
                raise
            if not args.json:
                print(f"warning: {exc.message()}\n  resolving everything anew", file=sys.stderr)
    opts = build_options(args)
    check_inputs(opts.ca_bundle, opts.wheelhouse)
    started = time.monotonic()
    lock = _resolve_checked(stack, opts, client=_engines(args.engine, stack, args.json), previous=previous,
                            update=args.update, progress=_say(args.json), sources=source_tarballs(stack),
                            prefer=bootstrap_prefer(stack))
    seconds = time.monotonic() - started
    if previous is not None and previous.inputs == lock.inputs and previous.flat() == lock.flat() \
            and previous.conda == lock.conda:
        lock.resolved_at, lock.resolvers = previous.resolved_at, previous.resolvers   # nothing changed
    write_folder(path.parent, {path.name: dump(lock).encode()}, force=opts.force)
    changes = compare(previous.flat() if previous else {}, lock.flat())
    if args.json:
        print(json.dumps({"ok": True, "lock": str(path), "seconds": round(seconds, 1),
                          "counts": {"base": len(lock.base), "apt": sum(len(v) for v in lock.apt.values()),
                                     "sources": len(lock.sources), "pip": len(lock.pip_entries()),
                                     "conda": len(lock.conda_packages())},
                          "changes": changes}, indent=2))
        return 0
    print(f"locked {spec.name} in {seconds:.0f} s: {summary(lock)} -> {path}"
          + (f" (engine: {lock.resolvers['engine']})" if lock.resolvers.get("engine") else ""))
    if previous is not None:
        n = len(changes["changed"]) + len(changes["added"]) + len(changes["removed"])
        print(f"  {n} {'entry' if n == 1 else 'entries'} changed" if n else "  no entry changed")
        lines = [f"  ~ {k}: {v['from']} -> {v['to']}" for k, v in changes["changed"].items()]
        lines += [f"  + {k}: {v}" for k, v in changes["added"].items()]
        lines += [f"  - {k}: {v}" for k, v in changes["removed"].items()]
        for line in lines[:20]:
            print(line)
        if len(lines) > 20:
            print(f"  ... and {len(lines) - 20} more (envbuilder diff OLD NEW shows all)")
    return 0


# --- diff -----------------------------------------------------------------------------------

def diff_args(p) -> None:
    p.add_argument("a", help="a lock, a manifest, an output folder, or an image reference")
    p.add_argument("b", help="the same kinds, compared with A")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def cmd_diff(args) -> int:
    kind_a, a = load_any(args.a, engine)
    kind_b, b = load_any(args.b, engine)
    result = compare(a, b)
    ident_a, ident_b = image_identity(args.a), image_identity(args.b)
    line = identity_line(ident_a, ident_b)
    if line:
        result["images"] = {"a": ident_a, "b": ident_b, "bit_identical": bool(set(ident_a["ids"]) & set(ident_b["ids"]))}
    if args.json:
        print(json.dumps({"a": {"what": args.a, "kind": kind_a}, "b": {"what": args.b, "kind": kind_b},
                          **result}, indent=2))
    else:
        print(f"A: {args.a} ({kind_a})\nB: {args.b} ({kind_b})")
        sys.stdout.write(table(result))
        if line:
            print(line)
    return 0

