"""The SIF binary layout (sylabs/sif v2.8.3, pkg/sif/sif.go `header` and descriptor.go
`rawDescriptor`, written little-endian with encoding/binary, no padding):

    global header, 128 bytes at 0:
        0 launch script [32]  32 magic "SIF_MAGIC\\0" [10]  42 version "01\\0" [3]  45 arch [3]
        48 ID (UUID) [16]     64 created int64   72 modified int64   80 descriptors free int64
        88 descriptors total  96 descriptors offset  104 descriptors size  112 data offset
        120 data size
    descriptor, 585 bytes each at `descriptors offset`:
        0 data type int32  4 used bool  5 ID uint32  9 group ID  13 linked ID  17 offset int64
        25 size int64  33 size with padding  41 created int64  49 modified int64  57 UID int64
        65 GID int64  73 name [128]  201 extra [384] (a partition: fs type, part type int32,
        arch [3])

siftool 2.8.3 stamps `new` and `add` with the current time and `new` with a random UUID and
has no option against it; `make_deterministic` sets what Apptainer >= 1.5 sets when
SOURCE_DATE_EPOCH is given (internal/pkg/build/assemblers/sif.go: sif.OptCreateDeterministic,
i.e. the nil UUID and Go's zero time.Time, whose Unix() is -62135596800) in the header and
every descriptor. No checksum covers these fields (signatures are separate objects).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

MAGIC = b"SIF_MAGIC\x00"
LAUNCH = b"#!/usr/bin/env run-singularity\n"
HEADER = struct.Struct("<32s10s3s3s16sqqqqqqqq")
DESCRIPTOR = struct.Struct("<i?IIIqqqqqqq128s384s")
GO_ZERO_TIME = -62135596800            # time.Time{}.Unix()

DATA_TYPES = {0x4001: "Def.FILE", 0x4002: "Env.Vars", 0x4003: "JSON.Labels", 0x4004: "FS",
              0x4005: "Signature", 0x4006: "JSON.Generic", 0x4007: "Generic/Raw",
              0x4008: "Cryptographic Message", 0x4009: "SBOM"}
DATA_PARTITION = 0x4004
FS_SQUASH, PART_PRIMSYS = 1, 2
# siftool add --partarch numbers (pkg/siftool/add.go) for the OCI architecture names
PART_ARCH = {"386": 1, "amd64": 2, "arm": 3, "arm64": 4, "ppc64": 5, "ppc64le": 6, "mips": 7,
             "mipsle": 8, "mips64": 9, "mips64le": 10, "s390x": 11, "riscv64": 12}


@dataclass
class Descriptor:
    index: int
    datatype: int
    id: int
    group: int
    offset: int
    size: int
    created: int
    modified: int
    name: str
    fstype: int = 0
    parttype: int = 0
    arch: str = ""

    @property
    def kind(self) -> str:
        return DATA_TYPES.get(self.datatype, f"0x{self.datatype:x}")


@dataclass
class Header:
    launch: bytes
    version: str
    arch: bytes
    uuid: bytes
    created: int
    modified: int
    total: int
    descriptors_offset: int
    data_offset: int
    data_size: int


class NotSif(ValueError):
    pass


def read(path: Path) -> tuple[Header, list[Descriptor]]:
    with open(path, "rb") as fh:
        raw = fh.read(HEADER.size)
        if len(raw) < HEADER.size:
            raise NotSif(f"{path} is too short to be a SIF file ({len(raw)} bytes)")
        (launch, magic, version, arch, uuid, created, modified, _free, total, doff, _dsize,
         data_off, data_size) = HEADER.unpack(raw)
        if magic != MAGIC:
            raise NotSif(f"{path} is not a SIF file (no SIF_MAGIC in its header)")
        header = Header(launch, version.rstrip(b"\0").decode(), arch, uuid, created, modified, total,
                        doff, data_off, data_size)
        fh.seek(doff)
        descriptors = []
        for i in range(total):
            fields = DESCRIPTOR.unpack(fh.read(DESCRIPTOR.size))
            (dtype, used, did, group, _link, off, size, _padded, dc, dm, _uid, _gid, name, extra) = fields
            if not used:
                continue
            d = Descriptor(i, dtype, did, group & ~0xF0000000, off, size, dc, dm,
                           name.rstrip(b"\0").decode("utf-8", "replace"))
            if dtype == DATA_PARTITION:
                d.fstype, d.parttype = struct.unpack_from("<ii", extra)
                d.arch = extra[8:11].rstrip(b"\0").decode()
            descriptors.append(d)
    return header, descriptors


def read_object(path: Path, descriptor: Descriptor, limit: int) -> bytes:
    """The data of one object, refused (NotSif) when larger than LIMIT bytes: a SIF is input."""
    if descriptor.size > limit:
        raise NotSif(f"{path}: its {descriptor.kind} object is {descriptor.size} bytes (more than {limit})")
    with open(path, "rb") as fh:
        fh.seek(descriptor.offset)
        return fh.read(descriptor.size)


def make_deterministic(path: Path, when: int = GO_ZERO_TIME, launch: bytes | None = None) -> None:
    """Nil UUID and WHEN as every creation/modification time (header and descriptors); LAUNCH as
    the launch script (Apptainer writes LAUNCH; `siftool new` leaves it empty)."""
    header, descriptors = read(path)
    with open(path, "r+b") as fh:
        if launch is not None:
            fh.seek(0)
            fh.write(launch.ljust(32, b"\0")[:32])
        fh.seek(48)
        fh.write(bytes(16) + struct.pack("<qq", when, when))
        for d in descriptors:
            fh.seek(header.descriptors_offset + d.index * DESCRIPTOR.size + 41)
            fh.write(struct.pack("<qq", when, when))


def primary_partition(descriptors: list[Descriptor]) -> Descriptor | None:
    for d in descriptors:
        if d.datatype == DATA_PARTITION and d.parttype == PART_PRIMSYS:
            return d
    return None


def arch_name(code: str) -> str:
    """The partition's arch field holds siftool's number as text ("02"): its Go name."""
    by_number = {n: name for name, n in PART_ARCH.items()}
    return by_number.get(int(code), code) if code.isdigit() else code


def root_arch(path: Path) -> str:
    """The architecture of a SIF's root file system (its primary partition), as Go names it
    (amd64, arm64): what Apptainer holds against the machine before it runs the image."""
    _header, descriptors = read(path)
    part = primary_partition(descriptors)
    if part is None:
        raise NotSif(f"{path} holds no root file system (no primary system partition)")
    return arch_name(part.arch)
