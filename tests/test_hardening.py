"""No spec value runs as code in a generated file (issue 15).

Adversarial text goes into every string field of the schema that reaches a file; each build
either refuses it (exit 2, one message naming the field, nothing written) or writes files in
which it is text: the Dockerfile keeps its instructions (dockerfile-parse) and Docker itself
stores ENV/LABEL values as written, Apptainer.def keeps its sections (split the way Apptainer
splits them, and spython's parser) and its %environment, sourced by sh, yields the text, the
#SBATCH directives are the same ones sbatch reads (all before the first command), and
job.sbatch, run with stub srun/scontrol/module commands on PATH, creates no marker file.
`cluster.command` is raw shell by design (README, schema) and is left out.
"""

from __future__ import annotations

import io
import re
import os
import shlex
import stat
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import RECIPES

from envbuilder.cli import main
from envbuilder.spec.schema import SPEC_FIELDS

MARK = "MARKER"
PAYLOADS = [
    f"$(touch {MARK})",
    f"`touch {MARK}`",
    f'x"; touch {MARK}; echo "',
    f"x' && touch {MARK} && echo '",
    f"%setup touch {MARK}",
    f"}}$(touch {MARK})",
    f"a && touch {MARK}",
    f"\\$(touch {MARK})\\",
    f"${{X:-$(touch {MARK})}}",
]
NEWLINE = f"ok\n%setup\n    touch {MARK}\nRUN touch {MARK}\n#SBATCH --x"

# where a payload goes in a field that holds paths or names (still text: it must stay text)
PATH_FIELDS = {"cluster.image_path", "cluster.local_scratch", "cluster.venv", "cluster.stage",
               "cluster.binds"}
HOST_FIELDS = {"cluster.venv", "cluster.modules"}
RAW_BY_DESIGN = {"cluster.command"}


def _string_fields(fields=SPEC_FIELDS, prefix=""):
    """Every dotted field of the schema that holds text (strings, versions, lists and maps of
    them): the test covers the schema as it is, not a list kept by hand."""
    for key, f in fields.items():
        path = f"{prefix}{key}"
        if f.kind == "object":
            yield from _string_fields(f.children, path + ".")
        elif f.kind in ("string", "version") and not f.enum:
            yield path
        elif f.kind == "list" and f.items.kind == "string" and not f.items.enum:
            yield path + "[0]"
        elif f.kind == "map":
            yield path + ".value"
            yield path + ".key"


FIELDS = [f for f in _string_fields() if f.split("[")[0] not in RAW_BY_DESIGN]


def _preset() -> dict:
    return yaml.safe_load((RECIPES / "cpu-torch-horovod.yaml").read_text())


def _set(data: dict, field: str, value: str) -> None:
    parts = field.replace("[0]", "").split(".")
    node = data
    for p in parts[:-1]:
        if p in ("env",) and parts[-1] in ("value", "key") and p == parts[-2]:
            break
        node = node.setdefault(p, {})
    last = parts[-1]
    if last == "value":
        node.setdefault(parts[-2], {})["HB_VAR"] = value
    elif last == "key":
        node.setdefault(parts[-2], {})[value] = "x"
    elif field.endswith("[0]"):
        node[last] = [value]
    elif last == "sweep":
        node[last] = [value]
    else:
        node[last] = value


def _value_for(field: str, payload: str, root: Path) -> str:
    base = field.replace("[0]", "")
    if base in PATH_FIELDS:
        return f"{root}/{payload}".replace(":", "_")
    if base == "cluster.sweep":
        return "hb=" + payload.replace(",", "_")
    return payload


def _build(tmp_path: Path, data: dict, name: str, capsys):
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(yaml.safe_dump(data, sort_keys=False))
    out = tmp_path / name
    code = main(["build", str(spec), "--no-build", "--out", str(out)])
    captured = capsys.readouterr()
    return code, out, captured.err


# --- how each tool reads the files ---------------------------------------------------------------

