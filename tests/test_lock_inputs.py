"""Issue 20, sections 2 and 3: a lock, a manifest and the report paths are user input (one message,
exit 2, nothing written); no credential, by name or by value, reaches a generated file; a file
in --out that envbuilder did not write is not replaced without --force; sweep names that bash,
Slurm or the job script own are refused.

Every lock here is written by the test (tools/fuzz_lock.py sample_lock: the cpu-torch preset's
lock as the resolvers write it, offline), and where a case says so its seals are recomputed with
the lock's own seal function, so that the shape check, not the seal, is what refuses."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import RECIPES, ROOT, run_envbuilder

from envbuilder.cli import main

sys.path.insert(0, str(ROOT / "tools"))

import fuzz_lock  # noqa: E402

SPEC = RECIPES / "cpu-torch-horovod.yaml"


def _data() -> dict:
    return json.loads(fuzz_lock.BASE_TEXT)


def _state(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _build_with_lock(tmp_path: Path, text: str, capsys) -> tuple[int, str, bool]:
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    (out / "envbuilder.lock").write_text(text)
    before = _state(out)
    code = main(["build", str(SPEC), "--no-build", "--out", str(out)])
    err = capsys.readouterr().err
    return code, err, _state(out) != before


def _one_message(code: int, err: str) -> None:
    assert code == 2, err
    assert err.startswith("error: ") and err.count("error: ") == 1 and "Traceback" not in err, err


# --- section 2: the lock -----------------------------------------------------------------------

def test_the_sample_lock_is_the_writers_shape_and_builds(tmp_path, capsys):
    from envbuilder.jsonfile import check_shape
    from envbuilder.lock.schema import LOCK_SCHEMA

    check_shape(_data(), LOCK_SCHEMA, "envbuilder.lock", fix="")
    code, err, _ = _build_with_lock(tmp_path, fuzz_lock.BASE_TEXT, capsys)
    assert code == 0, err


def test_a_lock_with_conda_packages_fits_the_schema(tmp_path):
    from envbuilder.lock.conda import check_lockfile
    from envbuilder.lock.model import dump, loads

    raw = (ROOT / "tests" / "data" / "conda" / "conda-lock.yml").read_text().replace("@CHANNEL@", "/tmp/ch")
    lockfile = check_lockfile(yaml.safe_load(raw), ["envbuilder-demo-data=1.0"], "test")
    lock = fuzz_lock.sample_lock()
    lock.conda = {"lockfile": lockfile, "from": "conda-lock.yml"}
    lock.inputs = dict(lock.inputs, conda={"packages": ["envbuilder-demo-data=1.0"], "channels": ["conda-forge"],
                                           "platform": "linux-64"})
    assert loads(dump(lock)).conda_packages()


def _mutate(path: str, value):
    def edit(d):
        node = d
        keys = [int(k) if k.isdigit() else k for k in path.split("/")]
        for k in keys[:-1]:
            node = node[k]
        node[keys[-1]] = value
    return edit


# (what, edit, reseal, a word the message names). Seals untouched: the cases the issue found;
# resealed: the same through a consistent lock, so the schema alone refuses
LOCK_CASES = [
    ("pip name null", _mutate("pip/framework/0/name", None), False, "pip.framework[0].name"),
    ("pip name a number", _mutate("pip/framework/0/name", 5), False, "pip.framework[0].name"),
    ("conda hash a list", lambda d: d.update(conda={"lockfile": {"version": 1, "metadata": {}, "package": [
        {"name": "x", "version": "1", "url": "https://h/x-1-0.conda", "hash": ["a"]}]}}), False, "hash"),
    ("resolvers nested 1000 deep", "resolvers", False, "nested"),
    ("inputs.base a list", _mutate("inputs/base", ["x"]), True, "inputs.base"),
    ("inputs.apt a string", _mutate("inputs/apt", "python3"), True, "inputs.apt"),
    ("inputs.apt.devel holds a number", _mutate("inputs/apt/devel/0", 7), True, "inputs.apt.devel[0]"),
    ("inputs.pip null", _mutate("inputs/pip", None), True, "inputs.pip"),
    ("inputs.pip.groups a list", _mutate("inputs/pip/groups", []), True, "inputs.pip.groups"),
    ("inputs.sources a list", _mutate("inputs/sources", ["horovod"]), True, "inputs.sources"),
    ("inputs.sources version a number", _mutate("inputs/sources/horovod", 28), True, "inputs.sources.horovod"),
    ("inputs.conda a string", _mutate("inputs/conda", "numpy"), True, "inputs.conda"),
    ("base pinned 5", _mutate("base/devel/pinned", 5), True, "base.devel.pinned"),
    ("base kind unknown", _mutate("base/devel/kind", "tag"), True, "base.devel.kind"),
    ("apt name null", _mutate("apt/devel/0/name", None), True, "apt.devel[0].name"),
    ("apt version a list", _mutate("apt/devel/0/version", ["1"]), True, "apt.devel[0].version"),
    ("apt sha256 a number", _mutate("apt/runtime/0/sha256", 1), True, "apt.runtime[0].sha256"),
    ("sources an object", _mutate("sources", {}), True, "sources"),
    ("source url a number", _mutate("sources/0/url", 1), True, "sources[0].url"),
    ("pip group unknown", lambda d: d["pip"].update(extra=[]), True, "pip"),
    ("pip entry a string", _mutate("pip/python/0", "pip==24.0"), True, "pip.python[0]"),
    ("pip sha256 null", _mutate("pip/python/0/sha256", None), True, "pip.python[0].sha256"),
    ("pip version with a newline", _mutate("pip/python/0/version", "24.0\n%setup"), True, "pip.python[0].version"),
    ("an unknown top-level key", lambda d: d.update(extra=1), True, "extra"),
    ("name a number", _mutate("name", 3), True, "name"),
    ("resolved_at null", _mutate("resolved_at", None), True, "resolved_at"),
    ("seals a list", _mutate("seals", []), False, "seals"),
    ("resolver note a list", _mutate("resolvers/apt", ["x"]), True, "resolvers.apt"),
    ("a number of 5000 digits", _mutate("generated_by", "@@BIG@@"), False, "envbuilder.lock"),
    ("NaN", _mutate("generated_by", "@@NAN@@"), False, "envbuilder.lock"),
]


@pytest.mark.parametrize("what, edit, reseal, named", LOCK_CASES, ids=[c[0] for c in LOCK_CASES])
def test_a_lock_of_the_wrong_shape_is_one_message_and_nothing_is_written(what, edit, reseal, named, tmp_path, capsys):
    data = _data()
    if edit == "resolvers":
        text = json.dumps(data).replace('"resolvers": {', '"resolvers": {"deep": ' + "[" * 1000 + "]" * 1000 + ", ", 1)
    else:
        edit(data)
        if reseal:
            data = fuzz_lock.resealed(data)
        text = json.dumps(data, indent=1).replace('"@@BIG@@"', "9" * 5000).replace('"@@NAN@@"', "NaN")
    code, err, changed = _build_with_lock(tmp_path, text, capsys)
    _one_message(code, err)
    assert named in err, err
    assert not changed
    assert "seal" not in err or not reseal, err        # the shape refused it, not the seal


def test_a_lock_over_the_size_cap_is_refused_unread_naming_the_cap(tmp_path, capsys):
    from envbuilder.lock.model import MAX_LOCK_BYTES

    out = tmp_path / "out"
    out.mkdir()
    with open(out / "envbuilder.lock", "wb") as fh:
        fh.truncate(MAX_LOCK_BYTES + 10)          # sparse: no disk used
    code = main(["build", str(SPEC), "--no-build", "--out", str(out)])
    err = capsys.readouterr().err
    _one_message(code, err)
    assert f"{MAX_LOCK_BYTES // (1024 * 1024)} MiB" in err, err


# --- section 2: diff and manifests -----------------------------------------------------------------

DIFF_CASES = [
    ("nested 5000 deep", '{"expect": ' + "[" * 5000 + "]" * 5000 + "}", "nested"),
    ("expect.framework a number", json.dumps({"expect": {"framework": 5}}), "expect.framework"),
    ("expect.packages a list", json.dumps({"expect": {"packages": [1, 2]}}), "expect.packages"),
    ("a package version a number", json.dumps({"expect": {"packages": {"numpy": 1}}}), "expect.packages.numpy"),
    ("expect.horovod.operations a string", json.dumps({"expect": {"horovod": {"operations": "mpi"}}}),
     "expect.horovod.operations"),
    ("expect.mpi a list", json.dumps({"expect": {"mpi": ["openmpi"]}}), "expect.mpi"),
    ("image a string", json.dumps({"expect": {}, "image": "x"}), "image"),
    ("lock.base a list", json.dumps({"expect": {}, "lock": {"base": ["x"]}}), "lock.base"),
    ("expect a list", json.dumps({"expect": []}), "manifest"),
    ("not UTF-8", b"\xff\xfe{}", "UTF-8"),
    ("a lock with wrong types", "@@LOCK@@", "pip.framework[0].name"),
]


@pytest.mark.parametrize("what, text, named", DIFF_CASES, ids=[c[0] for c in DIFF_CASES])
def test_diff_of_a_hostile_input_is_one_message(what, text, named, tmp_path, capsys):
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"expect": {"packages": {"numpy": "1.26.4"}}}))
    bad = tmp_path / "bad.json"
    if text == "@@LOCK@@":
        data = _data()
        data["pip"]["framework"][0]["name"] = None
        text = json.dumps(data)
    bad.write_bytes(text if isinstance(text, bytes) else text.encode())
    for args in (["diff", str(bad), str(good)], ["diff", str(good), str(bad)], ["diff", "--json", str(bad), str(good)]):
        code = main(args)
        captured = capsys.readouterr()
        assert code == 2
        shown = captured.err + captured.out
        assert named in shown and "Traceback" not in shown, shown


def test_verify_reads_a_manifest_of_the_wrong_shape_as_one_message(tmp_path, capsys):
    (tmp_path / "manifest.json").write_text(json.dumps({"expect": {"framework": [1]}}))
    code = main(["verify", str(tmp_path), "--runtime", "host"])
    err = capsys.readouterr().err
    _one_message(code, err)
    assert "expect.framework" in err


def test_diff_of_a_200_mb_file_is_refused_in_bounded_memory(tmp_path):
    big = tmp_path / "big.json"
    with open(big, "wb") as fh:
        fh.truncate(200 * 1024 * 1024)           # sparse
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"expect": {}}))
    probe = ("import resource, subprocess, sys; p = subprocess.run([sys.executable, '-m', 'envbuilder', 'diff', "
             f"{str(big)!r}, {str(good)!r}], capture_output=True, text=True); "
             "print(p.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); print(p.stderr)")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    first, err = proc.stdout.split("\n", 1)
    code, kb = map(int, first.split())
    assert code == 2 and "MiB" in err and "Traceback" not in err, err
    assert kb < 200 * 1024, f"{kb} KB"


# --- section 2: report paths ---------------------------------------------------------------------

def _report_cases(tmp_path: Path):
    folder = tmp_path / "existing"
    folder.mkdir()
    afile = tmp_path / "afile"
    afile.write_text("mine")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    cases = [("--report", str(folder), "is a folder"), ("--junit", str(folder), "is a folder"),
             ("--report", str(tmp_path / "new") + "/", "is a folder"),
             ("--junit", str(afile / "j.xml"), "is a file"), ("--report", str(afile / "x" / "r.json"), "is a file")]
    if os.geteuid() != 0:
        cases += [("--report", str(ro / "r.json"), "permission denied"), ("--junit", str(ro / "j.xml"), "permission denied")]
    return cases


def test_report_paths_that_cannot_be_written_are_one_message_before_anything_runs(tmp_path, capsys):
    (tmp_path / "manifest.json").write_text(json.dumps({"expect": {}}))
    cases = _report_cases(tmp_path)
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    for option, value, why in cases:
        code = main(["verify", str(tmp_path), "--runtime", "host", option, value])
        err = capsys.readouterr().err
        _one_message(code, err)
        assert option in err and why in err and "fix:" in err, err
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before
    assert (tmp_path / "afile").read_text() == "mine"
    (tmp_path / "ro").chmod(0o755)


# --- section 3: credentials ---------------------------------------------------------------------

SECRET_NAMES = ["MYSQL_PWD", "GITHUB_PAT", "MY_PAT", "DB_PWD", "SSH_KEY", "WANDB_KEY", "AWS_CREDENTIALS_FILE",
                "HF_TOKEN", "DB_PASSWORD", "APP_SECRET", "NPM_AUTH", "DB_PASS", "GPG_PASSPHRASE"]
SECRET_VALUES = [
    ("ghp_" + "A1b2" * 9, "GitHub"),
    ("github_pat_" + "11ABCDEFG0" * 8, "GitHub"),
    ("glpat-" + "x1Y2z3" * 4, "GitLab"),
    ("xoxb-1234567890-abcdefghij", "Slack"),
    ("AKIAIOSFODNN7EXAMPLE", "AWS"),
    ("hf_" + "aBcD" * 9, "Hugging Face"),
    ("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U", "JSON Web Token"),
    ("https://h.example/data?token=tok3nS3cr3t", "query"),
    ("https://h.example/x?a=1&access_token=tok3nS3cr3t", "query"),
    ("https://acct.blob.core.windows.net/c/x?sv=2022&sig=tok3nS3cr3t", "query"),
    ("https://b.s3.amazonaws.com/k?X-Amz-Signature=tok3nS3cr3t&X-Amz-Date=1", "query"),
    ("https://alice:S3cr3t@pw@h.example/x", "login"),
]


def _secret_parts(value: str) -> list[str]:
    """The parts of VALUE no output may hold."""
    m = re.search(r"://([^/?#]*)@", value)
    if m:
        return [m.group(1).split(":", 1)[1]]
    m = re.search(r"=([^&]+)$|=(tok3nS3cr3t)", value)
    if m and "tok3nS3cr3t" in value:
        return ["tok3nS3cr3t"]
    return [value[6:]]


def _nowhere(root: Path, secrets: list[str]) -> None:
    for p in root.rglob("*"):
        if p.is_file():
            data = p.read_bytes()
            for s in secrets:
                assert s.encode() not in data, f"{s} in {p}"


def _spec_with(field: str, value, name: str = "HB_VAR") -> dict:
    data = yaml.safe_load(SPEC.read_text())
    if field == "env":
        data["env"] = {name: value}
    elif field == "cluster.env":
        data.setdefault("cluster", {})["env"] = {name: value}
    elif field == "description":
        data["description"] = value
    elif field == "cluster.stage":
        data.setdefault("cluster", {})["stage"] = value
    return data


def test_secret_names_and_values_are_refused_in_every_field_and_never_written(tmp_path, capsys):
    tried = 0
    (tmp_path / "in").mkdir()
    (tmp_path / "outs").mkdir()
    for field in ("env", "cluster.env"):
        for name in SECRET_NAMES:
            spec = tmp_path / "in" / "s.yaml"
            spec.write_text(yaml.safe_dump(_spec_with(field, "v4lu3-xyz", name)))
            out = tmp_path / "outs" / f"o{tried}"
            code = main(["build", str(spec), "--no-build", "--out", str(out)])
            err = capsys.readouterr().err
            _one_message(code, err)
            assert f"{field}.{name}" in err and "secret" in err and "run time" in err, err
            assert "v4lu3-xyz" not in err and not out.exists()
            tried += 1
    for field in ("env", "cluster.env", "description", "cluster.stage"):
        for value, _what in SECRET_VALUES:
            spec = tmp_path / "in" / "s.yaml"
            spec.write_text(yaml.safe_dump(_spec_with(field, value)))
            out = tmp_path / "outs" / f"o{tried}"
            code = main(["build", str(spec), "--no-build", "--out", str(out)])
            err = capsys.readouterr().err
            _one_message(code, err)
            assert field in err and "run time" in err, (field, value, err)
            for s in _secret_parts(value):
                assert s not in err, (value, err)
            assert not out.exists()
            tried += 1
    _nowhere(tmp_path / "outs", [s for v, _ in SECRET_VALUES for s in _secret_parts(v)] + ["v4lu3-xyz"])
    assert tried == 2 * len(SECRET_NAMES) + 4 * len(SECRET_VALUES)


def test_a_site_profile_with_a_secret_is_refused(tmp_path, capsys):
    site = tmp_path / "site.yaml"
    site.write_text(yaml.safe_dump({"name": "s", "env": {"GITHUB_PAT": "zzz-s3cr3t"}}))
    code = main(["build", str(SPEC), "--no-build", "--out", str(tmp_path / "o"), "--site", str(site)])
    err = capsys.readouterr().err
    _one_message(code, err)
    assert "GITHUB_PAT" in err and "zzz-s3cr3t" not in err
    site.write_text(yaml.safe_dump({"name": "s", "env": {"EP": "https://u:pw-0042@h/x"}}))
    code = main(["build", str(SPEC), "--no-build", "--out", str(tmp_path / "o"), "--site", str(site)])
    err = capsys.readouterr().err
    _one_message(code, err)
    assert "pw-0042" not in err and not (tmp_path / "o").exists()


@pytest.mark.parametrize("value", [v for v, _ in SECRET_VALUES])
def test_a_sweep_value_holding_a_credential_is_refused_and_stored_nowhere(value, tmp_path, capsys):
    out = tmp_path / "o"
    code = main(["build", str(SPEC), "--no-build", "--out", str(out), "--sweep", f"ep={value.replace(',', '')}"])
    err = capsys.readouterr().err
    _one_message(code, err)
    assert "--sweep" in err and "run time" in err, err
    for s in _secret_parts(value):
        assert s not in err
    assert not out.exists()


def test_a_password_holding_an_at_sign_is_hidden_whole():
    from envbuilder.redact import redact

    assert redact("see https://alice:S3@cr3t@h.example/x") == "see https://***@h.example/x"
    assert redact("https://***@S3cr3t@h/x") == "https://***@h/x"
    assert redact("https://h/x?a=1&token=abc&sig=d") == "https://h/x?a=1&token=***&sig=***"
    r = run_envbuilder("build", str(SPEC), "--no-build", "--out", "/nonexistent/x",
                       "--sweep", "ep=https://alice:S3@cr3t@h.example/x")
    assert r.code == 2 and "S3" not in r.err and "cr3t" not in r.err and "***@h.example" in r.err, r.err


def test_legitimate_values_are_not_taken_for_credentials():
    from envbuilder.redact import credential_in, secret_name

    for name in ("NCCL_IB_HCA", "PWD", "OLDPWD", "AUTHOR", "PATH_PREFIX", "KEYBOARD", "OMP_NUM_THREADS"):
        assert not secret_name(name), name
    for value in ("https://download.pytorch.org/whl/cpu", "sha256:" + "a" * 64, "git@github.com:x/y",
                  "https://h/x?keyword=1", "0.1,0.01", "mlx5_0:1", "/scratch/$USER/data"):
        assert credential_in(value) is None, value


# --- section 3: the user's files in --out -----------------------------------------------------------

USER_FILES = ["Dockerfile", "job.sbatch", "Apptainer.def", "manifest.json", "wheelhouse/README.md"]
# (envbuilder.lock in --out is read as the lock first: a file of the user's there is refused as a lock)


@pytest.mark.parametrize("name", USER_FILES)
def test_a_file_envbuilder_did_not_write_is_not_replaced_without_force(name, tmp_path, capsys):
    home = tmp_path / "home"                       # stands in for $HOME
    (home / Path(name).parent).mkdir(parents=True, exist_ok=True)
    (home / ".bashrc").write_text("export X=1\n")
    (home / name).write_text("my own file\n")
    before = _state(home)
    code = main(["build", str(SPEC), "--no-build", "--out", str(home)])
    err = capsys.readouterr().err
    _one_message(code, err)
    assert str(home / name) in err and "--force" in err and "not written by envbuilder" in err, err
    assert _state(home) == before
    code = main(["build", str(SPEC), "--no-build", "--out", str(home), "--force"])
    capsys.readouterr()
    assert code == 0 and (home / name).read_text() != "my own file\n"
    assert (home / ".bashrc").read_text() == "export X=1\n"


def test_envbuilders_own_files_are_replaced_and_an_edited_one_still_carries_its_header(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["build", str(SPEC), "--no-build", "--out", str(out)]) == 0
    docker = out / "Dockerfile"
    docker.write_text(docker.read_text() + "# my note\n")      # edited, header kept: still envbuilder's
    assert main(["build", str(SPEC), "--no-build", "--out", str(out)]) == 0
    assert "# my note" not in docker.read_text()
    capsys.readouterr()


def test_lock_to_a_user_file_is_refused_without_force(tmp_path, capsys):
    mine = tmp_path / "notes.txt"
    mine.write_text("mine")
    code = main(["lock", str(SPEC), "--lock", str(mine)])
    err = capsys.readouterr().err
    _one_message(code, err)
    assert str(mine) in err and "--force" in err and mine.read_text() == "mine"


# --- section 3: sweep names ----------------------------------------------------------------------

SWEEP_NAMES = ["SHELLOPTS", "BASHOPTS", "UID", "EUID", "PPID", "BASH_ENV", "ENV", "IFS", "PATH", "LD_PRELOAD",
               "LD_LIBRARY_PATH", "HOME", "TORCHELASTIC_RUN_ID", "RANK", "LOCAL_RANK", "WORLD_SIZE",
               "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID", "OMPI_MCA_x", "PMIX_RANK",
               "GROUPS", "HOSTNAME", "PWD", "SECONDS", "OPTIND", "REPLY", "PIPESTATUS", "FUNCNAME"]


@pytest.mark.parametrize("name", SWEEP_NAMES)
def test_a_sweep_name_the_shell_or_the_job_owns_is_refused_saying_why(name, tmp_path, capsys):
    out = tmp_path / "o"
    code = main(["build", str(SPEC), "--no-build", "--out", str(out), "--sweep", f"{name.lower()}=1,2"])
    err = capsys.readouterr().err
    _one_message(code, err)
    assert name.upper() in err and "would replace" in err and "the job would break" in err, err
    assert not out.exists()


def _variables(script: str) -> set[str]:
    names = set(re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", script))
    names |= set(re.findall(r"(?:^|[\s;(])(?:export |local |unset )?([A-Za-z_][A-Za-z0-9_]*)=", script, re.M))
    names |= {n for line in re.findall(r"^\s*(?:export|unset|local) ([A-Za-z_][A-Za-z0-9_ ]*)$", script, re.M)
              for n in line.split()}
    return names


def test_every_variable_a_job_script_sets_or_reads_is_refused_as_a_sweep_name(tmp_path, capsys):
    """The job script's own variables, from render/sbatch.py's output for every runtime, torchrun,
    GPUs, a network interface, staging and a sweep: none can be a sweep name."""
    from envbuilder.slurm.sweeps import parse_entry
    from envbuilder.errors import EnvbuilderError

    seen = set()
    variants = []
    from envbuilder.runtimes import JOB_RUNTIMES

    for runtime in JOB_RUNTIMES:
        variants.append(("cpu-torch-horovod.yaml", {"runtime": runtime, "network_interface": "ib0", "stage": "/data",
                                            "monitor": ["tensorboard", "timeline"], "sweep": ["hp_lr=1,2"],
                                            "modules": ["x"], "venv": "/v"}))
    variants.append(("gpu-torch-ddp.yaml", {}))
    variants.append(("cpu-torch-ddp.yaml", {}))
    variants.append(("cpu-tf-multiworker.yaml", {}))          # TF_CONFIG per task
    for n, (recipe, cluster) in enumerate(variants):
        data = yaml.safe_load((RECIPES / recipe).read_text())
        data.setdefault("cluster", {}).update(cluster)
        if recipe == "cpu-torch-ddp.yaml":
            data["distributed"]["launcher"] = "torchrun"
        spec = tmp_path / f"v{n}.yaml"
        spec.write_text(yaml.safe_dump(data))
        assert main(["build", str(spec), "--no-build", "--out", str(tmp_path / f"v{n}")]) == 0, capsys.readouterr().err
        seen |= _variables((tmp_path / f"v{n}" / "job.sbatch").read_text())
    capsys.readouterr()
    # a sweep name becomes an upper-case variable: the script's lower-case locals cannot meet one
    seen = {n for n in seen if n == n.upper()} - {"HP_LR"}          # HP_LR: the sweep's own
    accepted = []
    for name in sorted(seen):
        try:
            parse_entry(f"{name}=1,2")
            accepted.append(name)
        except EnvbuilderError:
            pass
    assert not accepted, f"job.sbatch's own variables accepted as sweep names: {accepted}"
    assert len(seen) > 30, sorted(seen)


def test_a_lock_with_every_pip_group_fits_the_schema():
    """Every install group the lock writes (lock/model.py PIP_GROUPS) reads back: a lock with the MPI
    wheel's `mpi` group was refused ('is not a pip install group') when built on again."""
    from envbuilder.lock.model import PIP_GROUPS, dump, loads

    lock = fuzz_lock.sample_lock()
    entry = {"name": "a-pkg", "version": "1.0", "file": "a_pkg-1.0-py3-none-any.whl", "sha256": "ab" * 32,
             "from": "index", "url": "https://files.pythonhosted.org/packages/xx/a_pkg-1.0-py3-none-any.whl"}
    for n, group in enumerate(PIP_GROUPS):
        lock.pip.setdefault(group, []).append(dict(entry, name=f"a-pkg{n}", file=f"a_pkg{n}-1.0-py3-none-any.whl",
                                                   url=entry["url"].replace("a_pkg", f"a_pkg{n}")))
    assert set(loads(dump(lock)).pip) == set(PIP_GROUPS)
