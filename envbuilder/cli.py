"""The `envbuilder` command line. Exit codes: 0 ok, 1 a check failed, 2 bad input."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import __version__
from .errors import EXIT_BAD_INPUT, EnvbuilderError
from .helpdocs import epilog

COMMANDS = {}


def command(name, help_):
    def deco(fn):
        COMMANDS[name] = (fn, help_)
        return fn
    return deco


def _print_json(data) -> None:
    print(json.dumps(data, indent=2))


def _warn(findings, as_json: bool) -> None:
    if as_json:
        return
    for f in findings:
        print(f"{f.level}: {f.field}: {f.reason}" + (f" ({f.fix})" if f.fix else ""), file=sys.stderr)


# --- check / build ------------------------------------------------------------------------------

def _add_spec_arg(p):
    p.add_argument("spec", metavar="SPEC|PRESET", help="the YAML spec, or a preset's name (`envbuilder presets`; "
                   "a file of that name here wins)")
    p.add_argument("--json", action="store_true", help="machine-readable output")


@command("check", "validate a spec against the compatibility rules (writes nothing)")
def cmd_check(args) -> int:
    from .stack import resolve
    from .spec.presets import load_spec_arg
    from .config import load_config

    spec = load_spec_arg(args.spec, quiet=args.json)
    site = args.site or load_config().get("site")
    if site:
        from .slurm.options import apply_job_options

        # the site's arch, GPU and driver take part in the rules
        spec = apply_job_options(spec, site=site)
    stack = resolve(spec)
    if args.json:
        _print_json({"ok": True, "spec": args.spec, "findings": [f.as_dict() for f in stack.findings]})
    else:
        _warn(stack.findings, False)
        print(f"{args.spec}: ok ({stack.spec.framework.name} {stack.spec.framework.version}, base {stack.base})")
    return 0


def _build_args(p):
    _add_spec_arg(p)
    p.add_argument("--out", help="output folder (default: images/<name>)")
    p.add_argument("--no-build", action="store_true", help="write the files only; no container engine needed")
    from .engines import ENGINES

    p.add_argument("--engine", choices=list(ENGINES), default="docker",
                   help="buildah/podman: no daemon, rootless, bit-identical images from one lock")
    p.add_argument("--export", action="append", choices=["docker", "oci-archive", "docker-archive"],
                   help="buildah/podman: also hand the image to Docker, or write <out>/image.oci.tar "
                        "or image.docker.tar (apptainer build x.sif oci-archive://...); repeatable")
    p.add_argument("--no-cache", action="store_true",
                   help="build every step anew, none from the engine's build cache (buildah/podman always do)")
    p.add_argument("--check-reproducible", action="store_true",
                   help="buildah/podman: build twice without cache, print both digests and what differs")
    p.add_argument("--ca-bundle", help="CA bundle the build trusts (TLS-intercepting proxies); never stored in the image")
    p.add_argument("--netrc", help="netrc file with a private pip index's login (machine HOST login USER "
                   "password TOKEN): a BuildKit secret like --ca-bundle, never stored in the image")
    p.add_argument("--wheelhouse", help="folder of local wheels pip uses first (offline sites)")
    p.add_argument("--tag", help="image tag (default: envbuilder/<name>:<spec hash>)")
    p.add_argument("--push", metavar="REPO[:TAG]",
                   help="after the build, push the image to a registry and record its digest in image.json "
                        "(REPO@sha256:D: what `envbuilder attest sign --image` takes); docker engine")
    p.add_argument("--sif", action="store_true",
                   help="also write <folder>/<name>.sif from the built image (no Apptainer needed: "
                        "tar2sqfs + siftool); same as `targets: [sif]`")
    from .lockcmd import add_force_option, add_lock_option

    add_lock_option(p)
    add_force_option(p)
    _job_args(p)


def _job_args(p):
    """Job-script options (envbuilder/slurm): override the spec's `cluster` section."""
    from .spec.schema import RUNTIMES

    p.add_argument("--runtime", choices=RUNTIMES, help="how job.sbatch runs the image (cluster.runtime)")
    p.add_argument("--site", metavar="NAME|FILE", help="site profile: sites/NAME.yaml or a file")
    p.add_argument("--sweep", action="append", metavar="NAME=V1,V2", default=[],
                   help="hyper-parameter values: job.sbatch becomes a job array (repeatable)")


