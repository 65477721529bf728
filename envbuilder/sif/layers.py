"""Image layers -> one flattened tree, in memory, never on disk.

Only the layers' tar HEADERS are read to build the tree (Python tarfile); file contents stay
where they are (inside the archive for plain layers, in one decompressed scratch file per
compressed layer) and are copied into ONE tar stream at the end (`emit`), which tar2sqfs turns
into the SquashFS. Nothing of an image is ever extracted, so no link in it can send a write, a
delete or a read to the host.

The OCI image-spec rules (layer.md "Whiteouts", "Changesets"):
    a later entry replaces an earlier one; a directory over a directory keeps its children; any
    other replacement drops what was there (a file over a directory drops its children);
    `.wh.NAME` hides NAME (and what is under it) of the lower layers; `.wh..wh..opq` hides the
    lower layers' children of its folder; whiteouts act before the layer's own entries and never
    appear in the result; other `.wh..wh.*` (aufs bookkeeping) are ignored.
Paths are resolved inside the tree the way securejoin/umoci resolve them inside a root: names
are cleaned, every PARENT component that is a symlink is followed within the tree (an absolute
target is taken from the image root, `..` never climbs above the root, 40 hops at most), the
last component is never followed. A missing parent becomes a folder (0755, root), as tar does.
Hard links name an entry of the merged tree (resolved the same way); a missing one, or a folder,
is refused. Device nodes and FIFOs are kept as headers (tar2sqfs records them).
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import posixpath
import re
import tarfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import CheckFailed

WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"
MAX_HOPS = 40                     # Linux's MAXSYMLINKS
MAX_PATH = 4096                   # PATH_MAX
MAX_NAME = 255                    # NAME_MAX (SquashFS takes 256; tar2sqfs writes longer, corrupt)
MAX_ENTRIES = 1_000_000           # headers in all layers: bounds the tree's memory (~1.5 KB each)
SIZE_OPTION = "--max-unpacked-size"
DEFAULT_MAX_UNPACKED = 64 << 30
KINDS = {tarfile.REGTYPE: "file", tarfile.AREGTYPE: "file", tarfile.CONTTYPE: "file",
         tarfile.GNUTYPE_SPARSE: "file", tarfile.DIRTYPE: "dir", tarfile.SYMTYPE: "symlink",
         tarfile.CHRTYPE: "char", tarfile.BLKTYPE: "block", tarfile.FIFOTYPE: "fifo"}
OUT_TYPES = {"file": tarfile.REGTYPE, "dir": tarfile.DIRTYPE, "symlink": tarfile.SYMTYPE,
             "char": tarfile.CHRTYPE, "block": tarfile.BLKTYPE, "fifo": tarfile.FIFOTYPE}


def broken(reason: str, fix: str = "rebuild the image, or give an archive made by `docker save` "
           "or `buildah push IMAGE oci-archive:FILE`") -> CheckFailed:
    return CheckFailed("sif: image", reason, fix)


def too_big(total: int, limit: int) -> CheckFailed:
    return CheckFailed("sif: image", f"the image's files unpack to more than {human(limit)} "
                       f"(at least {human(total)} so far; limit {human(limit)})",
                       f"if the image is meant to be that large, raise the limit: {SIZE_OPTION} SIZE "
                       "(e.g. 200G)")


def human(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} bytes"


def parse_size(text: str) -> int:
    """`64G`, `500M`, `1.5T`, `4096` (bytes; K/M/G/T are powers of 1024)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*", str(text), re.IGNORECASE)
    if not m:
        raise ValueError(text)
    return int(float(m.group(1)) * (1 << (10 * " KMGT".index(m.group(2).upper() or " "))))


@dataclass(eq=False)
class Node:
    """One inode of the merged tree; hard links share one Node."""

    kind: str                                    # file dir symlink char block fifo
    mode: int = 0o755
    uid: int = 0
    gid: int = 0
    linkname: str = ""
    size: int = 0
    devmajor: int = 0
    devminor: int = 0
    source: tuple | None = None                 # (layer index, TarInfo) of a file's content
    data: bytes | None = None                   # content given directly (the SIF's own files)
    children: dict[str, "Node"] = field(default_factory=dict)


