"""Readers of cairn's on-disk formats: shard (docs/format/shard.md, versions 1
to 3; version 3 is compressed with zstd, read with the `zstandard` package),
a rank's image in the data files of an aggregated version (container.md), and
the sealed JSON files, MANIFEST (manifest.md) and RUN (run.md).

Everything here validates what it parses and raises CorruptionError (or
NotSupportedError for a newer format) naming the file.
"""
import io
import json
import os
import struct
from dataclasses import dataclass, field, replace
from typing import List, Optional, Tuple

import numpy as np

from ._hash import xxh3_64
from .errors import CorruptionError, NotSupportedError

SHARD_MAGIC = b"CAIRNSHD"
SHARD_VERSIONS = (1, 2, 3)
COMPRESSED_VERSION = 3
ALIGN = 4096
COMPRESS_NONE = 0
COMPRESS_ZSTD = 1
FIXED_HEADER = 64
CHECKSUM_OFFSET = 56
MAX_DIMS = 8
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
    # Where the bytes are in the file: offset and length unless the shard is
    # compressed (format 3), where a zstd frame (compression 1) of
    # stored_length bytes holds the region's `length` bytes.
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
    path: str
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


def _corrupt(path, what):
    return CorruptionError(f"{path}: {what}")


class ContainerImage:
    """Rank `rank`'s image in an aggregated version (docs/format/container.md),
    read through the extents its MANIFEST entry lists: [src, length, file,
    offset, checksum] = bytes [src, src+length) of the image at `offset` of data
    file `file`. Read like a shard file by read_shard_header and
    read_region_data (which verify the header and every region checksum).
    `manifest` is the version's, already validated (Store.manifest)."""

    def __init__(self, version_dir: str, manifest: dict, rank: int):
        files = manifest["container"]["files"]
        entry = manifest["shards"][rank]
        self.where = os.path.join(version_dir, f"data.* (rank {rank})")
        self.size = int(entry["size"])
        self.extents = [(int(src), int(length), int(f), int(offset)) for src, length, f, offset, _ in entry["extents"]]
        self.paths = {f: os.path.join(version_dir, files[f]["name"]) for _, _, f, _ in self.extents}
        self.sizes = {f: int(files[f]["size"]) for f in self.paths}

    def __str__(self):
        return self.where

    def open(self) -> "io.RawIOBase":
        """The image as a binary file (seek, read, readinto); closing it closes the data files.
        A data file that is missing or shorter than the MANIFEST says is corruption."""
        return _ImageFile(self)


class _ImageFile(io.RawIOBase):
    def __init__(self, image: ContainerImage):
        super().__init__()
        self._image, self._pos, self._files = image, 0, {}
        try:
            for f, path in image.paths.items():
                self._files[f] = open(path, "rb")
                size = os.fstat(self._files[f].fileno()).st_size
                if size < image.sizes[f]:
                    raise _corrupt(path, f"has {size} bytes, the manifest says {image.sizes[f]} (truncated)")
        except FileNotFoundError as e:
            self.close()
            raise _corrupt(e.filename, "data file listed in the manifest is missing") from None
        except BaseException:
            self.close()
            raise

    def readable(self):
        return True

    def seekable(self):
        return True

    def tell(self):
        return self._pos

    def seek(self, offset, whence=io.SEEK_SET):
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._image.size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, b):
        out = memoryview(b).cast("B")
        done = 0
        for src, length, f, offset in self._image.extents:
            if done == len(out) or self._pos >= self._image.size:
                break
            if self._pos >= src + length:
                continue
            rel = self._pos - src
            n = min(length - rel, len(out) - done)
            fh = self._files[f]
            fh.seek(offset + rel)
            got = fh.readinto(out[done:done + n])
            done += got
            self._pos += got
            if got < n:
                break
        return done

    def close(self):
        for fh in self._files.values():
            fh.close()
        self._files = {}
        super().close()


def _open_shard(source):
    """(binary file, size, name for messages) of a shard: a path, or a
    ContainerImage."""
    if isinstance(source, ContainerImage):
        return source.open(), source.size, str(source)
    f = open(source, "rb")
    return f, os.fstat(f.fileno()).st_size, os.fspath(source)


class _Reader:
    def __init__(self, buf, pos, path):
        self.buf, self.pos, self.path = buf, pos, path

    def take(self, fmt):
        n = struct.calcsize(fmt)
        if self.pos + n > len(self.buf):
            raise _corrupt(self.path, "truncated header")
        v = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return v

    def bytes(self, n):
        if self.pos + n > len(self.buf):
            raise _corrupt(self.path, "truncated header")
        b = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return b


