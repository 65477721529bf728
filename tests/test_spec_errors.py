"""Bad specs: one clear message naming the field and the fix, exit code 2, no traceback,
and no output folder left behind."""

from __future__ import annotations

import pytest

GOOD = """\
name: demo
framework: {name: pytorch, version: "2.13.0+cpu"}
python: "3.11"
base: local/debian:bookworm-slim
mpi: {flavor: openmpi, version: "4.1.4", pmi: pmix}
horovod: {version: "0.28.1", operations: [mpi, gloo]}
"""


def _fails(cli, write_spec, tmp_path, text, *needles, line=None):
    spec = write_spec(text)
    out = tmp_path / "out"
    r = cli("build", str(spec), "--no-build", "--out", str(out))
    assert r.code == 2, r.err
    assert "Traceback" not in r.err
    for needle in needles:
        assert needle in r.err, r.err
    if line is not None:
        assert f"{spec}:{line}:" in r.err, r.err
    assert not out.exists(), "a failed build must not leave an output folder"
    assert list(tmp_path.iterdir()) == [spec], "no partial files next to the spec"
    return r.err


def test_good_spec_builds(cli, write_spec, tmp_path):
    r = cli("build", str(write_spec(GOOD)), "--no-build", "--out", str(tmp_path / "out"))
    assert r.code == 0, r.err
    assert (tmp_path / "out" / "Dockerfile").is_file()


def test_yaml_syntax_error_names_the_line(cli, write_spec, tmp_path):
    _fails(cli, write_spec, tmp_path, GOOD + "cluster: {nodes: 2\n", "YAML syntax error", line=8)


def test_unknown_key_suggests_the_right_one(cli, write_spec, tmp_path):
    err = _fails(cli, write_spec, tmp_path, GOOD.replace("python:", "pyhton:"), "pyhton: unknown key",
                 "did you mean `python`?", line=3)
    assert "python: is required but missing" in err


def test_unknown_nested_key(cli, write_spec, tmp_path):
    _fails(cli, write_spec, tmp_path, GOOD + "cluster: {gpus_per_nod: 4}\n", "cluster.gpus_per_nod: unknown key",
           "did you mean `gpus_per_node`?", line=7)


def test_wrong_type(cli, write_spec, tmp_path):
    _fails(cli, write_spec, tmp_path, GOOD + "cluster: {nodes: two}\n", "cluster.nodes: expected a whole number",
           line=7)


def test_unquoted_python_version_is_caught(cli, write_spec, tmp_path):
    _fails(cli, write_spec, tmp_path, GOOD.replace('python: "3.11"', "python: 3.10"),
           "python: 3.10 is read as the number 3.1", 'quote it: python: "3.10"', line=3)


def test_missing_required_key(cli, write_spec, tmp_path):
    text = "\n".join(l for l in GOOD.splitlines() if not l.startswith("framework"))
    _fails(cli, write_spec, tmp_path, text, "framework: is required but missing", "add `framework:")


def test_unpinned_pip_package(cli, write_spec, tmp_path):
    _fails(cli, write_spec, tmp_path, GOOD + "packages: {pip: ['h5py>=']}\n", "packages.pip[0]",
           "not pinned", "h5py==", line=7)


@pytest.mark.parametrize("content,needle", [
    (b"", "the file is empty"),
    (b"   \n\n", "the file is empty"),
    (b"\x00\x01\x02binary", "binary file"),
    (b"- just\n- a list\n", "top level must be a mapping"),
])
def test_empty_binary_and_odd_files(cli, tmp_path, content, needle):
    spec = tmp_path / "spec.yaml"
    spec.write_bytes(content)
    r = cli("build", str(spec), "--no-build", "--out", str(tmp_path / "out"))
    assert r.code == 2 and needle in r.err and "Traceback" not in r.err, r.err
    assert not (tmp_path / "out").exists()


def test_nonexistent_spec(cli, tmp_path):
    r = cli("build", str(tmp_path / "nope.yaml"), "--no-build")
    assert r.code == 2
    assert "no such file" in r.err and "Traceback" not in r.err


def test_unwritable_output_folder(cli, write_spec, tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / "keep.txt").write_text("mine")
    locked.chmod(0o500)
    try:
        import os
        if os.access(locked, os.W_OK):
            # root ignores mode bits: use a path below a regular file instead
            target = tmp_path / "afile" / "out"
            (tmp_path / "afile").write_text("x")
        else:
            target = locked / "out"
        r = cli("build", str(write_spec(GOOD)), "--no-build", "--out", str(target))
        assert r.code == 2, r.err
        assert "cannot write" in r.err and "--out" in r.err and "Traceback" not in r.err
        assert (locked / "keep.txt").read_text() == "mine"
    finally:
        locked.chmod(0o700)


def test_json_error_output(cli, write_spec, tmp_path):
    import json

    spec = write_spec(GOOD.replace("pyhton", "x").replace('python: "3.11"', 'python: "3.11"\ncolor: red'))
    r = cli("check", str(spec), "--json")
    assert r.code == 2
    data = json.loads(r.out)
    assert data["ok"] is False
    assert data["errors"][0]["field"] == "color"
    assert data["errors"][0]["line"] == 4


@pytest.mark.parametrize("runtime", ["apptainer", "singularity", "pyxis"])
def test_a_site_bind_with_a_comma_is_refused_where_the_runtime_splits_on_commas(cli, tmp_path, runtime):
    """Apptainer's --bind and pyxis's --container-mounts read a comma as the end of a bind: a site's
    /data/a,/etc:/host-etc would mount /data/a and the host's /etc."""
    from conftest import RECIPES

    site = tmp_path / "site.yaml"
    site.write_text(f"name: commas\nruntime: {runtime}\nbinds: [/scratch, '/data/a,/etc:/host-etc']\n")
    r = cli("build", str(RECIPES / "cpu-torch-horovod.yaml"), "--site", str(site), "--no-build", "--out", str(tmp_path / "out"))
    assert r.code == 2 and "Traceback" not in r.err, r.err
    assert "cluster.binds[1]" in r.err and "'/data/a,/etc:/host-etc' holds ','" in r.err, r.err
    assert f"cluster.runtime {runtime} splits its bind list on" in r.err and "'/etc:/host-etc'" in r.err, r.err
    assert not (tmp_path / "out").exists()
    ok = cli("build", str(RECIPES / "cpu-torch-horovod.yaml"), "--site", str(site), "--runtime", "charliecloud",
             "--no-build", "--out", str(tmp_path / "ch"))
    assert ok.code == 0, ok.err           # ch-run takes one bind per -b: the comma is a path's
