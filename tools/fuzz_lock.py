#!/usr/bin/env python3
"""Property-based fuzzing (Hypothesis) of envbuilder.lock as input: a real lock of the cpu-torch
preset (written here, offline, through the lock's own model and dump: every entry the shape the
resolvers write), then mutated -- a value replaced by another type or hostile text, a key dropped
or added, a list or object nested deep -- and, half of the time, its seals recomputed with the
lock's own seal function (so that the shape check, not the seal, is what must refuse). Each
example runs `envbuilder build --no-build` on a copy of a folder holding the lock, through the
CLI's own code path (envbuilder.cli.main). The property: exit 0, or exit 2 with one message
starting with `error:`; never an exception; no file in the folder changed unless it exited 0.

    .venv/bin/python tools/fuzz_lock.py                 # 2,000 examples; prints a table
    .venv/bin/python tools/fuzz_lock.py --examples 500 --seed 1

tests/test_fuzz.py runs the same property for a bounded number of examples.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
import traceback
from pathlib import Path

from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from envbuilder.cli import main  # noqa: E402

sys.path.insert(0, str(ROOT / "tools"))
from fuzz import _mutate, _paths  # noqa: E402  (every path into a JSON-like value; nests stay text, so it is shallow)

SPEC = ROOT / "recipes" / "cpu-torch-horovod.yaml"
HEX = "0123456789abcdef"


def _sha(n: int) -> str:
    return (HEX * 8)[n % 16:][:64].ljust(64, "0")


def sample_lock(spec_path: Path = SPEC):
    """A complete, consistent Lock for SPEC_PATH as the resolvers would write it (no network, no
    engine): the spec's needs as inputs, a local base by image ID, each OS package, the source
    tarballs with their catalog hashes, one wheel per pip requirement."""
    from envbuilder import __version__
    from envbuilder.lock.model import Lock
    from envbuilder.needs import needs, source_tarballs
    from envbuilder.stack import resolve
    from envbuilder.spec.model import load_spec

    stack = resolve(load_spec(spec_path))
    want = needs(stack)
    lock = Lock(name=stack.spec.name, inputs=want, generated_by=f"envbuilder {__version__}")
    lock.base = {stage: {"ref": ref, "digest": "sha256:" + _sha(n), "kind": "image-id", "pinned": ref}
                 for n, (stage, ref) in enumerate(sorted(want["base"].items()))}
    lock.apt = {stage: sorted(({"name": p.split("=")[0], "version": "1.0-1", "arch": "amd64", "sha256": _sha(i)}
                               for i, p in enumerate(pkgs)), key=lambda e: e["name"])
                for stage, pkgs in want["apt"].items()}
    lock.sources = [dict({k: s[k] for k in ("name", "version", "url", "file", "sha256")},
                         checked="at build (sha256sum -c)") for s in source_tarballs(stack)]
    from packaging.requirements import Requirement

    lock.pip = {}
    for group, reqs in want["pip"]["groups"].items():
        entries = []
        for n, r in enumerate(reqs):
            req = Requirement(r)
            spec = next(iter(req.specifier), None)
            version = spec.version if spec is not None else "1.0"
            name = req.name
            wheel = f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
            entries.append({"name": name, "version": version, "file": wheel, "sha256": _sha(n + 3),
                            "from": "index", "url": f"https://files.pythonhosted.org/packages/xx/{wheel}",
                            "requested": True})
        lock.pip[group] = entries
    lock.resolvers = {"envbuilder": __version__, "docker": "27.0", "apt": "2.6.1", "pip": "24.0",
                      "apt-index": {"deb.debian.org bookworm": "2026-01-01"}}
    lock.resolved_at = "2026-01-01T00:00:00Z"
    return lock


def lock_text(lock) -> str:
    from envbuilder.lock.model import dump

    return dump(lock)


def resealed(data: dict) -> dict:
    """DATA with its seals recomputed by the lock's own seal function (model._sha over
    Lock.sections()), whatever its values: a consistent lock, as far as the seals go."""
    from envbuilder.lock.model import Lock

    try:
        lock = Lock(name=data.get("name"), inputs=data.get("inputs"), base=data.get("base"), apt=data.get("apt"),
                    sources=data.get("sources"), pip=data.get("pip"), conda=data.get("conda"))
        data = dict(data, seals=lock.seals())
    except Exception:       # noqa: BLE001 - a shape the seal function cannot walk: keep the old seals
        pass
    return data


# --- mutations ---------------------------------------------------------------------------------

HOSTILE = ["", "x\ny", "$(touch MARKER)", "%setup", "../../etc/passwd", "a" * 5000, "https://u:p@h/x",
           "sha256:" + "0" * 64, "0" * 64, "-1", "é", "\x00", "null", "1e999", "torch==2.13.0+cpu"]
scalars = st.one_of(st.sampled_from(HOSTILE), st.text(max_size=20), st.integers(-(10 ** 20), 10 ** 20),
                    st.floats(allow_nan=False), st.booleans(), st.none())
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                      max_leaves=8)


def _nested(depth: int, leaf) -> str:
    """LEAF inside DEPTH levels of lists and objects, as JSON text (built as text: Python's own
    json and the test's recursion would stop at a thousand levels)."""
    opens = "".join("[" if n % 2 else '{"k": ' for n in range(depth))
    closes = "".join("]" if n % 2 else "}" for n in reversed(range(depth)))
    return opens + json.dumps(leaf) + closes


@st.composite
def cases(draw, base_text: str | None = None):
    """(lock text, what was done) for one example."""
    data = json.loads(base_text or BASE_TEXT)
    done, nests = [], []
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from([p for p in _paths(data) if p]))
        parent = data
        for p in path[:-1]:
            parent = parent[p]
        op = draw(st.sampled_from(["replace", "replace", "type", "delete", "add", "nest"]))
        last = path[-1]
        if op in ("replace", "delete", "add"):
            data = _mutate(data, path, op, draw(values), draw(st.sampled_from(["x", "name", "", "pinned", "\n"])))
        elif op == "type":
            old = parent[last]
            parent[last] = draw(st.sampled_from([None, 5, 1.5, True, "text", [], {}, [old], {"x": old}]))
        elif op == "nest":
            nests.append(_nested(draw(st.sampled_from([10, 40, 1000, 5000])), parent[last]))
            parent[last] = f"@@NEST{len(nests) - 1}@@"
        done.append(f"{op} {'.'.join(map(str, path))[:80]}")
    if draw(st.booleans()):
        data = resealed(data)
        done.append("resealed")
    text = json.dumps(data, indent=1)
    for n, nested in enumerate(nests):
        text = text.replace(f'"@@NEST{n}@@"', nested)
    return text, done