def read_shard_header(path) -> ShardHeader:
    """Reads and validates a shard's header (magic, format version, header
    checksum, region table, file size). `path`: a shard file, or a rank's
    image in an aggregated version (ContainerImage)."""
    where = str(path)
    try:
        f, size, path = _open_shard(path)
        with f:
            buf = f.read(min(size, 64 * 1024))
            if len(buf) < FIXED_HEADER:
                raise _corrupt(path, f"file of {size} bytes is shorter than a shard header")
            if buf[:8] != SHARD_MAGIC:
                raise _corrupt(path, "not a cairn shard (bad magic)")
            fmt, flags, hb, nreg, data_offset, file_size, version, rank, nranks, hcs = struct.unpack_from(
                "<IIIIQQqIIQ", buf, 8)
            if fmt not in SHARD_VERSIONS:
                raise NotSupportedError(f"{path}: shard format version {fmt} is not readable by this "
                                        f"package (reads {SHARD_VERSIONS}); upgrade cairn")
            compressed = fmt >= COMPRESSED_VERSION
            # A compressed file's header may reach past the image's data_offset.
            if hb < FIXED_HEADER or (not compressed and hb > data_offset) or data_offset > file_size \
                    or hb > (64 << 20):
                raise _corrupt(path, "inconsistent header sizes")
            if hb > len(buf):
                if hb > size:
                    raise _corrupt(path, "truncated header")
                f.seek(0)
                buf = f.read(hb)
    except OSError as e:
        raise CorruptionError(f"{where}: cannot read: {e}") from e
    head = bytearray(buf[:hb])
    head[CHECKSUM_OFFSET:CHECKSUM_OFFSET + 8] = b"\0" * 8
    if xxh3_64(bytes(head)) != hcs:
        raise _corrupt(path, "header checksum mismatch")
    if not compressed and size != file_size:
        raise _corrupt(path, f"file is {size} bytes, header says {file_size} (truncated or overwritten)")
    rd = _Reader(buf[:hb], FIXED_HEADER, path)
    run_len, name_len, _ = rd.take("<HHI")
    run = rd.bytes(run_len).decode("utf-8", "replace")
    name = rd.bytes(name_len).decode("utf-8", "replace")
    regions = []
    for _ in range(nreg):
        nl, type_code, rflags, compression, ndims, _res, count, offset, length, checksum = rd.take("<HBBBBHQQQQ")
        if ndims > MAX_DIMS:
            raise _corrupt(path, "region with more than 8 dimensions")
        dims = rd.take(f"<{ndims}Q") if ndims else ()
        gshape = start = None
        if rflags & FLAG_LAYOUT:
            if fmt < 2:
                raise _corrupt(path, "layout flag in a format 1 shard")
            gshape = rd.take(f"<{ndims}Q") if ndims else ()
            start = rd.take(f"<{ndims}Q") if ndims else ()
        rname = rd.bytes(nl).decode("utf-8", "replace")
        if type_code not in TYPES:
            raise _corrupt(path, f"region '{rname}' has unknown type {type_code}")
        tname, dtype = TYPES[type_code]
        known = compression == COMPRESS_NONE or (compressed and compression == COMPRESS_ZSTD)
        if length != count * dtype.itemsize or offset < data_offset or offset + length > file_size or not known:
            raise _corrupt(path, f"region '{rname}' has an invalid table entry")
        if dims and int(np.prod(dims, dtype=np.uint64)) != count:
            raise _corrupt(path, f"region '{rname}': shape {list(dims)} does not hold {count} elements")
        if gshape is not None:
            if ndims == 0 or any(s + d > g for s, d, g in zip(start, dims, gshape)):
                raise _corrupt(path, f"region '{rname}' lies outside its global shape")
        regions.append(RegionInfo(
            name=rname, type_code=type_code, type=tname, dtype=dtype, count=count,
            shape=tuple(dims) if dims else (count,), column_major=bool(rflags & FLAG_COLUMN_MAJOR),
            global_shape=tuple(gshape) if gshape is not None else None,
            start=tuple(start) if start is not None else None,
            offset=offset, length=length, checksum=checksum, compression=compression,
            stored_offset=offset, stored_length=length))
    stored_size = file_size
    if compressed:
        # The stored table (format 3): the file's size, the image's header
        # checksum, and where each region's bytes are.
        stored_size, hcs = rd.take("<QQ")
        data_start = (hb + ALIGN - 1) // ALIGN * ALIGN
        if stored_size % ALIGN or data_start > stored_size:
            raise _corrupt(path, f"stored size {stored_size} is not a multiple of 4096 past the header")
        for i, r in enumerate(regions):
            soff, slen = rd.take("<QQ")
            if soff % ALIGN or soff < data_start:
                raise _corrupt(path, f"region '{r.name}': stored offset {soff} is not a 4096-aligned offset "
                                     "after the header")
            if soff > stored_size or slen > stored_size - soff:
                raise _corrupt(path, f"region '{r.name}': stored bytes [{soff}, {soff + slen}) run past the end "
                                     f"of the file ({stored_size} bytes)")
            if (slen != r.length) if r.compression == COMPRESS_NONE else (slen == 0 and r.length != 0):
                raise _corrupt(path, f"region '{r.name}': stored length {slen} does not fit its compression")
            regions[i] = replace(r, stored_offset=soff, stored_length=slen)
        if rd.pos != hb:
            raise _corrupt(path, "header_bytes does not end at the stored table")
        if size != stored_size:
            raise _corrupt(path, f"file is {size} bytes, header says {stored_size} (truncated or overwritten)")
    return ShardHeader(path=path, format_version=fmt, run=run, name=name, version=version, rank=rank,
                       nranks=nranks, data_offset=data_offset, file_size=file_size, header_checksum=hcs,
                       regions=regions, stored_size=stored_size)