def _docker_instructions(text: str) -> list[str]:
    from dockerfile_parse import DockerfileParser

    p = DockerfileParser(fileobj=io.BytesIO())
    p.content = text
    return [i["instruction"] for i in p.structure if i["instruction"] != "COMMENT"]


def _apptainer_sections(text: str) -> list[str]:
    """Apptainer: a line whose first word starts with % opens a section."""
    return [line.split()[0] for line in text.splitlines() if line.strip().startswith("%")]


def _spython_sections(path: Path) -> dict:
    from spython.main.parse.parsers import SingularityParser

    recipe = SingularityParser(str(path)).recipe
    return {stage: (r.fromHeader, len(r.install), len(r.environ), len(r.labels)) for stage, r in recipe.items()}


def _apptainer_environment(text: str) -> str:
    body, inside = [], False
    for line in text.splitlines():
        if line.strip().startswith("%"):
            inside = line.split()[0] == "%environment"
            continue
        if inside:
            body.append(line)
    return "\n".join(body) + "\n"


def _sbatch_directives(text: str) -> tuple[list[str], int]:
    """The #SBATCH lines sbatch reads (up to the first line that is not a comment or blank),
    and how many #SBATCH lines the whole file has."""
    read = []
    for line in text.splitlines()[1:]:
        s = line.strip()
        if s and not s.startswith("#"):
            break
        if s.startswith("#SBATCH"):
            read.append(s)
    return read, sum(1 for line in text.splitlines() if line.strip().startswith("#SBATCH"))


def _stubs(root: Path) -> Path:
    bin_ = root / "stub-bin"
    bin_.mkdir(parents=True, exist_ok=True)
    # srun: the node step runs here, as on a one-node job (it sets up the node, reports ready and
    # waits for the end); every other step does nothing
    srun = 'case "$*" in *"bash -c node_step") exec bash -c node_step ;; esac\nexit 0'
    for name, body in {"srun": srun, "scontrol": "echo localhost", "module": "exit 0"}.items():
        p = bin_ / name
        p.write_text(f"#!/bin/bash\n{body}\n")   # bash: the exported functions pass
        p.chmod(p.stat().st_mode | stat.S_IXUSR)
    return bin_


def _markers(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.name == MARK]


def _run_job(out: Path, root: Path, field: str, value: str) -> subprocess.CompletedProcess:
    base = field.replace("[0]", "")
    if base in ("cluster.image_path",):
        Path(value).parent.mkdir(parents=True, exist_ok=True)
        Path(value).write_text("image")
    if base in ("cluster.binds", "cluster.stage"):
        Path(value).mkdir(parents=True, exist_ok=True)
    if base == "cluster.venv":
        py = Path(value) / "bin" / "python"
        py.parent.mkdir(parents=True, exist_ok=True)
        py.write_text("#!/bin/sh\n")
        py.chmod(0o755)
    if base != "cluster.image_path":
        (out / "cpu-torch-horovod.sif").write_text("image")
    env = {"PATH": f"{_stubs(root)}:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(root),
           "SLURM_JOB_ID": "7", "SLURM_SUBMIT_DIR": str(out), "SLURM_ARRAY_TASK_ID": "0",
           "TMPDIR": str(root / "tmp")}
    (root / "tmp").mkdir(exist_ok=True)
    return subprocess.run(["bash", str(out / "job.sbatch")], cwd=out, env=env, capture_output=True,
                          text=True, timeout=60)


# --- the test ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    root = tmp_path_factory.mktemp("baseline")
    out = {}
    for runtime in ("apptainer", "host"):
        data = _preset()
        data["cluster"]["runtime"] = runtime
        spec = root / f"{runtime}.yaml"
        spec.write_text(yaml.safe_dump(data, sort_keys=False))
        assert main(["build", str(spec), "--no-build", "--out", str(root / runtime)]) == 0
        folder = root / runtime
        out[runtime] = {
            "docker": _docker_instructions((folder / "Dockerfile").read_text()),
            "apptainer": _apptainer_sections((folder / "Apptainer.def").read_text()),
            "spython": _spython_sections(folder / "Apptainer.def"),
            "sbatch": [d.split("=")[0] for d in _sbatch_directives((folder / "job.sbatch").read_text())[0]],
        }
    return out


