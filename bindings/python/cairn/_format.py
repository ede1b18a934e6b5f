"""What a shard's header says, as Python objects: RegionInfo and ShardHeader
are built from what libcairn's reader (src/format, through cairn_store.h)
decoded and validated; nothing here parses a file. The byte layout is
docs/format/shard.md.
"""
import json
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

import numpy as np

from ._clib import check, load, take_text

COMPRESS_NONE = 0
COMPRESS_ZSTD = 1
COMPRESSED_VERSION = 3
FLAG_COLUMN_MAJOR = 1
FLAG_LAYOUT = 2

# cairn_type_t value -> (name, numpy dtype); values are stored on disk.
TYPES = {
    0: ("byte", np.dtype("u1")),
    1: ("int8", np.dtype("i1")),
    2: ("int16", np.dtype("<i2")),
    3: ("int32", np.dtype("<i4")),
    4: ("int64", np.dtype("<i8")),
    5: ("uint8", np.dtype("u1")),
    6: ("uint16", np.dtype("<u2")),
    7: ("uint32", np.dtype("<u4")),
    8: ("uint64", np.dtype("<u8")),
    9: ("float32", np.dtype("<f4")),
    10: ("float64", np.dtype("<f8")),
}


@dataclass(frozen=True)
class RegionInfo:
    """One region entry of a shard's region table.

    shape: the stored block's shape in numpy terms (for column-major regions the
    Fortran shape, read with order='F'); (count,) for regions without a shape.
    global_shape / start: the global layout (cairn_protect_block), or None.
    offset, length: where the region's bytes are in the uncompressed image;
    stored_offset, stored_length: in the file (a zstd frame when compression
    is COMPRESS_ZSTD, format 3).
    """
    name: str
    type_code: int
    type: str
    dtype: np.dtype
    count: int
    shape: Tuple[int, ...]
    column_major: bool
    global_shape: Optional[Tuple[int, ...]]
    start: Optional[Tuple[int, ...]]
    offset: int
    length: int
    checksum: int
    compression: int = COMPRESS_NONE
    stored_offset: int = 0
    stored_length: int = 0

    @property
    def order(self) -> str:
        return "F" if self.column_major else "C"

    @property
    def has_layout(self) -> bool:
        return self.global_shape is not None


@dataclass
class ShardHeader:
    path: str               # the shard file, or "<version dir>/data.* (rank r)" in an aggregated version
    format_version: int
    run: str
    name: str
    version: int
    rank: int
    nranks: int
    data_offset: int
    file_size: int          # the uncompressed image's size (what MANIFESTs record)
    header_checksum: int    # the image's header checksum (what MANIFESTs record)
    regions: List[RegionInfo] = field(default_factory=list)
    stored_size: int = 0    # the file's size (file_size unless compressed)

    @property
    def compressed(self) -> bool:
        return self.format_version >= COMPRESSED_VERSION

    def region(self, name: str) -> Optional[RegionInfo]:
        for r in self.regions:
            if r.name == name:
                return r
        return None


def header_from_json(text: str) -> ShardHeader:
    """A ShardHeader from the JSON of cairn_store_shard_header / cairn_shard_file_header."""
    h = json.loads(text)
    regions = []
    for r in h["regions"]:
        tname, dtype = TYPES[r["type"]]
        layout = bool(r["flags"] & FLAG_LAYOUT)
        regions.append(RegionInfo(
            name=r["name"], type_code=r["type"], type=tname, dtype=dtype, count=r["count"],
            shape=tuple(r["dims"]) if r["dims"] else (r["count"],), column_major=bool(r["flags"] & FLAG_COLUMN_MAJOR),
            global_shape=tuple(r["global"]) if layout else None, start=tuple(r["start"]) if layout else None,
            offset=r["offset"], length=r["length"], checksum=r["checksum"], compression=r["compression"],
            stored_offset=r["stored_offset"], stored_length=r["stored_length"]))
    return ShardHeader(path=h["path"], format_version=h["format_version"], run=h["run"], name=h["name"],
                       version=h["version"], rank=h["rank"], nranks=h["nranks"], data_offset=h["data_offset"],
                       file_size=h["file_size"], header_checksum=h["header_checksum"], regions=regions,
                       stored_size=h["stored_size"])


def read_shard_header(path) -> ShardHeader:
    """The validated header of one shard file (any format, 1 to 3), read by
    libcairn. CorruptionError / NotSupportedError name the file."""
    ffi, lib = load()
    out = ffi.new("char **")
    check(lib.cairn_shard_file_header(str(path).encode(), out), "cairn_shard_file_header")
    return header_from_json(take_text(ffi, lib, out))
