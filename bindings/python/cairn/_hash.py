"""xxh3-64, the checksum of every cairn file (docs/format/).

Uses the `xxhash` package; without it, the system's libxxhash (libxxhash.so.0,
which cairn itself links) through ctypes. Neither present: reading raises
ChecksumUnavailable, naming both ways to fix it.
"""
import ctypes
import ctypes.util

from .errors import CairnError


class ChecksumUnavailable(CairnError):
    """Neither the xxhash package nor libxxhash could be loaded."""


def _from_package():
    try:
        import xxhash  # type: ignore
    except ImportError:
        return None
    fn = getattr(xxhash, "xxh3_64_intdigest", None)
    if fn is None:  # very old xxhash packages
        return None
    return lambda data: fn(data)


def _from_library():
    names = ["libxxhash.so.0", "libxxhash.so", ctypes.util.find_library("xxhash")]
    for name in names:
        if not name:
            continue
        try:
            lib = ctypes.CDLL(name)
            fn = lib.XXH3_64bits
        except (OSError, AttributeError):
            continue
        fn.restype = ctypes.c_uint64
        fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t]

        def xxh3(data, fn=fn):
            mv = memoryview(data).cast("B")
            if mv.nbytes == 0:
                return fn(None, 0)
            if mv.readonly:
                buf = (ctypes.c_char * mv.nbytes).from_buffer_copy(mv)
            else:
                buf = (ctypes.c_char * mv.nbytes).from_buffer(mv)
            return fn(ctypes.addressof(buf), mv.nbytes)

        return xxh3
    return None


_impl = _from_package() or _from_library()
BACKEND = "xxhash package" if _from_package() else ("libxxhash (ctypes)" if _impl else None)


def xxh3_64(data) -> int:
    """xxh3-64 (seed 0) of a bytes-like object, as an int."""
    if _impl is None:
        raise ChecksumUnavailable(
            "cannot verify cairn checksums: install the 'xxhash' Python package "
            "(pip install xxhash) or the system library libxxhash")
    return _impl(data)
