"""`envbuilder init` against hostile and careless inputs (issue 47, items 4-6): secrets in URLs never
leave the input, every parser is bounded before it parses, the docs' promises on links and http://
channels hold. Each case asserts what the user sees: the exit code, one `error:` message naming the
file (and line) with a fix, nothing written; or the spec written, parsed. Fast: no engine, no network."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import yaml

from conftest import run_envbuilder_in_process

SECRETS = ("PW-s3cr3t-1", "pypi-AgEIcHlwaS5vcmcSECRETSECRETSECRET", "tk-0a1b2c3d-SECRET", "qtok-SECRET")


def _write(folder: Path, files: dict) -> None:
    for rel, content in files.items():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, tuple):          # ("link", target)
            os.symlink(content[1], path)
        else:
            path.write_text(content)


def _init(tmp_path: Path, source: Path, *extra: str):
    out = tmp_path / "out" / "spec.yaml"
    out.parent.mkdir(exist_ok=True)
    started = time.process_time()
    r = run_envbuilder_in_process("init", str(source), "-o", str(out), *extra)
    return r, out, time.process_time() - started


def _refused(tmp_path, source: Path, *needles: str, where: str | None = None, line: int | None = None,
             limit_s: float = 2.0) -> str:
    r, out, took = _init(tmp_path, source)
    assert r.code == 2, (r.out, r.err)
    assert r.err.startswith("error: ") and "Traceback" not in r.err, r.err
    assert len([ln for ln in r.err.splitlines() if ln.startswith("error:")]) == 1, r.err
    assert "fix:" in r.err, r.err
    for needle in needles:
        assert needle in r.err, r.err
    if where is not None:
        assert f"{where}:{line}:" in r.err if line else f"{where}: " in r.err, r.err
    assert not out.exists(), "a refused import writes nothing"
    assert took < limit_s, f"{took:.1f} s of CPU"
    return r.err


# --- item 4: secrets never leave the input ------------------------------------------------------

def test_index_logins_are_noted_not_kept_and_never_written(tmp_path):
    src = tmp_path / "requirements.txt"
    src.write_text(f"-i https://alice:{SECRETS[0]}@pypi.example.org/simple\n"
                   f"--extra-index-url https://__token__:{SECRETS[1]}@pypi.example.org/extra/simple\n"
                   "torch==2.13.0\n")
    r, out, _ = _init(tmp_path, src)
    assert r.code == 0, r.err
    text = out.read_text()
    for s in SECRETS[:2]:
        assert s not in text and s not in r.out and s not in r.err
    assert f"{src}:1: index https://***@pypi.example.org/simple not kept" in text
    assert "netrc" in text and "docs/config.md" in text          # where the login goes instead
    assert yaml.safe_load(text)["framework"]["name"] == "pytorch"


def test_an_environment_yml_pip_list_and_a_token_channel_keep_no_secret(tmp_path):
    src = tmp_path / "environment.yml"
    src.write_text("name: demo\nchannels:\n"
                   f"  - https://conda.anaconda.org/t/{SECRETS[2]}/private\n"
                   "  - conda-forge\n"
                   "dependencies:\n  - python=3.11\n  - numpy=1.26\n  - pip:\n"
                   f"    - --extra-index-url https://u:{SECRETS[0]}@h.example/simple?token={SECRETS[3]}\n"
                   "    - torch==2.13.0\n")
    r, out, _ = _init(tmp_path, src)
    assert r.code == 0, r.err
    text = out.read_text()
    assert not any(s in text or s in r.out or s in r.err for s in SECRETS), text
    spec = yaml.safe_load(text)
    assert spec["packages"]["conda_channels"] == ["https://conda.anaconda.org/private", "conda-forge"]
    assert f"{src}:3: channel https://conda.anaconda.org/t/***/private holds a conda channel token" in text
    assert "RATTLER_AUTH_FILE" in text
    assert run_envbuilder_in_process("check", str(out)).code == 0


def test_a_requirement_url_with_a_login_is_refused_without_repeating_it(tmp_path):
    src = tmp_path / "requirements.txt"
    src.write_text(f"torch==2.13.0\nmylib @ https://bob:{SECRETS[0]}@files.example.org/mylib-1.0-py3-none-any.whl\n")
    err = _refused(tmp_path, src, "login", where=str(src), line=2)
    assert SECRETS[0] not in err and "--netrc" in err


def test_the_vcs_fix_is_not_mangled_by_the_redaction(tmp_path):
    """Issue 48 item 2: `https://...@<commit>` of the message itself holds no login."""
    from envbuilder.redact import credential_in, redact

    src = tmp_path / "requirements.txt"
    src.write_text("torch==2.13.0\ngit+https://example.org/me/mylib.git@main\n")
    err = _refused(tmp_path, src, "NAME @ git+https://...@<commit>", where=str(src), line=2)
    assert "***" not in err
    assert redact("NAME @ git+https://...@<40-hex commit>") == "NAME @ git+https://...@<40-hex commit>"
    assert credential_in("git+https://...@<commit>") is None
    # real ones still hidden, whole
    assert redact("https://a:b@c@host.example/x") == "https://***@host.example/x"
    assert redact("https://u:p@[::1]:8080/simple") == "https://***@[::1]:8080/simple"
    assert redact("https://conda.anaconda.org/t/abc-123/ch/linux-64/x.conda") == \
        "https://conda.anaconda.org/t/***/ch/linux-64/x.conda"
    assert credential_in("https://conda.anaconda.org/t/abc-123/ch") == "a conda channel token in a URL (/t/TOKEN/)"
    assert credential_in("/home/t/x") is None and credential_in("https://download.pytorch.org/whl/cpu") is None


# --- item 6: http:// channels and links in a conda environment, as the docs say -----------------

@pytest.mark.parametrize("channel, needle", [
    ("http://conda.example.org/forge", "http://"),
    ("ftp://conda.example.org/forge", "is not a conda channel"),
    ("https://u:pw@conda.example.org/forge", "login"),
])
def test_a_channel_the_docs_refuse_is_refused_everywhere(tmp_path, channel, needle, monkeypatch):
    from envbuilder.errors import EnvbuilderError
    from envbuilder.lock.conda import channels

    src = tmp_path / "environment.yml"
    src.write_text(f"channels:\n  - conda-forge\n  - {channel}\ndependencies:\n  - numpy=1.26\n  - pytorch=2.13.0\n")
    if "u:pw" not in channel:       # a login is hidden and the channel kept without it
        err = _refused(tmp_path, src, needle, where=str(src), line=3)
        assert "https://" in err
    spec = tmp_path / "spec.yaml"
    spec.write_text('name: c\nframework: {name: pytorch, version: "2.13.0+cpu"}\npython: "3.11"\n'
                    f'packages:\n  conda: [numpy=1.26]\n  conda_channels: ["{channel}"]\n')
    r = run_envbuilder_in_process("check", str(spec))
    assert r.code == 2 and "packages.conda_channels[0]" in r.err and "pw@" not in r.err, r.err
    monkeypatch.setenv("ENVBUILDER_CONDA_CHANNEL", channel)
    with pytest.raises(EnvbuilderError) as e:
        channels([])
    assert "ENVBUILDER_CONDA_CHANNEL" in e.value.message() and needle in e.value.message()
    assert "pw@" not in e.value.message()
    monkeypatch.setenv("ENVBUILDER_CONDA_CHANNEL", "https://conda.anaconda.org/t/tok-1/forge")
    with pytest.raises(EnvbuilderError) as e:
        channels([])
    assert "tok-1" not in e.value.message() and "RATTLER_AUTH_FILE" in e.value.fix


def _conda_env(root: Path) -> Path:
    env = root / "envs" / "train"
    (env / "conda-meta").mkdir(parents=True)
    for name, version in (("python", "3.11.9"), ("pytorch", "2.13.0")):
        (env / "conda-meta" / f"{name}-{version}-0.json").write_text(json.dumps(
            {"name": name, "version": version, "requested_spec": name}))
    return env


def test_links_in_a_conda_environments_metadata_are_refused(tmp_path):
    other = _conda_env(tmp_path / "other")
    env = tmp_path / "a" / "env"
    env.mkdir(parents=True)
    (env / "conda-meta").symlink_to(other / "conda-meta")
    _refused(tmp_path, env, "is a link", where=f"{env}/conda-meta")

    env = _conda_env(tmp_path / "b")
    (tmp_path / "history").write_text("# update specs: ['pytorch']\n")
    (env / "conda-meta" / "history").symlink_to(tmp_path / "history")
    _refused(tmp_path, env, "is a link", where=f"{env}/conda-meta/history")

    env = _conda_env(tmp_path / "c")
    outside = tmp_path / "outside" / "site-packages" / "tqdm-4.66.4.dist-info"
    outside.mkdir(parents=True)
    (outside / "INSTALLER").write_text("pip\n")
    (outside / "REQUESTED").write_text("")
    (env / "lib" / "python3.11").mkdir(parents=True)
    (env / "lib" / "python3.11" / "site-packages").symlink_to(outside.parent)
    _refused(tmp_path, env, "link leaving the environment", where=f"{env}/lib/python3.11/site-packages")

    env = _conda_env(tmp_path / "d")                 # a link to the environment itself is fine
    (tmp_path / "d" / "link").symlink_to(env)
    r, out, _ = _init(tmp_path, tmp_path / "d" / "link")
    assert r.code == 0, r.err
    assert yaml.safe_load(out.read_text())["framework"]["version"] == "2.13.0+cpu"


def test_hard_links_to_one_large_record_are_refused_without_reading_them_all(tmp_path):
    env = _conda_env(tmp_path)
    big = env / "conda-meta" / "aaa-1.0-0.json"
    big.write_text(json.dumps({"name": "aaa", "version": "1.0", "files": ["lib/x" * 20] * 100_000}))
    for n in range(300):
        os.link(big, env / "conda-meta" / f"aab{n:03d}-1.0-0.json")
    _refused(tmp_path, env, "hard link", where=f"{env}/conda-meta/aab000-1.0-0.json", limit_s=3)


# --- item 5: parsers bounded before they parse --------------------------------------------------

PYPROJECT = "[project]\nname = \"x\"\ndependencies = [\"torch>=2.1\"]\n"


@pytest.mark.parametrize("files, source, where, line, needles", [
    ({"pyproject.toml": PYPROJECT + "x = " + "[" * 30_000 + "]" * 30_000 + "\n"}, "pyproject.toml",
     "pyproject.toml", 4, ["more than 64 deep"]),
    ({"pyproject.toml": PYPROJECT + "x = " + "9" * 5000 + "\n"}, "pyproject.toml", "pyproject.toml", 4,
     ["5000 digits"]),
    ({"pyproject.toml": PYPROJECT, "uv.lock": "version = 1\nx = " + "{a = " * 20_000 + "1" + "}" * 20_000},
     "pyproject.toml", "uv.lock", 2, ["more than 64 deep"]),
    ({"pyproject.toml": PYPROJECT, "uv.lock": "version = 1\n[[package]]\nname = \"torch\"\nsize = " + "1" * 5000},
     "pyproject.toml", "uv.lock", 4, ["5000 digits"]),
    ({"pyproject.toml": PYPROJECT, "uv.lock": '[[package]]\nname = "torch"\nversion = "two point one"\n'},
     "pyproject.toml", "uv.lock", 3, ["'two point one', which is not a version"]),
    ({"pyproject.toml": PYPROJECT, "pylock.toml": '[[packages]]\nname = "torch"\nversion = "2.1;rm"\n'},
     "pyproject.toml", "pylock.toml", 3, ["not a version"]),
    ({"env/conda-meta/x-1-0.json": '{"name": "x", "version": "1", "d": ' + "[" * 30_000 + "]" * 30_000 + "}"},
     "env", "env/conda-meta/x-1-0.json", 1, ["more than 64 deep"]),
    ({"env/conda-meta/x-1-0.json": '{"name": "x", "version": "1", "size": ' + "7" * 5000 + "}"},
     "env", "env/conda-meta/x-1-0.json", 1, ["5000 digits"]),
])
def test_deep_nesting_huge_numbers_and_bad_versions_are_one_message(tmp_path, files, source, where, line, needles):
    _write(tmp_path / "in", files)
    _refused(tmp_path, tmp_path / "in" / source, *needles, where=str(tmp_path / "in" / where), line=line)


def test_includes_are_counted_per_run_not_per_pip_list(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "r.txt").write_text("six\n")
    body = "".join("  - pip:\n    - -r r.txt\n" for _ in range(300))
    (folder / "environment.yml").write_text("dependencies:\n  - python=3.11\n  - pytorch=2.13.0\n" + body)
    _refused(tmp_path, folder / "environment.yml", "more than 32 read through -r/-c", where=str(folder / "r.txt"))
    (folder / "big.txt").write_text("# pad\n" * 150_000)          # 900 KB, under the 1 MB of one file
    (folder / "requirements.txt").write_text("torch==2.13.0\n" + "-r big.txt\n" * 6)
    _refused(tmp_path, folder / "requirements.txt", "bytes together", where=str(folder / "big.txt"))


def test_include_link_loops_long_and_odd_names_are_one_message(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a.txt").symlink_to("b.txt")
    (folder / "b.txt").symlink_to("a.txt")
    (folder / "loop.txt").write_text("torch==2.13.0\n-r a.txt\n")
    _refused(tmp_path, folder / "loop.txt", "cannot be opened", where=str(folder / "loop.txt"), line=2)
    (folder / "long.txt").write_text("torch==2.13.0\n\n-r " + "x" * 5000 + "\n")
    _refused(tmp_path, folder / "long.txt", "no file name", where=str(folder / "long.txt"), line=3)
    (folder / "deep.txt").write_text("torch==2.13.0\n-r " + "d/" * 100 + "x\n")
    _refused(tmp_path, folder / "deep.txt", "not a file in the same folder", where=str(folder / "deep.txt"), line=2)
    (folder / "environment.yml").write_text('dependencies:\n  - pytorch=2.13.0\n  - pip:\n    - "-r a\\0b"\n')
    _refused(tmp_path, folder / "environment.yml", "no file name", where=str(folder / "environment.yml"), line=4)


def test_long_lines_are_read_in_linear_time(tmp_path):
    src = tmp_path / "requirements.txt"
    src.write_text("torch==2.13.0\nnumpy" + " " * 200_000 + "x\n")
    _refused(tmp_path, src, "is not a requirement", where=str(src), line=2, limit_s=1.0)
    src.write_text("torch==2.13.0\n" + "six" + " " * 200_000 + "# a comment\n" + "a \\\n" * 50_000 + "b\n")
    r, out, took = _init(tmp_path, src)
    assert r.code == 2 and took < 2, (took, r.err)


def test_a_large_pyproject_is_refused_fast(tmp_path):
    deps = "".join(f"  \"pkg{n}>=1; python_version >= '3'\",\n" for n in range(4_900))
    src = tmp_path / "pyproject.toml"
    src.write_text(f"[project]\nname = \"x\"\ndependencies = [\n{deps}  \"torch\"]\n" + "# pad\n" * 100_000)
    assert src.stat().st_size < 1_000_000
    _refused(tmp_path, src, "entries", limit_s=3)


def test_quotes_in_a_pyprojects_comment_and_token_like_runs_are_read_in_linear_time(tmp_path):
    src = tmp_path / "pyproject.toml"
    src.write_text('[project]\nname = "x"\n# ' + '"\\' * 200_000 + '\ndependencies = ["torch>=2.1", "six"]\n')
    r, out, took = _init(tmp_path, src)
    assert r.code == 0 and took < 2, (took, r.err)
    assert "# " + str(src) + ":4" in out.read_text()             # the line found past the comment
    from envbuilder.redact import redact

    started = time.process_time()
    redact("eyJ-" * 100_000)
    assert time.process_time() - started < 1


@pytest.mark.parametrize("arg", ["a" * 5000, "d/" * 3000 + "requirements.txt", "b" * 300 + ".txt"])
def test_an_unreadable_source_name_is_one_message(tmp_path, arg):
    r = run_envbuilder_in_process("init", arg, "-o", str(tmp_path / "spec.yaml"))
    assert r.code == 2 and r.err.startswith("error: ") and "Traceback" not in r.err and "fix:" in r.err, r.err
    assert not (tmp_path / "spec.yaml").exists()


def test_a_wheelhouse_that_is_no_folder_and_a_name_with_a_login(tmp_path):
    src = tmp_path / "requirements.txt"
    src.write_text("torch>=2.1\n")
    for bad in ("w" * 5000, str(src)):
        r = run_envbuilder_in_process("init", str(src), "-o", str(tmp_path / "spec.yaml"), "--wheelhouse", bad)
        assert r.code == 2 and "--wheelhouse" in r.err, r.err
        assert "is not a folder" in r.err or "cannot be read" in r.err, r.err
    r, out, _ = _init(tmp_path, src, "--name", f"https://u:{SECRETS[0]}@h.example/x")
    assert r.code == 0 and SECRETS[0].lower() not in out.read_text().lower(), out.read_text()


def test_a_spec_channel_with_a_token_says_where_the_token_goes(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text('name: c\nframework: {name: pytorch, version: "2.13.0+cpu"}\npython: "3.11"\n'
                    'packages:\n  conda: [numpy=1.26]\n  conda_channels: ["https://conda.anaconda.org/t/tok-77/x"]\n')
    r = run_envbuilder_in_process("check", str(spec))
    assert r.code == 2 and f"{spec}:6: packages.conda_channels[0]" in r.err, r.err
    assert "tok-77" not in r.err and "RATTLER_AUTH_FILE" in r.err, r.err
