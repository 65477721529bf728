"""Every text that reaches a generated file stays text in that file's grammar, and no file name
reaches an `error:` line raw (issue 47, item 3 and item 5's last sentence).

Hostile names (newline, CR, the line separators Python's splitlines and YAML also break at, a
terminal's escape sequences, backslash, quotes) go into each place user text reaches a generated
file; the file is read back the way its tool reads it:

- `export requirements`: pip's own requirements-file reader (pip._internal.req.req_file: line
  joining, comments, options), which must see the same requirement lines and options as for a
  plain name, none more;
- `export conda`: conda's explicit list, split at every line break any reader knows
  (str.splitlines) and at \\n alone: the same lines as for a plain name;
- `init`: yaml.safe_load of the spec, and every line break in it one a YAML reader sees;
- the spec's fields that reach Dockerfile / Apptainer.def / job.sbatch / slurm-epilog.sh: a
  line-breaking or terminal character is refused (exit 2, nothing written); quotes, backslashes
  and shell syntax stay text there (tests/test_hardening.py parses those files with their tools).

envbuilder writes no TOML file (config.toml is read only), so there is no TOML case.
Fast: no engine, no network.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from conftest import RECIPES, ROOT

from envbuilder.cli import main

DATA = ROOT / "tests" / "data" / "import"
SPEC = RECIPES / "cpu-torch-horovod.yaml"

# each would add a line (or rewrite the screen) if written raw
HOSTILE = [
    "a\n-r /etc/passwd\n--trusted-host evil.example\nb",
    "a\r-i https://evil.example/simple",
    "a\r\n--extra-index-url https://evil.example/simple",
    "a\x0b-r x", "a\x0c-r x", "a\x1c-r x", "a\x1d-r x", "a\x1e-r x",
    "a\x85--trusted-host evil.example",
    "a\u2028-r /etc/passwd", "a\u2029-e .",
    "a\x1b[2J\x1b]0;pwned\x07",
    "back\\slash\\",
    "quo\"te's #x",
    "line \\\n-r x",
]
IDS = [repr(h)[1:30] for h in HOSTILE]


def _export(tmp_path: Path, folder_name: str, fmt: str = "requirements") -> str:
    folder = tmp_path / folder_name
    folder.mkdir(parents=True)
    shutil.copy(DATA / "hf-text-classification.lock", folder / "envbuilder.lock")
    out = tmp_path / "exported.txt"
    assert main(["export", fmt, str(folder), "-o", str(out), "--force"]) == 0
    return out.read_text()


def _pip_reads(text: str) -> list[tuple[str, str]]:
    """(requirement, options) per line, as pip's requirements-file reader splits them."""
    from pip._internal.req.req_file import break_args_options, preprocess

    return [break_args_options(line) for _, line in preprocess(text)]


@pytest.mark.parametrize("name", HOSTILE, ids=IDS)
def test_export_requirements_keeps_a_hostile_folder_name_in_its_comment(name, tmp_path, capsys):
    plain = _pip_reads(_export(tmp_path / "plain", "hf"))
    assert len(plain) > 40 and all(opts.startswith("--hash=sha256:") and " " not in opts for _, opts in plain)
    text = _export(tmp_path / "hostile", name)
    assert _pip_reads(text) == plain                       # no -r, -i, --trusted-host, -e line added
    assert len(text.splitlines()) == len(text.split("\n")) - 1     # no line break but its own \n
    assert all(c == "\n" or c.isprintable() for c in text)
    head = text.splitlines()[0]
    assert head.startswith("# Exported by `envbuilder export requirements` from ")
    # the name is shown escaped, whole, and reads back to itself
    shown = head.split(" from ", 1)[1].rsplit(" (hf-text-classification)", 1)[0]
    assert shown.encode().decode("unicode_escape") == str(tmp_path / "hostile" / name / "envbuilder.lock")
    capsys.readouterr()


def _conda_lock():
    from envbuilder.lock.conda import check_lockfile
    from envbuilder.lock.model import Lock

    conda = yaml.safe_load((ROOT / "tests" / "data" / "conda" / "conda-lock.yml").read_text().replace(
        "@CHANNEL@", "/srv/channel"))
    return Lock(name="t", inputs={}, conda={"lockfile": check_lockfile(conda, [], "test")})


@pytest.mark.parametrize("name", HOSTILE, ids=IDS)
def test_export_conda_keeps_a_hostile_folder_name_in_its_comment(name):
    from envbuilder.lock.export import conda_explicit

    lock = _conda_lock()
    plain = conda_explicit(lock, "/x/plain/envbuilder.lock")
    text = conda_explicit(lock, f"/x/{name}/envbuilder.lock")
    for split in (str.splitlines, lambda t: t.split("\n")):
        got, want = split(text), split(plain)
        assert len(got) == len(want) and got[1:] == want[1:]
        assert [ln for ln in got if not ln.startswith("#")] == [ln for ln in want if not ln.startswith("#")]
    urls = [ln for ln in text.splitlines() if "://" in ln and not ln.startswith("#")]
    assert urls and all(u.startswith("file:///srv/channel/") for u in urls)


