"""What an image holds, read from its file tree (nothing is run in it): every path with its type,
mode, owner, size, link target and content hash; the Python distributions of every
site-packages/dist-packages folder and of /opt/packages (their METADATA: name==version); the OS
packages dpkg lists as installed (/var/lib/dpkg/status: name=version). And the difference between two images:
`envbuilder compare A B`, e.g. Apptainer's .sif of a lock against the Dockerfile's image of it.

An image in buildah's storage is read through a mounted working container (root); one in the
Docker engine through `docker export` of a created (never started) container, as a tar stream;
a .sif file through its SquashFS partition mounted read-only with squashfuse (as `verify x.sif`
mounts it), whoever wrote it (`apptainer build` or `envbuilder build --sif`)."""

from __future__ import annotations

import hashlib
import os
import posixpath
import re
import shutil
import stat
import subprocess
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from .errors import CheckFailed, EnvbuilderError
from .paths import PACKAGES_DIR

# a distribution's metadata: wheels' dist-info/METADATA; setuptools' egg-info (a folder with PKG-INFO,
# or one file, as Debian's python3-* packages install it); in a site-packages/dist-packages folder
# or in PACKAGES_DIR (the spec's packages, pip --target)
METADATA = re.compile(r"^(/(?:.*/)?(?:site|dist)-packages|" + re.escape(PACKAGES_DIR) + r")/[^/]+"
                      r"(?:\.dist-info/METADATA|\.egg-info/PKG-INFO|\.egg-info)$")
DPKG_STATUS = "/var/lib/dpkg/status"
# what a container engine puts into every container's file tree (docker export shows them; they
# are bind targets at run time, Apptainer's included): not compared
RUNTIME_PATHS = ("/.dockerenv", "/dev/console", "/dev/pts", "/dev/shm", "/etc/mtab", "/etc/hosts",
                 "/etc/resolv.conf", "/etc/hostname")
# what only a .sif holds: the runtime's metadata folder and its links (Apptainer's and envbuilder's
# SIFs alike), and the bind points Apptainer's build creates empty; listed as "only in", never a
# reason to fail
SIF_ONLY = ("/.singularity.d", "/environment", "/singularity", "/.exec", "/.run", "/.shell", "/.test")
SHOWN = 40          # paths printed per kind of difference (all are in --json)


@dataclass
class Contents:
    ref: str
    where: str                                          # buildah / docker / sif
    files: dict[str, tuple] = field(default_factory=dict)   # path -> (type, mode, uid, gid, size, link, sha256)
    python: dict[str, str] = field(default_factory=dict)    # "name==version" -> folder
    dpkg: set[str] = field(default_factory=set)             # "name=version"


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _metadata(path: str, data: bytes, out: Contents) -> None:
    name = version = None
    for line in data.decode("utf-8", errors="replace").splitlines():
        if not line.strip():
            break
        if line.startswith("Name:"):
            name = line.split(":", 1)[1].strip()
        elif line.startswith("Version:"):
            version = line.split(":", 1)[1].strip()
    if name and version:
        match = METADATA.match(path)
        out.python[f"{_canonical(name)}=={version}"] = match.group(1) if match else posixpath.dirname(path)


def _dpkg(data: bytes, out: Contents) -> None:
    for para in data.decode("utf-8", errors="replace").split("\n\n"):
        fields = dict(line.split(":", 1) for line in para.splitlines() if ":" in line and not line.startswith(" "))
        status = fields.get("Status", "").split()
        if fields.get("Package") and status[-1:] == ["installed"]:
            out.dpkg.add(f"{fields['Package'].strip()}={fields.get('Version', '').strip()}")


def _hash(fh: IO[bytes]) -> tuple[str, bytes | None, int]:
    h = hashlib.sha256()
    size = 0
    while True:
        chunk = fh.read(1 << 20)
        if not chunk:
            break
        h.update(chunk)
        size += len(chunk)
    return h.hexdigest(), None, size


def _note(path: str, read, out: Contents) -> None:
    if METADATA.match(path):
        _metadata(path, read(), out)
    elif path == DPKG_STATUS:
        _dpkg(read(), out)


def _walk(root: Path, out: Contents) -> None:
    for folder, dirs, names in os.walk(root):
        for name in dirs + names:
            full = Path(folder) / name
            st = full.lstat()
            path = "/" + full.relative_to(root).as_posix()
            kind = "dir" if stat.S_ISDIR(st.st_mode) else "link" if stat.S_ISLNK(st.st_mode) else \
                "file" if stat.S_ISREG(st.st_mode) else "other"
            link = os.readlink(full) if kind == "link" else ""
            digest = ""
            if kind == "file":
                with open(full, "rb") as fh:
                    digest = _hash(fh)[0]
                _note(path, full.read_bytes, out)
            out.files[path] = (kind, stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid,
                               st.st_size if kind == "file" else 0, link, digest)
        dirs[:] = [d for d in dirs if not (Path(folder) / d).is_symlink()]