def new_dir(mode: int = 0o755) -> Node:
    return Node("dir", mode=mode)


class Tree:
    def __init__(self) -> None:
        self.root = new_dir()

    # --- resolution inside the tree -------------------------------------------------------

    def walk(self, path: str, *, create: bool, where: str = "") -> tuple[Node | None, str]:
        """(the folder that holds PATH's last component, that component), parents resolved
        inside the tree; None when a parent is missing and CREATE is false."""
        parts = clean(path)
        if not parts:
            return None, ""
        folder = self._folder(parts[:-1], create=create, where=where or path)
        return folder, parts[-1]

    def _folder(self, parts: list[str], *, create: bool, where: str) -> Node | None:
        stack: list[Node] = [self.root]
        todo = list(reversed(parts))
        hops = 0
        while todo:
            name = todo.pop()
            if name in ("", "."):
                continue
            if name == "..":
                if len(stack) > 1:
                    stack.pop()
                continue
            here = stack[-1]
            node = here.children.get(name)
            if node is None:
                if not create:
                    return None
                node = here.children[name] = new_dir()
            if node.kind == "symlink":
                hops += 1
                if hops > MAX_HOPS:
                    raise broken(f"{where!r}: more than {MAX_HOPS} symbolic links on the way (a loop?)")
                target = node.linkname
                if target.startswith("/"):
                    del stack[1:]
                todo.extend(reversed(target.split("/")))
                continue
            if node.kind != "dir":
                if not create:
                    return None
                raise broken(f"{where!r} lies under {name!r}, which the image has as a "
                             f"{node.kind}, not a folder")
            stack.append(node)
        return stack[-1]

    def get(self, path: str) -> Node | None:
        """The node at PATH (last component not followed), or None."""
        if not clean(path):
            return self.root
        folder, name = self.walk(path, create=False)
        return folder.children.get(name) if folder is not None else None

    # --- the layer rules ------------------------------------------------------------------

    def whiteout(self, name: str) -> None:
        parent, base = posixpath.split(posixpath.normpath("/" + name))
        if base == OPAQUE:
            folder = self.get(parent)
            if folder is not None and folder.kind == "dir":
                folder.children.clear()
            return
        if base.startswith(WHITEOUT + WHITEOUT):          # aufs bookkeeping (.wh..wh.plnk ...)
            return
        hidden = base[len(WHITEOUT):]
        if hidden in ("", ".", ".."):
            raise broken(f"whiteout entry {name!r} names no file")
        folder, _ = self.walk(posixpath.join(parent, hidden), create=False)
        if folder is not None:
            folder.children.pop(hidden, None)

    def put(self, name: str, node: Node) -> None:
        parts = clean(name)
        if not parts:                                      # "./": the root's own attributes
            if node.kind == "dir":
                self.root.mode, self.root.uid, self.root.gid = node.mode, node.uid, node.gid
            return
        folder, base = self.walk(name, create=True)
        old = folder.children.get(base)
        if node.kind == "dir" and old is not None and old.kind == "dir":
            old.mode, old.uid, old.gid = node.mode, node.uid, node.gid
            return
        folder.children[base] = node

    def hardlink(self, name: str, target: str) -> None:
        node = self.get(target) if clean(target) else None
        if node is None:
            raise broken(f"hard link {name!r} -> {target!r}: {target!r} is not in the image "
                         "(a hard link must name a file of the image itself)")
        if node.kind == "dir":
            raise broken(f"hard link {name!r} -> {target!r}: {target!r} is a folder")
        self.put(name, node)


def clean(path: str) -> list[str]:
    """PATH's components inside the root, `..` stopped at the root (lexically)."""
    norm = posixpath.normpath("/" + path)
    return [p for p in norm.split("/") if p]


# --- reading the layers ---------------------------------------------------------------------

MAGIC = ((b"\x1f\x8b", "gzip"), (b"BZh", "bzip2"), (b"\xfd7zXZ\x00", "xz"), (b"\x28\xb5\x2f\xfd", "zstd"))


def compression(head: bytes) -> str | None:
    for magic, name in MAGIC:
        if head.startswith(magic):
            return name
    return None