@command("build", "check a spec, write Dockerfile, Apptainer.def, job.sbatch, manifest.json; build the image")
def cmd_build(args) -> int:
    from .lockcmd import build_options
    from .pipeline import BuildRequest, build

    def written(folder, shown, findings):
        if not args.json:
            _warn(findings, False)
            print(f"wrote {folder}/")
            for name in shown:
                print(f"  {name}")

    req = BuildRequest(spec=args.spec, opts=build_options(args), out=args.out, lock=args.lock,
                       site=args.site, runtime=args.runtime, sweep=tuple(args.sweep),
                       no_build=args.no_build, sif=args.sif)
    result = build(req, on_written=written)
    if args.json:
        _print_json(result)
    return 0


@command("sif", "write <folder>/<name>.sif from a built image or an image archive (no Apptainer needed)")
def cmd_sif(args) -> int:
    from .engines.docker import docker_cli
    from .errors import EnvbuilderError
    from .sif.build import make_sif, require_tools
    from .verify.runner import default_tag, read_manifest

    folder = Path(args.folder)
    manifest = read_manifest(folder / "manifest.json")
    archive = Path(args.archive) if args.archive else None
    if archive is not None and not archive.is_file():
        raise EnvbuilderError("--archive", f"no such file: {archive}",
                              "give a `docker save` or OCI image archive (buildah push IMAGE oci-archive:FILE)")
    require_tools()
    from .runtimes.docker import built_tag

    # the image this folder's build made (image.json: build --tag), else the spec's default tag
    tag = args.image or built_tag(folder) or default_tag(manifest)
    info = make_sif(folder, tag, docker=docker_cli(), archive=archive, quiet=args.json,
                    max_unpacked=args.max_unpacked_size)
    if args.json:
        _print_json({"ok": True, **info})
    return 0


