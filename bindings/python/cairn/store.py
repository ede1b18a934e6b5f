"""Read-only access to a cairn store (docs/format/store.md).

The files are the source of truth: a version exists when its MANIFEST is valid
(manifest.md); the catalog (catalog.sqlite) is not used. A version is a shard
file per rank (manifest format 1) or, written with persistent_layout =
aggregated, data files holding every rank's image as extents (manifest format
2, docs/format/container.md); both read the same here.

This package reads the files itself, in pure Python; it moves onto the C++
reader (format::open_persistent_image, the one every cairn tool uses) with
issue 13.
"""
import os
import re
from typing import Dict, List, Optional

import numpy as np

from ._format import (ContainerImage, RegionInfo, ShardHeader, read_region_data, read_sealed_json,
                      read_shard_header)
from .errors import CairnError, CorruptionError, NotFoundError, NotSupportedError

MANIFEST = "MANIFEST"
RUN_FILE = "RUN"
MANIFEST_FORMAT_VERSION = 2   # 1: a shard file per rank; 2: adds the aggregated layout
CONTAINER_FORMAT_VERSION = 1
RUN_FORMAT_VERSION = 1
_VERSION_DIR = re.compile(r"^v([0-9]+)$")


def _subdirs(path: str) -> List[str]:
    try:
        with os.scandir(path) as it:
            return sorted(e.name for e in it if e.is_dir() and not e.name.endswith(".tmp"))
    except FileNotFoundError:
        return []


