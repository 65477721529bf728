"""Which GPU architectures a shared library carries kernels for, read from the file without a GPU.

nvcc puts a library's device code in the ELF section `.nv_fatbin`: one or more fat binaries, each
a header (magic 0xBA55ED50, version, header size, size of what follows: the `fatBinaryHeader` of
CUDA's fatbinary.h) and then entries, each a header of its own (kind 1 = PTX, 2 = a cubin for one
SM; its header size, its payload size; the SM number at byte 28) and its payload. A library built
with HOROVOD_BUILD_CUDA_CC_LIST=90,100,110,120 shows cubins 90, 100, 110, 120 and PTX 120
(Horovod 0.28.1 on aarch64, docs/aarch64.md), the list nvcc was given.

Standard library only: it runs inside the image, in the smoke suite.
"""

import struct

FATBIN_MAGIC = 0xBA55ED50
KIND = {1: "ptx", 2: "cubin"}
ELF_MAGIC = b"\x7fELF"


def elf_section(path, name):
    """The bytes of section NAME of the 64-bit little-endian ELF file PATH, or None (no such
    section, not such a file)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(64)
            if len(head) < 64 or head[:4] != ELF_MAGIC or head[4] != 2 or head[5] != 1:
                return None
            shoff, = struct.unpack_from("<Q", head, 0x28)
            shentsize, shnum, shstrndx = struct.unpack_from("<HHH", head, 0x3A)
            if not shoff or shentsize < 64 or shstrndx >= shnum:
                return None
            fh.seek(shoff)
            table = fh.read(shentsize * shnum)
            sections = [struct.unpack_from("<IIQQQQ", table, i * shentsize) for i in range(shnum)]
            _, _, _, _, str_off, str_size = sections[shstrndx]
            fh.seek(str_off)
            names = fh.read(str_size)
            want = name.encode()
            for sh_name, sh_type, _, _, off, size in sections:
                end = names.find(b"\0", sh_name)
                if names[sh_name:end] == want and sh_type != 8:          # 8: SHT_NOBITS
                    fh.seek(off)
                    return fh.read(size)
    except (OSError, struct.error, ValueError):
        return None
    return None


def entries(blob):
    """(kind, sm) of each entry of the fat binaries in BLOB: ("cubin", 90), ("ptx", 120)..."""
    found = []
    pos = 0
    while pos + 16 <= len(blob):
        magic, _, header, size = struct.unpack_from("<IHHQ", blob, pos)
        if magic != FATBIN_MAGIC:
            pos += 8                      # sections are aligned; a gap of padding between binaries
            continue
        at, end = pos + header, min(pos + header + size, len(blob))
        while at + 32 <= end:
            kind, _, entry_header, payload = struct.unpack_from("<HHIQ", blob, at)
            sm, = struct.unpack_from("<I", blob, at + 28)
            if entry_header < 32:
                break
            found.append((KIND.get(kind, str(kind)), sm))
            at += entry_header + payload
        pos = max(end, pos + 16)
    return found


def kernels(path):
    """{"cubin": [sm...], "ptx": [sm...]} of library PATH (sorted, unique), or None when it carries
    no device code (no `.nv_fatbin` section)."""
    blob = elf_section(path, ".nv_fatbin")
    if blob is None:
        return None
    out = {"cubin": set(), "ptx": set()}
    for kind, sm in entries(blob):
        if kind in out:
            out[kind].add(sm)
    return {k: sorted(v) for k, v in out.items()}


def dotted(sm):
    """90 -> "9.0", 120 -> "12.0" (the manifest's cuda_arch spelling)."""
    return "%d.%d" % divmod(sm, 10)