def _size(text: str) -> int:
    from .sif.layers import parse_size

    try:
        return parse_size(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (e.g. 64G, 500M, 1T)") from None


def _sif_args(p):
    p.add_argument("folder", help="output folder of `envbuilder build` (holds manifest.json)")
    p.add_argument("--image", metavar="REF", help="Docker image (default: the manifest's image.tag)")
    p.add_argument("--archive", metavar="FILE", help="an image archive instead: `docker save` or OCI (buildah)")
    p.add_argument("--max-unpacked-size", metavar="SIZE", type=_size, default="64G",
                   help="refuse an image whose files add up to more than SIZE (K/M/G/T; default 64G)")
    p.add_argument("--json", action="store_true", help="machine-readable output")


@command("compare", "what two images hold, side by side: files, Python and OS packages (a .sif file, or an image "
                    "in the Docker engine or buildah's storage); exit 1 when the packages differ")
def cmd_compare(args) -> int:
    from .compare import compare_images, print_comparison

    diff = compare_images(args.a, args.b)
    ok = diff["same_packages"]
    if args.json:
        _print_json({"ok": ok, "compare": diff})
    else:
        print_comparison(diff)
        if not ok:
            print("error: compare: the two images do not hold the same Python and OS packages (listed above)\n"
                  "  fix: see which step of Apptainer.def installs them differently from the Dockerfile's",
                  file=sys.stderr)
    return 0 if ok else 1


def _compare_args(p):
    p.add_argument("a", metavar="A", help="an image: a .sif file (e.g. `apptainer build`'s of Apptainer.def), or a "
                   "tag in the Docker engine or buildah's storage")
    p.add_argument("b", metavar="B", help="the other image, likewise (e.g. the Dockerfile's: manifest.json image.tag)")
    p.add_argument("--json", action="store_true", help="machine-readable output: every difference")


# --- schema ---------------------------------------------------------------------------

@command("schema", "print the spec's JSON Schema (for editors)")
def cmd_schema(args) -> int:
    from .spec.schema import json_schema

    _print_json(json_schema())
    return 0


# --- verify (the smoke suite) -------------------------------------------------------------------

def _verify_args(p):
    from .verify.cli import add_arguments

    add_arguments(p)
    p.add_argument("--attest", metavar="FILE",
                   help="after a PASSING run only: write its in-toto attestation (subject: the image's "
                        "sha256 or ID) to FILE, for `envbuilder attest sign` (docs/attestation.md)")


@command("verify", "run the smoke suite in an image (or on the host) and report")
def cmd_verify(args) -> int:
    from .verify.cli import run

    return run(args)


# --- init / export: a user's environment in, a lock's environment out ---------------------------

def _write_new(path: str, text: str, force: bool, option: str) -> None:
    """Write one file the user named; an existing file is replaced only with --force, never through a link."""
    from .output import check_output_folder, write_atomic

    target = Path(path)
    check_output_folder(target.parent if str(target.parent) else Path("."), option)
    if target.is_symlink() or target.is_dir():
        raise EnvbuilderError(option, f"{path} is a link or a folder", "give the path of a new file")
    if target.exists() and not force:
        raise EnvbuilderError(option, f"{path} exists; replacing it would lose your file",
                              f"give another path with {option}, or --force to replace it")
    write_atomic(target, text)


@command("init", "write a spec from a requirements.txt, environment.yml, pyproject.toml or a conda environment")
def cmd_init(args) -> int:
    from .importers import import_spec

    if args.preset or not args.source:
        from .shippedcmd import init_preset

        return init_preset(args, _write_new)
    text, summary = import_spec(args.source, name=args.name, base=args.base, extras=tuple(args.extra),
                                out_name=args.out, wheelhouse=args.wheelhouse, gpu=args.gpu)
    if args.out == "-":
        sys.stdout.write(text)
        return 0
    _write_new(args.out, text, args.force, "-o")
    if args.json:
        _print_json({"ok": True, "spec": args.out, **summary})
    else:
        print(f"wrote {args.out}: {summary['framework']}, Python {summary['python']}"
              + (f", CUDA {summary['cuda']['version']}" if summary["cuda"] else "")
              + (f", MPI {summary['mpi']['flavor']} {summary['mpi']['version']}" if summary["mpi"] else "")
              + (f", Horovod {summary['horovod']['version']}" if summary["horovod"] else "")
              + f", {summary['pip']} pip and {summary['conda']} conda packages as written"
              + f"\n  next: envbuilder check {args.out}; envbuilder lock {args.out}")
    return 0


def _init_args(p):
    p.add_argument("source", metavar="FILE|ENV_PATH", nargs="?",
                   help="requirements*.txt, environment.yml, pyproject.toml (a uv.lock or pylock.toml beside it pins "
                        "its dependencies), or a conda environment's folder (it holds conda-meta/)")
    p.add_argument("--preset", metavar="NAME", help="instead of FILE: write out this preset (`envbuilder presets`) "
                   "to edit")
    p.add_argument("-o", "--out", default="spec.yaml", help="the spec to write (default spec.yaml; - prints it)")
    p.add_argument("--name", help="the spec's name (default: the project's or environment's name)")
    p.add_argument("--base", help="base image (e.g. local/debian:bookworm; default: chosen from CUDA and Python)")
    p.add_argument("--extra", action="append", default=[], metavar="GROUP",
                   help="pyproject.toml: also read this optional-dependencies group (repeatable)")
    p.add_argument("--gpu", action="store_true", help="a GPU image where the file names no CUDA part: CUDA from "
                   "PyPI, the framework's own NVIDIA wheels (cuda: {source: pypi})")
    p.add_argument("--wheelhouse", metavar="DIR", help="folder of local wheels: a framework range takes the newest "
                   "release there (e.g. torch 2.13.0+cpu) before the newest the catalog knows")
    p.add_argument("--force", action="store_true", help="replace an existing file at --out")
    p.add_argument("--json", action="store_true", help="machine-readable output")


@command("export", "write a lock's packages back out: a requirements file with hashes, or a conda explicit list")
def cmd_export(args) -> int:
    from .lock.export import conda_explicit, requirements
    from .lock.model import LOCK_NAME, load

    path = Path(args.lock)
    if path.is_dir():
        path = path / LOCK_NAME
    if not path.is_file():
        raise EnvbuilderError("export", f"no lock at {path}", "give an envbuilder.lock or the output folder "
                              "holding one (envbuilder lock SPEC writes it)")
    lock = load(path)
    if args.format == "conda":
        if not lock.conda_packages():
            raise EnvbuilderError("export conda", f"{path} holds no conda package",
                                  "export requirements instead; conda packages come from packages.conda")
        text = conda_explicit(lock, str(path))
    else:
        text = requirements(lock, str(path))
    if args.out in (None, "-"):
        sys.stdout.write(text)
    else:
        _write_new(args.out, text, args.force, "-o")
        if not args.json:
            print(f"wrote {args.out}")
    return 0


def _export_args(p):
    p.add_argument("format", choices=["requirements", "conda"],
                   help="requirements: pip's file with --hash lines; conda: @EXPLICIT list of URLs with md5")
    p.add_argument("lock", metavar="LOCK|FOLDER", help="an envbuilder.lock, or the output folder that holds one")
    p.add_argument("-o", "--out", help="the file to write (default: print it)")
    p.add_argument("--force", action="store_true", help="replace an existing file at --out")
    p.add_argument("--json", action="store_true", help="machine-readable errors")


# --- attest (signed proof of a passing verify) ---------------------------------------------------

def _attest_args(p):
    from .attest.commands import FORMATS

    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    s = sub.add_parser("sign", help="sign a verify attestation (or a build's provenance) with your key (cosign "
                                    "bundle beside a SIF, apptainer sign with it in the SIF's signed group, or "
                                    "cosign attest in a registry)",
                       epilog=epilog("attest"))
    s.add_argument("statement", metavar="STATEMENT",
                   help="the file `envbuilder verify --attest` wrote, or FOLDER/provenance.intoto.json")
    s.add_argument("--key", required=True, metavar="KEY",
                   help="your PEM private key (cosign.key; for --format apptainer an openssl PEM key); "
                        "an encrypted cosign key's password: COSIGN_PASSWORD")
    s.add_argument("--image", required=True, metavar="SIF|REPO@sha256:D", help="the image verify ran")
    s.add_argument("--format", choices=FORMATS, default="auto",
                   help="cosign (bundle STATEMENT.bundle), apptainer (in the SIF), registry (cosign attest); "
                        "auto: registry for REPO@sha256:D, cosign for a file")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    c = sub.add_parser("check", help="check an image has a valid, signed, passing attestation of this stack "
                                     "(exit 0; else exit 2 naming what failed)", epilog=epilog("attest"))
    c.add_argument("--image", required=True, metavar="SIF|REPO@sha256:D", help="the image to run")
    c.add_argument("--key", action="append", default=[], metavar="PUB", help="a trusted public key (repeatable)")
    c.add_argument("--format", choices=FORMATS, default="auto",
                   help="auto: registry for REPO@sha256:D, cosign when IMAGE.att.json exists, else apptainer")
    c.add_argument("--attestation", metavar="FILE", help="the statement (default IMAGE.att.json)")
    c.add_argument("--bundle", metavar="FILE", help="its cosign bundle (default ATTESTATION.bundle)")
    c.add_argument("--stack", metavar="ID", help="the stack it must be of (lock:HEX or spec:HEX)")
    c.add_argument("--folder", metavar="FOLDER", help="the stack of this output folder's manifest.json")
    c.add_argument("--pulled", metavar="REF|SIF", help="registry: the local image pulled by that digest, whose "
                                                      "ID must be the image verify ran, or the .sif `apptainer "
                                                      "pull docker://REPO@sha256:D` wrote")
    c.add_argument("--json", action="store_true", help="machine-readable output")
    v = sub.add_parser("provenance", help="write FOLDER/provenance.intoto.json: the build's inputs and image",
                       epilog=epilog("attest"))
    v.add_argument("folder", metavar="FOLDER", help="output folder of envbuilder build (built)")
    v.add_argument("--out", metavar="FILE", help="where to write it (default FOLDER/provenance.intoto.json)")
    v.add_argument("--json", action="store_true", help="machine-readable output")


@command("attest", "sign and check the attestation of a passing verify (sign, check, provenance)")
def cmd_attest(args) -> int:
    from .attest import commands

    if args.action == "sign":
        line = commands.sign(args.statement, args.key, args.image, args.format)
    elif args.action == "check":
        passed = commands.run_check(args.image, args.key, fmt=args.format, attestation=args.attestation,
                                    bundle=args.bundle, stack=args.stack, folder=args.folder, pulled=args.pulled)
        if args.json:
            _print_json({"ok": True, "form": passed.form, "subject": passed.subject, "key": passed.key,
                         "stack": passed.stack})
            return 0
        line = passed.line(args.image)
    else:
        line = commands.provenance(args.folder, args.out) or ""
    if args.json:
        _print_json({"ok": True, "message": line})
    else:
        print(line)
    return 0


@command("config", "the configuration in force: each key, its value and where it was set, and the files read")
def cmd_config(args) -> int:
    from .config import load_config, render_text

    cfg = load_config()
    if args.json:
        _print_json({"ok": True, **cfg.as_dict()})
    else:
        print(render_text(cfg))
    return 0


@command("doctor", "what this machine can do: engines, Slurm, MPI, proxy and CA, registry, QEMU, config")
def cmd_doctor(args) -> int:
    from .doctor import run

    return run(preset=args.preset, as_json=args.json)


def _doctor_args(p):
    p.add_argument("--preset", metavar="NAME", help="exit 1 when something this preset needs is missing")
    p.add_argument("--json", action="store_true", help="machine-readable output")


from .lockcmd import cmd_diff, cmd_lock, diff_args, lock_args  # noqa: E402
from .shippedcmd import cmd_presets, cmd_sites, presets_args, sites_args  # noqa: E402

command("lock", "resolve every pin and hash of a spec into envbuilder.lock (--update NAME: one entry)")(cmd_lock)
command("diff", "compare two locks or manifests (files, output folders, images): added, removed, changed")(cmd_diff)
command("presets", "list the known-good stacks by name (what `build NAME` takes) with their full version sets")(cmd_presets)
command("sites", "list the site profiles `--site NAME` takes: name, description, where found")(cmd_sites)

def _check_args(p):
    _add_spec_arg(p)
    p.add_argument("--site", metavar="NAME|FILE", help="site profile (its arch, gpu, driver are checked too)")


ARGS = {"check": _check_args, "build": _build_args, "lock": lock_args, "diff": diff_args, "presets": presets_args,
        "schema": lambda p: None,
        "verify": _verify_args, "sif": _sif_args, "compare": _compare_args, "init": _init_args, "sites": sites_args,
        "export": _export_args, "attest": _attest_args, "doctor": _doctor_args,
        "config": lambda p: p.add_argument("--json", action="store_true", help="machine-readable output")}


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="envbuilder",
        description="One YAML spec -> a validated deep-learning container for HPC and its Slurm job.",
        epilog=epilog())
    parser.add_argument("--version", action="version", version=f"envbuilder {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (fn, help_) in COMMANDS.items():
        p = sub.add_parser(name, help=help_, description=help_, epilog=epilog(name))
        ARGS[name](p)
        p.set_defaults(func=fn)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = make_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_BAD_INPUT
    try:
        return args.func(args)
    except EnvbuilderError as exc:
        if getattr(args, "json", False):
            _print_json({"ok": False, **exc.as_dict()})
        else:
            print(f"error: {exc.message()}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