class Store:
    """A cairn store (the persistent level), read-only.

    >>> s = cairn.open("cairn-store")
    >>> s.runs(); s.checkpoints("heat2d"); s.versions("heat2d", "heat2d")
    >>> grid = s.region("heat2d", "heat2d", 100, "grid")   # global array, all ranks
    """

    def __init__(self, path):
        self.path = os.fspath(path)
        if not os.path.isdir(self.path):
            raise NotFoundError(f"{self.path}: no such store (not a directory)")
        if not os.path.isdir(os.path.join(self.path, "runs")):
            raise NotFoundError(f"{self.path}: not a cairn store (no runs/ directory)")
        self._manifests: Dict[tuple, dict] = {}

    def __repr__(self):
        return f"cairn.Store({self.path!r})"

    def __fspath__(self):
        return self.path

    # ---- paths -----------------------------------------------------------------
    def run_dir(self, run: str) -> str:
        return os.path.join(self.path, "runs", run)

    def version_dir(self, run: str, name: str, version: int) -> str:
        return os.path.join(self.path, "runs", run, name, f"v{int(version):012d}")

    def shard_path(self, run: str, name: str, version: int, rank: int) -> str:
        return os.path.join(self.version_dir(run, name, version), f"shard.{int(rank):06d}")

    # ---- listing -----------------------------------------------------------------
    def runs(self) -> List[str]:
        """Run ids with at least one committed version, sorted."""
        return [r for r in _subdirs(os.path.join(self.path, "runs")) if self.checkpoints(r)]

    def checkpoints(self, run: str) -> List[str]:
        """Checkpoint names of `run` with at least one committed version, sorted."""
        return [n for n in _subdirs(self.run_dir(run)) if self.versions(run, n)]

    def versions(self, run: str, name: str) -> List[int]:
        """Committed versions (a valid MANIFEST) of checkpoint `name` of `run`, ascending.
        Versions being written, debris of a crash and damaged manifests are left out."""
        out = []
        for entry in _subdirs(os.path.join(self.run_dir(run), name)):
            m = _VERSION_DIR.match(entry)
            if not m:
                continue
            v = int(m.group(1))
            try:
                self.manifest(run, name, v)
            except (NotFoundError, CorruptionError):
                continue
            out.append(v)
        return sorted(out)

    # ---- metadata ----------------------------------------------------------------
    def manifest(self, run: str, name: str, version: int) -> dict:
        """The version's MANIFEST (verified) as a dict. NotFoundError if the version
        is not committed, CorruptionError if the manifest is damaged."""
        key = (run, name, int(version))
        if key in self._manifests:
            return self._manifests[key]
        path = os.path.join(self.version_dir(run, name, version), MANIFEST)
        try:
            m = read_sealed_json(path, "manifest", "cairn-manifest", MANIFEST_FORMAT_VERSION)
        except FileNotFoundError:
            raise NotFoundError(f"run '{run}', checkpoint '{name}': version {version} is not committed "
                                f"(no {path})") from None
        for k in ("run", "name", "version", "nranks", "shards"):
            if k not in m:
                raise CorruptionError(f"{path}: malformed manifest: no '{k}'")
        if m["run"] != run or m["name"] != name or m["version"] != int(version):
            raise CorruptionError(f"{path}: manifest is of {m['run']}/{m['name']}/v{m['version']}")
        if len(m["shards"]) != m["nranks"]:
            raise CorruptionError(f"{path}: {len(m['shards'])} shards listed for {m['nranks']} ranks")
        if m.get("layout", "file_per_process") == "aggregated":
            _check_container(m, path)
        elif m.get("layout", "file_per_process") != "file_per_process":
            raise NotSupportedError(f"{path}: layout {m['layout']!r} is not readable by this package; upgrade cairn")
        self._manifests[key] = m
        return m

    def layout(self, run: str, name: str, version: int) -> str:
        """'aggregated' (data files, docs/format/container.md) or 'file_per_process'."""
        return self.manifest(run, name, version).get("layout", "file_per_process")

    def nranks(self, run: str, name: str, version: int) -> int:
        return int(self.manifest(run, name, version)["nranks"])

    def run_info(self, run: str) -> Optional[dict]:
        """The run's identity and executions from `runs/<run>/RUN` (docs/format/run.md),
        or None when the run has no RUN file (stores written before it existed)."""
        path = os.path.join(self.run_dir(run), RUN_FILE)
        if not os.path.exists(path):
            if not os.path.isdir(self.run_dir(run)):
                raise NotFoundError(f"{self.path}: no run '{run}'")
            return None
        return read_sealed_json(path, "RUN file", "cairn-run", RUN_FORMAT_VERSION)

    def shard_header(self, run: str, name: str, version: int, rank: int = 0) -> ShardHeader:
        """The validated header of one rank's shard, checked against the manifest
        (size, header checksum, run/name/version/rank)."""
        m = self.manifest(run, name, version)
        nranks = int(m["nranks"])
        if not 0 <= int(rank) < nranks:
            raise NotFoundError(f"{run}/{name}/v{version}: no rank {rank} (the version has {nranks} ranks)")
        entry = m["shards"][int(rank)]
        path = self._image(run, name, version, rank)
        if not isinstance(path, ContainerImage) and not os.path.exists(path):
            raise CorruptionError(f"{path}: shard listed in the manifest is missing")
        h = read_shard_header(path)
        if "size" in entry and int(entry["size"]) != h.file_size:
            raise CorruptionError(f"{path}: size {h.file_size} differs from the manifest's {entry['size']}")
        if "header_checksum" in entry and int(entry["header_checksum"], 16) != h.header_checksum:
            raise CorruptionError(f"{path}: header checksum differs from the manifest's")
        if (h.run, h.name, h.version, h.rank, h.nranks) != (run, name, int(version), int(rank), nranks):
            raise CorruptionError(f"{path}: shard is of {h.run}/{h.name}/v{h.version} rank {h.rank} of {h.nranks}")
        return h

    def _image(self, run: str, name: str, version: int, rank: int):
        """Where rank's shard is read from: its shard file, or its image in the
        data files of an aggregated version."""
        m = self.manifest(run, name, version)
        if m.get("layout") == "aggregated":
            return ContainerImage(self.version_dir(run, name, version), m, int(rank))
        return self.shard_path(run, name, version, rank)

    def regions(self, run: str, name: str, version: int, rank: int = 0) -> List[RegionInfo]:
        """The region table of one rank's shard (name, type, dtype, shape, layout, ...)."""
        return list(self.shard_header(run, name, version, rank).regions)

    # ---- data ----------------------------------------------------------------------
    def region(self, run: str, name: str, version: int, region: str, rank: Optional[int] = None,
               fill=None) -> np.ndarray:
        """A region as a numpy array of its real dtype and shape, its checksum verified
        (CorruptionError otherwise).

        rank given: that rank's stored block (shape of the block; order 'F' for
        column-major regions). rank None: for a region with a global layout
        (cairn_protect_block), the global array assembled from every rank's block;
        for a region without one, the single rank's data when the version has one
        rank (otherwise give a rank). Elements of the global array no block covers
        raise CairnError unless `fill` gives their value; overlapping blocks raise.
        """
        if rank is not None:
            h = self.shard_header(run, name, version, rank)
            info = self._find(h, region)
            return read_region_data(self._image(run, name, version, rank), info)
        nranks = self.nranks(run, name, version)
        h0 = self.shard_header(run, name, version, 0)
        info0 = self._find(h0, region)
        if not info0.has_layout:
            if nranks == 1:
                return read_region_data(self._image(run, name, version, 0), info0)
            raise CairnError(f"region '{region}' of {run}/{name}/v{version} has no global layout and the "
                             f"version has {nranks} ranks: give rank= (0..{nranks - 1})")
        gshape = info0.global_shape
        out = np.empty(gshape, dtype=info0.dtype, order=info0.order)
        covered = np.zeros(gshape, dtype=bool, order=info0.order)
        for r in range(nranks):
            h = h0 if r == 0 else self.shard_header(run, name, version, r)
            info = self._find(h, region)
            if not info.has_layout or info.global_shape != gshape or info.dtype != info0.dtype \
                    or info.column_major != info0.column_major:
                raise CorruptionError(f"{h.path}: region '{region}' has another type, order or global shape "
                                      f"than on rank 0")
            sl = tuple(slice(s, s + d) for s, d in zip(info.start, info.shape))
            if covered[sl].any():
                raise CorruptionError(f"{h.path}: block of region '{region}' overlaps another rank's block")
            out[sl] = read_region_data(self._image(run, name, version, r), info)
            covered[sl] = True
        if not covered.all():
            missing = int(covered.size - np.count_nonzero(covered))
            if fill is None:
                raise CairnError(f"region '{region}' of {run}/{name}/v{version}: the blocks of the {nranks} ranks "
                                 f"leave {missing} of {covered.size} elements uncovered (pass fill=)")
            out[~covered] = fill
        return out

    @staticmethod
    def _find(h: ShardHeader, region: str) -> RegionInfo:
        info = h.region(region)
        if info is None:
            raise NotFoundError(f"{h.path}: no region '{region}' (regions: "
                                f"{', '.join(r.name for r in h.regions) or 'none'})")
        return info


