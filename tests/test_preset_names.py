"""A preset's name wherever a spec is taken (issue 46 items 1 and 5), from the checkout: a file of
that name in the working folder wins, the output folder is images/<name>/ under it, a name that is
no preset is refused with the close names, `init --preset` and `presets` as a user sees them.
The installed package's side: tests/test_install.py."""

from __future__ import annotations

import json

from conftest import RECIPES, run_envbuilder_in_process


def test_check_lock_build_take_a_preset_name(cli, tmp_path):
    r = cli("check", "cpu-torch-ddp", cwd=tmp_path)
    assert r.code == 0 and r.out.startswith("cpu-torch-ddp: ok"), r.out + r.err
    assert "using preset cpu-torch-ddp (envbuilder's recipes/cpu-torch-ddp.yaml" in r.err
    r = cli("build", "cpu-torch-ddp", "--no-build", cwd=tmp_path)
    assert r.code == 0, r.err
    manifest = json.loads((tmp_path / "images" / "cpu-torch-ddp" / "manifest.json").read_text())
    assert manifest["name"] == "cpu-torch-ddp"
    r = cli("check", "cpu-torch-ddp", "--json", cwd=tmp_path)
    assert r.code == 0 and json.loads(r.out)["ok"] and "using preset" not in r.err


def test_a_file_of_that_name_wins(cli, tmp_path):
    (tmp_path / "cpu-torch-ddp").write_text((RECIPES / "cpu-torch-ddp.yaml").read_text()
                                            .replace("name: cpu-torch-ddp", "name: mine"))
    r = cli("check", "cpu-torch-ddp", cwd=tmp_path)
    assert r.code == 0 and "using preset" not in r.err, r.out + r.err
    r = cli("build", "cpu-torch-ddp", "--no-build", cwd=tmp_path)
    assert r.code == 0 and (tmp_path / "images" / "mine" / "Dockerfile").is_file(), r.err


def test_an_unknown_name_lists_the_close_ones(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for command in ("check", "build", "lock"):
        r = run_envbuilder_in_process(command, "torch-horovod-pyp")
        assert r.code == 2, r.err
        assert "error: spec: no such file or preset: 'torch-horovod-pyp'" in r.err
        assert "close presets: torch-horovod-pypi" in r.err and "`envbuilder presets` lists all" in r.err
    r = run_envbuilder_in_process("build", "cpu-torch-ddp.yaml")
    assert r.code == 2 and "the preset of that name is `cpu-torch-ddp`" in r.err, r.err
    r = run_envbuilder_in_process("check", "nosuch", "--json")
    assert r.code == 2 and json.loads(r.out)["field"] == "spec"
    assert list(tmp_path.iterdir()) == []


def test_init_preset(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = run_envbuilder_in_process("init", "--preset", "cpu-torch-ddp", "-o", "my.yaml", "--name", "my-ddp")
    assert r.code == 0, r.err
    assert "name: my-ddp\n" in (tmp_path / "my.yaml").read_text()
    assert run_envbuilder_in_process("check", "my.yaml").code == 0
    r = run_envbuilder_in_process("init", "--preset", "cpu-torch-ddp", "-o", "my.yaml")
    assert r.code == 2 and "my.yaml exists" in r.err and "--force" in r.err
    assert "name: my-ddp\n" in (tmp_path / "my.yaml").read_text()
    r = run_envbuilder_in_process("init", "--preset", "cpu-torch", "-o", "other.yaml")
    assert r.code == 2 and "error: --preset: no preset named 'cpu-torch'" in r.err and "cpu-torch-ddp" in r.err
    r = run_envbuilder_in_process("init", "req.txt", "--preset", "cpu-torch-ddp")
    assert r.code == 2 and "give one" in r.err
    r = run_envbuilder_in_process("init", "--preset", "cpu-torch-ddp", "--name", "Bad Name", "-o", "x.yaml")
    assert r.code == 2 and "name" in r.err and not (tmp_path / "x.yaml").exists()


def test_no_presets_is_an_error(tmp_path, monkeypatch):
    """An installation whose package data is missing: its envbuilder/presets/ folder is empty."""
    from envbuilder.spec import presets

    (tmp_path / "presets").mkdir()
    monkeypatch.setattr(presets, "PACKAGE", tmp_path)
    r = run_envbuilder_in_process("presets")
    assert r.code == 1 and "has no presets" in r.err and "reinstall" in r.err, r.err
    r = run_envbuilder_in_process("build", "cpu-torch-ddp", "--no-build")
    assert r.code == 2 and "no presets" in r.err, r.err


def test_sites_lists_the_profiles(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sites").mkdir()
    (tmp_path / "sites" / "mine.yaml").write_text("name: mine\ndescription: my cluster\npartition: gpu\n")
    (tmp_path / "sites" / "broken.yaml").write_text("name: broken\nno_such_key: 1\n")
    r = run_envbuilder_in_process("sites", "--json")
    data = json.loads(r.out)
    rows = {s["name"]: s for s in data["sites"]}
    assert r.code == 1 and not data["ok"] and not rows["broken"]["ok"] and "no_such_key" in rows["broken"]["error"]
    assert rows["mine"]["where"] == "./sites/" and rows["mine"]["description"] == "my cluster"
    assert rows["example-gpu"]["where"] == "envbuilder's sites/"
    r = run_envbuilder_in_process("sites")
    assert r.code == 1 and "no_such_key" in r.err and "mine" in r.out
