"""The layout's rules, read from the source (an AST scan of envbuilder/, no import of it):

- no import cycle between envbuilder's parts (a part: a top-level module such as stack.py, or a
  package such as lock/ taken whole), whether the import is at the top or inside a function;
- no `from x import _private` across parts (a leading underscore means "this part only");
- the lock package imports no component, no engine and no renderer (the lock only resolves needs
  into pins; the pipeline hands it what it needs and a Docker client);
- the smoke suite inside the image (stdlib only, cannot import envbuilder) names the same manifest
  path as envbuilder/paths.py.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "envbuilder"


def _module_name(path: Path) -> tuple[str, bool]:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    is_pkg = parts[-1] == "__init__"
    return ".".join(parts[:-1] if is_pkg else parts), is_pkg


def _part(module: str) -> str:
    """envbuilder.lock.pip -> envbuilder.lock; envbuilder.stack -> envbuilder.stack."""
    bits = module.split(".")
    return ".".join(bits[:2])


def _is_module(dotted: str) -> bool:
    rel = Path(*dotted.split(".")[1:]) if "." in dotted else Path()
    return (PKG / rel).with_suffix(".py").is_file() or (PKG / rel / "__init__.py").is_file()


def _imports():
    """(importing module, imported module, names) for every envbuilder import."""
    out = []
    for path in sorted(PKG.rglob("*.py")):
        module, is_pkg = _module_name(path)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = module.split(".") if is_pkg else module.split(".")[:-1]
                    base = base[:len(base) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                if target.split(".")[0] != "envbuilder":
                    continue
                names = [a.name for a in node.names]
                # `from . import conda` imports the module envbuilder.<pkg>.conda
                for name in names:
                    sub = f"{target}.{name}"
                    out.append((module, sub if _is_module(sub) else target, name))
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.split(".")[0] == "envbuilder":
                        out.append((module, a.name, ""))
    return out


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = defaultdict(set)
    for src, dst, _ in _imports():
        a, b = _part(src), _part(dst)
        if a != b and b != "envbuilder":          # `from envbuilder import __version__` is the root
            graph[a].add(b)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found, state, stack = [], {}, []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                found.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return found


def test_the_scan_sees_the_imports_it_must():
    graph = _graph()
    assert "envbuilder.lock" in graph["envbuilder.plan"]       # components read their pins
    assert "envbuilder.slurm" in graph["envbuilder.verify"]          # verify --slurm submits jobs
    assert "envbuilder.compat" in graph["envbuilder.stack"]
    # and it finds a cycle when there is one
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]


def test_no_import_cycle_between_parts():
    cycles = _cycles(_graph())
    assert not cycles, "import cycles between envbuilder's parts:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_no_private_name_imported_across_parts():
    bad = [f"{src} imports {name} from {dst}" for src, dst, name in _imports()
           if name.startswith("_") and not name.startswith("__") and _part(src) != _part(dst)]
    assert not bad, "\n".join(bad)


def test_the_lock_imports_no_component_engine_or_renderer():
    graph = _graph()
    assert not graph["envbuilder.lock"] & {"envbuilder.plan", "envbuilder.engines", "envbuilder.render",
                                           "envbuilder.generate", "envbuilder.lockcmd"}


def test_the_image_side_manifest_path_matches_paths_py():
    from envbuilder import paths
    from envbuilder.smoke import launcher

    assert launcher.DEFAULT_MANIFEST == paths.MANIFEST_IN_IMAGE


CLI_LAYER = {"envbuilder.cli", "envbuilder.lockcmd", "envbuilder.shippedcmd", "envbuilder.verify.cli"}


def test_only_the_cli_layer_knows_argparse():
    """Engines, the lock, verify's runner take small option objects (engines/options.py), not
    argparse's Namespace: outside the CLI layer (and the smoke suite's own command line inside
    the image) no module imports argparse and no function takes a parameter named `args`."""
    bad = []
    for path in sorted(PKG.rglob("*.py")):
        module, _ = _module_name(path)
        if module in CLI_LAYER or module.startswith("envbuilder.smoke"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import) and any(a.name == "argparse" for a in node.names):
                bad.append(f"{module} imports argparse")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                params = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
                if any(p.arg == "args" for p in params):
                    bad.append(f"{module}.{node.name} takes `args`")
    assert not bad, "\n".join(bad)


def test_only_the_pipeline_knows_the_build_order():
    """envbuilder/pipeline.py alone runs the build's steps in order (lock, engine, SIF): no other
    module calls the engine or the lock-before-build step, and the CLI's build command only parses
    and prints."""
    steps = {"build_image", "ensure_locked"}
    bad = []
    for path in sorted(PKG.rglob("*.py")):
        module, _ = _module_name(path)
        if module == "envbuilder.pipeline":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
                if name in steps:
                    bad.append(f"{module} calls {name}()")
    assert not bad, "\n".join(bad)
    cli = ast.parse((PKG / "cli.py").read_text(encoding="utf-8"))
    build_cmd = next(n for n in ast.walk(cli) if isinstance(n, ast.FunctionDef) and n.name == "cmd_build")
    imported = {a.name for n in ast.walk(build_cmd) if isinstance(n, ast.ImportFrom) for a in n.names}
    assert imported <= {"build_options", "BuildRequest", "build"}, imported


def _name_comparisons(names: set[str], word: str, allowed: tuple[str, ...]) -> list[str]:
    """Where a module outside ALLOWED compares something called *WORD* (a variable, an attribute)
    with one of NAMES."""
    bad = []
    for path in sorted(PKG.rglob("*.py")):
        module, _ = _module_name(path)
        if module.startswith(allowed):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            consts = {c.value for side in sides for c in ast.walk(side)
                      if isinstance(c, ast.Constant) and isinstance(c.value, str)}
            about = any(word in (getattr(n, "id", "") or getattr(n, "attr", ""))
                        for side in sides for n in ast.walk(side))
            if about and consts & names:
                bad.append(f"{module}:{node.lineno} compares its {word} with {sorted(consts & names)}")
    return bad


def test_runtime_names_are_dispatched_only_in_the_registry():
    """A runtime is one class in envbuilder/runtimes/, created by name there: no other module
    compares a runtime variable with a runtime's name (`rt.name == "host"`, `runtime in
    ("docker", ...)`); it asks the runtime's class instead."""
    from envbuilder.runtimes import REGISTRY

    bad = _name_comparisons(set(REGISTRY), "runtime", ("envbuilder.runtimes", "envbuilder.smoke", "envbuilder.engines"))
    assert not bad, "\n".join(bad)


def test_engine_names_are_dispatched_only_in_the_registry():
    """An engine is one entry of envbuilder/engines/ ENGINES, with its capabilities (resolves_lock,
    needs_daemon, storage_root, oci_archive, writes_sif): no module outside engines/ compares an
    engine with an engine's name (`opts.engine == "apptainer"`, `engine in ("buildah", ...)`); it
    asks the entry's capability instead."""
    from envbuilder.engines import ENGINES

    bad = _name_comparisons(set(ENGINES), "engine", ("envbuilder.engines", "envbuilder.smoke"))
    assert not bad, "\n".join(bad)


def test_every_engine_is_offered_where_its_capabilities_say():
    """`build --engine` offers every engine; `lock --engine` (and the automatic choice) those that
    resolve a lock; each entry's module has the build() the pipeline calls."""
    import importlib

    from envbuilder.engines import ENGINES
    from envbuilder.engines.images import AUTO_ORDER

    assert set(AUTO_ORDER) == {n for n, e in ENGINES.items() if e.resolves_lock}
    for name, engine in ENGINES.items():
        assert callable(importlib.import_module(f"envbuilder.engines.{engine.module}").build), name
        assert not (engine.writes_sif and engine.oci_archive), name


def test_every_runtime_answers_for_where_it_is_offered():
    from envbuilder.runtimes import JOB_RUNTIMES, REGISTRY, VERIFY_RUNTIMES, Runtime, runtime
    from envbuilder.spec.schema import RUNTIMES

    assert RUNTIMES == JOB_RUNTIMES and "docker" in VERIFY_RUNTIMES and "docker" not in JOB_RUNTIMES
    for name in REGISTRY:
        rt = runtime(name)
        assert rt.name == name
        if name in JOB_RUNTIMES:
            assert type(rt).job_launch is not Runtime.job_launch and rt.job_launch(False)
        if name in VERIFY_RUNTIMES:
            assert type(rt).command is not Runtime.command


def test_the_smoke_suite_imports_only_itself_and_verify_shares_its_report_format():
    """envbuilder/smoke/ ships into the image as envbuilder_smoke: it imports nothing else of
    envbuilder. verify reads and prints its report with the suite's own functions."""
    bad = []
    for path in sorted((PKG / "smoke").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.level > 1 or (node.module or "").startswith("envbuilder")):
                bad.append(f"{path.name}:{node.lineno}")
            elif isinstance(node, ast.Import) and any(a.name.startswith("envbuilder") for a in node.names):
                bad.append(f"{path.name}:{node.lineno}")
    assert not bad, bad
    from envbuilder.smoke import common, report as suite_report
    from envbuilder.verify import report, runner

    assert runner.BEGIN_MARKER is common.BEGIN_MARKER and runner.REPORT_SCHEMA is common.REPORT_SCHEMA
    checks = [{"name": "a", "status": "fail", "figure": "", "detail": "\n".join("l%d" % i for i in range(9))}]
    assert report.table({"checks": checks}) == suite_report.table(checks, detail_lines=8)


def test_every_shell_script_of_the_repository_passes_shellcheck():
    """CI's set-up, the cluster tool and the developer scripts (job.sbatch has its own tests):
    every file under .ci/ and tools/ that starts with a shell's #! line, at shellcheck's warning level."""
    import shutil
    import subprocess

    root = PKG.parent
    exe = shutil.which("shellcheck")
    assert exe, "shellcheck must be installed (.ci/install-system.sh)"
    def shebang(p: Path) -> bytes:
        return p.read_bytes()[:40].split(b"\n")[0].rstrip() if p.is_file() else b""

    scripts = sorted(p for folder in (".ci", "tools") for p in (root / folder).iterdir()
                     if (line := shebang(p)).startswith(b"#!") and line.endswith((b"sh", b"bash")))
    assert len(scripts) >= 10, scripts          # the scan itself still finds them
    r = subprocess.run([exe, "-S", "warning", *map(str, scripts)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-4000:]


# --- files are written through safewrite.py (issue 47, item 2) ------------------------------------

# The calls that create, replace or fill a file by path; a module holding one is either safewrite.py
# or writes only where no one else can (a private temporary folder), said here with the count.
# The smoke suite and conda_install.py run inside the image (stdlib only; the image is theirs).
_LOW_WRITES_OS = {"replace", "rename", "link", "symlink", "open", "mkfifo", "truncate"}
_LOW_WRITES_SHUTIL = {"copy", "copy2", "copyfile", "move", "copytree"}
_LOW_WRITES_ATTR = {"write_text", "write_bytes", "touch", "symlink_to", "hardlink_to", "rename"}
IN_IMAGE = ("envbuilder/smoke/", "envbuilder/lock/conda_install.py")
PRIVATE_WRITERS = {
    "envbuilder/safewrite.py": (14, "the helper: openat/renameat under one folder descriptor, O_NOFOLLOW"),
    "envbuilder/output.py": (4, "a new output folder staged in a private mkdtemp, renamed whole; the "
                                "backup links and their rollback through safewrite's folder descriptors"),
    "envbuilder/engines/context.py": (6, "the build context: a private mkdtemp"),
    "envbuilder/lock/pip.py": (1, "pip's constraints file in a TemporaryDirectory"),
    "envbuilder/runtimes/sif.py": (1, "the manifest handed to ch-run, in a private mkdtemp"),
    "envbuilder/runtimes/charliecloud.py": (2, "renames of whole directory images in the cache (a rename "
                                               "replaces no file through a link)"),
    "envbuilder/attest/commands.py": (1, "cosign attest's predicate in a TemporaryDirectory; the SIF "
                                         "copied into a private mkdtemp beside it (opened 'xb')"),
    "envbuilder/attest/bounded.py": (2, "reads (os.open with the caller's read flags) and the private "
                                        "copies of what was read, in a 0700 folder it made"),
    "envbuilder/attest/sifsign.py": (1, "the SIF opened read-only once (os.open, O_RDONLY)"),
    "envbuilder/sif/build.py": (2, "the SIF's objects and the SIF itself in the private work folder "
                                   "(safewrite.place moves the SIF out)"),
    "envbuilder/sif/layers.py": (1, "a decompressed layer in the private work folder"),
    "envbuilder/sif/layout.py": (1, "the SIF being made, in the private work folder (r+b)"),
}


def _low_writes(tree) -> list[int]:
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Name) and f.id == "open":
            modes = list(node.args[1:2]) + [k.value for k in node.keywords if k.arg == "mode"]
            if any(not isinstance(m, ast.Constant) or set(str(m.value)) & set("wax+") for m in modes):
                lines.append(node.lineno)
        elif isinstance(f, ast.Attribute):
            base = f.value.id if isinstance(f.value, ast.Name) else None
            if (base == "os" and f.attr in _LOW_WRITES_OS) or (base == "shutil" and f.attr in _LOW_WRITES_SHUTIL) \
                    or (base == "tempfile" and f.attr in ("mkstemp", "NamedTemporaryFile")) \
                    or f.attr in _LOW_WRITES_ATTR:
                lines.append(node.lineno)
    return lines


def test_files_are_written_through_safewrite_or_in_a_private_folder():
    found = {}
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG.parent).as_posix()
        if rel.startswith(IN_IMAGE):
            continue
        lines = _low_writes(ast.parse(path.read_text(encoding="utf-8")))
        if lines:
            found[rel] = len(lines)
    expected = {rel: count for rel, (count, _why) in PRIVATE_WRITERS.items()}
    assert found == expected, (
        "a module writes a file without envbuilder/safewrite.py (write_file, place, open_new; or "
        "output.write_atomic / write_folder): use it, or, for a private temporary folder only, list the "
        f"module in PRIVATE_WRITERS with its count and why. Found {found}")
    # and the scan sees what it must
    assert _low_writes(ast.parse("open(p, 'w')\nopen(p)\nx.write_text('')\nos.replace(a, b)\n'a'.replace('b', 'c')")) \
        == [1, 3, 4]