def _check_container(m: dict, path: str) -> None:
    """The index of an aggregated version (container.md): a known container
    format, and every rank's extents tiling its image [0, size), in order,
    each inside its data file."""
    c = m.get("container")
    if not isinstance(c, dict) or not isinstance(c.get("files"), list):
        raise CorruptionError(f"{path}: malformed manifest: aggregated without a 'container' section")
    if c.get("format_version") != CONTAINER_FORMAT_VERSION:
        raise NotSupportedError(f"{path}: container format version {c.get('format_version')} is not readable by "
                                f"this package (reads {CONTAINER_FORMAT_VERSION}); upgrade cairn")
    for f in c["files"]:
        name = f.get("name", "") if isinstance(f, dict) else ""
        if not name or "/" in name or not isinstance(f.get("size"), int):
            raise CorruptionError(f"{path}: malformed manifest: bad data file entry {f!r}")
    for s in m["shards"]:
        at = 0
        for x in s.get("extents", []):
            ok = isinstance(x, list) and len(x) == 5 and all(isinstance(v, int) for v in x[:4])
            if not ok or x[0] != at or x[1] <= 0 or not 0 <= x[2] < len(c["files"]) \
                    or x[3] + x[1] > c["files"][x[2]]["size"]:
                raise CorruptionError(f"{path}: rank {s.get('rank')}: extents do not tile the image inside the "
                                      "data files")
            at += x[1]
        if at != s.get("size"):
            raise CorruptionError(f"{path}: rank {s.get('rank')}: extents cover {at} of {s.get('size')} bytes")


def open(path) -> Store:  # noqa: A001 - cairn.open mirrors the built-in's role
    """Opens a store (the persistent directory) read-only."""
    return Store(path)
