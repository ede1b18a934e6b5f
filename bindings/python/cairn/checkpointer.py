"""Writer API: cairn.Checkpointer, over libcairn's C API (include/cairn.h)
through cffi in ABI mode, so that the one C++ implementation writes and reads
the format.

    import numpy as np, cairn
    u = np.zeros((512, 512))
    step = np.zeros(1, dtype=np.int64)
    with cairn.Checkpointer(comm=None, config={"persistent": "store"}) as ck:   # or an mpi4py comm
        ck.protect("u", u)            # no copy: cairn reads u in place at each checkpoint
        ck.protect("step", step)
        v = ck.latest("sim")          # newest restorable version, or None
        if v is not None:
            ck.restart("sim", v)      # writes into u and step
        for i in range(int(step[0]) + 1, 1000):
            ...
            if i % 100 == 0:
                step[0] = i
                ck.checkpoint("sim", i)

Arrays are protected in place: they must be numpy arrays, contiguous (C or
Fortran order), writeable, of a fixed-size integer or float dtype in native
byte order. The Checkpointer keeps a reference to each, so an array cannot be
freed, and numpy refuses to resize it, while it is protected. An array that is
replaced by another (double buffering: `u, v = v, u`) must be protected again,
under the same name, before the next checkpoint. Every failure raises a
cairn.CairnError subclass (InvalidArgumentError, NotFoundError, ...) whose
message is the C library's: what failed, where, and what to do.

The library is found as _clib.py says: PYCAIRN_LIBRARY (a path to
libcairn.so), a copy bundled in the wheel, the system's library path, this
checkout's build/.
"""
from __future__ import annotations

import math
import os
import tempfile
import warnings
from typing import Optional

import numpy as np

from ._clib import EARLIER, ERRORS, library_path, load
from .errors import CairnError, EarlierFailureWarning, InvalidArgumentError, NotFoundError, NotSupportedError

LEVEL_CAPTURED = 0x1
LEVEL_LOCAL = 0x2
LEVEL_PROTECTED = 0x4
LEVEL_PERSISTENT = 0x8
MAX_DIMS = 8

# cairn_type_t (stored on disk: never renumber).
_TYPES = {np.dtype(np.int8): 1, np.dtype(np.int16): 2, np.dtype(np.int32): 3, np.dtype(np.int64): 4,
          np.dtype(np.uint8): 5, np.dtype(np.uint16): 6, np.dtype(np.uint32): 7, np.dtype(np.uint64): 8,
          np.dtype(np.float32): 9, np.dtype(np.float64): 10}

_ERRORS = ERRORS
_library_path = library_path
_load = load


def _mpi_init(ffi, path, comm, cfg, out):
    from mpi4py import MPI  # only when a communicator is given
    if not isinstance(comm, MPI.Comm):
        raise InvalidArgumentError(f"comm must be an mpi4py communicator or None, not {type(comm).__name__}")
    size = MPI._sizeof(MPI.Comm)
    ctype = {4: "int32_t", 8: "void *"}.get(size)
    if ctype is None:
        raise NotSupportedError(f"MPI_Comm of {size} bytes: not supported by the cffi declarations")
    mffi = __import__("cffi").FFI()
    mffi.cdef(f"int cairn_init_mpi({ctype} comm, const char *config_path, void **out);")
    mlib = mffi.dlopen(path)
    handle = MPI._handleof(comm)
    arg = mffi.cast(ctype, handle)
    raw = mffi.new("void **")
    rc = mlib.cairn_init_mpi(arg, cfg if cfg is not None else mffi.NULL, raw)
    if rc == 0:
        out[0] = ffi.cast("cairn_t *", int(mffi.cast("uintptr_t", raw[0])))
    return rc


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    s = str(v).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{s}"'