def test_the_schema_fields_under_test_are_all_there():
    # a field added to the schema is picked up here; these must be among them
    for f in ("description", "framework.index_url", "base", "runtime_base", "env.value", "env.key",
              "cluster.partition", "cluster.account", "cluster.image_path", "cluster.local_scratch",
              "cluster.network_interface", "cluster.venv", "cluster.binds[0]", "cluster.modules[0]",
              "cluster.env.value", "cluster.stage", "cluster.sweep[0]", "packages.apt[0]", "name"):
        assert f in FIELDS, f
    assert len(FIELDS) >= 30


@pytest.mark.parametrize("field", FIELDS)
def test_adversarial_text_in_a_field_is_refused_or_stays_text(field, tmp_path, capsys, baseline):
    base = field.replace("[0]", "")
    runtime = "host" if base in HOST_FIELDS else "apptainer"
    for n, payload in enumerate(PAYLOADS + [NEWLINE]):
        data = _preset()
        data["cluster"]["runtime"] = runtime
        value = _value_for(field, payload, tmp_path / f"p{n}")
        _set(data, field, value)
        code, out, err = _build(tmp_path, data, f"b{n}", capsys)
        if code != 0:
            assert code == 2, err
            assert err.startswith("error: ") and "Traceback" not in err, err
            shown_field = field.split("[")[0].replace(".value", "").replace(".key", "")
            assert shown_field.split(".")[-1] in err or "spec" in err, err
            assert not out.exists(), f"{field}: refused but wrote {out}"
            continue
        assert payload != NEWLINE, f"{field}: a newline was accepted"
        docker = (out / "Dockerfile").read_text()
        apptainer = (out / "Apptainer.def").read_text()
        job = (out / "job.sbatch").read_text()
        want = baseline[runtime]
        assert _docker_instructions(docker) == want["docker"], f"{field}={payload!r}: Dockerfile instructions changed"
        assert _apptainer_sections(apptainer) == want["apptainer"], f"{field}={payload!r}: Apptainer sections changed"
        got = _spython_sections(out / "Apptainer.def")
        assert got.keys() == want["spython"].keys()
        assert all(got[s][1:] == want["spython"][s][1:] or base == "env.value" for s in got), (field, got)
        directives, total = _sbatch_directives(job)
        assert len(directives) == total, f"{field}={payload!r}: an #SBATCH line after the first command"
        opts = [d.split("=")[0] for d in directives]
        assert set(opts) - {"#SBATCH --array"} == set(want["sbatch"]), (field, directives)
        for d in directives:
            assert len(shlex.split(d)) == 2, d                 # '#SBATCH' and one --opt=value word
        if base == "env.value":
            envfile = tmp_path / f"env{n}.sh"
            envfile.write_text(_apptainer_environment(apptainer))
            proc = subprocess.run(["sh", "-c", f'. "{envfile}"; printf %s "$HB_VAR"'], cwd=tmp_path,
                                  capture_output=True, text=True)
            assert proc.stdout == value, (field, proc.stdout)
        proc = _run_job(out, tmp_path / f"p{n}", field, value)
        assert proc.returncode == 0, f"{field}={payload!r}: job.sbatch failed\n{proc.stderr[-2000:]}"
        assert not _markers(tmp_path), f"{field}={payload!r}: a value ran as code"
        if base == "cluster.sweep":
            assert (out / "runs").exists()


