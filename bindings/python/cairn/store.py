"""Read-only access to a cairn store (docs/format/store.md), through libcairn's
reader (include/cairn_store.h: src/format, what restart and the cairn CLI
read with), so that the formats have one implementation.

The files are the source of truth: a version exists when its MANIFEST is valid
(manifest.md); the catalog (catalog.sqlite) is not used. A version is a shard
file per rank (manifest format 1) or, written with persistent_layout =
aggregated, data files holding every rank's image as extents (manifest format
2, docs/format/container.md); both read the same here.
"""
import json
import os
from typing import Dict, List, Optional

import numpy as np

from ._clib import check, load, take_text
from ._format import RegionInfo, ShardHeader, header_from_json
from .errors import CairnError, CorruptionError, NotFoundError


class Store:
    """A cairn store (the persistent level), read-only.

    >>> s = cairn.open("cairn-store")
    >>> s.runs(); s.checkpoints("heat2d"); s.versions("heat2d", "heat2d")
    >>> grid = s.region("heat2d", "heat2d", 100, "grid")   # global array, all ranks
    """

    def __init__(self, path):
        self.path = os.fspath(path)
        self._ffi, self._lib = load()
        out = self._ffi.new("cairn_store_t **")
        check(self._lib.cairn_store_open(os.fsencode(self.path), out), "cairn_store_open")
        self._h = self._ffi.gc(out[0], self._lib.cairn_store_close)
        self._manifests: Dict[tuple, dict] = {}

    def __repr__(self):
        return f"cairn.Store({self.path!r})"

    def __fspath__(self):
        return self.path

    def _text(self, fn: str, *args) -> str:
        out = self._ffi.new("char **")
        check(getattr(self._lib, fn)(self._h, *args, out), fn)
        return take_text(self._ffi, self._lib, out)

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
        return json.loads(self._text("cairn_store_runs"))

    def checkpoints(self, run: str) -> List[str]:
        """Checkpoint names of `run` with at least one committed version, sorted."""
        return json.loads(self._text("cairn_store_checkpoints", run.encode()))

    def versions(self, run: str, name: str) -> List[int]:
        """Committed versions (a valid MANIFEST) of checkpoint `name` of `run`, ascending.
        Versions being written, debris of a crash and damaged manifests are left out."""
        return json.loads(self._text("cairn_store_versions", run.encode(), name.encode()))

    # ---- metadata ----------------------------------------------------------------
    def manifest(self, run: str, name: str, version: int) -> dict:
        """The version's MANIFEST (verified) as a dict. NotFoundError if the version
        is not committed, CorruptionError if the manifest is damaged."""
        key = (run, name, int(version))
        if key not in self._manifests:
            self._manifests[key] = json.loads(
                self._text("cairn_store_manifest", run.encode(), name.encode(), int(version)))
        return self._manifests[key]

    def layout(self, run: str, name: str, version: int) -> str:
        """'aggregated' (data files, docs/format/container.md) or 'file_per_process'."""
        return self.manifest(run, name, version).get("layout", "file_per_process")

    def nranks(self, run: str, name: str, version: int) -> int:
        return int(self.manifest(run, name, version)["nranks"])

    def run_info(self, run: str) -> Optional[dict]:
        """The run's identity and executions from `runs/<run>/RUN` (docs/format/run.md),
        or None when the run has no RUN file (stores written before it existed)."""
        if not os.path.exists(os.path.join(self.run_dir(run), "RUN")):
            if not os.path.isdir(self.run_dir(run)):
                raise NotFoundError(f"{self.path}: no run '{run}'")
            return None
        return json.loads(self._text("cairn_store_run_info", run.encode()))

    def shard_header(self, run: str, name: str, version: int, rank: int = 0) -> ShardHeader:
        """The validated header of one rank's shard, checked against the manifest
        (size, header checksum, run/name/version/rank)."""
        if int(rank) < 0:
            raise NotFoundError(f"{run}/{name}/v{version}: no rank {rank}")
        return header_from_json(
            self._text("cairn_store_shard_header", run.encode(), name.encode(), int(version), int(rank)))

    def _read(self, h: ShardHeader, info: RegionInfo) -> np.ndarray:
        """The region's block, read whole and checksum-verified by libcairn, as a
        writable array of its dtype and shape (order 'F' for column-major regions)."""
        out = np.empty(info.shape, dtype=info.dtype, order=info.order)
        buf = self._ffi.cast("void *", out.ctypes.data)
        check(self._lib.cairn_store_read_region(self._h, h.run.encode(), h.name.encode(), h.version, h.rank,
                                                info.name.encode(), buf, out.nbytes), "cairn_store_read_region")
        return out

    def regions(self, run: str, name: str, version: int, rank: int = 0) -> List[RegionInfo]:
        """The region table of one rank's shard (name, type, dtype, shape, layout, ...)."""
        return list(self.shard_header(run, name, version, rank).regions)

    def region_keys(self, run: str, name: str, version: int, rank: int = 0) -> Dict[str, str]:
        """For a version saved by cairn.pytorch, each tensor region's key in the
        saved state ({"t000004": "model.fc1.weight", ...}: keys and list indices
        joined with '.'); {} for a version of another kind."""
        return json.loads(self._text("cairn_store_region_keys", run.encode(), name.encode(), int(version), int(rank)))

    # ---- data ----------------------------------------------------------------------
    def read_into(self, run: str, name: str, version: int, region: str, out: np.ndarray, rank: int = 0) -> None:
        """Reads one rank's region whole into `out` (a C-contiguous array of exactly
        the region's length in bytes, any dtype), its checksum verified."""
        if not out.flags.c_contiguous or not out.flags.writeable:
            raise CairnError("read_into: out must be a writable C-contiguous array")
        buf = self._ffi.cast("void *", out.ctypes.data)
        check(self._lib.cairn_store_read_region(self._h, run.encode(), name.encode(), int(version), int(rank),
                                                region.encode(), buf, out.nbytes), "cairn_store_read_region")

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
            return self._read(h, info)
        nranks = self.nranks(run, name, version)
        h0 = self.shard_header(run, name, version, 0)
        info0 = self._find(h0, region)
        if not info0.has_layout:
            if nranks == 1:
                return self._read(h0, info0)
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
            out[sl] = self._read(h, info)
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


def open(path) -> Store:  # noqa: A001 - cairn.open mirrors the built-in's role
    """Opens a store (the persistent directory) read-only."""
    return Store(path)