class Checkpointer:
    """A cairn handle. comm: None (single process) or an mpi4py communicator
    (collective calls on every rank, as in C). config: None, the path of a TOML
    file, or a dict of configuration keys (docs/design/core.md); CAIRN_<KEY>
    environment variables win over either. With a dict, or None (and no
    CAIRN_CONFIG file), the keys of PYTHON_DEFAULTS that it does not set take
    the values there (memory for a training job: about 3 S beside a state of
    S); a TOML file keeps the core's defaults. Use it as a context manager, or
    call finalize()."""

    #: One staging slot and one node-local version: a state of size S costs
    #: about 3 S while the run lasts (the slot, the newest node-local version
    #: and the file the next one overwrites) instead of 5 S with the core's
    #: two and two. A save taken while the previous one is still being
    #: written waits for it. Saves copy the state before they return (the
    #: core's capture = copy): a training step rewrites all of it right after
    #: a save, and with copy-on-write (capture = copy_or_cow) that step waited
    #: for the background copy, costing the loop 4-6x what the copy took
    #: (docs/benchmarks/python.md, "The first save again").
    PYTHON_DEFAULTS = {"staging_slots": 1, "keep_local": 1}

    def __init__(self, comm=None, config=None):
        if isinstance(config, dict) or (config is None and not os.environ.get("CAIRN_CONFIG")):
            config = {**self.PYTHON_DEFAULTS, **(config or {})}
        ffi, lib = _load()
        self._ffi, self._lib = ffi, lib
        self._regions = {}
        out = ffi.new("cairn_t **")
        tmp = None
        try:
            cfg = None
            if isinstance(config, dict):
                fd, tmp = tempfile.mkstemp(prefix="cairn-config-", suffix=".toml")
                with os.fdopen(fd, "w") as f:
                    for k, v in config.items():
                        f.write(f"{k} = {_toml_value(v)}\n")
                cfg = tmp.encode()
            elif config is not None:
                cfg = os.fsencode(config)
            if comm is None:
                rc = lib.cairn_init(cfg if cfg is not None else ffi.NULL, out)
            else:
                rc = _mpi_init(ffi, _library_path(), comm, cfg, out)
        finally:
            if tmp:
                os.unlink(tmp)
        self._check(rc, "cairn_init")
        self._h = out[0]
        self._capture = self.config_value("capture")  # StateSaver checks pinned tensors against it

    # ---- errors -------------------------------------------------------------
    def _check(self, rc: int, what: str) -> None:
        if rc == 0:
            return
        ffi, lib = self._ffi, self._lib
        msg = ffi.string(lib.cairn_last_error()).decode(errors="replace")
        if rc == EARLIER:
            # The call did its work: an earlier version's failure is a warning
            # (one per failure: the message names the version).
            warnings.warn(f"{what}: {msg}", EarlierFailureWarning, stacklevel=3)
            return
        reason = ffi.string(lib.cairn_strerror(rc)).decode(errors="replace")
        err = _ERRORS.get(rc, CairnError)(f"{what}: {reason}: {msg}")
        err.code = rc
        raise err

    def _handle(self):
        if self._h is None:
            raise InvalidArgumentError("this Checkpointer was finalized: create a new one")
        return self._h

    # ---- identity -------------------------------------------------------------
    @property
    def rank(self) -> int:
        return int(self._lib.cairn_rank(self._handle()))

    @property
    def size(self) -> int:
        return int(self._lib.cairn_size(self._handle()))

    # ---- regions --------------------------------------------------------------
    def protect(self, name: str, array: np.ndarray) -> None:
        """Registers `array` (or replaces the region `name`) without copying:
        each checkpoint reads it in place, restart writes into it. Its dtype
        and shape (and C or Fortran order) are recorded."""
        if not isinstance(array, np.ndarray):
            raise InvalidArgumentError(f"protect: region '{name}': a numpy array is needed, not "
                                       f"{type(array).__name__} (np.asarray makes one)")
        dt = array.dtype
        if dt.newbyteorder("=") not in _TYPES or not dt.isnative:
            raise InvalidArgumentError(f"protect: region '{name}': dtype {dt} is not supported: use a native "
                                       "int8..int64, uint8..uint64, float32 or float64 array")
        c_order = array.flags.c_contiguous
        if not c_order and not array.flags.f_contiguous:
            raise InvalidArgumentError(
                f"protect: region '{name}': the array is not contiguous (a strided view such as a[::2] or "
                "a[:, 1]); cairn reads and restores protected arrays in place, so protect a contiguous array "
                "(np.ascontiguousarray makes a copy, which is then the array to update and protect)")
        if not array.flags.writeable:
            raise InvalidArgumentError(f"protect: region '{name}': the array is read-only; restart writes into "
                                       "protected arrays, so protect a writeable one")
        if array.ndim > MAX_DIMS:
            raise InvalidArgumentError(f"protect: region '{name}': {array.ndim} dimensions, more than cairn "
                                       f"records ({MAX_DIMS}): reshape it first")
        ffi, lib = self._ffi, self._lib
        ptr = ffi.cast("void *", array.ctypes.data)
        t = _TYPES[dt]
        if array.ndim == 0:
            rc = lib.cairn_protect(self._handle(), name.encode(), ptr, 1, t)
        else:
            dims = ffi.new("uint64_t[]", list(array.shape))
            rc = lib.cairn_protect_shaped(self._handle(), name.encode(), ptr, t, array.ndim, dims,
                                          0 if c_order else 1)
        self._check(rc, "cairn_protect")
        self._regions[name] = array  # keeps it alive, and numpy refuses to resize it

    def protect_block(self, name: str, array: np.ndarray, global_shape, start, count=None,
                      mem_start=None) -> None:
        """Registers `array` as holding a block of a global array of shape
        `global_shape`: `count` elements (default: the whole array) starting
        at `start` of the global array, at `mem_start` in `array` (default:
        its origin; e.g. (1, 1) for one halo cell). Only the block is
        checkpointed and restored, and a version can be restored on another
        number of ranks (docs/design/reshard.md). Indices in the array's own
        order (Fortran-ordered arrays: Fortran order)."""
        self.protect(name, array)  # the array checks, then replaced by the block below
        self._regions.pop(name, None)
        n = array.ndim
        count = tuple(array.shape) if count is None else tuple(count)
        mem_start = (0,) * n if mem_start is None else tuple(mem_start)
        for what, v in (("global_shape", global_shape), ("start", start), ("count", count),
                        ("mem_start", mem_start)):
            if len(tuple(v)) != n:
                self._lib.cairn_unprotect(self._handle(), name.encode())
                raise InvalidArgumentError(f"protect_block: region '{name}': {what} has {len(tuple(v))} entries; "
                                           f"the array has {n} dimensions")
        ffi, lib = self._ffi, self._lib
        u = lambda v: ffi.new("uint64_t[]", [int(x) for x in v])  # noqa: E731
        c_order = array.flags.c_contiguous
        rc = lib.cairn_protect_block(self._handle(), name.encode(), ffi.cast("void *", array.ctypes.data),
                                     _TYPES[array.dtype], n, u(global_shape), u(start), u(count),
                                     u(array.shape), u(mem_start), 0 if c_order else 1)
        if rc != 0:
            lib.cairn_unprotect(self._handle(), name.encode())
        self._check(rc, "cairn_protect_block")
        self._regions[name] = array

    def unprotect(self, name: str) -> None:
        self._check(self._lib.cairn_unprotect(self._handle(), name.encode()), "cairn_unprotect")
        self._regions.pop(name, None)

    # ---- checkpoint and restart -------------------------------------------------
    def checkpoint(self, name: str, version: int) -> None:
        """Collective. Captures every protected array as `version` of `name`;
        returns once they are copied (mode thread) or written (mode sync).
        An earlier version's background failure is reported here once, as an
        EarlierFailureWarning saying "version V was taken": this version was
        captured all the same (do not repeat the call)."""
        self._check(self._lib.cairn_checkpoint(self._handle(), name.encode(), int(version)), "cairn_checkpoint")

    def test(self, name: str, version: int) -> int:
        """Local. The LEVEL_* bits this rank's part of the version has reached."""
        levels = self._ffi.new("unsigned *")
        self._check(self._lib.cairn_test(self._handle(), name.encode(), int(version), levels), "cairn_test")
        return int(levels[0])

    def wait(self, name: str, version: int, level: int = LEVEL_PERSISTENT) -> None:
        """Collective. Blocks until the version has reached `level` on every rank."""
        self._check(self._lib.cairn_wait(self._handle(), name.encode(), int(version), int(level)), "cairn_wait")

    def restart_test(self, name: str) -> int:
        """Collective. The newest version every rank can restore; NotFoundError
        when there is none, UnusableError when this job cannot use those there are."""
        v = self._ffi.new("int64_t *")
        self._check(self._lib.cairn_restart_test(self._handle(), name.encode(), v), "cairn_restart_test")
        return int(v[0])

    def latest(self, name: str) -> Optional[int]:
        """restart_test, with None instead of NotFoundError."""
        try:
            return self.restart_test(name)
        except NotFoundError:
            return None

    def should_checkpoint(self) -> bool:
        """Collective. True when the batch system warned the job (a warning
        signal such as Slurm's --signal=USR1@T, or SIGTERM, arrived since the
        last checkpoint) or the time left is below what a checkpoint takes to
        become persistent; the same answer on every rank (cairn_should_checkpoint)."""
        yes = self._ffi.new("int *")
        self._check(self._lib.cairn_should_checkpoint(self._handle(), yes), "cairn_should_checkpoint")
        return bool(yes[0])

    def time_left(self) -> Optional[float]:
        """Local. Seconds until the job's end (the configured deadline, else
        Slurm's SLURM_JOB_END_TIME), None when neither is known, negative once
        the end has passed (cairn_time_left)."""
        s = self._ffi.new("double *")
        self._check(self._lib.cairn_time_left(self._handle(), s), "cairn_time_left")
        return None if math.isinf(s[0]) else float(s[0])

    def config_value(self, key: str) -> str:
        """Local. The value of configuration key `key` as cairn_init resolved
        it (the CAIRN_<KEY> environment variable, else the dict or file, else
        the default), as text (cairn_config_value)."""
        buf = self._ffi.new("char[]", 1 << 16)  # longer than any value a key takes
        self._check(self._lib.cairn_config_value(self._handle(), key.encode(), buf, len(buf)), "cairn_config_value")
        return self._ffi.string(buf).decode()

    def restart(self, name: str, version: Optional[int] = None) -> int:
        """Collective. Restores `version` (default: restart_test's) of `name`
        into the protected arrays; every checksum is verified first. Returns
        the version restored."""
        if version is None:
            version = self.restart_test(name)
        self._check(self._lib.cairn_restart(self._handle(), name.encode(), int(version)), "cairn_restart")
        return int(version)

    def finalize(self, wait: bool = True) -> None:
        """Collective. wait: until every pending version reached its levels;
        else pending background work is cancelled (committed versions stay)."""
        if self._h is None:
            return
        p = self._ffi.new("cairn_t **", self._h)
        self._h = None
        self._regions.clear()
        self._check(self._lib.cairn_finalize(p, 1 if wait else 0), "cairn_finalize")

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        # After an exception pending work is cancelled, committed versions kept.
        self.finalize(wait=exc_type is None)
