"""No write through a link, anywhere envbuilder writes (issue 47, item 2).

Every writer (each command or step that creates a file outside a private temporary folder) is run
with a symbolic link planted at its destination, pointing at a victim file outside: the victim
keeps its bytes, the user sees one `error:` line naming the path and the link, exit 2, no
traceback. The list cannot go stale quietly: `test_every_module_that_writes_is_walked` derives
the modules that call the writer (safewrite.py, output.write_atomic / write_folder, the CLI's
_write_new) from the source and wants a case for each; tests/test_architecture.py keeps the
modules that write files without safewrite.py to a list with a reason each.
Fast: no engine, no network (engines' and tools' commands are stand-ins)."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import RECIPES, ROOT

from envbuilder.cli import main
from envbuilder.errors import EnvbuilderError

SPEC = RECIPES / "cpu-torch-horovod.yaml"
DATA = ROOT / "tests" / "data" / "import"
VICTIM = b"the victim's own bytes\n"


def _cli(capsys, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().err


def _call(fn, *args, **kw) -> tuple[int, str]:
    """A step called as the CLI calls it: its refusal as `error: ...` and its exit code."""
    try:
        fn(*args, **kw)
    except EnvbuilderError as exc:
        return exc.exit_code, f"error: {exc.message()}\n"
    return 0, ""


def _built(tmp_path: Path, capsys) -> Path:
    out = tmp_path / "out"
    assert main(["build", str(SPEC), "--no-build", "--out", str(out)]) == 0
    capsys.readouterr()
    return out


# --- the writers: each plants the link (at the path it returns) and runs ------------------------

def w_init(tmp_path, link, capsys, monkeypatch):
    (tmp_path / "requirements.txt").write_text("torch==2.13.0\n")
    return _cli(capsys, "init", str(tmp_path / "requirements.txt"), "-o", str(link))


def w_init_force(tmp_path, link, capsys, monkeypatch):
    (tmp_path / "requirements.txt").write_text("torch==2.13.0\n")
    return _cli(capsys, "init", str(tmp_path / "requirements.txt"), "-o", str(link), "--force")


def w_init_preset(tmp_path, link, capsys, monkeypatch):
    return _cli(capsys, "init", "--preset", "cpu-torch-horovod", "-o", str(link))


def w_export(tmp_path, link, capsys, monkeypatch):
    folder = tmp_path / "hf"
    folder.mkdir()
    shutil.copy(DATA / "hf-text-classification.lock", folder / "envbuilder.lock")
    return _cli(capsys, "export", "requirements", str(folder), "-o", str(link), "--force")


def w_lock(tmp_path, link, capsys, monkeypatch):
    return _cli(capsys, "lock", str(SPEC), "--lock", str(link), "--force")


def w_build_folder(tmp_path, link, capsys, monkeypatch):
    return _cli(capsys, "build", str(SPEC), "--no-build", "--out", str(tmp_path / "out"), "--force")


def w_verify_report(tmp_path, link, capsys, monkeypatch):
    return _cli(capsys, "verify", "--report", str(link))


def w_verify_junit(tmp_path, link, capsys, monkeypatch):
    return _cli(capsys, "verify", "--junit", str(link))


def w_verify_attest(tmp_path, link, capsys, monkeypatch):
    return _cli(capsys, "verify", "--attest", str(link))


def _provenance_folder(tmp_path, capsys) -> Path:
    out = _built(tmp_path, capsys)
    (out / "image.json").write_text(json.dumps({"engine": "docker", "tag": "t:1", "id": "sha256:" + "a" * 64}))
    return out


def w_provenance_out(tmp_path, link, capsys, monkeypatch):
    out = _provenance_folder(tmp_path, capsys)
    return _cli(capsys, "attest", "provenance", str(out), "--out", str(link))


def w_provenance_default(tmp_path, link, capsys, monkeypatch):
    out = _provenance_folder(tmp_path, capsys)
    return _cli(capsys, "attest", "provenance", str(out))


def w_attest_bundle(tmp_path, link, capsys, monkeypatch):
    from envbuilder.attest import commands, cosign

    sif = tmp_path / "x.sif"
    sif.write_bytes(b"sif")
    statement = Path(str(link).removesuffix(".bundle"))
    statement.write_text("{}")
    digest = "b" * 64
    monkeypatch.setattr(commands, "check_key", lambda key, private: Path(key))
    monkeypatch.setattr(commands.bounded, "parse", lambda text, what, path: {
        "predicateType": "x", "predicate": {"result": "passed"}, "subject": [{"digest": {"sha256": digest}}]})
    monkeypatch.setattr(commands, "stable_file_sha256", lambda path, *a: digest)
    monkeypatch.setattr(cosign, "sign_blob", lambda st, key, bundle: Path(bundle).write_text('{"bundle": 1}'))
    return _call(commands.sign, str(statement), str(tmp_path / "key"), str(sif), "cosign")


def w_image_json(tmp_path, link, capsys, monkeypatch):
    from envbuilder.engines import docker

    digest = "sha256:" + "c" * 64

    def run(argv, **kw):
        return subprocess.CompletedProcess(argv, 0, f"latest: digest: {digest} size: 1\n", "")

    monkeypatch.setattr(docker, "docker_cli", lambda: "docker")
    monkeypatch.setattr(docker.subprocess, "run", run)
    return _call(docker.push, link.parent, {"tag": "t:1", "id": "sha256:" + "a" * 64}, "127.0.0.1:5000/t:1")


def w_buildah_archive(tmp_path, link, capsys, monkeypatch):
    from envbuilder.engines import buildah

    def run(argv, **kw):
        kind, path, tag = argv[-1].split(":", 2)
        Path(path).write_bytes(b"archive")          # what buildah push writes, where it is told
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(buildah.subprocess, "run", run)
    return _call(buildah.export_image, "buildah", "t:1", "oci-archive", link.parent)


def _apptainer(tmp_path, monkeypatch):
    from envbuilder.engines import apptainer
    from envbuilder.engines.options import BuildOptions

    folder = tmp_path / "out"
    folder.mkdir(exist_ok=True)
    tool = tmp_path / "fake-apptainer"
    tool.write_text('#!/bin/sh\nfor a; do last2="$last1"; last1="$a"; done\necho built > "$last2"\n')
    tool.chmod(0o755)
    monkeypatch.setattr(apptainer, "find_binary", lambda: str(tool))
    monkeypatch.setattr(apptainer, "check_unprivileged", lambda uid, user: None)
    monkeypatch.setattr(apptainer, "check_base_archives", lambda *a: None)
    monkeypatch.setattr(apptainer, "check_sif_arch", lambda sif, arch: "amd64")
    monkeypatch.setattr(apptainer.emulation, "require_runnable", lambda *a: None)
    spec = SimpleNamespace(name="demo", target_arch=apptainer.emulation.machine(), gpu=False, base_from=None)
    output = SimpleNamespace(stack=SimpleNamespace(spec=spec, lock=None))
    return apptainer, folder, output, BuildOptions(engine="apptainer", quiet=True)


def w_apptainer_sif(tmp_path, link, capsys, monkeypatch):
    apptainer, folder, output, opts = _apptainer(tmp_path, monkeypatch)
    return _call(apptainer.build, folder, output, opts)


def w_apptainer_log(tmp_path, link, capsys, monkeypatch):
    apptainer, folder, output, opts = _apptainer(tmp_path, monkeypatch)
    return _call(apptainer.build, folder, output, opts)


def w_sif(tmp_path, link, capsys, monkeypatch):
    from envbuilder.sif import build

    folder = link.parent
    (folder / "manifest.json").write_text(json.dumps({"name": "demo"}))
    monkeypatch.setattr(build, "require_tools", lambda: {"tar2sqfs": "x", "siftool": "x"})
    monkeypatch.setattr(build, "_image_size", lambda docker, tag: 1)
    return _call(build.make_sif, folder, "t:1")


def w_conda_fetch(tmp_path, link, capsys, monkeypatch):
    import hashlib

    from envbuilder.lock import conda

    channel = tmp_path / "channel" / "noarch"
    channel.mkdir(parents=True)
    pkg = channel / "demo-1.0-0.tar.bz2"
    pkg.write_bytes(b"package")
    p = {"name": "demo", "version": "1.0", "url": pkg.as_uri(),
         "hash": {"sha256": hashlib.sha256(b"package").hexdigest()}}
    # conda-pkgs/ is envbuilder's: a link found there is removed, unfollowed, before the fetch
    # (as in pins/); this one is planted while the package downloads
    real = conda._download

    def download_and_plant(url, fh, ca):
        real(url, fh, ca)
        if not link.is_symlink():
            link.symlink_to(tmp_path / "victim-dir" / "victim")

    link.unlink()
    monkeypatch.setattr(conda, "_download", download_and_plant)
    return _call(conda.fetch, [p], link.parent.parent)


def w_charliecloud(tmp_path, link, capsys, monkeypatch):
    """An image whose tree holds `ch` as a link out: its environment file is not written there."""
    from envbuilder.runtimes import charliecloud

    tar = tmp_path / "image.tar"
    with tarfile.open(tar, "w") as tf:
        for d in ("dev", "etc", "opt", "usr"):
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tf.addfile(info)
        info = tarfile.TarInfo("ch")
        info.type, info.linkname = tarfile.SYMTYPE, str(link.parent)
        tf.addfile(info)
    docker = tmp_path / "fake-docker"
    docker.write_text(f'#!/bin/sh\ncase "$1" in create) echo cid;; export) cat {tar};; image) echo A=1;; esac\n')
    docker.chmod(0o755)
    dest = tmp_path / "dirimage"
    return _call(charliecloud.docker_to_directory, str(docker), "img", dest)


# (case, the module whose writer it runs, the destination relative to tmp_path)
WRITERS = [
    (w_init, "envbuilder.cli", "spec.yaml"),
    (w_init_force, "envbuilder.cli", "spec.yaml"),
    (w_init_preset, "envbuilder.shippedcmd", "spec.yaml"),
    (w_export, "envbuilder.cli", "req.txt"),
    (w_lock, "envbuilder.lockcmd", "my.lock"),
    (w_build_folder, "envbuilder.pipeline", "out/Dockerfile"),
    (w_build_folder, "envbuilder.pipeline", "out/job.sbatch"),
    (w_build_folder, "envbuilder.pipeline", "out/envbuilder_smoke/__init__.py"),
    (w_verify_report, "envbuilder.verify.cli", "report.json"),
    (w_verify_junit, "envbuilder.verify.cli", "junit.xml"),
    (w_verify_attest, "envbuilder.verify.cli", "x.sif.att.json"),
    (w_provenance_out, "envbuilder.attest.commands", "prov.json"),
    (w_provenance_default, "envbuilder.attest.commands", "out/provenance.intoto.json"),
    (w_attest_bundle, "envbuilder.attest.commands", "x.att.json.bundle"),
    (w_image_json, "envbuilder.engines.docker", "out/image.json"),
    (w_buildah_archive, "envbuilder.engines.buildah", "out/image.oci.tar"),
    (w_apptainer_sif, "envbuilder.engines.apptainer", "out/demo.sif"),
    (w_apptainer_log, "envbuilder.engines.apptainer", "out/apptainer-build.log"),
    (w_sif, "envbuilder.sif.build", "out/demo.sif"),
    (w_conda_fetch, "envbuilder.lock.conda", "out/conda-pkgs/demo-1.0-0.tar.bz2"),
    (w_charliecloud, "envbuilder.runtimes.charliecloud", "victim-dir/environment"),
]


@pytest.mark.parametrize("case,module,dest", WRITERS, ids=[f"{c.__name__}:{d}" for c, _, d in WRITERS])
def test_no_writer_writes_through_a_link(case, module, dest, tmp_path, capsys, monkeypatch):
    outside = tmp_path / "victim-dir"
    outside.mkdir()
    victim = outside / "victim"
    victim.write_bytes(VICTIM)
    link = tmp_path / dest
    if case is w_build_folder:
        _built(tmp_path, capsys)
    link.parent.mkdir(parents=True, exist_ok=True)
    if case is w_charliecloud:
        planted = link.parent / "environment"       # the image's `ch` leads here
        planted.write_bytes(VICTIM)
        victim = planted
    else:
        if link.exists():
            link.unlink()
        link.symlink_to(victim)
    code, err = case(tmp_path, link, capsys, monkeypatch)
    assert victim.read_bytes() == VICTIM, f"written through the link: {err}"
    assert code == 2, err
    assert err.startswith("error: ") and err.count("error: ") == 1 and "Traceback" not in err, err
    assert "symbolic link" in err, err
    shown = str(link.parent) if case is w_charliecloud else str(link)
    if case is w_charliecloud:
        shown = str(tmp_path / "dirimage" / "ch")
    assert shown in err, err
    assert "fix: remove the link" in err, err
    if case is not w_charliecloud:
        assert link.is_symlink()                      # the link itself is left for the user to look at


# --- the list above cannot go stale ---------------------------------------------------------------

# safewrite.<anything>, and the writers built on it
WRITER_CALLS = {"write_atomic", "write_folder", "_write_new", "write_new"}


def _modules_that_write() -> set[str]:
    pkg = ROOT / "envbuilder"
    found = set()
    for path in sorted(pkg.rglob("*.py")):
        if path.name in ("safewrite.py", "output.py"):
            continue                # the writers themselves
        rel = path.relative_to(ROOT).with_suffix("")
        module = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                f = node.func
                if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "safewrite" \
                        or (f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)) in WRITER_CALLS:
                    found.add(module)
    return found


def test_every_module_that_writes_is_walked():
    walked = {module for _, module, _ in WRITERS}
    assert _modules_that_write() == walked, (
        "a module writes files through safewrite/output but has no case in WRITERS (or a case names a "
        "module that no longer writes): add its writer with a link planted at its destination")


# --- the helper itself: races and what it may replace ---------------------------------------------

def test_a_link_planted_after_the_check_is_refused_and_not_followed(tmp_path, monkeypatch):
    from envbuilder import safewrite

    victim = tmp_path / "victim"
    victim.write_bytes(VICTIM)
    target = tmp_path / "report.json"
    real = safewrite.stage

    def stage_then_plant(fd, name, data, mode):
        tmp = real(fd, name, data, mode)
        target.symlink_to(victim)                  # planted between the check and the rename
        return tmp

    monkeypatch.setattr(safewrite, "stage", stage_then_plant)
    with pytest.raises(EnvbuilderError) as exc:
        safewrite.write_file(target, "new", option="--report")
    assert "symbolic link" in exc.value.message() and str(target) in exc.value.message()
    assert victim.read_bytes() == VICTIM and sorted(p.name for p in tmp_path.iterdir()) == ["report.json", "victim"]


def test_a_folder_swapped_for_a_link_after_it_was_opened_is_refused_and_not_followed(tmp_path, monkeypatch,
                                                                                     capsys):
    """write_folder opens each folder once and checks, before each file is swapped in, that the path
    still leads to it: pins/ replaced by a link after the check is refused, naming it, and nothing
    is written through it (nor into the folder moved away)."""
    from envbuilder import output, safewrite

    folder = tmp_path / "out"
    output.write_folder(folder, {"pins/pip-python.txt": b"a"})
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    real = safewrite.stage

    def stage_then_swap(fd, name, data, mode):
        tmp = real(fd, name, data, mode)
        if name == "pip-python.txt" and not (folder / "pins").is_symlink():    # pins/ opened by now
            os.rename(folder / "pins", tmp_path / "pins-moved")
            (folder / "pins").symlink_to(elsewhere)
        return tmp

    monkeypatch.setattr(safewrite, "stage", stage_then_swap)
    with pytest.raises(EnvbuilderError) as exc:
        output.write_folder(folder, {"Dockerfile": b"# Written by envbuilder", "pins/pip-python.txt": b"b"})
    assert "symbolic link" in exc.value.message() and str(folder / "pins") in exc.value.message()
    assert list(elsewhere.iterdir()) == []
    assert [p.name for p in (tmp_path / "pins-moved").iterdir()] == ["pip-python.txt"]
    assert (tmp_path / "pins-moved" / "pip-python.txt").read_bytes() == b"a"
    assert not (folder / "Dockerfile").exists()          # all or nothing: the folder as it was


def test_a_users_folder_swapped_after_it_was_opened_is_refused(tmp_path, monkeypatch):
    from envbuilder import safewrite

    (tmp_path / "reports").mkdir()
    (tmp_path / "elsewhere").mkdir()
    real = safewrite.stage

    def stage_then_swap(fd, name, data, mode):
        tmp = real(fd, name, data, mode)
        os.rename(tmp_path / "reports", tmp_path / "reports-moved")
        (tmp_path / "reports").symlink_to(tmp_path / "elsewhere")
        return tmp

    monkeypatch.setattr(safewrite, "stage", stage_then_swap)
    with pytest.raises(EnvbuilderError) as exc:
        safewrite.write_file(tmp_path / "reports" / "r.json", "{}", option="--report")
    assert "moved or replaced while envbuilder wrote into it" in exc.value.message()
    assert list((tmp_path / "elsewhere").iterdir()) == [] and list((tmp_path / "reports-moved").iterdir()) == []


def test_init_never_replaces_a_file_made_while_it_wrote(tmp_path, monkeypatch):
    """replace="never": the new file is hard-linked into place, which fails on anything there."""
    from envbuilder import safewrite

    target = tmp_path / "spec.yaml"
    real = safewrite.stage

    def stage_then_race(fd, name, data, mode):
        tmp = real(fd, name, data, mode)
        target.write_bytes(VICTIM)                  # the user's file, made meanwhile
        return tmp

    monkeypatch.setattr(safewrite, "stage", stage_then_race)
    with pytest.raises(EnvbuilderError) as exc:
        safewrite.write_file(target, "name: x\n", option="-o", replace="never")
    assert "exists" in exc.value.message() and target.read_bytes() == VICTIM
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.yaml"]


def test_what_each_policy_replaces(tmp_path):
    from envbuilder import safewrite

    target = tmp_path / "f"
    target.write_bytes(b"mine")
    safewrite.write_file(target, "report", option="--report")                       # any plain file
    assert target.read_text() == "report"
    with pytest.raises(EnvbuilderError, match="replacing it would lose your file"):
        safewrite.write_file(target, "x", option="-o", replace="never")
    safewrite.write_file(target, "forced", option="-o", replace="never", force=True)
    assert target.read_text() == "forced"
    with pytest.raises(EnvbuilderError, match="not written by envbuilder"):
        safewrite.write_file(target, "x", option="--lock", replace=lambda head: head.startswith(b"# env"))
    (tmp_path / "d").mkdir()
    with pytest.raises(EnvbuilderError, match="not a plain file"):
        safewrite.write_file(tmp_path / "d", "x", option="--report")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(EnvbuilderError, match="not a plain file"):           # never opened (it would block)
        safewrite.write_file(fifo, "x", option="--report", replace=lambda head: True)


def test_a_link_inside_the_folder_on_the_way_is_refused(tmp_path):
    from envbuilder import safewrite

    folder = tmp_path / "out"
    folder.mkdir()
    (tmp_path / "elsewhere").mkdir()
    (folder / "conda-pkgs").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(EnvbuilderError) as exc:
        safewrite.write_file(folder / "conda-pkgs" / "x", "x", option="conda", inside=folder)
    assert "symbolic link" in exc.value.message() and str(folder / "conda-pkgs") in exc.value.message()
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_a_link_in_the_users_own_path_to_the_folder_is_the_users(tmp_path):
    """Above the folder a command writes into, links are the user's (a home folder often is one)."""
    from envbuilder import safewrite

    (tmp_path / "real").mkdir()
    (tmp_path / "home").symlink_to(tmp_path / "real")
    safewrite.write_file(tmp_path / "home" / "report.json", "{}", option="--report")
    assert (tmp_path / "real" / "report.json").read_text() == "{}"


