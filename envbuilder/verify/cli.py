"""`envbuilder verify [FOLDER|--image REF] [--runtime docker|apptainer|charliecloud|host] ...`

Exit codes: 0 every check passed (or was skipped), 1 a check failed, 2 bad input (no manifest,
no engine, no image). Bad input raises ``EnvbuilderError``, which the top-level command line
prints as one message.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path
from typing import Callable

from ..errors import EXIT_CHECK_FAILED, EXIT_OK, EnvbuilderError
from . import report as rep
from .slurm import SlurmRequest, add_slurm_arguments, run_slurm
from ..output import write_atomic
from ..runtimes import VERIFY_DEFAULT, for_target, runtime
from ..runtimes.sif import SifCharliecloud
from .runner import RUNTIMES, Outcome, Target, VerifyOptions, resolve_target, run_suite


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("folder", nargs="?", metavar="FOLDER",
                        help="output folder of `envbuilder build` (holds manifest.json); default: "
                             "./manifest.json or the only images/<name>/ here")
    parser.add_argument("--image", metavar="REF",
                        help="image to run: docker tag (default: the manifest's image.tag), .sif file "
                             "(apptainer; without Apptainer: charliecloud runs its SquashFS partition) "
                             "or directory/tag (charliecloud)")
    parser.add_argument("--runtime", choices=RUNTIMES, default=VERIFY_DEFAULT,
                        help="where the suite runs (default docker); host: this machine's Python")
    parser.add_argument("--ranks", type=int, default=2, help="ranks (Horovod or torch.distributed; default 2)")
    parser.add_argument("--timeout", type=float, default=120.0, metavar="S",
                        help="seconds any single check may take before its rank counts as hung "
                             "(default 120)")
    parser.add_argument("--report", metavar="FILE", help="write the JSON report to FILE")
    parser.add_argument("--junit", metavar="FILE", help="write JUnit XML (one testcase per check)")
    parser.add_argument("--json", action="store_true", help="print the JSON report instead of the table")
    parser.add_argument("--manifest", metavar="FILE", help="compare with this manifest.json instead of "
                                                          "FOLDER's (host runtime without FOLDER)")
    parser.add_argument("--launcher", default="auto",
                        choices=("auto", "gloo", "mpi", "srun", "torchrun", "none"),
                        help="how the suite starts ranks (default: Horovod's gloo rendezvous started by the "
                             "suite and mpirun, per the manifest's controllers; gloo: horovodrun --gloo)")
    parser.add_argument("--python", metavar="EXE",
                        help="interpreter: host runtime (default: this one), images (default python)")
    parser.add_argument("--gpus", action="store_true", help="docker: pass --gpus all")
    parser.add_argument("--require-gpu", action="store_true", help=argparse.SUPPRESS)  # the default now
    parser.add_argument("--no-gpu", action="store_true",
                        help="no GPU here: leave the GPU checks of a GPU image out (the table and report "
                             "say so) instead of failing them; the device-free checks still run")
    # --slurm and its options: envbuilder/verify/slurm.py owns them
    add_slurm_arguments(parser)


def check_report_path(option: str, value: str | None) -> None:
    """Before the suite runs: --report/--junit FILE must be a file that can be written (missing
    folders above it are made at the end); a folder, a path under a file or an unwritable place is
    one message naming the option, and nothing is written."""
    if not value:
        return
    path = Path(value)
    fix = f"give {option} a file path in a folder you can write to (e.g. {option} reports/{path.name or 'report'})"
    if path.is_symlink():
        raise EnvbuilderError(option, f"{value} is a symbolic link; envbuilder never writes through a link "
                              "(it could lead to a file elsewhere)", f"remove the link {value}, or give another path")
    if value.endswith(("/", os.sep)) or path.is_dir():
        raise EnvbuilderError(option, f"{value} is a folder; {option} writes one file", fix)
    if path.exists() and not path.is_file():
        raise EnvbuilderError(option, f"{value} is not a plain file", fix)
    parent = path.parent
    while not parent.exists():
        if parent.is_symlink():
            raise EnvbuilderError(option, f"{parent} is a dangling symbolic link", fix)
        parent = parent.parent
    if not parent.is_dir():
        raise EnvbuilderError(option, f"{parent} is a file, so {value} cannot be made under it", fix)
    if not os.access(parent, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise EnvbuilderError(option, f"cannot write {value}: permission denied", fix)


def _write_report(option: str, path: str, text: str) -> None:
    try:
        write_atomic(path, text, option=option)
    except OSError as exc:
        raise EnvbuilderError(option, f"cannot write {path}: {exc.strerror or exc}",
                              f"give {option} a file path in a folder you can write to") from None


def options(args) -> VerifyOptions:
    check_report_path("--report", args.report)
    check_report_path("--junit", args.junit)
    if getattr(args, "attest", None):
        from ..attest.commands import check_out_path

        check_report_path("--attest", args.attest)
        check_out_path(args.attest)
    if args.report and args.junit and Path(args.report).resolve() == Path(args.junit).resolve():
        raise EnvbuilderError("--junit", "names the same file as --report", "give the two different files")
    if args.ranks < 1:
        raise EnvbuilderError("--ranks", f"must be at least 1, got {args.ranks}")
    if args.timeout <= 0:
        raise EnvbuilderError("--timeout", f"must be positive, got {args.timeout}")
    return VerifyOptions(ranks=args.ranks, timeout=args.timeout, launcher=args.launcher,
                         python=args.python, gpus=args.gpus, require_gpu=args.require_gpu,
                         no_gpu=args.no_gpu,
                         echo_stderr=True)


def run_local(args, opts: VerifyOptions) -> tuple[Target, Outcome, str]:
    """The suite on this machine: in a docker/apptainer/charliecloud image or the host Python."""
    target = resolve_target(args.folder, args.image, args.runtime, manifest=args.manifest)
    if getattr(args, "attest", None):
        # the subject of --attest is taken BEFORE the run (attest/commands.py snapshot_subject):
        # the statement names the bytes that ran, and an image changed meanwhile gets none
        from ..attest.commands import snapshot_subject

        args.attest_before = snapshot_subject(target.image)
    if isinstance(for_target(args.runtime, target.image), SifCharliecloud):
        # a .sif without Apptainer: charliecloud runs its SquashFS partition (runtimes/sif.py)
        target.runtime = "charliecloud"
        return target, run_suite(target, opts), f"{target.name} (charliecloud, SIF {target.image})"
    where = f"{target.name} ({args.runtime}" + (f" {target.image}" if target.image and
                                                   runtime(args.runtime).container else "") + ")"
    return target, run_suite(target, opts), where


def _snapshot_before_slurm(args) -> None:
    """verify --slurm --attest: a file image's subject taken before the job runs (as run_local
    does), so the statement names the bytes the job ran, and a file changed meanwhile gets none."""
    from ..attest.commands import snapshot_subject
    from ..attest.subject import is_file_image

    try:
        t = resolve_target(args.folder, args.image, args.runtime, manifest=args.manifest)
    except EnvbuilderError:
        return              # the run itself names the problem
    if t.image and is_file_image(t.image):
        args.attest_before = snapshot_subject(str(Path(t.image).resolve()))


SuiteRunner = Callable[[argparse.Namespace, VerifyOptions], "tuple[Target, Outcome, str]"]


def run(args, suite_runner: SuiteRunner | None = None) -> int:
    """`envbuilder verify`. SUITE_RUNNER (default: run_local) runs the suite and returns
    (target, outcome, where); another one (a Slurm job, say) plugs in here and gets the same
    table, JSON, JUnit and exit codes."""
    opts = options(args)
    if suite_runner is None and getattr(args, "slurm", False):
        if getattr(args, "attest", None):
            _snapshot_before_slurm(args)
        # through the folder's job.sbatch: envbuilder/verify/slurm.py
        req = SlurmRequest(folder=args.folder, manifest=args.manifest, image=args.image, runtime=args.runtime,
                           nodes=args.nodes, partition=args.partition, account=args.account,
                           time_limit=args.time_limit, sbatch_args=tuple(args.sbatch_arg))
        target, outcome, where = run_slurm(req, opts)
    else:
        target, outcome, where = (suite_runner or run_local)(args, opts)
    return report_outcome(args, opts, target, outcome, where)


def report_outcome(args, opts: VerifyOptions, target: Target, outcome: Outcome, where: str) -> int:
    report = outcome.report
    if report is None:
        report = rep.failure_report(outcome.problem, argv=outcome.argv, wall_s=outcome.wall_s,
                                    runtime=target.runtime)
    report["verify"] = {
        "runtime": target.runtime, "image": target.image,
        "folder": str(target.folder) if target.folder else None,
        "manifest": str(target.manifest_path) if target.manifest_path else None,
        "argv": outcome.argv, "exit_code": outcome.returncode, "wall_s": round(outcome.wall_s, 2),
        "timed_out": outcome.timed_out,
    }
    record = image_record(target, target.runtime)
    if record:
        report["verify"]["image_record"] = record
    failed = rep.summary(report)[rep.FAIL] > 0 or report.get("ok") is False
    if args.report:
        _write_report("--report", args.report, rep.dumps(report))
    if args.junit:
        props = {"runtime": target.runtime, "image": target.image or "", "ranks": opts.ranks,
                 "command": " ".join(shlex.quote(a) for a in outcome.argv)}
        _write_report("--junit", args.junit, rep.junit_xml(report, suite_name=f"envbuilder.verify.{target.name}",
                                                            properties=props))
    attested = None
    if getattr(args, "attest", None):
        # a statement only for a passing, complete run (attest/statement.py why_not_passing)
        from ..attest.commands import attest_after_verify

        attested = attest_after_verify(report, target.image, target.manifest_path, args.attest,
                                       nodes=getattr(args, "nodes", None) or 1, manifest=target.manifest,
                                       before=getattr(args, "attest_before", None))
    if args.json:
        sys.stdout.write(json.dumps(report, indent=2, default=str) + "\n")
    else:
        sys.stdout.write(rep.table(report) + "\n\n" + rep.headline(report, where) + "\n")
        if record:
            sys.stdout.write(record["line"] + "\n")
    if attested:
        sys.stderr.write(attested + "\n")
    sys.stdout.flush()
    return EXIT_CHECK_FAILED if failed else EXIT_OK


def image_record(target: Target, runtime_name: str) -> dict | None:
    """The build's record (<folder>/image.json: engine, image digest and ID) and, for the docker
    runtime, whether the image verified is that build (same image ID)."""
    if not target.folder:
        return None
    path = target.folder / "image.json"
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    rt = runtime(runtime_name)
    ran = rt.image_id(target.image) if rt.identifies_images and target.image else None
    record = {k: data.get(k) for k in ("engine", "tag", "digest", "id", "docker_id")}
    line = f"image: built by {record['engine']}, id {record['id']}"
    if record.get("digest"):
        line = f"image: built by {record['engine']}, digest {record['digest']}, id {record['id']}"
    if rt.identifies_images and target.image and record.get("id"):
        record["ran_id"] = ran
        built = {record["id"], record.get("docker_id")}       # Docker's ID of a buildah image: docker_id
        record["same_image"] = ran in built
        line += ("; the image verified is that build" if ran in built else
                 f"; the image verified is {ran or 'unknown'}, not that build")
    record["line"] = line
    return record


def main(argv=None) -> int:
    """Stand-alone entry (``python -m envbuilder.verify.cli``), same behaviour as the subcommand."""
    from ..helpdocs import epilog

    parser = argparse.ArgumentParser(prog="envbuilder verify", epilog=epilog("verify"))
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except EnvbuilderError as exc:
        print(f"error: {exc.message()}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