def _decompress(path: str, region: RegionInfo, frame: bytes) -> bytearray:
    """A zstd frame holding exactly the region's length bytes, and nothing after it."""
    try:
        import zstandard
    except ImportError as e:
        raise NotSupportedError(f"{path}: region '{region.name}' is compressed (zstd): install the "
                                "'zstandard' package to read it") from e
    what = f"{path}: region '{region.name}'"
    try:
        size = zstandard.frame_content_size(frame)
    except zstandard.ZstdError as e:
        raise CorruptionError(f"{what}: not a zstd frame ({e})") from e
    if size != region.length:
        raise CorruptionError(f"{what}: decompressed size {size} is not the region's length {region.length}")
    d = zstandard.ZstdDecompressor().decompressobj()
    try:
        out = d.decompress(frame)
    except zstandard.ZstdError as e:
        raise CorruptionError(f"{what}: zstd: {e}") from e
    if not d.eof:
        raise CorruptionError(f"{what}: zstd frame is truncated")
    if len(out) != region.length:
        raise CorruptionError(f"{what}: decompressed {len(out)} bytes, the region has {region.length}")
    if d.unused_data:
        raise CorruptionError(f"{what}: {len(d.unused_data)} stored bytes after the end of its zstd frame")
    return bytearray(out)


def read_region_data(path, region: RegionInfo, verify: bool = True) -> np.ndarray:
    """The region's block as a writable numpy array of its dtype and shape
    (order 'F' for column-major regions), after verifying its checksum. A
    compressed region (format 3) is decompressed. `path`: a shard file, or a
    rank's image in an aggregated version (ContainerImage)."""
    if region.stored_offset:  # set by read_shard_header (a RegionInfo made by hand may lack it)
        start, stored = region.stored_offset, region.stored_length
    else:
        start, stored = region.offset, region.length
    buf = bytearray(stored)
    where = str(path)
    try:
        f, _, path = _open_shard(path)
        with f:
            f.seek(start)
            got = f.readinto(buf)
    except OSError as e:
        raise CorruptionError(f"{where}: cannot read region '{region.name}': {e}") from e
    if got != stored:
        raise CorruptionError(f"{path}: region '{region.name}' is truncated ({got} of {stored} bytes)")
    if region.compression == COMPRESS_ZSTD:
        buf = _decompress(path, region, bytes(buf))
    if verify and xxh3_64(buf) != region.checksum:
        raise CorruptionError(f"{path}: checksum mismatch in region '{region.name}' (the data are damaged)")
    arr = np.frombuffer(buf, dtype=region.dtype, count=region.count)
    return arr.reshape(region.shape, order=region.order)


def read_sealed_json(path: str, kind: str, expect_format: Optional[str] = None,
                     max_version: Optional[int] = None) -> dict:
    """A JSON object followed by the line `xxh3 <16 hex>` checksumming every byte
    before it (MANIFEST, RUN)."""
    try:
        with open(path, "rb") as f:
            text = f.read()
    except FileNotFoundError:
        raise
    except OSError as e:
        raise CorruptionError(f"{path}: cannot read: {e}") from e
    pos = text.rfind(b"xxh3 ")
    if pos < 0 or len(text) != pos + 5 + 16 + 1 or not text.endswith(b"\n"):
        raise _corrupt(path, f"missing checksum trailer (truncated {kind})")
    try:
        want = int(text[pos + 5:pos + 21], 16)
    except ValueError:
        raise _corrupt(path, "bad checksum trailer") from None
    if xxh3_64(text[:pos]) != want:
        raise _corrupt(path, f"{kind} checksum mismatch")
    try:
        obj = json.loads(text[:pos].decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise _corrupt(path, f"malformed {kind}: {e}") from e
    if not isinstance(obj, dict):
        raise _corrupt(path, f"malformed {kind}: not a JSON object")
    if expect_format is not None and obj.get("format") != expect_format:
        raise _corrupt(path, f"not a cairn {kind} (format {obj.get('format')!r})")
    if max_version is not None:
        fv = obj.get("format_version")
        if not isinstance(fv, int):
            raise _corrupt(path, f"malformed {kind}: no format_version")
        if fv > max_version:
            raise NotSupportedError(f"{path}: {kind} format version {fv} is not readable by this package "
                                    f"(reads up to {max_version}); upgrade cairn")
    return obj
