#!/usr/bin/env python3
"""Property-based fuzzing of envbuilder's command line on mutated presets (Hypothesis).

Every example takes a preset from recipes/, mutates it (a value replaced by hostile text,
a huge or negative number, null, a list or mapping where a scalar goes, a key dropped or
added, YAML syntax spliced into the text: tags, aliases, merge keys, deep nesting) and runs
`envbuilder check` or `envbuilder build --no-build` through the CLI's own code path
(envbuilder.cli.main, in this process). The property: exit 0, or exit 2 with one message
starting with `error:`, never an exception, never more than 2 s of CPU time (wall time is
reported too: on a shared, loaded machine it measures the machine, not the input).

    .venv/bin/python tools/fuzz.py                 # 10,000 examples; prints a table
    .venv/bin/python tools/fuzz.py --examples 500 --seed 1

tests/test_fuzz.py runs the same property for a bounded number of examples.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import tempfile
import time
import traceback
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from envbuilder.cli import main  # noqa: E402

PRESETS = sorted((ROOT / "recipes").glob("*.yaml"))
LIMIT_S = 2.0
LAST_WALL = [0.0]

HOSTILE = ["$(touch MARKER)", "`id`", "a\nb", "x\n%setup\ntouch M", "'; rm -rf / #", "\"", "\\",
           "${PATH}", "&& id", "%post", "\x00", "\x1b[31m", "\u202e", "é", "-1", "0", "1e999", "nan",
           "~", "null", "yes", "2.7", "3.10", "../../etc/passwd", "/", "*", "https://u:p@h/x",
           "a" * 5000, "1." * 3000 + "x!", "lr=1,2", "A=" + ",".join(map(str, range(50)))]

scalars = st.one_of(
    st.sampled_from(HOSTILE),
    st.text(max_size=40),
    st.integers(min_value=-(10 ** 30), max_value=10 ** 30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
)
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(st.text(max_size=12), inner, max_size=4)),
                      max_leaves=12)

YAML_SPLICES = ["<<: {python: '3.11'}\n", "x: !!python/name:os.system ''\n", "x: !!binary aGk=\n",
                "x: &a [*a]\n", "x: " + "[" * 300 + "]" * 300 + "\n", "x: !!int 'two'\n",
                "x: " + "9" * 5000 + "\n", "x: !!set {a, b}\n", "x: =\n", "? [a]\n: b\n",
                "x: 2024-01-01\n", "\t\n", "x: {a: 1, a: 2}\n", "--- \n--- \n", "%YAML 1.1\n---\n"]


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(node, list):
        for n, v in enumerate(node):
            yield from _paths(v, prefix + (n,))


def _mutate(data, path, op, value, key):
    if not path:
        return value if op == "replace" else data
    parent = data
    for p in path[:-1]:
        parent = parent[p]
    last = path[-1]
    if op == "replace":
        parent[last] = value
    elif op == "delete":
        if isinstance(parent, dict):
            del parent[last]
        else:
            parent.pop(last)
    elif op == "add" and isinstance(parent[last], dict):
        parent[last][key] = value
    elif op == "add" and isinstance(parent[last], list):
        parent[last].append(value)
    return data


@st.composite
def cases(draw):
    preset = draw(st.sampled_from(PRESETS))
    data = yaml.safe_load(preset.read_text())
    for _ in range(draw(st.integers(1, 3))):
        paths = list(_paths(data))
        path = draw(st.sampled_from(paths))
        op = draw(st.sampled_from(["replace", "replace", "delete", "add"]))
        data = _mutate(data, path, op, draw(values), draw(st.sampled_from(["x", "env", "cluster", "sweep", "<<"])))
    try:
        text = yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
    except (yaml.YAMLError, RecursionError, ValueError):
        text = preset.read_text()
    if draw(st.integers(0, 4)) == 0:
        text += draw(st.sampled_from(YAML_SPLICES))
    if draw(st.integers(0, 5)) == 0:
        pos = draw(st.integers(0, len(text)))
        text = text[:pos] + draw(st.text(max_size=8)) + text[pos:]
    command = draw(st.sampled_from(["check", "build"]))
    extra = []
    if command == "build" and draw(st.integers(0, 3)) == 0:
        extra = ["--sweep", draw(st.one_of(st.sampled_from(HOSTILE), st.text(max_size=30)))]
    if command == "build" and draw(st.integers(0, 5)) == 0:
        extra += ["--runtime", draw(st.sampled_from(["host", "pyxis", "charliecloud", "apptainer"]))]
    return text, command, extra


def run_case(text: str, command: str, extra: list[str]) -> tuple[int | str, float, str]:
    """One CLI run; returns (exit code or 'exception', CPU seconds, stderr or the traceback).
    CPU time of this process, not wall time: what an input costs envbuilder (a backtracking
    pattern, an alias bomb), without the stalls of a loaded machine (wall time is in
    ``LAST_WALL``)."""
    with tempfile.TemporaryDirectory(prefix="envbuilder-fuzz-") as tmp:
        spec = Path(tmp) / "spec.yaml"
        try:
            spec.write_text(text, encoding="utf-8", errors="surrogatepass")
        except UnicodeEncodeError:
            spec.write_bytes(text.encode("utf-8", "replace"))
        argv = [command, str(spec)]
        if command == "build":
            argv += ["--no-build", "--out", str(Path(tmp) / "out"), *extra]
        err, out = io.StringIO(), io.StringIO()
        t, w = time.process_time(), time.monotonic()
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
                code = main(argv)
        except SystemExit as exc:           # argparse: a bad --runtime value and the like
            code = exc.code if isinstance(exc.code, int) else 2
        except BaseException:               # noqa: BLE001 - what the property forbids
            return "exception", time.process_time() - t, traceback.format_exc()
        finally:
            LAST_WALL[0] = time.monotonic() - w
        return code, time.process_time() - t, err.getvalue()


def violation(code, took: float, err: str) -> str | None:
    """The property; None when it holds, else a one-line signature of what broke."""
    if code == "exception":
        last = err.strip().splitlines()[-1]
        where = [l for l in err.splitlines() if l.strip().startswith("File ")][-1:] or [""]
        return f"exception: {last[:120]} at {where[0].strip()[:160]}"
    if code not in (0, 2):
        return f"exit {code}"
    if code == 2 and not err.startswith(("error: ", "usage: ")):
        return f"exit 2 without a message: {err[:80]!r}"
    if "Traceback" in err:
        return "traceback printed"
    if took > LIMIT_S:
        return f"took {took:.1f} s"
    return None


def main_(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--examples", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    stats = {"examples": 0, "exit 0": 0, "exit 2": 0, "slowest_s": 0.0, "slowest_wall_s": 0.0}
    failures: dict[str, tuple[str, str]] = {}

    @settings(max_examples=args.examples, deadline=None, database=None, derandomize=False,
              suppress_health_check=list(HealthCheck))
    @seed(args.seed)
    @given(cases())
    def prop(case):
        text, command, extra = case
        code, took, err = run_case(text, command, extra)
        stats["examples"] += 1
        stats["slowest_s"] = max(stats["slowest_s"], took)
        stats["slowest_wall_s"] = max(stats["slowest_wall_s"], LAST_WALL[0])
        if code in (0, 2):
            stats[f"exit {code}"] += 1
        bad = violation(code, took, err)
        if bad and bad not in failures:
            failures[bad] = (text[:300], " ".join([command, *extra]))

    t0 = time.monotonic()
    prop()
    total = time.monotonic() - t0
    print(f"{'examples':<28}{stats['examples']:>10}")
    print(f"{'exit 0 (accepted)':<28}{stats['exit 0']:>10}")
    print(f"{'exit 2 (one message)':<28}{stats['exit 2']:>10}")
    print(f"{'property violations':<28}{len(failures):>10}")
    print(f"{'slowest example (CPU s)':<28}{stats['slowest_s']:>10.3f}")
    print(f"{'slowest example (wall s)':<28}{stats['slowest_wall_s']:>10.3f}")
    print(f"{'total time (s)':<28}{total:>10.1f}")
    for sig, (text, cmd) in sorted(failures.items()):
        print(f"\nVIOLATION {sig}\n  envbuilder {cmd[:200]}\n  spec: {text[:300]!r}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main_())