class Budget:
    """The unpacked size, counted as headers are read (logical sizes: a sparse file's real
    size) and as compressed layers are decompressed to scratch."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.files = 0
        self.entries = 0

    def add(self, size: int) -> None:
        self.files += size
        self.entries += 1
        if self.files > self.limit:
            raise too_big(self.files, self.limit)
        if self.entries > MAX_ENTRIES:
            raise broken(f"the image's layers hold more than {MAX_ENTRIES:,} entries")


def decompress(fh, kind: str, dest: Path, limit: int, member: str) -> None:
    """FH's KIND stream into DEST, at most LIMIT bytes; damage is one message. MEMBER names
    what is read: a layer's member name, or "the archive NAME"."""
    opener = {"gzip": gzip.GzipFile, "bzip2": bz2.BZ2File, "xz": lzma.LZMAFile}.get(kind)
    if opener is None:
        raise broken(f"{_what(member)} is {kind}-compressed, which envbuilder does not read",
                     "save the image with gzip or uncompressed layers (docker save; buildah push "
                     "--compression-format gzip)")
    written = 0
    try:
        with opener(fileobj=fh) as src, open(dest, "wb") as out:
            while True:
                chunk = src.read(1 << 20)
                if not chunk:
                    break
                written += len(chunk)
                if written > limit:
                    raise too_big(written, limit)
                out.write(chunk)
    except (EOFError, OSError, zlib.error, lzma.LZMAError) as exc:
        if isinstance(exc, OSError) and exc.errno is not None:
            raise                                          # the disk's own errors: ENOSPC ...
        raise broken(f"{_what(member)} is damaged: its {kind} stream is truncated or corrupt "
                     f"({exc})") from None


def _what(member: str) -> str:
    return member if member.startswith("the archive ") else f"layer {member}"


def read_layer(tree: Tree, index: int, layer: tarfile.TarFile, member: str, budget: Budget,
               length: int | None = None) -> None:
    """Apply one layer's headers to TREE: whiteouts first (they hide the layers below), then
    the entries in order."""
    try:
        infos = []
        for info in layer:
            budget.add(info.size if info.isreg() else 0)
            infos.append(info)
    except (tarfile.TarError, EOFError, zlib.error) as exc:
        raise broken(f"layer {member} is not a readable tar archive ({exc})") from None
    if length is not None and layer.offset > length:
        raise broken(f"layer {member} is truncated: its last entry runs past the end of the layer")
    for info in infos:
        base = posixpath.basename(info.name.rstrip("/"))
        if base.startswith(WHITEOUT):
            tree.whiteout(info.name.rstrip("/"))
    for info in infos:
        name = info.name
        encoded = name.encode("utf-8", "surrogateescape")
        if len(encoded) > MAX_PATH or any(len(part) > MAX_NAME for part in encoded.split(b"/")):
            raise broken(f"layer {member}: entry {name[:60]!r}... is longer than a file system takes "
                         f"({MAX_NAME} bytes a name, {MAX_PATH} a path)")
        if posixpath.basename(name.rstrip("/")).startswith(WHITEOUT):
            continue
        if info.islnk():
            tree.hardlink(name, info.linkname)
            continue
        kind = KINDS.get(info.type)
        if kind is None:
            raise broken(f"layer {member}: entry {name!r} has tar type {info.type!r}, which is not a "
                         "file, folder, link, device or FIFO")
        node = Node(kind, mode=info.mode & 0o7777, uid=info.uid, gid=info.gid,
                    linkname=info.linkname if kind == "symlink" else "", size=info.size if kind == "file" else 0,
                    devmajor=info.devmajor, devminor=info.devminor,
                    source=(index, info) if kind == "file" else None)
        if kind == "symlink" and not 0 < len(info.linkname.encode("utf-8", "surrogateescape")) < MAX_PATH:
            raise broken(f"layer {member}: symbolic link {name[:60]!r} has no target or one longer "
                         f"than {MAX_PATH} bytes")
        tree.put(name, node)


def total_size(tree: Tree) -> int:
    seen, total, todo = set(), 0, [tree.root]
    while todo:
        node = todo.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        total += node.size if node.kind == "file" else 0
        todo.extend(node.children.values())
    return total


