"""A hostile image archive given to `envbuilder sif --archive FILE` (issue 20 §1): nothing outside
the output folder is written, deleted or read, whatever links, whiteouts and hard links the
layers hold; a malformed archive is one message; the unpacked size is bounded; the layers are
applied by the OCI rules; and it works as a non-root user, owners kept as in the image.

Every archive is made here with Python's tarfile, in both layouts (`docker save`, OCI) and with
plain and gzip layers. VICTIM is a folder beside the output folder holding a secret; after each
run it must hold exactly what it held, and no byte of the secret may be in the SquashFS (read
back with sqfs2tar). No Docker engine is needed; tar2sqfs, siftool and sqfs2tar are."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import pwd
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

import pytest

from conftest import ROOT, run_envbuilder
from infra import require_binary, small_tmpfs, user_python

SECRET = b"TOPSECRET-3f9c1e-do-not-copy\n"
USER = "envb-sif"


@pytest.fixture(autouse=True)
def tools():
    for name, package in (("tar2sqfs", "squashfs-tools-ng"), ("sqfs2tar", "squashfs-tools-ng"),
                          ("siftool", "siftool"), ("unsquashfs", "squashfs-tools")):
        require_binary(name, f"apt-get install {package} (.ci/install-system.sh)")


# --- archives, made here ----------------------------------------------------------------------

def F(name, data=b"", mode=0o644, uid=0, gid=0):
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.uid, info.gid = len(data), mode, uid, gid
    return info, io.BytesIO(data)


def D(name, mode=0o755, uid=0, gid=0):
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.uid, info.gid = tarfile.DIRTYPE, mode, uid, gid
    return info, None


def L(name, target):
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = tarfile.SYMTYPE, target, 0o777
    return info, None


def H(name, target):
    info = tarfile.TarInfo(name)
    info.type, info.linkname = tarfile.LNKTYPE, target
    return info, None


def DEV(name, kind=tarfile.CHRTYPE, major=1, minor=3):
    info = tarfile.TarInfo(name)
    info.type, info.devmajor, info.devminor, info.mode = kind, major, minor, 0o666
    return info, None


def layer(entries, compress: str | None = None) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in entries:
            tar.addfile(info, data)
    raw = buf.getvalue()
    return gzip.compress(raw, mtime=0) if compress == "gzip" else raw


CONFIG = {"architecture": "amd64", "os": "linux",
          "config": {"Env": ["PATH=/usr/bin:/bin", "LANG=C.UTF-8"], "Cmd": ["/bin/sh"]}}


def _outer(path: Path, members: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def docker_archive(path: Path, layers: list[bytes], config=CONFIG, manifest=None, drop=()) -> Path:
    members = {f"l{i}/layer.tar": data for i, data in enumerate(layers)}
    members["config.json"] = config if isinstance(config, bytes) else json.dumps(config).encode()
    if manifest is None:
        manifest = [{"Config": "config.json", "RepoTags": ["x:1"], "Layers": list(members)[:len(layers)]}]
    members["manifest.json"] = manifest if isinstance(manifest, bytes) else json.dumps(manifest).encode()
    return _outer(path, {k: v for k, v in members.items() if k not in drop})


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def oci_archive(path: Path, layers: list[bytes], config=CONFIG, manifest=None, index=None, drop=()) -> Path:
    blobs = {}
    config_bytes = config if isinstance(config, bytes) else json.dumps(config).encode()
    blobs[_digest(config_bytes)] = config_bytes
    descs = []
    for data in layers:
        blobs[_digest(data)] = data
        kind = "tar+gzip" if data[:2] == b"\x1f\x8b" else "tar"
        descs.append({"mediaType": f"application/vnd.oci.image.layer.v1.{kind}", "digest": _digest(data),
                      "size": len(data)})
    if manifest is None:
        manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                               "digest": _digest(config_bytes), "size": len(config_bytes)},
                    "layers": descs}
    manifest_bytes = json.dumps(manifest).encode()
    blobs[_digest(manifest_bytes)] = manifest_bytes
    if index is None:
        index = {"schemaVersion": 2, "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                                                    "digest": _digest(manifest_bytes),
                                                    "size": len(manifest_bytes)}]}
    members = {"oci-layout": b'{"imageLayoutVersion": "1.0.0"}', "index.json": json.dumps(index).encode()}
    members.update({"blobs/" + d.replace(":", "/"): b for d, b in blobs.items()})
    return _outer(path, {k: v for k, v in members.items() if k not in drop and k.split("/")[-1] not in drop})


ARCHIVES = {"docker": docker_archive, "oci": oci_archive}
LAYOUTS = [("docker", None), ("docker", "gzip"), ("oci", None), ("oci", "gzip")]


# --- the scene: an output folder, VICTIM beside it -----------------------------------------------

@pytest.fixture
def scene(tmp_path):
    victim = tmp_path / "VICTIM"
    (victim / "sub").mkdir(parents=True)
    (victim / "secret.txt").write_bytes(SECRET)
    (victim / "sub" / "inner.txt").write_bytes(SECRET)
    out = tmp_path / "out"
    out.mkdir()
    (out / "manifest.json").write_text(json.dumps({"name": "img", "expect": {}}))
    return tmp_path, out, victim


def snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() and not p.is_symlink() else
                                         ("link", os.readlink(p)) if p.is_symlink() else "dir")
            for p in sorted(folder.rglob("*"))}


def sif_run(out: Path, archive: Path, *extra, **kw):
    return run_envbuilder("sif", str(out), "--archive", str(archive), *extra, timeout=300, **kw)


def squashfs_of(sif: Path, where: Path) -> Path:
    from envbuilder.sif import check

    part = check.structure(sif)["partition"]
    dest = where / "part.squashfs"
    with open(sif, "rb") as src, open(dest, "wb") as out:
        src.seek(part["offset"])
        out.write(src.read(part["size"]))
    return dest


def contents(sif: Path, where: Path) -> dict[str, tuple]:
    """path -> (type, mode, uid, gid, content or link target), from sqfs2tar."""
    raw = subprocess.run(["sqfs2tar", str(squashfs_of(sif, where))], capture_output=True, check=True).stdout
    out = {}
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        for m in tar:
            data = tar.extractfile(m).read() if m.isreg() else m.linkname
            out[m.name.rstrip("/")] = (m.type, m.mode, m.uid, m.gid, data)
    return out


def assert_held(result, out: Path, victim: Path, before: dict, where: Path, code: int = 0):
    assert result.code == code, result.err
    assert "Traceback" not in result.err
    assert snapshot(victim) == before, "VICTIM changed"
    leftovers = [p.name for p in out.iterdir() if p.name.startswith(".")]
    assert not leftovers, leftovers                          # the work folder is gone
    if code != 0:
        assert not (out / "img.sif").exists()
        assert len([line for line in result.err.splitlines() if not line.startswith("  fix:")]) == 1, result.err
        return None
    files = contents(out / "img.sif", where)
    assert not [k for k, v in files.items() if isinstance(v[4], bytes) and SECRET.strip() in v[4]]
    return files


# --- escapes: links, whiteouts, hard links -------------------------------------------------------

def _escapes(victim: Path) -> dict[str, list[list]]:
    rel = "../../../VICTIM"                  # from the old work folder's root/: up to VICTIM's parent
    return {
        "write through an absolute link": [[L("esc", str(victim))], [F("esc/x", b"pwned")]],
        "write through a relative link": [[L("esc", rel)], [F("esc/x", b"pwned")]],
        "write through a link that replaced a folder": [
            [D("d"), F("d/keep", b"k")], [F(".wh.d"), L("d", str(victim))], [F("d/x", b"pwned")]],
        "whiteout through a link": [[L("esc", str(victim))], [F("esc/.wh.secret.txt")]],
        "opaque folder through a link": [[L("esc", rel)], [F("esc/.wh..wh..opq")]],
        "dot-dot in entry names": [[F("../../../VICTIM/x", b"pwned"), F("a/../../VICTIM/secret.txt", b"x")]],
        "/.singularity.d as a link": [[L(".singularity.d", str(victim))]],
        "/etc as a link": [[L("etc", rel), F("etc/passwd", b"root:x:0:0::/root:/bin/sh\n")]],
        "/etc as a link to the host's folder": [[L("etc", str(victim))]],
    }


@pytest.mark.parametrize("fmt,compress", LAYOUTS)
@pytest.mark.parametrize("case", list(_escapes(Path("/V"))))
def test_links_in_the_image_never_reach_outside_the_output_folder(scene, fmt, compress, case):
    tmp, out, victim = scene
    before = snapshot(victim)
    layers = [layer(entries, compress) for entries in _escapes(victim)[case]]
    archive = ARCHIVES[fmt](tmp / "hostile.tar", layers)
    files = assert_held(sif_run(out, archive), out, victim, before, tmp)
    if case.startswith("write through an absolute"):
        assert files[str(victim).lstrip("/") + "/x"][4] == b"pwned"     # inside the image
    if case == "write through a relative link":
        assert files["VICTIM/x"][4] == b"pwned"                       # `..` stops at the root
    if case == "write through a link that replaced a folder":
        assert "d/keep" not in files and files[str(victim).lstrip("/") + "/x"][4] == b"pwned"
    if case == "dot-dot in entry names":
        assert files["VICTIM/x"][4] == b"pwned" and files["VICTIM/secret.txt"][4] == b"x"
    if case == "/.singularity.d as a link":
        assert files[".singularity.d"][0] == tarfile.DIRTYPE
        assert files[".singularity.d/runscript"][4].startswith(b"#!/bin/sh")
    if case.startswith("/etc as a link"):
        assert files["etc"][0] == tarfile.DIRTYPE and files["etc/hosts"][4] == b""
        assert "etc/passwd" not in files              # it went where the link led, inside the image
        if case == "/etc as a link":
            assert files["VICTIM/passwd"][4].startswith(b"root:")


@pytest.mark.parametrize("fmt,compress", LAYOUTS)
def test_a_hard_link_to_a_file_outside_the_image_is_refused(scene, fmt, compress):
    tmp, out, victim = scene
    before = snapshot(victim)
    for target in ("esc/secret.txt", f"{victim}/secret.txt", "../../../VICTIM/secret.txt"):
        layers = [layer([L("esc", str(victim))], compress), layer([H("h", target)], compress)]
        r = sif_run(out, ARCHIVES[fmt](tmp / "hostile.tar", layers))
        assert_held(r, out, victim, before, tmp, code=1)
        assert f"hard link 'h' -> '{target}'" in r.err and "is not in the image" in r.err, r.err


def test_a_compressed_archive_is_read_like_a_plain_one(scene):
    """`docker save | gzip`: decompressed once into the work folder (members are read out of
    order), then the same image."""
    tmp, out, victim = scene
    before = snapshot(victim)
    plain = oci_archive(tmp / "a.tar", [layer([L("esc", str(victim)), F("f", b"1")]), layer([F("esc/x", b"2")])])
    packed = _write(tmp / "a.tar.gz", gzip.compress(plain.read_bytes()))
    files = assert_held(sif_run(out, packed), out, victim, before, tmp)
    assert files["f"][4] == b"1" and files[str(victim).lstrip("/") + "/x"][4] == b"2"


def test_a_link_loop_is_one_message(scene):
    tmp, out, victim = scene
    before = snapshot(victim)
    archive = docker_archive(tmp / "loop.tar", [layer([L("a", "b"), L("b", "/a"), F("a/x", b"1")])])
    r = sif_run(out, archive)
    assert_held(r, out, victim, before, tmp, code=1)
    assert "more than 40 symbolic links on the way" in r.err


def test_an_entry_under_a_file_is_one_message(scene):
    tmp, out, victim = scene
    archive = oci_archive(tmp / "f.tar", [layer([F("f", b"1")]), layer([F("f/x", b"2")])])
    r = sif_run(out, archive)
    assert r.code == 1 and "'f/x' lies under 'f', which the image has as a file, not a folder" in r.err


# --- the OCI rules, on legitimate images ---------------------------------------------------------

@pytest.mark.parametrize("fmt,compress", LAYOUTS)
def test_layers_apply_by_the_oci_rules(scene, fmt, compress):
    tmp, out, victim = scene
    before = snapshot(victim)
    layers = [
        layer([D("usr"), D("usr/lib"), F("usr/lib/a", b"A"), L("lib", "usr/lib"), L("abs", "/usr/lib"),
               D("w"), F("w/gone", b"G"), F("w/kept", b"K"), D("o"), F("o/old", b"O"), D("o/sub"),
               F("o/sub/deep", b"D"), D("r"), F("r/child", b"C"), F("f", b"F"), F("hl-src", b"same"),
               DEV("dev/null"), DEV("fifo", tarfile.FIFOTYPE, 0, 0),
               F("owned", b"u", mode=0o4755, uid=1234, gid=5678), F("caf\udce9", b"latin-1 name"),
               F("long/" + "n" * 255, b"255 bytes")], compress),
        layer([F("lib/b", b"B"), F("abs/c", b"C2"), F("w/.wh.gone"), F("o/.wh..wh..opq"), F("o/new", b"N"),
               F("r", b"now a file"), H("hl", "hl-src"), H("hl2", "lib/a"), F(".wh.f")], compress),
        layer([F("f", b"back"), F("w/.wh.kept"), F("w/kept", b"K2")], compress),
    ]
    files = assert_held(sif_run(out, ARCHIVES[fmt](tmp / "ok.tar", layers)), out, victim, before, tmp)
    assert files["lib"][0] == tarfile.SYMTYPE and files["lib"][4] == "usr/lib"
    assert files["usr/lib/b"][4] == b"B" and files["usr/lib/c"][4] == b"C2"    # through links, inside
    assert "w/gone" not in files and "w/.wh.gone" not in files
    assert files["w/kept"][4] == b"K2"                        # a whiteout hides lower layers only
    assert {k for k in files if k.startswith("o/")} == {"o/new"}             # opaque: lower ones hidden
    assert files["r"][4] == b"now a file" and "r/child" not in files
    assert files["f"][4] == b"back"
    assert files["hl"][4] == b"same" and files["hl2"][4] == b"A"
    hard = {m.name: m for m in _members(out / "img.sif", tmp) if m.islnk()}
    assert hard["hl-src"].linkname == "hl" and hard["usr/lib/a"].linkname == "hl2"      # one inode each
    assert files["dev/null"][0] == tarfile.CHRTYPE and files["fifo"][0] == tarfile.FIFOTYPE
    assert files["owned"][1:4] == (0o4755, 1234, 5678)
    assert files["caf\udce9"][4] == b"latin-1 name" and files["long/" + "n" * 255][4] == b"255 bytes"
    assert not [k for k in files if "/.wh." in "/" + k]


def _members(sif: Path, where: Path) -> list[tarfile.TarInfo]:
    raw = subprocess.run(["sqfs2tar", str(squashfs_of(sif, where))], capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        return tar.getmembers()


def test_the_sif_is_the_same_bytes_twice_and_mounts_for_verify(scene):
    tmp, out, _ = scene
    archive = oci_archive(tmp / "ok.tar", [layer([D("bin"), F("bin/sh", b"#!x", mode=0o755)], "gzip")])
    assert sif_run(out, archive).code == 0
    first = (out / "img.sif").read_bytes()
    assert sif_run(out, archive).code == 0
    assert (out / "img.sif").read_bytes() == first
    from envbuilder.sif import check

    if not (shutil.which("squashfuse") and os.path.exists("/dev/fuse")):
        pytest.skip("squashfuse or /dev/fuse missing: the mount half of verify cannot run here")
    with check.mounted(out / "img.sif", check.structure(out / "img.sif")["partition"]["offset"]) as root:
        assert (root / "bin" / "sh").read_bytes() == b"#!x"
        assert (root / ".singularity.d" / "actions" / "exec").is_file()


# --- malformed archives: one message each -------------------------------------------------------

GOOD = layer([F("a", b"1")])


def _malformed(tmp: Path) -> dict[str, tuple[Path, str]]:
    gz = layer([F("big", os.urandom(200_000))], "gzip")
    plain = layer([F("a", b"x" * 5000)])
    d, o = docker_archive, oci_archive
    return {
        "layer missing": (d(tmp / "1.tar", [GOOD], drop=("l0/layer.tar",)), "is named by the image's manifest but is not in the archive"),
        "truncated gzip layer": (d(tmp / "2.tar", [gz[:len(gz) // 2]]), "is damaged: its gzip stream is truncated or corrupt"),
        "truncated plain layer": (o(tmp / "3.tar", [plain[:2048]]), "is not a readable tar archive (unexpected end of data)"),
        "layer not a tar": (d(tmp / "4.tar", [b"this is not a tar" * 100]), "is not a tar archive"),
        "manifest.json an object": (d(tmp / "5.tar", [GOOD], manifest={"Config": "config.json"}), "manifest.json is a JSON dict, not a list"),
        "Layers a string": (d(tmp / "6.tar", [GOOD], manifest=[{"Config": "config.json", "Layers": "l0/layer.tar"}]), "Layers is not a list of file names"),
        "Config a number": (d(tmp / "7.tar", [GOOD], manifest=[{"Config": 7, "Layers": []}]), "has no Config file name"),
        "manifest.json not JSON": (d(tmp / "8.tar", [GOOD], manifest=b"[{oops"), "is not JSON"),
        "config a list": (d(tmp / "9.tar", [GOOD], config=[1, 2]), "config is a JSON list, not an object"),
        "Env a string": (o(tmp / "10.tar", [GOOD], config={"config": {"Env": "PATH=/bin"}}), "'Env' is a JSON str, not a list"),
        "Env items numbers": (o(tmp / "11.tar", [GOOD], config={"config": {"Env": [1]}}), "config.Env holds an item that is not text"),
        "Labels values numbers": (d(tmp / "12.tar", [GOOD], config={"config": {"Labels": {"a": 1}}}), "Labels holds a value that is not text"),
        "architecture a number": (d(tmp / "13.tar", [GOOD], config={"architecture": 64}), "'architecture' is a JSON int, not text"),
        "index manifests not a list": (o(tmp / "14.tar", [GOOD], index={"manifests": {"a": 1}}), "'manifests' is a JSON dict, not a list"),
        "layer descriptor without digest": (o(tmp / "15.tar", [GOOD], manifest={"config": {"digest": _digest(json.dumps(CONFIG).encode())}, "layers": [{"size": 3}]}), "has no valid digest"),
        "digest climbing out": (o(tmp / "16.tar", [GOOD], index={"manifests": [{"digest": "sha256:../../../VICTIM/secret.txt"}]}), "has no valid digest"),
        "layers not a list": (o(tmp / "17.tar", [GOOD], manifest={"config": {"digest": _digest(json.dumps(CONFIG).encode())}, "layers": "x"}), "'layers' is a JSON str, not a list"),
        "not a tar at all": (_write(tmp / "18.tar", os.urandom(4096)), "is not an image archive"),
        "zstd layer": (o(tmp / "19.tar", [b"\x28\xb5\x2f\xfd" + b"\0" * 100]), "is zstd-compressed"),
        "truncated compressed archive": (_write(tmp / "23.tar.gz", gzip.compress(d(tmp / "23.tar", [GOOD]).read_bytes())[:300]), "the archive 23.tar.gz is damaged: its gzip stream is truncated"),
        "a name past NAME_MAX": (d(tmp / "21.tar", [layer([F("d/" + "y" * 256, b"1")])]), "is longer than a file system takes"),
        "a link to nowhere": (d(tmp / "22.tar", [layer([L("l", "")])]), "has no target"),
        "config missing": (d(tmp / "20.tar", [GOOD], drop=("config.json",)), "is named by the image's manifest but is not in the archive"),
    }


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


MALFORMED = [
    "layer missing", "truncated gzip layer", "truncated plain layer", "layer not a tar", "manifest.json an object",
    "Layers a string", "Config a number", "manifest.json not JSON", "config a list", "Env a string",
    "Env items numbers", "Labels values numbers", "architecture a number", "index manifests not a list",
    "layer descriptor without digest", "digest climbing out", "layers not a list", "not a tar at all",
    "zstd layer", "config missing", "a name past NAME_MAX", "a link to nowhere",
    "truncated compressed archive"]


@pytest.mark.parametrize("case", MALFORMED)
def test_a_malformed_archive_is_one_message(scene, case):
    tmp, out, victim = scene
    before = snapshot(victim)
    existing = out / "img.sif"
    existing.write_bytes(b"an earlier SIF")
    archive, expected = _malformed(tmp)[case]
    r = sif_run(out, archive)
    assert r.code == 1, r.err
    assert "Traceback" not in r.err and "free disk space" not in r.err
    assert "sif: image:" in r.err and expected in r.err, r.err
    assert existing.read_bytes() == b"an earlier SIF"
    assert sorted(p.name for p in out.iterdir()) == ["img.sif", "manifest.json"]
    assert snapshot(victim) == before


# --- the size bound ------------------------------------------------------------------------------

def test_a_layer_that_unpacks_past_the_limit_is_refused(scene):
    tmp, out, victim = scene
    bomb = layer([F("zeros", bytes(8 << 20))], "gzip")             # 8 MiB of zeros in ~8 KB
    assert len(bomb) < 100_000
    r = sif_run(out, docker_archive(tmp / "bomb.tar", [bomb]), "--max-unpacked-size", "2M")
    assert r.code == 1 and "Traceback" not in r.err
    assert "the image's files unpack to more than 2.0 MiB" in r.err and "limit 2.0 MiB" in r.err
    assert "--max-unpacked-size SIZE" in r.err
    assert not list(out.glob("*.sif")) and not [p for p in out.iterdir() if p.name.startswith(".")]
    assert sif_run(out, docker_archive(tmp / "bomb.tar", [bomb]), "--max-unpacked-size", "9M").code == 0


def test_a_sparse_member_counts_at_its_real_size(scene):
    tmp, out, _ = scene
    src = tmp / "sparse-src"
    src.mkdir()
    with open(src / "hole", "wb") as fh:
        fh.truncate(64 << 20)                                     # 64 MiB, no data
    raw = subprocess.run(["tar", "--sparse", "--format=gnu", "-cf", "-", "-C", str(src), "hole"],
                         capture_output=True, check=True).stdout
    assert len(raw) < 100_000
    with tarfile.open(fileobj=io.BytesIO(raw)) as t:
        assert t.getmember("hole").type == tarfile.GNUTYPE_SPARSE
    for fmt in ("docker", "oci"):
        archive = ARCHIVES[fmt](tmp / "sparse.tar", [gzip.compress(raw, mtime=0)])
        r = sif_run(out, archive, "--max-unpacked-size", "16M")
        assert r.code == 1 and "more than 16.0 MiB (at least 64.0 MiB so far" in r.err, r.err
    r = sif_run(out, archive, "--max-unpacked-size", "1G")
    assert r.code == 0, r.err
    files = contents(out / "img.sif", tmp)
    assert files["hole"][4] == bytes(64 << 20)


def test_the_size_option_needs_a_size(scene):
    tmp, out, _ = scene
    r = sif_run(out, docker_archive(tmp / "a.tar", [GOOD]), "--max-unpacked-size", "lots")
    assert r.code == 2 and "'lots' is not a size" in r.err


# --- names that become files or lines -------------------------------------------------------------

def test_the_manifests_name_must_be_a_plain_file_name(scene):
    tmp, out, _ = scene
    elsewhere = tmp / "elsewhere"
    elsewhere.mkdir()
    archive = docker_archive(tmp / "a.tar", [GOOD])
    for name in (str(elsewhere / "x"), "../x", "a/b", "x\ny", ".."):
        (out / "manifest.json").write_text(json.dumps({"name": name, "expect": {}}))
        r = sif_run(out, archive)
        assert r.code == 2 and "manifest.json: name:" in r.err and "is not a plain file name" in r.err, r.err
        assert "Traceback" not in r.err
    assert list(elsewhere.iterdir()) == [] and not list(tmp.glob("*.sif"))
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json"]


def test_an_archive_name_with_a_newline_cannot_add_lines_to_def_file(scene):
    tmp, out, _ = scene
    archive = docker_archive(tmp / "x.tar\n%post\ntouch pwned\n", [GOOD])
    r = sif_run(out, archive)
    assert r.code == 2 and "holds a newline or another control character" in r.err, r.err
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json"]


def test_an_env_name_ending_in_a_newline_is_skipped_and_dash_reads_the_script(scene):
    tmp, out, _ = scene
    config = {"config": {"Env": ["PATH=/usr/bin:/bin", "BAD\n=1", "GOOD=2", "A B=3", "X=a\nb"]}}
    r = sif_run(out, oci_archive(tmp / "env.tar", [GOOD], config=config))
    assert r.code == 0, r.err
    script = contents(out / "img.sif", tmp)[".singularity.d/env/10-docker2singularity.sh"][4].decode()
    assert "BAD" not in script and "A B" not in script
    dash = shutil.which("dash") or "/bin/sh"
    proc = subprocess.run([dash, "-c", '. /dev/stdin; printf "%s|%s" "$GOOD" "$X"'], input=script,
                          capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0 and proc.stdout == "2|a\nb", proc.stderr


# --- as a non-root user ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def plain_user():
    if os.geteuid() != 0:
        pytest.skip("making a user to run as needs root")
    try:
        pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", USER],
                       check=True)
    entry = pwd.getpwnam(USER)
    return entry.pw_uid, entry.pw_gid


def run_as(user: str, *args: str):
    """envbuilder as USER: USER's own venv with envbuilder's dependencies (this one lies under
    /root), the checkout on PYTHONPATH."""
    python = user_python(user, Path(f"/tmp/envb-{user}-venv"))
    env = {"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "PYTHONPATH": str(ROOT), "HOME": "/tmp",
           "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.run(["runuser", "-u", user, "--", python, "-m", "envbuilder", *args],
                          capture_output=True, text=True, env=env, cwd="/tmp", timeout=300)
    return proc


def test_a_non_root_user_makes_the_sif_with_the_images_owners(plain_user):
    uid, gid = plain_user
    base = Path(tempfile.mkdtemp(prefix="envb-sif-user-", dir="/tmp"))
    try:
        os.chmod(base, 0o755)
        out, victim = base / "out", base / "VICTIM"
        out.mkdir()
        (victim / "sub").mkdir(parents=True)
        (victim / "secret.txt").write_bytes(SECRET)
        os.chmod(victim, 0o777)                  # writable by the user: a wrong step would show
        (out / "manifest.json").write_text(json.dumps({"name": "img", "expect": {}}))
        os.chown(out, uid, gid)
        before = snapshot(victim)
        layers = [layer([D("etc", mode=0o755), F("etc/shadow", b"root:*:1::::::\n", mode=0o640, gid=42),
                         D("root", mode=0o700), F("root/.profile", b"p"), F("usr/bin/su", b"su", mode=0o4755),
                         F("home/u/file", b"u", uid=1000, gid=1000), L("esc", str(victim))], "gzip"),
                  layer([F("esc/.wh.secret.txt"), F("esc/.wh..wh..opq"), F("esc/x", b"pwned")], "gzip")]
        archive = oci_archive(base / "image.oci.tar", layers)
        os.chmod(archive, 0o644)
        proc = run_as(USER, "sif", str(out), "--archive", str(archive))
        assert proc.returncode == 0, proc.stderr
        assert "Cannot change ownership" not in proc.stderr
        assert snapshot(victim) == before
        listing = subprocess.run(["unsquashfs", "-lln", str(squashfs_of(out / "img.sif", base))],
                                 capture_output=True, text=True, check=True).stdout
        owners = {line.split("squashfs-root/", 1)[1].split(" -> ")[0]: (line.split()[0], line.split()[1])
                  for line in listing.splitlines() if "squashfs-root/" in line}
        assert owners["etc/shadow"] == ("-rw-r-----", "0/42")
        assert owners["root"] == ("drwx------", "0/0")
        assert owners["usr/bin/su"] == ("-rwsr-xr-x", "0/0")
        assert owners["home/u/file"][1] == "1000/1000"
        assert owners[".singularity.d/runscript"] == ("-rwxr-xr-x", "0/0")
        assert (out / "img.sif").stat().st_uid == uid
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_an_output_folder_without_room_for_the_images_files_is_one_message(scene):
    """The check made once the headers are read (the files' total, before the SquashFS is written)
    and a disk that fills all the same (ENOSPC): one message each, no partial SIF, no work folder
    left. Only ENOSPC says "free disk space" (the malformed cases above check that they do not)."""
    tmp, _, _ = scene
    with small_tmpfs(tmp / "small", "4m") as small:
        out = small / "out"
        out.mkdir()
        (out / "manifest.json").write_text(json.dumps({"name": "img", "expect": {}}))
        # a plain layer is read in place: refused by the check, before anything is written
        archive = docker_archive(tmp / "big.tar", [layer([F("zeros", bytes(6 << 20))])])
        r = sif_run(out, archive)
        assert r.code == 1 and "Traceback" not in r.err, r.err
        assert "no room:" in r.err and f"free under {out}" in r.err and "making the SIF needs about" in r.err
        assert sorted(p.name for p in out.iterdir()) == ["manifest.json"]
        # a gzip layer is decompressed into the work folder first: the disk fills (ENOSPC)
        archive = docker_archive(tmp / "big.tar", [layer([F("zeros", bytes(6 << 20))], "gzip")])
        r = sif_run(out, archive)
        assert r.code == 1 and "Traceback" not in r.err, r.err
        assert f"no room left on the device under {out}" in r.err and "free disk space there" in r.err
        assert sorted(p.name for p in out.iterdir()) == ["manifest.json"]