def test_the_moved_writers_still_write_where_they_did(tmp_path, capsys, monkeypatch):
    """The .sif apptainer builds, buildah's archive and a conda package: written in a private folder,
    then moved into place (nothing left beside them)."""
    import hashlib

    from envbuilder.engines import buildah
    from envbuilder.lock import conda

    apptainer, folder, output, opts = _apptainer(tmp_path, monkeypatch)
    info = apptainer.build(folder, output, opts)
    assert info["sif"] == str(folder / "demo.sif") and (folder / "demo.sif").read_text() == "built\n"

    def run(argv, **kw):
        Path(argv[-1].split(":", 2)[1]).write_bytes(b"archive")
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(buildah.subprocess, "run", run)
    assert buildah.export_image("buildah", "t:1", "oci-archive", folder) == str(folder.resolve() / "image.oci.tar")
    assert (folder / "image.oci.tar").read_bytes() == b"archive"
    pkg = tmp_path / "demo-1.0-0.tar.bz2"
    pkg.write_bytes(b"package")
    p = {"name": "demo", "version": "1.0", "url": pkg.as_uri(), "hash": {"sha256": hashlib.sha256(b"package").hexdigest()}}
    assert conda.fetch([p], folder) == ["demo-1.0-0.tar.bz2"]
    assert (folder / "conda-pkgs" / "demo-1.0-0.tar.bz2").read_bytes() == b"package"
    assert sorted(p.name for p in folder.iterdir()) == ["apptainer-build.log", "conda-pkgs", "demo.sif", "image.oci.tar"]
    assert [p.name for p in (folder / "conda-pkgs").iterdir()] == ["demo-1.0-0.tar.bz2"]


