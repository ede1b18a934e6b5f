"""libcairn through cffi in ABI mode: the one implementation of cairn's
formats and runtime, shared by the writer (checkpointer.py) and the reader
(store.py, _format.py).

The library is found through PYCAIRN_LIBRARY (a path to libcairn.so), else a
copy bundled in this package (cairn/lib/, in wheels), else the system's
library path (ctypes.util.find_library), else this checkout's build/.
"""
from __future__ import annotations

import ctypes.util
import os
from pathlib import Path

from .errors import (AgainError, BusyError, CairnError, CairnIOError, CancelledError, CorruptionError, DivergedError,
                     ExistsError, InvalidArgumentError, NoSpaceError, NotFoundError, NotSupportedError,
                     UnusableError)

ERRORS = {-1: InvalidArgumentError, -2: NotFoundError, -3: CorruptionError, -4: CairnIOError, -5: NoSpaceError,
          -6: AgainError, -7: CancelledError, -8: NotSupportedError, -10: DivergedError, -11: UnusableError,
          -12: ExistsError, -14: BusyError}
EARLIER = -13  # CAIRN_EEARLIER: a warning (errors.EarlierFailureWarning), not an error

CDEF = """
typedef struct cairn cairn_t;
int cairn_init(const char *config_path, cairn_t **out);
int cairn_protect(cairn_t *c, const char *region, void *ptr, size_t count, int type);
int cairn_protect_shaped(cairn_t *c, const char *region, void *ptr, int type, int ndims,
                         const uint64_t *dims, int column_major);
int cairn_protect_block(cairn_t *c, const char *region, void *ptr, int type, int ndims,
                        const uint64_t *global_shape, const uint64_t *start, const uint64_t *count,
                        const uint64_t *mem_shape, const uint64_t *mem_start, int column_major);
int cairn_unprotect(cairn_t *c, const char *region);
int cairn_checkpoint(cairn_t *c, const char *name, int64_t version);
int cairn_test(cairn_t *c, const char *name, int64_t version, unsigned *levels_reached);
int cairn_wait(cairn_t *c, const char *name, int64_t version, unsigned level);
int cairn_restart_test(cairn_t *c, const char *name, int64_t *version);
int cairn_restart(cairn_t *c, const char *name, int64_t version);
int cairn_restart_begin(cairn_t *c, const char *name, int64_t version);
int cairn_restart_end(cairn_t *c, int success);
int cairn_restart_region_size(cairn_t *c, const char *region, uint64_t *bytes);
int cairn_finalize(cairn_t **c, int wait_for_pending);
const char *cairn_strerror(int code);
const char *cairn_last_error(void);
int cairn_should_checkpoint(cairn_t *c, int *yes);
int cairn_time_left(cairn_t *c, double *seconds);
int cairn_config_value(cairn_t *c, const char *key, char *value, size_t len);
int cairn_rank(const cairn_t *c);
int cairn_size(const cairn_t *c);

typedef struct cairn_store cairn_store_t;
int cairn_store_open(const char *path, cairn_store_t **out);
void cairn_store_close(cairn_store_t *s);
void cairn_store_free(char *text);
int cairn_store_runs(cairn_store_t *s, char **json);
int cairn_store_checkpoints(cairn_store_t *s, const char *run, char **json);
int cairn_store_versions(cairn_store_t *s, const char *run, const char *name, char **json);
int cairn_store_manifest(cairn_store_t *s, const char *run, const char *name, int64_t version, char **json);
int cairn_store_run_info(cairn_store_t *s, const char *run, char **json);
int cairn_store_shard_header(cairn_store_t *s, const char *run, const char *name, int64_t version, uint32_t rank,
                             char **json);
int cairn_store_read_region(cairn_store_t *s, const char *run, const char *name, int64_t version, uint32_t rank,
                            const char *region, void *buf, uint64_t bytes);
int cairn_store_region_keys(cairn_store_t *s, const char *run, const char *name, int64_t version, uint32_t rank,
                            char **json);
int cairn_shard_file_header(const char *path, char **json);
"""

_loaded = None


def library_path() -> str:
    p = os.environ.get("PYCAIRN_LIBRARY")
    if p:
        return p
    here = Path(__file__).resolve().parent
    bundled = sorted((here / "lib").glob("libcairn.so*")) if (here / "lib").is_dir() else []
    if bundled:
        return str(bundled[0])
    found = ctypes.util.find_library("cairn")
    if found:
        return found
    local = here.parents[2] / "build" / "src" / "libcairn.so"
    if local.is_file():
        return str(local)
    raise NotSupportedError("libcairn not found: set PYCAIRN_LIBRARY to the path of libcairn.so "
                            "(build/src/libcairn.so in a build tree, lib/libcairn.so where cairn is installed), "
                            "or install cairn's C library where the system's loader finds it")


def load():
    """(ffi, lib) over libcairn, loaded once."""
    global _loaded
    if _loaded is None:
        try:
            import cffi
        except ImportError as e:  # pragma: no cover - a dependency of the package
            raise NotSupportedError("cairn needs cffi: pip install cffi") from e
        ffi = cffi.FFI()
        ffi.cdef(CDEF)
        path = library_path()
        try:
            lib = ffi.dlopen(path)
        except OSError as e:
            raise NotSupportedError(f"libcairn at {path} cannot be loaded: {e}") from e
        _loaded = (ffi, lib)
    return _loaded


def check(rc: int, what: str) -> None:
    """Raises the CairnError subclass of a CAIRN_E* code, with the C library's message."""
    if rc == 0:
        return
    ffi, lib = load()
    msg = ffi.string(lib.cairn_last_error()).decode(errors="replace")
    reason = ffi.string(lib.cairn_strerror(rc)).decode(errors="replace")
    err = ERRORS.get(rc, CairnError)(f"{what}: {reason}: {msg}")
    err.code = rc
    raise err


def take_text(ffi, lib, out) -> str:
    """The text a cairn_store_* call returned in *out, freed."""
    try:
        return ffi.string(out[0]).decode("utf-8")
    finally:
        lib.cairn_store_free(out[0])