def _from_buildah(ref: str) -> Contents:
    out = Contents(ref, "buildah")
    proc = subprocess.run(["buildah", "from", "--pull=false", ref], capture_output=True, text=True)
    if proc.returncode != 0:
        raise CheckFailed("compare", f"buildah cannot open {ref}: {proc.stderr.strip()[-300:]}", "")
    ctr = proc.stdout.strip().splitlines()[-1]
    try:
        mount = subprocess.run(["buildah", "mount", ctr], capture_output=True, text=True, check=True)
        _walk(Path(mount.stdout.strip().splitlines()[-1]), out)
    finally:
        subprocess.run(["buildah", "rm", ctr], capture_output=True)
    return out


def _tar_path(name: str) -> str:
    """A member name of `docker export` ("./etc/x", "etc/x") as an absolute path."""
    name = name[2:] if name.startswith("./") else name
    return "/" + name.strip("/")


def _from_docker(ref: str, docker: str) -> Contents:
    out = Contents(ref, "docker")
    proc = subprocess.run([docker, "create", ref, "/bin/true"], capture_output=True, text=True)
    if proc.returncode != 0:
        raise CheckFailed("compare", f"docker cannot open {ref}: {proc.stderr.strip()[-300:]}", "")
    ctr = proc.stdout.strip()
    try:
        export = subprocess.Popen([docker, "export", ctr], stdout=subprocess.PIPE)
        assert export.stdout is not None
        with tarfile.open(fileobj=export.stdout, mode="r|") as tar:
            for m in tar:
                path = _tar_path(m.name)
                if path == "/":
                    continue
                kind = "dir" if m.isdir() else "link" if m.issym() else "file" if m.isreg() else \
                    "hardlink" if m.islnk() else "other"
                digest = ""
                if kind == "file":
                    fh = tar.extractfile(m)
                    assert fh is not None
                    data = fh.read() if (METADATA.match(path) or path == DPKG_STATUS) else None
                    if data is not None:
                        digest = hashlib.sha256(data).hexdigest()
                        _note(path, lambda d=data: d, out)
                    else:
                        digest = _hash(fh)[0]
                elif kind == "hardlink":        # the same file as an earlier member: its size and content
                    first = out.files.get(_tar_path(m.linkname))
                    if first is not None:
                        out.files[path] = (first[0], m.mode & 0o7777, m.uid, m.gid, first[4], "", first[6])
                        continue
                out.files[path] = (kind, m.mode & 0o7777, m.uid, m.gid, m.size if kind == "file" else 0,
                                   m.linkname if kind == "link" else "", digest)
        export.wait()
    finally:
        subprocess.run([docker, "rm", "-f", ctr], capture_output=True)
    return out


def _from_sif(path: Path) -> Contents:
    """Only the primary SquashFS partition is read: Apptainer's .sif has no envbuilder objects
    (labels, SBOM), so verify's structure check, which asks for them, is not this one."""
    from .sif import check, layout

    out = Contents(str(path), "sif")
    fix = "give a .sif made by `apptainer build` or `envbuilder build --sif`, or an image tag"
    try:
        _, descriptors = layout.read(path)
    except layout.NotSif as exc:
        raise EnvbuilderError("IMAGE", str(exc), fix) from None
    part = layout.primary_partition(descriptors)
    if part is None or part.fstype != layout.FS_SQUASH:
        raise EnvbuilderError("IMAGE", f"{path} has no SquashFS system partition to read", fix)
    with check.mounted(path, part.offset) as root:
        _walk(root, out)
    return out


def read_image(ref: str, fix: str = "give a .sif file, or an image tag (manifest.json image.tag), built "
               "first: envbuilder build SPEC") -> Contents:
    """The contents of REF: a .sif file when REF names one, else an image of the Docker engine,
    else one of buildah's storage."""
    if ref.endswith(".sif") or Path(ref).is_file():
        path = Path(ref)
        if not path.is_file():
            raise EnvbuilderError("IMAGE", f"{ref}: no such .sif file", fix)
        return _from_sif(path)
    # the Docker engine first: `envbuilder build`'s default engine, and where `--engine buildah`
    # hands its image too (a stale buildah image under the same tag is never read before it)
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "image", "inspect", ref], capture_output=True).returncode == 0:
        return _from_docker(ref, docker)
    buildah = shutil.which("buildah")
    if buildah and subprocess.run([buildah, "inspect", "--type", "image", ref], capture_output=True).returncode == 0:
        if os.geteuid() != 0:
            raise EnvbuilderError("IMAGE", "reading an image from buildah's storage needs root (buildah mount)",
                                  "run as root, or give an image the Docker engine holds")
        return _from_buildah(ref)
    raise EnvbuilderError("IMAGE", f"image {ref} is neither a .sif file, nor in buildah's storage, nor in the "
                          "Docker engine", fix)


