"""Run the smoke suite in an image (docker, apptainer, charliecloud) or on the host, and parse
the JSON report it prints between two marker lines."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from .. import emulation
from ..manifest_shape import read_manifest_file
from ..errors import EXIT_BAD_INPUT, EXIT_CHECK_FAILED, EnvbuilderError
from ..paths import HOST_MODULE, MANIFEST_IN_IMAGE, PREFIX, SUITE_MODULE, VERIFY_MANIFEST  # noqa: F401
# the report's markers and schema are the suite's own (envbuilder/smoke is stdlib-only, so verify
# imports it on the host; the suite never imports verify)
from ..smoke.common import BEGIN_MARKER, END_MARKER, REPORT_SCHEMA  # noqa: F401
from ..runtimes import VERIFY_RUNTIMES, for_target, runtime
from ..runtimes.charliecloud import charliecloud_dir  # noqa: F401  (verify --slurm, tests)
from ..runtimes.docker import default_tag

IMAGE_PREFIX = PREFIX
IMAGE_MANIFEST = MANIFEST_IN_IMAGE
RUNTIMES = VERIFY_RUNTIMES          # runtimes/__init__.py: each one is a class there


@dataclass
class Target:
    """What to verify: the manifest (what was asked for) and where the image is."""

    runtime: str
    manifest_path: Path | None = None    # on the host, when a folder or --manifest was given
    manifest: dict = field(default_factory=dict)
    image: str | None = None             # docker tag, .sif path, or charliecloud directory
    folder: Path | None = None

    @property
    def name(self) -> str:
        return str(self.manifest.get("name") or self.image or "?")


def read_manifest(path: Path, field_name: str = "FOLDER") -> dict:
    """manifest.json, bounded and its shape checked (manifest_shape.py); one message otherwise."""
    if not Path(path).exists():
        raise EnvbuilderError(field_name, f"{path} does not exist",
                              "give the output folder of `envbuilder build` (it holds manifest.json)")
    return read_manifest_file(path, field_name)


def find_folder(cwd: Path) -> Path | None:
    """No FOLDER and no --image: ./manifest.json, or the only images/<name>/ there is."""
    if (cwd / "manifest.json").is_file():
        return cwd
    found = sorted(p.parent for p in (cwd / "images").glob("*/manifest.json"))
    if len(found) == 1:
        return found[0]
    if found:
        names = ", ".join(str(p.relative_to(cwd)) for p in found)
        raise EnvbuilderError("FOLDER", f"several built folders here ({names}); which one?",
                              "envbuilder verify images/<name>")
    return None


def resolve_target(folder: str | None, image: str | None, runtime_name: str,
                   manifest: str | None = None, cwd: Path | None = None) -> Target:
    if runtime_name not in RUNTIMES:
        raise EnvbuilderError("--runtime", f"unknown runtime {runtime_name!r}", "one of " + ", ".join(RUNTIMES))
    cwd = cwd or Path.cwd()
    t = Target(runtime=runtime_name, image=image)
    if manifest:
        t.manifest_path = Path(manifest).resolve()
        t.manifest = read_manifest(t.manifest_path, "--manifest")
    if folder:
        f = Path(folder)
        if not f.exists():
            raise EnvbuilderError("FOLDER", f"{folder} does not exist",
                                  "give the output folder of `envbuilder build` (default images/<name>)")
        if f.is_file():
            if f.name.endswith(".json"):
                raise EnvbuilderError("FOLDER", f"{folder} is a file, not a folder",
                                      f"use --manifest {folder}, or give its folder")
            if not image:       # a .sif or other image file given as FOLDER
                t.image = str(f)
                folder = None
        if folder:
            if not (f / "manifest.json").is_file():
                raise EnvbuilderError("FOLDER", f"{folder} has no manifest.json",
                                      "give the output folder of `envbuilder build SPEC` "
                                      "(or run it first)")
            t.folder = f.resolve()
            if not manifest:
                t.manifest_path = t.folder / "manifest.json"
                t.manifest = read_manifest(t.manifest_path)
    elif not image and not manifest:
        found = find_folder(cwd)
        if found is None:
            raise EnvbuilderError("FOLDER", "nothing to verify: no FOLDER, no --image, and no "
                                  "manifest.json or images/<name>/ here",
                                  "envbuilder verify images/<name>  (or --image REF)")
        t.folder = found.resolve()
        t.manifest_path = t.folder / "manifest.json"
        t.manifest = read_manifest(t.manifest_path)
    if not runtime(runtime_name).container:          # the host: its Python runs the suite
        if not t.manifest_path:
            raise EnvbuilderError("--runtime host", "the host runtime needs a manifest to compare with",
                                  "give FOLDER (holding manifest.json) or --manifest FILE")
        return t
    if not t.image:
        t.image = runtime(runtime_name).default_image(t.manifest, t.folder, cwd)
    return t


# ----------------------------------------------------------------------------- command lines

def suite_args(ranks: int, timeout: float, manifest_in_image: str | None, launcher: str = "auto",
               extra: list[str] | None = None) -> list[str]:
    args = ["--json", "--ranks", str(ranks), "--timeout", _num(timeout), "--launcher", launcher]
    if manifest_in_image:
        args += ["--manifest", manifest_in_image]
    return args + list(extra or [])


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


# ----------------------------------------------------------------------------- running

@dataclass
class Outcome:
    argv: list[str]
    returncode: int | None
    stdout: str
    wall_s: float
    timed_out: bool = False
    report: dict | None = None
    problem: str = ""


def parse_report(stdout: str) -> dict | None:
    """The JSON between the markers; else the last line that parses as a report."""
    start = stdout.rfind(BEGIN_MARKER)
    if start >= 0:
        end = stdout.find(END_MARKER, start)
        body = stdout[start + len(BEGIN_MARKER):end if end >= 0 else None]
        try:
            data = json.loads(body)
            if isinstance(data, dict) and "checks" in data:
                return data
        except ValueError:
            pass
    for line in reversed(stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                data = json.loads(line)
            except ValueError:
                continue
            if isinstance(data, dict) and "checks" in data:
                return data
    return None


# qemu-user's line when the emulated process takes a fatal signal. A multi-threaded process (torch
# 2.15's aarch64 wheel on import, qemu 7.2) can then hang instead of exiting; verify stops it once
# the suite has been silent this long after the line, rather than waiting for the whole timeout.
EMULATION_CRASH = "qemu: uncaught target signal"
EMULATION_CRASH_GRACE_S = 60.0


def execute(argv: list[str], *, timeout: float, env: dict | None = None,
            on_timeout=None, echo_stderr: bool = True) -> Outcome:
    """Run ARGV; stderr streams through (progress), stdout is captured and parsed."""
    t0 = time.time()
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                stdin=subprocess.DEVNULL, env=env, start_new_session=True)
    except FileNotFoundError:
        raise EnvbuilderError("verify", f"{argv[0]} not found", "install it or pick another --runtime") from None
    except OSError as exc:
        raise EnvbuilderError("verify", f"cannot run {argv[0]}: {exc.strerror}") from None
    # stderr (the suite's progress lines) streams through live and its tail is kept for the
    # message when no report comes; stdout (the report) is collected
    err_tail: deque = deque(maxlen=40)
    crash: dict = {}           # the qemu crash line and when the suite last wrote to stderr

    def pump_stderr():
        for raw in iter(proc.stderr.readline, b""):
            line = raw.decode("utf-8", "replace")
            err_tail.append(line.rstrip("\n"))
            crash["last"] = time.time()
            if EMULATION_CRASH in line:
                crash["line"] = line.strip()
            if echo_stderr:
                sys.stderr.write(line)
                sys.stderr.flush()

    out_chunks: list[bytes] = []

    def pump_stdout():
        for chunk in iter(lambda: proc.stdout.read(65536), b""):
            out_chunks.append(chunk)

    threads = [threading.Thread(target=pump_stderr, daemon=True),
               threading.Thread(target=pump_stdout, daemon=True)]
    for th in threads:
        th.start()
    timed_out = False
    hung = False
    try:
        while True:
            left = timeout - (time.time() - t0)
            if left <= 0:
                raise subprocess.TimeoutExpired(argv, timeout)
            try:
                proc.wait(timeout=min(left, 1.0))
                break
            except subprocess.TimeoutExpired:
                if "line" in crash and time.time() - crash["last"] > EMULATION_CRASH_GRACE_S:
                    hung = True
                    raise
    except subprocess.TimeoutExpired:
        timed_out = not hung
        if on_timeout:
            on_timeout()
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except OSError:
            pass
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            proc.wait()
    for th in threads:
        th.join(timeout=10)
    text = b"".join(out_chunks).decode("utf-8", "replace")
    o = Outcome(argv=argv, returncode=proc.returncode, stdout=text, wall_s=time.time() - t0,
                timed_out=timed_out)
    o.report = parse_report(text)
    if o.report is None:
        tail = "\n".join((text.strip().splitlines() + [l for l in err_tail if l.strip()])[-15:])
        if hung:
            o.problem = emulation_crash_problem(crash["line"])
        elif timed_out:
            o.problem = f"the suite did not finish within {timeout:.0f} s and was stopped"
        else:
            o.problem = f"the suite printed no report (exit code {proc.returncode})"
        if tail:
            o.problem += "; its last output:\n" + tail
    return o


def emulation_crash_problem(line: str) -> str:
    """What verify says when the image's Python crashed under qemu-user and the suite hung: the
    crash, the emulator's version where this machine runs aarch64 programs through one, and the two
    ways out (a machine of the image's architecture; a newer QEMU: PyPI's aarch64 torch 2.15.0
    crashes on import under Debian 12's qemu-user 7.2 and runs under Debian unstable's 11.1.3,
    docs/aarch64.md)."""
    version = emulation.qemu_version("aarch64") if emulation.machine() != "aarch64" else None
    under = f" under qemu-aarch64 {version}" if version else ""
    return (f"the image's Python crashed under emulation{under} ({line}) and the suite hung; stopped after "
            f"{EMULATION_CRASH_GRACE_S:.0f} s of silence: run verify on a machine of the image's "
            "architecture, or under a newer QEMU (.ci/install-qemu.sh registers Debian unstable's "
            "qemu-user 11.1.3, which runs PyPI's aarch64 torch 2.15 that 7.2 crashes on)")


@dataclass
class VerifyOptions:
    ranks: int = 2
    timeout: float = 120.0
    launcher: str = "auto"
    python: str | None = None       # host: interpreter (default sys.executable); images: "python"
    gpus: bool = False
    require_gpu: bool = False
    no_gpu: bool = False
    total_timeout: float | None = None
    echo_stderr: bool = True


def total_timeout(opts: VerifyOptions) -> float:
    """The outer guard: the suite enforces each check's timeout itself; this only catches a
    launcher that hangs as a whole (the image's Python, a stuck container start)."""
    if opts.total_timeout:
        return opts.total_timeout
    return max(600.0, opts.timeout * 10)


def build_argv(t: Target, opts: VerifyOptions, **how) -> tuple[list[str], dict | None]:
    """The command line verify runs for TARGET (and the environment, None = inherit); HOW: what
    a runtime's preparation decided (docker: container_name; charliecloud: ch_directory, ch_manifest)."""
    return runtime(t.runtime).command(t, opts, suite_for(opts), **how)


def suite_for(opts: VerifyOptions):
    """The suite's arguments, given where the manifest to compare with is inside the image."""
    extra = ["--no-gpu"] if opts.no_gpu else []
    return lambda manifest_in_image: suite_args(opts.ranks, opts.timeout, manifest_in_image, opts.launcher, extra)


def run_suite(t: Target, opts: VerifyOptions) -> Outcome:
    """Run the suite for TARGET with its runtime (runtimes/); raise EnvbuilderError (exit 2) when
    it cannot start at all."""
    rt = for_target(t.runtime, t.image)
    with rt.session(t, opts, suite_for(opts)) as launch:
        outcome = execute(launch.argv, timeout=total_timeout(opts), env=launch.env,
                          on_timeout=launch.on_timeout, echo_stderr=opts.echo_stderr)
    if outcome.report is not None:
        rt.annotate(outcome.report)
    return outcome


__all__ = ["Target", "VerifyOptions", "Outcome", "resolve_target", "build_argv", "run_suite",
           "parse_report", "default_tag", "EXIT_BAD_INPUT", "EXIT_CHECK_FAILED"]