def test_a_thread_swapping_a_link_and_a_file_never_gets_a_write_through(tmp_path):
    """A concurrent writer flips the destination between a link to the victim, nothing and a plain
    file while 600 writes run (write_file replacing any file or none, open_new): every write either lands (the link or file replaced, not followed)
    or is refused with safewrite's message; the victim never changes."""
    import threading

    from envbuilder import safewrite

    victim = tmp_path / "victim"
    victim.write_bytes(VICTIM)
    target = tmp_path / "report.json"
    stop = threading.Event()

    def flip():
        while not stop.is_set():
            for make in (lambda: target.symlink_to(victim), lambda: target.write_bytes(b"plain")):
                try:
                    target.unlink()
                except FileNotFoundError:
                    pass
                try:
                    make()
                except FileExistsError:
                    pass

    t = threading.Thread(target=flip, daemon=True)
    t.start()
    outcomes = {"written": 0, "refused": 0}
    try:
        for n in range(200):
            for how in ("any", "never", "open_new"):
                try:
                    if how == "open_new":
                        with safewrite.open_new(target, option="build log") as log:
                            log.write(f"log {n}")
                    else:
                        safewrite.write_file(target, f"report {n}", option="--report", replace=how)
                    outcomes["written"] += 1
                except safewrite.UnsafeTarget as exc:
                    assert "symbolic link" in exc.reason or "exists" in exc.reason or "appeared" in exc.reason, exc.reason
                    outcomes["refused"] += 1
    finally:
        stop.set()
        t.join()
    assert victim.read_bytes() == VICTIM
    assert sum(outcomes.values()) == 600, outcomes            # which of the two: the threads' schedule
    if target.is_symlink():
        target.unlink()
    safewrite.write_file(target, "last", option="--report")     # once the other writer stops: written
    assert target.read_text() == "last" and victim.read_bytes() == VICTIM
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []     # no temporary left