@pytest.mark.parametrize("name", HOSTILE, ids=IDS)
def test_init_keeps_a_hostile_source_name_in_a_yaml_comment(name, tmp_path, capsys):
    def init(folder: Path) -> str:
        folder.mkdir(parents=True)
        (folder / "requirements.txt").write_text("torch==2.13.0\nsix==1.16.0\n")
        out = folder.parent / f"{folder.name[:1]}-spec.yaml"
        code = main(["init", str(folder / "requirements.txt"), "--name", "demo", "-o", str(out)])
        assert code == 0, capsys.readouterr().err
        return out.read_text()

    plain = init(tmp_path / "plain" / "src")
    text = init(tmp_path / "hostile" / name)
    assert yaml.safe_load(text) == yaml.safe_load(plain)
    assert len(text.splitlines()) == len(text.split("\n")) - 1
    assert all(c == "\n" or c.isprintable() for c in text)
    capsys.readouterr()


# --- the spec's text fields: a line break any reader sees, or a terminal's escape, is refused --------

BREAKS = ["a\rb", "a\x85b", "a\u2028b", "a\u2029b", "a\x1b[2Jb", "a\x0bb"]


def _string_fields():
    from test_hardening import FIELDS

    return FIELDS


@pytest.mark.parametrize("field", _string_fields())
def test_a_line_break_or_escape_in_any_spec_field_is_refused(field, tmp_path, capsys):
    from test_hardening import _preset, _set, _value_for

    for n, payload in enumerate(BREAKS):
        data = _preset()
        _set(data, field, _value_for(field, payload, tmp_path / f"p{n}"))
        spec = tmp_path / f"s{n}.yaml"
        spec.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=False))
        out = tmp_path / f"o{n}"
        code = main(["build", str(spec), "--no-build", "--out", str(out)])
        err = capsys.readouterr().err
        assert code == 2, f"{field}={payload!r} accepted"
        assert err.startswith("error: ") and "Traceback" not in err, err
        assert not out.exists()
        assert "\x1b" not in err and "\r" not in err and "\x85" not in err and "\u2028" not in err, repr(err)


# --- error lines: a file name cannot rewrite the screen ---------------------------------------------

ESCAPES = "\x1b]0;owned\x07\x1b[2J\x1b[1;1H\r\x9b31m\u2028"


def test_a_file_name_with_escape_sequences_reaches_the_error_line_escaped(tmp_path, capsys):
    name = tmp_path / f"lock{ESCAPES}dir"
    assert main(["export", "requirements", str(name)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: export: no lock at ") and err.count("\n") == 2, repr(err)   # its own fix line
    assert all(c in "\n" or c.isprintable() for c in err), repr(err)
    assert "\\x1b]0;owned\\x07\\x1b[2J" in err and "\\x0d" in err and "\\x9b" in err and "\\u2028" in err
    # a spec path, an -o path: each message the same way
    assert main(["check", str(tmp_path / f"spec{ESCAPES}.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and all(c in "\n" or c.isprintable() for c in err), repr(err)
    src = tmp_path / "requirements.txt"
    src.write_text("torch==2.13.0\n")
    mine = tmp_path / f"mine{ESCAPES}.yaml"
    mine.write_text("mine\n")
    assert main(["init", str(src), "-o", str(mine)]) == 2
    err = capsys.readouterr().err
    assert "exists" in err and all(c in "\n" or c.isprintable() for c in err), repr(err)
    assert mine.read_text() == "mine\n"


def test_a_newline_in_a_name_cannot_fake_a_line_of_its_own(tmp_path, capsys):
    """Where the name is the place or field (every control escaped there), a newline in it cannot
    start a line that looks like envbuilder's."""
    from envbuilder.errors import EnvbuilderError

    e = EnvbuilderError("key\nerror: all fine", "unknown key", "remove it", source="spec\n  fix: x.yaml", line=3)
    assert e.message().splitlines() == ["spec\\x0a  fix: x.yaml:3: key\\x0aerror: all fine: unknown key",
                                        "  fix: remove it"]
    assert json.loads(json.dumps(e.as_dict()))["field"] == "key\nerror: all fine"     # --json: JSON's own escaping


@pytest.mark.parametrize("payload", BREAKS)
def test_a_lock_note_with_a_line_break_any_reader_sees_is_refused(payload):
    """A lock's free text (resolver notes, times) is one line for every reader too (lock/schema.py)."""
    import sys

    from envbuilder.errors import EnvbuilderError
    from envbuilder.lock.model import loads

    sys.path.insert(0, str(ROOT / "tools"))
    import fuzz_lock

    lock = json.loads(fuzz_lock.BASE_TEXT)
    lock["resolvers"]["apt-index"] = {"deb.debian.org bookworm": f"2026-01-01{payload}%setup"}
    with pytest.raises(EnvbuilderError) as exc:
        loads(json.dumps(fuzz_lock.resealed(lock)))
    message = exc.value.message()
    assert "resolvers.apt-index" in message and "one line" in message
    assert all(c == "\n" or c.isprintable() for c in message), repr(message)