def _folder_state(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def run_case(text: str) -> tuple[int | str, str, bool]:
    """`envbuilder build --no-build` on a folder holding TEXT as its lock. Returns (exit code or
    'exception', stderr or the traceback, whether the folder changed)."""
    with tempfile.TemporaryDirectory(prefix="envbuilder-fuzzlock-") as tmp:
        out = Path(tmp) / "out"
        out.mkdir()
        (out / "envbuilder.lock").write_text(text)
        before = _folder_state(out)
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                code = main(["build", str(SPEC), "--no-build", "--out", str(out)])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 2
        except BaseException:               # noqa: BLE001 - what the property forbids
            return "exception", traceback.format_exc(), True
        return code, err.getvalue(), _folder_state(out) != before


def violation(code, err: str, changed: bool) -> str | None:
    if code == "exception" or "Traceback" in err:
        return "exception"
    if code == 0:
        return None
    if code != 2:
        return f"exit {code}"
    if not err.startswith("error: ") or err.count("error: ") != 1:
        return "not one message"
    if changed:
        return "refused but changed the folder"
    return None


BASE_TEXT = lock_text(sample_lock())


def main_(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--examples", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    tally: dict[str, int] = {}
    bad: list = []

    @seed(args.seed)
    @settings(max_examples=args.examples, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(cases())
    def one(case):
        text, done = case
        code, err, changed = run_case(text)
        v = violation(code, err, changed)
        key = v or ("accepted" if code == 0 else "refused, one message")
        tally[key] = tally.get(key, 0) + 1
        if v:
            bad.append((done, err[-2000:]))

    one()
    for k, n in sorted(tally.items()):
        print(f"{n:6d}  {k}")
    for done, err in bad[:5]:
        print("---", done, "\n", err)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main_())
