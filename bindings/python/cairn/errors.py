"""Exceptions of the cairn package."""


class CairnError(Exception):
    """Base class of every error raised by the cairn package."""


class NotFoundError(CairnError, LookupError):
    """No such run, checkpoint, committed version, rank or region."""


class CorruptionError(CairnError):
    """A file of the store fails a check (checksum, size, format): its data are
    not returned. The message names the file and what failed."""


class NotSupportedError(CairnError):
    """A file of a newer format version than this package reads."""


class DiffUnavailable(CairnError):
    """The cairn CLI was not found or has no `diff` command."""


# ---- errors of the writer API (cairn.Checkpointer), one per CAIRN_E* code ----
class InvalidArgumentError(CairnError, ValueError):
    """CAIRN_EINVAL: a bad argument or configuration (the message says which)."""


class CairnIOError(CairnError, OSError):
    """CAIRN_EIO: an I/O operation failed (the message holds errno)."""


class NoSpaceError(CairnIOError):
    """CAIRN_ENOSPC: a level ran out of space."""


class AgainError(CairnError):
    """CAIRN_EAGAIN: staging memory full with staging_policy = eagain."""


class CancelledError(CairnError):
    """CAIRN_ECANCELLED: the operation was cancelled."""


class DivergedError(CairnError):
    """CAIRN_EDIVERGED: the run diverged from its reference run."""


class UnusableError(CairnError):
    """CAIRN_EUNUSABLE: checkpoints exist but this job cannot restore them."""


class ExistsError(CairnError):
    """CAIRN_EEXIST: the version is already committed by an earlier execution."""


class BusyError(CairnError):
    """CAIRN_EBUSY: another execution is writing this run (the message names it)."""


class EarlierFailureWarning(UserWarning):
    """CAIRN_EEARLIER, issued by Checkpointer.checkpoint: this version was
    taken, but an earlier version failed in the background (the message says
    which and why; Checkpointer.test or wait on that version raises its error).
    warnings.simplefilter("error", EarlierFailureWarning) makes it an exception."""