def test_docker_stores_env_and_label_text_as_written(tmp_path, capsys):
    """The final stage's LABEL and ENV instructions, built by Docker itself (FROM scratch: no
    RUN, a second): every env value and the description come back byte for byte."""
    from infra import docker_cli, require_docker

    require_docker()
    data = _preset()
    data["env"] = {f"HB_{n}": p for n, p in enumerate(PAYLOADS)}
    data["description"] = " | ".join(PAYLOADS)
    code, out, err = _build(tmp_path, data, "docker", capsys)
    assert code == 0, err
    from dockerfile_parse import DockerfileParser

    p = DockerfileParser(fileobj=io.BytesIO())
    p.content = (out / "Dockerfile").read_text()
    keep = [i["content"] for i in p.structure if i["instruction"] in ("LABEL", "ENV")]
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text("FROM scratch\n" + "".join(keep))
    tag = "envbuilder-test-harden/labels:latest"
    subprocess.run([docker_cli(), "build", "-q", "-t", tag, str(ctx)], check=True, capture_output=True,
                   env={**os.environ, "DOCKER_BUILDKIT": "1"})
    try:
        import json

        info = json.loads(subprocess.run([docker_cli(), "image", "inspect", tag], check=True,
                                         capture_output=True, text=True).stdout)[0]["Config"]
    finally:
        subprocess.run([docker_cli(), "image", "rm", "-f", tag], capture_output=True)
    env = dict(e.split("=", 1) for e in info["Env"])
    for n, payload in enumerate(PAYLOADS):
        assert env[f"HB_{n}"] == payload
    assert info["Labels"]["org.opencontainers.image.description"] == data["description"]
    assert env["PATH"].startswith("/opt/venv/bin:")          # the components' own $PATH still expands


def test_secrets_are_refused_and_credentials_never_repeated(tmp_path, capsys):
    cases = [
        ("env", {"HF_TOKEN": "hf_abc123"}, "env.HF_TOKEN"),
        ("cluster.env", {"WANDB_API_KEY": "k123"}, "cluster.env.WANDB_API_KEY"),
        ("framework.index_url", "https://alice:s3cr3tpw@pypi.example.org/simple", "framework.index_url"),
    ]
    for n, (field, value, named) in enumerate(cases):
        data = _preset()
        node = data
        *parents, last = field.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
        code, out, err = _build(tmp_path, data, f"s{n}", capsys)
        assert code == 2 and named in err, err
        assert "s3cr3tpw" not in err and "hf_abc123" not in err and "k123" not in err, err
        assert not out.exists()
    data = _preset()
    data["cluster"]["sweep"] = ["lr=https://bob:pw9876@x.example/a"]
    code, _, err = _build(tmp_path, data, "s9", capsys)
    assert code == 2 and "pw9876" not in err and "***@" in err, err


def test_sweep_names_cannot_replace_the_scripts_variables(tmp_path, capsys):
    for name in ("path", "IFS", "output_dir", "SLURM_JOB_ID", "HOME", "ENVBUILDER_IMAGE"):
        data = _preset()
        data["cluster"]["sweep"] = [f"{name}=a,b"]
        code, out, err = _build(tmp_path, data, f"w{name}", capsys)
        assert code == 2 and "sweep" in err and name.upper() in err, err
    data = _preset()
    data["cluster"]["sweep"] = [f"v{n}=" + ",".join(str(i) for i in range(100)) for n in range(6)]   # 10^12
    code, _, err = _build(tmp_path, data, "huge", capsys)
    assert code == 2 and "1000000000000 combinations" in err, err


def test_gpus_per_node_zero_with_nccl_is_refused(tmp_path, capsys):
    data = yaml.safe_load((RECIPES / "torch-horovod-gpu.yaml").read_text())
    assert "nccl" in data["horovod"]["operations"]
    data.setdefault("cluster", {})["gpus_per_node"] = 0
    code, out, err = _build(tmp_path, data, "g", capsys)
    assert code == 2 and "cluster.gpus_per_node" in err and "nccl" in err, err


# --- the output folder ---------------------------------------------------------------------------