# --- the SIF's own files -------------------------------------------------------------------

def ensure_folder(tree: Tree, path: str, *, follow: bool) -> Node:
    """The folder at PATH, made where missing. FOLLOW: a symlink on the way is followed inside
    the tree when it leads to a folder of the image; otherwise (never for /.singularity.d) a
    link, file or dangling link on the way is REPLACED by a folder."""
    here = tree.root
    done: list[str] = []
    for name in clean(path):
        node = here.children.get(name)
        if node is not None and node.kind == "symlink" and follow:
            try:
                target = tree.get(posixpath.join("/", *done, name) + "/.")
            except CheckFailed:
                target = None
            if target is not None and target.kind == "dir":
                here, done = target, done + [name]
                continue
        if node is None or node.kind != "dir":
            node = here.children[name] = new_dir()
        here, done = node, done + [name]
    return here


def add_file(tree: Tree, path: str, data: bytes, mode: int, *, follow_parents: bool = False) -> None:
    """PATH holds DATA (owned by root): whatever the image had there is replaced."""
    parent, base = posixpath.split(path)
    folder = ensure_folder(tree, parent, follow=follow_parents)
    folder.children[base] = Node("file", mode=mode, size=len(data), data=data)


def add_symlink(tree: Tree, path: str, target: str) -> None:
    parent, base = posixpath.split(path)
    folder = ensure_folder(tree, parent, follow=False)
    folder.children[base] = Node("symlink", mode=0o777, linkname=target)


# --- the one tar stream ---------------------------------------------------------------------

def emit(tree: Tree, out, layer_file, epoch: int) -> None:
    """The tree as one tar stream on OUT, folders before their contents, names sorted (bytes),
    every time EPOCH, owners numeric, no user/group names; a node seen twice is a hard link
    to the first name. LAYER_FILE(index) gives an open TarFile for a layer's content."""
    first: dict[int, str] = {}
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(_info(".", tree.root, epoch))
        todo = [("", tree.root)]
        while todo:
            prefix, folder = todo.pop()
            names = sorted(folder.children, key=lambda n: n.encode("utf-8", "surrogateescape"))
            subdirs = []
            for name in names:
                node = folder.children[name]
                path = f"{prefix}{name}"
                if node.kind != "dir" and id(node) in first:
                    info = tarfile.TarInfo(path)
                    info.type, info.linkname, info.mtime = tarfile.LNKTYPE, first[id(node)], epoch
                    tar.addfile(info)
                    continue
                first[id(node)] = path
                info = _info(path, node, epoch)
                if node.kind == "file":
                    tar.addfile(info, _content(node, layer_file))
                else:
                    tar.addfile(info)
                if node.kind == "dir":
                    subdirs.append((path + "/", node))
            todo.extend(reversed(subdirs))


def _info(path: str, node: Node, epoch: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(path)
    info.type = OUT_TYPES[node.kind]
    info.mode, info.uid, info.gid, info.mtime = node.mode, node.uid, node.gid, epoch
    info.uname = info.gname = ""
    info.linkname = node.linkname
    info.size = node.size if node.kind == "file" else 0
    info.devmajor, info.devminor = node.devmajor, node.devminor
    return info


def _content(node: Node, layer_file):
    if node.data is not None:
        return io.BytesIO(node.data)
    index, info = node.source
    fh = layer_file(index).extractfile(info)
    return _Exact(fh, node.size, info.name)


class _Exact(io.RawIOBase):
    """A member's content that must be SIZE bytes: a layer cut short is a message, not a
    tar stream that tar2sqfs reads wrong."""

    def __init__(self, fh, size: int, name: str) -> None:
        self.fh, self.left, self.name = fh, size, name

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        try:
            data = self.fh.read(self.left if n < 0 else min(n, self.left))
        except (tarfile.TarError, EOFError, zlib.error) as exc:
            raise broken(f"the content of {self.name!r} cannot be read ({exc})") from None
        if not data and self.left:
            raise broken(f"the content of {self.name!r} is cut short (the layer is truncated)")
        self.left -= len(data)
        return data