WHAT = ("type", "mode", "owner", "group", "size", "link target", "content")


def _collapse(paths: set[str]) -> list[tuple[str, int]]:
    """Paths whose parent is not in the set, each with how many of the set lie at or under it."""
    top = sorted(p for p in paths if p.rsplit("/", 1)[0] not in paths)
    counts = {t: 0 for t in top}
    for p in paths:
        q = p
        while q and q not in counts:
            q = q.rsplit("/", 1)[0]
        if q in counts:
            counts[q] += 1
    return [(t, counts[t]) for t in top]


def compare_images(a_ref: str, b_ref: str) -> dict:
    """A and B: e.g. the definition file's .sif and the Dockerfile's image of the same lock. Files by
    path; packages by name and version. Modification times are not compared (cp -r and COPY set
    them differently)."""
    a = read_image(a_ref)
    b = read_image(b_ref)
    for c in (a, b):
        for path in RUNTIME_PATHS:
            c.files.pop(path, None)
        if c.where == "sif":
            for path in [p for p in c.files if p in SIF_ONLY or p.startswith("/.singularity.d/")]:
                del c.files[path]
    only_a = set(a.files) - set(b.files)
    only_b = set(b.files) - set(a.files)
    differ = {}
    for path in sorted(set(a.files) & set(b.files)):
        fa, fb = a.files[path], b.files[path]
        if fa != fb:
            fields = [WHAT[i] for i in range(len(WHAT)) if fa[i] != fb[i]]
            if fields == ["size"] and fa[0] == "dir":
                continue
            differ[path] = fields
    py_a, py_b = set(a.python), set(b.python)
    return {
        "a": {"ref": a_ref, "from": a.where, "files": len(a.files), "python": len(py_a), "dpkg": len(a.dpkg)},
        "b": {"ref": b_ref, "from": b.where, "files": len(b.files), "python": len(py_b), "dpkg": len(b.dpkg)},
        "python": {"same": len(py_a & py_b), "only_a": sorted(py_a - py_b), "only_b": sorted(py_b - py_a)},
        "dpkg": {"same": len(a.dpkg & b.dpkg), "only_a": sorted(a.dpkg - b.dpkg), "only_b": sorted(b.dpkg - a.dpkg)},
        "files": {"same": len(set(a.files) & set(b.files)) - len(differ),
                  "only_a": [{"path": p, "entries": n} for p, n in _collapse(only_a)],
                  "only_b": [{"path": p, "entries": n} for p, n in _collapse(only_b)],
                  "differ": [{"path": p, "what": w} for p, w in differ.items()]},
        "not_compared": list(RUNTIME_PATHS) + (list(SIF_ONLY) if "sif" in (a.where, b.where) else []),
        "same_packages": py_a == py_b and a.dpkg == b.dpkg,
    }


def print_comparison(diff: dict) -> None:
    a, b = diff["a"], diff["b"]
    for label, x in (("A", a), ("B", b)):
        print(f"{label} ({x['from']}): {x['ref']}  [{x['files']} paths, {x['python']} Python, {x['dpkg']} OS packages]")
    for key, title, sep in (("python", "Python packages", "name==version"), ("dpkg", "OS packages (dpkg)", "name=version")):
        d = diff[key]
        if not d["only_a"] and not d["only_b"]:
            print(f"{title}: the same ({d['same']}, {sep})")
            continue
        print(f"{title}: {d['same']} the same, {len(d['only_a'])} only in A, {len(d['only_b'])} only in B ({sep})")
        for item in d["only_a"]:
            print(f"  A only  {item}")
        for item in d["only_b"]:
            print(f"  B only  {item}")
    f = diff["files"]
    print(f"files: {f['same']} the same; {sum(x['entries'] for x in f['only_a'])} only in A, "
          f"{sum(x['entries'] for x in f['only_b'])} only in B, {len(f['differ'])} differ (times not compared, nor "
          f"the runtime's paths {', '.join(diff['not_compared'])})")
    for key, label in (("only_a", "A only "), ("only_b", "B only ")):
        for item in f[key][:SHOWN]:
            more = f"  ({item['entries']} entries)" if item["entries"] > 1 else ""
            print(f"  {label} {item['path']}{more}")
        if len(f[key]) > SHOWN:
            print(f"  {label} ... and {len(f[key]) - SHOWN} more (--json lists all)")
    for item in f["differ"][:SHOWN]:
        print(f"  differ  {item['path']}: {', '.join(item['what'])}")
    if len(f["differ"]) > SHOWN:
        print(f"  differ  ... and {len(f['differ']) - SHOWN} more (--json lists all)")