def test_a_link_in_the_output_folder_is_refused_and_nothing_outside_is_touched(tmp_path, capsys):
    repo = tmp_path / "repo"
    (repo / "src").mkdir(parents=True)
    (repo / "src" / "train.py").write_text("keep me")
    out = repo / "images" / "x"
    data = _preset()
    code, _, err = _build(tmp_path, data, "first", capsys)
    assert code == 0
    (tmp_path / "first").rename(out.parent.mkdir(parents=True) or out)
    (out / "pins").symlink_to("../..")
    spec = tmp_path / "first.yaml"
    assert main(["build", str(spec), "--no-build", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "symbolic link" in err and "pins" in err, err
    assert (repo / "src" / "train.py").read_text() == "keep me"
    assert sorted(p.name for p in repo.iterdir()) == ["images", "src"]


SYSTEM_FOLDERS = ("/", "/etc", "/usr/local/share", "/var/lib", "/tmp")


@pytest.mark.parametrize("folder", SYSTEM_FOLDERS)
def test_a_system_folder_is_refused_as_output_before_anything_is_written(folder, tmp_path, capsys):
    """As root, `build SPEC --out /` once wrote its Dockerfile and job script into /."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(_preset(), sort_keys=False))
    # what envbuilder would write there (the whole listing of a shared folder such as /tmp changes
    # under other processes)
    names = ("Dockerfile", "Apptainer.def", "job.sbatch", "manifest.json", "envbuilder.lock", "my.lock",
             "wheelhouse", "envbuilder_smoke", "pins")
    before = {n: os.path.lexists(os.path.join(folder, n)) for n in names}
    for argv in (["build", str(spec), "--no-build", "--out", folder],
                 ["build", str(spec), "--out", folder],
                 ["lock", str(spec), "--out", folder]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("error: --out: ") and f"{folder} is a system folder" in err, err
        assert "fix: give a folder of yours with --out" in err and "Traceback" not in err, err
    assert main(["lock", str(spec), "--lock", f"{folder.rstrip('/')}/my.lock"]) == 2
    assert "error: --lock: " in capsys.readouterr().err
    assert {n: os.path.lexists(os.path.join(folder, n)) for n in names} == before


def test_a_link_to_a_system_folder_is_refused_as_output(tmp_path, capsys):
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(_preset(), sort_keys=False))
    (tmp_path / "out").symlink_to("/etc")
    assert main(["build", str(spec), "--no-build", "--out", str(tmp_path / "out")]) == 2
    assert "is a system folder (it leads to /etc: a folder directly under /)" in capsys.readouterr().err
    assert not os.path.exists("/etc/Dockerfile")


def test_a_failed_update_puts_every_old_file_back_and_names_the_file(tmp_path, monkeypatch):
    from envbuilder.errors import EnvbuilderError
    from envbuilder.output import write_folder

    folder = tmp_path / "out"
    write_folder(folder, {"Dockerfile": b"old", "job.sbatch": b"old"}, complete=True)
    (folder / "manifest.json").mkdir()                       # a folder where a file goes
    with pytest.raises(EnvbuilderError) as exc:
        write_folder(folder, {"Dockerfile": b"new", "job.sbatch": b"new", "manifest.json": b"{}"}, complete=True,
                     force=True)     # the files have no envbuilder header: this tests the swap
    assert "manifest.json" in exc.value.message()
    assert (folder / "Dockerfile").read_bytes() == b"old" and (folder / "job.sbatch").read_bytes() == b"old"
    assert sorted(p.name for p in folder.iterdir()) == ["Dockerfile", "job.sbatch", "manifest.json"]
    # a failure during the swap itself (a full disk, a file system gone read-only): the files
    # swapped in so far go back. Fault injection: the third rename fails.
    (folder / "manifest.json").rmdir()
    real, calls = os.rename, []

    def failing(src, dst, **kw):
        calls.append(dst)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        return real(src, dst, **kw)

    monkeypatch.setattr(os, "rename", failing)
    with pytest.raises(EnvbuilderError) as exc:
        write_folder(folder, {"Dockerfile": b"new", "job.sbatch": b"new", "manifest.json": b"{}"}, complete=True,
                     force=True)     # the files have no envbuilder header: this tests the swap
    monkeypatch.undo()
    assert "No space left" in exc.value.message() and "manifest.json" in exc.value.message()
    assert (folder / "Dockerfile").read_bytes() == b"old" and (folder / "job.sbatch").read_bytes() == b"old"
    assert sorted(p.name for p in folder.iterdir()) == ["Dockerfile", "job.sbatch"]


def test_user_files_in_owned_folders_are_kept_and_named(tmp_path):
    from envbuilder.output import write_folder

    folder = tmp_path / "out"
    write_folder(folder, {"pins/pip-python.txt": b"a", "pins/pip-packages.txt": b"b"}, complete=True)
    (folder / "pins" / "my-notes.md").write_text("mine")
    notes = []
    write_folder(folder, {"pins/pip-python.txt": b"a"}, complete=True, note=notes.append)
    assert not (folder / "pins" / "pip-packages.txt").exists()            # stale, generated: gone
    assert (folder / "pins" / "my-notes.md").read_text() == "mine"
    assert len(notes) == 1 and "my-notes.md" in notes[0]


# --- inputs that used to crash or hang -----------------------------------------------------------

BOMB = "\n".join(["a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"] + [
    f"{chr(98 + n)}: &{chr(98 + n)} [" + ", ".join([f"*{chr(97 + n)}"] * 9) + "]" for n in range(8)])


@pytest.mark.parametrize("text, field", [
    (BOMB, "aliases"),
    ("a: " + "[" * 500 + "]" * 500, "nested"),
    ("a: &x [*x]", "nested"),
    ("name: x\n<<: {python: '3.11'}", "merge keys"),
    ("name: !!python/name:os.system x", "tag"),
    ("name: !!int 'two'", "tag"),
    ("name: !!binary aGVsbG8=", "tag"),
    ("cluster: {nodes: " + "9" * 5000 + "}", "number"),
    ("packages: {pip: [null]}", "empty entry"),
    ("framework: {name: pytorch, version: '" + "1." * 24000 + "x!'}", "not a version"),
    ("name: 'x\n'", "name"),
])
def test_hostile_yaml_is_one_message_and_exit_2_fast(text, field, tmp_path, capsys):
    import time

    spec = tmp_path / "s.yaml"
    spec.write_text(text)
    t = time.monotonic()
    code = main(["check", str(spec)])
    took = time.monotonic() - t
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: ") and field in err, err
    assert took < 2, f"{took:.1f} s"


def test_a_lock_nested_100000_deep_is_one_message(tmp_path, capsys):
    from envbuilder.errors import EnvbuilderError
    from envbuilder.lock.model import loads

    with pytest.raises(EnvbuilderError) as exc:
        loads("[" * 100000 + "]" * 100000)
    assert "nested more than" in exc.value.message()
    with pytest.raises(EnvbuilderError):
        loads('{"schema": "envbuilder.lock/1", "conda": 5}')


# --- apt caches, whatever the base's apt settings ------------------------------------------------

def test_every_apt_step_cleans_apt_caches_in_both_recipes(tmp_path, capsys):
    code, out, err = _build(tmp_path, _preset(), "apt", capsys)
    assert code == 0, err
    docker = (out / "Dockerfile").read_text()
    from dockerfile_parse import DockerfileParser

    p = DockerfileParser(fileobj=io.BytesIO())
    p.content = docker
    runs = [i["value"] for i in p.structure if i["instruction"] == "RUN" and "apt-get install" in i["value"]]
    assert len(runs) == 2                                      # devel and runtime
    for run in runs:
        assert run.index("apt-get clean") > run.index("apt-get install")
        assert "/var/cache/apt/*.bin" in run and "/var/cache/apt/archives/*.deb" in run
    post = re.split(r"^%post\b", (out / "Apptainer.def").read_text(), flags=re.M)[1:]   # sections, not comments
    assert len(post) == 2
    for section in post:
        assert section.index("apt-get clean") > section.index("apt-get install")
        assert "/var/cache/apt/*.bin" in section


def test_the_runtime_apt_step_leaves_no_cache_on_a_plain_debootstrap_base(tmp_path, capsys):
    """A base made by plain debootstrap (no docker-clean: apt keeps .deb files and *.bin
    caches): the runtime stage's apt step, as rendered, built on it; nothing stays in
    /var/cache/apt or /var/lib/apt/lists. (The step alone, not the whole image: the rest of
    the image adds no apt step; bounded time, ~1 min.)"""
    from dockerfile_parse import DockerfileParser
    from infra import docker_cli, plain_base_image

    base = plain_base_image()
    cli = docker_cli()
    has_clean = subprocess.run([cli, "run", "--rm", base, "ls", "/etc/apt/apt.conf.d"],
                               capture_output=True, text=True, check=True).stdout
    assert "docker-clean" not in has_clean                     # else this test proves nothing
    data = _preset()
    data["base"] = base
    data["base_os"] = "debian-bookworm"
    code, out, err = _build(tmp_path, data, "plain", capsys)
    assert code == 0, err
    p = DockerfileParser(fileobj=io.BytesIO())
    p.content = (out / "Dockerfile").read_text()
    items = [i for i in p.structure if i["instruction"] != "COMMENT"]
    froms = [n for n, i in enumerate(items) if i["instruction"] == "FROM"]
    runtime = items[froms[-1]:]
    assert runtime[0]["value"].startswith(base)
    step = next(i for i in runtime if i["instruction"] == "RUN" and "apt-get install" in i["value"])
    shell = next(i for i in runtime if i["instruction"] == "SHELL")
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text(f"FROM {base}\n{shell['content']}{step['content']}")
    tag = "envbuilder-test-harden/plain-apt:latest"
    try:
        build = subprocess.run([cli, "build", "-q", "-t", tag, str(ctx)], capture_output=True, text=True,
                               env={**os.environ, "DOCKER_BUILDKIT": "1"}, timeout=900)
        assert build.returncode == 0, build.stderr[-3000:]
        left = subprocess.run([cli, "run", "--rm", tag, "sh", "-c",
                               "find /var/cache/apt /var/lib/apt/lists -type f "
                               "\\( -name '*.bin' -o -name '*.deb' -o -name '*_Packages*' \\)"],
                              capture_output=True, text=True, check=True).stdout
        assert left == "", left
        installed = subprocess.run([cli, "run", "--rm", tag, "python3", "-c", "print('ok')"],
                                   capture_output=True, text=True).stdout
        assert installed.strip() == "ok"                       # the step did install its packages
    finally:
        subprocess.run([cli, "image", "rm", "-f", tag], capture_output=True)


def test_a_private_index_login_reaches_pip_as_a_build_secret_and_no_layer(tmp_path, capsys):
    """--netrc FILE: the recipe's download steps mount it as a BuildKit secret and point pip's
    requests at it (NETRC); the built image holds no trace of the password."""
    import tarfile

    from infra import base_image, docker_cli

    from envbuilder.engines.docker import docker_build_command
    from envbuilder.render.common import network_setup, shell_join

    code, out, err = _build(tmp_path, _preset(), "netrc", capsys)
    assert code == 0, err
    docker = (out / "Dockerfile").read_text()
    network_runs = [r for r in docker.split("\nRUN ")[1:] if "PIP_FIND_LINKS" in r]
    assert network_runs and all("--mount=type=secret,id=netrc" in r for r in network_runs)
    base = base_image()
    secret = tmp_path / "login.netrc"
    secret.write_text("machine pypi.example.org login alice password pw-3141592653\n")
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text(
        f"FROM {base}\nSHELL [\"/bin/bash\", \"-o\", \"pipefail\", \"-c\"]\n"
        "RUN --mount=type=secret,id=netrc " + shell_join(
            network_setup() + ['test "$NETRC" = /run/secrets/netrc', 'grep -q "^machine pypi.example.org" "$NETRC"',
                               'echo "$NETRC" > /netrc-was-set']) + "\n")
    tag = "envbuilder-test-harden/netrc:latest"
    cmd = docker_build_command([docker_cli(), "build"], ctx, tag, None, str(secret))
    assert f"id=netrc,src={secret}" in " ".join(cmd)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "DOCKER_BUILDKIT": "1"},
                              timeout=600)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        saved = tmp_path / "image.tar"
        subprocess.run([docker_cli(), "save", "-o", str(saved), tag], check=True, capture_output=True)
        with tarfile.open(saved) as tar:
            for member in tar.getmembers():
                if member.isfile() and member.size < 200 * 1024 * 1024:
                    inner = tar.extractfile(member).read()
                    assert b"pw-3141592653" not in inner, member.name
    finally:
        subprocess.run([docker_cli(), "image", "rm", "-f", tag], capture_output=True)


def test_lock_resolver_notes_are_one_line_each_at_any_depth():
    import json
    import sys

    from conftest import ROOT
    from envbuilder.errors import EnvbuilderError
    from envbuilder.lock.model import loads

    sys.path.insert(0, str(ROOT / "tools"))
    import fuzz_lock

    lock = json.loads(fuzz_lock.BASE_TEXT)
    lock["resolvers"]["apt-index"] = {"deb.debian.org bookworm": "2026-01-01"}
    loads(json.dumps(fuzz_lock.resealed(lock)))            # notes grouped in an object are fine
    lock["resolvers"]["apt-index"]["deb.debian.org bookworm"] = "x\n%setup\ntouch MARKER"
    with pytest.raises(EnvbuilderError) as exc:
        loads(json.dumps(fuzz_lock.resealed(lock)))
    assert "resolvers.apt-index.deb.debian.org bookworm: is 'x\\n%setup" in exc.value.message()
    assert "one line" in exc.value.message()
    lock["resolvers"]["apt-index"]["deb.debian.org bookworm"] = "ok"
    lock["resolved_at"] = "2026-01-01\n%setup"
    with pytest.raises(EnvbuilderError) as exc:
        loads(json.dumps(fuzz_lock.resealed(lock)))
    assert "resolved_at" in exc.value.message()


def test_the_sifs_env_and_runscript_carry_the_images_metadata_literally(tmp_path):
    """The SIF's env/10-docker2singularity.sh and runscript are shell made from the image's
    own ENV and ENTRYPOINT/CMD (quoting.metadata_*): run by /bin/sh, every value comes back
    as written ($(...), backticks, quotes, a newline) and nothing runs."""
    from envbuilder.sif.metadata import docker_env_script, runscript
    from envbuilder.sif.rootfs import ImageConfig

    canary = tmp_path / "ran"
    nasty = f'a "b" `touch {canary}` $(touch {canary}) $HOME \\ \'q\'\nline2'
    config = ImageConfig(env=["PATH=/usr/bin:/bin", f"HB_NASTY={nasty}"],
                         entrypoint=["/bin/sh", "-c", 'printf "%s|" "$0" "$@"; printf "%s" "$HB_NASTY"'],
                         cmd=["x y", nasty])
    env_sh = tmp_path / "env.sh"
    env_sh.write_text(docker_env_script(config.env))
    run_sh = tmp_path / "runscript"
    run_sh.write_text(runscript(config))
    out = subprocess.run(["/bin/sh", "-c", f'. {shlex.quote(str(env_sh))}; . {shlex.quote(str(run_sh))}'],
                         capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"}, check=True)
    assert out.stdout == f"x y|{nasty}|{nasty}"
    assert not canary.exists()
